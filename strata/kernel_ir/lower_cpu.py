"""Kernel IR for a CPU: each register tile's K loop becomes the instruction form it runs as.

Why here: the schedule decided the form (FORM, tile/passes/cpu_matmul.py) and lowering built the
loop; this pass states it as a Kernel IR statement (kernel_ir/cpu_ir.py) that `--ir kernel`
prints, the verifier checks and every consumer (the C printer, the cost model) looks up by its
class, so no emitter looks at a loop's shape or a buffer's name to pick an instruction.

The form of a kernel's K loops follows its FORM knob: amx (AmxTiles where the tile is 16 or 32
rows of 16-column pair vectors, else PairsBf16), pairs (PairsBf16), outer (OuterFma where a
vector ISA's registers hold the tile), dot (DotBf16 for bf16 operands). A kernel with no FORM (a
matrix-vector row: cpu_rows) takes DotBf16 for a row of bf16 products. In any kernel a loop over
blocks of a quantized weight that dequantizes a format's blocks is a QuantRow (lower_quant.py;
QDOT picks its int8 form). A loop that does not have its form's operands (f32 in the dot form, a
remainder of fewer than 16 pairs) stays a loop, or a LaneSum where it only sums floats over a
short row (the dot and pairs forms' loops as written sum in lanes so too).
"""
from __future__ import annotations

from dataclasses import replace

from ..core.expr import Const, Op, Var, affine_terms, coefficient, free_vars, sub
from .cpu_ir import VECTOR_ISAS, AmxTiles, DotBf16, LaneSum, OuterFma, PairsBf16, fits
from .ir import Assign, For, If, Kernel, Let, Load, Smem, While, walk
from .lower_quant import quant_row
from .lower_quant_rows import lower_quant_rows
from .simd_plan import plan_loop

LANES = 16                      # a pairs vector: 16 columns of one row
LANED_SUM = (32, 512)           # a float sum over a row this short adds into lanes, then a tree


def lower_cpu_forms(k: Kernel) -> Kernel:
    """`k` with each K loop its FORM runs as a CPU instruction form (see the module docstring)."""
    form, qdot = dict(k.knobs).get("FORM"), dict(k.knobs).get("QDOT")
    bufs = {p.name: p.dtype for p in k.params}
    bufs.update({s.name: s.dtype for s in walk(k.body) if isinstance(s, Smem)})
    types = {s.var: s.dtype for s in walk(k.body) if isinstance(s, (Let, For))}
    params = {p.name for p in k.params}

    def choose(loop: For, tiles: For | None):
        if form == "amx":
            amx = _amx(loop, bufs, types, tiles, params)
            if amx:
                return amx
        row = quant_row(loop, bufs, qdot)          # (lower_quant.py: found by evaluation)
        if row:
            return row
        if form in ("amx", "pairs"):
            pairs = _pairs(loop, bufs, types)
            if pairs:
                return PairsBf16.of(loop, vectors=pairs, lanes=_sum_lanes(loop, types))
        if form in ("dot", None):
            accs = _dot(loop, bufs, types)
            if accs:
                return DotBf16.of(loop, accs=accs, lanes=_sum_lanes(loop, types))
        if form == "outer":
            rows = _outer(loop, bufs, types)
            if rows and any(fits(rows, lanes, regs) for lanes, regs in VECTOR_ISAS):
                return OuterFma.of(loop, rows=rows, tiles=tiles.var if tiles else None,
                           tiles_dtype=tiles.dtype if tiles else "i32")
        lanes = _sum_lanes(loop, types)
        return LaneSum.of(loop, lanes=lanes) if lanes else None

    def body(stmts, tiles):
        out = []
        for s in stmts:
            if isinstance(s, For):
                chosen = choose(s, tiles)
                if chosen is not None:
                    out.append(chosen)
                    continue
                fixed = isinstance(s.start, Const) and isinstance(s.stop, Const)
                s = s.map_bodies(lambda b: tuple(body(b, s if fixed else tiles)))
            elif isinstance(s, (If, While)):
                s = s.map_bodies(lambda b: tuple(body(b, tiles)))
            out.append(s)
        return out
    return lower_quant_rows(replace(k, body=tuple(body(k.body, None))))


def _sum_lanes(loop: For, types: dict) -> int:
    """32 or 16 where `loop` only sums floats over a short row of a multiple of 16, else 0."""
    plan, trips = plan_loop(loop, types), loop.trip_count
    if not (plan.simd and plan.reductions and loop.step == 1 and trips and trips % 16 == 0
            and LANED_SUM[0] <= trips <= LANED_SUM[1]
            and all(op == "+" and types.get(v) == "f32" for op, v in plan.reductions)):
        return 0
    return 32 if trips % 32 == 0 else 16


# ---------------------------------------------------------------- bf16 products along K

def _dot(loop: For, bufs: dict, types: dict) -> tuple | None:
    """((acc, a, b), ...) where the loop is bf16 loads contiguous along it, their float products
    and one float sum of a product per accumulator; else None."""
    if loop.step != 1:
        return None
    found = products_and_sums(loop, bufs, types, lambda v, loads: _unit_stride(v.index, loop.var)
                              and not free_vars(v.index) & loads.keys())
    if not found or not found[2] or len({acc for acc, _ in found[2]}) != len(found[2]):
        return None                     # (an accumulator summing two products: the pairs form)
    return tuple((acc, *found[1][p]) for acc, p in found[2])


