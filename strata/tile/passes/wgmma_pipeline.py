"""wgmma_pipeline: how many shared stages a wgmma kernel's TMA pipeline keeps in flight.

Each K step's A and B tiles land in one of STAGES buffers, each with its own mbarrier; the
block waits on a tile's barrier, issues its wgmmas, and once they are done (wgmma.wait_group 0:
kernel_ir/lower_wgmma.py says why not 1) refills that buffer with the tile STAGES steps ahead. The buffers
live in dynamic shared memory: the default is the deepest of 4 that fits in what the target lets
a block opt into, less room for alignment and the mbarriers (and no deeper than the K loop is
long). Raises when one stage does not fit.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...core import dtypes
from ...core.errors import KnobError
from ...core.targets import DYNAMIC_SMEM_ALIGN
from ..ir import MmaLoop, TileKernel



def smem_limit(ctx: Context) -> int:
    return ctx.arch.smem_optin - 2 * DYNAMIC_SMEM_ALIGN    # room for alignment, mbarriers


def stage_bytes(k: TileKernel) -> int:
    mt = k.matmul
    return (mt.tile_m + mt.tile_n) * mt.tile_k * dtypes.ITEMSIZE[mt.dtype]


def wgmma_pipeline(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "wgmma":
        return k
    mt, per, limit = k.matmul, stage_bytes(k), smem_limit(ctx)
    fit = limit // per
    if fit < 1:
        raise KnobError(f"{k.name}: one stage of its {mt.tile_m}x{mt.tile_n}x{mt.tile_k} tiles needs "
                        f"{per} bytes of shared memory (more than {limit})")
    steps = max(-(-s.extent // mt.tile_k) for s in k.body if isinstance(s, MmaLoop))
    stages = ctx.knob("STAGES", max(1, min(4, fit, steps)))
    if not 1 <= stages <= fit:
        raise KnobError(f"STAGES={stages}: between 1 and {fit} stages of {per} bytes fit in "
                        f"{limit} bytes of shared memory")
    ctx.log(f"wgmma_pipeline: {k.name}: {stages} stage(s) of {per} bytes", 2)
    body = tuple(replace(s, stages=stages) if isinstance(s, MmaLoop) else s for s in k.body)
    return replace(k, body=body).with_knob("STAGES", stages)
