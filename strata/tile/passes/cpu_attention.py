"""cpu_attention: a CPU's schedule of a fused attention (loop/attention.py's `Attention`, which
loop/fuse.py plans on a CPU for prompts of CPU_FLASH_QUERIES or more): flash attention, one
thread a block of BLOCK_M queries, BLOCK_N keys a step (kernel_ir/lower_attention_cpu.py).

Why: as a matmul, a softmax and a matmul kernel, a long prompt's scores and weights go through
memory (1.2 GB a call at 2048 tokens and 32 heads). Here a block's scores stay in L1/L2, the key
loop stops at the block's causal limit, and only the diagonal and tail blocks pay for masks. The
two block products (k @ q^T: the scores transposed, so that each query's softmax runs along
vectors of queries; then p @ v) are register tiles of ROWS (AVX2: AVX2_ROWS) rows by `points`
columns that kernel_ir/lower_cpu.py runs as vector FMAs (OuterFma, FORM=outer: 4 x 64 on
AVX-512, 6 x 16 on AVX2), or for bf16 q, k, v on AVX512-BF16 as vdpbf16ps (PairsBf16,
FORM=pairs). Columns of no whole vector (BLOCK_M not a multiple of 16) run as written.

On AVX2 the tiles are 6 x 16 (12 of the 16 ymm registers accumulate, as in cpu_matmul) and the
blocks 48 queries by 96 keys: 1.08x over 4 x 16 and 64 x 64 at 2048 tokens, f32 and bf16 (Zen 3,
2026-12-03). Knobs: BLOCK_M and BLOCK_N, multiples of 4 (BLOCK_M 128 in bf16 from 512 queries on
AVX-512; the queries rounded up to 16 where fewer); rows past the last whole tile take one tile.
"""
from __future__ import annotations

from ...core.context import Context
from ...core.errors import KnobError
from ...loop.attention import attention_of, causal_limit
from ..attention import AttentionTile
from ..ir import TileKernel

ROWS, AVX2_ROWS = 4, 6      # rows of a register tile (AVX-512, AVX2)
BLOCK = 64                  # queries a block and keys a step, by default
AVX2_BLOCKS = (48, 96)      # ... where vectors are 32 bytes
WIDE_FROM = 512             # bf16 prompts from this many queries: blocks of 2 * BLOCK queries


def cpu_attention(k, ctx: Context, buffers: tuple):
    """The first CPU tile pass: a fused attention kernel gets its schedule; any other kernel
    passes through to tileify."""
    op = attention_of(k)
    if op is None:
        return k
    lanes = max(1, ctx.arch.vector_bytes // 4)
    points = lanes * (4 if ctx.arch.vector_bytes >= 64 else 2)
    bf16 = all(o.dtype == "bf16" for o in (op.q, op.k, op.v)) and ctx.arch.has("avx512_bf16")
    # bf16 from 512 queries: 128 a block, as V is transposed for each block of them (Zen 4, 2048
    # tokens: 97 -> 90 ms); below, the diagonal block's masked half costs more (128 queries 0.83x)
    wide = bf16 and op.i[1] >= WIDE_FROM
    narrow = ctx.arch.vector_bytes == 32             # AVX2: the class these were measured on
    rows = AVX2_ROWS if narrow else ROWS
    m, n = AVX2_BLOCKS if narrow else (BLOCK * (2 if wide else 1), BLOCK)
    bm = ctx.knob("BLOCK_M", min(m, -(-op.i[1] // 16) * 16))
    bn = ctx.knob("BLOCK_N", n)
    if bm % ROWS or bn % ROWS or bm <= 0 or bn <= 0:
        raise KnobError(f"BLOCK_M={bm}, BLOCK_N={bn}: a CPU attention needs both positive "
                        f"multiples of {ROWS}")
    at = AttentionTile(op, bm, bn, 1, causal=causal_limit(op), instr="cpu-bf16" if bf16 else "cpu",
                       points=points, tile_rows=rows)
    ctx.log(f"cpu_attention: {k.name}: {bm} queries x {bn} keys a step, one thread a block, "
            f"{at.grid} blocks, register tiles of {rows} x {points}"
            + (", bf16 on vdpbf16ps" if bf16 else ", f32 FMAs"), 2)
    tk = TileKernel(k.name, "attention", (*op.batch, op.i), (), (), block=1, reads=k.reads,
                    writes=k.writes, buffers=buffers, attention=at, src=k.src)
    for name, value in (("BLOCK_M", bm), ("BLOCK_N", bn), ("FORM", "pairs" if bf16 else "outer")):
        tk = tk.with_knob(name, value)
    return tk
