"""A CudaProgram's launches as one C call (cuda_launcher.c): the host path of a call on CUDA.

Why: per kernel and per argument, Python and cuda-bindings cost microseconds, more than a small
kernel runs. The C library is built once per process (the native build cache), opens libcuda
itself and holds a plan of every launch; a call writes its input and output pointers into
`pointers` and makes one ctypes call: plain launches, or a CUDA graph built on the first graph
call whose kernel nodes are updated only where a pointer changed. `programmatic`: the graph's
kernels are joined by programmatic edges (sm_90+: each kernel's launch overlaps the tail of the
one before, which it waits for itself, codegen/cuda.py's st_grid_dependency).
"""
from __future__ import annotations

import ctypes
import weakref
from pathlib import Path

import numpy as np

from ..core.errors import CudaError, DeviceUnavailable
from .native_build import build_library, load_library
from .tensor_map import encode

_LIBRARIES: dict[str, ctypes.CDLL] = {}        # libcuda's name or path -> the launcher opened on it
_U64P, _I32P, _U32P = (ctypes.POINTER(t) for t in (ctypes.c_uint64, ctypes.c_int32,
                                                   ctypes.c_uint32))


def launcher_library(libcuda: str) -> ctypes.CDLL:
    """The launch loop, compiled (once) and opened on `libcuda`."""
    lib = _LIBRARIES.get(libcuda)
    if lib is None:
        lib = load_library(build_library(Path(__file__).with_name("cuda_launcher.c").read_text()))
        lib.st_plan.restype = ctypes.c_void_p
        lib.st_plan.argtypes = [ctypes.c_int, _U64P, _U32P, _I32P, _I32P, _U64P, _U64P,
                                ctypes.c_int, ctypes.c_uint64, ctypes.c_int]
        lib.st_launch.argtypes = [ctypes.c_void_p, _U64P, ctypes.c_uint64, ctypes.c_int,
                                  ctypes.c_int]
        lib.st_graph.argtypes = [ctypes.c_void_p, _U64P, ctypes.c_uint64]
        lib.st_failed.argtypes = lib.st_free.argtypes = lib.st_has_graph.argtypes = [ctypes.c_void_p]
        lib.st_missing_name.restype = ctypes.c_char_p
        status = lib.st_open(libcuda.encode())
        if status < 0:
            raise DeviceUnavailable(f"the CUDA driver library {libcuda} does not open")
        if status > 0:
            raise DeviceUnavailable(f"the CUDA driver library {libcuda} has no "
                                    f"{lib.st_missing_name(status).decode()}: update the driver")
        _LIBRARIES[libcuda] = lib
    return lib


def _array(values, ctype, dtype):
    a = np.ascontiguousarray(values, dtype=dtype)
    return a, a.ctypes.data_as(ctypes.POINTER(ctype))


class Launcher:
    """Every launch of a program, planned once. `slots`: the names a call passes pointers for, in
    the order of `pointers` (None: a position the plan does not read); `fixed`: the pointer of
    every other parameter (weights, slab temps, the static buffers of tensor-mapped slots)."""

    def __init__(self, launches, slots: list[str | None], fixed: dict[str, int], driver, ctx,
                 programmatic: bool = False):
        self.driver, self.kernels = driver, [lc.kernel for lc in launches]
        self.lib = launcher_library(driver.library())
        index = {name: i for i, name in enumerate(slots) if name is not None}
        dims, first, slot, value, blob, self._blobs = [], [0], [], [], [], []
        for lc in launches:
            k = lc.kernel
            dims += [k.grid, k.block, k.dynamic_smem_bytes]
            for p in k.params:
                if p.tensor_map is not None:
                    self._blobs.append(encode(p, fixed[p.name], driver))
                    slot.append(-1), value.append(0), blob.append(self._blobs[-1].ctypes.data)
                else:
                    slot.append(index.get(p.name, -1)), blob.append(0)
                    value.append(0 if p.name in index else fixed[p.name])
            first.append(len(slot))
        arrays = [_array([driver.handle(lc.function) for lc in launches], ctypes.c_uint64, np.uint64),
                  _array(dims, ctypes.c_uint32, np.uint32), _array(first, ctypes.c_int32, np.int32),
                  _array(slot, ctypes.c_int32, np.int32), _array(value, ctypes.c_uint64, np.uint64),
                  _array(blob, ctypes.c_uint64, np.uint64)]
        self.programmatic = programmatic and bool(self.lib.st_has_programmatic_edges())
        self.plan = self.lib.st_plan(len(launches), *(p for _, p in arrays), len(slots),
                                     driver.handle(ctx), self.programmatic)
        if not self.plan:
            raise MemoryError("no host memory for a launch plan")
        weakref.finalize(self, self.lib.st_free, self.plan).atexit = False    # the driver may be gone
        self.pointers = (ctypes.c_uint64 * max(1, len(slots)))()
        self._launch, self._graph = self.lib.st_launch, self.lib.st_graph

    def __call__(self, stream: int, graph: bool) -> None:
        """Launch every kernel on `stream` with the pointers written in `self.pointers`: plainly,
        or as the plan's CUDA graph."""
        if graph:
            self._check(self._graph(self.plan, self.pointers, stream), "a CUDA graph call")
        else:
            self.launch(stream, 0, len(self.kernels))

    @property
    def has_graph(self) -> bool:
        """Whether the plan's CUDA graph was built (by a graph call)."""
        return bool(self.lib.st_has_graph(self.plan))

    def launch(self, stream: int, first: int, last: int) -> None:
        """Plain launches of kernels first..last-1 (one of them: a timing harness)."""
        self._check(self._launch(self.plan, self.pointers, stream, first, last), "cuLaunchKernel")

    def _check(self, status: int, what: str) -> None:
        if status:
            k = self.lib.st_failed(self.plan)
            kernel = self.kernels[k] if k >= 0 else None
            where = (f" launching {kernel.name} (grid {kernel.grid}, block {kernel.block})"
                     if kernel else "")
            raise CudaError(f"{what} failed with {self.driver.error_text(status)}{where}")
