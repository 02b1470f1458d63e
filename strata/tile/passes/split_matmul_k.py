"""split_matmul_k: split the K loop of a contraction across blocks when its tiles are too few
to fill the GPU (decode shapes: M = 1..16 rows against a large weight, or tall-skinny K).

The kernel becomes two. `<name>_splitk` sums each of SPLIT_K consecutive slices of K into a temp
buffer of partials; it is still a contraction, with the slice as one more batch axis, and the
matmul passes tile it like any other. The original kernel then starts by adding the SPLIT_K
partials of its point instead of running the K loop, and applies the epilogue. SPLIT_K divides
K, so no slice has a tail. The tiles counted are those the contraction will get: the tensor-core
passes' (asked of wgmma_tile and mma_tile themselves, quietly) where one takes it, else the CUDA
cores'. A slice is at least K_MIN long, shorter for few rows (16 x M, down to GEMV_K_MIN): the
partials (4 bytes, SPLIT_K x M x N) then cost at most a quarter of the weights' bytes again;
and a multiple of 16 bytes where K allows, so each slice still takes cp.async, TMA or vectors.
A vector times byte weights (tile/gemv.py) counts blocks of 128 threads, a group of up to 32 per
row taking VEC points of K each, and cuts slices of whole VEC runs, GEMV_K_MIN at least.
Declines, saying why, when the tiles already fill the GPU, when K is too short to share (less
than the shortest slice) or has no such divisor, or when the row holds more than one reduction.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from ...core import dtypes
from ...core.context import Context
from ...core.expr import Var, add, mul
from ...loop.ir import Accum, BufferInfo, Load, Store
from ..contraction import choose_tiles, match, prelude_for
from ..gemv import group_of, row_vec
from ..ir import TileKernel, subst_body, walk
from ..split import choose_pieces
from .mma_tile import mma_tile
from .wgmma_tile import wgmma_tile

K_MIN = 256          # the shortest slice of K worth a block of its own
GEMV_K_MIN = 64      # ... for a contraction of 1 to 4 rows (decode): 2 steps of mma's TILE_K


def split_matmul_k(k: TileKernel, ctx: Context):
    c = match(k)
    if isinstance(c, str):
        return k                    # tile_matmul says why it is not a contraction
    if len(c.loops) != 1:
        ctx.log(f"split_matmul_k: {k.name}: declined, the row holds {len(c.loops)} reductions")
        return k
    (loop,) = c.loops
    vec = row_vec(k, c, loop, ctx)
    if vec:
        blocks = -(-k.rows * group_of(loop.extent // vec, k.rows) // 128)
        split, why = choose_pieces(loop.extent, blocks, ctx, "SPLIT_K", max(vec, GEMV_K_MIN),
                                   "blocks", vec)
    else:
        tile_m, tile_n = _tile(k, c, ctx)
        rows = k.extent(c.m)
        blocks = prod(e for v, e in k.domain if v not in (c.m, c.n)) \
            * -(-rows // tile_m) * -(-k.extent(c.n) // tile_n)
        k_min = max(GEMV_K_MIN, min(K_MIN, 16 * rows))
        split, why = choose_pieces(loop.extent, blocks, ctx, "SPLIT_K", k_min, "tiles",
                                   _grain(k, loop))
    if split == 1:
        if why:
            ctx.log(f"split_matmul_k: {k.name}: declined, {why}")
        return k.with_knob("SPLIT_K", 1) if ctx.pinned("SPLIT_K") else k
    size, (acc,) = loop.extent // split, loop.accs
    s, a = f"{loop.var}_s", loop.var
    row = tuple(Var(v) for v, _ in k.domain)
    partial = BufferInfo(f"{k.name}_partial", (split,) + tuple(e for _, e in k.domain), acc.dtype, "temp")

    # kernel 1: the slice index is one more (batch) axis; the loop covers one slice
    body = subst_body(loop.body, {a: add(mul(Var(s), size), Var(a))}, {a: size, s: split})
    reads = tuple(r for r in k.reads if _loads(prelude_for(k.prelude, (loop,)) + (loop,), r))
    sliced = (replace(loop, extent=size, body=body),
              Store(partial.name, (Var(s),) + row, Var(acc.acc, acc.dtype)))
    first = replace(k, name=f"{k.name}_splitk", domain=((s, split),) + k.domain,
                    prelude=prelude_for(k.prelude, sliced), body=sliced,
                    reads=reads, writes=(partial.name,),
                    buffers=tuple(b for b in k.buffers if b.name in reads) + (partial,))

    # kernel 2: the original row, adding the partials instead of running the K loop
    summed = replace(loop, extent=split, body=(
        Load(f"{acc.acc}_p", partial.name, (Var(a),) + row, acc.dtype),
        Accum(acc.acc, acc.op, Var(f"{acc.acc}_p", acc.dtype))))
    rest = tuple(summed if x is loop else x for x in c.body)
    keep = {r for r in k.reads if _loads(prelude_for(k.prelude, rest) + rest, r)}
    second = replace(k, prelude=prelude_for(k.prelude, rest), body=rest,
                     reads=(partial.name,) + tuple(r for r in k.reads if r in keep),
                     buffers=tuple(b for b in k.buffers if b.name in keep or b.name in k.writes)
                     + (partial,))
    ctx.log(f"split_matmul_k: {k.name}: K={loop.extent} split {split} ways over {blocks} tiles")
    return first.with_knob("SPLIT_K", split), second.with_knob("SPLIT_K", split)


def _tile(k: TileKernel, c, ctx: Context) -> tuple[int, int]:
    """(TILE_M, TILE_N) of the contraction's blocks, as the pass that will tile it chooses."""
    quiet = replace(ctx, verbosity=0, messages=[])
    for tile_pass in (wgmma_tile, mma_tile):
        got = tile_pass(k, quiet)
        if got.mode in ("wgmma", "mma"):
            return got.matmul.tile_m, got.matmul.tile_n
    mt = choose_tiles(k, c.m, c.n, ctx)
    return mt.tile_m, mt.tile_n


def _grain(k: TileKernel, loop) -> int:
    """Elements of K in 16 bytes of the narrowest operand, when K is a multiple of it (so
    each slice starts aligned for cp.async, TMA and vector loads), else 1."""
    sizes = [dtypes.ITEMSIZE[k.dtype_of(s.buf)] for s in walk(loop.body) if isinstance(s, Load)
             and any(b.name == s.buf for b in k.buffers)]
    grain = 16 // min(sizes) if sizes else 1
    return grain if loop.extent % grain == 0 else 1


def _loads(body, buf: str) -> bool:
    return any(isinstance(s, Load) and s.buf == buf for s in walk(body))
