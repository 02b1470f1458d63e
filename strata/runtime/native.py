"""A KernelProgram compiled to a native shared library and run on torch CPU tensors.

Why: the CPU target's whole runtime. The program's C (target/c.py) is compiled once by the host
compiler (runtime/cc.py) through a persistent cache and loaded with ctypes
(runtime/native_build.py); a run is one call, `strata_run(void** args)`, with the data pointers
of the program's buffers in KernelProgram.buffers order: inputs as given (checked and, if
non-contiguous, copied by runtime/args.py), weights prepared once, outputs from torch.empty,
temps in one slab planned by liveness (runtime/slab.py). ctypes releases the GIL for the call;
the kernels' blocks run on OpenMP threads (every core, or OMP_NUM_THREADS). An input the program
updates in place (`mutated_inputs`) is written in the caller's tensor, which must then be
contiguous.
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping

import torch

from .. import dtypes
from ..errors import InputMismatch
from ..kernel.ir import KernelProgram
from .args import prepare_args, prepare_weights
from .native_build import build_library, load_library
from .program import mutated_inputs, poison_
from .slab import plan_slab


class NativeProgram:
    """Run a KernelProgram on the CPU (see the module docstring).

    weights: name -> torch tensor for the program's weight buffers. inputs: name -> (object with
    .shape and .dtype) in call order; default the program's input buffers. poison: fill outputs
    and temps with NaN / sentinels before each run, so an element no kernel writes shows."""

    def __init__(self, program: KernelProgram, weights: Mapping[str, torch.Tensor] | None = None,
                 *, inputs: Mapping | None = None, poison: bool = False):
        from ..target.c import emit_program
        self.program, self.poison = program, poison
        self.source = emit_program(program)            # refuses kernels a CPU cannot run
        self.spec = dict(inputs) if inputs is not None else {
            b.name: b for b in program.buffers if b.kind == "input"}
        self.buffers = {b.name: b for b in program.buffers}
        self.mutated = set(mutated_inputs(program))
        self.plan = plan_slab(program)
        self.weights = prepare_weights(program.buffers, weights or {}, "cpu")
        self.library = None
        self._entry = None
        if program.kernels:                            # empty tensors only: nothing to build
            self.library = load_library(build_library(self.source))
            self._entry = self.library.strata_run
            self._entry.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            self._entry.restype = None

    @property
    def threads(self) -> int:
        """The OpenMP threads a kernel's blocks run on."""
        if self.library is None:
            return 1
        fn = self.library.strata_num_threads
        fn.restype = ctypes.c_int
        return int(fn())

    def run(self, inputs) -> list[torch.Tensor]:
        """The outputs, in program output order, as CPU tensors (0-d buffers have shape ())."""
        given = list(inputs)
        args = prepare_args(self.spec, given, "cpu")
        for name, g, a in zip(self.spec, given, args):
            if name in self.mutated and a.data_ptr() != g.data_ptr():
                raise InputMismatch(f"input {name} is updated in place, so it must be a "
                                    f"contiguous tensor with 16-byte aligned data (as "
                                    f"torch.zeros gives)")
        tensors = {**self.weights, **dict(zip(self.spec, args))}
        outs = {b.name: torch.empty(b.shape, dtype=dtypes.to_torch(b.dtype))
                for b in self.program.buffers if b.kind == "output"}
        slab = torch.empty(self.plan.total_bytes, dtype=torch.uint8) if self.plan.total_bytes \
            else None
        if self.poison:
            for t in outs.values():
                poison_(t)
            if slab is not None:
                slab.fill_(255)     # all-ones bytes: NaN in every float type, -1 in ints
        if self._entry is not None:
            self._entry(self._pointers(tensors, outs, slab))
        return self._collect(tensors, outs)

    __call__ = run

    def _pointers(self, tensors, outs, slab):
        offsets = self.plan.offsets
        ptrs = (ctypes.c_void_p * max(1, len(self.program.buffers)))()
        for i, b in enumerate(self.program.buffers):
            t = tensors.get(b.name, outs.get(b.name))
            if t is not None:
                ptrs[i] = t.data_ptr() or None
            elif slab is not None and b.name in offsets:
                ptrs[i] = slab.data_ptr() + offsets[b.name]
        return ptrs

    def _collect(self, tensors, outs) -> list[torch.Tensor]:
        result = []
        for name in self.program.outputs:
            if name in outs:
                result.append(outs[name])
            elif name in self.mutated:          # the caller's tensor, updated in place
                result.append(tensors[name])
            else:                               # an input or weight returned as it is
                result.append(tensors[name].clone().reshape(self.buffers[name].shape))
        return result
