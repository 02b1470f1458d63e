"""A KernelProgram loaded on a GPU and callable on torch CUDA tensors.

Why: this is the whole runtime a user sees. At construction the program's CUDA (the units the
pipeline printed, `units`, else written here: codegen/cuda_units.py) is compiled
(through the persistent cache), loaded with cuModuleLoadData, its weights are uploaded once and
its temps get one slab of its own (planned by liveness, runtime/slab.py). A call checks its
arguments (a few attribute reads when they are what it was compiled for; else one sentence naming
a wrong one), allocates its outputs (or takes `out=`) and makes one C call that launches every
kernel on torch's current stream with the tensors' own pointers (runtime/cuda_launcher.c): no
Python per kernel and no copies, except of a non-contiguous or misaligned argument and of an
input or output a TMA tensor map reads (its address is encoded once, so it goes through a static
buffer, copied on the device).

With use_graph=True the first call launches plainly (so a failing launch says which kernel) and
later calls launch one CUDA graph of the program, built once; where a call's pointers differ from
the last call's, only the kernel nodes that read them are updated. Results of earlier calls stay
valid (every call has its own outputs). An input the program updates in place (a KV cache written
with index_copy_, `mutated_inputs`) is the caller's tensor, which must be contiguous on the
device. Calls share the slab: one program runs on one stream at a time.
"""
from __future__ import annotations

import os
import re
import statistics
from collections.abc import Mapping

import torch

from ..codegen.cfamily import cname
from ..codegen.cuda_units import Units, plan_units
from ..core import dtypes
from ..core.errors import InputMismatch
from ..core.targets import TARGETS
from ..kernel_ir.ir import KernelProgram, Wgmma, walk
from . import driver
from .args import POINTER_ALIGN, check_args, prepare_args, prepare_weights
from .cache import compile_cached
from .cuda_launcher import Launcher
from .cuda_units import compile_units
from .launch import Launch, allow_dynamic_smem
from .slab import plan_slab


def compile_cubin(source: str, arch: str, kernel_names: list[str]) -> bytes:
    """The cubin of `source` for `arch`, from the persistent compile cache."""
    return compile_cached(source, arch, kernel_names, want="cubin")


def mutated_inputs(program: KernelProgram) -> list[str]:
    """Input buffers some kernel writes: the program updates these arguments in place."""
    written = {p.name for k in program.kernels for p in k.params if p.output}
    return [b.name for b in program.buffers if b.kind == "input" and b.name in written]


def _arch_for(program: KernelProgram, device_arch: str) -> str:
    """The device's architecture, sm_90a on an sm_90 device when a kernel uses wgmma (the
    architecture-specific features exist only in code built for sm_90a)."""
    if device_arch == "sm_90" and any(isinstance(s, Wgmma) for k in program.kernels
                                      for s in walk(k.body)):
        return "sm_90a"
    return device_arch


def _default_driver():
    return driver


def poison_(t: torch.Tensor) -> None:
    """Fill `t` with 'never written' (NaN, or the extreme integer), like the simulator does."""
    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype != torch.bool:
        info = torch.iinfo(t.dtype)
        t.fill_(info.min if info.min < 0 else info.max)


def few_waves(program: KernelProgram, arch: str) -> bool:
    """Every kernel at most two blocks per SM (the target's fill_blocks; an H100's SMs for a
    GPU strata has no target for)."""
    fill = TARGETS.get(arch, TARGETS["sm_90a"]).fill_blocks
    return all(k.grid <= fill for k in program.kernels)


