"""Accumulating writes at data-dependent positions, as reductions over the sources: scatter_add,
scatter_reduce, index_add, index_reduce, index_put with accumulate, histc, embedding_bag.

Why no atomics: every output element reduces the sources whose index names it,
out[.., p, ..] = dest op reduce_j{src[.., j, ..] : index[.., j, ..] == p}, which is an ordinary
fused reduction (deterministic, and the same on every target) at n_out * n_src work along the
indexed axis: fine for MoE token counts, bag layers and histograms of moderate size, quadratic for
a scatter of a vocabulary into a vocabulary. (bincount is refused by torch.export itself: its
length depends on the data.)
"""
from __future__ import annotations

from ..core import dtypes
from ..core.errors import UnsupportedOp
from ..core.expr import Const, Var, call
from ..core.scalar_ops import reduce_identity
from .builder import T, norm_axis, rule
from .ir import IDX

REDUCE = {"sum": "sum", "add": "sum", "prod": "prod", "amax": "max", "amin": "min", "mean": "sum"}
COMBINE = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}


def accumulate(b, dest: T, axis: int, index: T, src: T, how: str, include_self: bool = True) -> T:
    """dest with src reduced into it at `index` along `axis` (how: sum, prod, amax, amin, mean).
    index is either 1-D (index_add: src's slice j goes to index[j]) or of src's rank with extents
    no larger than src's (scatter: element (.., j, ..) goes to index[.., j, ..])."""
    if how not in REDUCE:
        raise UnsupportedOp(f"{b.op} (reduce={how!r})")
    op, rank = REDUCE[how], dest.rank
    work = "f32" if dest.dtype in ("f16", "bf16") else dest.dtype
    if how == "mean" and not dtypes.is_float(work):
        raise UnsupportedOp(f"{b.op} (reduce='mean' of an integer tensor)")
    n, j = dest.shape[axis], Var(f"i{rank}")
    along = [Var(f"i{k}") for k in range(rank)]
    along[axis] = j
    one_d = index.rank == 1 and rank > 1 or rank == 1
    shape = dest.shape + ((index.shape[0] if one_d else index.shape[axis]),)
    # a scatter's index may be smaller than dest in the other dims: those elements get nothing
    inside = Const(True)
    if not one_d:
        for k in range(rank):
            if k != axis and index.shape[k] < dest.shape[k]:
                inside = call("logical_and", inside, call("lt", Var(f"i{k}"), index.shape[k]))
    where_idx = (j,) if one_d else tuple(along)
    index = b.cast(index, "i64")
    wrapped = b.ew("where", b.ew("lt", index, 0), b.ew("add", index, n), index, hint="wrapped")
    idx = b.index_map(wrapped, shape, where_idx, valid=inside, fill=-1, hint="at")
    hit = b.ew("eq", idx, b.iota(shape, axis, hint="slot"), hint="hit")
    vals = b.index_map(b.cast(src, work), shape, tuple(along), hint="src")
    ident = reduce_identity(op, work)
    red = b.squeeze(b.reduce(op, b.ew("where", hit, vals, ident, dtype=work), (rank,), hint=op),
                    (rank,))
    base = b.cast(dest, work)
    if how == "sum" or how == "add":
        out = b.ew("add", base, red) if include_self else None
    elif how == "mean":
        count = b.squeeze(b.reduce("sum", b.ew("where", hit, 1.0, 0.0, dtype=work), (rank,),
                                   hint="count"), (rank,))
        total = b.ew("add", base, red) if include_self else red
        count = b.ew("add", count, 1.0) if include_self else count
        out = b.ew("divide", total, b.ew("maximum", count, 1.0), hint="mean")
    else:
        out = b.ew(COMBINE[op], base, red) if include_self else None
    if out is None or not include_self:     # positions nothing names keep dest
        touched = b.squeeze(b.reduce("max", b.ew("where", hit, 1, 0, dtype="i32"), (rank,),
                                     hint="touched"), (rank,))
        out = b.ew("where", touched, red if out is None else out, base, dtype=work)
    return b.cast(out, dest.dtype)


