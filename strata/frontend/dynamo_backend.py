"""`torch.compile(model, backend="strata")`: dynamo hands strata one FX graph at a time.

Why re-export: dynamo's graph holds torch-level calls (torch.relu, F.linear) with every parameter
and buffer lifted to a graph input. Exporting that GraphModule with torch.export (capture.py,
strata's decomposition table) gives exactly the aten graph `strata.compile` sees, with the user's
source lines kept as provenance. Inference only: outputs carry no autograd history.

Each graph is compiled for its concrete input shapes; a graph dynamo made shape-dynamic (after a
recompile) gets one Program per shape it is called with. A graph strata cannot compile raises a
strata error naming every unsupported aten op; only an explicit opt-in (options={"fallback":
True} or STRATA_FALLBACK=1) runs such a graph eagerly, with a warning naming the ops.

Registered twice over: a `torch_dynamo_backends` entry point in pyproject.toml (torch finds it
without `import strata`), and `register()`, called by `import strata` when no entry point is
installed (a source checkout on sys.path).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch import nn

from ..errors import StrataError, UnsupportedOp

NAME = "strata"
# options={...} of torch.compile, with their defaults (printed by `describe_options`).
OPTIONS = {
    "device": "auto",       # auto: cuda for CUDA inputs, else cpu (native C); or "sim" / "cuda" / "cpu"
    "fallback": False,      # run a graph strata cannot compile eagerly, with a warning
    "knobs": {},            # schedule knobs, as --knob NAME=VALUE (strata/knobs.py)
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


class StrataFallbackWarning(UserWarning):
    """A graph strata could not compile runs eagerly (fallback was asked for)."""


class StrataNoGradWarning(UserWarning):
    """A graph compiled with autograd on: its outputs carry no autograd history."""


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
    graph = StrataGraph(gm, opts)
    entry = graph.entry([_hint(a) for a in example_inputs])
    if torch.is_grad_enabled() and not isinstance(entry, _Eager) and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs):
        warnings.warn("strata's torch.compile backend is inference only: this graph's outputs "
                      "carry no autograd history (call the model under torch.no_grad())",
                      StrataNoGradWarning, stacklevel=2)
    return gm.forward if isinstance(entry, _Eager) else graph


def register() -> None:
    """Make backend="strata" known to torch when the entry point is not installed."""
    from importlib.metadata import entry_points
    if any(ep.name == NAME for ep in entry_points(group="torch_dynamo_backends")):
        return                     # torch loads us through the entry point (importing it here costs ~1 s)
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
    if NAME not in _COMPILER_FNS:
        register_backend(strata_backend, name=NAME)


# ---------------------------------------------------------------- one graph


def _hint(a):
    """A concrete example value: dynamo passes a SymInt (with its example value as hint) for a
    size input of a shape-dynamic graph; the call-time value is a plain int."""
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        if a.node.hint is None:
            raise StrataError(f"strata needs concrete sizes; graph input {a} has no example value")
        return a.node.hint
    return a


def _count_ops(gm) -> int:
    return sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)


def _signature(args) -> tuple:
    """What a Program is specialised on: tensor shapes, dtypes, devices; other inputs' values."""
    return tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor)
                 else (type(a).__name__, a) for a in args)


class StrataGraph:
    """Dynamo's compiled function for one graph: a Program per input signature."""

    def __init__(self, gm: torch.fx.GraphModule, opts: dict):
        self.gm, self.opts = gm, opts
        self.entries: dict = {}
        self.names = _input_names(gm)

    def entry(self, args):
        key = _signature(args)
        if key not in self.entries:
            try:
                self.entries[key] = _compile(self.gm, args, self.names, self.opts)
            except StrataError as e:
                if not self.opts["fallback"]:
                    raise
                why = e.summary if isinstance(e, UnsupportedGraph) else str(e)
                warnings.warn(f"strata: running a graph of {_count_ops(self.gm)} torch ops eagerly "
                              f"(fallback is on): {why}", StrataFallbackWarning, stacklevel=2)
                self.entries[key] = _Eager(self.gm)
        return self.entries[key]

    def __call__(self, *args):
        return self.entry(args)(args)


class _Eager:
    def __init__(self, gm):
        self.gm = gm

    def __call__(self, args):
        return self.gm(*args)


class _Plan:
    """Where each leaf of dynamo's output comes from (a plain object: torch.export restores a
    module's attributes and containers after tracing, not the attributes of this)."""
    leaves: list | None = None
    spec = None


