"""Tensor IR: every aten op as one of a handful of tensor-level primitives.

    Input       a graph input or weight (kind "input" | "weight")
    Full        a tensor filled with one constant
    Iota        the index along one axis (arange, masks of triu/tril, cat selectors)
    Elementwise a scalar op from `strata.core.scalar_ops` applied per element; operands are node names
                of the *same shape* (broadcasting is an explicit IndexMap) or Python scalars
    Reduce      sum | prod | max | min | argmax | argmin over axes, always keepdim (size-1 axes)
    IndexMap    out[i0..in] = arg[index(i0..in)] (or `fill` where `valid` is false): broadcast,
                view, reshape, permute, slice, expand, flip, roll, select, squeeze... none copies
    Gather      out[o] = data[index(o)] where the index exprs may use Var("idx") = indices[o]
    Scatter     out = dest with the slices indices[j] along `axis` replaced by values[.., j, ..]
                (index_copy / index_put: a KV-cache write; loop/lower.py writes it in place)

Index expressions use variables i0, i1, ... (one per output dim, `out_vars`). Nodes are frozen;
a program lists them in topological order. `verify()` checks shapes, dtypes and references.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Union

import numpy as np

from ..core import dtypes, scalar_ops
from ..core.expr import Expr, Var, free_vars, to_str, value_range, format_const


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        dims = ", ".join(map(str, self.shape)) + ("," if len(self.shape) == 1 else "")
        return f"({dims}) {self.dtype}"

    @property
    def numel(self) -> int:
        return prod(self.shape)


Scalar = Union[int, float, bool]


@dataclass(frozen=True)
class Node:
    name: str
    type: TensorType
    # Provenance: the aten op(s) and the user's source line this node came from.
    src: str = field(default="", compare=False, kw_only=True)

    def operands(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class Input(Node):
    kind: str = "input"          # "input" | "weight"


@dataclass(frozen=True)
class Full(Node):
    value: Scalar = 0


@dataclass(frozen=True)
class Iota(Node):
    axis: int = 0


@dataclass(frozen=True)
class Elementwise(Node):
    op: str = "add"
    args: tuple = ()             # node names (str) or Python scalars

    def operands(self):
        return tuple(a for a in self.args if isinstance(a, str))


@dataclass(frozen=True)
class Reduce(Node):
    op: str = "sum"              # sum | prod | max | min | argmax | argmin
    arg: str = ""
    axes: tuple[int, ...] = ()   # non-negative, sorted; output keeps them as size 1

    def operands(self):
        return (self.arg,)


@dataclass(frozen=True)
class IndexMap(Node):
    arg: str = ""
    index: tuple[Expr, ...] = ()  # one expr per dim of `arg`, over out_vars(len(type.shape))
    valid: Expr | None = None     # where false, the element is `fill` instead of a read
    fill: Scalar = 0

    def operands(self):
        return (self.arg,)


@dataclass(frozen=True)
class Gather(Node):
    data: str = ""
    indices: str = ""             # integer node with the same shape as this node
    index: tuple[Expr, ...] = ()  # one expr per dim of `data`; may use Var("idx")

    def operands(self):
        return (self.data, self.indices)


@dataclass(frozen=True)
class Scatter(Node):
    """out = dest, except out[.., indices[j], ..] (at `axis`) = values[.., j, ..]: the only node
    whose value is mostly another node's, so that it can be stored in dest's buffer in place."""
    dest: str = ""
    values: str = ""              # dest's shape, except indices' length along `axis`
    indices: str = ""             # 1-D integer node, non-negative positions along `axis`
    axis: int = 0

    def operands(self):
        return (self.dest, self.values, self.indices)


@dataclass(frozen=True)
class Custom(Node):
    """The result of a hand-written kernel (a @strata.kernel registered by st.custom_op): opaque
    to fusion, its tensor operands are buffers. `kernel` (duck-typed, from strata/dsl) builds
    its Kernel IR for given buffers (`kernel_ir`) and computes its reference (`reference`)."""
    op: str = ""
    args: tuple = ()              # node names (str) or Python scalars, in the op's order
    kernel: object = field(default=None, compare=False)

    def operands(self):
        return tuple(a for a in self.args if isinstance(a, str))


# custom op name (as Torch IR spells it: "mylib.scale_add.default") -> its kernel (st.custom_op)
CUSTOM_OPS: dict[str, object] = {}

REDUCE_OPS = ("sum", "prod", "max", "min", "argmax", "argmin")
IDX = Var("idx")


def out_vars(rank: int) -> tuple[Var, ...]:
    return tuple(Var(f"i{d}") for d in range(rank))


def out_bounds(shape) -> dict[str, int]:
    return {f"i{d}": n for d, n in enumerate(shape)}


class VerifyError(Exception):
    pass


@dataclass
class TensorProgram:
    nodes: list[Node]
    outputs: list[str]
    weights: dict[str, np.ndarray] = field(default_factory=dict)   # Input(kind="weight") values
    mutations: dict[str, str] = field(default_factory=dict)  # input updated in place -> new value

    def node(self, name: str) -> Node:
        return self.by_name[name]

    @property
    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @property
    def inputs(self) -> list[Input]:
        return [n for n in self.nodes if isinstance(n, Input) and n.kind == "input"]

    def users(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for o in n.operands():
                out[o].append(n.name)
        return out

    def verify(self) -> None:
        seen: dict[str, Node] = {}
        for n in self.nodes:
            if n.name in seen:
                raise VerifyError(f"{n.name}: defined twice")
            _verify_node(n, seen)
            seen[n.name] = n
        for o in self.outputs:
            if o not in seen:
                raise VerifyError(f"output {o} is not defined")
        for i, v in self.mutations.items():
            if v not in seen or seen[v].type != seen.get(i, seen[v]).type:
                raise VerifyError(f"in-place update of {i} with {v} does not fit")

    def __str__(self) -> str:
        return format_program(self)


def _verify_node(n: Node, env: dict[str, Node]) -> None:
    def need(name: str) -> Node:
        if name not in env:
            raise VerifyError(f"{n.name}: operand {name} used before definition")
        return env[name]

    if n.type.dtype not in dtypes.ALL:
        raise VerifyError(f"{n.name}: unknown dtype {n.type.dtype}")
    if isinstance(n, Elementwise):
        op = scalar_ops.get(n.op)
        if len(n.args) != op.arity:
            raise VerifyError(f"{n.name}: {n.op} takes {op.arity} operands, got {len(n.args)}")
        for a in n.operands():
            if need(a).type.shape != n.type.shape:
                raise VerifyError(f"{n.name}: operand {a} has shape {env[a].type.shape}, "
                                  f"expected {n.type.shape} (broadcast with an IndexMap)")
    elif isinstance(n, Reduce):
        src = need(n.arg)
        if n.op not in REDUCE_OPS:
            raise VerifyError(f"{n.name}: unknown reduction {n.op}")
        want = tuple(1 if d in n.axes else s for d, s in enumerate(src.type.shape))
        if want != n.type.shape:
            raise VerifyError(f"{n.name}: reduce of {src.type.shape} over {n.axes} gives {want}, "
                              f"typed {n.type.shape}")
    elif isinstance(n, IndexMap):
        src = need(n.arg)
        _verify_index(n, n.index, src.type.shape, allowed=set())
    elif isinstance(n, Gather):
        src, idx = need(n.data), need(n.indices)
        if idx.type.shape != n.type.shape:
            raise VerifyError(f"{n.name}: indices shape {idx.type.shape} != {n.type.shape}")
        _verify_index(n, n.index, src.type.shape, allowed={"idx"})
    elif isinstance(n, Custom):
        for a in n.operands():
            need(a)
    elif isinstance(n, Scatter):
        dest, vals, idx = need(n.dest), need(n.values), need(n.indices)
        count = idx.type.shape[0] if len(idx.type.shape) == 1 else -1
        want = tuple(count if d == n.axis else s for d, s in enumerate(dest.type.shape))
        if dest.type != n.type or len(idx.type.shape) != 1 or vals.type.shape != want \
                or idx.type.dtype not in ("i64", "i32"):
            raise VerifyError(f"{n.name}: scatter of {vals.type} into {dest.type} along axis "
                              f"{n.axis} at {idx.type} does not fit")


def _verify_index(n: Node, index, src_shape, allowed: set[str]) -> None:
    if len(index) != len(src_shape):
        raise VerifyError(f"{n.name}: {len(index)} index exprs for a rank-{len(src_shape)} operand")
    names = {v.name for v in out_vars(len(n.type.shape))} | allowed
    bounds = out_bounds(n.type.shape)
    for d, e in enumerate(index):
        extra = free_vars(e) - names
        if extra:
            raise VerifyError(f"{n.name}: index uses unbound {sorted(extra)}")
        if getattr(n, "valid", None) is None and not (free_vars(e) & allowed):
            r = value_range(e, bounds)
            if r is not None and (r[0] < 0 or r[1] >= src_shape[d]):
                raise VerifyError(f"{n.name}: index {to_str(e)} spans {r}, outside 0..{src_shape[d] - 1}")


# ---------------------------------------------------------------- printing

def _arg(a) -> str:
    if isinstance(a, str):
        return a
    if isinstance(a, bool):
        return "true" if a else "false"
    return format_const(a, "f32" if isinstance(a, float) else "i64")


def format_node(n: Node) -> str:
    if isinstance(n, Input):
        rhs = n.kind
    elif isinstance(n, Full):
        rhs = f"full({_arg(n.value)})"
    elif isinstance(n, Iota):
        rhs = f"iota(axis={n.axis})"
    elif isinstance(n, Elementwise):
        rhs = f"{n.op}({', '.join(_arg(a) for a in n.args)})"
    elif isinstance(n, Reduce):
        rhs = f"{n.op}({n.arg}, axis={list(n.axes) if len(n.axes) > 1 else n.axes[0]})"
    elif isinstance(n, IndexMap):
        rhs = f"{n.arg}[{', '.join(to_str(e) for e in n.index)}]"
        if n.valid is not None:
            rhs += f" if {to_str(n.valid)} else {_arg(n.fill)}"
    elif isinstance(n, Gather):
        rhs = f"{n.data}[{', '.join(to_str(e) for e in n.index)}] with idx = {n.indices}"
    elif isinstance(n, Custom):
        rhs = f"custom {n.op}({', '.join(_arg(a) for a in n.args)})"
    elif isinstance(n, Scatter):
        where = ", ".join("idx" if d == n.axis else ":" for d in range(len(n.type.shape)))
        rhs = f"{n.dest} with [{where}] = {n.values} with idx = {n.indices}"
    else:
        rhs = repr(n)
    return f"{n.name} = {rhs} -> {n.type}"


def format_program(p: TensorProgram) -> str:
    lines = [format_node(n) for n in p.nodes if not isinstance(n, Input)]
    width = max((len(s.split(" -> ")[0]) for s in lines), default=0)
    out = [f"{n.name}: {n.kind} {n.type}" for n in p.nodes if isinstance(n, Input)]
    for s in lines:
        lhs, ty = s.rsplit(" -> ", 1)
        out.append(f"{lhs.ljust(width)}  -> {ty}")
    out.append(f"return {', '.join(p.outputs)}")
    return "\n".join(out)
