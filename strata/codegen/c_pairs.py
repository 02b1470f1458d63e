"""A register tile's loop over pairs of K (cpu_matmul FORM=pairs) as vdpbf16ps, for the C target.

Why: in the pairs form each K step of a register tile reads two consecutive K of every row of
the M-side operand (adjacent bf16 values) and the two K rows of a panel that holds them side by
side per column, and adds both products to each point's float accumulator. vdpbf16ps does that
for 16 columns at once: the row's pair broadcast as one 32-bit lane, the panel's 32 values as
the other operand. gcc does not pick the instruction itself (it widens both to floats).

The loop is printed twice, under `#if defined(__AVX512BF16__)`: as vector code (one 16-lane
accumulator per row and 16 columns, added to the points' scalar accumulators after the loop),
and as written otherwise. The order of the sums is the scalar loop's per point (two products
a step); the instruction flushes subnormal inputs and products to zero, as in codegen/c_dot.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..expr import affine_terms, sub
from ..kernel_ir.ir import For
from .c_dot import products_and_sums
from .cfamily import REL, cname, strip_parens

LANES = 16


@dataclass(frozen=True)
class PairLoop:
    loads: dict                 # variable -> its bf16 Load
    vectors: tuple              # (row pair's first load var, panel's first load var, accs x 16)


def match_pairs(loop: For, bufs: dict, types: dict) -> PairLoop | None:
    """The loop as bf16 loads, products of an M-side value and a panel value, and float sums of
    two such products per accumulator at consecutive K (see the module docstring), grouped into
    rows of 16 accumulators whose panel values are consecutive pairs; None for anything else."""
    if loop.step != 1:
        return None
    found = products_and_sums(loop, bufs, types, lambda v, loads: True)
    if not found:
        return None
    loads, products, accs = found[0], found[1], {}
    for acc, p in found[2]:
        accs.setdefault(acc, []).append(products[p])
    rows: dict[str, list] = {}
    for acc, pair in accs.items():
        if len(pair) != 2 or any(load_offset(loads, x, y) != 1 for x, y in zip(*pair)):
            return None                 # (u0, v0), (u1, v1): both operands at K and K + 1
        rows.setdefault(pair[0][0], []).append((acc, pair[0][1]))
    vectors = []
    for u, points in rows.items():
        if len(points) % LANES:
            return None
        for at in range(0, len(points), LANES):
            group = points[at:at + LANES]
            if any(load_offset(loads, group[0][1], v) != 2 * t for t, (_, v) in enumerate(group)):
                return None
            vectors.append((u, group[0][1], tuple(a for a, _ in group)))
    return PairLoop(loads, tuple(vectors)) if vectors else None


def load_offset(loads: dict, a: str, b: str) -> int | None:
    """Elements from load a to load b of one buffer, when constant."""
    la, lb = loads[a], loads[b]
    lin = affine_terms(sub(lb.index, la.index)) if la.buf == lb.buf else None
    return lin[1] if lin is not None and not any(lin[0].values()) else None


def lanes_back(store: str, lanes: int, accs, op: str) -> str:
    """One line handing each lane of a vector accumulator to its point's scalar accumulator
    (`op`: "=" or "+="), through a lanes-long array `store` (a statement) writes to st_l."""
    return f"{{ float st_l[{lanes}]; {store}; " + \
        " ".join(f"{cname(a)} {op} st_l[{i}];" for i, a in enumerate(accs)) + " }"


def emit_pairs(em, loop: For, pl: PairLoop, depth: int, as_written) -> None:
    """Print `loop` as vdpbf16ps code when the compiler targets AVX512-BF16, else `as_written()`."""
    v, t = cname(loop.var), em.ctype(loop.var, loop.dtype)

    def at(var: str) -> str:
        e = pl.loads[var]
        return f"&{cname(e.buf)}[{strip_parens(em.expr(e.index))}]"
    em.emit("#if defined(__AVX512BF16__)    // vdpbf16ps on pairs of K (codegen/c_pairs.py)", 0)
    em.emit("{", depth)
    names = [f"{cname(accs[0])}_pv" for _, _, accs in pl.vectors]
    for name in names:
        em.emit(f"__m512 {name} = _mm512_setzero_ps();", depth + 1)
    em.emit(f"for ({t} {v} = {strip_parens(em.expr(loop.start))}; {v} < {em.expr(loop.stop, REL + 1)}; "
            f"{v}++) {{", depth + 1)
    for u in dict.fromkeys(u for u, _, _ in pl.vectors):
        em.emit(f"__m512bh {cname(u)}_pb = st_bf16x2({at(u)});", depth + 2)
    for name, (u, w, _) in zip(names, pl.vectors):
        em.emit(f"{name} = _mm512_dpbf16_ps({name}, {cname(u)}_pb, st_bf16x32({at(w)}));", depth + 2)
    em.emit("}", depth + 1)
    for name, (_, _, accs) in zip(names, pl.vectors):
        em.emit(lanes_back(f"_mm512_storeu_ps(st_l, {name})", LANES, accs, "+="), depth + 1)
    em.emit("}", depth)
    em.emit("#else", 0)
    as_written()
    em.emit("#endif", 0)
