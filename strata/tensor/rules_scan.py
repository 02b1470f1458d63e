"""Cumulative ops (cumsum, cumprod, cummax/cummin with indices, logcumsumexp) as blocked scans.

Why blocked: Tensor IR has reductions but no sequential loop, and a prefix written as one
triangular reduction (out[i] = sum over j <= i) costs n^2 along the axis: a vocabulary cumsum
(top-p over 32k tokens) would be 10^9 operations. Split the axis into nb blocks of B ~ sqrt(n):
scan within each block (n * B), scan the block totals (nb^2, exclusive) and combine the two
elementwise, so the work is about 2 n sqrt(n) and every piece is a reduction the fusion planner
and every schedule already know. Axes of up to 64 use the triangle directly.
"""
from __future__ import annotations

from math import ceil, isqrt

from ..core import dtypes
from ..core.expr import Const, Var, call
from ..core.scalar_ops import reduce_identity
from .builder import T, norm_axis, rule

DIRECT = 64                    # axes this short scan as one triangle
COMBINE = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}


def _lse_pair(b, a: T, c: T) -> T:
    """log(exp(a) + exp(c)) without overflow; -inf with -inf, +inf with +inf."""
    m = b.ew("maximum", a, c, hint="lse_max")
    inf = b.ew("eq", b.ew("abs", m), float("inf"), hint="inf")
    ms = b.ew("where", inf, 0.0, m, dtype=m.dtype, hint="shift")
    s = b.ew("add", b.ew("exp", b.ew("subtract", a, ms)), b.ew("exp", b.ew("subtract", c, ms)))
    return b.ew("add", ms, b.ew("log", s), hint="lse")


def _triangle(b, x: T, ax: int, op: str, exclusive: bool = False) -> T:
    """out[.., i, ..] = op over j <= i (j < i when exclusive) of x[.., j, ..]: one reduction
    over a new last axis; an empty prefix gives op's identity."""
    rank, n = x.rank, x.shape[ax]
    j = Var(f"i{rank}")
    index = [Var(f"i{k}") for k in range(rank)]
    index[ax] = j
    keep = call("lt" if exclusive else "le", j, Var(f"i{ax}"))
    shape = x.shape + (n,)
    if op == "lse":         # shift by the prefix's max so that exp cannot overflow
        m = _triangle(b, x, ax, "max", exclusive)
        ms = b.ew("where", b.ew("eq", b.ew("abs", m), float("inf")), 0.0, m, dtype=x.dtype,
                  hint="shift")
        rows = b.index_map(ms, shape, tuple(Var(f"i{k}") for k in range(rank)), hint="shift_bc")
        tri = b.index_map(x, shape, tuple(index), valid=keep, fill=float("-inf"), hint="tri")
        s = b.reduce("sum", b.ew("exp", b.ew("subtract", tri, rows)), (rank,), hint="sum")
        return b.ew("add", ms, b.ew("log", b.squeeze(s, (rank,))), hint="lse")
    tri = b.index_map(x, shape, tuple(index), valid=keep, fill=reduce_identity(op, x.dtype),
                      hint="tri")
    return b.squeeze(b.reduce(op, tri, (rank,), hint=op), (rank,))


def scan(b, x: T, ax: int, op: str) -> T:
    """Inclusive scan of `op` (sum, prod, max, min, or lse: log-sum-exp) along axis `ax`."""
    n = x.shape[ax]
    if n <= DIRECT:
        return _triangle(b, x, ax, op)
    bs = isqrt(n - 1) + 1
    nb = ceil(n / bs)
    ident = float("-inf") if op == "lse" else reduce_identity(op, x.dtype)
    blk, inner = Var(f"i{ax}"), Var(f"i{ax + 1}")
    pos = call("add", call("multiply", blk, bs), inner)
    split = [Var(f"i{k}") for k in range(ax)] + [pos] + \
        [Var(f"i{k + 1}") for k in range(ax + 1, x.rank)]
    blocks = b.index_map(x, x.shape[:ax] + (nb, bs) + x.shape[ax + 1:], tuple(split),
                         valid=call("lt", pos, n), fill=ident, hint="blocks")
    local = _triangle(b, blocks, ax + 1, op)
    last = [Var(f"i{k}") for k in range(blocks.rank)]
    last[ax + 1] = Const(bs - 1)
    totals = b.index_map(local, blocks.shape[:ax + 1] + (1,) + blocks.shape[ax + 2:], tuple(last),
                         hint="totals")
    before = b.bcast(_triangle(b, totals, ax, op, exclusive=True), blocks.shape)
    both = _lse_pair(b, before, local) if op == "lse" else b.ew(COMBINE[op], before, local)
    back = [Var(f"i{k}") for k in range(ax)] + \
        [call("floordiv", Var(f"i{ax}"), bs), call("mod", Var(f"i{ax}"), bs)] + \
        [Var(f"i{k - 1}") for k in range(ax + 2, blocks.rank)]
    return b.index_map(both, x.shape, tuple(back), hint="scan")


def _operand(b, x: T, out_dtype: str) -> T:
    """x in the dtype the scan runs in: 16-bit floats accumulate in float32, as eager does."""
    return b.cast(x, "f32" if out_dtype in ("f16", "bf16") else out_dtype)


@rule("aten.cumsum", "aten.cumprod")
def cumulative(b, a):
    x = a.self
    if x.rank == 0 or x.numel == 0:
        return b.cast(x, b.out.dtype)
    op = "sum" if b.op == "aten.cumsum" else "prod"
    return b.cast(scan(b, _operand(b, x, b.out.dtype), norm_axis(a.dim, x.rank), op), b.out.dtype)


@rule("aten.logcumsumexp")
def logcumsumexp(b, a):
    x = a.self
    if x.rank == 0 or x.numel == 0:
        return b.cast(x, b.out.dtype)
    return b.cast(scan(b, _operand(b, x, b.out.dtype), norm_axis(a.dim, x.rank), "lse"),
                  b.out.dtype)


@rule("aten.cummax", "aten.cummin")
def cumextreme(b, a):
    """Values are a max (min) scan; the index is the last position j <= i that set or tied the
    running value (or holds a NaN, which torch's running value keeps once met): j is such a
    position exactly when x[j] equals the running value at j, so the index is itself a max scan."""
    x = a.self
    vals_t, idx_t = b.out
    if x.rank == 0 or x.numel == 0:
        return x, b.full(idx_t.shape, 0, "i64")
    d = norm_axis(a.dim, x.rank)
    op = "max" if b.op == "aten.cummax" else "min"
    run = scan(b, x, d, op)
    record = b.ew("eq", x, run, hint="record")
    if dtypes.is_float(x.dtype):
        record = b.ew("logical_or", record, b.ew("isnan", x), hint="record")
    pos = b.ew("where", record, b.iota(x.shape, d, hint="pos"), -1, dtype="i64", hint="at")
    return run, scan(b, pos, d, "max")
