"""Rules for convolutions, pooling and padding: every one is an IndexMap over a sliding window.

A convolution is an implicit GEMM: the window view of the input (N, groups, output positions,
C/groups x kernel positions), IndexMap'd with its padding as `valid` (zero outside), times the
weight viewed as (groups, out channels / groups, C/groups x kernel positions), through the
matmul rule (a transposed convolution gathers the same way: output o reads input i where
i*stride = o + padding - k*dilation, valid where that divides), so the contraction schedules (micro-kernel on a CPU, tensor cores on a GPU) apply
and the bias and activation fuse as its epilogue. Pooling reduces the same window view (fill
-inf for max, 0 for avg) over its kernel axis. Any number of spatial dims (1d, 2d, 3d).
"""
from __future__ import annotations

from math import prod

from ..core.errors import StrataError
from ..core.expr import Const, Var, add, call, floordiv, mod, mul, sub
from .builder import T, rule
from .rules_matmul import matmul


def _per_dim(v, n: int, default) -> tuple:
    """An int-or-list argument (stride=2, padding=[1, 0]) as one value per spatial dim."""
    if v is None or (isinstance(v, (list, tuple)) and not v):
        v = default
    if isinstance(v, (list, tuple)):
        return tuple(v) * n if len(v) == 1 else tuple(v)
    return (v,) * n


def _unflatten(flat, sizes) -> list:
    """The coordinates of a row-major flat index over `sizes`."""
    out = []
    for d, n in enumerate(sizes):
        inner = prod(sizes[d + 1:])
        e = floordiv(flat, inner) if inner > 1 else flat
        out.append(mod(e, n) if d > 0 else e)
    return out


def _window(out_pos, k_pos, stride, pad, dil) -> list:
    """Input coordinates read by output position o at kernel offset k: o*s - p + k*d."""
    return [add(sub(mul(o, s), p), mul(k, d)) for o, k, s, p, d in zip(out_pos, k_pos, stride, pad, dil)]