class CudaProgram:
    """Run a KernelProgram on one CUDA device (see the module docstring).

    inputs: name -> (object with .shape and .dtype), in call order; default: the program's input
    buffers. weights: name -> torch tensor (any device; uploaded once). arch: default the
    device's (sm_90 on H100). poison: fill outputs and the slab with NaN / sentinels before every
    run, so that an element no kernel writes shows (for checks, not speed). driver: the module
    of CUDA calls (runtime/driver.py; tests pass a fake)."""

    def __init__(self, program: KernelProgram, arch: str | None = None, *,
                 inputs: Mapping | None = None, weights: Mapping[str, torch.Tensor] | None = None,
                 device=None, use_graph: bool = True, poison: bool = False, driver=None,
                 units: Units | None = None):
        self.program = program
        self.driver = driver or _default_driver()
        self.device = _resolve_device(device)
        self.ctx = self.driver.context(self.device)
        self.arch = arch or _arch_for(program, self.driver.arch(self.device))
        self.use_graph, self.poison = use_graph, poison
        # every kernel waits for the one before it on sm_90+ (codegen/cuda.py), so the graph may
        # join them by programmatic edges: by default where each kernel is at most two waves of
        # blocks (a decode step: the next kernel's weights asked of L2 under this one's tail). A
        # prefill's kernels of many waves lost with them on the H200 (run 6: bf16 5.20 against
        # 4.70 ms, Q4_0 34.7 against 27.3; why is not known). STRATA_PDL=0|1 pins it.
        pinned = os.environ.get("STRATA_PDL")
        self.programmatic = int(re.search(r"\d+", self.arch)[0]) >= 90 and (
            pinned == "1" if pinned in ("0", "1") else few_waves(program, self.arch))
        self.spec = dict(inputs) if inputs is not None else {
            b.name: b for b in program.buffers if b.kind == "input"}
        self.buffers = {b.name: b for b in program.buffers}
        self.mutated = set(mutated_inputs(program))
        self.plan = plan_slab(program)
        self.weights = prepare_weights(program.buffers, weights or {}, self.device)
        # the units the pipeline printed (Lowered.units), else written here; twins compiled once
        self.units = units or plan_units(program, self.arch)
        images = compile_units(self.units, lambda src, names: compile_cubin(src, self.arch, names))
        functions = {}
        for image, names in zip(images, self.units.kernels):
            module = self.driver.load_module(image, ", ".join(names))
            functions.update({n: self.driver.get_function(module, n) for n in names})
        self.launches = [Launch(k, functions[self.units.function_of[cname(k.name)]])
                         for k in program.kernels]
        allow_dynamic_smem(self.driver, self.launches)
        self.slab = (torch.empty(self.plan.total_bytes, dtype=torch.uint8, device=self.device)
                     if self.plan.total_bytes else None)        # the program's temps, its own
        self._expect = [(torch.Size(b.shape), dtypes.to_torch(b.dtype)) for b in self.spec.values()]
        self._input_index = {name: i for i, name in enumerate(self.spec)}
        self._made_buffers = [b for b in program.buffers if b.kind == "output"]
        self._made = [(tuple(b.shape), dtypes.to_torch(b.dtype)) for b in self._made_buffers]
        self._made_index = {b.name: i for i, b in enumerate(self._made_buffers)}
        self._outputs_made = list(program.outputs) == [b.name for b in self._made_buffers]
        index = self.device.index
        self._on_device = ((lambda v: v.get_device() == index) if self.device.type == "cuda"
                           else (lambda v: v.device == self.device))
        self.calls = 0
        self._launcher: Launcher | None = None

    # ------------------------------------------------------------ calling

    def run(self, inputs, out=None) -> list[torch.Tensor]:
        """Flat outputs, in program output order, as torch tensors on the device; `out`: tensors
        (one per output buffer, in that order) to write them into instead of new ones."""
        args = inputs if self._as_compiled(inputs, self._expect) else self._checked(inputs)
        if out is None:
            outs = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in self._made]
        elif self._as_compiled(out, self._made):
            outs = out
        else:
            outs = list(out)
            check_args({b.name: b for b in self._made_buffers}, outs, self.device, role="out=")
            raise InputMismatch("out= tensors must be contiguous with 16-byte aligned data")
        self.calls += 1
        if self.launches:
            self._launch(args, outs)
        return self._collect(args, outs)

    __call__ = run

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """New values for some weights (Program.set_weights); the launch plan holding the old
        pointers is made again."""
        self.weights.update(prepare_weights(
            [b for b in self.program.buffers if b.name in weights], weights, self.device))
        self._launcher = None

    def set_programmatic(self, on: bool) -> None:
        """Join the graph's kernels by programmatic edges or not (a benchmark compares both)."""
        self.programmatic, self._launcher = on, None

    def _as_compiled(self, tensors, expect) -> bool:
        """Whether each tensor is what the program was compiled for (shape, dtype, device),
        contiguous and aligned: a few attribute reads each, so a call checks no more."""
        if len(tensors) != len(expect):
            return False
        on_device = self._on_device
        for (shape, dtype), v in zip(expect, tensors):
            if not (isinstance(v, torch.Tensor) and v.dtype is dtype and v.shape == shape
                    and on_device(v) and v.is_contiguous() and not v.data_ptr() % POINTER_ALIGN):
                return False
        return True

    def _checked(self, inputs) -> list[torch.Tensor]:
        """Inputs that are not as compiled: checked in full (one sentence naming a wrong one) and
        copied where non-contiguous or misaligned, unless the program updates them in place."""
        args = prepare_args(self.spec, list(inputs), self.device)
        for name, given, arg in zip(self.spec, inputs, args):
            if name in self.mutated and arg.data_ptr() != given.data_ptr():
                raise InputMismatch(f"input {name} is updated in place, so it must be a "
                                    f"contiguous tensor with 16-byte aligned data (as "
                                    f"torch.zeros gives)")
        return args

    def _launch(self, args, outs) -> None:
        launcher = self._bind(args, outs)
        launcher(self.driver.current_stream(self.device), self.use_graph and self.calls > 1)
        n = len(args)
        for i, static in self._pinned_out:
            (args[i] if i < n else outs[i - n]).copy_(static)

    def _bind(self, args, outs) -> Launcher:
        """The launch plan with this call's pointers written in (and tensor-mapped inputs copied
        to their static buffers)."""
        if self._launcher is None:
            self._launcher = self._plan()
        if self.poison:
            for t in outs:
                poison_(t)
            if self.slab is not None:
                self.slab.fill_(255)       # all-ones bytes: NaN in every float type, -1 in ints
        pointers, n = self._launcher.pointers, len(args)
        for i, t in enumerate(args):
            pointers[i] = t.data_ptr()
        for i, t in enumerate(outs):
            pointers[n + i] = t.data_ptr()
        for i, static in self._pinned_in:
            static.copy_(args[i])
        return self._launcher

    def _plan(self) -> Launcher:
        """The C launch plan: inputs and outputs by pointer per call; weights, slab temps and the
        static buffers of tensor-mapped inputs and outputs fixed."""
        names = [*self.spec, *(b.name for b in self._made_buffers)]
        mapped = {p.name for lc in self.launches for p in lc.kernel.params
                  if p.tensor_map is not None and p.name in names}
        fixed = {name: t.data_ptr() for name, t in self.weights.items()}
        if self.slab is not None:
            fixed.update({s.name: self.slab.data_ptr() + s.offset for s in self.plan.slots})
        self._pinned_in, self._pinned_out = [], []
        for name in mapped:             # TMA encodes its address once: copy through a static buffer
            b, i = self.buffers[name], names.index(name)
            static = torch.empty(b.shape, dtype=dtypes.to_torch(b.dtype), device=self.device)
            fixed[name] = static.data_ptr()
            if i < len(self.spec):
                self._pinned_in.append((i, static))
            if i >= len(self.spec) or name in self.mutated:
                self._pinned_out.append((i, static))
        return Launcher(self.launches, [None if n in mapped else n for n in names], fixed,
                        self.driver, self.ctx, programmatic=self.programmatic)

    def _collect(self, args, outs) -> list[torch.Tensor]:
        if self._outputs_made:          # the usual case: the outputs are the new buffers, in order
            return outs
        made = self._made_index
        result = []
        for name in self.program.outputs:
            if name in made:
                result.append(outs[made[name]])
            elif name in self._input_index and name in self.mutated:   # the caller's, in place
                result.append(args[self._input_index[name]])
            else:                     # an input or weight returned as it is
                t = args[self._input_index[name]] if name in self._input_index else self.weights[name]
                result.append(t.clone().reshape(self.buffers[name].shape))
        return result

    # ------------------------------------------------------------ for benchmarks

    def kernel_rows(self) -> list[dict]:
        """One row per launch: name, grid, block, smem_bytes (static), registers per thread,
        local_bytes (spills and local arrays, per thread)."""
        rows = []
        for lc in self.launches:
            k = lc.kernel
            rows.append({"name": k.name, "grid": k.grid, "block": k.block,
                         "smem_bytes": k.smem_bytes,
                         "registers": self.driver.function_attribute(lc.function, "NUM_REGS", k.name),
                         "local_bytes": self.driver.function_attribute(lc.function,
                                                                       "LOCAL_SIZE_BYTES", k.name)})
        return rows

    def time_kernels(self, inputs, warmup: int = 3, reps: int = 20) -> list[dict]:
        """Median milliseconds of each launch, timed with CUDA events around each one (plain
        launches, no graph, no L2 flush: a benchmark harness adds what it needs)."""
        if not self.launches:
            return []
        args = prepare_args(self.spec, list(inputs), self.device)
        launcher = self._bind(args, [torch.empty(shape, dtype=dtype, device=self.device)
                                     for shape, dtype in self._made])
        stream, n = self.driver.current_stream(self.device), len(self.launches)
        for _ in range(warmup):
            launcher.launch(stream, 0, n)
        events = [[] for _ in range(n)]
        for _ in range(reps):
            for i in range(n):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                launcher.launch(stream, i, i + 1)
                end.record()
                events[i].append((start, end))
        torch.cuda.synchronize(self.device)
        return [{"name": lc.kernel.name, "grid": lc.kernel.grid, "block": lc.kernel.block,
                 "ms": statistics.median(s.elapsed_time(e) for s, e in ev)}
                for lc, ev in zip(self.launches, events)]


def _resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
