"""Torch IR -> Tensor IR: one rule per aten op, looked up in a table (rules are data).

The rules live in the rules_*.py files listed in RULE_MODULES; each marks itself with
`@rule("aten.op")` and builds nodes with the
`Builder` (builder.py). This driver binds every node's arguments to its aten schema, runs the
rule, checks the result against the shape/dtype torch.export recorded, names the rule's last node
after the aten node, and drops nodes no output needs. An op without a rule is an
`UnsupportedOp("aten.X", where=<user line>)`, never a silent fallback.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from ..core.errors import StrataError, UnsupportedOp
from ..frontend.torch_ir import Ref, TorchNode, TorchProgram, shape_only
from . import (rules_accumulate, rules_attention, rules_const, rules_conv, rules_elementwise,
               rules_layout, rules_matmul, rules_reduce, rules_resample, rules_scan, rules_scatter)
from .builder import Builder, T, rules_of
from .fold_empty import fold_empty
from .ir import CUSTOM_OPS, Custom, Input, TensorProgram

# Every rule module, listed once: the table of aten op -> rule is built from these.
RULE_MODULES = (rules_const, rules_elementwise, rules_layout, rules_reduce, rules_matmul,
                rules_conv, rules_resample, rules_scan, rules_attention, rules_scatter,
                rules_accumulate)
RULES = rules_of(RULE_MODULES)


class Args(dict):
    """A node's arguments by schema name; tensors are `T`, missing optionals are defaults."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _resolve(v, env):
    if isinstance(v, Ref):
        return env[v.name]
    if isinstance(v, (list, tuple)):
        return type(v)(_resolve(x, env) for x in v)
    return v


def bind(node: TorchNode, env: dict) -> Args:
    a = Args()
    if node.op == "getitem":
        a["self"], a["index"] = _resolve(node.args[0], env), node.args[1]
        return a
    schema = node.target._schema
    for arg, v in zip(schema.arguments, node.args):
        a[arg.name] = _resolve(v, env)
    for k, v in node.kwargs.items():
        a[k] = _resolve(v, env)
    for arg in schema.arguments:
        if arg.name not in a:
            a[arg.name] = arg.default_value if arg.has_default_value() else None
    return a


def _custom_rule(op: str):
    """A hand-written kernel's op (st.custom_op): one Custom node over its arguments."""
    def rule(b: Builder, a: Args) -> T:
        args = tuple(v.name if isinstance(v, T) else v for v in a.values())
        return b.emit(Custom, b.base, b.out.shape, b.out.dtype, op=op, args=args,
                      kernel=CUSTOM_OPS[op])
    return rule


def supported_ops() -> list[str]:
    """Every op with a rule, and the ops st.custom_op registered (without their overload)."""
    return sorted(set(RULES) | {op.rsplit(".", 1)[0] for op in CUSTOM_OPS})


def _rename_last(b: Builder, start: int, result: T, name: str) -> T:
    """Give the rule's final node the aten node's name (`rms_norm`, `add`, `matmul`)."""
    if result.name == name or name in b.values or not b.nodes or b.nodes[-1].name != result.name \
            or len(b.nodes) <= start:
        return result
    b.nodes[-1] = dataclasses.replace(b.nodes[-1], name=name)
    new = T(name, result.shape, result.dtype)
    del b.values[result.name]
    b.values[name] = new
    for k, v in list(b._cache.items()):
        if v == result:
            b._cache[k] = new
    return new


def _check(node: TorchNode, result) -> None:
    want = node.type
    if isinstance(want, tuple):
        got = tuple(result)
        pairs = list(zip(got, want))
    else:
        pairs = [(result, want)]
    for g, w in pairs:
        if w is None or g is None:
            continue
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            raise AssertionError(f"rule for {node.op} at {node.name} produced {g.shape} {g.dtype}, "
                                 f"torch says {w.shape} {w.dtype}")


def _live(nodes, outputs) -> list:
    by_name = {n.name: n for n in nodes}
    live, stack = set(), list(outputs)
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(by_name[n].operands())
    return [n for n in nodes if n.name in live or isinstance(n, Input)]


class WeightArrays(Mapping):
    """Weight values as NumPy arrays (bf16 as float32), converted on first read: only the
    reference evaluators read them, and a whole model's weights copied up front would double
    its memory. A meta tensor (a model compiled from shapes only) has no values to read."""

    def __init__(self, tensors: dict):
        self._tensors, self._arrays = tensors, {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = _numpy(name, self._tensors[name])
        return self._arrays[name]

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def _numpy(name: str, t) -> np.ndarray:
    import torch
    if not isinstance(t, torch.Tensor):
        return np.asarray(t)
    if shape_only(t):
        raise StrataError(f"weight {name} has no values: this program was compiled from shapes "
                          f"only")
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy().copy()


def to_tensor_ir(prog: TorchProgram) -> TensorProgram:
    """Lower every Torch IR node with its rule; raises UnsupportedOp for ops without one."""
    b = Builder()
    env: dict = {}
    for kind, items in (("input", prog.inputs), ("weight", prog.weight_types)):
        for name, t in items.items():
            b.src = kind
            env[name] = b.emit(Input, name, t.shape, t.dtype, kind=kind)
    for node in prog.nodes:
        fn = RULES.get("getitem" if node.op == "getitem" else node.packet)
        if fn is None and node.op in CUSTOM_OPS:
            fn = _custom_rule(node.op)
        where = str(node.where) if node.where else ""
        if fn is None:
            raise UnsupportedOp(node.packet, where=where)
        b.base, b.out, b.op = node.name, node.type, node.packet
        b.src = f"{node.packet} @ {node.where.loc}" if node.where else node.packet
        start = len(b.nodes)
        try:
            result = fn(b, bind(node, env))
        except UnsupportedOp as e:      # a rule that declines a case (int rounding division ...)
            raise UnsupportedOp(e.op, where=e.where or where) from None
        _check(node, result)
        if isinstance(result, T):
            result = _rename_last(b, start, result, node.name)
        env[node.name] = result
    outputs = [env[o].name for o in prog.outputs]
    mutations = {i: env[v].name for i, v in getattr(prog, "mutations", {}).items()}
    nodes = _live(fold_empty(b.nodes), outputs + list(mutations.values()))
    out = TensorProgram(nodes, outputs, WeightArrays(prog.weights), mutations)
    return out
