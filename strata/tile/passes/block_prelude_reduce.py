"""block_prelude_reduce: a reduction in a kernel's prelude is summed by the whole block together.

Why: on a GPU the fusion planner lets a reduction to one value that a contraction's operand reads
(a decode step's RMSNorm sum of squares, ahead of its projection: loop/fuse.py `block_scalars`)
sit in that contraction's prelude instead of a one-block kernel of its own, which the projection
would wait for. Every block then needs the value; its threads take strided iterations of the
loop (a 2048-wide row: 16 loads each for 128 threads) and merge their partials by warp shuffles
and shared memory, so each thread holds the total before the contraction starts. Left serial
(each thread the whole loop) in a block of one thread or less than a warp. The elementwise kernel
that rounds a GEMV's operand once (materialize_prologue: FP8's activations by their largest
magnitude) takes its sum the same way.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...loop.ir import Loop
from ..ir import Combine, StridedLoop, TileKernel


def block_prelude_reduce(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode in ("attention", "custom") \
            or not any(isinstance(s, Loop) and s.kind == "reduce" for s in k.prelude):
        return k
    if k.block < ctx.arch.warp_size or k.block % ctx.arch.warp_size:
        ctx.log(f"block_prelude_reduce: {k.name}: declined, a block of {k.block} threads")
        return k
    prelude = []
    for s in k.prelude:
        if isinstance(s, Loop) and s.kind == "reduce":
            prelude += [StridedLoop(s.var, s.extent, k.block, "reduce", s.body, s.accs,
                                    block_wide=True),
                        Combine(s.accs, k.block, block_wide=True)]
            ctx.log(f"block_prelude_reduce: {k.name}: {', '.join(a.acc for a in s.accs)} over "
                    f"{s.extent} points summed by the block's {k.block} threads")
        else:
            prelude.append(s)
    return replace(k, prelude=tuple(prelude))
