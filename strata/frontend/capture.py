"""Capture a module or function as Torch IR with torch.export.

Decomposition choice: `run_decompositions` gets a small table (`DECOMPOSE`) instead of the full
core-aten set. Ops that read well and that `strata.tensor.decompose` lowers directly stay whole:
rms_norm, layer_norm, softmax, log_softmax, logsumexp, gelu, silu, linear, matmul, mm, bmm, addmm,
var, std, linalg_vector_norm, masked_fill, lerp, clamp*, triu/tril, cat, stack, flip, roll,
repeat, embedding, index_select, gather, the view family and every pointwise op. Only rarer
composites whose core decomposition lands in that set (softplus, hardswish, addcmul, einsum,
baddbmm, split, unbind, ...) are decomposed, so the printed graph stays one node per user-level
op and the rule table stays small. Anything else that survives is reported by decompose.py as
`unsupported op aten.X (at <user line>)`.
"""
from __future__ import annotations

import functools
import inspect
import operator
import types
import warnings

import torch
from torch import nn

from ..core import dtypes
from ..core.errors import DataDependentShape, StrataError
from .snippet import quiet_torch, register_source, user_line
from .static_experts import static_experts
from .torch_ir import Ref, TorchNode, TorchProgram, TorchType, user_frame

_A = torch.ops.aten
# Composites decomposed before Tensor IR (their core decompositions use ops decompose.py knows).
DECOMPOSE = [
    _A.hardswish, _A.hardsigmoid, _A.celu, _A.selu, _A.softplus, _A.mish, _A.relu6, _A.logit,
    _A.addcmul, _A.addcdiv, _A.baddbmm, _A.mv, _A.dot, _A.rsub,
    _A.xlogy, _A.frac, _A.deg2rad, _A.einsum, _A.cosine_similarity, _A.split, _A.unbind,
    _A.heaviside, _A.logaddexp, _A.sgn, _A.nan_to_num, _A.rot90, _A.norm, _A.diff,
    _A.instance_norm, _A.one_hot, _A.repeat_interleave, _A.cross_entropy_loss, _A.nll_loss,
    _A.nll_loss_nd, _A.nll_loss2d,
]
# Skip run_decompositions when it could not change the graph (tests compare both paths).
FAST_PATH = True
# Ops that compute nothing (shape/dtype assertions export inserts): dropped from Torch IR.
NOOPS = {"aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size",
         "aten._assert_async", "aten.sym_constrain_range"}


@functools.lru_cache(maxsize=None)
def _table() -> tuple:
    from torch._decomp import core_aten_decompositions
    wanted = set(DECOMPOSE)
    return tuple((op, fn) for op, fn in core_aten_decompositions().items()
                 if getattr(op, "overloadpacket", None) in wanted)


def decomposition_table() -> dict:
    """The subset of torch's core-aten decompositions strata applies (see DECOMPOSE)."""
    return dict(_table())


def as_forward(fn):
    """`fn` with its code renamed to "forward": torch.export records stack-trace frames only for
    functions of that name, and this frame is the user's line we want as provenance."""
    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or code is None:
        return fn
    renamed = types.FunctionType(code.replace(co_name="forward"), fn.__globals__, fn.__name__,
                                 fn.__defaults__, fn.__closure__)
    renamed.__kwdefaults__ = fn.__kwdefaults__
    return renamed


