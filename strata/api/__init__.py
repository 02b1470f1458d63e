"""`strata.compile`: capture a function or module, lower it through every stage, and return a
callable `Program` that runs the generated kernels (on the CPU simulator, or on a CUDA GPU
through strata/runtime) and exposes the text of every stage."""
from __future__ import annotations

import copy
import dataclasses
import sys
import time

import numpy as np
import torch

from ..core import dtypes
from ..core.context import Context
from ..core.errors import DeviceUnavailable, InputMismatch, StrataError
from ..core.targets import get_target, gpu_target
from ..frontend import capture_cache
from ..frontend.capture import FunctionModule, _param_names, as_forward, capture, capture_snippet
from ..frontend.index_bounds import index_bounds
from ..frontend.snippet import parse_snippet
from ..frontend.torch_ir import shape_only
from ..kernel_ir.sim import simulate
from ..models.build import build
from ..models.hf import is_causal_lm
from ..models.wrappers import CausalLMLogits
from ..pipeline import Lowered, STAGES, lower_torch_program
from ..runtime import driver
from ..runtime.args import check_args
from ..runtime.native import NativeProgram
from ..runtime.program import CudaProgram, mutated_inputs
from ..runtime.qemu import QemuProgram
from ..tensor.merge_projections import derive_weights
from ..tune.db import default_db
from ..view import write_page
from .autograd import warn_inference_only, without_backward

DEVICES = ("sim", "cuda", "cpu")


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise StrataError(f"unknown device {device!r}; choose sim, cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("--device cuda needs an NVIDIA GPU visible to torch; none is; "
                                "use --device sim")


def on_device(ctx: Context, device: str) -> Context:
    """`ctx` with its target filled in for `device` when the user pinned none: a program that
    will run on this GPU is compiled for the GPU's own architecture, sm_90a on H100/H200 (so
    wgmma and TMA are used), sm_80 on A100. Compiling without running keeps targets.DEFAULT."""
    if device in ("cuda", "cpu") and ctx.tuned is None:     # runs natively: tuned schedules apply
        ctx.tuned = default_db()
    if device == "cuda" and ctx.target is None:
        ctx.target = get_target(gpu_target(driver.arch(torch.cuda.current_device())))
    if device == "cpu":
        if ctx.target is None:
            ctx.target = get_target("host")      # this machine's cores and vector features
        elif ctx.target.is_gpu:
            raise StrataError(f"--device cpu runs CPU code, but --target {ctx.target} is a GPU; "
                              f"pin a CPU target (cpu, cpu-avx2, host) or none")
    elif ctx.target is not None and not ctx.target.is_gpu:
        raise StrataError(f"--target {ctx.target} is a CPU: run it with --device cpu")
    return ctx


def _emulated(target) -> bool:
    """Whether a CPU target is another instruction set than this machine's (cpu-neoverse on x86):
    its code then runs under qemu-user (runtime/qemu.py)."""
    return target.machine not in ("", get_target("host").machine)


def _missing_features(target) -> list:
    """What a CPU target of this instruction set needs that this CPU lacks (none for one built
    with -march=native: the code for a feature it lacks sits under #if, the fallback runs)."""
    return [] if target.isa == "native" else sorted(target.features - get_target("host").features)


def _check_runs_here(target) -> None:
    """A named CPU target of this instruction set runs only where this CPU has its features."""
    missing = _missing_features(target)
    if missing:
        raise StrataError(f"--target {target} needs {', '.join(missing)}, which this CPU lacks: "
                          f"run with --target host (or none), or print its code with --ir asm")


