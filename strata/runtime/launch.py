"""A program's launches (kernel and loaded function) and the argument arrays cuLaunchKernel reads.

Why apart from program.py: this is the ABI boundary. Every strata kernel takes only pointers
(`const T* __restrict__` inputs, `T* __restrict__` outputs, in Kernel.params order), so the
`kernelParams` of a launch is a void*[n] whose k-th entry points at a 64-bit device address.
`PackedArgs` builds exactly that in NumPy memory and keeps it alive (the @strata.kernel path;
a compiled program's launches build the same arrays in C, runtime/cuda_launcher.c); the driver
copies the values when the launch is enqueued. A tensor-map parameter (TMA) is the exception: its
entry points at the 128-byte CUtensorMap (runtime/tensor_map.py). A kernel with dynamic shared
memory gets its size as sharedMemBytes. Nothing here needs a GPU: the driver is passed in.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernel_ir.ir import Kernel
from ..codegen.cfamily import cname


class PackedArgs:
    """void*[n] -> n uint64 device pointers (or uint64 arrays passed by value: tensor maps), for
    cuLaunchKernel's kernelParams."""

    def __init__(self, pointers):
        items = list(pointers)
        self.blobs = [p for p in items if isinstance(p, np.ndarray)]
        self.values = np.array([0 if isinstance(p, np.ndarray) else int(p) for p in items],
                               dtype=np.uint64)
        base = self.values.ctypes.data
        self.slots = np.array([p.ctypes.data if isinstance(p, np.ndarray) else base + 8 * i
                               for i, p in enumerate(items)], dtype=np.uint64)

    @property
    def address(self) -> int:
        return int(self.slots.ctypes.data) if len(self.slots) else 0


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a program: the IR kernel and its loaded function handle."""
    kernel: Kernel
    function: object

    @property
    def name(self) -> str:
        return cname(self.kernel.name)


def allow_dynamic_smem(driver, launches) -> None:
    """Raise each function's dynamic shared-memory limit to what its kernel takes
    (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; the default allows 48 KB)."""
    done = set()
    for lc in launches:
        nbytes = lc.kernel.dynamic_smem_bytes
        if nbytes and lc.name not in done:
            driver.set_function_attribute(lc.function, "MAX_DYNAMIC_SHARED_SIZE_BYTES", nbytes,
                                          lc.name)
            done.add(lc.name)

