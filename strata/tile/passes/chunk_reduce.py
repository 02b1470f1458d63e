"""chunk_reduce: split a reduction too long for one block into chunks reduced by separate blocks.

A row whose first statement is a long reduce loop (a sum over 1M elements, an amax over a 150k
vocabulary) would run on one block per row, leaving most of the GPU idle when rows are few; on a
CPU, where a block is a thread, fewer rows than cores leave cores idle (a whole-tensor sum of 256
MiB ran on one core at 13 GB/s, torch.sum on two at 21). The loop is cut into CHUNKS equal chunks:
a first kernel (`<name>_chunks`) reduces each (row, chunk) and writes one partial per accumulator
to a temp buffer; the original kernel then starts by combining the CHUNKS partials instead of
reading the whole row. CHUNKS divides the extent, so neither kernel needs a tail. Declines, saying
why, for argmax/argmin (partials would need indices), when the rows already fill the GPU, when the
reduction is short, or when the extent has no divisor giving chunks of at least CHUNK_MIN elements.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...core.expr import Var, add, mul
from ...loop.ir import Accum, BufferInfo, Load, Loop, Store
from ..ir import TileKernel, subst_body, walk
from ..split import choose_pieces

CHUNK_MIN = 4096             # below this a chunk is too little work for a block
CPU_CHUNK_MIN = 1 << 16      # a CPU block is a thread: a chunk must outweigh waking one (~3 us)


def chunk_reduce(k: TileKernel, ctx: Context):
    if k.mode != "rows" or not k.body or not isinstance(k.body[0], Loop) or k.body[0].kind != "reduce":
        return k
    loop = k.body[0]
    if any(a.op in ("argmax", "argmin") for a in loop.accs):
        ctx.log(f"chunk_reduce: {k.name}: declined, argmax/argmin partials would need their indices")
        return k
    least = ctx.knob("CHUNK_MIN", CHUNK_MIN if ctx.arch.is_gpu else CPU_CHUNK_MIN)
    chunks, why = choose_pieces(loop.extent, k.rows, ctx, "CHUNKS", least, "rows")
    if ctx.pinned("CHUNK_MIN") and not ctx.pinned("CHUNKS"):      # it decided CHUNKS
        k = k.with_knob("CHUNK_MIN", least)
    if chunks == 1:
        if why:
            ctx.log(f"chunk_reduce: {k.name}: declined, {why}")
        return k.with_knob("CHUNKS", 1) if ctx.pinned("CHUNKS") else k
    size = loop.extent // chunks
    c, a = f"{loop.var}_c", loop.var
    row_index = tuple(Var(v) for v, _ in k.domain)
    shape = tuple(e for _, e in k.domain) + (chunks,)
    partial = {acc.acc: BufferInfo(f"{k.name}_{acc.acc}_partial", shape, acc.dtype, "temp")
               for acc in loop.accs}

    # kernel 1: one row per (row, chunk); the loop covers this chunk only
    inner = subst_body(loop.body, {a: add(mul(Var(c), size), Var(a))}, {a: size, c: chunks})
    stores = tuple(Store(b.name, row_index + (Var(c),), Var(acc, b.dtype)) for acc, b in partial.items())
    reads = tuple(r for r in k.reads if _loads(k.prelude + (loop,), r))
    first = replace(k, name=f"{k.name}_chunks", domain=k.domain + ((c, chunks),),
                    body=(replace(loop, extent=size, body=inner),) + stores,
                    reads=reads, writes=tuple(b.name for b in partial.values()),
                    buffers=tuple(b for b in k.buffers if b.name in reads) + tuple(partial.values()))

    # kernel 2: the original row, starting from the partials
    loads = tuple(Load(f"{acc}_p", b.name, row_index + (Var(a),), b.dtype) for acc, b in partial.items())
    accums = tuple(Accum(init.acc, init.op, Var(f"{init.acc}_p", init.dtype)) for init in loop.accs)
    merged = replace(loop, extent=chunks, body=loads + accums)
    rest = k.body[1:]
    keep = {r for r in k.reads if _loads(k.prelude + rest, r)}
    second = replace(k, body=(merged,) + rest,
                     reads=tuple(b.name for b in partial.values()) + tuple(r for r in k.reads if r in keep),
                     buffers=tuple(b for b in k.buffers if b.name in keep or b.name in k.writes)
                     + tuple(partial.values()))
    ctx.log(f"chunk_reduce: {k.name}: {loop.extent} split into {chunks} chunks of {size}")
    return first.with_knob("CHUNKS", chunks), second.with_knob("CHUNKS", chunks)


def _loads(body, buf: str) -> bool:
    return any(isinstance(s, Load) and s.buf == buf for s in walk(body))
