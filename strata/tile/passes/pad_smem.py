"""pad_smem: pad the row stride of staged matmul tiles so that their fill hits distinct banks.

Shared memory has 32 banks of 4 bytes; the 32 threads of a warp that touch different words of
one bank wait for each other. A tile filled along K (its rows) writes addresses k * stride + x
from neighbouring threads, which share a bank whenever the stride is a multiple of 32 words.
The pass counts, for the first warp of the fill, the most distinct words any bank receives, and
picks the smallest padding that minimises it (the K-inner loop reads one row per step, so its
conflicts do not depend on the stride). PAD_A / PAD_B pin the padding, in elements, of the M-side
and N-side tiles. Declines, saying why, where no padding helps.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ...core import dtypes
from ...core.context import Context
from ..ir import StageTile, TileKernel, map_body, walk

MAX_PAD = 8


def conflicts(st: StageTile, stride: int, block: int) -> int:
    """The most distinct 4-byte words one bank receives from the first warp's fill stores."""
    words = set()
    for f in range(min(32, block, st.k_extent * st.x_extent)):
        k, x = (f % st.k_extent, f // st.k_extent) if st.fast == "k" else divmod(f, st.x_extent)
        words.add((k * stride + x) * dtypes.ITEMSIZE[st.dtype] // 4)
    return max(Counter(w % 32 for w in words).values())


def _worst(tiles, pad: int, block: int) -> int:
    return max(conflicts(t, t.x_extent + pad, block) for t in tiles)


def pad_smem(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "matmul":
        return k
    tiles = [s for s in walk(k.body) if isinstance(s, StageTile)]
    if not tiles:
        return k
    pads = {}
    for knob, origin in (("PAD_A", "m0"), ("PAD_B", "n0")):
        side = [t for t in tiles if t.origin == origin]
        names = ", ".join(t.name for t in side)
        best = min(range(MAX_PAD + 1), key=lambda p: (_worst(side, p, k.block), p))
        pad = pads[origin] = ctx.knob(knob, best)
        before, after = _worst(side, 0, k.block), _worst(side, pad, k.block)
        if pad == 0:
            why = "its fill has no bank conflicts" if before == 1 else \
                f"{knob}=0 is pinned" if best else f"no padding beats {before}-way bank conflicts"
            ctx.log(f"pad_smem: {k.name}: declined {names}, {why}")
        else:
            ctx.log(f"pad_smem: {k.name}: {names}: stride {side[0].x_extent} + {pad}: "
                    f"{before}-way -> {after}-way bank conflicts in the fill", 2)
        k = k.with_knob(knob, pad)

    def fn(s):
        return replace(s, stride=s.x_extent + pads[s.origin]) if isinstance(s, StageTile) else s
    return replace(k, body=map_body(k.body, fn))
