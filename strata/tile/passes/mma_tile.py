"""mma_tile: schedule an fp16/bf16 contraction on tensor cores (mma.sync m16n8k16, sm_80+).

The row kernel becomes a block tile of TILE_M x TILE_N (mode "mma"): WARPS_M x WARPS_N warps,
each owning a piece of 16x8 accumulator tiles, and per reduce loop one `MmaLoop` whose operands
are staged TILE_K at a time in shared memory (filled with plain loads for now: later passes pick
cp.async, the layout and the pipeline depth). The row statements after the loops (bias,
activation, residual, SiLU(gate) * up ...) run per accumulator element, guarded at the M and N
edges. INSTR=mma|fma pins the choice. Declines, saying why, for other dtypes (fp32 keeps the
CUDA-core path; TF32 is not offered), a target below sm_80, accumulators that are not f32, a
prologue computed in f32 whose rounding to 16 bits eager would not do (an f32 output), or one
row of activations times byte weights (Q8_0, Q4_0: tile/gemv.py reads them by 16-byte loads,
where mma would stage them a byte at a time).
"""
from __future__ import annotations

from dataclasses import replace

from math import prod

from ...core.context import Context
from ...core.errors import KnobError
from ..contraction import match, pow2_ceil
from ..gemv import byte_vec
from ..ir import MmaTile, TileKernel
from ..tensor_core import edge_guarded, mma_loops


def default_tiles(m: int, n: int, loops: int) -> tuple[int, int, int, int]:
    """(TILE_M, TILE_N, WARPS_M, WARPS_N): 128x128 tiles of 2x4 warps (64x32 each) for big
    matrices, narrower for short sides (decode: 16 rows) and for rows with several reductions
    (each holds its own accumulators)."""
    tile_m = min(max(pow2_ceil(m), 16), 128)
    tile_n = min(max(pow2_ceil(n), 16), 128 if loops == 1 else 64)
    warps_m = max(1, min(2, tile_m // 64))
    warps_n = max(1, min(4, tile_n // 32))
    return tile_m, tile_n, warps_m, warps_n


def fill_the_gpu(tm: int, tn: int, m: int, n: int, others: int, sms: int) -> tuple[int, int]:
    """Halve the larger side of the tile, down to 64 x 64, while the grid (others = batch and
    split-K blocks) is under one block per SM: an M = 128 projection gets 64x64 tiles rather
    than a few 128x128 ones that leave most of the GPU idle."""
    def blocks(a, b):
        return others * -(-m // a) * -(-n // b)
    while blocks(tm, tn) < sms and max(tm, tn) > 64:
        if tn >= tm:
            tn //= 2
        else:
            tm //= 2
    return tm, tn


def choose_mma_tile(k: TileKernel, m: str | None, n: str, loops: int, dtype: str,
                    ctx: Context) -> MmaTile:
    tm, tn, wm, wn = default_tiles(k.extent(m), k.extent(n), loops)
    others = prod(e for v, e in k.domain if v not in (m, n))
    tm, tn = fill_the_gpu(tm, tn, k.extent(m), k.extent(n), others, ctx.arch.cores)
    wm, wn = max(1, min(wm, tm // 16)), max(1, min(wn, tn // 8))
    tile_m, tile_n = ctx.knob("TILE_M", tm), ctx.knob("TILE_N", tn)
    warps_m, warps_n, tile_k = ctx.knob("WARPS_M", wm), ctx.knob("WARPS_N", wn), ctx.knob("TILE_K", 32)
    if tile_m % (16 * warps_m) or tile_n % (8 * warps_n):
        raise KnobError(f"TILE_M={tile_m}, TILE_N={tile_n}, WARPS_M={warps_m}, WARPS_N={warps_n}: "
                        f"each warp's tile must be a multiple of 16 x 8 (the mma shape)")
    if tile_k < 16 or tile_k % 16:
        raise KnobError(f"TILE_K={tile_k}: must be a multiple of 16 (the mma K) for INSTR=mma")
    if warps_m * warps_n > 32:
        raise KnobError(f"WARPS_M={warps_m} x WARPS_N={warps_n}: more than 32 warps in a block")
    return MmaTile(m, n, tile_m, tile_n, tile_k, warps_m, warps_n, dtype)


def mma_tile(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "rows":
        return k
    c = match(k)
    if isinstance(c, str):
        return k                        # tile_matmul says why it is not a contraction
    pinned = ctx.knob("INSTR", "")
    if pinned == "fma":
        ctx.log(f"mma_tile: {k.name}: declined, INSTR=fma pinned")
        return k
    if not ctx.arch.has("mma.sync"):
        ctx.log(f"mma_tile: {k.name}: declined, target {ctx.arch} has no mma.sync (needs sm_80+)")
        return k
    if pinned != "mma" and len(c.loops) == 1 and byte_vec(k, c, c.loops[0]):
        ctx.log(f"mma_tile: {k.name}: declined, one row times byte weights: 16-byte loads on "
                f"the CUDA cores (tile/gemv.py)")
        return k
    got = mma_loops(k, c)
    if isinstance(got, str):
        ctx.log(f"mma_tile: {k.name}: declined, {got}")
        return k
    loops, dtype = got
    mt = choose_mma_tile(k, c.m, c.n, len(loops), dtype, ctx)
    epilogue = edge_guarded(k, c, mt.tile_m, mt.tile_n)
    ctx.log(f"mma_tile: {k.name}: M={c.m}, N={c.n}, {mt.tile_m}x{mt.tile_n} tiles of "
            f"{mt.warps_m}x{mt.warps_n} warps, mma.m16n8k16.{dtype}", 2)
    out = replace(k, mode="mma", matmul=mt, body=tuple(loops) + epilogue,
                  block=32 * mt.warps_m * mt.warps_n)
    for name, value in (("INSTR", "mma"), ("TILE_M", mt.tile_m), ("TILE_N", mt.tile_n),
                        ("TILE_K", mt.tile_k), ("WARPS_M", mt.warps_m), ("WARPS_N", mt.warps_n)):
        out = out.with_knob(name, value)
    return out


