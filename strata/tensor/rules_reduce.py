"""Rules for reductions and the normalisations built on them.

Reduce nodes always keep their reduced axes (size 1); an IndexMap squeezes them when the aten op
does not keepdim. Formulas are the numerically stable ones: softmax and logsumexp subtract the
max first, var/std are two-pass (mean, then mean of squared deviations).
"""
from __future__ import annotations

from math import prod

import torch

from .. import dtypes
from ..expr import Var, call
from .builder import T, norm_axis, rule


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
        from .rules_elementwise import binary
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


@rule("aten.cumsum")
def cumsum(b, a):
    """A prefix sum as a triangular reduction: out[.., i, ..] = sum_j x[.., j, ..] * (j <= i).

    O(n^2) work along the axis, which is cheap for the short axes models scan (position ids,
    packed-sequence ids); a log-depth Scan node would replace it for long axes."""
    x = b.cast(a.self, b.out.dtype)
    if x.rank == 0:
        return x
    d = norm_axis(a.dim, x.rank)
    n = x.shape[d]
    j = Var(f"i{x.rank}")                                  # the summed position, a new last axis
    index = [Var(f"i{k}") for k in range(x.rank)]
    index[d] = j
    tri = b.index_map(x, x.shape + (n,), tuple(index), valid=call("le", j, Var(f"i{d}")),
                      fill=0, hint="tri")
    red = b.reduce("sum", tri, (x.rank,), hint="sum")
    return b.squeeze(red, (x.rank,))
