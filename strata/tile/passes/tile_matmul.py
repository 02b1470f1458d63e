"""tile_matmul: schedule a contraction as a 2-D block tile instead of one row per thread.

A block computes a TILE_M x TILE_N tile of the output and each of its threads owns THREAD_M x
THREAD_N points of it, spaced by the thread grid so that neighbouring threads touch neighbouring
columns. For now each point still runs its whole row in turn (register_tile interleaves them).
Points past the edge of M or N read nothing (their loads are predicated) and store nothing (the
epilogue is guarded), so M and N need not be multiples of the tile. The row statements after the
reduce loops (the epilogue: bias, activation, residual, cast) and those the loops do not read run
per point after the loops. Declines, saying why, when the row is not a contraction (see
tile/contraction.py).
"""
from __future__ import annotations

from dataclasses import replace

from ...context import Context
from ...errors import KnobError
from ...expr import Const, Var, call
from ...loop.ir import Load, Loop
from ..contraction import depends, match
from ..ir import Guard, MatmulTile, Points, TileKernel, map_body

THREADS = 256                     # threads per block the default tiles aim for


def pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def default_tiles(m: int, n: int) -> tuple[int, int, int, int]:
    """(TILE_M, TILE_N, THREAD_M, THREAD_N): 64x64 tiles of 4x4 points per thread; a short M
    (decode) or N gets a narrow tile and a long other side; about THREADS threads per block."""
    tile_m = min(pow2_ceil(m), 64)
    tile_n = min(pow2_ceil(n), 64 if tile_m == 64 else 128)
    if tile_n < 64:
        tile_m = min(pow2_ceil(m), 128)
    per_thread = max(1, tile_m * tile_n // THREADS)
    thread_n = min(4, tile_n, per_thread)
    thread_m = min(4, tile_m, per_thread // thread_n)
    return tile_m, tile_n, thread_m, thread_n


def choose_tiles(k: TileKernel, m: str | None, n: str, ctx: Context) -> MatmulTile:
    """The tile of axes m x n of k, with the TILE_M/N and THREAD_M/N knobs applied (no M: 1)."""
    tm, tn, pm, pn = default_tiles(k.extent(m), k.extent(n))
    tile_n, thread_n = ctx.knob("TILE_N", tn), ctx.knob("THREAD_N", pn)
    tile_m, thread_m = (ctx.knob("TILE_M", tm), ctx.knob("THREAD_M", pm)) if m else (1, 1)
    for tile, thread, side in ((tile_m, thread_m, "M"), (tile_n, thread_n, "N")):
        if tile % thread:
            raise KnobError(f"TILE_{side}={tile}, THREAD_{side}={thread}: the thread tile must "
                            f"divide the block tile")
    threads = tile_m // thread_m * (tile_n // thread_n)
    if threads > 1024:
        raise KnobError(f"a {tile_m}x{tile_n} tile of {thread_m}x{thread_n} points per thread "
                        f"needs {threads} threads (more than 1024)")
    return MatmulTile(m, n, tile_m, tile_n, thread_m, thread_n)


def edge(var: str | None, extent: int, tile: int):
    """`var < extent` when the last tile along var overhangs the matrix, else None."""
    if var is None or extent % tile == 0:
        return None
    return call("lt", Var(var), Const(extent))


def conjoin(a, b):
    """a && b, where None means true."""
    if a is None or b is None:
        return a if b is None else b
    return call("logical_and", a, b)


def tile_matmul(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "rows":
        return k
    c = match(k)
    if isinstance(c, str):
        ctx.log(f"tile_matmul: {k.name}: declined, {c}")
        return k
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
