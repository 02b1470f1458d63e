"""chunk_matmul_k: cut each reduce loop of a contraction into K-outer x K-inner steps of TILE_K.

The K-outer loop walks the K axis a tile at a time (stage_matmul_tiles fills shared memory once
per step); the K-inner loop, of a fixed TILE_K iterations, is unrolled. When TILE_K does not
divide K the last step is guarded (`if k < K`). Declines on a contraction whose reduce loops do
not hold register points (register_tile declined).
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...core.expr import Const, Var, add, call, mul
from ...loop.ir import Loop
from ..contraction import pow2_ceil
from ..ir import Guard, Points, TileKernel, subst_body

TILE_K = 16


def _chunk(loop: Loop, tile: int) -> Loop:
    outer, inner = Var(f"{loop.var}_o"), Var(f"{loop.var}_i")
    steps = -(-loop.extent // tile)
    k = add(mul(outer, tile), inner)
    body = subst_body(loop.body, {loop.var: k}, {outer.name: steps, inner.name: tile})
    if loop.extent % tile:
        body = (Guard(call("lt", k, Const(loop.extent)), body),)
    return Loop(outer.name, steps, "reduce", (Loop(inner.name, tile, "reduce", body, unroll=True),))


def chunk_matmul_k(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "matmul":
        return k
    loops = [s for s in k.body if isinstance(s, Loop)]
    if not all(len(l.body) == 1 and isinstance(l.body[0], Points) for l in loops):
        ctx.log(f"chunk_matmul_k: {k.name}: declined, a reduce loop does not hold register points")
        return k
    longest = max(l.extent for l in loops)
    tile = ctx.knob("TILE_K", min(TILE_K, pow2_ceil(longest)))
    body = tuple(_chunk(s, tile) if isinstance(s, Loop) else s for s in k.body)
    return replace(k, body=body).with_knob("TILE_K", tile)
