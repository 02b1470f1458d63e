"""cpu_prologue: on a CPU, compute a contraction's M-side operand that has a prologue (RMSNorm's
normed x before q/k/v and gate/up, SiLU(gate) * up before down, a 16-bit widening) once, into a
float temp, before the contraction; the vector operand of a matrix-vector product likewise.

Why: cpu_matmul packs a computed M-side operand per register tile, and every block (one panel
of TILE_N columns) packs the same rows again: a 5632-wide projection recomputes RMSNorm 176
times per element, scalar code that then costs more than the FMAs (the TinyLlama MLP ran 3x
slower fused than with the normed x given). Stored once, the operand costs one write and one
read of M x K floats, small next to the weights, and the micro-kernel loads it plainly. A
decode step's matrix-vector products are rows of dot products, each computing the vector's
prologue again: RoPE on q once per cached key, softmax's exp once per value dimension.

PROLOGUE=fuse|materialize pins the choice. By default an operand is materialized when the
output has more than one block's panel of columns (N > TILE_N: 4 SIMD vectors in the outer form
where 32 registers hold its tile, else 2; 2 for a matrix-vector product; outer_vectors: the rule
read 2 for all, so causal attention's first 64 scores per row stored RoPE'd q first, which
`strata tune` found 1.58x slower than fused, Zen 5, 2026-11-30) unless a matrix product's N
fits two panels, which then takes one block that wide (contraction.one_block_n), or always in
the dot form (FORM=dot: every 8 columns would compute it again), there in bf16 when eager holds it in
bf16 (Accum.operands; vdpbf16ps reads both operands in bf16), and a plain bf16 load is not
widened at all (one not contiguous along K, attention's output before o_proj, is stored
contiguous); the pairs form reads it the same way, and the outer form an f32 one not affine in
K (rows of heads x head dim: TinyLlama's o_proj at 2048 tokens ran 1.7x slower than q_proj, Zen
3, 2026-12-03; a transposed one, a stride of M, is read as it is). A matrix-vector product's plain bf16
vector is not widened either where vdpbf16ps runs: its rows run on both operands as loaded
(`strata tune` measured the widening 1.2x to 1.75x slower on TinyLlama's decode projections).
Declines, saying why, on a prologue that reads a value the row computes before its loop.

A matrix product (M > 1) whose N-side operand is dequantized (a QuantLinear's weight: computed
from integer blocks, rounded to bf16 as eager holds it) has it stored once, in bf16, by a kernel
of its own (its blocks run as blocks there, cpu_block_loops); the product then reads a plain bf16
weight and takes the bf16 forms (AMX tiles where present) instead of packing the weight with a
division per element into an f32 panel (a q8_0 128 x 2048 by 5632 linear: 28.7 ms, bf16's 3.6).
A matrix-vector product (decode) keeps the dequantization fused: it reads each weight once.
Where the CPU multiplies bf16, an N-side operand rounded to bf16 from floats (under autocast a
training step's forward multiplies by its f32 weights cast to bf16) is stored the same way: the
product then takes the bf16 forms instead of an f32 panel (TinyLlama's gate and up at 128 tokens
under autocast: 19 ms each in the outer form, Zen 4, 2026-11-29).
"""
from __future__ import annotations

from ...core import dtypes
from ...core.context import Context
from ...loop.ir import Let, Load
from ..contraction import (CPU_VECTORS_N, affine, along, bf16_exact, closure, cpu_form, dequantized,
                           held, match, one_block_n, outer_vectors, plain_bf16, sides,
                           split_prologues, uses, value_dtype)
from ..ir import Mode, TileKernel


def _computed_n_sides(k: TileKernel, c, ctx: Context) -> list:
    """The N-side operands of a matrix product that are bf16 values computed from integer
    buffers (dequantized), or, where the CPU multiplies bf16 (AVX512-BF16, AMX), from float ones
    (autocast's cast of an f32 weight), as split_prologues takes them; [] for a matrix-vector
    product."""
    if c.m is None:
        return []
    out = []
    for loop in c.loops:
        a, b = sides(c, loop)
        side = closure(loop.body, b)
        if len(side) < 2 or held(loop) != "bf16" or value_dtype(side[-1]) != "bf16":
            continue
        if dequantized(k, side):
            out.append((loop, b, a, f"the N-side operand of {loop.accs[0].acc}, dequantized", "bf16"))
        elif ctx.arch.has("avx512_bf16") and ctx.knob("PROLOGUE", "") != "fuse":
            out.append((loop, b, a, f"the N-side operand of {loop.accs[0].acc}, rounded to bf16",
                        "bf16"))
    return out