def _transposed_window(out_pos, k_pos, stride, pad, dil, ks, in_sp):
    """A transposed convolution's input coordinates: output o takes input i at offset k where
    i*s = o + p - k*d. Shifted by m*s (m*s >= the largest k*d) so that every // and % is of a
    non-negative number; valid where the shifted value divides and i is inside the input."""
    coords, terms = [], []
    for o, k, s, p, d, kn, n in zip(out_pos, k_pos, stride, pad, dil, ks, in_sp):
        m = -(-((kn - 1) * d) // s)
        t = add(sub(add(o, p), mul(k, d)), m * s)
        i = sub(floordiv(t, s), m)
        coords.append(i)
        terms += [call("eq", mod(t, s), Const(0)), call("ge", i, 0), call("lt", i, n)]
    valid = terms[0]
    for term in terms[1:]:
        valid = call("logical_and", valid, term)
    return coords, valid


def _inside(coords, lo, hi):
    """lo[d] <= coords[d] < hi[d] for every d, as one index expression (None: always)."""
    terms = []
    for c, l, h in zip(coords, lo, hi):
        terms += [call("ge", c, l), call("lt", c, h)]
    out = None
    for t in terms:
        out = t if out is None else call("logical_and", out, t)
    return out


@rule("aten.convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.conv_transpose1d",
      "aten.conv_transpose2d", "aten.conv_transpose3d")
def convolution(b, a):
    x, w = a.input, a.weight
    transposed = bool(a.get("transposed")) or "transpose" in b.op
    n_sp = w.rank - 2
    ks = w.shape[2:]
    stride = _per_dim(a.get("stride"), n_sp, 1)
    dil = _per_dim(a.get("dilation"), n_sp, 1)
    padding = a.get("padding")
    if padding == "valid":
        padding = 0
    elif padding == "same":                 # torch puts the odd one of the total on the right
        padding = [d * (k - 1) // 2 for d, k in zip(dil, ks)]
    pad = _per_dim(padding, n_sp, 0)
    groups = a.get("groups", 1) or 1
    unbatched = x.rank == n_sp + 1
    if unbatched:
        x = b.reshape(x, (1, *x.shape), hint="batched")
    out_shape = ((1,) if unbatched else ()) + tuple(b.out.shape)
    N, C, *in_sp = x.shape
    out_sp = out_shape[2:]
    # weight: (OC, C/groups, *ks); transposed: (C, OC/groups, *ks)
    Cg, OCg = (C // groups, w.shape[1]) if transposed else (w.shape[1], w.shape[0] // groups)
    P, K = prod(out_sp), Cg * prod(ks)
    dt = b.out.dtype
    n, g, p, k = (Var(f"i{d}") for d in range(4))
    c, *k_pos = _unflatten(k, (Cg, *ks))
    if transposed:
        coords, valid = _transposed_window(_unflatten(p, out_sp), k_pos, stride, pad, dil, ks,
                                           in_sp)
        g2, oc2, k2 = (Var(f"i{d}") for d in range(3))
        c2, *k2_pos = _unflatten(k2, (Cg, *ks))
        wk = b.index_map(b.cast(w, dt), (groups, OCg, K), (add(mul(g2, Cg), c2), oc2, *k2_pos),
                         hint="wk")
    else:
        coords = _window(_unflatten(p, out_sp), k_pos, stride, pad, dil)
        valid = _inside(coords, [0] * n_sp, in_sp)
        wk = b.reshape(b.cast(w, dt), (groups, OCg, K), hint="wk")
    cols = b.index_map(b.cast(x, dt), (N, groups, P, K), (n, add(mul(g, Cg), c), *coords),
                       valid=valid, fill=0, hint="im2col")
    y = matmul(b, cols, wk, transposed=True, hint="conv")          # (N, groups, P, OCg)
    o = [Var(f"i{d}") for d in range(2 + n_sp)]
    flat = Const(0)
    for d, size in enumerate(out_sp):
        flat = add(mul(flat, size), o[2 + d])
    out = b.index_map(y, out_shape, (o[0], floordiv(o[1], OCg), flat, mod(o[1], OCg)),
                      hint="conv_out")
    if a.get("bias") is not None:
        bias = b.index_map(b.cast(a.bias, dt), out_shape, (o[1],), hint="bias")
        out = b.ew("add", out, bias)
    return b.reshape(out, b.out.shape, hint="unbatched") if unbatched else out


def _pool_window(b, x: T, n_sp: int, ks, stride, pad, dil, out_sp, fill, valid_hi=None) -> T:
    """x's windows as (*leading, *out_sp, prod(ks)); `fill` outside the input (or outside
    `valid_hi` when given: the padded bounds an average counts)."""
    lead = x.shape[:x.rank - n_sp]
    rank = len(lead) + n_sp
    o = [Var(f"i{d}") for d in range(rank)]
    k_pos = _unflatten(Var(f"i{rank}"), ks)
    coords = _window(o[len(lead):], k_pos, stride, pad, dil)
    hi = valid_hi if valid_hi is not None else x.shape[len(lead):]
    lo = [0] * n_sp if valid_hi is None else [-q for q in pad]
    return b.index_map(x, (*lead, *out_sp, prod(ks)), (*o[:len(lead)], *coords),
                       valid=_inside(coords, lo, hi), fill=fill, hint="window")


def _pool_args(b, a, n_sp: int):
    ks = _per_dim(a.kernel_size, n_sp, 1)
    stride = _per_dim(a.get("stride"), n_sp, ks)
    pad = _per_dim(a.get("padding"), n_sp, 0)
    dil = _per_dim(a.get("dilation"), n_sp, 1)
    out = b.out[0] if isinstance(b.out, (list, tuple)) else b.out
    return ks, stride, pad, dil, out.shape[len(out.shape) - n_sp:]


def _squeeze_last(b, x: T) -> T:
    return b.squeeze(x, (x.rank - 1,), hint="pooled")


@rule("aten.max_pool1d_with_indices", "aten.max_pool2d_with_indices",
      "aten.max_pool3d_with_indices", "aten.max_pool1d", "aten.max_pool2d", "aten.max_pool3d")
def max_pool(b, a):
    n_sp = int(b.op.split("max_pool")[1][0])
    x = a.self
    ks, stride, pad, dil, out_sp = _pool_args(b, a, n_sp)
    win = _pool_window(b, x, n_sp, ks, stride, pad, dil, out_sp, float("-inf"))
    values = _squeeze_last(b, b.reduce("max", win, (win.rank - 1,), hint="max"))
    if not b.op.endswith("with_indices"):
        return values
    # where the max was: its flat position in the input's spatial plane (torch's indices)
    sp = x.shape[x.rank - n_sp:]
    plane = b.full(x.shape, 0, "i64", hint="zero")
    for d in range(n_sp):
        axis = x.rank - n_sp + d
        step = b.ew("multiply", b.iota(x.shape, axis, hint="pos"), prod(sp[d + 1:]), dtype="i64")
        plane = b.ew("add", plane, step, dtype="i64", hint="flatpos")
    pos = _pool_window(b, plane, n_sp, ks, stride, pad, dil, out_sp, -1)
    arg = b.reduce("argmax", win, (win.rank - 1,), hint="argmax")
    idx = b.gather(pos, arg, (*(Var(f"i{d}") for d in range(win.rank - 1)), Var("idx")),
                   hint="argpos")
    return values, _squeeze_last(b, idx)


@rule("aten.avg_pool1d", "aten.avg_pool2d", "aten.avg_pool3d")
def avg_pool(b, a):
    n_sp = int(b.op.split("avg_pool")[1][0])
    x = b.cast(a.self, b.out.dtype)
    ks, stride, pad, _, out_sp = _pool_args(b, a, n_sp)
    dil = (1,) * n_sp
    total = b.reduce("sum", _pool_window(b, x, n_sp, ks, stride, pad, dil, out_sp, 0),
                     (x.rank,), hint="window_sum")
    if a.get("divisor_override"):
        return _squeeze_last(b, b.ew("divide", total, float(a.divisor_override)))
    sp = x.shape[x.rank - n_sp:]
    # the count: window positions inside the input, or inside the padded input (and the input
    # plus padding, not past it, under ceil_mode) when padding counts
    hi = [n + q for n, q in zip(sp, pad)] if a.get("count_include_pad", True) else None
    ones = b.full(x.shape, 1.0, x.dtype, hint="one")
    count = b.reduce("sum", _pool_window(b, ones, n_sp, ks, stride, pad, dil, out_sp, 0, hi),
                     (x.rank,), hint="count")
    return _squeeze_last(b, b.ew("divide", total, count, hint="avg"))


@rule("aten.adaptive_avg_pool1d", "aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d",
      "aten.adaptive_avg_pool3d", "aten._adaptive_avg_pool3d", "aten.adaptive_max_pool1d",
      "aten.adaptive_max_pool2d", "aten.adaptive_max_pool3d")
def adaptive_pool(b, a):
    """Output cell o of n_out over n_in reads [floor(o n_in / n_out), ceil((o+1) n_in / n_out)):
    a window of the widest cell's length, masked past each cell's own end."""
    is_max = "max" in b.op
    out = b.out[0] if isinstance(b.out, (list, tuple)) else b.out
    x = a.self if is_max else b.cast(a.self, out.dtype)
    n_sp = len(a.output_size)
    lead = x.shape[:x.rank - n_sp]
    sp, out_sp = x.shape[x.rank - n_sp:], out.shape[len(out.shape) - n_sp:]
    widths = [max(-(-((o + 1) * n) // m) - (o * n) // m for o in range(m)) if m else 1
              for n, m in zip(sp, out_sp)]
    rank = len(lead) + n_sp
    o = [Var(f"i{d}") for d in range(rank)]
    k_pos = _unflatten(Var(f"i{rank}"), widths)
    starts = [floordiv(mul(oi, n), m) for oi, n, m in zip(o[len(lead):], sp, out_sp)]
    ends = [floordiv(add(mul(oi, n), n + m - 1), m) for oi, n, m in zip(o[len(lead):], sp, out_sp)]
    coords = [add(s, k) for s, k in zip(starts, k_pos)]
    valid = _inside(coords, [0] * n_sp, ends)
    shape = (*lead, *out_sp, prod(widths))
    fill = float("-inf") if is_max else 0
    win = b.index_map(x, shape, (*o[:len(lead)], *coords), valid=valid, fill=fill, hint="window")
    if is_max:
        values = _squeeze_last(b, b.reduce("max", win, (rank,), hint="max"))
        plane = b.full(x.shape, 0, "i64", hint="zero")
        for d in range(n_sp):
            step = b.ew("multiply", b.iota(x.shape, len(lead) + d, hint="pos"), prod(sp[d + 1:]),
                        dtype="i64")
            plane = b.ew("add", plane, step, dtype="i64", hint="flatpos")
        pos = b.index_map(plane, shape, (*o[:len(lead)], *coords), valid=valid, fill=-1)
        arg = b.reduce("argmax", win, (rank,), hint="argmax")
        idx = b.gather(pos, arg, (*o, Var("idx")), hint="argpos")
        return values, _squeeze_last(b, idx)
    ones = b.full(x.shape, 1.0, x.dtype, hint="one")
    count = b.reduce("sum", b.index_map(ones, shape, (*o[:len(lead)], *coords), valid=valid,
                                        fill=0, hint="window"), (rank,), hint="count")
    total = b.reduce("sum", win, (rank,), hint="window_sum")
    return _squeeze_last(b, b.ew("divide", total, count, hint="avg"))


@rule("aten.constant_pad_nd", "aten.pad", "aten.reflection_pad1d", "aten.reflection_pad2d",
      "aten.reflection_pad3d", "aten.replication_pad1d", "aten.replication_pad2d",
      "aten.replication_pad3d")
def pad(b, a):
    """F.pad's list runs from the last dim backwards: (left, right, top, bottom, ...);
    negative amounts crop."""
    x = a.self
    mode = a.get("mode") or ("reflect" if "reflection" in b.op else
                             "replicate" if "replication" in b.op else "constant")
    amounts = list(a.pad if "pad" in a and a.pad is not None else a.padding)
    index, conds = [], []
    for d in range(x.rank):
        i = Var(f"i{d}")
        j = (x.rank - 1 - d) * 2
        lo = amounts[j] if j < len(amounts) else 0
        n = x.shape[d]
        src = sub(i, lo)
        if lo == 0 and (j + 1 >= len(amounts) or amounts[j + 1] <= 0) or j >= len(amounts):
            index.append(src)
        elif mode == "constant":
            index.append(src)
            conds += [call("ge", src, 0), call("lt", src, n)]
        elif mode == "reflect":                     # -1 -> 1, n -> n - 2
            index.append(sub(n - 1, call("abs", sub(n - 1, call("abs", src)))))
        elif mode == "replicate":
            index.append(call("minimum", call("maximum", src, 0), n - 1))
        elif mode == "circular":
            index.append(mod(add(src, n * (lo // n + 1)), n))
        else:
            raise StrataError(f"padding mode {mode!r} is not supported")
    valid = None
    for t in conds:
        valid = t if valid is None else call("logical_and", valid, t)
    value = a.get("value") or 0
    return b.index_map(x, b.out.shape, tuple(index), valid=valid, fill=value, hint="pad")
