"""Launching a program's kernels: the argument arrays cuLaunchKernel reads, and the launch loop.

Why apart from program.py: this is the ABI boundary. Every strata kernel takes only pointers
(`const T* __restrict__` inputs, `T* __restrict__` outputs, in Kernel.params order), so the
`kernelParams` of a launch is a void*[n] whose k-th entry points at a 64-bit device address.
`PackedArgs` builds exactly that in NumPy memory and keeps it alive; the driver copies the values
when the launch is enqueued. A tensor-map parameter (TMA) is the exception: its entry points at
the 128-byte CUtensorMap, encoded from the buffer's pointer by runtime/tensor_map.py (at bind
time: a captured CUDA graph keeps the maps of its static buffers). A kernel with dynamic shared
memory gets its size as sharedMemBytes. Nothing here needs a GPU: the driver is passed in.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..kernel_ir.ir import Kernel
from ..codegen.cfamily import cname
from .tensor_map import encode


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

    def pack(self, pointers: Mapping[str, int], driver=None) -> PackedArgs:
        missing = [p.name for p in self.kernel.params if p.name not in pointers]
        if missing:
            raise KeyError(f"{self.name}: no device pointer for parameter(s) {', '.join(missing)}")
        return PackedArgs(encode(p, pointers[p.name], driver) if p.tensor_map is not None
                          else pointers[p.name] for p in self.kernel.params)


def bind(launches, pointers: Mapping[str, int], driver=None) -> list[tuple[Launch, PackedArgs]]:
    """Each launch with its packed arguments (pack once, launch many times: a timing loop);
    tensor maps are encoded through `driver` (default runtime/driver.py)."""
    return [(lc, lc.pack(pointers, driver)) for lc in launches]


def launch_all(driver, bound, stream: int) -> None:
    """Enqueue every launch, in program order, on `stream`."""
    for lc, args in bound:
        k = lc.kernel
        if k.dynamic_smem_bytes:      # sharedMemBytes (the function's limit was raised at load)
            driver.launch(lc.function, lc.name, k.grid, k.block, args.address, stream,
                          smem_bytes=k.dynamic_smem_bytes)
        else:
            driver.launch(lc.function, lc.name, k.grid, k.block, args.address, stream)


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

