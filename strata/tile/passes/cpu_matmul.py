"""cpu_matmul: a contraction on a CPU as a packed, register-tiled micro-kernel (GotoBLAS's shape).

A block is one thread (an iteration of the kernel's OpenMP loop) owning TILE_N columns and TILE_M
rows of the output. It packs its K x TILE_N panel of the N-side operand once (prologue computed,
16-bit floats widened, zero past the edge of N) into a contiguous scratch array, then runs its
THREAD_M x TILE_N register tiles along M in turn (`MicroTiles`): each K step loads THREAD_M values
of the M-side operand (prologue computed in registers) and one row of the panel, and does
THREAD_M x TILE_N fused multiply-adds into accumulators the C compiler keeps in SIMD registers
(default 6 x two vectors: 6 x 32 on AVX-512, 6 x 16 on AVX2: 12 accumulator registers). The
epilogue (bias, activation, residual, cast) runs on the registers before the store. The panel
stays in the core's cache across the M tiles while the M-side rows stream past it.

FORM=dot (the default for bf16 on a CPU with AVX512-BF16 whose N side is not a weight, and for
f32 of few rows, see contraction.cpu_form) runs the same register tiles the other way round: no
panel; each K step loads THREAD_M (default 2) rows of the M-side operand and TILE_N (default 8)
rows of the N-side one straight from memory, and the C compiler vectorises the K loop, so each
point's accumulator is a vector of partial sums added up after it (codegen/c_dot.py makes that
vdpbf16ps: 2 x 8 vectors of 16 lanes, both operands' rows contiguous along K as a linear layer
stores them). A register tile overhanging M or N reads the last row again (its points are not
stored). When the block's TILE_N rows of the N-side operand would not fit in L1, the K loops run
K_CHUNK elements at a time over all the block's register tiles (the rows of one chunk stay in
L1), their sums kept in a scratch between chunks.

FORM=pairs (the default for bf16 operands on AVX512-BF16 where the N side is a weight, packed
once at load by cpu_pack_weights, or a (K, N) matrix: `x @ w`, attention's matmuls) is the
packed form with a bf16 panel holding two K per column side by side: each K step of a register
tile then reads a pair of each row (one 32-bit broadcast) and 2 x 16 columns of the panel, and
codegen/c_pairs.py prints it as 12 vdpbf16ps (a bf16 linear 128 x 2048 x 5632 with its weight
packed once: 7.5 ms, the dot form 10.6, eager 8.7; Zen 4, 2026-11-28).

FORM=amx (the default for bf16 on a CPU with AMX-BF16, see contraction.cpu_form) is the pairs
form with 32 x 32 register tiles (16 rows when M is 16 or less): the panel's K pairs are AMX's
B-tile layout, and codegen/c_amx.py prints the K loop as 2 x 2 tiles of tdpbf16ps (16x16 fp32
each, 32 K a step), emulated in C where the CPU has no AMX.

In the outer form on a CPU with 32 vector registers the tile is 6 x 4 vectors; where the
block's panels take over a quarter of L2 and every M-side operand is a plain f32 load, K runs
in chunks (K_CHUNK) over all the block's register tiles, their sums kept in a scratch between
chunks, as the dot form's do; PREFETCH has each tile bring part of the next chunk's (or the next
block's) panel rows into L2 under its FMAs (codegen/c_outer.py).

TILE_M defaults to all of M, in near-equal pieces of at most MAX_TILE_M rows, unless that leaves
fewer than BLOCKS_PER_CORE blocks per core (then smaller pieces). Several reductions over the
same rows (the MLP's gate and up projections) each pack a panel and run their K loops in turn on
each register tile. Declines, saying why, on a matrix-vector product (no M axis: rows of dot
products read each weight row once, contiguously, at memory speed) and on a row that is not
a contraction.
"""
from __future__ import annotations

from dataclasses import replace
from math import lcm, prod

from ...core import dtypes
from ...core.context import Context
from ...core.errors import KnobError
from ...core.expr import Const, Var, call, sub, substitute
from ...loop.ir import Accum, Load, Loop
from ..contraction import (CPU_VECTORS_N, bf16_exact, closure, conjoin, cpu_form, depends, edge,
                           fastest_axis, match, one_block_n, outer_vectors, plain_bf16, pow2_ceil,
                           sides, value_dtype)
from ..ir import (Guard, MatmulTile, MicroTiles, Mode, Points, Registers, StageTile, TileKernel,
                  rename_stmt)

