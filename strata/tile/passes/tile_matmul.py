"""tile_matmul: schedule a contraction as a 2-D block tile instead of one row per thread.

A block computes a TILE_M x TILE_N tile of the output and each of its threads owns THREAD_M x
THREAD_N points of it, spaced by the thread grid so that neighbouring threads touch neighbouring
columns. For now each point still runs its whole row in turn (register_tile interleaves them).
Points past the edge of M or N read nothing (their loads are predicated) and store nothing (the
epilogue is guarded), so M and N need not be multiples of the tile. The row statements after the
reduce loops (the epilogue: bias, activation, residual, cast) and those the loops do not read run
per point after the loops. One row of activations times a matrix of byte weights (Q8_0, Q4_0)
stays a rows kernel instead, read by 16-byte loads (tile/gemv.py). Declines, saying why, when
the row is not a contraction (see tile/contraction.py).
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...loop.ir import Load, Loop
from ..contraction import choose_tiles, conjoin, depends, edge, match
from ..gemv import gemv_rows
from ..ir import Guard, Points, TileKernel, map_body


def tile_matmul(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "rows" or k.group != 1:
        return k
    c = match(k)
    if isinstance(c, str):
        ctx.log(f"tile_matmul: {k.name}: declined, {c}")
        return k
    gemv = gemv_rows(k, c, ctx)
    if gemv is not None:
        return gemv
    mt = choose_tiles(k, c.m, c.n, ctx)
    edges = {c.m: edge(c.m, k.extent(c.m), mt.tile_m), c.n: edge(c.n, k.extent(c.n), mt.tile_n)}
    axes = {v for v, _ in k.domain}

    def predicate(loop: Loop) -> Loop:
        deps = depends(loop.body, axes)

        def fn(s):
            if not isinstance(s, Load):
                return s
            pred = s.pred
            for axis in (c.m, c.n):
                if edges[axis] is not None and axis in deps[s.var]:
                    pred = conjoin(pred, edges[axis])
            return replace(s, pred=pred)
        return replace(loop, body=map_body(loop.body, fn))

    loops = tuple(predicate(s) for s in c.body if isinstance(s, Loop))
    rest = tuple(s for s in c.body if not isinstance(s, Loop))
    guard = conjoin(edges[c.m], edges[c.n])
    epilogue = (Guard(guard, rest),) if guard is not None and rest else rest
    ctx.log(f"tile_matmul: {k.name}: M={c.m}, N={c.n}, {mt.tile_m}x{mt.tile_n} tiles of "
            f"{mt.thread_m}x{mt.thread_n} points per thread", 2)
    out = replace(k, mode="matmul", matmul=mt, body=(Points(loops + epilogue),),
                  block=mt.threads_m * mt.threads_n)
    for name, value in (("TILE_M", mt.tile_m), ("TILE_N", mt.tile_n),
                        ("THREAD_M", mt.thread_m), ("THREAD_N", mt.thread_n)):
        out = out.with_knob(name, value)
    return out.with_knob("INSTR", "fma") if ctx.pinned("INSTR") else out     # a pin shows what ran
