"""A PairsBf16 loop (kernel_ir/cpu_ir.py: cpu_matmul FORM=pairs) as vdpbf16ps, for the C target.

Why: in the pairs form each K step of a register tile reads two consecutive K of every row of the
M-side operand (adjacent bf16 values) and the two K rows of a panel that holds them side by side
per column, and adds both products to each point's float accumulator. vdpbf16ps does that for 16
columns at once: the row's pair broadcast as one 32-bit lane, the panel's 32 values as the other
operand. gcc does not pick the instruction itself (it widens both to floats).

The loop is printed twice, under `#if defined(__AVX512BF16__)`: as vector code (one 16-lane
accumulator per row and 16 columns, added to the points' scalar accumulators after the loop), and
as written otherwise. The order of the sums is the scalar loop's per point (two products a step);
the instruction flushes subnormal inputs and products to zero, as in codegen/c_dot.py.
"""
from __future__ import annotations

from ..kernel_ir.cpu_ir import PairsBf16
from .cfamily import REL, cname, strip_parens

LANES = 16
# an empty asm statement that holds vector {} in a register: gcc otherwise folds its load into
# every instruction that reads it (a load each), and Zen 4 loads one 512-bit vector a cycle
X86_PIN = '__asm__("" : "+v"({}));'


def lanes_back(store: str, lanes: int, accs, op: str) -> str:
    """One line handing each lane of a vector accumulator to its point's scalar accumulator
    (`op`: "=" or "+="), through a lanes-long array `store` (a statement) writes to st_l."""
    return f"{{ float st_l[{lanes}]; {store}; " + \
        " ".join(f"{cname(a)} {op} st_l[{i}];" for i, a in enumerate(accs)) + " }"


def emit_pairs(em, loop: PairsBf16, depth: int, as_written) -> None:
    """Print `loop` as vdpbf16ps code when the compiler targets AVX512-BF16, else `as_written()`."""
    v, t = cname(loop.var), em.ctype(loop.var, loop.dtype)
    loads = loop.loads()

    def at(var: str) -> str:
        e = loads[var]
        return f"&{cname(e.buf)}[{strip_parens(em.expr(e.index))}]"
    em.emit("#if defined(__AVX512BF16__)    // vdpbf16ps on pairs of K (codegen/c_pairs.py)", 0)
    em.emit("{", depth)
    names = [f"{cname(accs[0])}_pv" for _, _, accs in loop.vectors]
    for name in names:
        em.emit(f"__m512 {name} = _mm512_setzero_ps();", depth + 1)
    em.emit(f"for ({t} {v} = {strip_parens(em.expr(loop.start))}; {v} < {em.expr(loop.stop, REL + 1)}; "
            f"{v}++) {{", depth + 1)
    for w in dict.fromkeys(w for _, w, _ in loop.vectors):       # each panel vector once, held
        em.emit(f"__m512bh {cname(w)}_pw = st_bf16x32({at(w)}); {X86_PIN.format(cname(w) + '_pw')}",
                depth + 2)                                      # in a register (c_outer.py)
    for u in dict.fromkeys(u for u, _, _ in loop.vectors):
        em.emit(f"__m512bh {cname(u)}_pb = st_bf16x2({at(u)});", depth + 2)
    for name, (u, w, _) in zip(names, loop.vectors):
        em.emit(f"{name} = _mm512_dpbf16_ps({name}, {cname(u)}_pb, {cname(w)}_pw);", depth + 2)
    em.emit("}", depth + 1)
    for name, (_, _, accs) in zip(names, loop.vectors):
        em.emit(lanes_back(f"_mm512_storeu_ps(st_l, {name})", LANES, accs, "+="), depth + 1)
    em.emit("}", depth)
    em.emit("#else", 0)
    as_written()
    em.emit("#endif", 0)
