"""`torch.compile(model, backend="strata")`: dynamo hands strata one FX graph at a time.

Each graph is re-exported with torch.export (frontend/dynamo_graph.py) and lowered like
`strata.compile`'s (an entry point beside strata/api/, above the stages it runs). Traced for training
(autograd on, an input such as a parameter requiring grad), the graph goes through AOTAutograd:
its forward graph (which also returns the activations the backward saves) and its backward
graph are each compiled as an inference graph is, both at compile time, so an op either lacks
is named then. `torch.compile(opt.step, backend="strata")` compiles the optimizer step: dynamo
holds its parameters and state as its graph's own attributes, which become inputs the program
updates in place (_capture), its foreach ops one op per tensor (torch_compile/rewrite.py).

The graph inputs dynamo marks static (a module's parameters and buffers) are the program's
weights, packed once as strata.compile's are, and again when one's storage or version changes
(frontend/dynamo_graph.py). An input or buffer the graph updates in place (transformers'
static KV cache and its length counters, an optimizer's parameters and state) is written in the
caller's tensor, as strata's own KV cache is, and its version counter bumped. Each graph is
compiled for its concrete input shapes; a graph dynamo made shape-dynamic (after a recompile)
gets one Program per bucket of sizes (torch_compile/buckets.py: the dynamic KV cache's lengths
share one), or, where it cannot run padded exactly, one per shape it is called with; a static
graph takes the Program of any other graph of the process that computes the same on the same
tensors (frontend/dynamo_key.py), so a repeated `generate` compiles nothing, and a later process
takes it from the compile cache (saved_graphs.py). Floats dynamo passes as 0-d tensors read by
`.item()` (with dynamic=True) are constants of a graph per set of their values (floats.py).
A graph strata cannot compile raises a strata error naming every
unsupported aten op; only an explicit opt-in (options={"fallback": True} or STRATA_FALLBACK=1)
runs such a graph eagerly, with a warning naming the ops.

Registered twice over: a `torch_dynamo_backends` entry point in pyproject.toml (torch finds it
without `import strata`), and `register()`, called by `import strata` when no entry point names
this module (a source checkout on sys.path, or an install older than the module's move here).
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
import weakref
from importlib.metadata import entry_points

import torch

from ..api import Program, check_device, on_device
from ..core.context import Context
from ..core.errors import StrataError, UnsupportedOp
from ..frontend.capture import capture
from . import saved_graphs
from .buckets import Padded, Refused
from .floats import float_inputs, specialise
from .programs import BucketProgram, CompiledGraph
from .rewrite import foreach_per_tensor, lift_attributes
from .saved_graphs import Saved
from .training import forward_and_backward, training
from ..frontend.dynamo_graph import (SpecialisedGraph, args_key, concrete, count_ops, is_dynamic,
                                    mutated_weights, placeholder_names, weight_positions)
from ..frontend.dynamo_key import graph_key
from ..pipeline import lower_torch_program
from ..tensor.decompose import supported_ops

NAME = "strata"
ENTRY_POINT = "strata.torch_compile.backend:strata_backend"     # pyproject.toml
# options={...} of torch.compile, with their defaults (printed by `describe_options`).
OPTIONS = {
    "device": "auto",       # auto: cuda for CUDA inputs, else cpu (native C); or "sim" / "cuda" / "cpu"
    "fallback": False,      # run a graph strata cannot compile eagerly, with a warning
    "knobs": {},            # schedule knobs, as --knob NAME=VALUE (strata/core/knobs.py)
    "verbosity": 0,         # -v level of the lowering log (stderr)
    "use_graph": True,      # device cuda: replay repeated calls as one CUDA graph
}


class UnsupportedGraph(UnsupportedOp):
    """A dynamo graph holding aten ops strata has no rule for; names every one."""

    def __init__(self, ops: dict[str, str]):
        self.ops = list(ops)
        self.summary = (f"unsupported op{'s' if len(ops) > 1 else ''} " + "; ".join(
            op + (f" (at {where})" if where else "") for op, where in ops.items()))
        StrataError.__init__(self, (
            f"strata cannot compile this graph: {self.summary}. Pass options={{'fallback': True}} "
            f"to torch.compile or set STRATA_FALLBACK=1 to run such graphs eagerly"))
        self.op, self.where = self.ops[0], ops[self.ops[0]]


class StrataManyShapesWarning(UserWarning):
    """A shape-dynamic graph that cannot run padded to a bucket (buckets.py) has been compiled
    for many shapes: said once per graph."""


MANY_SHAPES = 8             # programs of one graph before StrataManyShapesWarning


class StrataFallbackWarning(UserWarning):
    """A graph strata could not compile runs eagerly (fallback was asked for)."""


def options_of(options: dict | None) -> dict:
    """OPTIONS overridden by the environment (STRATA_FALLBACK) and then by torch.compile's."""
    opts = dict(OPTIONS)
    env = os.environ.get("STRATA_FALLBACK", "")
    if env:
        opts["fallback"] = env.lower() in ("1", "true", "yes", "on")
    unknown = sorted(set(options or {}) - set(OPTIONS))
    if unknown:
        raise StrataError(f"unknown strata option{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    opts.update(options or {})
    if opts["device"] not in ("auto", "sim", "cuda", "cpu"):
        raise StrataError(f"unknown device {opts['device']!r}; choose auto, sim, cuda or cpu")
    return opts


def describe_options(opts: dict) -> str:
    """One line, as logged at verbosity >= 1."""
    return "strata backend options: " + ", ".join(f"{k}={v!r}" for k, v in opts.items())


def strata_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None,
                   mode: str | None = None):
    """The torch.compile backend: compile `gm` for `example_inputs` now (so that an error shows
    at compile time) and return a callable dynamo runs instead of the graph. `mode` is accepted
    and ignored (strata has one schedule heuristic; knobs pin the rest)."""
    opts = options_of(options)
    if training(example_inputs):
        if is_dynamic(gm):
            return _TrainingByShape(gm, opts)
        return forward_and_backward(gm, example_inputs, lambda g, inputs: _first_entry(g, inputs, opts),
                                    flash=_on_gpu(opts, example_inputs))
    graph = StrataGraph(gm, opts)
    entry = graph.entry([concrete(a) for a in example_inputs])
    return gm.forward if isinstance(entry, _Eager) else graph


