"""A register tile's loop over pairs of K (cpu_matmul FORM=amx) as AMX tile code, for the C target.

Why: the amx form is the pairs form (codegen/c_pairs.py) with register tiles of 16 or 32 rows
and 16 or 32 columns, and a panel (named `*_amx`) whose rows of K pairs are AMX's B-tile layout
(VNNI pairs: two K of a column side by side). One tdpbf16ps does 16 pairs of K for a 16 x 16
block of fp32 accumulators, 16x a vdpbf16ps; the register tile runs as up to 2 x 2 C tiles
(tmm0-3), two A tiles of 16 rows x 32 bf16 (tmm4-5, loaded from the M-side rows in place, or
copied first when the rows are clamped at an M edge) and two B tiles (tmm6-7) per 32 K. The C
tiles are stored to a local fp32 array and added to the points' accumulators, so the kernel's
epilogue runs on them as in every form; K pairs past a multiple of 16 run as written.

The tile ops are the prelude's `st_tile_*` (AMX_PRELUDE): the instructions where the compiler
targets AMX and Linux grants the process tile data, else a C emulation with their semantics
(docs/amx-probe-2026-11-26.md: bit-exact on the probe's CPU), which STRATA_AMX_EMULATE=1 forces.
A kernel asks which once per call before its threads start (`st_amx_mode`: the permission is
requested once, on the first call), and each thread loads its tile configuration (gcc-12-safe,
see strata/codegen/amx_kernel.c) before its blocks and releases the tiles after them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..expr import coefficient
from ..kernel_ir.ir import For
from .c_pairs import PairLoop, load_offset, match_pairs
from .cfamily import cname, prelude, strip_parens

PANEL = "_amx"                  # the suffix of an amx-form panel's name (tile/passes/cpu_matmul.py)


@dataclass(frozen=True)
class AmxLoop:
    pairs: PairLoop
    rows: tuple                 # the M-side load var of each row (16 or 32)
    cols: tuple                 # per row: ((panel load var, 16 accumulators), ...) (1 or 2)
    lda: int | None             # elements between rows, None when not constant (copied)
    ldb: int                    # elements between the panel's pair rows
    prefetch: tuple = ()        # a packed weight's panels (global): (elements per panel, the
                                # register tiles' loop var or None, their count)


def match_amx(loop: For, bufs: dict, types: dict, tiles: For | None = None,
              packed: bool = False) -> AmxLoop | None:
    """The loop as a pairs loop on an amx-form panel with 16 or 32 rows of 1 or 2 groups of 16
    columns, consecutive pairs of K contiguous in every row, and 16 pairs or more; else None."""
    trips = [getattr(x, "value", None) for x in (loop.start, loop.stop)]
    pl = match_pairs(loop, bufs, types) if None in trips or trips[1] - trips[0] >= 16 else None
    if pl is None or not all(pl.loads[w].buf.endswith(PANEL) for _, w, _ in pl.vectors):
        return None
    rows: dict = {}
    for u, w, accs in pl.vectors:
        rows.setdefault(u, []).append((w, accs))
    us, cols = tuple(rows), tuple(tuple(r) for r in rows.values())
    g = len(cols[0])
    if len(us) not in (16, 32) or g not in (1, 2) or any(len(c) != g for c in cols) \
            or any(load_offset(pl.loads, cols[0][j][0], c[j][0]) != 0 for c in cols for j in range(g)) \
            or (g == 2 and load_offset(pl.loads, cols[0][0][0], cols[0][1][0]) != 32):
        return None
    w0, step = pl.loads[cols[0][0][0]], [coefficient(pl.loads[u].index, loop.var) for u in us]
    ldb = coefficient(w0.index, loop.var)
    if any(s != 2 for s in step) or ldb is None or ldb < 2 * 16 * g:
        return None
    gaps = [load_offset(pl.loads, us[0], u) for u in us]
    lda = gaps[1] if None not in gaps and all(x == i * gaps[1] for i, x in enumerate(gaps)) else None
    prefetch = ()
    if packed and None not in trips:        # the block's panel is ldb x the loop's pairs
        n = getattr(tiles.stop, "value", None) if tiles is not None else None
        prefetch = (ldb * (trips[1] - trips[0]), tiles.var if n else None, n or 1)
    return AmxLoop(pl, us, cols, lda if lda and lda >= 32 else None, ldb, prefetch)


def emit_amx(em, loop: For, amx: AmxLoop, depth: int) -> None:
    """Print `loop` as tile code for 16 pairs of K a step, then its remaining pairs as written."""
    v, t, d = cname(loop.var), em.ctype(loop.var, loop.dtype), depth + 1
    halves, g = len(amx.rows) // 16, len(amx.cols[0])
    width = 16 * g

    def at(var: str) -> str:
        e = amx.pairs.loads[var]
        return f"&{cname(e.buf)}[{strip_parens(em.expr(e.index))}]"
    em.emit(f"{{   // AMX: {halves}x{g} tiles of 16x16 fp32, 32 K a step (codegen/c_amx.py)", depth)
    em.emit(f"float st_c[{16 * halves * width}] __attribute__((aligned(64)));", d)
    if amx.lda is None:
        em.emit("uint16_t st_a[32][32] __attribute__((aligned(64)));", d)
    em.emit("st_fence();     // the panel was just written: tile loads are opaque asm", d)
    for h in range(halves):
        for j in range(g):
            em.emit(f"st_tile_zero(st_amx, {2 * h + j});", d)
    em.emit(f"{t} {v} = {strip_parens(em.expr(loop.start))};", d)
    em.emit(f"for (; {v} + 16 <= {strip_parens(em.expr(loop.stop))}; {v} += 16) {{", d)
    if amx.lda is None:                 # clamped rows: copied to st_a (an M edge's tile)
        for r, u in enumerate(amx.rows):
            em.emit(f"memcpy(st_a[{r}], {at(u)}, 64);", d + 1)
        em.emit("st_fence();", d + 1)
    for h in range(halves):
        src = f"st_a[{16 * h}], 64" if amx.lda is None else f"{at(amx.rows[16 * h])}, {2 * amx.lda}"
        em.emit(f"st_tile_load(st_amx, {4 + h}, {src});", d + 1)
    for j in range(g):
        em.emit(f"st_tile_load(st_amx, {6 + j}, {at(amx.cols[0][j][0])}, {2 * amx.ldb});", d + 1)
    if amx.prefetch:
        _prefetch(em, loop, amx, at(amx.cols[0][0][0]), d + 1)
    for h in range(halves):
        for j in range(g):
            em.emit(f"st_tile_dp(st_amx, {2 * h + j}, {4 + h}, {6 + j});", d + 1)
    em.emit("}", d)
    for h in range(halves):
        for j in range(g):
            em.emit(f"st_tile_store(st_amx, {2 * h + j}, st_c + {16 * h * width + 16 * j}, "
                    f"{4 * width});", d)
    em.emit("st_fence();", d)
    for r in range(len(amx.rows)):
        em.emit(" ".join(f"{cname(a)} += st_c[{r * width + 16 * j + i}];"
                         for j, (_, accs) in enumerate(amx.cols[r]) for i, a in enumerate(accs)), d)
    trips = [getattr(x, "value", None) for x in (loop.start, loop.stop)]
    if None in trips or (trips[1] - trips[0]) % 16:
        em.emit(f"for (; {v} < {strip_parens(em.expr(loop.stop))}; {v}++) {{", d)
        em.body(loop.body, d + 1)
        em.emit("}", d)
    em.emit("}", depth)


def _prefetch(em, loop: For, amx: AmxLoop, b: str, depth: int) -> None:
    """Prefetch into L2 this K step's share of the next block's panel (the next panel of a packed
    weight; an OpenMP thread's blocks are consecutive), spread over the block's register tiles:
    the next block then finds its weights in L2 instead of waiting on DRAM for them (a 128 x 2048
    by 5632 linear, 2 threads: 1.5x faster)."""
    size, tile, tiles = amx.prefetch
    steps = (loop.stop.value - loop.start.value) // 16
    lines = -(-size * 2 // 64 // (steps * tiles))
    v = cname(loop.var)
    step = f"({cname(tile)} * {steps} + ({v} - {loop.start.value}) / 16)" if tile else \
        f"(({v} - {loop.start.value}) / 16)"
    start = f"{b} + {size} - ({v} - {loop.start.value}) * {amx.ldb}"     # the next panel's first row
    em.emit(f"{{ const char* st_pf = (const char*)({start}) + {step} * {lines * 64};", depth)
    em.emit(f"  for (int st_q = 0; st_q < {lines * 64}; st_q += 64) st_prefetch_l2(st_pf + st_q); }}",
            depth)


AMX_PRELUDE = prelude("c_amx.h")