class FunctionModule(nn.Module):
    """A plain function as a module, so torch.export can capture it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = as_forward(fn)

    def forward(self, *args):
        return self.fn(*args)


def _param_names(fn, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) < n:
        names += [f"in{i}" for i in range(len(names), n)]
    return names[:n]


def _type_of(val):
    if isinstance(val, torch.Tensor) and not all(isinstance(s, int) for s in val.shape):
        raise DataDependentShape()
    if isinstance(val, torch.Tensor):
        return TorchType(tuple(int(s) for s in val.shape), dtypes.from_torch(val.dtype))
    if isinstance(val, (tuple, list)):
        return tuple(_type_of(v) for v in val)
    return None


def _weight_name(kind: str, target: str, strip: str) -> str:
    if target.startswith(strip):
        target = target[len(strip):]
    if kind == "c":
        return "const_" + target.replace("lifted_tensor_", "").replace(".", "_")
    return f"{kind}_{target.replace('.', '_')}"


def _common_module_prefix(targets: list[str]) -> str:
    """ "rmsnorm." when every weight lives in one top-level submodule (strip it: p_weight)."""
    heads = {t.split(".")[0] for t in targets if "." in t}
    if len(heads) == 1 and all("." in t for t in targets):
        return heads.pop() + "."
    return ""


KEPT = {"aten::reshape", "aten::to"}     # CompositeImplicit, and taken as they are by their rules


def _already_final(ep) -> bool:
    """True when run_decompositions could only decompose ops in KEPT: every op is a functional
    aten op neither in DECOMPOSE nor a CompositeImplicit op export would decompose; detach_
    becomes detach. (It costs 0.4 s on a tiny graph, 2.9 s on a 22-layer decoder.)"""
    try:
        from torch._export.utils import _is_preservable_cia_op
    except ImportError:
        return False
    decompose = set(DECOMPOSE)
    detached = []
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        op = n.target
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            return False
        if op is torch.ops.aten.detach_.default:
            detached.append(n)
            continue
        if op._schema.is_mutable or op.overloadpacket in decompose:
            return False
        cia = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
        if cia and not _is_preservable_cia_op(op) and op._schema.name not in KEPT:
            return False
    for n in detached:
        n.target = torch.ops.aten.detach.default
    return True


def _export(module, example_inputs):
    from torch.fx.experimental.symbolic_shapes import (GuardOnDataDependentSymNode,
                                                       PendingUnbackedSymbolNotFound)
    try:
        with warnings.catch_warnings(), quiet_torch():
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, tuple(example_inputs), strict=False)
            if FAST_PATH and _already_final(ep):
                return ep
            return ep.run_decompositions(decomposition_table())
    except StrataError:
        raise
    except (GuardOnDataDependentSymNode, PendingUnbackedSymbolNotFound) as e:
        raise DataDependentShape("", user_line(e)) from None
    except Exception as e:
        text = str(e).strip().splitlines()
        raise StrataError(f"torch.export could not capture the program: "
                          f"{type(e).__name__}: {text[0] if text else ''}") from None


def capture(fn_or_module, example_inputs, source_lines: dict[str, str] | None = None,
            input_names: list[str] | None = None) -> TorchProgram:
    """Export `fn_or_module(*example_inputs)` and return its Torch IR.

    source_lines: {filename: source text} registered in linecache first, so that code compiled
    from a string (the "<snippet>") shows its text in provenance.
    input_names: names of the user inputs (default: the forward's parameter names).
    """
    example_inputs = tuple(example_inputs)
    for filename, text in (source_lines or {}).items():
        register_source(filename, text)
    module = fn_or_module if isinstance(fn_or_module, nn.Module) else FunctionModule(fn_or_module)
    if input_names is None:
        fn = fn_or_module.forward if isinstance(fn_or_module, nn.Module) else fn_or_module
        input_names = _param_names(fn, len(example_inputs))
    with static_experts(module) as notes:
        ep = _export(module, example_inputs)
    prog = build_program(ep, list(input_names))
    prog.notes.extend(notes)
    return prog


def capture_snippet(snippet) -> TorchProgram:
    """Torch IR of a parsed `-c` snippet."""
    return capture(snippet.module, snippet.shapes, snippet.source_lines(),
                   snippet.input_names)


def build_program(ep, input_names: list[str]) -> TorchProgram:
    """The renamed, flattened view of an ExportedProgram."""
    from torch.export.graph_signature import InputKind, OutputKind
    sig = ep.graph_signature
    state = dict(ep.state_dict)
    consts = dict(getattr(ep, "constants", {}) or {})
    weight_specs = [s for s in sig.input_specs if s.kind != InputKind.USER_INPUT]
    strip = _common_module_prefix([s.target for s in weight_specs
                                   if s.kind in (InputKind.PARAMETER, InputKind.BUFFER)])
    rename: dict[str, str] = {}
    inputs: dict[str, TorchType] = {}
    weights: dict = {}
    weight_of: dict[str, str] = {}
    seen: dict[int, str] = {}
    user_i = 0
    for spec in sig.input_specs:
        ph = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            rename[ph] = input_names[user_i] if user_i < len(input_names) else ph
            user_i += 1
            continue
        kind = {InputKind.PARAMETER: "p", InputKind.BUFFER: "b"}.get(spec.kind, "c")
        value = state[spec.target] if spec.target in state else consts[spec.target]
        if id(value) in seen:        # a tied weight (lm_head = embed_tokens): one buffer, first name
            rename[ph] = weight_of[spec.target] = seen[id(value)]
            continue
        rename[ph] = seen[id(value)] = weight_of[spec.target] = _weight_name(
            kind, spec.target, strip if kind != "c" else "")
        weights[rename[ph]] = value.detach()
    taken = set(rename.values())
    nodes: list[TorchNode] = []
    outputs: list[str] = []
    mutations: dict[str, str] = {}

    def name_of(n) -> str:
        return rename.get(n.name, n.name)

    def conv(a):
        if isinstance(a, torch.fx.Node):
            return Ref(name_of(a))
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return a

    for n in ep.graph.nodes:
        if n.op == "placeholder":
            if rename.get(n.name, n.name) not in weights:
                inputs[name_of(n)] = _type_of(n.meta.get("val"))
            continue
        if n.op == "output":
            # zip with the specs: an in-place op's value is both a mutation and a user output
            outputs = [name_of(a) for s, a in zip(sig.output_specs, n.args[0])
                       if s.kind == OutputKind.USER_OUTPUT and isinstance(a, torch.fx.Node)]
            mutations = {rename.get(s.target, s.target): name_of(a)
                         for s, a in zip(sig.output_specs, n.args[0])
                         if s.kind == OutputKind.USER_INPUT_MUTATION and isinstance(a, torch.fx.Node)}
            continue
        if n.op != "call_function":
            continue
        op = "getitem" if n.target is operator.getitem else str(n.target)
        if op.rsplit(".", 1)[0] in NOOPS:
            continue
        if n.name in taken:       # a renamed weight/input took this name
            k = 1
            while f"{n.name}_{k}" in taken:
                k += 1
            rename[n.name] = f"{n.name}_{k}"
        taken.add(name_of(n))
        where = user_frame(n.meta.get("stack_trace"))
        try:
            ty = _type_of(n.meta.get("val"))
        except DataDependentShape:
            raise DataDependentShape(str(n.target), str(where or "")) from None
        stack = list((n.meta.get("nn_module_stack") or {}).values())
        nodes.append(TorchNode(name_of(n), op, n.target, conv(tuple(n.args)),
                               {k: conv(v) for k, v in n.kwargs.items()}, ty, where,
                               stack[-1][0] if stack else ""))
    weight_types = {k: TorchType(tuple(v.shape), dtypes.from_torch(v.dtype)) for k, v in weights.items()}
    out_spec = None
    try:
        out_spec = ep.call_spec.out_spec
    except AttributeError:
        pass
    return TorchProgram(ep.graph, nodes, inputs, weights, weight_types, outputs, out_spec, ep,
                        mutations, weight_of=weight_of)
