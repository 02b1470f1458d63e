"""How many pieces to cut a reduction into so that its blocks fill the device (two waves over the
target's SMs, `Target.fill_blocks`). chunk_reduce (long row reductions) and split_matmul_k
(decode-shaped matmuls) share this rule."""
from __future__ import annotations

from ..core.context import Context
from ..core.errors import KnobError


def choose_pieces(extent: int, blocks: int, ctx: Context, knob: str, min_piece: int,
                  unit: str, grain: int = 1) -> tuple[int, str]:
    """(pieces, why not): a divisor of `extent` giving pieces of at least `min_piece` (and a
    multiple of `grain` long: slices that start 16-byte aligned keep their vector loads), the one
    closest to fill_blocks // blocks, or 1 and the reason splitting does not pay. `blocks`
    counts the `unit`s (rows, tiles) that already run in parallel; a pinned `knob` wins."""
    pinned = ctx.knob(knob, 0)
    if pinned:
        if extent % pinned:
            raise KnobError(f"{knob}={pinned}: must divide the reduction extent {extent}")
        return pinned, "" if pinned > 1 else f"{knob}=1 pinned"
    fill = ctx.arch.fill_blocks
    if blocks * 2 >= fill:
        return 1, f"{blocks} {unit} already fill the {'GPU' if ctx.arch.is_gpu else 'cores'}"
    if extent < 2 * min_piece:
        return 1, f"a reduction of {extent} is too short to share (fits one block)"
    want = max(2, fill // blocks)
    divisors = [d for d in range(2, extent // min_piece + 1)
                if extent % d == 0 and extent // d % grain == 0]
    if not divisors:
        return 1, (f"{extent} has no divisor giving pieces of at least {min_piece}"
                   + (f" in multiples of {grain}" if grain > 1 else ""))
    return min(divisors, key=lambda d: (abs(d - want), d)), ""
