"""The toolkit decomposition rules build Tensor IR with.

A rule sees tensors as `T` (name, shape, dtype) and calls `Builder` methods that append nodes:
`ew` (elementwise, broadcasting its operands with explicit IndexMaps), `cast`, `reduce`,
`index_map` (which composes with an IndexMap operand and simplifies, so views of views stay one
readable node), `reshape`, `full`, `iota`, `gather`. Names are deterministic: intermediates are
`<aten node>_<hint>`, broadcasts `<operand>_bc`, casts `<operand>_<dtype>`; the driver renames a
rule's last node to the aten node's own name.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable

import numpy as np

from ..core import dtypes, scalar_ops
from ..core.expr import Const, Expr, Var, call, simplify, substitute
from .ir import (Elementwise, Full, Gather, IndexMap, Iota, Node, Reduce, TensorType,
                 out_bounds, out_vars)


@dataclass(frozen=True)
class T:
    """A Tensor IR value as rules see it."""
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)


def rule(*ops: str):
    """Mark `fn(b, a) -> T | tuple` as the rule of these aten op packets ("aten.add"); the
    table is built from the rule modules listed in decompose.py (`rules_of`)."""
    def deco(fn):
        fn.aten_ops = ops
        return fn
    return deco


def rules_of(modules) -> dict[str, Callable]:
    """{aten packet: rule} of every function marked with @rule in `modules`; an op claimed
    twice is a bug, reported at import."""
    table: dict[str, Callable] = {}
    for module in modules:
        for fn in vars(module).values():
            for op in getattr(fn, "aten_ops", ()):
                if op in table and table[op] is not fn:
                    raise RuntimeError(f"{op} has two rules: {table[op].__name__}, {fn.__name__}")
                table[op] = fn
    return table


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for d, n in enumerate(s):
            od = d + rank - len(s)
            if n != 1:
                if out[od] not in (1, n):
                    raise ValueError(f"shapes {shapes} do not broadcast")
                out[od] = n
    return tuple(out)


def norm_axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def scalar_for(value, dtype: str):
    """A Python scalar written in the kind of `dtype` (2 -> 2.0 for floats); an integer outside
    the dtype's range wraps around as eager's cast does (full_like(uint8, -9) is 247, alpha=-3
    on uint8 is 253), so every later stage sees a value the dtype can hold."""
    if dtype == "bool":
        return bool(value)
    if dtypes.is_float(dtype):
        return float(value)
    value = int(value)
    info = np.iinfo(dtypes.to_numpy(dtype))
    if not info.min <= value <= info.max:
        value = (value - info.min) % (int(info.max) - int(info.min) + 1) + int(info.min)
    return value


def reshape_index(in_shape, out_shape) -> tuple:
    """Index of a row-major reshape, group by group: runs of dims with equal products map onto
    each other, so (2, 3, 4) -> (6, 4) reads x[i0 // 3, i0 % 3, i1], not one flat index."""
    index: list = [Const(0) if n == 1 else None for n in in_shape]
    ins = [d for d, n in enumerate(in_shape) if n != 1]
    outs = [d for d, n in enumerate(out_shape) if n != 1]
    i = j = 0
    while i < len(ins) and j < len(outs):
        gi, gj = [ins[i]], [outs[j]]
        pi, pj = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(ins[i])
                pi *= in_shape[ins[i]]
                i += 1
            else:
                gj.append(outs[j])
                pj *= out_shape[outs[j]]
                j += 1
        flat, stride = Const(0), 1
        for d in reversed(gj):
            flat = call("add", flat, call("multiply", Var(f"i{d}"), stride))
            stride *= out_shape[d]
        stride = 1
        for d in reversed(gi):
            index[d] = call("mod", call("floordiv", flat, stride), in_shape[d])
            stride *= in_shape[d]
    return tuple(Const(0) if e is None else e for e in index)


class Builder:
    def __init__(self):
        self.nodes: list[Node] = []
        self.values: dict[str, T] = {}
        self.base = "t"          # name of the aten node being lowered
        self.src = ""            # provenance of that node
        self.out = None          # its TorchType (shape, dtype) from the export metadata
        self._cache: dict = {}

    # ------------------------------------------------------------ bookkeeping
    def fresh(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.values:
            name, k = f"{hint}_{k}", k + 1
        return name

    def tmp(self, hint: str) -> str:
        return f"{self.base}_{hint}"

    def emit(self, cls, hint: str, shape, dtype: str, **fields) -> T:
        name = self.fresh(hint)
        node = cls(name, TensorType(tuple(shape), dtype), src=self.src, **fields)
        self.nodes.append(node)
        t = T(name, tuple(shape), dtype)
        self.values[name] = t
        return t

    def node(self, t: T) -> Node:
        for n in reversed(self.nodes):
            if n.name == t.name:
                return n
        raise KeyError(t.name)

    # ------------------------------------------------------------ constants
    def full(self, shape, value, dtype: str, hint: str = "full") -> T:
        return self.emit(Full, self.tmp(hint), shape, dtype, value=scalar_for(value, dtype))

    def iota(self, shape, axis: int, hint: str = "iota") -> T:
        key = ("iota", tuple(shape), axis)
        if key not in self._cache:
            self._cache[key] = self.emit(Iota, self.tmp(hint), shape, "i64", axis=axis)
        return self._cache[key]

    # ------------------------------------------------------------ elementwise
    def cast(self, x: T, dtype: str) -> T:
        if x.dtype == dtype:
            return x
        key = ("cast", x.name, dtype)
        if key not in self._cache:
            self._cache[key] = self.emit(Elementwise, f"{x.name}_{dtype}", x.shape, dtype,
                                         op="cast", args=(x.name,))
        return self._cache[key]

    def bcast(self, x: T, shape) -> T:
        shape = tuple(shape)
        if x.shape == shape:
            return x
        key = ("bc", x.name, shape)
        if key not in self._cache:
            rank = len(shape)
            index = tuple(Const(0) if n == 1 and shape[d + rank - x.rank] != 1
                          else Var(f"i{d + rank - x.rank}") for d, n in enumerate(x.shape))
            self._cache[key] = self.index_map(x, shape, index, hint=f"{x.name}_bc", prefix=False)
        return self._cache[key]

    def ew(self, op: str, *args, dtype: str | None = None, hint: str | None = None) -> T:
        """op(args) elementwise; tensor operands are broadcast (not cast: use `arith`)."""
        tensors = [a for a in args if isinstance(a, T)]
        shape = broadcast_shapes(*[t.shape for t in tensors])
        names = tuple(self.bcast(a, shape).name if isinstance(a, T) else a for a in args)
        if dtype is None:
            dts = [a.dtype if isinstance(a, T) else tensors[0].dtype for a in args]
            dtype = scalar_ops.result_dtype(op, dts)
        operand_dtype = tensors[0].dtype if scalar_ops.get(op).result == "bool" else dtype
        names = tuple(a if isinstance(a, str) else
                      scalar_for(a, "bool" if op == "where" and i == 0 else operand_dtype)
                      for i, a in enumerate(names))
        return self.emit(Elementwise, self.tmp(hint or op), shape, dtype, op=op, args=names)

    def arith(self, op: str, *args, dtype: str, hint: str | None = None) -> T:
        """op(args) computed in `dtype`: tensor operands are cast to it first (type promotion)."""
        args = tuple(self.cast(a, dtype) if isinstance(a, T) else a for a in args)
        return self.ew(op, *args, dtype=dtype, hint=hint)

    # ------------------------------------------------------------ reductions
    def reduce(self, op: str, x: T, axes, hint: str | None = None, dtype: str | None = None) -> T:
        axes = tuple(sorted({norm_axis(a, x.rank) for a in axes}))
        shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
        if dtype is None:
            dtype = "i64" if op in ("argmax", "argmin") else x.dtype
        if not axes:
            return x
        return self.emit(Reduce, self.tmp(hint or op), shape, dtype, op=op, arg=x.name, axes=axes)

    # ------------------------------------------------------------ index maps
    def index_map(self, x: T, shape, index, valid: Expr | None = None, fill=0,
                  hint: str = "view", prefix: bool = True) -> T:
        """out[i..] = x[index(i..)] (fill where not valid); composes with an IndexMap operand."""
        shape = tuple(shape)
        bounds = out_bounds(shape)
        index = tuple(simplify(e, bounds) for e in index)
        src = self.node(x)
        if isinstance(src, IndexMap) and (src.valid is None or valid is None):
            env = {f"i{d}": e for d, e in enumerate(index)}
            inner_valid = substitute(src.valid, env, bounds) if src.valid is not None else None
            index = tuple(substitute(e, env, bounds) for e in src.index)
            if inner_valid is not None:
                valid, fill = inner_valid, src.fill
            x = self.values[src.arg]
        if valid is not None:
            valid = simplify(valid, bounds)
            if isinstance(valid, Const) and valid.value:
                valid = None
        if valid is None and shape == x.shape and index == out_vars(len(shape)):
            return x
        name = self.tmp(hint) if prefix else hint
        fill = scalar_for(fill, x.dtype)
        return self.emit(IndexMap, name, shape, x.dtype, arg=x.name, index=index, valid=valid,
                         fill=fill)

    def reshape(self, x: T, shape, hint: str = "view") -> T:
        shape = tuple(shape)
        if shape == x.shape:
            return x
        if x.numel == 0:        # no element to map (reshape_index needs non-zero extents)
            return self.full(shape, 0, x.dtype, hint=hint)
        return self.index_map(x, shape, reshape_index(x.shape, shape), hint=hint)

    def squeeze(self, x: T, axes, hint: str = "squeeze") -> T:
        """Drop size-1 `axes` (what a keepdim reduction leaves behind)."""
        axes = {norm_axis(a, x.rank) for a in axes}
        keep = [d for d in range(x.rank) if d not in axes]
        pos = {d: k for k, d in enumerate(keep)}
        index = tuple(Var(f"i{pos[d]}") if d in pos else Const(0) for d in range(x.rank))
        return self.index_map(x, [x.shape[d] for d in keep], index, hint=hint)

    def gather(self, src: T, indices: T, index, hint: str = "gather") -> T:
        return self.emit(Gather, self.tmp(hint), indices.shape, src.dtype, data=src.name,
                         indices=indices.name, index=tuple(index))
