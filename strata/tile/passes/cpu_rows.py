"""cpu_rows: the CPU schedule of a kernel, after tileify: outer free axes split across cores,
the innermost axis a loop the C compiler vectorises.

A CPU target runs one thread per block (codegen/c.py): each block is one iteration of an OpenMP
parallel loop over the cores, and inner loops get `#pragma omp simd` (reductions with a vector
accumulator). So a rows kernel keeps its rows as blocks (GROUP=1, BLOCK=1: its reduce and free
loops run inside the block, vectorised), and an elementwise kernel becomes rows over all but its
innermost axis with that axis as an inner loop; a 1-D elementwise kernel is cut into CHUNK-long
rows when its length allows (CHUNK divides it), so both cores get work. A contraction that
cpu_matmul declined (a decode GEMV) stays rows of dot products: each weight row read once,
contiguously. Fused attention has no CPU schedule yet (fusion leaves it unfused on CPUs).
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...core.expr import Const, Var, add, call, mul, value_range
from ...loop.ir import Let, Load, Loop
from ..ir import Mode, TileKernel, map_body, walk

MIN_CHUNK = 1024        # elements per row of a 1-D elementwise kernel, at the least


def _chunk(extent: int, cores: int) -> int:
    """A divisor of `extent` giving one row per core or more, at least MIN_CHUNK long; extent
    itself (one row) when there is none."""
    for rows in range(max(2, cores), extent // MIN_CHUNK + 1):
        if extent % rows == 0:
            return extent // rows
    return extent


def cpu_rows(k: TileKernel, ctx: Context) -> TileKernel:
    """Schedule k (module docstring); every kernel it leaves gets the THREADS knob (0: the
    emitter runs the blocks on every core when there is enough work, else on one)."""
    if k.mode is Mode.MATMUL:
        return k.with_knob("THREADS", ctx.knob("THREADS", 0))
    return _read_anyway(_rows(k, ctx)).with_knob("THREADS", ctx.knob("THREADS", 0))


def _read_anyway(k: TileKernel) -> TileKernel:
    """A load taken only where a mask holds (a causal mask's scores), at an index that stays
    inside its buffer everywhere, is read unconditionally and then selected: its masked vector
    loads took 45% of a causal softmax row's time."""
    bounds = dict(k.domain) | {s.var: s.extent for s in walk(k.body) if isinstance(s, Loop)}

    def fn(s):
        if not isinstance(s, Load) or s.pred is None or any(
                r is None or r[0] < 0 or r[1] >= n for r, n in
                zip((value_range(e, bounds) for e in s.index), k.shape_of(s.buf))):
            return s
        return (replace(s, var=f"{s.var}_all", pred=None), Let(f"{s.var}_take", s.pred),
                Let(s.var, call("where", Var(f"{s.var}_take", "bool"), Var(f"{s.var}_all", s.dtype),
                                Const(0, s.dtype))))
    return replace(k, body=map_body(k.body, fn))


def _rows(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode is Mode.ROWS:
        return replace(k, group=1, block=1)
    if k.mode is not Mode.ELEMENTWISE:
        return k
    if not k.domain:                      # a single point
        return replace(k, mode=Mode.ROWS, group=1, block=1)
    *outer, (var, extent) = k.domain
    body = k.body
    if not outer:                         # 1-D: rows of CHUNK elements
        chunk = _chunk(extent, ctx.arch.cores)
        if chunk < extent:
            outer = [(f"{var}_row", extent // chunk)]
            body = (Let(var, add(mul(Var(f"{var}_row"), chunk), Var(f"{var}_col"))),) + body
            var, extent = f"{var}_col", chunk
    ctx.log(f"cpu_rows: {k.name}: {' x '.join(str(e) for _, e in outer) or 1} rows of a "
            f"{extent}-long inner loop", 2)
    return replace(k, mode=Mode.ROWS, domain=tuple(outer), body=(Loop(var, extent, "free", body),),
                   group=1, block=1)
