"""An OuterFma loop (kernel_ir/cpu_ir.py: cpu_matmul FORM=outer) as explicit vector FMAs.

Why: each K step of an outer-form register tile loads THREAD_M values of the M-side operand and
TILE_N consecutive values of the packed panel, then does THREAD_M x TILE_N `acc = fma(a, b, acc)`
on scalars. gcc's SLP vectoriser turns those into vector FMAs only up to a point: a 6 x 64 tile (24
zmm accumulators, what AVX-512's 32 registers hold) it spilled, and the kernel ran 1.25x slower
than 6 x 32. Printed with intrinsics the tile is what the schedule chose on every CPU: one
broadcast per row and K step, one vector load per LANES columns of the panel, one vector FMA per
row and vector.

Each panel vector is loaded once a K step and pinned to a register (an empty asm statement): gcc
otherwise folds the load into each row's FMA as a memory operand, a load per FMA, and Zen 4 (one
512-bit load a cycle) then waits on loads: a flash-attention block 138 -> 120 ms.

Each lane runs the scalar code's fmaf calls in the same order, so the results are the same bits.
The loop is printed once per vector ISA the tile fits (AVX-512: 16 lanes, 32 registers; AVX2 with
FMA: 8 lanes, 16 registers; AArch64 NEON: 4 lanes, 32 registers), under `#if`, and as written for
any other compiler target: the C stays one source for every CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.expr import Var, add, call, coefficient, free_vars, substitute
from ..kernel_ir.cpu_ir import VECTOR_ISAS, OuterFma, fits
from .c_pairs import X86_PIN, lanes_back
from .cfamily import REL, cname, strip_parens


@dataclass(frozen=True)
class Isa:
    guard: str                  # the preprocessor test for it
    lanes: int
    registers: int              # vector registers: accumulators + panel vectors + a broadcast
    vec: str                    # the vector type
    set_lanes: str              # a vector of `lanes` scalars, {} their list
    load: str                   # {} an address
    bcast: str                  # {} a scalar
    fma: str                    # {a} * {b} + {c}
    store: str                  # {p} an address, {v} a vector
    pin: str                    # {} a vector: an empty asm statement that holds it in a register


ISAS = (
    Isa("defined(__AVX512F__)", *VECTOR_ISAS[0], "__m512", "_mm512_setr_ps({})", "_mm512_loadu_ps({})",
        "_mm512_set1_ps({})", "_mm512_fmadd_ps({a}, {b}, {c})", "_mm512_storeu_ps({p}, {v})", X86_PIN),
    Isa("defined(__AVX2__) && defined(__FMA__)", *VECTOR_ISAS[1], "__m256", "_mm256_setr_ps({})",
        "_mm256_loadu_ps({})", "_mm256_set1_ps({})", "_mm256_fmadd_ps({a}, {b}, {c})",
        "_mm256_storeu_ps({p}, {v})", X86_PIN),
    Isa("defined(__aarch64__) && defined(__ARM_NEON)", *VECTOR_ISAS[2], "float32x4_t", "(float32x4_t){{{}}}",
        "vld1q_f32({})", "vdupq_n_f32({})", "vfmaq_f32({c}, {a}, {b})", "vst1q_f32({p}, {v})",
        '__asm__("" : "+w"({}));'),
)


LINE = 16                       # floats in a 64-byte cache line


def next_panel(em, loop: OuterFma):
    """The element each K step of the vector loop prefetches, or None. Why: a block's first
    register tile reads its packed panel from DRAM while the others find it in L2; the block after
    it (the same thread's, in a static schedule) reads the panel `row` elements per K step further
    on. Each tile `mi` of the block prefetches line `mi % lines` of that panel's row k at step k,
    so the first `lines` tiles bring the whole next panel into L2 one line a step, under their
    FMAs. Where the schedule asks for it (PREFETCH, tile/passes/cpu_matmul.py), for a panel that
    is a kernel parameter (packed once, cpu_pack_weights) indexed by the block's first column, at
    least a cache line a row."""
    e = loop.loads()[loop.rows[0][1][0][1]]
    if loop.tiles is None or e.buf in em.smem or not dict(em.k.knobs).get("PREFETCH"):
        return None
    row = coefficient(e.index, loop.var)
    others = free_vars(e.index) - {loop.var}
    if not row or row % LINE or len(others) != 1:
        return None
    (n0,) = others
    chunk = dict(em.k.knobs).get("K_CHUNK", 0)
    nxt = add(e.index, chunk * row) if chunk else substitute(e.index, {n0: add(Var(n0, "i32"), row)})
    at = add(nxt,
             call("multiply", call("mod", Var(loop.tiles, loop.tiles_dtype), row // LINE), LINE))
    return f"{cname(e.buf)}[{strip_parens(em.expr(at))}]"


def emit_outer(em, loop: OuterFma, depth: int, as_written) -> None:
    """Print `loop` as vector FMAs for each ISA of ISAS the tile fits (lower_cpu chose the form
    where one does), then `as_written()` for any other compiler target."""
    isas = [isa for isa in ISAS if fits(loop.rows, isa.lanes, isa.registers)]
    v, t = cname(loop.var), em.ctype(loop.var, loop.dtype)
    ahead = next_panel(em, loop)
    loads = loop.loads()

    def at(var: str) -> str:
        e = loads[var]
        return f"{cname(e.buf)}[{strip_parens(em.expr(e.index))}]"
    for i, isa in enumerate(isas):
        em.emit(f"#{'el' if i else ''}if {isa.guard}    // {isa.lanes}-lane FMAs (codegen/c_outer.py)", 0)
        em.emit("{", depth)
        vectors = []            # (vector name, its accumulators, panel variable, row variable)
        for u, points in loop.rows:
            for first in range(0, len(points), isa.lanes):
                group = points[first:first + isa.lanes]
                vectors.append((f"{cname(group[0][0])}_v", [a for a, _ in group], group[0][1], u))
                em.emit(f"{isa.vec} {vectors[-1][0]} = "
                        f"{isa.set_lanes.format(', '.join(cname(a) for a in vectors[-1][1]))};", depth + 1)
        em.emit(f"for ({t} {v} = {strip_parens(em.expr(loop.start))}; {v} < {em.expr(loop.stop, REL + 1)}; "
                f"{v}++) {{", depth + 1)
        if ahead:
            em.emit(f"__builtin_prefetch(&{ahead}, 0, 2);    // the next panel rows, into L2", depth + 2)
        for w in dict.fromkeys(x[2] for x in vectors):
            em.emit(f"{isa.vec} {cname(w)}_v = {isa.load.format('&' + at(w))};", depth + 2)
            em.emit(isa.pin.format(f"{cname(w)}_v"), depth + 2)
        for u, _ in loop.rows:
            em.emit(f"{isa.vec} {cname(u)}_b = {isa.bcast.format(at(u))};", depth + 2)
            for name, _, w, row in vectors:
                if row == u:
                    em.emit(f"{name} = {isa.fma.format(a=cname(u) + '_b', b=cname(w) + '_v', c=name)};",
                            depth + 2)
        em.emit("}", depth + 1)
        for name, accs, _, _ in vectors:
            em.emit(lanes_back(isa.store.format(p="st_l", v=name), isa.lanes, accs, "="), depth + 1)
        em.emit("}", depth)
    em.emit("#else", 0)
    as_written()
    em.emit("#endif", 0)
