"""wgmma_tile: on sm_90a, schedule an fp16/bf16 or FP8 contraction on Hopper tensor cores (mode
"wgmma").

A block of WARPGROUPS warpgroups computes a TILE_M x TILE_N output tile (TILE_M = 64 x
WARPGROUPS: each warpgroup one m64nNk16 row of TILE_N columns, accumulators in registers).
Per reduce loop both operands come into shared memory by TMA (cp.async.bulk.tensor), TILE_K of
K at a time laid out with the swizzle of a TILE_K-element row wgmma reads (TILE_K = 64 16-bit or
128 FP8 elements: 128B), the edges zero-filled by TMA. FP8 operands (torch._scaled_mm's e4m3 or
e5m2, loaded as stored) run wgmma's k32 form, K-major only. The epilogue (bias, activation,
residual, cast, SiLU(gate) * up) runs
per accumulator element, guarded at the M and N edges, as in mode "mma".

Declines, saying why (mma_tile then takes the kernel), for a target other than sm_90a, INSTR=mma
or fma pinned, a vector M side, and operands TMA cannot fetch as they are: a computed prologue,
a predicated or non-affine load, an operand contiguous along neither K nor its M / N axis,
strides that are not multiples of 16 bytes, or a buffer read by the kernel in another way too.
INSTR=wgmma pinned turns a decline into an error.

An operand contiguous along K (F.linear's weight) is read K-major; one contiguous along its M or
N axis (`x @ w` with w stored (K, N)) MN-major: TMA boxes of 64 M- or N-contiguous elements
(128 bytes, 128B swizzle) by TILE_K rows of K, and wgmma's transpose bit (lower_wgmma.py). TILE_N
is then a multiple of 64 (TILE_M always is).
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from ...core import dtypes
from ...core.context import Context
from ...core.errors import KnobError
from ...loop.ir import Load, Loop
from ..contraction import match
from ..ir import MmaLoop, MmaTile, TileKernel, walk
from ..tensor_core import SWIZZLE_OF_ROW, edge_guarded, mma_loops, mn_major, tma_dims

DECODE_ROWS = 16         # M of a decode step's GEMV (a batch of up to 16 sequences)


def _other_loads(k: TileKernel, loops: list[MmaLoop]) -> set[str]:
    """Buffers the kernel loads outside the operands of its K loops."""
    rest = [s for s in k.body if not isinstance(s, Loop)]
    return {s.buf for s in walk(tuple(k.prelude) + tuple(rest)) if isinstance(s, Load)}


def why_not_tma(k: TileKernel, loops: list[MmaLoop], tile_of) -> str:
    """Why the K loops' operands cannot all be fetched by TMA ("" when they can)."""
    maps: dict[str, tuple] = {}
    others = _other_loads(k, loops) | set(k.writes)
    for lp in loops:
        for op in (lp.a, lp.b):
            dims = tma_dims(k, op, lp.k_var, lp.extent)
            if isinstance(dims, str):
                return f"operand {op.side} of {lp.acc.acc}: {dims}"
            buf = op.body[0].buf
            if buf in others:
                return f"operand {op.side} of {lp.acc.acc}: {buf} is also read or written directly"
            key = (tuple((e, c) for _, e, c in dims), tile_of(op))
            if maps.setdefault(buf, key) != key:
                return f"{buf} is fetched with two different tensor maps"
    return ""


