"""A program's CUDA as a few small translation units, each kernel body compiled once, side by side.

Why: a whole model is about 500 kernels, 5 MB of CUDA in one source, and NVRTC took 40 s on
each of SmolLM2-135M's two programs (one core, 2026-11-26); on the GPU machine the decode
benchmark ran past its 200 s step without launching a kernel. Two facts cut that:
  twins    the layers repeat, so most kernels differ from an earlier one only in their own name
           and their buffers' names (kernel_ir/twins.py finds them; the C target calls one function
           for them). Such a kernel is not compiled again: it launches its first twin's function
           with its own arguments, which the ABI passes by position (runtime/launch.py).
  threads  NVRTC releases the GIL, so units compile on threads, one per core.
A unit holds UNIT_KERNELS kernels whatever the core count, so a program makes the same units, and
hits the same cubin cache entries (runtime/cache.py), on every machine.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ..kernel_ir.ir import KernelProgram
from ..codegen.cfamily import cname, distinct_kernels, numbered
from ..codegen.cuda import emit_kernel, emit_program

UNIT_KERNELS = 16


@dataclass(frozen=True)
class Units:
    sources: list[str]            # one translation unit each
    kernels: list[list[str]]      # the C names of the kernels each unit defines
    function_of: dict[str, str]   # every kernel's C name -> the kernel compiled for it


def plan_units(program: KernelProgram, arch: str) -> Units:
    """Each kernel's function (its own, or its twin's: the lowering's `program.twins`, else the
    same code by codegen/cuda.py's `numbered`), and the kernels compiled, split into units; each
    unit is emit_program's source for its kernels."""
    first: dict[tuple, str] = {}
    function_of: dict[str, str] = {}
    compiled = []
    for k in distinct_kernels(program):
        name = cname(k.name)
        twin = program.twins.get(k.name)
        if twin is not None and cname(twin) in function_of:
            function_of[name] = function_of[cname(twin)]
            continue
        function_of[name] = first.setdefault((numbered(emit_kernel(k), k), k.dynamic_smem_bytes),
                                             name)
        if function_of[name] == name:
            compiled.append(k)
    chunks = [compiled[i:i + UNIT_KERNELS] for i in range(0, len(compiled), UNIT_KERNELS)]
    return Units([emit_program(replace(program, kernels=c), arch) for c in chunks],
                 [[cname(k.name) for k in c] for c in chunks], function_of)


def compile_units(units: Units, compile_one, workers: int | None = None) -> list[bytes]:
    """compile_one(source, kernel_names) of every unit, on up to `workers` threads (default one
    per core); the images in unit order. A failure is raised as it is (it names its kernels)."""
    n = min(len(units.sources), workers or os.cpu_count() or 1)
    if n <= 1:
        return [compile_one(s, names) for s, names in zip(units.sources, units.kernels)]
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(compile_one, units.sources, units.kernels))