class Program:
    """A compiled program: call it like the original, print any stage with `ir(stage)`.

    On device "cuda" a call takes and returns torch CUDA tensors (runtime/program.py does the
    work; `use_graph` picks CUDA-graph replay for repeated calls); on "sim" the kernels run in
    the simulator and tensors come back on the CPU. `threads`: on "cpu", the OpenMP threads a
    call runs on (None: the cores other processes leave free, runtime/threads.py)."""

    def __init__(self, lowered: Lowered, device: str = "sim", use_graph: bool = True,
                 threads: int | None = None):
        if threads is not None and threads < 1:
            raise StrataError(f"threads must be at least 1, not {threads}")
        self.lowered, self.device, self.use_graph, self.threads = lowered, device, use_graph, threads
        self.torch_program = lowered.torch
        self._runtime = None
        self._plain_run = None      # the runtime's run, when a call returns its one output as is
        self.constants: dict = {}   # position -> a non-tensor example input it is specialised on
        self.ctx: Context | None = None     # what it was lowered with (Program.view lowers again)
        self.grad_params = None     # strata.compile's: the parameters that require grad (autograd.py)

    def ir(self, stage: str) -> str:
        return self.lowered.text(stage)

    def view(self, path: str = "strata-view.html", verdict=None) -> str:
        """Write the whole compilation as one offline HTML page (strata/view; `strata view` on
        the command line); `verdict` is a check.Report to show. Returns the path."""
        write_page(self, path, verdict=verdict)
        return path

    def source(self, language: str | None = None) -> str:
        """The emitted source: CUDA for a GPU target, C for a CPU one (`language` checks it)."""
        return self.lowered.text(language or self.lowered.target.language)

    @property
    def kernels(self):
        return self.lowered.kernel.kernels

    @property
    def runtime(self):
        """The CudaProgram (device "cuda") or NativeProgram (device "cpu") behind the program,
        compiled and loaded on first use."""
        return self._runtime if self._runtime is not None else self.load()

    def load(self):
        """Compile the kernels and load them now (CUDA: on the GPU; cpu: a shared library);
        returns the runtime. strata.compile calls it so that a failure surfaces at compile time."""
        if self.device not in ("cuda", "cpu"):
            raise StrataError(f"this program runs on the simulator (device {self.device!r}); "
                              f"nothing to load")
        if self.lowered.kernel is None:
            raise StrataError("this program was not lowered to Kernel IR; compile it whole to run it")
        self._check_runnable()
        if self.device == "cpu" and _emulated(self.lowered.target):
            self._runtime = QemuProgram(self.lowered.kernel, self.torch_program.weights,
                                        inputs=self.torch_program.inputs, target=self.lowered.target,
                                        source=self.lowered.source)
        elif self.device == "cpu":
            _check_runs_here(self.lowered.target)
            self._runtime = NativeProgram(self.lowered.kernel, self.torch_program.weights,
                                          inputs=self.torch_program.inputs,
                                          source=self.lowered.source or None, threads=self.threads,
                                          bounds=index_bounds(self.torch_program))
        else:
            self._runtime = CudaProgram(self.lowered.kernel, inputs=self.torch_program.inputs,
                                        weights=self.torch_program.weights, use_graph=self.use_graph,
                                        units=self.lowered.units)
        self._plain_run = self._runtime.run if self._one_plain_output() else None
        return self._runtime

    def set_weights(self, weights: dict) -> None:
        """New values for weights, by name (a torch.compile'd module's parameters after an
        optimizer step or load_state_dict): the runtime takes them and packs them again; the
        kernels are not rebuilt."""
        weights = {k: v.detach() for k, v in weights.items()}
        self.torch_program.weights.update(weights)
        weights.update(derive_weights(self.torch_program, weights))   # merged projections
        self.torch_program.weights.update(weights)
        if isinstance(self._runtime, (NativeProgram, CudaProgram)):
            self._runtime.set_weights(weights)
        elif self._runtime is not None:
            self.load()

    def with_weights(self, weights: dict) -> Program:
        """The same kernels over other values of some weights, by name (another module a
        torch.compile graph runs): a Program of its own, loaded if this one is (the compile
        cache has its code), so that the two never pack each other's weights."""
        twin = copy.copy(self)
        twin.torch_program = dataclasses.replace(self.torch_program, weights={
            **self.torch_program.weights, **{k: v.detach() for k, v in weights.items()}})
        twin.torch_program.weights.update(derive_weights(twin.torch_program, weights))
        twin._runtime = twin._plain_run = None
        if self._runtime is not None:
            twin.load()
        return twin

    def _check_runnable(self) -> None:
        empty = [k for k, v in self.torch_program.weights.items() if shape_only(v)]
        if empty:
            raise StrataError(f"this program was compiled from shapes only (weight {empty[0]} has "
                              f"no values); build it with weights to run it")

    def _check_inputs(self, inputs) -> dict[str, np.ndarray]:
        spec = self.torch_program.inputs
        check_args(spec, inputs)
        return {name: to_numpy(value) for name, value in zip(spec, inputs)}

    def run_flat(self, inputs) -> list[torch.Tensor]:
        """Outputs as torch tensors in program output order (on the device that ran them)."""
        if self.device in ("cuda", "cpu"):
            return self.runtime.run(inputs)
        outs = []
        for name, arr in zip(self.lowered.kernel.outputs, self.run_numpy(inputs)):
            dt = self.lowered.kernel.buffer(name).dtype     # outputs and inputs are all buffers
            arr = np.ascontiguousarray(arr).reshape(np.shape(arr))    # (ascontiguousarray makes 0-d 1-d)
            outs.append(torch.from_numpy(arr).to(dtypes.to_torch(dt)))
        return outs

    def run_numpy(self, inputs) -> list[np.ndarray]:
        """Outputs as NumPy arrays (bf16 as float32 values), in program output order."""
        if self.device in ("cuda", "cpu"):
            return [to_numpy(t) for t in self.runtime.run(inputs)]
        self._check_runnable()
        feed = self._check_inputs(inputs)
        feed.update({k: to_numpy(v) for k, v in self.torch_program.weights.items()})
        kp = self.lowered.kernel
        mutated = mutated_inputs(kp)
        result = simulate(dataclasses.replace(kp, outputs=kp.outputs + mutated) if mutated else kp,
                          feed)
        for name, given in zip(self.torch_program.inputs, inputs):
            if name in mutated:        # updated in place, as on CUDA (index_copy_ of a KV cache)
                with torch.no_grad():
                    given.copy_(torch.from_numpy(np.ascontiguousarray(result[name])).reshape(given.shape))
        return [result[o] if o in result else feed[o] for o in kp.outputs]

    def __call__(self, *inputs, out=None):
        """`out`: a tensor (or a sequence, one per output) to write the results into; on "cuda"
        the kernels write there and nothing is allocated."""
        if out is not None:
            return self._call_into(inputs, [out] if isinstance(out, torch.Tensor) else list(out))
        if self.grad_params is not None and torch.is_grad_enabled():     # autograd.py
            return without_backward(self._call(inputs), self.grad_params, inputs)
        return self._call(inputs)

    def _call_into(self, inputs, out: list):
        kp = self.lowered.kernel
        if kp is None or any(kp.buffer(name).kind != "output" for name in kp.outputs):
            raise StrataError("out= needs a program whose outputs are all computed (none an input "
                              "or weight returned as it is)")
        if len(out) != len(kp.outputs):
            raise InputMismatch(f"out= has {len(out)} tensors for {len(kp.outputs)} outputs")
        inputs = self._bound(inputs)
        if self.device == "cuda":
            self.runtime.run(inputs, out=out)
        else:
            check_args({name: kp.buffer(name) for name in kp.outputs}, out, out[0].device, "out=")
            with torch.no_grad():
                for o, r in zip(out, self.run_flat(inputs)):
                    o.copy_(r)
        return out[0] if len(out) == 1 else tuple(out)

    def _call(self, inputs):
        if self._plain_run is not None:        # a decode step's case: nothing to check or rebuild
            return self._plain_run(inputs)[0]
        inputs = self._bound(inputs)
        outs = self._aliased(self.run_flat(inputs), inputs)
        spec = self.torch_program.out_spec
        if spec is None or (len(outs) == 1 and spec.is_leaf()):
            return outs[0] if len(outs) == 1 else tuple(outs)
        return torch.utils._pytree.tree_unflatten(outs, spec)

    def _one_plain_output(self) -> bool:
        """Whether a call returns the runtime's one output as it is: no constant inputs to
        check, no input updated in place, no output structure to rebuild."""
        tp, spec = self.torch_program, self.torch_program.out_spec
        return (not self.constants and not tp.mutations and len(tp.outputs) == 1
                and (spec is None or spec.is_leaf()))

    def _bound(self, inputs) -> tuple:
        """The tensor inputs of a call; the non-tensor ones must equal what it was compiled for."""
        if not self.constants:
            return tuple(inputs)
        if len(inputs) != len(self.torch_program.inputs) + len(self.constants):
            raise InputMismatch(f"expected {len(self.torch_program.inputs) + len(self.constants)} "
                                f"inputs, got {len(inputs)}")
        for i, value in self.constants.items():
            if inputs[i] != value or type(inputs[i]) is not type(value):
                raise InputMismatch(f"input {i} was {value!r} when the program was compiled (it is "
                                    f"a constant of the program); got {inputs[i]!r}: compile again")
        return tuple(x for i, x in enumerate(inputs) if i not in self.constants)

    def _aliased(self, outs: list, inputs) -> list:
        """An output that is an input's new value after an in-place update (`x.add_(1)`) is the
        caller's tensor itself, as in eager."""
        tp = self.torch_program
        if not tp.mutations:
            return outs
        given = dict(zip(tp.inputs, inputs))
        updated = {value: given[name] for name, value in tp.mutations.items() if name in given}
        return [updated.get(name, out) for name, out in zip(tp.outputs, outs)]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):   # values as float32
        return t.float().numpy()
    return t.numpy()