def products_and_sums(loop: For, bufs: dict, types: dict, load_ok):
    """The loop's body as bf16 loads (those load_ok(load, loads so far) takes), float products of
    two of them and float sums of products, in order: (loads, products: var -> (a, b), sums:
    [(accumulator, product var)]), or None for any other statement."""
    loads, products, sums = {}, {}, []
    for s in loop.body:
        v = getattr(s, "value", None)
        if isinstance(s, Let) and isinstance(v, Load) and bufs.get(v.buf) == "bf16" and load_ok(v, loads):
            loads[s.var] = v
        elif isinstance(s, Let) and isinstance(v, Op) and v.op == "multiply" and s.dtype == "f32" \
                and all(isinstance(x, Var) and x.name in loads for x in v.args):
            products[s.var] = tuple(x.name for x in v.args)
        elif isinstance(s, Assign) and isinstance(v, Op) and v.op == "add" and types.get(s.var) == "f32" \
                and v.args[0] == Var(s.var, "f32") and isinstance(v.args[1], Var) \
                and v.args[1].name in products:
            sums.append((s.var, v.args[1].name))
        else:
            return None
    return loads, products, sums


def _unit_stride(index, var: str) -> bool:
    """index is var plus terms free of it (clamped rows included, which expr's affine forms
    do not take)."""
    if isinstance(index, Var):
        return index.name == var
    if isinstance(index, Op) and index.op == "add":
        a, b = index.args
        return any(_unit_stride(x, var) and var not in free_vars(y) for x, y in ((a, b), (b, a)))
    return False


def load_offset(loads: dict, a: str, b: str) -> int | None:
    """Elements from load a to load b of one buffer, when constant."""
    la, lb = loads[a], loads[b]
    lin = affine_terms(sub(lb.index, la.index)) if la.buf == lb.buf else None
    return lin[1] if lin is not None and not any(lin[0].values()) else None


# ---------------------------------------------------------------- pairs of K

def _pairs(loop: For, bufs: dict, types: dict) -> tuple | None:
    """((row load, first panel load, 16 accumulators), ...) where each accumulator sums the
    products of a row value and a panel value at K and at K + 1, in rows of 16 accumulators whose
    panel values are consecutive pairs; else None."""
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
    return tuple(vectors) or None


def _amx(loop: For, bufs: dict, types: dict, tiles: For | None, params: set) -> AmxTiles | None:
    """The loop as AmxTiles: a pairs loop of 16 or 32 rows of 1 or 2 vectors of 16 columns, the
    vectors of a row 32 elements apart, consecutive pairs of K contiguous in every row, and 16
    pairs or more; else None. A panel that is a kernel parameter (a weight packed once) is
    prefetched block by block."""
    trips = [getattr(x, "value", None) for x in (loop.start, loop.stop)]
    vectors = _pairs(loop, bufs, types) if None in trips or trips[1] - trips[0] >= 16 else None
    if not vectors:
        return None
    loads = {s.var: s.value for s in loop.body if isinstance(s, Let) and isinstance(s.value, Load)}
    rows: dict = {}
    for u, w, accs in vectors:
        rows.setdefault(u, []).append((w, accs))
    us, cols = tuple(rows), tuple(tuple(r) for r in rows.values())
    g = len(cols[0])
    if len(us) not in (16, 32) or g not in (1, 2) or any(len(c) != g for c in cols) \
            or any(load_offset(loads, cols[0][j][0], c[j][0]) != 0 for c in cols for j in range(g)) \
            or (g == 2 and load_offset(loads, cols[0][0][0], cols[0][1][0]) != 32):
        return None
    w0, step = loads[cols[0][0][0]], [coefficient(loads[u].index, loop.var) for u in us]
    ldb = coefficient(w0.index, loop.var)
    if any(s != 2 for s in step) or ldb is None or ldb < 2 * 16 * g:
        return None
    gaps = [load_offset(loads, us[0], u) for u in us]
    lda = gaps[1] if None not in gaps and all(x == i * gaps[1] for i, x in enumerate(gaps)) else None
    prefetch = ()
    if w0.buf in params and None not in trips:      # the block's panel is ldb x the loop's pairs
        n = getattr(tiles.stop, "value", None) if tiles is not None else None
        prefetch = (ldb * (trips[1] - trips[0]), tiles.var if n else None, n or 1)
    return AmxTiles.of(loop, rows=us, cols=cols, lda=lda if lda and lda >= 32 else None, ldb=ldb,
               prefetch=prefetch)


# ---------------------------------------------------------------- f32 outer products

def _outer(loop: For, bufs: dict, types: dict) -> tuple | None:
    """((row load, ((accumulator, panel load), ...)), ...) where the loop is f32 loads then
    `acc = fma(u, w, acc)`, each row value u meeting a run of consecutive panel values w; else
    None."""
    if loop.step != 1:
        return None
    loads, fmas = {}, []
    for s in loop.body:
        v = getattr(s, "value", None)
        if isinstance(s, Let) and isinstance(v, Load) and bufs.get(v.buf) == "f32" and not fmas \
                and not free_vars(v.index) & loads.keys():
            loads[s.var] = v
        elif isinstance(s, Assign) and isinstance(v, Op) and v.op == "fma" and types.get(s.var) == "f32" \
                and v.args[2] == Var(s.var, "f32") \
                and all(isinstance(x, Var) and x.name in loads for x in v.args[:2]):
            fmas.append((s.var, v.args[0].name, v.args[1].name))
        else:
            return None
    if len({acc for acc, _, _ in fmas}) != len(fmas) or len(fmas) < 2:
        return None
    for row_first in (True, False):
        rows: dict[str, list] = {}
        for acc, a, b in fmas:
            u, w = (a, b) if row_first else (b, a)
            rows.setdefault(u, []).append((acc, w))
        if all(load_offset(loads, points[0][1], w) == t
               for points in rows.values() for t, (_, w) in enumerate(points)) and len(rows) < len(fmas):
            return tuple((u, tuple(p)) for u, p in rows.items())
    return None
