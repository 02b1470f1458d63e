"""A KernelProgram loaded on a GPU and callable on torch CUDA tensors.

Why: this is the whole runtime a user sees. At construction the program's CUDA is compiled
(through the persistent cache), loaded with cuModuleLoadData, and its weights are uploaded once.
A call checks its arguments (one sentence naming a wrong one), allocates the outputs as torch
tensors and the temps as one slab (planned by liveness, runtime/slab.py), and launches every
kernel in order on torch's current stream with the tensors' data pointers: no copies except a
non-contiguous or misaligned argument.

With use_graph=True the first call launches plainly (so a failing launch says which kernel), the
second captures the launches into a torch.cuda.CUDAGraph over static input, output and slab
buffers, and every call from then on copies its inputs into the static buffers, replays the
graph and returns copies of the static outputs (so results of earlier calls stay valid). Shapes
are fixed at compile time, so one graph serves every call. use_graph=False keeps plain launches.

An input the program updates in place (a KV cache written with index_copy_, `mutated_inputs`)
is never copied: the kernels write the caller's tensor, which must be contiguous on the device,
and a graph is captured over that tensor itself (captured again if a call passes another one).
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping

import torch

from .. import dtypes
from ..codegen.cfamily import cname
from ..kernel_ir.ir import KernelProgram, Wgmma, walk
from ..errors import InputMismatch
from . import driver
from .args import prepare_args, prepare_weights
from .cache import compile_cached
from .cuda_units import compile_units, plan_units
from .launch import Launch, allow_dynamic_smem, bind, launch_all
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


class CudaProgram:
    """Run a KernelProgram on one CUDA device (see the module docstring).

    inputs: name -> (object with .shape and .dtype), in call order; default: the program's input
    buffers. weights: name -> torch tensor (any device; uploaded once). arch: default the
    device's (sm_90 on H100). poison: fill outputs and the slab with NaN / sentinels before every
    run, so that an element no kernel writes shows (for checks, not speed). driver: the module
    of CUDA calls (runtime/driver.py; tests pass a fake)."""

    def __init__(self, program: KernelProgram, arch: str | None = None, *,
                 inputs: Mapping | None = None, weights: Mapping[str, torch.Tensor] | None = None,
                 device=None, use_graph: bool = True, poison: bool = False, driver=None):
        self.program = program
        self.driver = driver or _default_driver()
        self.device = _resolve_device(device)
        self.ctx = self.driver.context(self.device)
        self.arch = arch or _arch_for(program, self.driver.arch(self.device))
        self.use_graph, self.poison = use_graph, poison
        self.spec = dict(inputs) if inputs is not None else {
            b.name: b for b in program.buffers if b.kind == "input"}
        self.buffers = {b.name: b for b in program.buffers}
        self.mutated = set(mutated_inputs(program))
        self.plan = plan_slab(program)
        self.weights = prepare_weights(program.buffers, weights or {}, self.device)
        self.units = plan_units(program, self.arch)       # twins compiled once (cuda_units.py)
        images = compile_units(self.units, lambda src, names: compile_cubin(src, self.arch, names))
        functions = {}
        for image, names in zip(images, self.units.kernels):
            module = self.driver.load_module(image, ", ".join(names))
            functions.update({n: self.driver.get_function(module, n) for n in names})
        self.launches = [Launch(k, functions[self.units.function_of[cname(k.name)]])
                         for k in program.kernels]
        allow_dynamic_smem(self.driver, self.launches)
        self.calls = 0
        self.graph = None
        self._static = None           # (inputs, outputs, slab) the graph was captured over

    # ------------------------------------------------------------ calling

    def run(self, inputs) -> list[torch.Tensor]:
        """Flat outputs, in program output order, as torch tensors on the device."""
        args = prepare_args(self.spec, list(inputs), self.device)
        for name, given, arg in zip(self.spec, inputs, args):
            if name in self.mutated and arg.data_ptr() != given.data_ptr():
                raise InputMismatch(f"input {name} is updated in place, so it must be a "
                                    f"contiguous tensor with 16-byte aligned data (as "
                                    f"torch.zeros gives)")
        self.driver.make_current(self.ctx)
        self.calls += 1
        if self.use_graph and self.device.type == "cuda" and self.calls > 1 and self.launches:
            return self._replay(args)
        tensors, outs, slab = self._allocate(args)
        self._launch(tensors, outs, slab)
        return self._collect(tensors, outs, clone=False)

    __call__ = run

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """New values for some weights (Program.set_weights); a CUDA graph holding the old
        pointers is captured again."""
        self.weights.update(prepare_weights(
            [b for b in self.program.buffers if b.name in weights], weights, self.device))
        self.graph = None

    def _allocate(self, args):
        tensors = {**self.weights, **dict(zip(self.spec, args))}
        outs = {b.name: torch.empty(b.shape, dtype=dtypes.to_torch(b.dtype), device=self.device)
                for b in self.program.buffers if b.kind == "output"}
        slab = (torch.empty(self.plan.total_bytes, dtype=torch.uint8, device=self.device)
                if self.plan.total_bytes else None)
        return tensors, outs, slab

    def _pointers(self, tensors, outs, slab) -> dict[str, int]:
        ptrs = {name: t.data_ptr() for name, t in {**tensors, **outs}.items()}
        if slab is not None:
            base = slab.data_ptr()
            ptrs.update({s.name: base + s.offset for s in self.plan.slots})
        return ptrs

    def _launch(self, tensors, outs, slab, bound=None) -> None:
        if self.poison:
            for t in outs.values():
                poison_(t)
            if slab is not None:
                slab.fill_(255)       # all-ones bytes: NaN in every float type, -1 in ints
        bound = bound or bind(self.launches, self._pointers(tensors, outs, slab), self.driver)
        launch_all(self.driver, bound, self.driver.current_stream(self.device))

    def _collect(self, tensors, outs, clone: bool) -> list[torch.Tensor]:
        result = []
        for name in self.program.outputs:
            if name in outs:
                result.append(outs[name].clone() if clone else outs[name])
            elif name in self.mutated:    # the caller's tensor, updated in place
                result.append(tensors[name])
            else:                     # an input or weight returned as it is
                result.append(tensors[name].clone().reshape(self.buffers[name].shape))
        return result

    def _replay(self, args) -> list[torch.Tensor]:
        with torch.cuda.device(self.device):
            if self.graph is not None and any(
                    s.data_ptr() != a.data_ptr() for name, s, a in zip(self.spec, self._static[0], args)
                    if name in self.mutated):
                self.graph = None          # another tensor to update in place: capture again
            if self.graph is None:
                self._capture(args)
            static_in, static_out, _slab = self._static
            for name, s, a in zip(self.spec, static_in, args):
                if name not in self.mutated:
                    s.copy_(a)
            self.graph.replay()
            tensors = {**self.weights, **dict(zip(self.spec, static_in))}
            return self._collect(tensors, static_out, clone=True)

    def _capture(self, args) -> None:
        static_in = [a if name in self.mutated else
                     torch.empty_like(a, memory_format=torch.contiguous_format)
                     for name, a in zip(self.spec, args)]
        tensors, static_out, slab = self._allocate(static_in)
        bound = bind(self.launches, self._pointers(tensors, static_out, slab), self.driver)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._launch(tensors, static_out, slab, bound)
        self.graph, self._static = graph, (static_in, static_out, slab)

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
        args = prepare_args(self.spec, list(inputs), self.device)
        self.driver.make_current(self.ctx)
        tensors, outs, slab = self._allocate(args)
        bound = bind(self.launches, self._pointers(tensors, outs, slab), self.driver)
        if not bound:
            return []
        with torch.cuda.device(self.device):
            return self._time(bound, warmup, reps)

    def _time(self, bound, warmup: int, reps: int) -> list[dict]:
        stream = self.driver.current_stream(self.device)
        for _ in range(warmup):
            launch_all(self.driver, bound, stream)
        events = []
        for _ in range(reps):
            for one in bound:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                launch_all(self.driver, [one], stream)
                end.record()
                events.append((one[0].kernel.name, start, end))
        torch.cuda.synchronize(self.device)
        times: dict[int, list[float]] = {}
        for i, (_, start, end) in enumerate(events):
            times.setdefault(i % len(bound), []).append(start.elapsed_time(end))
        return [{"name": lc.kernel.name, "grid": lc.kernel.grid, "block": lc.kernel.block,
                 "ms": statistics.median(times[i])} for i, (lc, _) in enumerate(bound)]


def _resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
