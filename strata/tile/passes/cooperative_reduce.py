"""cooperative_reduce: let a group of threads share each row's loops and merge their partials.

Every loop of a row becomes a StridedLoop dealt to GROUP threads; after a reduction a Combine
merges the group's partial accumulators (warp shuffles, then shared memory). Declines for short
rows (one thread per row) and for rows read across a non-contiguous axis when there are enough
rows to keep the GPU busy, since neighbouring threads then read neighbouring addresses. A row
shared by more than a warp takes a whole block, so there a pinned BLOCK sets GROUP (unless GROUP
is pinned too).
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...core.expr import coefficient, free_vars
from ...loop.ir import Load, Loop
from ..ir import Combine, StridedLoop, TileKernel, flat_index, walk


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _contiguous(k: TileKernel, loop: Loop) -> bool:
    """Do the loop's global loads walk memory with unit stride in its variable?"""
    for s in walk(loop.body):
        if isinstance(s, Load) and loop.var in set().union(*map(free_vars, s.index)):
            if coefficient(flat_index(s.index, k.shape_of(s.buf)), loop.var) != 1:
                return False
    return True


def default_group(k: TileKernel, warp: int) -> tuple[int, str]:
    loops = [s for s in k.body if isinstance(s, Loop)]
    work = max(l.extent for l in loops)
    if work <= 16:
        return 1, f"rows of {work} are too short to share"
    if k.rows >= 2048 and not all(_contiguous(k, l) for l in loops):
        return 1, "rows are strided in memory and there are enough of them: one thread per row"
    if work <= 256:
        return warp, ""
    return min(1024, max(64, _pow2_floor(work // 8))), ""


def cooperative_reduce(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "rows" or k.group != 1 or not any(isinstance(s, Loop) for s in k.body):
        return k                              # a byte GEMV's rows (tile/gemv.py) are dealt already
    group, why = default_group(k, ctx.arch.warp_size)
    if group >= 64 and ctx.pinned("BLOCK"):     # such a row takes the whole block: a pinned
        group = ctx.knob("BLOCK", group)        # block size is its group unless GROUP is pinned
    group = ctx.knob("GROUP", group)
    k = replace(k, group=group).with_knob("GROUP", group)
    if group == 1:
        ctx.log(f"cooperative_reduce: {k.name}: declined, {why or 'GROUP=1 pinned'}")
        return k
    body = []
    for s in k.body:
        if isinstance(s, Loop):
            body.append(StridedLoop(s.var, s.extent, group, s.kind, s.body, s.accs))
            if s.accs:
                body.append(Combine(s.accs, group))
        else:
            body.append(s)
    return replace(k, body=tuple(body))
