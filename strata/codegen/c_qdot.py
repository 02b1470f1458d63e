"""A QuantRow (kernel_ir/cpu_ir.py: a quantized matrix-vector row) as AVX-512/AVX2 code.

Why: cpu_block_loops runs a QuantLinear's row as blocks of 32 with the block's scale hoisted, but
gcc still dequantizes each lane through its scalar chain (nibble masks, selects, a bf16 rounding)
and adds it to a partial sum in memory, so the row is bound by instructions, not by the bytes it
reads (docs/quant-cpu-2026-11-26.md). kernel_ir/lower_quant.py states the block loop as a QuantRow
(matched by what it computes, evaluated), and here a block becomes: 32 bytes (q8_0) or 16 (q4_0)
widened to int32 lanes (two zmm, or four ymm with AVX2), converted to float, multiplied by the 32
activations, and the sum scaled by the block's scale once: acc += d * (q[0:16] x[0:16] + q[16:32]
x[16:32]), two accumulators for alternate blocks. After the loop the accumulators are added into
the row's partial sums, which the kernel sums as written. The K-quants (quant/kquants.py) are
blocks too: q4_k's 32 nibbles have a scale and a minimum (w = a * q - b), looked up in a table of
the block's sixteen weights; q6_k's blocks are 16 weights in 12 bytes with one scale. A rounded weight
(QuantLinear's `.to(bf16)`) is not rounded here: the scale is applied to the block's sum instead,
which is nearer the float64 reference, not farther; the order of the sum differs from the scalar
loop's as `omp simd`'s does. The loop is printed as written under `#else`, for compilers targeting
neither (the `cpu` target's x86-64).

QDOT=vnni (cpu_block_loops' default where the CPU has AVX512-VNNI): as llama.cpp does, the kernel
first quantizes the row's activations to int8 blocks of 32 (d = max|x| / 127, q = round(x / d)),
and a row's blocks run 16 at a time on vpdpbusd: the weights' bytes as unsigned (nibbles 0..15, or
q8_0's bytes + 128) times the activations' int8, two blocks per instruction, each block's int32
sums scaled by its two scales in one FMA and the offset (8 or 128 times the activations' sum) taken
off per row. A 5632 x 2048 q4_0 row set, weights streamed from
DRAM, 2 threads, Emerald Rapids: 0.73 ms as float lanes, 0.39 with VNNI (the bytes alone stream in
0.32). On AVX2 without AVX-512 (Zen 3, Haswell) the same blocks run one at a time on vpmaddubsw +
vpmaddwd (q8_0 by llama.cpp's sign trick, whose products cannot saturate int16): the same row set
on the 2-core Zen 3, interleaved, 0.68 ms as float lanes, 0.37 ms so (then 1.13x more with q4_0's
nibbles unpacked by one vpsrlvq); a TinyLlama q4_0 decode 13.9 -> 27 tokens/s. The activations'
rounding is llama.cpp's error, not the float path's: QDOT=float keeps the float lanes. The row must
read whole, aligned blocks of the activations and contiguous bytes and f16 or bf16 scales
(lower_quant.py decides); the float path takes any other. q4_k and q6_k rows run so too (their
scale bytes and super-block scales, QuantRow.vnni): q4_k's 16 scales and minimums a step made from
the bytes, the minimums times the activations' block sums taken off; q6_k's 6-bit q (four blocks'
48 bytes unpacked to 64 by a vpermd, shifts and masks) less 32 times the activations' sums, a
scale per 16. The same 5632 x 2048 row set, 2 threads, Zen 4 (another process busy): q4_0 0.33
ms, q4_k 0.37 to 0.48, q6_k 0.47 to 0.52 (then a byte a weight); as float lanes 0.61, 1.1 to 1.3
and 1.2 to 1.4. A row's steps prefetch the bytes 8192 on (c_qdot.h's ST_QFETCH).
"""
from __future__ import annotations

from ..core.expr import Const, Expr, Op, Var, substitute
from ..kernel_ir.cpu_ir import BLOCK_BYTES, LANES, QuantRow
from .cfamily import REL, cname, prelude, strip_parens

QDOT_PRELUDE = prelude("c_qdot.h")


