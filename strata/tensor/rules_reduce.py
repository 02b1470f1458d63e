"""Rules for reductions and the normalisations built on them.

Reduce nodes always keep their reduced axes (size 1); an IndexMap squeezes them when the aten op
does not keepdim. Formulas are the numerically stable ones: softmax and logsumexp subtract the
max first, var/std are two-pass (mean, then mean of squared deviations).
"""
from __future__ import annotations

from math import prod

import torch

from ..core import dtypes
from ..core.expr import Const, Var
from .builder import T, norm_axis, rule
from .rules_elementwise import binary
from .rules_layout import cat_along, gather_along


def axes_of(x: T, dim) -> tuple[int, ...]:
    """Normalised reduction axes; None or [] mean every axis (as torch's sum/mean do)."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(x.rank))
    if x.rank == 0:                     # a 0-d tensor accepts dim 0 / -1 and reduces nothing
        return ()
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return tuple(sorted({norm_axis(d, x.rank) for d in dims}))


def count(x: T, axes) -> int:
    return prod(x.shape[d] for d in axes)


def finish(b, red: T, axes, keepdim: bool) -> T:
    return red if keepdim else b.squeeze(red, axes)


def float_dtype(b) -> str:
    out = b.out[0] if isinstance(b.out, tuple) else b.out
    return out.dtype


def mean_keep(b, x: T, axes, hint: str = "mean") -> T:
    s = b.reduce("sum", x, axes, hint=f"{hint}_sum")
    return b.ew("divide", s, float(count(x, axes)), hint=hint)


def var_keep(b, x: T, axes, correction: float) -> tuple[T, T]:
    """(variance, mean), both keepdim: two passes, mean first."""
    mean = mean_keep(b, x, axes)
    diff = b.ew("subtract", x, mean, hint="diff")
    sq = b.ew("square", diff, hint="sq")
    ss = b.reduce("sum", sq, axes, hint="sumsq")
    return b.ew("divide", ss, float(max(count(x, axes) - correction, 0)), hint="var"), mean


@rule("aten.sum", "aten.prod")
def sum_(b, a):
    x = b.cast(a.self, b.out.dtype)
    axes = axes_of(x, a.get("dim"))
    op = "sum" if b.op == "aten.sum" else "prod"
    return finish(b, b.reduce(op, x, axes, hint=op), axes, a.get("keepdim", False))


@rule("aten.mean")
def mean(b, a):
    x = b.cast(a.self, b.out.dtype)
    axes = axes_of(x, a.get("dim"))
    return finish(b, mean_keep(b, x, axes), axes, a.get("keepdim", False))


@rule("aten.amax", "aten.amin")
def amax(b, a):
    axes = axes_of(a.self, a.get("dim"))
    op = "max" if b.op == "aten.amax" else "min"
    return finish(b, b.reduce(op, a.self, axes, hint=op), axes, a.get("keepdim", False))


@rule("aten.max", "aten.min")
def max_(b, a):
    op = "max" if b.op == "aten.max" else "min"
    if a.get("other") is not None:                    # max(a, b) is maximum
        b.op = "aten.maximum" if op == "max" else "aten.minimum"
        return binary(b, a)
    if a.get("dim") is None:
        return finish(b, b.reduce(op, a.self, axes_of(a.self, None), hint=op),
                      range(a.self.rank), False)
    axes = axes_of(a.self, a.dim)
    keep = a.get("keepdim", False)
    values = finish(b, b.reduce(op, a.self, axes, hint=op), axes, keep)
    if not axes:
        return values, b.full(values.shape, 0, "i64", hint="arg" + op)
    index = finish(b, b.reduce("arg" + op, a.self, axes, hint="arg" + op), axes, keep)
    return values, index


@rule("aten.argmax", "aten.argmin")
def argmax(b, a):
    op = b.op.split(".")[1]
    x = a.self
    if x.numel == 1:                    # one element: its index is 0
        return b.full(b.out.shape, 0, "i64")
    if a.get("dim") is None:            # index into the flattened tensor
        flat = b.reshape(x, (x.numel,), hint="flat")
        red = b.reduce(op, flat, (0,), hint=op)
        return b.reshape(red, b.out.shape, hint="squeeze")
    axes = axes_of(x, a.dim)
    return finish(b, b.reduce(op, x, axes, hint=op), axes, a.get("keepdim", False))


@rule("aten.any", "aten.all")
def any_(b, a):
    x = b.cast(a.self, "bool")
    axes = axes_of(x, a.get("dim"))
    op = "max" if b.op == "aten.any" else "min"
    out = finish(b, b.reduce(op, x, axes, hint=b.op.split(".")[1]), axes, a.get("keepdim", False))
    return b.cast(out, b.out.dtype)     # a uint8 input gives uint8 0/1 (torch's legacy rule)


def correction_of(a) -> float:
    if a.get("correction") is not None:
        return float(a.correction)
    unbiased = a.get("unbiased")
    return 0.0 if unbiased is False else 1.0


@rule("aten.var", "aten.std", "aten.var_mean", "aten.std_mean")
def var(b, a):
    x = b.cast(a.self, float_dtype(b))
    axes = axes_of(x, a.get("dim"))
    v, mean = var_keep(b, x, axes, correction_of(a))
    if b.op.startswith("aten.std"):
        v = b.ew("sqrt", v, hint="std")
    keep = a.get("keepdim", False)
    if b.op.endswith("_mean"):
        return finish(b, v, axes, keep), finish(b, mean, axes, keep)
    return finish(b, v, axes, keep)


@rule("aten.logsumexp")
def logsumexp(b, a):
    x = b.cast(a.self, b.out.dtype)
    axes = axes_of(x, a.get("dim"))
    m = b.reduce("max", x, axes, hint="max")
    if m.name != x.name:        # as torch: an infinite max shifts by 0 (inf - inf would be NaN)
        inf = b.ew("eq", b.ew("abs", m, hint="max_abs"), float("inf"), hint="max_inf")
        m = b.ew("where", inf, 0.0, m, dtype=x.dtype, hint="shift")
    e = b.ew("exp", b.ew("subtract", x, m, hint="shifted"))
    ls = b.ew("log", b.reduce("sum", e, axes))
    return finish(b, b.ew("add", ls, m, hint="lse"), axes, a.get("keepdim", False))


@rule("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax")
def softmax(b, a):
    x = b.cast(a.self, b.out.dtype)
    axes = (norm_axis(a.dim, x.rank),) if x.rank else ()
    if not axes:
        return b.full((), 0.0 if "log" in b.op else 1.0, x.dtype)
    m = b.reduce("max", x, axes, hint="max")
    shifted = b.ew("subtract", x, m, hint="shifted")
    e = b.ew("exp", shifted)
    s = b.reduce("sum", e, axes)
    if "log" in b.op:
        return b.ew("subtract", shifted, b.ew("log", s))
    return b.ew("divide", e, s)


def _affine(b, y: T, weight, bias) -> T:
    if weight is not None:
        y = b.ew("multiply", y, b.cast(weight, y.dtype), hint="scaled")
    if bias is not None:
        y = b.ew("add", y, b.cast(bias, y.dtype), hint="shifted")
    return y


@rule("aten.rms_norm")
def rms_norm(b, a):
    x = a.input
    axes = tuple(range(x.rank - len(a.normalized_shape), x.rank))
    eps = a.get("eps")
    if eps is None:
        eps = torch.finfo(dtypes.to_torch(x.dtype)).eps
    sq = b.ew("square", x, hint="sq")
    ms = b.ew("divide", b.reduce("sum", sq, axes), float(count(x, axes)), hint="mean")
    rstd = b.ew("rsqrt", b.ew("add", ms, float(eps), hint="eps"), hint="rstd")
    return _affine(b, b.ew("multiply", x, rstd, hint="norm"), a.get("weight"), None)


@rule("aten.layer_norm", "aten.native_layer_norm")
def layer_norm(b, a):
    x = a.input
    axes = tuple(range(x.rank - len(a.normalized_shape), x.rank))
    mean = mean_keep(b, x, axes)
    diff = b.ew("subtract", x, mean, hint="diff")
    var = b.ew("divide", b.reduce("sum", b.ew("square", diff, hint="sq"), axes, hint="sumsq"),
               float(count(x, axes)), hint="var")
    rstd = b.ew("rsqrt", b.ew("add", var, float(a.eps), hint="eps"), hint="rstd")
    y = _affine(b, b.ew("multiply", diff, rstd, hint="norm"), a.get("weight"), a.get("bias"))
    if b.op == "aten.native_layer_norm":
        return y, b.reshape(mean, b.out[1].shape), b.reshape(rstd, b.out[2].shape)
    return y


@rule("aten.linalg_vector_norm")
def vector_norm(b, a):
    x = b.cast(a.self, b.out.dtype)
    axes = axes_of(x, a.get("dim"))
    p = float(a.get("ord", 2))
    ax = b.ew("abs", x)
    if p == 2:
        n = b.ew("sqrt", b.reduce("sum", b.ew("square", x, hint="sq"), axes), hint="norm")
    elif p == 1:
        n = b.reduce("sum", ax, axes, hint="norm")
    elif p == float("inf"):
        n = b.reduce("max", ax, axes, hint="norm")
    elif p == float("-inf"):
        n = b.reduce("min", ax, axes, hint="norm")
    elif p == 0:
        nz = b.cast(b.ew("ne", x, 0, hint="nz"), x.dtype)
        n = b.reduce("sum", nz, axes, hint="norm")
    else:
        s = b.reduce("sum", b.ew("pow", ax, p, hint="powp"), axes)
        n = b.ew("pow", s, 1.0 / p, hint="norm")
    return finish(b, n, axes, a.get("keepdim", False))


def _per_channel(b, v, like: T, dtype: str) -> T | None:
    """A (C,) tensor broadcast along axis 1 of `like` (batch, group and instance norms)."""
    if v is None:
        return None
    return b.index_map(b.cast(v, dtype), like.shape, (Var("i1"),), hint="per_channel")


@rule("aten._native_batch_norm_legit_no_training", "aten._native_batch_norm_legit",
      "aten.native_batch_norm", "aten.batch_norm", "aten._native_batch_norm_legit_functional")
def batch_norm(b, a):
    """Eval mode normalises with the running statistics; training mode (and instance_norm,
    which torch writes as a batch norm of the input's own statistics) with the batch's, biased
    variance. Running statistics are not updated: strata compiles inference."""
    out = b.out[0] if isinstance(b.out, (list, tuple)) else b.out
    x = b.cast(a.input, out.dtype)
    training = a.get("training", b.op != "aten._native_batch_norm_legit_no_training")
    if b.op == "aten._native_batch_norm_legit" and a.get("running_mean") is None:
        training = True
    axes = tuple(d for d in range(x.rank) if d != 1)
    if training:
        var, mean = var_keep(b, x, axes, 0)
        rstd = b.ew("rsqrt", b.ew("add", var, float(a.eps), hint="eps"), hint="rstd")
        diff = b.ew("subtract", x, mean, hint="diff")
    else:
        mean = _per_channel(b, a.running_mean, x, x.dtype)
        rstd = b.ew("rsqrt", b.ew("add", _per_channel(b, a.running_var, x, x.dtype),
                                  float(a.eps), hint="eps"), hint="rstd")
        diff = b.ew("subtract", x, mean, hint="diff")
    y = b.ew("multiply", diff, rstd, hint="norm")
    if a.get("weight") is not None:
        y = b.ew("multiply", y, _per_channel(b, a.weight, x, x.dtype), hint="scaled")
    if a.get("bias") is not None:
        y = b.ew("add", y, _per_channel(b, a.bias, x, x.dtype), hint="shifted")
    if not isinstance(b.out, (list, tuple)):
        return y
    rest = b.out[1:]
    if training:        # saved mean and rstd per channel, then (functional) the running stats
        stats = [b.reshape(mean, rest[0].shape), b.reshape(rstd, rest[1].shape)]
        stats += [b.cast(a.running_mean, t.dtype) if i == 2 else b.cast(a.running_var, t.dtype)
                  for i, t in enumerate(rest[2:], 2)]
        return (y, *stats)
    return (y, *(b.full(t.shape, 0, t.dtype, hint="unused") for t in rest))


@rule("aten.native_group_norm", "aten.group_norm")
def group_norm(b, a):
    x = a.input
    out = b.out[0] if isinstance(b.out, (list, tuple)) else b.out
    N, C = x.shape[0], x.shape[1]
    G = a.group if "group" in a else a.num_groups
    per = prod(x.shape[2:]) * (C // G)
    grouped = b.reshape(b.cast(x, out.dtype), (N, G, per), hint="groups")
    var, mean = var_keep(b, grouped, (2,), 0)
    rstd = b.ew("rsqrt", b.ew("add", var, float(a.eps), hint="eps"), hint="rstd")
    normed = b.reshape(b.ew("multiply", b.ew("subtract", grouped, mean, hint="diff"), rstd,
                            hint="norm"), x.shape, hint="ungroup")
    y = normed
    if a.get("weight") is not None:
        y = b.ew("multiply", y, _per_channel(b, a.weight, x, y.dtype), hint="scaled")
    if a.get("bias") is not None:
        y = b.ew("add", y, _per_channel(b, a.bias, x, y.dtype), hint="shifted")
    if b.op == "aten.group_norm":
        return y
    return y, b.reshape(mean, b.out[1].shape), b.reshape(rstd, b.out[2].shape)


@rule("aten.nll_loss_forward", "aten.nll_loss2d_forward")
def nll_loss(b, a):
    """-x[n, target[n], ...] * weight[target], zero where target is ignore_index; reduction
    0 none, 1 mean (over the weights taken), 2 sum. cross_entropy decomposes to this after
    log_softmax. Returns (loss, total_weight)."""
    x, target = a.self, a.target
    out, total_t = b.out
    dt = out.dtype
    c_axis = 1 if x.rank > 1 else 0
    keep = b.ew("ne", target, int(a.ignore_index), hint="kept")
    safe = b.ew("where", keep, target, 0, dtype=target.dtype, hint="class")
    index = [Var(f"i{d}") for d in range(target.rank)]
    index.insert(c_axis, Var("idx"))
    picked = b.gather(b.cast(x, dt), safe, tuple(index), hint="picked")
    if a.get("weight") is not None:
        w = b.gather(b.cast(a.weight, dt), safe, (Var("idx"),), hint="class_weight")
    else:
        w = b.full(target.shape, 1.0, dt, hint="one")
    w = b.ew("where", keep, w, 0.0, dtype=dt, hint="taken")
    loss = b.ew("negative", b.ew("multiply", picked, w, hint="weighted"), hint="nll")
    axes = tuple(range(target.rank))
    total = b.reshape(b.reduce("sum", w, axes, hint="total_weight"), ()) if axes else w
    if a.reduction == 0:
        return loss, total
    summed = b.reshape(b.reduce("sum", loss, axes, hint="loss_sum"), ()) if axes else loss
    if a.reduction == 2:
        return summed, total
    return b.ew("divide", summed, total, hint="mean"), total


@rule("aten.topk")
def topk(b, a):
    """k rounds, each finding the first element in the order that comes after the previous
    round's winner (value, then index): every round reads the row and two scalars, so k rounds
    cost k passes and the program grows linearly in k (sampling's top-50 over a vocabulary).
    torch's order: descending with NaN first, or ascending with NaN last; ties by lower index."""
    x = a.self
    vals_t, idx_t = b.out
    k = int(a.k)
    if k == 0 or x.rank == 0:
        return (b.full(vals_t.shape, 0, vals_t.dtype) if k == 0 else x,
                b.full(idx_t.shape, 0, "i64"))
    d = norm_axis(a.get("dim", -1), x.rank)
    largest = a.get("largest", True)
    is_float = dtypes.is_float(x.dtype)
    pos = b.iota(x.shape, d, hint="pos")
    nan_x = b.ew("isnan", x, hint="nan") if is_float else None
    values, indices = [], []
    for j in range(k):
        if j == 0:
            cand = None
        else:
            v, i = values[-1], indices[-1]
            same = b.ew("eq", x, v, hint="same")
            before = b.ew("gt" if largest else "lt", v, x, hint="before")   # v ranks before x
            if is_float:
                nan_v = b.ew("isnan", v, hint="nan_v")
                same = b.ew("logical_or", same, b.ew("logical_and", nan_x, nan_v))
                nan_first = (nan_v, b.ew("logical_not", nan_x)) if largest else \
                    (b.ew("logical_not", nan_v), nan_x)
                before = b.ew("logical_or", before, b.ew("logical_and", *nan_first))
            later = b.ew("logical_and", same, b.ew("gt", pos, i))
            cand = b.ew("logical_or", before, later, hint="after")
        values.append(_first_in_order(b, x, cand, nan_x, d, largest))
        hit = b.ew("eq", x, values[-1])
        if is_float:
            hit = b.ew("logical_or", hit, b.ew("logical_and", nan_x, b.ew("isnan", values[-1])))
        if cand is not None:
            hit = b.ew("logical_and", hit, cand)
        at = b.ew("where", hit, pos, x.shape[d], dtype="i64", hint="at")
        indices.append(b.reduce("min", at, (d,), hint=f"index{j}"))
    return (cat_along(b, values, d, vals_t.shape), cat_along(b, indices, d, idx_t.shape))


def _first_in_order(b, x, cand, nan_x, d: int, largest: bool):
    """The best value among the candidates (all of x when cand is None): max propagates NaN,
    which is first in descending order; ascending order wants NaN only when nothing else is left."""
    op = "max" if largest else "min"
    if dtypes.is_float(x.dtype):
        fill = float("-inf") if largest else float("inf")
    elif x.dtype == "bool":
        fill = not largest
    else:
        info = torch.iinfo(dtypes.to_torch(x.dtype))
        fill = info.min if largest else info.max
    if largest or nan_x is None:
        masked = x if cand is None else b.ew("where", cand, x, fill, dtype=x.dtype)
        return b.reduce(op, masked, (d,), hint=f"{op}")
    real = b.ew("logical_not", nan_x) if cand is None else \
        b.ew("logical_and", cand, b.ew("logical_not", nan_x))
    best = b.reduce(op, b.ew("where", real, x, fill, dtype=x.dtype), (d,), hint=op)
    left = b.reduce("max", b.ew("where", real, 1, 0, dtype="i32"), (d,), hint="any_real")
    return b.ew("where", left, best, float("nan"), dtype=x.dtype, hint="or_nan")


@rule("aten.sort", "aten.argsort", "aten.msort")
def sort(b, a):
    """A stable sort by counting: an element's position is the number of elements before it in
    the order (smaller, or equal and earlier; NaN last, as torch puts it), and each output slot
    then picks the element whose position it is. O(n^2) per row: for the small rows of
    routing and ranking, not a vocabulary."""
    x = a.self
    outs = b.out if isinstance(b.out, (list, tuple)) else (b.out,)
    if x.rank == 0:
        res = (x, b.full((), 0, "i64"))
        return res if len(outs) == 2 else res[1]
    d = norm_axis(a.get("dim", -1) if b.op != "aten.msort" else 0, x.rank)
    desc = bool(a.get("descending", False))
    n = x.shape[d]
    shape = (*x.shape, n)                       # (..., i at d, ..., j last)
    index_i = [Var(f"i{k}") for k in range(x.rank)]
    index_j = list(index_i)
    index_j[d] = Var(f"i{x.rank}")
    xi = b.index_map(x, shape, tuple(index_i), hint="xi")
    xj = b.index_map(x, shape, tuple(index_j), hint="xj")
    i_pos, j_pos = b.iota(shape, d, hint="i"), b.iota(shape, x.rank, hint="j")
    before = b.ew("gt" if desc else "lt", xj, xi, hint="before")
    if dtypes.is_float(x.dtype):                # NaN sorts as the largest value
        nan_i, nan_j = b.ew("isnan", xi), b.ew("isnan", xj)
        nan_order = b.ew("logical_and", nan_i if not desc else nan_j,
                         b.ew("logical_not", nan_j if not desc else nan_i))
        before = b.ew("logical_or", before, nan_order, hint="before")
        same = b.ew("logical_or", b.ew("eq", xj, xi), b.ew("logical_and", nan_i, nan_j))
    else:
        same = b.ew("eq", xj, xi)
    earlier = b.ew("logical_and", same, b.ew("lt", j_pos, i_pos), hint="earlier")
    ahead = b.cast(b.ew("logical_or", before, earlier), "i64")
    rank = b.reduce("sum", ahead, (x.rank,), hint="rank")            # (..., n at d, ..., 1)
    # slot s (at d) takes the j whose rank is s
    rank_j = b.index_map(rank, shape, (*index_j[:x.rank], Const(0)), hint="rank_j")
    mine = b.ew("eq", rank_j, i_pos, hint="mine")
    idx = b.squeeze(b.reduce("sum", b.ew("where", mine, j_pos, 0, dtype="i64"), (x.rank,)),
                    (x.rank,), hint="order")
    if b.op == "aten.argsort":
        return idx
    return gather_along(b, x, idx, d, x.shape), idx


@rule("aten._weight_norm")
def weight_norm(b, a):
    """v * g / ||v||, the norm over every dim but `dim` (wav2vec2's positional convolution)."""
    v = a.v
    d = norm_axis(a.get("dim", 0), v.rank) if v.rank else 0
    axes = tuple(k for k in range(v.rank) if k != d)
    norm = b.ew("sqrt", b.reduce("sum", b.ew("square", v, hint="sq"), axes, hint="sumsq"), hint="norm")
    return b.ew("multiply", v, b.ew("divide", b.cast(a.g, v.dtype), norm, hint="scale"))
