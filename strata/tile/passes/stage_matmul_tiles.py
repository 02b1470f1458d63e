"""stage_matmul_tiles: compute each K step's operand tiles once per block, into shared memory.

Per K-outer step, the whole block fills a TILE_K x TILE_M tile of the M-side operand and a
TILE_K x TILE_N tile of the N-side operand (`StageTile`), computing the prologue (bias add,
scale, cast ...) on the way, so that each element is loaded and computed once per block instead
of once per thread that needs it; then a barrier, the K-inner loop reading the tiles, and a
barrier before the next step overwrites them. Elements outside the matrix (the K tail, the M and
N edges) are stored as 0, so the K-inner loop needs no guard. The fill walks the operand's
contiguous global axis across neighbouring threads. Declines, saying why, when the tiles exceed
the shared-memory budget (SMEM_BUDGET bytes) or the K steps are not in the expected shape.
"""
from __future__ import annotations

from dataclasses import replace

from ...core import dtypes
from ...core.context import Context
from ...core.expr import Const, Var, sub
from ...loop.ir import Load, Loop
from ..contraction import (closure, conjoin, depends, edge, fastest_axis, product, value_dtype,
                           without)
from ..ir import Guard, Points, StageTile, Sync, TileKernel

SMEM_BUDGET = 32 * 1024


def _stage(k: TileKernel, body, value: str, inner: Loop, guard, side: str) -> StageTile:
    mt = k.matmul
    axis, tile, origin = (mt.m, mt.tile_m, "m0") if side == "A" else (mt.n, mt.tile_n, "n0")
    cut = edge(axis, k.extent(axis), tile)
    stmts = tuple(replace(s, pred=without(s.pred, cut)) if isinstance(s, Load) and cut is not None
                  else s for s in closure(body, value))
    last = stmts[-1]
    dtype = k.dtype_of(last.buf) if isinstance(last, Load) else value_dtype(last)
    x_extent = tile if axis else 1
    return StageTile(f"{value}_smem", value, dtype, inner.var, inner.extent, axis, x_extent, origin,
                     stmts, conjoin(guard, cut), fastest_axis(k, stmts, inner.var, axis), x_extent)


def _stage_step(k: TileKernel, outer: Loop):
    """((stage A, stage B), the K-outer loop filling them each step), or why not."""
    if len(outer.body) != 1 or not isinstance(outer.body[0], Loop):
        return "the K-outer loop does not hold one K-inner loop"
    inner = outer.body[0]
    guard, body = None, inner.body
    if len(body) == 1 and isinstance(body[0], Guard):
        guard, body = body[0].cond, body[0].body
    if len(body) != 1 or not isinstance(body[0], Points):
        return "the K-inner loop does not hold register points"
    points = body[0].body
    found = product(points)
    if isinstance(found, str):
        return found
    a, b, _ = found
    mt = k.matmul
    if mt.n in depends(points, {mt.n})[a]:
        a, b = b, a
    stages = (_stage(k, points, a, inner, guard, "A"), _stage(k, points, b, inner, guard, "B"))
    staged = {s.var for st in stages for s in st.body}
    reads = tuple(Load(st.value, st.name, (Var(inner.var), sub(Var(st.x_var), Var(st.origin))
                                           if st.x_var else Const(0)),
                       dtypes.compute_dtype(value_dtype(st.body[-1])))
                  for st in stages)
    compute = reads + tuple(s for s in points if getattr(s, "var", None) not in staged)
    new_inner = replace(inner, body=(Points(compute, registers=True),))
    return stages, replace(outer, body=stages + (new_inner, Sync()))


def stage_matmul_tiles(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "matmul":
        return k
    budget = ctx.knob("SMEM_BUDGET", SMEM_BUDGET)
    body, used = [], 0
    for s in k.body:
        if not isinstance(s, Loop):
            body.append(s)
            continue
        staged = _stage_step(k, s)
        if isinstance(staged, str):
            ctx.log(f"stage_matmul_tiles: {k.name}: declined, {staged}")
            return k
        stages, loop = staged
        used += sum(st.k_extent * st.stride * dtypes.ITEMSIZE[st.dtype] for st in stages)
        body.append(loop)
    if ctx.pinned("SMEM_BUDGET"):
        k = k.with_knob("SMEM_BUDGET", budget)
    if used > budget:
        ctx.log(f"stage_matmul_tiles: {k.name}: declined, the tiles need {used} bytes of shared "
                f"memory (SMEM_BUDGET={budget})")
        return k
    return replace(k, body=tuple(body))
