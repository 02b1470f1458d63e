"""Rules for tensors made from nothing: full/zeros/ones(_like), empty, scalar_tensor, arange.

They become Full and Iota nodes (arange with a start or step is start + iota * step), so a
later stage can fold them into the kernels that read them.
"""
from __future__ import annotations

from ..core import dtypes
from .builder import rule


@rule("aten.full", "aten.full_like", "aten.new_full")
def full(b, a):
    return b.full(b.out.shape, a.fill_value, b.out.dtype)


@rule("aten.zeros", "aten.zeros_like", "aten.new_zeros", "aten.ones", "aten.ones_like",
      "aten.new_ones", "aten._efficientzerotensor")
def zeros(b, a):
    return b.full(b.out.shape, 1 if "ones" in b.op else 0, b.out.dtype)


@rule("aten.empty", "aten.empty_like", "aten.new_empty", "aten.empty_permuted",
      "aten.empty_strided")
def empty(b, a):
    """Memory whose values torch leaves unspecified (AOTAutograd's backward of addcdiv and lerp
    makes one before writing it): zeros are as good as any, and deterministic."""
    return b.full(b.out.shape, 0, b.out.dtype)


@rule("aten.scalar_tensor")
def scalar_tensor(b, a):
    return b.full((), a.s, b.out.dtype)


@rule("aten.arange")
def arange(b, a):
    n, = b.out.shape
    dt = b.out.dtype
    start = a.get("start") or 0
    step = a.get("step") or 1
    pos = b.iota((n,), 0, hint="iota")
    if start == 0 and step == 1:
        return b.cast(pos, dt)
    if dtypes.is_float(dt):
        scaled = b.ew("multiply", b.cast(pos, dt), float(step), hint="scaled")
        return b.ew("add", scaled, float(start))
    scaled = b.ew("multiply", pos, int(step), hint="scaled") if step != 1 else pos
    return b.cast(b.ew("add", scaled, int(start)), dt)
