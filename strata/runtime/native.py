"""A KernelProgram compiled to a native shared library and run on torch CPU tensors.

Why: the CPU target's whole runtime. The program's C (codegen/c.py) is compiled once by the host
compiler (runtime/cc.py) through a persistent cache and loaded with ctypes
(runtime/native_build.py); a run is one call, `strata_run(void** args)`, with the data pointers
of the program's buffers in KernelProgram.buffers order: inputs as given (checked and, if
non-contiguous, copied by runtime/args.py), weights prepared once, outputs from torch.empty (a
large one in the last call's memory once the caller dropped it: `_output`), temps in one slab
planned by liveness (runtime/slab.py). The kernels the program runs once
(KernelProgram.once: weights packed into a contraction's panel layout) run when the program is
loaded, and their results are kept as weights, unless they would take more than half of the
memory available then (they then run on every call, as any kernel); a panel another live program
packed the same way from the same weights is taken as it is (the prefill programs of one model at
several prompt lengths: a TinyLlama decoder layer's 88 MB of bf16 panels once, not per program). ctypes releases the GIL
for the call; the kernels' blocks run on OpenMP threads: as many as runtime/threads.py says (the
user's number, else the cores other processes leave free). An
input the program updates in place (`mutated_inputs`) is written in the caller's tensor, which
must then be contiguous.
"""
from __future__ import annotations

import ctypes
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from math import prod

import torch
from torch import Tensor

from ..codegen.c import emit_program
from ..core import dtypes
from ..core.cpu_load import available_bytes
from ..core.errors import InputMismatch
from ..frontend.derived_weights import share, shared
from ..kernel_ir.ir import KernelProgram
from .args import prepare_args, prepare_weights
from .native_build import build_library, load_library
from .program import mutated_inputs, poison_
from .slab import plan_slab
from .threads import THREADS

SMALL = 1 << 14             # elements of an output made from a kept blank one
KEEP = 1 << 20              # bytes of an output whose memory a later call may take again
_uses = getattr(torch._C, "_storage_Use_Count", None)   # references to a storage's memory


