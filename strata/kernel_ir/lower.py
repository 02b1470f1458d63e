"""Tile IR -> Kernel IR: each kernel's lowering, chosen by its mode (the matmul, mma, wgmma and
attention ones in lower_*.py, all built on lowerer.py's Lowerer); rows and elementwise here.

Rows: `row` comes from blockIdx (and the thread's group when rows are packed into a block),
`t` is the thread's position in its group; a StridedLoop is `for (a = t; a < n; a += group)`;
a Combine is a butterfly of warp shuffles, then, for groups wider than a warp, one partial per
warp through shared memory and a second butterfly. Elementwise: one thread per VEC elements,
with a predicated tail when the domain does not fill the last block.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from math import prod

from ..core.expr import Const, Expr, Var, call, floordiv, mod, add, mul
from ..loop.ir import Store as LStore
from ..tile.attention import CombineTile
from ..tile.ir import TileKernel, TileProgram
from .ir import WARP, BlockIdx, Buffer, If, Kernel, KernelProgram, Let, Param, ThreadIdx
from .lower_attention import lower_attention_kernel
from .lower_attention_combine import lower_combine_kernel
from .lower_attention_cpu import lower_attention_cpu_kernel
from .lower_attention_mma import lower_attention_mma_kernel
from .lower_attention_wgmma import lower_attention_wgmma_kernel
from .lower_matmul import lower_matmul_kernel
from .lower_mma import lower_mma_kernel
from .lower_wgmma import lower_wgmma_kernel
from .lowerer import Lowerer, _vector_body, bind_domain
from .twins import tile_key, twin


MODES = {"mma": lower_mma_kernel, "wgmma": lower_wgmma_kernel, "matmul": lower_matmul_kernel}


def lower_kernel(tk: TileKernel) -> Kernel:
    if tk.mode == "custom":          # st.custom_op: the author's Kernel IR, on these buffers
        op = tk.body[0]
        return op.kernel.kernel_ir(tk.name, op.args, op.out,
                                   {b.name: (b.dtype, tuple(b.shape)) for b in tk.buffers})
    if tk.mode == "attention":      # flash attention (tile/attention.py), its split-KV combine
        if isinstance(tk.attention, CombineTile):
            return lower_combine_kernel(tk)
        lowering = {"mma": lower_attention_mma_kernel, "wgmma": lower_attention_wgmma_kernel,
                    "cpu": lower_attention_cpu_kernel, "cpu-bf16": lower_attention_cpu_kernel}
        return lowering.get(tk.attention.instr, lower_attention_kernel)(tk)
    if tk.mode in MODES:            # tensor cores (mma: sm_80+, wgmma: TMA, sm_90a); CUDA cores
        return MODES[tk.mode](tk)
    low = Lowerer(tk)
    idx = low.idx
    v = low.v
    body: list = []
    # a prelude the whole block reduces (block_prelude_reduce) syncs: before the bounds guard
    pre = low.stmts(tk.prelude)
    wide = any(getattr(s, "block_wide", False) for s in tk.prelude)
    body += pre if wide else []
    pre = [] if wide else pre
    t = Var(v["t"], idx)
    if tk.mode == "rows":
        per_block = tk.block // tk.group
        if per_block == 1:
            row: Expr = BlockIdx()
            body.append(Let(v["t"], idx, ThreadIdx()))
        else:
            body.append(Let(v["t"], idx, mod(ThreadIdx(), tk.group)))
            row = add(mul(BlockIdx(), per_block), floordiv(ThreadIdx(), tk.group))
        body.append(Let(v["row"], idx, row))
        bounds = {v["row"]: tk.rows}
        for var, e in bind_domain(Var(v["row"], idx), tk.domain, bounds):
            body.append(Let(var, idx, e))
        inner = pre
        for s in tk.body:
            # a row-level result is stored once per row, by the group's first thread
            if isinstance(s, LStore) and tk.group > 1:
                inner.append(If(call("eq", t, Const(0)), tuple(low.stmt(s))))
            else:
                inner.extend(low.stmt(s))
        if low.has_warp_ids:
            body += [Let(v["lane"], idx, mod(ThreadIdx(), WARP)), Let(v["warp"], idx, floordiv(ThreadIdx(), WARP))]
        if per_block > 1 and tk.rows % per_block:
            body.append(If(call("lt", Var(v["row"], idx), Const(tk.rows)), tuple(inner)))
        else:
            body += inner
    else:
        body.append(Let(v["gid"], idx, add(mul(BlockIdx(), tk.block), ThreadIdx())))
        n = tk.rows // tk.vec
        first = mul(Var(v["gid"], idx), tk.vec)
        bounds = {v["gid"]: n}
        binds = [Let(v, idx, e) for v, e in bind_domain(first, tk.domain, bounds)]
        inner = binds + pre + \
            (low.stmts(tk.body) if tk.vec == 1 else _vector_body(low, tk.body, tk.domain[-1][0], tk.vec))
        if n % tk.block:
            body.append(If(call("lt", Var(v["gid"], idx), Const(n)), tuple(inner)))
        else:
            body += inner
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes)
                   for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)


def lower(tp: TileProgram, finish=lambda k: k) -> KernelProgram:
    """`finish`: a last step (the CPU's forms) run on the first of twins only, then renamed."""
    lp = tp.loop_program
    buffers = [Buffer(b.name, b.dtype, b.shape, b.kind) for b in lp.buffers]
    known = {b.name for b in buffers}
    for tk in tp.kernels:           # temps a tile pass introduced (chunk_reduce's partials)
        for b in tk.buffers:
            if b.name not in known:
                known.add(b.name)
                buffers.append(Buffer(b.name, b.dtype, b.shape, b.kind))
    kernels, firsts, twins = [], {}, {}
    for tk in tp.kernels:           # a twin (kernel_ir/twins.py) is the first one renamed
        key = tile_key(tk)
        if key in firsts and firsts[key][0].name != tk.name:
            first, k = firsts[key]
            kernels.append(twin(k, first, tk))
            twins[tk.name] = first.name
            continue
        kernels.append(finish(replace(lower_kernel(tk), threads=dict(tk.knobs).get("THREADS", 0), knobs=tk.knobs)))
        firsts.setdefault(key, (tk, kernels[-1]))
    return KernelProgram(buffers, kernels, list(lp.outputs), twins, run_once(tp.kernels, buffers))


def run_once(kernels, buffers) -> tuple[str, ...]:
    """The PACK=once kernels (tile/passes/cpu_pack_weights.py) that read only weights and write
    only temps no other kernel writes: their results are constants."""
    kind = {b.name: b.kind for b in buffers}
    writers = Counter(w for tk in kernels for w in tk.writes)
    return tuple(tk.name for tk in kernels if dict(tk.knobs).get("PACK") == "once"
                 and all(kind[r] == "weight" for r in tk.reads)
                 and all(kind[w] == "temp" and writers[w] == 1 for w in tk.writes))