def compile(fn, example_inputs, device: str | None = None, ctx: Context | None = None,
            until: str = "cuda", use_graph: bool = True, threads: int | None = None) -> Program:
    """Capture `fn(*example_inputs)` (a function or nn.Module) and lower it to kernels.

    A Hugging Face causal LM (a transformers model with a language-model head) is captured
    without its KV cache, and the program returns the logits tensor, `model(ids).logits`, not
    the ModelOutput. device="cuda" also compiles and loads the kernels on the current GPU; calls
    then take and return CUDA tensors; "cpu" builds them natively (C + OpenMP); "sim" runs them
    in the simulator (the default, unless ctx pins a CPU target: then "cpu"). A named CPU target
    whose features this CPU lacks (cpu-spr on an AVX2 machine) compiles, prints its source and
    says why at its first call. Inference only: a backward through its outputs raises one
    sentence (strata/api/autograd.py). use_graph: replay repeated CUDA calls as one CUDA graph.
    threads: on "cpu", the OpenMP threads a call runs on (default: the cores other processes
    leave free, looked at again as calls go on; strata.set_threads sets it for every program)."""
    ctx = ctx or Context()
    device = device or default_device(ctx)
    check_device(device)
    ctx = on_device(ctx, device)
    grad_params = [p for p in fn.parameters() if p.requires_grad] if isinstance(
        fn, torch.nn.Module) else []
    warn_inference_only("this strata.compile program", [*grad_params, *example_inputs])
    if _is_causal_lm(fn):
        fn = CausalLMLogits(fn)
    fn, tensors, constants = specialise(fn, tuple(example_inputs))
    torch_program = capture(fn, tensors, input_names=getattr(fn, "input_names", None))
    program = Program(lower_torch_program(torch_program, ctx, until), device, use_graph, threads)
    program.constants, program.ctx, program.grad_params = constants, ctx, grad_params
    if _loads(device, until) and not (device == "cpu" and not _emulated(ctx.target)
                                      and _missing_features(ctx.target)):
        program.load()
    return program