def cpu_prologue(k: TileKernel, ctx: Context):
    if k.mode is not Mode.ROWS:
        return k
    c = match(k)
    if isinstance(c, str):
        return k                        # cpu_matmul says why it is not a contraction
    axes = {v for v, _ in k.domain}
    packed = _computed_n_sides(k, c, ctx)
    if packed:                          # stored first: the matrix product then reads plain bf16
        *firsts, k = split_prologues(k, c, packed, "bf16", axes, ctx, "cpu_prologue", "_w")
        rest = cpu_prologue(k, ctx)     # and its M-side operand as for any other product
        return (*firsts, *(rest if isinstance(rest, tuple) else (rest,)))
    form, computed, stored = cpu_form(k, c, ctx), [], None
    dot = form in ("dot", "pairs", "amx")   # all read the M-side operand in bf16, contiguous along K
    for loop in c.loops:
        a, b = sides(c, loop)
        n_side = closure(loop.body, b)
        gemv = c.m is None and ctx.arch.has("avx512_bf16") and plain_bf16(k, n_side, loop.var)
        if gemv and ctx.knob("PROLOGUE", "") != "materialize" and \
                plain_bf16(k, closure(loop.body, a), loop.var):
            continue                    # a bf16 GEMV row: vdpbf16ps on both as loaded
        side = closure(loop.body, a)
        dtype = dtypes.compute_dtype(value_dtype(side[-1]))
        fp8 = dot and held(loop) != "bf16" and bf16_exact(k, c, loop)     # FP8 values
        if len(side) == 1 and isinstance(side[0], Load) and (
                along(k, side[0], loop.var) and not (fp8 and k.dtype_of(side[0].buf) != "bf16")
                if dot else k.dtype_of(side[0].buf) == dtype and (c.m is None or affine(k, side[0], loop.var))):
            continue                    # a plain load: nothing to compute (or widen, dot form)
        if (dot or gemv) and held(loop) == "bf16" or fp8:
            stored = "bf16"             # eager holds it in bf16 too (RMSNorm's output), or its
                                        # values are FP8 (exact in bf16: torch._scaled_mm's)
        defined = {s.var for s in (*k.prelude, *side) if isinstance(s, (Load, Let))} | axes | {loop.var}
        outside = set().union(*map(uses, side)) - defined
        if outside:
            ctx.log(f"cpu_prologue: {k.name}: declined, the prologue of {loop.accs[0].acc} reads "
                    f"{sorted(outside)[0]}, computed before the row")
            return k
        side = "M-side" if c.m is not None else "vector"
        computed.append((loop, a, b, f"the {side} operand of {loop.accs[0].acc}", dtype))
    if not computed:
        return k
    pinned = ctx.knob("PROLOGUE", "")
    lanes = max(1, ctx.arch.vector_bytes // 4)
    panel = CPU_VECTORS_N * lanes if c.m is None else \
        ctx.knob("TILE_N", outer_vectors(sum(l.extent for l in c.loops), lanes, ctx) * lanes)
    wide = not dot and one_block_n(k, c, lanes, ctx)
    if pinned == "fuse" or (not pinned and not dot and (k.extent(c.n) <= panel or wide)):
        why = "PROLOGUE=fuse pinned" if pinned else \
            f"N={k.extent(c.n)} is one block's panel: each row is packed once anyway" if not wide \
            else f"N={k.extent(c.n)} fits one block of two panels: each row is packed once"
        ctx.log(f"cpu_prologue: {k.name}: declined, {why}")
        return k.with_knob("PROLOGUE", "fuse")
    dtype = stored or next((x[4] for x in computed if x[4]), "bf16")
    return split_prologues(k, c, [x[:4] + x[5:] for x in computed], dtype, axes, ctx,
                           "cpu_prologue")