@rule("aten.scatter_add")
def scatter_add(b, a):
    x = a.self
    if a.index.numel == 0:      # nothing added (eager allows an empty index of another rank)
        return x
    if x.rank == 0:
        return b.ew("add", x, b.reshape(b.cast(a.src, x.dtype), ()))
    return accumulate(b, x, norm_axis(a.dim, x.rank), a.index, a.src, "sum")


@rule("aten.scatter_reduce", "aten.index_reduce")
def scatter_reduce(b, a):
    x = a.self
    if a.index.numel == 0:      # nothing touched
        return x
    if x.rank == 0:
        raise UnsupportedOp(f"{b.op} (of a 0-d tensor)")
    src = a.src if b.op == "aten.scatter_reduce" else a.source
    return accumulate(b, x, norm_axis(a.dim, x.rank), a.index, src, a.reduce,
                      a.get("include_self", True))


@rule("aten.index_add")
def index_add(b, a):
    x = a.self
    src = a.source
    alpha = a.get("alpha", 1)
    if alpha != 1:
        src = b.ew("multiply", b.cast(src, x.dtype), alpha, hint="scaled")
    if x.rank == 0:
        return b.ew("add", x, b.reshape(b.cast(src, x.dtype), ()))
    return accumulate(b, x, norm_axis(a.dim, x.rank), b.reshape(a.index, (a.index.numel,)), src,
                      "sum")


def index_put_accumulate(b, dest: T, axis: int, index: T, values: T) -> T:
    """x[.., pos, ..] += v (index_put with accumulate=True, one 1-D index tensor)."""
    want = tuple(index.shape[0] if d == axis else s for d, s in enumerate(dest.shape))
    if values.rank < dest.rank:
        values = b.reshape(values, (1,) * (dest.rank - values.rank) + values.shape, hint="vals")
    return accumulate(b, dest, axis, index, b.bcast(b.cast(values, dest.dtype), want), "sum")


@rule("aten.histc")
def histc(b, a):
    """torch's bins: (x - min) / (max - min) * bins, truncated, the top edge in the last bin;
    min = max = 0 takes the data's range (widened by 1 each way when it is one value)."""
    x = b.cast(a.self, "f32") if a.self.dtype in ("f16", "bf16") else a.self
    bins, lo, hi = int(a.get("bins", 100)), float(a.get("min", 0)), float(a.get("max", 0))
    flat = b.reshape(x, (x.numel,), hint="flat")
    if x.numel == 0:
        return b.full((bins,), 0, b.out.dtype)
    if lo == hi:
        mn = b.reduce("min", flat, (0,), hint="lo")
        mx = b.reduce("max", flat, (0,), hint="hi")
        same = b.ew("eq", mn, mx)
        lo_t = b.ew("where", same, b.ew("subtract", mn, 1.0), mn, hint="lo")
        hi_t = b.ew("where", same, b.ew("add", mx, 1.0), mx, hint="hi")
    else:
        lo_t, hi_t = b.full((1,), lo, x.dtype), b.full((1,), hi, x.dtype)
    inside = b.ew("logical_and", b.ew("ge", flat, lo_t), b.ew("le", flat, hi_t), hint="inside")
    scaled = b.ew("multiply", b.ew("divide", b.ew("subtract", flat, lo_t),
                                   b.ew("subtract", hi_t, lo_t)), float(bins))
    which = b.ew("minimum", b.cast(scaled, "i64"), bins - 1, hint="bin")
    which = b.ew("where", inside, which, bins, dtype="i64", hint="bin")     # bins: no bin
    ones = b.full((x.numel,), 1, b.out.dtype)
    return accumulate(b, b.full((bins,), 0, b.out.dtype), 0, which, ones, "sum")


