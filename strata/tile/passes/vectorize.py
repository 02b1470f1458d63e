"""vectorize: give each thread VEC consecutive elements so loads and stores move 16 bytes.

Elementwise kernels: the innermost axis must be a multiple of VEC. Row kernels: each strided
loop of a row (RMSNorm's reduction and its output loop) is vectorised on its own; its extent
must be a multiple of VEC. In both, every access must either not move with the vectorised
variable (a broadcast, loaded once) or move with unit stride from a VEC-aligned base. Declines,
saying which access prevents it, otherwise.
"""
from __future__ import annotations

from dataclasses import replace

from ...core import dtypes
from ...core.context import Context
from ...core.expr import coefficient, free_vars
from ...loop.ir import Load, Loop, Store
from ..alignment import aligned
from ..ir import StridedLoop, TileKernel, flat_index, walk


def _why_not(k: TileKernel, accesses, inner: str, extent: int, vec: int, fixed: set[str]):
    """None when the accesses allow VEC along `inner`, else the reason."""
    if extent % vec:
        return f"extent {extent} is not a multiple of {vec}"
    for s in accesses:
        flat = flat_index(s.index, k.shape_of(s.buf))
        c = coefficient(flat, inner)
        if isinstance(s, Load) and s.pred is not None:
            return f"{s.buf} is read under a predicate"
        if not free_vars(flat) <= fixed | {inner}:
            return f"{s.buf} is read at a data-dependent index"
        if c == 0 and isinstance(s, Load):
            continue
        if c != 1 or not aligned(flat, inner, vec, fixed):
            return f"{s.buf} is not accessed contiguously from an aligned base"
    return None


def _width(k: TileKernel, accesses, ctx: Context) -> int:
    """VEC, at most 16 bytes of the widest element: no wider vector access exists."""
    widest = max((dtypes.ITEMSIZE[k.dtype_of(s.buf)] for s in accesses), default=4)
    most = max(1, 16 // widest)
    vec = ctx.knob("VEC", most)
    if vec > most:
        msg = (f"vectorize: {k.name}: VEC={vec} does not apply: {vec} elements of {widest} bytes "
               f"exceed a 16-byte access; VEC={most}")
        if msg not in ctx.messages:         # once per kernel, not once per loop
            ctx.log(msg)
        return most
    return vec


def _rows(k: TileKernel, ctx: Context) -> TileKernel:
    fixed = {v for v, _ in k.domain}
    chosen = set()

    def one(s):
        if not isinstance(s, StridedLoop):
            return s
        if s.vec > 1:                       # a byte GEMV's (tile/gemv.py)
            chosen.add(s.vec)
            return s
        if any(isinstance(x, (Loop, StridedLoop)) for x in walk(s.body)):
            ctx.log(f"vectorize: {k.name}: declined loop {s.var}, it holds another loop")
            return s
        accesses = [x for x in s.body if isinstance(x, (Load, Store))]
        moving = [x for x in accesses if coefficient(flat_index(x.index, k.shape_of(x.buf)), s.var) != 0]
        vec = _width(k, moving, ctx)
        if vec == 1 or not moving:
            return s
        why = _why_not(k, accesses, s.var, s.extent, vec, fixed)
        if why:
            ctx.log(f"vectorize: {k.name}: declined loop {s.var}, {why}")
            return s
        chosen.add(vec)
        return replace(s, vec=vec)
    body = tuple(one(s) for s in k.body)
    return replace(k, body=body).with_knob("VEC", max(chosen, default=1))


def vectorize(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode == "rows":
        return _rows(k, ctx)
    if k.mode != "elementwise" or not k.domain:
        return k
    inner, extent = k.domain[-1]
    accesses = [s for s in walk(k.body) if isinstance(s, (Load, Store))]
    vec = _width(k, accesses, ctx)
    if vec == 1:
        return k.with_knob("VEC", 1)
    why = _why_not(k, accesses, inner, extent, vec, {v for v, _ in k.domain})
    if why:
        ctx.log(f"vectorize: {k.name}: declined, {why}")
        return k.with_knob("VEC", 1)
    return replace(k, vec=vec).with_knob("VEC", vec)
