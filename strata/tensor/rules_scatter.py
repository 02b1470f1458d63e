"""Writes at tensor-valued positions: index_copy and index_put as one Scatter node.

Why: a KV cache is written at the decode position, an input of the program, so that one compiled
step serves every position. `cache.index_copy(2, pos, k)` and `cache[:, :, pos] = k` both become
`Scatter(dest=cache, values=k, indices=pos, axis=2)`, which loop/lower.py stores in the cache's
own buffer when nothing else reads the old cache (only the new rows are written).
Positions must be in range (index_put's negative ones are wrapped first); several index tensors,
or an index that is not 1-D, are not supported.
"""
from __future__ import annotations

from ..core.errors import UnsupportedOp
from ..core.expr import Const, Var
from .builder import T, broadcast_shapes, norm_axis, rule
from .ir import Scatter
from .rules_accumulate import index_put_accumulate


def _positions(b, index: T) -> T:
    """The index as a 1-D i64 tensor (a 0-d index is one position)."""
    if index.dtype not in ("i64", "i32"):
        raise UnsupportedOp(f"{b.op} (only integer index tensors are supported)")
    if index.rank == 0:
        index = b.reshape(index, (1,), hint="pos")
    if index.rank != 1:
        raise UnsupportedOp(f"{b.op} (only a 1-D index tensor is supported, not {index.rank}-D)")
    return b.cast(index, "i64")


def scatter(b, dest: T, axis: int, index: T, values: T) -> T:
    """dest with the slices `index` along `axis` replaced by `values` (broadcast and cast)."""
    want = tuple(index.shape[0] if d == axis else n for d, n in enumerate(dest.shape))
    if values.rank == dest.rank - 1 and index.shape[0] == 1 and dest.rank:   # index_copy, 0-d index
        values = b.index_map(values, want, tuple(Var(f"i{d}") for d in range(dest.rank) if d != axis),
                             hint="rows")
    if broadcast_shapes(values.shape, want) != want:
        raise UnsupportedOp(f"{b.op} (values of shape {values.shape} do not fit {want})")
    values = b.bcast(b.cast(values, dest.dtype), want)
    return b.emit(Scatter, b.tmp("scatter"), dest.shape, dest.dtype, dest=dest.name,
                  values=values.name, indices=index.name, axis=axis)


@rule("aten.index_copy")
def index_copy(b, a):
    dest = a.self
    if dest.rank == 0:      # one element, whose only position is 0: the source replaces it
        return b.reshape(b.cast(a.source, dest.dtype), (), hint="value")
    axis = norm_axis(a.dim, dest.rank) if dest.rank else 0
    return scatter(b, dest, axis, _positions(b, a.index), a.source)


@rule("aten.index_put")
def index_put(b, a):
    """x[..., pos, ...] = v with one integer index tensor (the others None); with accumulate
    (x[..., pos, ...] += v, repeated positions adding up) a reduction (rules_accumulate.py)."""
    dest = a.self
    given = [k for k, t in enumerate(a.indices) if t is not None]
    if len(given) != 1:
        raise UnsupportedOp("aten.index_put (only one index tensor)")
    axis, index, values = given[0], a.indices[given[0]], a["values"]   # (a.values: the dict's)
    if index.rank > 1:      # embedding's backward: ids (B, S) -> B*S positions, values alike
        full = dest.shape[:axis] + index.shape + dest.shape[axis + 1:]
        if values.rank < len(full):
            values = b.reshape(values, (1,) * (len(full) - values.rank) + values.shape, hint="vals")
        values = b.reshape(b.bcast(values, full), dest.shape[:axis] + (index.numel,)
                           + dest.shape[axis + 1:], hint="vals")
        index = b.reshape(index, (index.numel,), hint="pos")
    index = _positions(b, index)
    n = dest.shape[axis]
    wrapped = b.ew("where", b.ew("lt", index, 0, hint="neg"), b.ew("add", index, n, hint="wrap"),
                   index, hint="pos")
    if values.rank < dest.rank:             # torch broadcasts values against the indexed shape
        values = b.reshape(values, (1,) * (dest.rank - values.rank) + values.shape, hint="vals")
    if a.accumulate:
        return index_put_accumulate(b, dest, axis, wrapped, values)
    return scatter(b, dest, axis, wrapped, values)


@rule("aten.scatter")
def scatter_along(b, a):
    """torch.scatter(self, dim, index, src or value): out[.., index[.., k, ..], ..] = src[.., k,
    ..] (a one-hot gradient: cross-entropy's backward). Each of the K positions index holds along
    `dim` is one select over self (a later k wins a repeated position; torch leaves which one
    undefined); index must span self in the other dims."""
    x, index, dim = a.self, a.index, norm_axis(a.dim, a.self.rank) if a.self.rank else 0
    if a.get("reduce") is not None:
        raise UnsupportedOp("aten.scatter (with reduce=)")
    if x.rank == 0 or index.numel == 0:
        return x if index.numel == 0 else b.reshape(b.cast(a.src if "src" in a else
                                                           b.full((), a.value, x.dtype), x.dtype), ())
    K = index.shape[dim]
    if any(index.shape[k] != x.shape[k] for k in range(x.rank) if k != dim) or K > 16:
        raise UnsupportedOp(f"aten.scatter (an index of shape {index.shape} into {x.shape}: only "
                            f"one spanning the other dims, at most 16 along dim {dim})")
    src = b.cast(a.src, x.dtype) if "src" in a else None
    pos, out = b.iota(x.shape, dim, hint="pos"), x
    for k in range(K):
        at = tuple(Const(k) if d == dim else Var(f"i{d}") for d in range(x.rank))
        where_k = b.index_map(b.cast(index, "i64"), x.shape, at, hint=f"index{k}")
        value = b.index_map(src, x.shape, at, hint=f"src{k}") if src is not None else a.value
        out = b.ew("where", b.ew("eq", pos, where_k, hint=f"hit{k}"), value, out, dtype=x.dtype,
                   hint="scattered")
    return out
