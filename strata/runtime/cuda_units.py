"""The translation units of a program's CUDA (codegen/cuda_units.py) compiled side by side: NVRTC
releases the GIL, so units compile on threads, one per core."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from ..codegen.cuda_units import Units


def compile_units(units: Units, compile_one, workers: int | None = None) -> list[bytes]:
    """compile_one(source, kernel_names) of every unit, on up to `workers` threads (default one
    per core); the images in unit order. A failure is raised as it is (it names its kernels)."""
    n = min(len(units.sources), workers or os.cpu_count() or 1)
    if n <= 1:
        return [compile_one(s, names) for s, names in zip(units.sources, units.kernels)]
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(compile_one, units.sources, units.kernels))