def _on_gpu(opts, inputs) -> bool:
    """Whether the graph compiles for a GPU (or its simulator): the device option, or auto with
    CUDA inputs."""
    device = opts["device"]
    if device == "auto":
        return any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in inputs)
    return device in ("sim", "cuda")


def _first_entry(g, inputs, opts) -> StrataGraph:
    """A StrataGraph for an AOTAutograd graph, its program compiled now for `inputs`."""
    graph = StrataGraph(g, opts)
    graph.entry(inputs)
    return graph


def register() -> None:
    """Make backend="strata" known to torch when the entry point is not installed."""
    if any(ep.value == ENTRY_POINT for ep in entry_points(group="torch_dynamo_backends")):
        return                     # torch loads us through the entry point (importing it here costs ~1 s)
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
    if NAME not in _COMPILER_FNS:
        register_backend(strata_backend, name=NAME)


# ---------------------------------------------------------------- one graph


# graph_key -> a CompiledGraph some live StrataGraph holds (weakly: gone with dynamo's cache)
_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class StrataGraph:
    """Dynamo's compiled function for one graph: a Program per input signature."""

    def __init__(self, gm: torch.fx.GraphModule, opts: dict):
        self.gm, self.opts = gm, opts
        self.entries: dict = {}
        self.names = placeholder_names(gm)
        # floats dynamo passes as 0-d tensors read by .item(): a graph per set of their values
        self.floats = float_inputs(gm)
        # dynamo's guards hold a static graph's inputs to one signature: no lookup per call
        self.only = None if is_dynamic(gm) or self.floats else False
        self.padded = self._padded() if self.only is None and not self.floats else None

    def _padded(self) -> Padded | None:
        """The graph's bucket plan, or None (said at verbosity 1): a graph the plan does not
        understand, whatever the reason, gets a program per shape, which is always right."""
        try:
            return Padded(self.gm)
        except Exception as e:  # noqa: BLE001
            why = str(e) if isinstance(e, Refused) else f"{type(e).__name__}: {e}"
            self._say(f"a program per size for this shape-dynamic graph: {why}")
            return None

    def _say(self, text: str) -> None:
        if self.opts["verbosity"]:
            print(f"strata: {text}", file=sys.stderr)

    def entry(self, args):
        if self.floats:
            return self._by_value(args).entry(args)
        if self.padded is not None:
            values = self.padded.values(args)
            caps = self.padded.caps(values)
            key = ("bucket", *caps)
            if key not in self.entries:
                try:
                    self.entries[key] = self._bucket(args, values, caps)
                except Refused as e:
                    self._say(f"a program per size for this shape-dynamic graph: {e}")
                    self.padded = None
                    return self.entry(args)
            return self.entries[key]
        key = args_key(args)
        if key not in self.entries:
            try:
                self.entries[key] = self._shared(args)
            except StrataError as e:
                if not self.opts["fallback"]:
                    raise
                why = e.summary if isinstance(e, UnsupportedGraph) else str(e)
                warnings.warn(f"strata: running a graph of {count_ops(self.gm)} torch ops eagerly "
                              f"(fallback is on): {why}", StrataFallbackWarning, stacklevel=2)
                self.entries[key] = _Eager(self.gm)
        return self.entries[key]

    def _by_value(self, args) -> StrataGraph:
        """The graph with its floats read as this call's values (floats.py), made once per set."""
        values = tuple(float(args[i]) for i in self.floats)
        if values not in self.entries:
            if len(self.entries) + 1 == MANY_SHAPES:
                warnings.warn(f"strata has compiled a graph of {count_ops(self.gm)} torch ops for "
                              f"{MANY_SHAPES} values of the floats it reads (a value is a constant "
                              f"of its program); pass a float that changes at every call as a "
                              f"tensor", StrataManyShapesWarning, stacklevel=3)
            self.entries[values] = StrataGraph(specialise(self.gm, self.floats, values), self.opts)
        return self.entries[values]

    def _bucket(self, args, values, caps) -> BucketProgram:
        """The program of the bucket these sizes fall in (buckets.py)."""
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        try:
            gm = self.padded.graph(caps)
            inputs = self.padded.inputs(args, values, caps, device)
        except Refused:
            raise
        except Exception as e:  # noqa: BLE001 - as in _padded
            raise Refused(f"{type(e).__name__}: {e}") from None
        try:
            compiled = _compile(gm, inputs, placeholder_names(gm), self.opts)
        except StrataError as e:
            raise Refused(f"its padded graph does not compile ({e})") from None
        if compiled.lifted:
            raise Refused("it updates its own attributes in place")
        given = [i for i in range(len(args)) if i not in self.padded.sym_positions]
        self._say(f"one program for sizes {', '.join(f'{s} <= {c}' for s, c in zip(self.padded.symbols, caps))}")
        return BucketProgram(self.padded, compiled, caps, device, [
            (w, given[w]) for w in compiled.written if given[w] in self.padded.pad_inputs])

    def _shared(self, args) -> CompiledGraph:
        """The program another graph of this process compiled for the same computation on the
        same tensors (frontend/dynamo_key.py), else a new one."""
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        key = graph_key(self.gm, args, set(weight_positions(self.gm, args)))
        if key is not None:
            key = (key, repr(sorted(self.opts.items())))
            if (twin := _SHARED.get(key)) is not None:
                return twin.moved(twin.tensor_positions, tensors)
        compiled = _compile(self.gm, args, self.names, self.opts)
        compiled.tensor_positions = tensors
        if len(self.entries) + 1 == MANY_SHAPES:
            warnings.warn(f"strata has compiled {MANY_SHAPES} programs for one shape-dynamic graph "
                          f"of {count_ops(self.gm)} torch ops, one per shape it met (it cannot run "
                          f"padded to a bucket of sizes: verbosity 1 says why); with transformers' "
                          f"generate pass cache_implementation='static'", StrataManyShapesWarning,
                          stacklevel=2)
        if key is not None and not compiled.lifted:     # another graph's are other tensors
            _SHARED[key] = compiled
        return compiled

    def __call__(self, *args):
        entry = self.only or self.entry(args)
        if self.only is False:
            self.only = entry
        return entry(args)