class _Specialised(nn.Module):
    """`gm` with its non-tensor inputs fixed, returning only the tensors it computes; the rest
    of its output (inputs passed through, constants) is recorded in `plan` while it is traced."""

    def __init__(self, gm, args):
        super().__init__()
        self.gm = gm
        self.slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self.fixed = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
        self.plan = _Plan()

    def forward(self, *tensors):
        args = dict(self.fixed)
        args.update(zip(self.slots, tensors))
        with fx_traceback.preserve_node_meta():    # keep dynamo's user stack traces as provenance
            out = torch.fx.Interpreter(self.gm).run(*(args[i] for i in range(len(args))))
        leaves, spec = pytree.tree_flatten(out)
        plan, computed = [], []
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                plan.append(("const", leaf))
            elif any(leaf is t for t in tensors):        # an input returned as is: keep the alias
                plan.append(("input", self.slots[next(j for j, t in enumerate(tensors) if leaf is t)]))
            else:
                k = next((j for j, c in enumerate(computed) if c is leaf), None)
                if k is None:
                    computed.append(leaf)
                    k = len(computed) - 1
                plan.append(("out", k))
        self.plan.leaves, self.plan.spec = plan, spec
        return tuple(computed)


class _Compiled:
    """One Program and how to rebuild dynamo's output structure around its outputs."""

    def __init__(self, program, plan, slots, device):
        self.program, self.plan, self.slots, self.device = program, plan, slots, device

    def __call__(self, args):
        tensors = [args[i] for i in self.slots]
        flat = self.program.run_flat(tensors) if self.program is not None else []
        where = next((t.device for t in tensors), torch.device("cpu"))
        if self.device == "sim" and where.type != "cpu":
            flat = [t.to(where) for t in flat]
        leaves = [flat[v] if kind == "out" else args[v] if kind == "input" else v
                  for kind, v in self.plan.leaves]
        return pytree.tree_unflatten(leaves, self.plan.spec)


def _compile(gm, args, names, opts) -> _Compiled:
    from ..api import Program, check_device, on_device
    from ..context import Context
    from ..pipeline import lower_torch_program
    from .capture import capture
    device = opts["device"]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    on_cuda = any(t.device.type == "cuda" for t in tensors)
    if device == "auto":
        device = "cuda" if on_cuda else "cpu"      # CPU tensors run natively
    if device == "cuda" and not all(t.device.type == "cuda" for t in tensors):
        raise StrataError("device cuda needs every input of the graph on the GPU; "
                          "some are on the CPU")
    check_device(device)
    module = _Specialised(gm, args)
    slot_names = [names[i] for i in module.slots]
    with _progress(opts) as say, torch.no_grad():
        say(f"strata: capturing a graph of {_count_ops(gm)} torch ops")
        torch_program = capture(module, tuple(tensors), input_names=slot_names)
        _check_functional(torch_program)
        _check_supported(torch_program)
        program = None
        if torch_program.outputs:
            ctx = on_device(Context(verbosity=int(opts["verbosity"]), knobs=dict(opts["knobs"])), device)
            ctx.log(describe_options({**opts, "device": device}))
            say(f"strata: lowering {len(torch_program.nodes)} aten ops to kernels")
            program = Program(lower_torch_program(torch_program, ctx, "cuda"), device,
                              bool(opts["use_graph"]))
            if device in ("cuda", "cpu"):
                say(f"strata: compiling {len(program.kernels)} kernels "
                    f"({'NVRTC' if device == 'cuda' else 'the C compiler'})")
                program.load()
    return _Compiled(program, module.plan, module.slots, device)


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
    from ..tensor.decompose import supported_ops
    rules = set(supported_ops())
    missing: dict[str, str] = {}
    for n in torch_program.nodes:
        op = "getitem" if n.op == "getitem" else n.packet
        if op not in rules and op not in missing:
            missing[op] = str(n.where) if n.where else ""
    if missing:
        raise UnsupportedGraph(missing)


def _check_functional(torch_program) -> None:
    """An in-place update of a graph input would be lost: refuse it clearly."""
    from torch.export.graph_signature import InputKind, OutputKind
    sig = torch_program.exported.graph_signature
    users = [s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    names = dict(zip(users, torch_program.input_names))
    mutated = [names.get(s.target, s.target) for s in sig.output_specs
               if s.kind in (OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION)]
    if mutated:
        raise StrataError(f"strata cannot compile this graph: it updates its input"
                          f"{'s' if len(mutated) > 1 else ''} {', '.join(mutated)} in place")


def _input_names(gm) -> list[str]:
    """Readable, unique names for dynamo's placeholders: L_self_modules_fc1_parameters_weight_
    -> fc1_weight, L_x_ -> x."""
    out: list[str] = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        name = n.name
        for prefix in ("L_", "l_"):
            name = name.removeprefix(prefix)
        name = name.rstrip("_")
        name = re.sub(r"^(self|s)_(?=(modules|parameters|buffers)_)", "", name)
        name = re.sub(r"(^|_)(modules|parameters|buffers)_", r"\1", name)
        if not name.isidentifier():
            name = f"in{len(out)}"
        base, k = name, 1
        while name in out:
            name, k = f"{base}_{k}", k + 1
        out.append(name)
    return out
