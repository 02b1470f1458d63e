"""mma_pipeline: software-pipeline the K loop of a tensor-core kernel over STAGES shared buffers.

With STAGES = S the block first issues the fills of K steps 0 .. S-2 (prologue); each step of
the steady state then waits for its own tile (cp.async.wait_group S-2, a barrier), issues the
fill of step + S-1 into the buffer read one step earlier, and multiplies; the last S-1 steps
(epilogue) only wait and multiply. So S-1 tiles are in flight while one is consumed. The default
is the deepest of 3 or 2 whose buffers fit in SMEM_LIMIT bytes of static shared memory (rows
with several reductions reuse one set of buffers). Raises when even one stage does not fit.

A decode GEMV (at most 16 rows of M in one tile row) is bound by the bytes each SM keeps in
flight (Little's law: about 36 KB on an H200; 3 stages keep 8 KB a block and the H200 run read
those GEMVs at 18% of its bandwidth): it takes the deepest pipeline that fits, up to 8 stages.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...core.errors import KnobError
from ..ir import MmaLoop, TileKernel
from ..tensor_core import stage_elems


def stage_bytes(k: TileKernel) -> int:
    """Bytes of one stage: the largest A tile plus the largest B tile over the kernel's loops."""
    mt = k.matmul
    loops = [s for s in k.body if isinstance(s, MmaLoop)]
    return 2 * (max(stage_elems(s.a, mt) for s in loops) + max(stage_elems(s.b, mt) for s in loops))


def _default_stages(k: TileKernel) -> int:
    """3; a decode GEMV (at most 16 rows of M, one tile row) one per K step, up to 8."""
    if k.extent(k.matmul.m) > min(16, k.matmul.tile_m):
        return 3
    steps = (-(-s.extent // k.matmul.tile_k) for s in k.body if isinstance(s, MmaLoop))
    return max(3, min(8, *steps))


def mma_pipeline(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "mma":
        return k
    per, limit = stage_bytes(k), ctx.arch.smem_per_block       # static __shared__ per block
    fit = limit // per
    if fit < 1:
        raise KnobError(f"{k.name}: one stage of its {k.matmul.tile_m}x{k.matmul.tile_n}x"
                        f"{k.matmul.tile_k} tiles needs {per} bytes of shared memory (more than "
                        f"{limit}); choose smaller TILE_M/TILE_N/TILE_K")
    stages = ctx.knob("STAGES", max(1, min(_default_stages(k), fit)))
    if not 1 <= stages <= fit:
        raise KnobError(f"STAGES={stages}: between 1 and {fit} stages of {per} bytes fit in "
                        f"{limit} bytes of shared memory")
    if stages == 1:
        ctx.log(f"mma_pipeline: {k.name}: declined, one stage ({per} bytes) fits")
    body = tuple(replace(s, stages=stages) if isinstance(s, MmaLoop) else s for s in k.body)
    return replace(k, body=body).with_knob("STAGES", stages)