def emit_quant_blocks(em, loop: QuantRow, depth: int, as_written) -> None:
    """Print `loop` as vector code where the compiler targets AVX-512F or AVX2 with FMA (and with
    vnni first as int8 dot products where the compiler targets them), else `as_written()`."""
    qb = loop
    o, t = cname(loop.var), em.ctype(loop.var, loop.dtype)
    stop = em.expr(loop.stop, REL + 1)
    fn = f"st_{qb.fmt}_{'bf16' if em.bufs[qb.x or qb.dest] == 'bf16' else 'f32'}"
    ctype = "signed char" if BLOCK_BYTES[qb.fmt][0] == "i8" else "unsigned char"

    def at(e: Expr, step: int) -> str:
        if step:
            e = substitute(e, {loop.var: Op("add", (Var(loop.var, loop.dtype), Const(step, loop.dtype)),
                                            loop.dtype)})
        return strip_parens(em.expr(e))

    def value(e: Expr, step: int) -> str:        # fp16 loads by F16C, which these CPUs have
        plain, em.to_float = em.to_float, {**em.to_float, "f16": "st_f16_scale"}
        try:
            return at(e, step)
        finally:
            em.to_float = plain

    def scale(step: int) -> str:
        return value(qb.scale, step)

    def low(step: int) -> str:
        return "" if qb.low is None else f", {value(qb.low, step)}"

    def q(step: int) -> str:
        return f"(const {ctype}*)&{cname(qb.qs)}[{at(qb.qs_at, step)}]"
    if qb.x is None:                        # a weight dequantized and stored
        em.emit(f"#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    // {qb.fmt} "
                f"blocks stored as vector code (codegen/c_qdot.py)", 0)
        em.emit(f"for ({t} {o} = {strip_parens(em.expr(loop.start))}; {o} < {stop}; {o}++) {{", depth)
        em.emit(f"{fn.replace('_f32', '_to_f32').replace('_bf16', '_to_bf16')}"
                f"(&{cname(qb.dest)}[{at(qb.dest_at, 0)}], {q(0)}, {scale(0)}{low(0)});", depth + 1)
        em.emit("}", depth)
        em.emit("#else", 0)
        as_written()
        return em.emit("#endif", 0)

    def block(acc: str, step: int, d: int) -> None:
        em.emit(f"{acc} = {fn}({acc}, {q(step)}, &{cname(qb.x)}[{at(qb.x_at, step)}], "
                f"{scale(step)}{low(step)});", d)
    if qb.vnni:
        em.emit(f"#if ST_VNNI    // {qb.fmt} blocks by int8 dot products, activations in int8 "
                f"(codegen/c_qdot.py)", 0)
        em.emit(f"{{ {t} {o} = {strip_parens(em.expr(loop.start))};", depth)
        scales = qb.vnni
        where = ", ".join(f"&{cname(s.buf)}[{at(s.index, 0)}]" for s in scales)
        em.emit(f"st_qlanes(&{cname(qb.dest)}[{strip_parens(em.expr(qb.dest_at))}], "
                f"st_{qb.fmt}_vnni_{em.bufs[scales[0].buf]}({q(0)}, {where}, "
                f"&st_xq_{cname(qb.x)}, ({at(qb.x_at, 0)}) / {LANES}, {stop} - {o}), st_qzero()); }}",
                depth)
        em.emit(f"#elif defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    "
                f"// {qb.fmt} blocks as vector code", 0)
    else:
        em.emit(f"#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    "
                f"// {qb.fmt} blocks as vector code (codegen/c_qdot.py)", 0)
    em.emit("{", depth)
    em.emit("st_qv st_qacc0 = st_qzero(), st_qacc1 = st_qzero();", depth + 1)
    em.emit(f"{t} {o} = {strip_parens(em.expr(loop.start))};", depth + 1)
    em.emit(f"for (; {o} + 2 <= {stop}; {o} += 2) {{", depth + 1)
    block("st_qacc0", 0, depth + 2)
    block("st_qacc1", 1, depth + 2)
    em.emit("}", depth + 1)
    em.emit(f"if ({o} < {stop}) {{", depth + 1)
    block("st_qacc0", 0, depth + 2)
    em.emit("}", depth + 1)
    em.emit(f"st_qlanes(&{cname(qb.dest)}[{strip_parens(em.expr(qb.dest_at))}], st_qacc0, st_qacc1);",
            depth + 1)
    em.emit("}", depth)
    em.emit("#else", 0)
    as_written()
    em.emit("#endif", 0)
