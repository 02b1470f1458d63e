"""blockify_launch: choose the block size, i.e. how many rows or elements one block covers.

Rows shared by a whole block (GROUP >= 64) get a block of GROUP threads (cooperative_reduce
made a pinned BLOCK the GROUP, unless GROUP is pinned too); warp- or thread-sized rows are
packed BLOCK // GROUP to a block. Elementwise kernels use BLOCK threads, fewer when
the whole domain is smaller than a block.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ..ir import TileKernel


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def blockify_launch(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode in ("matmul", "mma", "wgmma", "attention"):   # their tiling pass sized the block
        return k
    if k.mode == "rows" and "BLOCK" in dict(k.knobs):      # so did tile/gemv.py's
        return k
    # BLOCK is a multiple of 32 (strata/core/knobs.py) and GROUP below 64 is 1 or 32: any pin fits
    warp = ctx.arch.warp_size
    if k.mode == "rows" and k.group >= 64:
        block = k.group
        if ctx.knob("BLOCK", block) != block:
            ctx.log(f"blockify_launch: {k.name}: BLOCK={ctx.knob('BLOCK', block)} does not apply: "
                    f"GROUP={k.group} threads share each row, and such a row takes the whole block")
    elif k.mode == "rows":
        block = ctx.knob("BLOCK", min(256, max(warp, _round_up(k.rows * k.group, warp))))
    else:
        block = ctx.knob("BLOCK", min(256, max(warp, _round_up(k.rows, warp))))
    return replace(k, block=block).with_knob("BLOCK", block)