class _TrainingByShape:
    """A training graph dynamo made shape-dynamic (a batch of another size came): AOTAutograd's
    forward and backward graphs traced and compiled for each set of shapes met, at its first
    call, as a static graph's are at compile time (strata's programs have fixed shapes)."""

    def __init__(self, gm: torch.fx.GraphModule, opts: dict):
        self.gm, self.opts, self.by_shape = gm, opts, {}

    def __call__(self, *args):
        key = args_key(args)
        if key not in self.by_shape:
            if len(self.by_shape) + 1 == MANY_SHAPES:
                warnings.warn(f"strata has compiled a training graph of {count_ops(self.gm)} torch "
                              f"ops for {MANY_SHAPES} shapes, forward and backward for each; pad "
                              f"batches to a few sizes", StrataManyShapesWarning, stacklevel=2)
            self.by_shape[key] = forward_and_backward(
                self.gm, list(args), lambda g, inputs: _first_entry(g, inputs, self.opts),
                flash=_on_gpu(self.opts, args))
        return self.by_shape[key](*args)


class _Eager:
    def __init__(self, gm):
        self.gm = gm

    def __call__(self, args):
        return self.gm(*args)


def _compile(gm, args, names, opts) -> CompiledGraph:
    device = opts["device"]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    on_cuda = any(t.device.type == "cuda" for t in tensors)
    if device == "auto":
        device = "cuda" if on_cuda else "cpu"      # CPU tensors run natively
    if device == "cuda" and not all(t.device.type == "cuda" for t in tensors):
        raise StrataError("device cuda needs every input of the graph on the GPU; "
                          "some are on the CPU")
    check_device(device)
    ctx = on_device(Context(verbosity=int(opts["verbosity"]), knobs=dict(opts["knobs"])), device)
    key = saved_graphs.key(gm, args, weight_positions(gm, args), opts, ctx)
    with _progress(opts) as say, torch.no_grad():
        if key is not None and (hit := saved_graphs.load(key, args)) is not None:
            lowered, saved = hit
            say("strata: the graph's program from the compile cache")
            ctx.log("strata: the graph's program from the compile cache (no capture, no lowering)")
            return CompiledGraph(_loaded(Program(lowered, device, bool(opts["use_graph"])), say),
                                 saved.plan, saved.slots, device, saved.weights, args, (),
                                 saved.written)
        say(f"strata: capturing a graph of {count_ops(gm)} torch ops")
        module, torch_program, lifted = _capture(gm, args, names)
        if device == "cuda" and not all(t.device.type == "cuda" for t in lifted):
            raise StrataError("device cuda needs every tensor the graph updates on the GPU; some "
                              "are on the CPU (an optimizer's step counters made before "
                              "torch.compile, without capturable=True)")
        _check_supported(torch_program)
        program = None
        if torch_program.outputs or torch_program.mutations:
            ctx.log(describe_options({**opts, "device": device}))
            say(f"strata: lowering {len(torch_program.nodes)} aten ops to kernels")
            program = _loaded(Program(lower_torch_program(torch_program, ctx, "cuda"), device,
                                      bool(opts["use_graph"])), say)
    weights = {i: torch_program.weight_of[a] for i, a in module.weights.items()}
    written = [i for i, name in zip(module.slots, torch_program.inputs)
               if name in torch_program.mutations]
    if key is not None and program is not None and not lifted:
        saved_graphs.store(key, program.lowered, Saved(module.plan, module.slots, weights, written))
    return CompiledGraph(program, module.plan, module.slots, device, weights, [*args, *lifted],
                         lifted, written)


