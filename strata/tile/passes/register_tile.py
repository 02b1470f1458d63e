"""register_tile: keep each thread's THREAD_M x THREAD_N accumulators in registers across K.

After tile_matmul a thread runs its points one after another and reads every operand element
once per point. Here the points move inside the reduce loops: each K step loads the THREAD_M
values of the M-side operand and the THREAD_N values of the N-side operand once and does
THREAD_M x THREAD_N multiply-adds with them. The accumulators (`Registers`) live across the
loops, and the epilogue runs for every point after them. Declines on a kernel that is not a
contraction whose points still run in turn.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...loop.ir import Loop
from ..ir import Points, Registers, TileKernel


def register_tile(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "matmul":
        return k
    if len(k.body) != 1 or not isinstance(k.body[0], Points) or k.body[0].registers:
        ctx.log(f"register_tile: {k.name}: declined, the points are not one region run in turn")
        return k
    body, epilogue = [], []
    for s in k.body[0].body:
        if isinstance(s, Loop):
            body += [Registers(s.accs), replace(s, accs=(), body=(Points(s.body, registers=True),))]
        else:
            epilogue.append(s)
    return replace(k, body=tuple(body) + (Points(tuple(epilogue), registers=True),))