class NativeProgram:
    """Run a KernelProgram on the CPU (see the module docstring).

    weights: name -> torch tensor for the program's weight buffers. inputs: name -> (object with
    .shape and .dtype) in call order; default the program's input buffers. poison: fill outputs
    and temps with NaN / sentinels before each run, so an element no kernel writes shows.
    threads: run on this many OpenMP threads; None: runtime/threads.py chooses per call."""

    def __init__(self, program: KernelProgram, weights: Mapping[str, torch.Tensor] | None = None,
                 *, inputs: Mapping | None = None, poison: bool = False, source: str | None = None,
                 threads: int | None = None, bounds: Mapping[int, tuple[int, str]] | None = None):
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.program, self.poison, self.fixed_threads = program, poison, threads
        self.bounds = dict(bounds or {})    # input position -> (rows, what): read as row numbers
        # emit_program refuses kernels a CPU cannot run; `source`: the program's C, emitted already
        self.source = source or emit_program(program)
        self.spec = dict(inputs) if inputs is not None else {
            b.name: b for b in program.buffers if b.kind == "input"}
        self.buffers = {b.name: b for b in program.buffers}
        self.mutated = set(mutated_inputs(program))
        self.weights = prepare_weights(program.buffers, weights or {}, "cpu")
        self._once = self._packed_once()           # launch indices run at load; self.weights grew
        self.plan = plan_slab(replace(      # the packed weights are not temps of a call
            program, kernels=[k for i, k in enumerate(program.kernels) if i not in self._once],
            buffers=[replace(b, kind="weight") if b.name in self.weights else b for b in program.buffers]))
        self.library = None
        self._entry = None
        self._team = 0                  # the team size its library was last told
        # what a call repeats, worked out once (a decode step's call is a few microseconds)
        self._outs = [(b.name, tuple(b.shape), dtypes.to_torch(b.dtype))
                      for b in program.buffers if b.kind == "output"]
        self._ptrs = ctypes.c_void_p * (len(program.buffers) + 1)
        self._spare_calls: list[tuple] = []      # (slab, pointers) no call is using
        self._kept: dict[int, torch.UntypedStorage] = {}    # large outputs' memory, by slot
        self._plan_call()
        if program.kernels:                            # empty tensors only: nothing to build
            self.library = load_library(build_library(self.source))
            self._entry = self.library.strata_run_per_call if self._once else self.library.strata_run
            self._entry.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            self._entry.restype = None
            run_kernel = self.library.strata_run_kernel
            run_kernel.argtypes, run_kernel.restype = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)], None
            self._set_team = self.library.strata_set_team
            self._set_team.argtypes, self._set_team.restype = [ctypes.c_int], None
            self._run_once()
            THREADS.start()

    def _run_once(self, indices=None) -> None:
        """Run the once kernels (weights packed into a contraction's panel layout), or those of
        `indices`, but for a panel another program packed already; each panel made is offered
        to later programs (frontend/derived_weights.py)."""
        ptrs = self._ptrs(*self._fixed)         # weights only: what the once kernels read
        self._team_now()
        for i in self._once if indices is None else indices:
            if indices is None and i in self._taken:
                continue
            self.library.strata_run_kernel(i, ptrs)
            if (panel := self._panel_of(i)) is not None:
                how, sources, name = panel
                share(how, sources, self.weights[name])

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """New values for some weights (Program.set_weights): taken by pointer, packed again
        into panels of this program's own (another program may hold the old ones)."""
        self.weights.update(prepare_weights(
            [b for b in self.program.buffers if b.name in weights], weights, "cpu"))
        again = [i for i in self._once if any(p.name in weights for p in self.program.kernels[i].params)]
        for p in (p for i in again for p in self.program.kernels[i].params if p.output):
            self.weights[p.name] = torch.empty_like(self.weights[p.name])
        self._plan_call()
        self._spare_calls.clear()                   # their pointer arrays hold the old weights
        if self.library is not None:
            self._run_once(again)

    def _packed_once(self) -> list[int]:
        """The launch indices of the kernels run once, their outputs made weights (a panel
        another live program packed from the same weights, the same way, is taken as it is:
        self._taken); [] when there are none, or their outputs would take over half the memory
        available."""
        once = [i for i, k in enumerate(self.program.kernels) if k.name in self.program.once]
        made = {p.name for i in once for p in self.program.kernels[i].params if p.output}
        size = sum(self.buffers[n].numel * dtypes.ITEMSIZE[self.buffers[n].dtype] for n in made)
        free = available_bytes()
        self._taken, self._how = set(), {}
        if not once or (free is not None and size > free // 2):
            if once:
                print(f"strata: the packed weights ({size / 2**30:.1f} GiB) would take over half "
                      f"the free memory; they are packed on every call", file=sys.stderr)
            return []
        self._how = {i: repr(replace(self.program.kernels[i], name="")) for i in once}  # its code
        for i in once:
            panel = self._panel_of(i)
            if panel is not None and (taken := shared(*panel[:2])) is not None:
                self.weights[panel[2]] = taken
                self._taken.add(i)
                continue
            for n in (p.name for p in self.program.kernels[i].params if p.output):
                self.weights[n] = torch.empty(self.buffers[n].shape,
                                              dtype=dtypes.to_torch(self.buffers[n].dtype))
        return once

    def _panel_of(self, i: int) -> tuple | None:
        """(how, sources, name) of once kernel i's panel for derived_weights: its code and the
        panel's name, the weights it reads, the panel's name; None unless it makes one output."""
        params = self.program.kernels[i].params
        outs = [p.name for p in params if p.output]
        if len(outs) != 1:
            return None
        return (self._how[i], outs[0]), [self.weights[p.name] for p in params if not p.output], outs[0]

    def _team_now(self, n: int | None = None) -> None:
        """Tell the library the team its next call runs on (n, else runtime/threads.py's)."""
        self._team = n or self.fixed_threads or THREADS.current()
        self._set_team(self._team)

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
        if self.bounds:
            self._check_rows(inputs)
        slab, ptrs = call = self._spare_calls.pop() if self._spare_calls else self._new_call()
        args = inputs
        if len(inputs) == len(self._in_ready):
            # an input a kernel can read as it is (the expected shape and dtype, a contiguous,
            # 16-byte aligned CPU tensor) goes in by its pointer: a tiny call costs microseconds
            for t, (i, shape, dtype) in zip(inputs, self._in_ready):
                if not (type(t) is Tensor and t.dtype is dtype and t.shape == shape
                        and t.is_contiguous() and t.is_cpu and not (a := t.data_ptr()) & 15):
                    break
                ptrs[i] = a
            else:
                args = None
        if args is not None:                      # checked, and copied where not readable
            args = self._prepared(list(inputs))
            for i, k in self._in_slots:
                ptrs[i] = args[k].data_ptr()
        outs = []
        for i, blank, shape, dtype in self._out_plan:
            out = torch.empty_like(blank) if blank is not None else self._output(i, shape, dtype)
            ptrs[i] = out.data_ptr()
            outs.append(out)
        if self.poison:
            for t in outs:
                poison_(t)
            if slab is not None:
                slab.fill_(255)     # all-ones bytes: NaN in every float type, -1 in ints
        if self._entry is not None:
            if (n := self.fixed_threads or THREADS.current()) != self._team:
                self._team_now(n)
            self._entry(ptrs)
        self._spare_calls.append(call)
        if self._plain_results:
            return outs
        args = args or inputs
        return [outs[key] if kind == "out" else args[key] if kind == "in" else
                (args[key] if kind == "copy" else self.weights[key]).clone().reshape(shape)
                for kind, key, shape in self._results]

    def _output(self, i: int, shape, dtype) -> Tensor:
        """A large output in the memory of the last call's, once nothing but this program holds
        it (a training step's gradients, dropped by zero_grad before the next backward): fresh
        memory costs a page fault every 4 KiB, 25 ms of a 60 ms decoder-block backward on Zen 5.
        Popped while in use, so that two threads calling at once never share it."""
        kept = self._kept.pop(i, None)
        # no tensor on its memory (one use: ours) and no other hold of the storage object itself
        if kept is not None and _uses(kept._cdata) == 1 and sys.getrefcount(kept) == 2:
            out = torch.empty(0, dtype=dtype).set_(kept, 0, shape)
        else:
            out = torch.empty(shape, dtype=dtype)
            if _uses is None or out.nbytes < KEEP:
                return out
        self._kept[i] = out.untyped_storage()
        return out

    def _prepared(self, given: list) -> list:
        """The inputs checked, and copied where a kernel cannot read them as they are."""
        args = prepare_args(self.spec, given, "cpu")
        for name, g, a in zip(self.spec, given, args):
            if name in self.mutated and a.data_ptr() != g.data_ptr():
                raise InputMismatch(f"input {name} is updated in place, so it must be a contiguous "
                                    f"tensor with 16-byte aligned data (as torch.zeros gives)")
        return args

    __call__ = run

    def _check_rows(self, inputs) -> None:
        """Row numbers a caller passes are read as they are (frontend/index_bounds.py): one out
        of its table is an error here, not a read outside the table."""
        for pos, (rows, what) in self.bounds.items():
            t = inputs[pos]
            if isinstance(t, Tensor) and t.numel():
                low, high = (int(v) for v in torch.aminmax(t))
                if low < 0 or high >= rows:
                    raise InputMismatch(f"input {list(self.spec)[pos]}: index {low if low < 0 else high} is "
                                        f"out of range for {what}, which has {rows} rows "
                                        f"(0..{rows - 1})")

    def kernel_runner(self, inputs, whole_run: bool = True):
        """A function of k that runs the program's k-th kernel (launch order) alone, on buffers
        one whole run on `inputs` has filled (none yet unless `whole_run`): how the tuner times
        one kernel's schedules. Its `view(name)` is a tensor over that buffer's memory as the
        kernels left it, and `once` the kernels that ran at load (a weight's panel): how the
        tuner takes one kernel's operands from a run stepped kernel by kernel (tune/units.py)."""
        args = prepare_args(self.spec, list(inputs), "cpu")
        outs = [torch.empty(shape, dtype=dtype) for _, shape, dtype in self._outs]
        slab, ptrs = self._new_call()
        self._fill(ptrs, args, outs)
        self._team_now()
        if whole_run:
            self._entry(ptrs)
        fn = self.library.strata_run_kernel
        at = {b.name: i for i, b in enumerate(self.program.buffers)}

        def run_kernel(k: int) -> None:
            fn(k, ptrs)

        def view(name: str) -> Tensor:
            b = self.buffers[name]
            dtype, size = dtypes.to_torch(b.dtype), b.numel * dtypes.ITEMSIZE[b.dtype]
            if not size:
                return torch.empty(tuple(b.shape), dtype=dtype)
            memory = (ctypes.c_byte * size).from_address(ptrs[at[name]])
            return torch.frombuffer(memory, dtype=dtype).view(tuple(b.shape))
        run_kernel.view, run_kernel.once = view, frozenset(self._once)
        run_kernel.buffers = (args, outs, slab)       # alive as long as the runner
        return run_kernel

    def time_kernels(self, inputs, warmup: int = 3, reps: int = 20) -> list[dict]:
        """Median ms of each launch (the CUDA runtime's contract), timed in launch order through
        whole passes, so a kernel meets the cache its predecessors left, as in a run (a decode
        step's weights are not hot from its own last rep); kernels run at load: 0."""
        run, n = self.kernel_runner(inputs), len(self.program.kernels)
        times = [[] for _ in range(n)]
        for rep, k in ((rep, k) for rep in range(warmup + reps) for k in range(n) if k not in run.once):
            start = time.perf_counter()
            run(k)
            times[k] += [time.perf_counter() - start] if rep >= warmup else []
        return [{"name": kernel.name, "ms": statistics.median(t) * 1e3 if t else 0.0}
                for kernel, t in zip(self.program.kernels, times)]

    def _new_call(self) -> tuple:
        """A slab and a pointer array holding the weights' and the temps' pointers: a call takes
        a spare one (list ops are atomic: threads calling at once get one each) and fills in
        only its inputs' and outputs' pointers."""
        slab = torch.empty(self.plan.total_bytes, dtype=torch.uint8) if self.plan.total_bytes else None
        ptrs = self._ptrs(*self._fixed)
        for i, offset in self._slab_slots:
            ptrs[i] = slab.data_ptr() + offset
        return slab, ptrs

    def _plan_call(self) -> None:
        """Where each buffer's pointer and each result come from, worked out once: a call only
        fills in the pointers of its inputs, outputs and slab."""
        inputs, outputs = list(self.spec), [name for name, _, _ in self._outs]
        self._fixed, self._in_slots, self._out_slots, self._slab_slots = [], [], [], []
        for i, b in enumerate(self.program.buffers):
            w = self.weights.get(b.name)
            self._fixed.append(w.data_ptr() or None if w is not None else None)
            if b.name in self.spec:
                self._in_slots.append((i, inputs.index(b.name)))
            elif b.name in outputs:
                self._out_slots.append((i, outputs.index(b.name)))
            elif w is None and b.name in self.plan.offsets:
                self._slab_slots.append((i, self.plan.offsets[b.name]))
        at = {b.name: i for i, b in enumerate(self.program.buffers)}
        spare = len(self.program.buffers)   # the pointer slot of an input no kernel reads
        self._in_ready = [(at.get(name, spare), torch.Size(b.shape), dtypes.to_torch(b.dtype))
                          for name, b in self.spec.items()]       # what run() takes as it is
        # a small output is made like a kept blank one (0.5 us less than torch.empty)
        self._out_plan = [(at[name], torch.empty(shape, dtype=dtype) if prod(shape) <= SMALL else None,
                           shape, dtype) for name, shape, dtype in self._outs]
        self._results = []
        for name in self.program.outputs:
            shape = tuple(self.buffers[name].shape)
            if name in outputs:
                self._results.append(("out", outputs.index(name), shape))
            elif name in self.spec:             # updated in place: the caller's tensor; else a copy
                self._results.append(("in" if name in self.mutated else "copy",
                                      inputs.index(name), shape))
            else:                               # a weight returned as it is
                self._results.append(("weight", name, shape))
        self._plain_results = self._results == [("out", k, tuple(self.buffers[name].shape))
                                                for k, (name, _, _) in enumerate(self._outs)]

    def _fill(self, ptrs, args, outs) -> None:
        """Put a call's inputs' and outputs' data pointers in its pointer array."""
        for i, k in self._in_slots:
            ptrs[i] = args[k].data_ptr() or None
        for i, k in self._out_slots:
            ptrs[i] = outs[k].data_ptr() or None