def _loaded(program: Program, say) -> Program:
    """`program` built for its device (the C compiler or NVRTC; the simulator needs nothing)."""
    if program.device in ("cuda", "cpu"):
        say(f"strata: compiling {len(program.kernels)} kernels "
            f"({'NVRTC' if program.device == 'cuda' else 'the C compiler'})")
        program.load()
    return program


def _capture(gm, args, names):
    """(SpecialisedGraph, its Torch IR, the tensors it reads after `args`): parameters and buffers
    become weights, except what the graph updates in place, captured again as an input that the
    program writes in place: a buffer (a static KV cache or its length counter) or an attribute
    of dynamo's graph itself (`gm.` in the Torch IR: an optimizer's parameters and state), which
    becomes an input after the graph's own, its tensor passed at every call."""
    gm = foreach_per_tensor(gm)
    module, lifted = SpecialisedGraph(gm, args, names), []
    # export's own fake mode, not dynamo's: whose guards name dynamo's frame locals
    with torch._guards.tracing(None):
        torch_program = capture(module, [args[i] for i in module.slots],
                                input_names=[names[i] for i in module.slots])
        if mutated := mutated_weights(torch_program):
            keep = {i for i, name in module.weights.items() if name in mutated}
            if attrs := sorted(t.removeprefix("gm.") for t in mutated if t.startswith("gm.")):
                gm, lifted, more = lift_attributes(gm, attrs, names)
                keep.update(range(len(args), len(args) + len(lifted)))
                args, names = [*args, *lifted], [*names, *more]
            module = SpecialisedGraph(gm, args, names, inputs=frozenset(keep))
            torch_program = capture(module, [args[i] for i in module.slots],
                                    input_names=[names[i] for i in module.slots])
    # what is still updated in place is not a tensor the program is given (a submodule's buffer
    # updated inside a call_module): refused, not dropped
    if left := sorted(mutated_weights(torch_program)):
        what = ", ".join(t.removeprefix("gm.") for t in left[:3]) + (", ..." if len(left) > 3 else "")
        raise StrataError(f"strata cannot compile this graph: it updates tensors in place that it "
                          f"would not write back ({what}). Pass options={{'fallback': True}} to "
                          f"torch.compile or set STRATA_FALLBACK=1 to run such graphs eagerly")
    return module, torch_program, lifted


@contextlib.contextmanager
def _progress(opts):
    """A spinner on stderr saying what the backend is doing, when stderr is a terminal (compiling
    a whole model's forward takes tens of seconds); silent otherwise and at verbosity >= 1."""
    if opts["verbosity"] or not sys.stderr.isatty():
        yield lambda text: None
        return
    from rich.console import Console
    with Console(stderr=True).status("strata") as status:
        yield status.update


def _check_supported(torch_program) -> None:
    """Name every op without a rule at once (lowering would stop at the first)."""
    rules = set(supported_ops())
    missing: dict[str, str] = {}
    for n in torch_program.nodes:
        op = "getitem" if n.op == "getitem" else n.packet
        if op not in rules and op not in missing:
            missing[op] = str(n.where) if n.where else ""
    if missing:
        raise UnsupportedGraph(missing)
