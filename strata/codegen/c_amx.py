"""An AmxTiles loop (kernel_ir/cpu_ir.py: cpu_matmul FORM=amx) as AMX tile code, for the C target.

Why: the amx form is the pairs form (codegen/c_pairs.py) with register tiles of 16 or 32 rows and
16 or 32 columns, and a panel whose rows of K pairs are AMX's B-tile layout (VNNI pairs: two K of a
column side by side). One tdpbf16ps does 16 pairs of K for a 16 x 16 block of fp32 accumulators,
16x a vdpbf16ps; the register tile runs as up to 2 x 2 C tiles (tmm0-3), two A tiles of 16 rows x
32 bf16 (tmm4-5, loaded from the M-side rows in place, or copied first when the rows are clamped at
an M edge) and two B tiles (tmm6-7) per 32 K. The C tiles are stored to a local fp32 array and
added to the points' accumulators, so the kernel's epilogue runs on them as in every form; K pairs
past a multiple of 16 run as written.

The tile ops are the prelude's `st_tile_*` (AMX_PRELUDE): the instructions where the compiler
targets AMX and Linux grants the process tile data, else a C emulation with their semantics
(docs/amx-probe-2026-11-26.md: bit-exact on the probe's CPU), which STRATA_AMX_EMULATE=1 forces. A
kernel asks which once per call before its threads start (`st_amx_mode`: the permission is
requested once, on the first call), and each thread loads its tile configuration (gcc-12-safe, see
strata/codegen/amx_kernel.c) before its blocks and releases the tiles after them.
"""
from __future__ import annotations

from ..kernel_ir.cpu_ir import AmxTiles
from .cfamily import cname, prelude, strip_parens


def emit_amx(em, amx: AmxTiles, depth: int) -> None:
    """Print `amx` as tile code for 16 pairs of K a step, then its remaining pairs as written."""
    loop, loads = amx, amx.loads()
    v, t, d = cname(loop.var), em.ctype(loop.var, loop.dtype), depth + 1
    halves, g = len(amx.rows) // 16, len(amx.cols[0])
    width = 16 * g

    def at(var: str) -> str:
        e = loads[var]
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


def _prefetch(em, loop: AmxTiles, amx: AmxTiles, b: str, depth: int) -> None:
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