def default_device(ctx: Context) -> str:
    """Where a program runs when no device is named: natively for a pinned CPU target, else in
    the simulator."""
    return "cpu" if ctx.target is not None and not ctx.target.is_gpu else "sim"


def _loads(device: str, until: str) -> bool:
    """Whether compiling loads the kernels now (a native device, lowered to its source)."""
    return device in ("cuda", "cpu") and until in ("cuda", "c")


def specialise(fn, example_inputs: tuple):
    """(fn over the tensor inputs only, those tensors, {position: constant}): a Python number,
    bool or None among the example inputs is baked into the program, as torch.compile does."""
    constants = {i: a for i, a in enumerate(example_inputs) if not isinstance(a, torch.Tensor)}
    for i, a in constants.items():
        if not isinstance(a, (bool, int, float, type(None))):
            raise StrataError(f"example input {i} is a {type(a).__name__}; strata takes tensors, "
                              f"and Python numbers, bools or None (compiled as constants)")
    if not constants:
        return fn, example_inputs, {}
    names = _param_names(fn.forward if isinstance(fn, torch.nn.Module) else fn, len(example_inputs))
    call = fn if isinstance(fn, torch.nn.Module) else as_forward(fn)

    def forward(*tensors):
        it = iter(tensors)
        return call(*[constants[i] if i in constants else next(it)
                      for i in range(len(example_inputs))])

    module = FunctionModule(forward)
    if isinstance(fn, torch.nn.Module):
        module.inner = fn          # its parameters become the program's weights
    module.input_names = [n for i, n in enumerate(names) if i not in constants]
    return module, tuple(a for a in example_inputs if isinstance(a, torch.Tensor)), constants


