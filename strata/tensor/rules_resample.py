"""Rules for interpolate/upsample: nearest, nearest-exact, (bi/tri)linear, align_corners both ways.

Each spatial dim is resampled in turn (the last first, as torch's kernels weight it): the source
position of every output index is computed in float32 from an Iota exactly as torch computes
it (the scale 1/scale_factor when one is given, else in/out), then Gathers read the one
(nearest) or two (linear) neighbours, which the loop stage fuses into one kernel.
"""
from __future__ import annotations

import numpy as np

from .builder import T, rule
from .rules_layout import gather_along


def _scale(n_in: int, n_out: int, factor, align_corners: bool) -> float:
    """torch's area_pixel_compute_scale, in float32."""
    if align_corners:
        return float(np.float32((n_in - 1) / (n_out - 1))) if n_out > 1 else 0.0
    if factor is not None and factor > 0:
        return float(np.float32(1.0 / factor))
    return float(np.float32(n_in) / np.float32(n_out))


def _positions(b, shape, d: int) -> T:
    return b.cast(b.iota(shape, d, hint="dst"), "f32")


def _nearest_along(b, x: T, d: int, n_out: int, factor, exact: bool) -> T:
    shape = tuple(n_out if k == d else n for k, n in enumerate(x.shape))
    pos = _positions(b, shape, d)
    if exact:
        pos = b.ew("add", pos, 0.5, hint="center")
    src = b.ew("floor", b.ew("multiply", pos, _scale(x.shape[d], n_out, factor, False)), hint="src")
    idx = b.ew("minimum", b.cast(src, "i64"), x.shape[d] - 1, dtype="i64", hint="nearest")
    return gather_along(b, x, idx, d, shape)


def _linear_along(b, x: T, d: int, n_out: int, factor, align_corners: bool) -> T:
    shape = tuple(n_out if k == d else n for k, n in enumerate(x.shape))
    scale = _scale(x.shape[d], n_out, factor, align_corners)
    pos = _positions(b, shape, d)
    if align_corners:
        src = b.ew("multiply", pos, scale, hint="src")
    else:
        src = b.ew("subtract", b.ew("multiply", b.ew("add", pos, 0.5), scale), 0.5)
        src = b.ew("maximum", src, 0.0, hint="src")
    i0 = b.cast(b.ew("floor", src), "i64")
    i1 = b.ew("minimum", b.ew("add", i0, 1, dtype="i64"), x.shape[d] - 1, dtype="i64", hint="next")
    w1 = b.ew("subtract", src, b.cast(i0, "f32"), hint="frac")
    w0 = b.ew("subtract", 1.0, w1, hint="rest")
    x0 = gather_along(b, x, i0, d, shape)
    x1 = gather_along(b, x, i1, d, shape)
    return b.ew("add", b.ew("multiply", x0, w0), b.ew("multiply", x1, w1), hint="lerp")


def _factors(a, n_sp: int):
    """Scale factors per spatial dim from either overload (.vec's list, or scales_h/_w/_d)."""
    if "scale_factors" in a:
        f = a.get("scale_factors")
        return list(f) if f else [None] * n_sp
    names = {1: ["scales"], 2: ["scales_h", "scales_w"], 3: ["scales_d", "scales_h", "scales_w"]}
    return [a.get(k) for k in names[n_sp]]


@rule("aten.upsample_nearest1d", "aten.upsample_nearest2d", "aten.upsample_nearest3d",
      "aten._upsample_nearest_exact1d", "aten._upsample_nearest_exact2d",
      "aten._upsample_nearest_exact3d", "aten.upsample_linear1d", "aten.upsample_bilinear2d",
      "aten.upsample_trilinear3d")
def upsample(b, a):
    x = a.input if "input" in a else a.self
    out_sp = b.out.shape[2:]
    n_sp = len(out_sp)
    factors = _factors(a, n_sp)
    linear = "linear" in b.op
    y = b.cast(x, "f32") if linear else x
    for k in reversed(range(n_sp)):
        d = 2 + k
        if linear:
            y = _linear_along(b, y, d, out_sp[k], factors[k], bool(a.get("align_corners")))
        else:
            y = _nearest_along(b, y, d, out_sp[k], factors[k], "exact" in b.op)
    return b.cast(y, b.out.dtype)
