"""Tile IR for a fused attention (mode "attention"): the flash-attention schedule of one
loop/attention.py `Attention` statement.

A block takes BLOCK_M queries of one batch point; ROW_THREADS threads share each query, thread
g owning the head-dim elements d = g + ROW_THREADS * u of q and e = g + ROW_THREADS * u of the
output accumulator (registers). The keys are walked BLOCK_N at a time: the block stages that
block of K and V (operand prologues included, zero past Lk and past the head dim) in shared
memory, each query's group computes its BLOCK_N scores (partial dot products, then a butterfly
of warp shuffles), applies x (scale, masks), and does the online-softmax step: new running max,
rescale of the running sum and the accumulator by exp(m_old - m_new), accumulate p @ V.
After the last block out = acc / l. Nothing of size Lq x Lk is ever stored.

Knobs: BLOCK_M, BLOCK_N, ROW_THREADS (a power of two up to 32; BLOCK_M * ROW_THREADS is a
multiple of 32 and at most 1024). The scores of a key block sit in registers, so an mma version
replaces the dot products and the p @ V step and keeps the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .. import dtypes
from ..context import Context
from ..loop.attention import Attention, attention_of
from .ir import TileKernel

SMEM_LIMIT = 48 * 1024


def _pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class AttentionTile:
    op: Attention
    block_m: int
    block_n: int
    row_threads: int

    @property
    def d_per_thread(self) -> int:
        return -(-self.op.d[1] // self.row_threads)

    @property
    def e_per_thread(self) -> int:
        return -(-self.op.e[1] // self.row_threads)

    @property
    def m_blocks(self) -> int:
        return -(-self.op.i[1] // self.block_m)

    @property
    def grid(self) -> int:
        return prod(n for _, n in self.op.batch) * self.m_blocks

    @property
    def block(self) -> int:
        return self.block_m * self.row_threads

    def smem_bytes(self) -> int:
        g = self.row_threads
        k = self.block_n * self.d_per_thread * g * dtypes.ITEMSIZE[self.op.k.dtype]
        v = self.block_n * self.e_per_thread * g * dtypes.ITEMSIZE[self.op.v.dtype]
        return k + v


def default_schedule(op: Attention) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, ROW_THREADS): about 4 head-dim elements per thread, 256 threads a
    block (fewer for short queries: a decode row is one warp), 32 keys a step."""
    g = min(32, _pow2_ceil(-(-op.d[1] // 4)))
    lq = op.i[1]
    block_m = max(32 // g, min(_pow2_ceil(lq), 256 // g))
    return block_m, 32, g


def tile_attention(k, ctx: Context, buffers: tuple) -> TileKernel:
    """t:001 for a fused attention kernel: pick the block of queries, the key step and the
    threads per query (knobs), checking what the hardware allows."""
    op = attention_of(k)
    bm, bn, g = default_schedule(op)
    bm, bn, g = ctx.knob("BLOCK_M", bm), ctx.knob("BLOCK_N", bn), ctx.knob("ROW_THREADS", g)
    if g < 1 or g > 32 or g & (g - 1):
        raise ValueError(f"ROW_THREADS={g}: must be a power of two from 1 to 32")
    if bm < 1 or bn < 1 or (bm * g) % 32 or bm * g > 1024:
        raise ValueError(f"BLOCK_M={bm}, ROW_THREADS={g}: the block of BLOCK_M * ROW_THREADS "
                         f"threads must be a multiple of 32 and at most 1024")
    at = AttentionTile(op, bm, bn, g)
    if "BLOCK_N" not in ctx.knobs:
        while at.smem_bytes() > SMEM_LIMIT and at.block_n > 1:
            at = AttentionTile(op, bm, at.block_n // 2, g)
    if at.smem_bytes() > SMEM_LIMIT:
        raise ValueError(f"BLOCK_N={at.block_n}: the K and V tiles need {at.smem_bytes()} bytes "
                         f"of shared memory (more than {SMEM_LIMIT})")
    ctx.log(f"tile_attention: {k.name}: {at.block_m} queries x {at.block_n} keys per step, "
            f"{g} threads per query", 2)
    domain = (*op.batch, op.i)
    tk = TileKernel(k.name, "attention", domain, (), (), block=at.block, reads=k.reads,
                    writes=k.writes, buffers=buffers, attention=at, src=k.src)
    for name, value in (("BLOCK_M", at.block_m), ("BLOCK_N", at.block_n), ("ROW_THREADS", g)):
        tk = tk.with_knob(name, value)
    return tk


def format_attention_tile(k: TileKernel, out: list[str]) -> None:
    from ..loop.ir import format_stmt
    at = k.attention
    op, g = at.op, at.row_threads
    axes = ", ".join(f"{v}:{n}" for v, n in op.batch) + f", {op.i[0]}:{op.i[1]}=M"
    out.append(f"Tile(attention=({axes.lstrip(', ')}) = {at.block_m}/BLOCK, t:{at.block_m}x{g}"
               f"=QUERY x THREAD, grid={k.grid}, block={k.block}):")
    i, j, d, e = op.i[0], op.j[0], op.d[0], op.e[0]
    out.append(f"    q = Registers(q[{i}, {d} = t + {g} * u], {at.d_per_thread} per thread):")
    for s in op.q.body:
        format_stmt(s, 2, out)
    out.append(f"    m, l, acc = Registers(max -inf, sum 0, acc[{e} = t + {g} * u] 0; "
               f"{at.e_per_thread} per thread)")
    steps = -(-op.j[1] // at.block_n)
    out.append(f"    for {j}_o in 0..{steps}:  # key blocks of {at.block_n}")
    for name, o, ax in (("k", op.k, d), ("v", op.v, e)):
        out.append(f"        {name}_smem = StageTile({name}[{j}:{at.block_n}, {ax}:"
                   f"{-(-{'k': op.d, 'v': op.e}[name][1] // g) * g}] {o.dtype}, 0 past {op.j[1]}):")
        for s in o.body:
            format_stmt(s, 3, out)
    out.append("        Sync")
    out.append(f"        {op.score}[{at.block_n}] = Combine(sum over {d} of q * k_smem, threads={g})")
    out.append(f"        x[{at.block_n}] = -inf past {op.j[1]}, else:")
    for s in op.x.body:
        format_stmt(s, 3, out)
    out.append("        m_new = max(m, max(x)); c = exp(m - m_new); p = exp(x - m_new)  "
               "# -inf - -inf counts as 0")
    out.append("        l = l * c + sum(p); acc = acc * c + p @ v_smem; m = m_new")
    out.append("        Sync")
    zero = "0 where m == -inf, else " if op.safe else ""
    out.append(f"    {op.out}[{', '.join(str(x) for x in op.out_index)}] = {zero}acc / l")
