"""blockify_launch: choose the block size, i.e. how many rows or elements one block covers.

Rows shared by a whole block (GROUP >= 64) get a block of GROUP threads; warp- or thread-sized
rows are packed BLOCK // GROUP to a block. Elementwise kernels use BLOCK threads, fewer when
the whole domain is smaller than a block.
"""
from __future__ import annotations

from dataclasses import replace

from ...context import Context
from ..ir import TileKernel


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def blockify_launch(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode in ("matmul", "mma", "wgmma", "attention"):   # their tiling pass sized the block
        return k
    if k.mode == "rows" and k.group >= 64:
        block = k.group
    elif k.mode == "rows":
        block = ctx.knob("BLOCK", min(256, max(32, _round_up(k.rows * k.group, 32))))
        if block % k.group or block % 32:
            raise ValueError(f"BLOCK={block}: must be a multiple of 32 and of GROUP={k.group}")
    else:
        block = ctx.knob("BLOCK", min(256, max(32, _round_up(k.rows, 32))))
        if block % 32 or not 32 <= block <= 1024:
            raise ValueError(f"BLOCK={block}: must be a multiple of 32 between 32 and 1024")
    return replace(k, block=block).with_knob("BLOCK", block)
