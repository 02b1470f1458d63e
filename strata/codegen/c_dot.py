"""A DotBf16 loop (kernel_ir/cpu_ir.py) as AVX512-BF16 instructions (vdpbf16ps), for the C target.

Why: a K loop whose every step multiplies bf16 values loaded contiguously along K and adds the
products to float accumulators (a dot-form register tile of cpu_matmul; a matrix-vector row of two
bf16 operands too) is what vdpbf16ps does 32 elements at a time: two products per lane, no
widening, twice the multiply-adds of an fp32 FMA. gcc does not pick the instruction itself.

The loop is printed twice, under `#if defined(__AVX512BF16__)`: as vector code for a compiler
targeting that extension (32 elements a step, then one masked step for the rest), and as written
(with its `omp simd` pragma) otherwise, so the C is the same for every CPU. Each accumulator's 16
lanes are summed after the loop and added to it: the order of the sum differs from the scalar
loop's as `omp simd`'s does, and the instruction flushes subnormal inputs and products to zero
(bf16 values under 1.2e-38), where the tolerances of a bf16 result are far larger.
"""
from __future__ import annotations

from ..kernel_ir.cpu_ir import DotBf16
from .cfamily import REL, cname, strip_parens


CHAINS = 4         # vdpbf16ps chains in flight: one accumulator alone waits on its latency


def emit_dot(em, loop: DotBf16, depth: int, as_written) -> None:
    """Print `loop` as vdpbf16ps code when the compiler targets AVX512-BF16, else `as_written()`.
    With fewer than CHAINS accumulators (a matrix-vector row has one) each is split into
    independent partial sums over consecutive steps, added together after the loop."""
    v, t = cname(loop.var), em.ctype(loop.var, loop.dtype)
    stop = em.expr(loop.stop, REL + 1)
    ways = max(1, CHAINS // len(loop.accs))

    def step(d: int, load: str, way: int = 0) -> None:
        for var, e in loop.loads().items():
            at = f"&{cname(e.buf)}[{strip_parens(em.expr(e.index))}]" + (f" + {32 * way}" if way else "")
            em.emit(f"__m512bh {cname(var)}_{way} = {load.format(at)};", d)
        for acc, a, b in loop.accs:
            em.emit(f"{cname(acc)}_v{way} = _mm512_dpbf16_ps({cname(acc)}_v{way}, {cname(a)}_{way}, "
                    f"{cname(b)}_{way});", d)
    em.emit("#if defined(__AVX512BF16__)    // vdpbf16ps: 32 bf16 products a step (codegen/c_dot.py)", 0)
    em.emit("{", depth)
    for acc in loop.accumulators():
        for w in range(ways):
            em.emit(f"__m512 {cname(acc)}_v{w} = _mm512_setzero_ps();", depth + 1)
    em.emit(f"{t} {v} = {strip_parens(em.expr(loop.start))};", depth + 1)
    if ways > 1:
        em.emit(f"for (; {v} + {32 * ways} <= {stop}; {v} += {32 * ways}) {{", depth + 1)
        for w in range(ways):
            step(depth + 2, "st_bf16x32({})", w)
        em.emit("}", depth + 1)
    em.emit(f"for (; {v} + 32 <= {stop}; {v} += 32) {{", depth + 1)
    step(depth + 2, "st_bf16x32({})")
    em.emit("}", depth + 1)
    em.emit(f"if ({v} < {stop}) {{", depth + 1)
    em.emit(f"__mmask32 st_rest = (__mmask32)((1ull << ({stop} - {v})) - 1);", depth + 2)
    step(depth + 2, "st_bf16x32_masked(st_rest, {})")
    em.emit("}", depth + 1)
    for acc in loop.accumulators():
        total = " + ".join(f"{cname(acc)}_v{w}" for w in range(ways))
        em.emit(f"{cname(acc)} += _mm512_reduce_add_ps({total});", depth + 1)
    em.emit("}", depth)
    em.emit("#else", 0)
    as_written()
    em.emit("#endif", 0)