def _is_causal_lm(fn) -> bool:
    if "transformers" not in sys.modules:      # never import transformers for a plain module
        return False
    return is_causal_lm(fn)


def compile_model(model: str, layer: int | None = None, seq_len: int = 128,
                  dtype: str | None = None, ctx: Context | None = None, until: str = "cuda",
                  device: str | None = None, materialise: bool = False, progress=None,
                  quant: str | None = None):
    """Build MODEL (a bundled name or a directory, strata/models), capture it and lower it;
    `quant` (q8_0, q4_0) quantizes its linear weights first (strata/quant).

    materialise=False compiles from shapes only (fake tensors: no weight is allocated);
    True allocates and loads (or draws) the weights so that the Program can run. progress(text)
    is told what is happening. device None: the simulator, or the CPU for a pinned CPU target
    (built natively only when materialised). Returns (Program, BuiltModel)."""
    device = device or default_device(ctx or Context())
    check_device(device)
    ctx = on_device(ctx or Context(), device)
    say = progress or (lambda text: None)
    say(f"building {model}")
    t0 = time.perf_counter()
    built = build(model, layer=layer, seq_len=seq_len, dtype=dtype, materialise=materialise,
                  quant=quant)
    ctx.log(f"{'build model':<28} {(time.perf_counter() - t0) * 1e3:8.2f} ms")
    say(f"capturing {built.what} with torch.export")
    t0 = time.perf_counter()
    torch_program = capture(built.module, built.example_inputs, input_names=built.input_names)
    ctx.log(f"{'capture (torch.export)':<28} {(time.perf_counter() - t0) * 1e3:8.2f} ms")
    say(f"lowering {len(torch_program.nodes)} aten ops")
    program = Program(lower_torch_program(torch_program, ctx, until), device)
    program.ctx = ctx
    if _loads(device, until) and (materialise or device == "cuda"):
        program.load()
    return program, built


def compile_snippet(code: str, ctx: Context | None = None, until: str = "cuda",
                    device: str | None = None):
    """Parse and lower a `-c` snippet; returns (Program, snippet). device None: compile only
    (for the pinned target, nothing is loaded); "sim", "cuda" or "cpu": to run there."""
    ctx = ctx or Context()
    load = device in ("cuda", "cpu")
    device = device or default_device(ctx)
    ctx = on_device(ctx, device)
    t0 = time.perf_counter()
    torch_program = capture_cache.load(code)
    snippet = parse_snippet(code, dry=torch_program is None)
    how = "capture (cached)"
    if torch_program is None:
        torch_program, how = capture_snippet(snippet), "capture (torch.export)"
        capture_cache.store(code, torch_program)
    ctx.log(f"{how:<28} {(time.perf_counter() - t0) * 1e3:8.2f} ms")
    program = Program(lower_torch_program(torch_program, ctx, until), device)
    program.ctx = ctx
    if load and until in ("cuda", "c"):
        program.load()
    return program, snippet


__all__ = ["STAGES", "Program", "compile", "compile_model", "on_device"]
