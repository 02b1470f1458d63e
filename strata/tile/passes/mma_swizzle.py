"""mma_swizzle: lay the shared operand tiles of a tensor-core kernel out without bank conflicts.

ldmatrix reads 8 rows of 16 bytes at once; with rows a multiple of 128 bytes apart they all hit
the same 4 banks (8-way conflicts). SWIZZLE=xor (the default) stores 16-byte chunk c of row r at
chunk c ^ f(r), f spreading any 8 consecutive rows over the 8 bank groups at no cost in memory;
SWIZZLE=pad pads each row by 16 bytes instead; none keeps the plain layout. Both keep every
chunk 16-byte aligned for cp.async and ldmatrix. xor needs a power-of-two number of chunks per
row (at least 2); otherwise the pass says so and pads.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...core.errors import KnobError
from ..ir import MmaLoop, TileKernel
from ..tensor_core import tile_rows_cols


def _xor_ok(cols: int) -> bool:
    chunks = cols // 8
    return chunks >= 2 and chunks & (chunks - 1) == 0


def mma_swizzle(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "mma":
        return k
    mt = k.matmul
    ops = [op for s in k.body if isinstance(s, MmaLoop) for op in (s.a, s.b)]
    widths = sorted({tile_rows_cols(op, mt)[1] for op in ops})
    fits = all(_xor_ok(w) for w in widths)
    swizzle = ctx.knob("SWIZZLE", "xor" if fits else "pad")
    if swizzle == "xor" and not fits:
        raise KnobError(f"SWIZZLE=xor: shared rows of {widths} elements are not a power of two "
                        f"of at least 2 16-byte chunks")
    if not fits:
        ctx.log(f"mma_swizzle: {k.name}: declined xor, rows of {widths} elements; padding instead")
    ctx.log(f"mma_swizzle: {k.name}: SWIZZLE={swizzle} for shared rows of {widths} elements", 2)
    return replace(k, matmul=replace(mt, swizzle=swizzle)).with_knob("SWIZZLE", swizzle)