def choose_tiles(k: TileKernel, m: str, n: str, loops: int, ctx: Context,
                 n_major: bool = False, dtype: str = "bf16") -> tuple[int, int, int]:
    """(TILE_M, TILE_N, TILE_K) from the knobs: 64 rows per warpgroup (two for tall matrices),
    N rounded up to 8 and at most 128 (64 for rows with several reductions, or for a decode GEMV
    of at most DECODE_ROWS rows that 128 leaves under one block per SM), K 128 bytes of `dtype`
    (the 128B swizzle: 64 16-bit elements, 128 FP8 ones).
    With an N-major B (n_major), N is rounded up to 64: such a B tile is TILE_N / 64 boxes of
    64 N-contiguous elements (one 128B-swizzle row) per K."""
    wg_default = 2 if k.extent(m) > 64 else 1
    warpgroups = ctx.knob("WARPGROUPS", ctx.knob("TILE_M", 64 * wg_default) // 64)
    tile_m = ctx.knob("TILE_M", 64 * warpgroups)
    step = 64 if n_major else 8
    tile_n = min(-(-k.extent(n) // step) * step, 128 if loops == 1 else 64)
    blocks = prod(e for v, e in k.domain if v not in (m, n)) * -(-k.extent(n) // tile_n)
    if tile_n > 64 and k.extent(m) <= DECODE_ROWS and blocks < ctx.arch.cores:
        tile_n = 64
    tile_n = ctx.knob("TILE_N", tile_n)
    item = dtypes.ITEMSIZE[dtype]
    tile_k = ctx.knob("TILE_K", 128 // item)
    if tile_m != 64 * warpgroups or not 1 <= warpgroups <= 4:
        raise KnobError(f"TILE_M={tile_m}, WARPGROUPS={warpgroups}: INSTR=wgmma takes 64 rows per "
                        f"warpgroup, 1 to 4 warpgroups")
    if tile_n % 8 or not 8 <= tile_n <= 256:
        raise KnobError(f"TILE_N={tile_n}: wgmma's N is a multiple of 8 in 8..256")
    if tile_k * item not in SWIZZLE_OF_ROW:
        takes = ", ".join(str(b // item) for b in SWIZZLE_OF_ROW)
        raise KnobError(f"TILE_K={tile_k}: INSTR=wgmma takes {takes} {dtype} elements (rows of a "
                        f"32B, 64B or 128B swizzle)")
    return tile_m, tile_n, tile_k


def wgmma_tile(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "rows":
        return k
    c = match(k)
    if isinstance(c, str):
        return k                        # tile_matmul says why it is not a contraction
    pinned = ctx.knob("INSTR", "")

    def decline(why: str) -> TileKernel:
        if pinned == "wgmma":
            raise KnobError(f"INSTR=wgmma: {k.name}: {why}")
        ctx.log(f"wgmma_tile: {k.name}: declined, {why}")
        return k
    if pinned in ("mma", "fma"):
        return decline(f"INSTR={pinned} pinned")
    if not ctx.arch.has("wgmma"):
        return decline(f"target {ctx.arch} has no wgmma (needs sm_90a)"
                       if ctx.arch.has("mma.sync") else f"target {ctx.arch} has no wgmma")
    if c.m is None:
        return decline("its M side is a vector (one row)")
    got = mma_loops(k, c, fp8=True)
    if isinstance(got, str):
        return decline(got)
    loops, dtype = got
    n_major = any(mn_major(k, lp, lp.b) for lp in loops)
    if dtype in dtypes.FLOAT8 and any(mn_major(k, lp, op) for lp in loops for op in (lp.a, lp.b)):
        return decline("an FP8 operand is contiguous along M or N (wgmma reads FP8 K-major only)")
    tile_m, tile_n, tile_k = choose_tiles(k, c.m, c.n, len(loops), ctx, n_major, dtype)
    if n_major and tile_n % 64:
        return decline(f"TILE_N={tile_n}: an N-major B (contiguous along {c.n}) takes a multiple "
                       f"of 64")
    why = why_not_tma(k, loops, lambda op: tile_m if op.side == "A" else tile_n)
    if why:
        return decline(why)
    loops = [replace(lp, a=replace(lp.a, fill="tma"), b=replace(lp.b, fill="tma")) for lp in loops]
    mt = MmaTile(c.m, c.n, tile_m, tile_n, tile_k, tile_m // 16, 1, dtype,
                 SWIZZLE_OF_ROW[tile_k * dtypes.ITEMSIZE[dtype]])
    epilogue = edge_guarded(k, c, tile_m, tile_n)
    ctx.log(f"wgmma_tile: {k.name}: M={c.m}, N={c.n}, {tile_m}x{tile_n}x{tile_k} tiles of "
            f"{tile_m // 64} warpgroup(s), wgmma.m64n{tile_n}k{32 // dtypes.ITEMSIZE[dtype]}.{dtype} "
            f"fed by TMA", 2)
    out = replace(k, mode="wgmma", matmul=mt, body=tuple(loops) + epilogue, block=2 * tile_m)
    for name, value in (("INSTR", "wgmma"), ("TILE_M", tile_m), ("TILE_N", tile_n),
                        ("TILE_K", tile_k), ("WARPGROUPS", tile_m // 64)):
        out = out.with_knob(name, value)
    return out