THREAD_M = 6                # rows of a register tile: 6 x 2 vectors of accumulators
                            # (6 x 4 in the outer form: contraction.WIDE_N)
TALL_M = 8                  # ... 8 x 2 in the pairs form (bf16, M=128: 1.08-1.13x on Zen 5)
                            # and when the packed panel takes over a quarter of L2, which each
                            # tile streams from further out (K=5632, N=32, M=128: 1.6x on the
                            # EPYC's 1 MiB L2, 1.03x in the EMR's 2 MiB)
BLOCKS_PER_CORE = 4
MAX_TILE_M = 512           # rows of a piece, which packs its own panels (512 as one: 1.12x)
WIDE_ACCUMULATORS = 16     # a block of two panels (contraction.one_block_n): 2 rows of 8 vectors,
                           # 3 of 5
DOT_M, DOT_N = 2, 8        # a dot-form register tile: 16 vector accumulators (over the
                           # reductions it runs: 2 x 4 each for the MLP's gate and up)


def _tiles(k: TileKernel, c, ctx: Context, form: str, chunkable: bool) -> MatmulTile:
    m, n, loops = c.m, c.n, len(c.loops)
    dot, amx = form == "dot", form == "amx"
    lanes = 16 if amx else max(1, ctx.arch.vector_bytes // 4)     # amx: 2 B tiles of 16 columns
    half_l2 = dict(ctx.arch.caches).get("L2", 1 << 19) // 2    # the panel's share of L2
    k_total = sum(l.extent for l in c.loops)
    wide_registers = ctx.arch.vector_registers >= 32     # 16 hold 6 x 2 accumulators at most
    vectors = outer_vectors(k_total, lanes, ctx, chunkable) if form == "outer" else CPU_VECTORS_N
    wide = form == "outer" and dict(k.knobs).get("PROLOGUE") == "fuse" and \
        one_block_n(k, c, lanes, ctx)
    tile_n = ctx.knob("TILE_N", wide or min(max(1, DOT_N // loops) if dot else vectors * lanes,
                                            max(16 if amx else 1, pow2_ceil(k.extent(n)))))
    rows = DOT_M if dot else 32 if amx and k.extent(m) > 16 else 16 if amx else \
        max(1, WIDE_ACCUMULATORS // (wide // lanes)) if wide else \
        TALL_M if wide_registers and vectors == CPU_VECTORS_N and \
        (form == "pairs" or k_total * tile_n * 4 > half_l2 // 2) else THREAD_M
    thread_m = ctx.knob("THREAD_M", rows if amx else _fitted(rows, k.extent(m)) if form == "outer"
                        else min(rows, k.extent(m)))
    panels = prod(e for v, e in k.domain if v not in (m, n)) * -(-k.extent(n) // tile_n)
    rows = -(-k.extent(m) // -(-BLOCKS_PER_CORE * ctx.arch.cores // panels))   # M cut for cores
    rows = -(-rows // -(-rows // MAX_TILE_M))        # pieces of equal rows, at most MAX_TILE_M
    step = lcm(thread_m, 8)              # a TILE_M the user can pin back (knobs.py's rule)
    tile_m = ctx.knob("TILE_M", -(-rows // step) * step)
    if tile_m % thread_m:
        raise KnobError(f"TILE_M={tile_m}, THREAD_M={thread_m}: the register tile must divide "
                        f"the block's rows")
    # M pieces fastest where M's last piece is short: each thread's run of blocks (OpenMP's static
    # schedule) then takes an equal share of it (512 rows as 240 + 240 + 32, N fastest, left one
    # of 2 threads 70% of the work); else N fastest, each thread's M-side rows staying in cache
    # (2048^3 as 3 x 528 + 464 rows 1.03x-1.09x, Zen 3)
    pieces = -(-k.extent(m) // tile_m)
    order = ctx.knob("ORDER", "nm" if pieces > 1 and 0 < k.extent(m) % tile_m < tile_m * 3 // 4
                     else "mn")
    return MatmulTile(m, n, tile_m, tile_n, thread_m, tile_n, serial=True, order=order)


def _fitted(rows: int, m: int) -> int:
    """The outer form's register-tile height for M rows: `rows`, or a lower one (above half) where
    `rows` leaves over a fifth of the tiles' rows past M, which a tile computes all the same: a
    decode step's GQA scores (8 query heads a KV head) as 6 + 2 rows computed 12; as 4 + 4, 1.09x
    to 1.31x faster (Zen 3, 2026-12-03; `strata tune --suite` found it on Zen 3 and Zen 4)."""
    padded = lambda h: -(-m // h) * h      # noqa: E731
    if m <= rows or padded(rows) * 5 <= m * 6:
        return max(1, min(rows, m))
    return min(range(rows, max(1, rows // 2), -1), key=lambda h: (padded(h), -h))


def _chunkable(k: TileKernel, c) -> bool:
    """Whether the outer form can run K in chunks over all of a block's register tiles: one K
    extent, and each M-side operand a plain f32 load (a computed one is packed per tile, for all
    of K)."""
    if len({l.extent for l in c.loops}) != 1:
        return False
    m_sides = [closure(l.body, sides(c, l)[0]) for l in c.loops]
    return all(len(a) == 1 and isinstance(a[0], Load) and k.dtype_of(a[0].buf) == "f32" for a in m_sides)


def _outer_chunk(c, mt: MatmulTile, ctx: Context) -> int:
    """K_CHUNK's default in the outer form: 0 (all of K) when the block's panels take at most a
    quarter of L2, else the multiple of 64 whose rows of one panel take a sixteenth of it (512 in
    2 MiB). Measured on the 2-core EMR, M=128, 6 x 4 tiles with PREFETCH: K=5632, N=2048 over
    chunks of 512 1.16x the unchunked 8 x 2 tiles (1.09x eager; chunks of 128 or 256 1.07x); the
    MLP's gate and up (two 512 KiB panels) 1.12x unchunked; a single K=2048 panel the same.
    """
    l2 = dict(ctx.arch.caches).get("L2", 1 << 19)
    if sum(l.extent for l in c.loops) * mt.tile_n * 4 <= l2 // 4 or ctx.arch.vector_registers < 32:
        return 0                        # (not measured with AVX2's 6 x 2 tiles)
    return max(64, l2 // 16 // (mt.tile_n * 4) // 64 * 64)


def _prefetch(c, mt: MatmulTile, chunk: int, ctx: Context) -> bool:
    """PREFETCH's default (codegen/c_outer.py prints it): on when the panel rows a block (or a K
    chunk of it) reads and the next one's fit in half of L2 together (fp32 128 x 2048 x 5632, a
    512 KiB panel: 1.05x; K=5632 unchunked, a 720 KiB one in a 2 MiB L2: 0.85x, 2-core EMR).
    Off with 16 vector registers (AVX2's 6 x 2 tiles): there the fp32 q, k and v projections at
    M=128 ran 1.04x to 1.18x faster without it (2-core Zen 3, `strata tune --suite`, 2026-11-27)."""
    rows = chunk or sum(l.extent for l in c.loops) // len(c.loops)
    panels = rows * len(c.loops) * mt.tile_n * 4
    return ctx.arch.vector_registers >= 32 and 2 * panels <= dict(ctx.arch.caches).get("L2", 1 << 19) // 2


def _pairable(k: TileKernel, c, loop: Loop) -> bool:
    """Whether FORM=pairs can run the loop: both operands bf16 loads (or an FP8 weight, packed
    into the bf16 panel exactly: contraction.bf16_exact), the M-side one contiguous along K (a
    pair is adjacent), K even."""
    a, b = (closure(loop.body, v) for v in sides(c, loop))
    return loop.extent % 2 == 0 and plain_bf16(k, a, loop.var) and len(b) == 1 \
        and isinstance(b[0], Load) and (k.dtype_of(b[0].buf) == "bf16" or bf16_exact(k, c, loop))


def _reduction(k: TileKernel, c, loop: Loop, mt: MatmulTile, n_edge):
    """One reduce loop's operands: the N-side panel it packs, and a function giving its K loop
    for one register tile (guarded at an M edge or not)."""
    a, b = sides(c, loop)
    b_side = closure(loop.body, b)
    dtype = dtypes.compute_dtype(value_dtype(b_side[-1]))
    panel = StageTile(f"{b}_panel", b, dtype, loop.var, loop.extent, c.n, mt.tile_n, "n0", b_side,
                      n_edge, fastest_axis(k, b_side, loop.var, c.n), mt.tile_n)
    accum = next(s for s in loop.body if isinstance(s, Accum))
    product_ = replace(accum, value=call("multiply", Var(a, dtype), Var(b, dtype)))
    read_panel = Load(b, panel.name, (Var(loop.var), sub(Var(c.n), Var("n0"))), dtype)
    a_side = closure(loop.body, a)
    a_dtype = dtypes.compute_dtype(value_dtype(a_side[-1]))
    plain = len(a_side) == 1 and isinstance(a_side[0], Load) and k.dtype_of(a_side[0].buf) == a_dtype

    def k_loop(m_edge) -> tuple:
        """The K loop of one register tile. An M-side operand that is computed (a prologue, a
        16-bit widening) is first packed for the tile as THREAD_M floats per K step: the C
        compiler vectorises the FMAs only over plain float loads."""
        pack = ()
        if plain:       # rows past M read row M - 1 (a masked load per point per K step
                        # kept gcc from vectorising the edge tile: M=16 ran 7x slower)
            step = a_side if m_edge is None else _clamped(a_side, c.m, k.extent(c.m), mt.thread_m)
        else:
            pack = (StageTile(f"{a}_rows", a, a_dtype, loop.var, loop.extent, c.m, mt.thread_m,
                              "m0", a_side, m_edge, fastest_axis(k, a_side, loop.var, c.m),
                              mt.thread_m),)
            step = (Load(a, pack[0].name, (Var(loop.var), sub(Var(c.m), Var("m0"))), a_dtype),)
        step += (read_panel, product_)
        return pack + (Registers(loop.accs),
                       replace(loop, accs=(), body=(Points(step, registers=True),)))
    return panel, k_loop


def _pair_reduction(k: TileKernel, c, loop: Loop, mt: MatmulTile, amx: bool = False):
    """FORM=pairs: one reduce loop's bf16 panel with K in pairs per column (each K step of a
    register tile then reads two K of a row and of the panel: codegen/c_pairs.py), and its K loop,
    over pairs, for one register tile (rows past M read row M - 1). FORM=amx: the same in the B-tile
    layout (`*_amx`: a name for the reader; Kernel IR's lower_cpu picks the form from FORM)."""
    a, b = sides(c, loop)
    b_side = _clamped(closure(loop.body, b), c.n, k.extent(c.n), mt.tile_n)
    name, fast = (f"{b}_amx", fastest_axis(k, b_side, loop.var, c.n)) if amx else (f"{b}_panel", "x")
    panel = StageTile(name, b, "bf16", loop.var, loop.extent // 2, c.n, mt.tile_n, "n0", b_side,
                      None, fast, 2 * mt.tile_n, pairs=True)

    def k_loop(m_edge) -> tuple:
        body = loop.body if m_edge is None else _clamped(loop.body, c.m, k.extent(c.m), mt.thread_m)
        steps = ()
        for h in (0, 1):
            at = {loop.var: call("add", call("multiply", Var(loop.var), Const(2)), Const(h))}
            column = call("add", call("multiply", sub(Var(c.n), Var("n0")), Const(2)), Const(h))
            for s in body:
                if isinstance(s, Load):
                    s = Load(b, panel.name, (Var(loop.var), column), "bf16") if s.var == b else \
                        replace(s, index=tuple(substitute(i, at) for i in s.index))
                steps += (rename_stmt(s, {x.var: f"{x.var}_{h}" for x in body
                                          if not isinstance(x, Accum)}),)
        return (Registers(loop.accs), replace(loop, extent=loop.extent // 2, accs=(),
                                              body=(Points(steps, registers=True),)))
    return panel, k_loop


def _clamped(stmts, axis: str, extent: int, tile: int) -> tuple:
    """stmts with the loads' `axis` coordinate clamped into the matrix when a tile overhangs it."""
    if extent % tile == 0:
        return stmts
    at = {axis: call("minimum", Var(axis), Const(extent - 1))}
    return tuple(replace(s, index=tuple(substitute(i, at) for i in s.index))
                 if isinstance(s, Load) and axis in depends((s,), {axis})[s.var] else s for s in stmts)


def _dot_tile(k: TileKernel, c, mt: MatmulTile) -> tuple:
    """FORM=dot: each reduce loop with its points' accumulators in registers, operands loaded in
    the K loop (edges clamped), which the C compiler vectorises along K. Reductions over the same
    K run as one loop (the MLP's gate and up: run in turn, the two weight tiles evicted each
    other from L1 and the kernel took 1.6x the time of two projections)."""
    loops = [replace(l, body=_clamped(_clamped(l.body, c.m, k.extent(c.m), mt.thread_m), c.n,
                                      k.extent(c.n), mt.tile_n)) for l in c.loops]
    if len(loops) > 1 and len({l.extent for l in loops}) == 1:
        one = {l.var: loops[0].var for l in loops}
        loops = [replace(loops[0], accs=sum((l.accs for l in loops), ()),
                         body=tuple(rename_stmt(s, one) for l in loops for s in l.body))]
    return sum(((Registers(l.accs), replace(l, accs=(), body=(Points(l.body, registers=True),)))
                for l in loops), ())


def cpu_matmul(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode is not Mode.ROWS:
        return k
    c = match(k)
    if isinstance(c, str) or c.m is None:
        why = c if isinstance(c, str) else "a matrix-vector product (rows of dot products read " \
            "each weight row once)"
        ctx.log(f"cpu_matmul: {k.name}: declined, {why}")
        return k
    form = cpu_form(k, c, ctx)
    if form == "pairs" and not (ctx.arch.has("avx512_bf16") and all(_pairable(k, c, l) for l in c.loops)) \
            or form == "amx" and not all(_pairable(k, c, l) for l in c.loops):
        form = "outer"                  # (no vdpbf16ps, f32, odd K, or PROLOGUE=fuse pinned)
    dot, amx = form == "dot", form == "amx"
    chunkable = form == "outer" and _chunkable(k, c)
    mt = _tiles(k, c, ctx, form, chunkable)
    n_edge = edge(c.n, k.extent(c.n), mt.tile_n)
    reductions = [] if dot else [_pair_reduction(k, c, loop, mt, amx) if form in ("pairs", "amx") else
                                 _reduction(k, c, loop, mt, n_edge) for loop in c.loops]
    epilogue = tuple(s for s in c.body if not isinstance(s, Loop))

    def register_tile(m_edge):
        """The K loops (one per reduction: the MLP's gate and up share a kernel) and the epilogue
        of one register tile, guarded at the edges given."""
        guard, last = conjoin(m_edge, n_edge), epilogue
        if guard is not None and epilogue:
            last = (Guard(guard, epilogue),)
        loops = _dot_tile(k, c, mt) if dot else sum((k_loop(m_edge) for _, k_loop in reductions), ())
        return loops + (Points(last, registers=True),)
    m_edge = edge(c.m, k.extent(c.m), mt.thread_m)
    if dot:         # loads clamped: one body for every tile, its stores guarded at the edges
        l1 = dict(ctx.arch.caches).get("L1", 32 * 1024)
        size = max(dtypes.ITEMSIZE[k.dtype_of(s.buf)] for l in c.loops for s in l.body if isinstance(s, Load))
        fits = l1 // (mt.tile_n * size * len(c.loops)) // 32 * 32
        chunk = ctx.knob("K_CHUNK", fits)
        one_k = len({l.extent for l in c.loops}) == 1      # the reductions share their chunks
        tiles = MicroTiles(mt.tile_m // mt.thread_m, register_tile(m_edge),
                           k_chunk=chunk if one_k and chunk < c.loops[0].extent else 0)
    elif chunkable and 0 < (chunk := ctx.knob("K_CHUNK", _outer_chunk(c, mt, ctx))) < c.loops[0].extent:
        tiles = MicroTiles(mt.tile_m // mt.thread_m, register_tile(m_edge), k_chunk=chunk)
    else:
        tiles = MicroTiles(mt.tile_m // mt.thread_m, register_tile(None),
                           register_tile(m_edge) if m_edge is not None else ())
    panels = tuple(panel for panel, _ in reductions)
    ctx.log(f"cpu_matmul: {k.name}: M={c.m}, N={c.n}, {mt.tile_m}x{mt.tile_n} per block, "
            f"{mt.thread_m}x{mt.tile_n} register tiles, " + (
                "dot products along K" if dot else f"the {c.loops[0].extent}x{mt.tile_n} panel"
                f"{'s' if len(panels) > 1 else ''} of {', '.join(p.value for p in panels)} packed"), 2)
    out = replace(k, mode=Mode.MATMUL, matmul=mt, body=(*panels, tiles), block=1, group=1)
    prefetch = ((("PREFETCH", ctx.knob("PREFETCH", _prefetch(c, mt, tiles.k_chunk, ctx))),)
                if form == "outer" else ())
    k_chunk = (("K_CHUNK", tiles.k_chunk),) if dot or tiles.k_chunk else ()
    for name, value in (("TILE_M", mt.tile_m), ("TILE_N", mt.tile_n), ("THREAD_M", mt.thread_m),
                        ("FORM", form), ("ORDER", mt.order)) + k_chunk + prefetch:
        out = out.with_knob(name, value)
    return out