@rule("aten.embedding_bag", "aten._embedding_bag")
def embedding_bag(b, a):
    """Bags of rows of `weight`: bag k holds indices[offsets[k]:offsets[k+1]]; sum, mean or max
    per bag (per_sample_weights scale the rows of a sum), padding_idx rows left out, an empty bag
    zeros. The other three outputs are torch's bookkeeping for the backward pass."""
    w, ids, offs = a.weight, a.indices, a.offsets
    mode, pad = int(a.get("mode", 0)), a.get("padding_idx", None)
    pad = None if pad is None or pad < 0 else int(pad)        # _embedding_bag says -1
    psw, last = a.get("per_sample_weights", None), a.get("include_last_offset", False)
    if ids.rank != 1:
        raise UnsupportedOp(f"{b.op} (2-D indices without offsets reach it flattened; got "
                            f"{ids.rank}-D)")
    out_t, o2b_t, size_t, maxi_t = b.out
    nbags, dim, n = out_t.shape[0], w.shape[1], ids.shape[0]
    ids = b.cast(ids, "i64")
    offs = b.cast(offs, "i64")
    # bag of index j: the last k with offsets[k] <= j (offsets ascend)
    e = (n, offs.shape[0])
    started = b.ew("le", b.index_map(offs, e, (Var("i1"),), hint="starts"), b.iota(e, 0), hint="started")
    bag = b.ew("subtract", b.squeeze(b.reduce("sum", b.cast(started, "i64"), (1,)), (1,)), 1,
               hint="bag")
    if last:                                # the last offset ends the last bag
        bag = b.ew("where", b.ew("ge", bag, nbags), -1, bag, dtype="i64", hint="bag")
    keep = b.ew("ge", bag, 0) if pad is None else \
        b.ew("logical_and", b.ew("ge", bag, 0), b.ew("ne", ids, pad), hint="keep")
    shape = (nbags, dim, n)
    member = b.ew("logical_and", b.ew("eq", b.index_map(bag, shape, (Var("i2"),)), b.iota(shape, 0)),
                  b.index_map(keep, shape, (Var("i2"),)), hint="member")
    rows = b.gather(w, b.index_map(ids, shape, (Var("i2"),), hint="ids"), (IDX, Var("i1")))
    work = "f32" if w.dtype in ("f16", "bf16") else w.dtype
    rows = b.cast(rows, work)
    if psw is not None:
        rows = b.ew("multiply", rows, b.index_map(b.cast(psw, work), shape, (Var("i2"),)))
    count = b.squeeze(b.reduce("sum", b.ew("where", b.index_map(member, (nbags, n), (Var("i0"), Const(0), Var("i1"))),
                                           1, 0, dtype="i64"), (1,), hint="bag_size"), (1,))
    op = "max" if mode == 2 else "sum"
    red = b.squeeze(b.reduce(op, b.ew("where", member, rows, reduce_identity(op, work), dtype=work),
                             (2,), hint=op), (2,))
    cnt = b.index_map(count, (nbags, dim), (Var("i0"),))
    if mode == 1:
        red = b.ew("divide", red, b.ew("maximum", b.cast(cnt, work), 1.0), hint="mean")
    elif mode == 2:
        red = b.ew("where", b.ew("gt", cnt, 0), red, 0.0, dtype=work, hint="max")
    out = b.cast(red, out_t.dtype)
    o2b = b.full(o2b_t.shape, 0, "i64") if o2b_t.shape[0] != n else \
        b.ew("where", b.ew("ge", bag, 0), bag, 0, dtype="i64")
    size = b.full(size_t.shape, 0, "i64") if mode == 0 else count
    if mode == 2:       # the row index that won each (bag, column); -1 for an empty bag
        won = b.ew("logical_and", member, b.ew("eq", rows, b.index_map(red, shape, (Var("i0"), Var("i1")))))
        first = b.squeeze(b.reduce("argmax", b.cast(won, "i32"), (2,)), (2,))
        at = b.gather(ids, first, (IDX,))
        maxi = b.ew("where", b.ew("gt", cnt, 0), at, -1, dtype="i64")
    else:
        maxi = b.full(maxi_t.shape, 0, "i64") if mode == 0 else count
    return out, o2b, size, maxi
