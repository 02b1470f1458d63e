"""stage_inputs: copy an input slab that a row reads more than once into shared memory.

A buffer qualifies when every load of it in the row reads `base + a` with `a` the variable of
a loop over the row and `base` fixed for the row, and at least two loops read it (RMSNorm reads
`x` in the reduction and again in the output loop). The slab is filled cooperatively once per
row, so it needs one row per block. Declines, saying why, when the slab does not fit the
shared-memory budget (SMEM_BUDGET bytes) or when rows are packed several to a block. The copy
moves 16 bytes per thread when the slab's origin and size allow it, or VEC elements when VEC is
pinned (VEC=1: no vector access anywhere in the kernel).
"""
from __future__ import annotations

from dataclasses import replace

from ...core import dtypes
from ...core.context import Context
from ...core.expr import Var, add, coefficient, free_vars, simplify, sub
from ...loop.ir import Load
from ..alignment import aligned
from ..ir import Stage, StridedLoop, TileKernel, flat_index, map_body


def _candidates(k: TileKernel):
    """buf -> (base, size, [loop vars]) for buffers read as base + loop var in row loops."""
    found: dict[str, list] = {}
    bad: set[str] = set()
    row_vars = {v for v, _ in k.domain}
    for loop in k.body:
        if not isinstance(loop, StridedLoop):
            continue
        for s in loop.body:
            if not isinstance(s, Load) or s.buf in bad:
                continue
            flat = flat_index(s.index, k.shape_of(s.buf))
            if s.pred is not None or coefficient(flat, loop.var) != 1:
                bad.add(s.buf)
                continue
            base = simplify(sub(flat, Var(loop.var)))
            if not free_vars(base) <= row_vars:       # must be fixed for the whole row
                bad.add(s.buf)
                continue
            found.setdefault(s.buf, []).append((base, loop.extent, loop.var))
    out = {}
    for buf, uses in found.items():
        if buf in bad or len({u[2] for u in uses}) < 2:
            continue
        if len({(u[0], u[1]) for u in uses}) == 1:
            out[buf] = (uses[0][0], uses[0][1])
    return out


def stage_inputs(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "rows" or k.group != k.block or k.group == 1:
        return k
    candidates = _candidates(k)
    if not candidates:
        return k
    budget = ctx.knob("SMEM_BUDGET", 32 * 1024)
    if ctx.pinned("SMEM_BUDGET"):
        k = k.with_knob("SMEM_BUDGET", budget)
    row_vars = {v for v, _ in k.domain}
    stages, used = [], 0
    for buf, (base, size) in candidates.items():
        dt = k.dtype_of(buf)
        nbytes = size * dtypes.ITEMSIZE[dt]
        if used + nbytes > budget:
            ctx.log(f"stage_inputs: {k.name}: declined {buf}: a {nbytes}-byte slab exceeds the "
                    f"shared-memory budget ({budget - used} bytes left)")
            continue
        used += nbytes
        vec = 16 // dtypes.ITEMSIZE[dt]
        vec = min(vec, ctx.knob("VEC", vec))
        copy_vec = vec if size % vec == 0 and aligned(add(base, Var("f")), "f", vec, row_vars) else 1
        stages.append(Stage(f"{buf}_smem", buf, base, size, dt, copy_vec))
    if not stages:
        return k
    staged = {s.buf: s for s in stages}

    def rewrite(s):
        if isinstance(s, Load) and s.buf in staged:
            st = staged[s.buf]
            flat = flat_index(s.index, k.shape_of(s.buf))
            return Load(s.var, st.name, (simplify(sub(flat, st.base)),), s.dtype)
        return s
    return replace(k, body=tuple(stages) + map_body(k.body, rewrite))
