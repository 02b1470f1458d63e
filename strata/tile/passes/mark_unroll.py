"""mark_unroll: annotate loops with a small, fixed trip count for `#pragma unroll`.

A serial loop of at most UNROLL_MAX iterations, or a strided loop whose every thread runs the
same at-most-UNROLL_MAX iterations, is fully unrolled by the CUDA compiler. A loop that stages
matmul tiles is left rolled: unrolling it would only copy the fills.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...loop.ir import Loop
from ..ir import StageTile, StridedLoop, TileKernel, map_body, walk


def mark_unroll(k: TileKernel, ctx: Context) -> TileKernel:
    limit = ctx.knob("UNROLL_MAX", 8)

    def fn(s):
        stride = s.step * s.vec if isinstance(s, StridedLoop) else 1
        if isinstance(s, StridedLoop) and s.extent % stride == 0 and s.extent // stride <= limit:
            return replace(s, unroll=True)
        if isinstance(s, Loop) and s.extent <= limit and \
                not any(isinstance(x, StageTile) for x in walk(s.body)):
            return replace(s, unroll=True)
        return s
    k = k.with_knob("UNROLL_MAX", limit) if ctx.pinned("UNROLL_MAX") else k
    return replace(k, body=map_body(k.body, fn))
