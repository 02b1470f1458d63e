"""Launching a program's kernels: the argument arrays cuLaunchKernel reads, and the launch loop.

Why apart from program.py: this is the ABI boundary. Every strata kernel takes only pointers
(`const T* __restrict__` inputs, `T* __restrict__` outputs, in Kernel.params order), so the
`kernelParams` of a launch is a void*[n] whose k-th entry points at a 64-bit device address.
`PackedArgs` builds exactly that in NumPy memory and keeps it alive; the driver copies the values
when the launch is enqueued. Nothing here needs a GPU: the driver is passed in.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..kernel.ir import Kernel
from ..target.cuda import cname


class PackedArgs:
    """void*[n] -> n uint64 device pointers, for cuLaunchKernel's kernelParams."""

    def __init__(self, pointers):
        self.values = np.array([int(p) for p in pointers], dtype=np.uint64)
        base = self.values.ctypes.data
        self.slots = np.array([base + 8 * i for i in range(len(self.values))], dtype=np.uint64)

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

    def pack(self, pointers: Mapping[str, int]) -> PackedArgs:
        missing = [p.name for p in self.kernel.params if p.name not in pointers]
        if missing:
            raise KeyError(f"{self.name}: no device pointer for parameter(s) {', '.join(missing)}")
        return PackedArgs(pointers[p.name] for p in self.kernel.params)


def bind(launches, pointers: Mapping[str, int]) -> list[tuple[Launch, PackedArgs]]:
    """Each launch with its packed arguments (pack once, launch many times: a timing loop)."""
    return [(lc, lc.pack(pointers)) for lc in launches]


def launch_all(driver, bound, stream: int) -> None:
    """Enqueue every launch, in program order, on `stream`."""
    for lc, args in bound:
        k = lc.kernel
        driver.launch(lc.function, lc.name, k.grid, k.block, args.address, stream)


def unique_kernel_names(kernels) -> list[str]:
    """The C names of the program's kernels, each once, in launch order (a kernel may run twice)."""
    return list(dict.fromkeys(cname(k.name) for k in kernels))
