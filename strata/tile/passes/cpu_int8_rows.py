"""cpu_int8_rows: a prefill's product by a block-quantized weight on int8 dot products.

Why: a matrix product (M > 1) whose N-side operand is dequantized (a QuantLinear's weight) ran
as a kernel storing the weight in bf16, then a bf16 GEMM (cpu_prologue). The GEMM runs near the
vdpbf16ps peak, but vpdpbusd does two to three times the work a cycle (Zen 5: 2841 against 1023
G/s), and llama.cpp's prefill multiplies int8 by int8 (issue 56). So where the CPU has
AVX512-VNNI, each reduction becomes a kernel of its own over groups of INT8_ROWS weight rows:
for each of the group's rows, for each of the M activation rows, the row's dot product over its
blocks, into an f32 temp [M, N]; then the contraction's epilogue reads those sums as a kernel of
rows. In that kernel the dot products are QuantRows as a decode step's (cpu_block_loops,
kernel_ir/lower_quant.py), so the simulator and the verifier see nothing new, and
kernel_ir/lower_quant_rows.py states the group's loops as one QuantRows form, which
codegen/c_int8_rows.py prints as preludes/c_int8_rows.h's kernel (activation rows as vpdpbusd's
lanes, the weights read as stored: no packing, no copy of the weight).

QGEMM=int8|bf16 pins the choice; int8 is the default where the CPU has AVX512-VNNI (and BW, VL)
but no AMX (whose bf16 tiles take the dequantized weight faster than vpdpbusd; AMX-INT8 rows are
not written yet), M >= MIN_M, M * N * K >= MIN_WORK, every reduction's N side is dequantized in
blocks of 32 (Q6_K's 16 keep the bf16 path), K a multiple of 32 and N of INT8_ROWS. Zen 5, 128 x
2048 x 5632 (`python -m strata.bench.quant_prefill`): q4_0 3.11 to 3.17 ms against 4.44 to 5.13
for the bf16 path, q8_0 3.25 to 3.49 against 4.68 to 5.41, q4_k 3.21 to 3.32 against 4.81 to 5.18.
The activations are rounded to int8 blocks of 32 as llama.cpp's and QDOT=vnni's rows round them
(about 0.6% of the output's norm; QGEMM=bf16 keeps the 16-bit path).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ... import dtypes
from ...context import Context
from ...expr import Const, Var, add, coefficient, evaluate, free_vars, mul, simplify
from ...loop.ir import BufferInfo, Load, Loop, Store
from ..contraction import closure, divisors, match, sides, split_prologues
from ..ir import TileKernel, flat_index, subst_body, walk

INT8_ROWS = 8               # weight rows a group (preludes/c_int8_rows.h's ST_IR)
MIN_M = 16                  # activation rows: fewer are a decode's, rows of dot products
MIN_WORK = 1 << 22          # multiply-adds: below, the activations' quantization and the extra
                            # kernel cost more than they save (16 x 256 x 64: 0.022 ms, bf16 0.011)
NEEDS = ("avx512_vnni", "avx512bw", "avx512vl")


def wanted(k: TileKernel, c, packed, ctx: Context) -> bool:
    """Whether the product takes int8 rows (module docstring)."""
    pinned = ctx.knob("QGEMM", "")
    default = all(map(ctx.arch.has, NEEDS)) and not ctx.arch.has("amx_bf16")
    if pinned == "bf16" or c.m is None or not (pinned == "int8" or default):
        return False
    m, n = k.extent(c.m), k.extent(c.n)
    others = [v for v, e in k.domain if e > 1 and v not in (c.m, c.n)]
    work = m * n * sum(l.extent for l in c.loops)
    return (m >= MIN_M and n % INT8_ROWS == 0 and not others and len(packed) == len(c.loops)
            and all(l.extent % 32 == 0 and len(l.accs) == 1 for l in c.loops)
            and (pinned == "int8" or work >= MIN_WORK and _blocks(packed) >= 32))


def _blocks(packed) -> int:
    """The smallest block the N sides' indices cut K into (`k // c`, `k % c`): Q6_K's 16 runs
    the kernel's float part twice as often, and measured 0.93x to 1.07x the bf16 path (Zen 5),
    so it keeps that unless pinned."""
    sizes = [c for loop, b, *_ in packed for s in closure(loop.body, b) if isinstance(s, Load)
             for i in s.index for c in divisors(simplify(i), loop.var)]
    return min(sizes, default=32)


def cpu_int8_rows(k: TileKernel, c, ctx: Context) -> tuple[TileKernel, ...]:
    """k as: its computed M-side operands stored in f32 (as cpu_prologue stores them), a kernel
    per reduction storing its sums, and k's epilogue reading them."""
    axes = {v for v, _ in k.domain}
    computed = []
    for loop in c.loops:
        a, b = sides(c, loop)
        side = closure(loop.body, a)
        if not (len(side) == 1 and isinstance(side[0], Load) and _rows(k, side[0], c.m, loop)):
            computed.append((loop, a, b, f"the M-side operand of {loop.accs[0].acc}", "f32"))
    firsts = ()
    if computed:
        *firsts, k = split_prologues(k, c, computed, "f32", axes, ctx, "cpu_int8_rows")
        c = match(k)
    m, n, m_ext, n_ext = c.m, c.n, k.extent(c.m), k.extent(c.n)
    group, row = f"{n}_g", f"{n}_r"
    at = {n: add(mul(Var(group), Const(INT8_ROWS)), Var(row))}
    sums, loaded = [], {}
    for i, loop in enumerate(c.loops):
        acc = loop.accs[0]
        out = BufferInfo(f"{k.name}_sums{i or ''}", (m_ext, n_ext), "f32", "temp")
        body = (Loop(row, INT8_ROWS, "free", (Loop(m, m_ext, "free", (
            loop, Store(out.name, (Var(m), Var(n)), Var(acc.acc, acc.dtype)))),)),)
        reads = tuple(r for r in k.reads if _reads(loop.body, r))
        groups = n_ext // INT8_ROWS
        sums.append(replace(k, name=f"{k.name}_int8{i or ''}", domain=((group, groups),),
                            body=subst_body(body, at, {group: groups, row: INT8_ROWS}),
                            reads=reads, writes=(out.name,),
                            buffers=tuple(b for b in k.buffers if b.name in reads) + (out,))
                    .with_knob("QGEMM", "int8"))
        loaded[id(loop)] = Load(acc.acc, out.name, (Var(m), Var(n)),
                                dtypes.compute_dtype(acc.dtype))
        ctx.log(f"cpu_int8_rows: {k.name}: {acc.acc} on int8 dot products by {sums[-1].name} into "
                f"{out.name} [{m_ext}, {n_ext}] f32")
    body = tuple(loaded.get(id(s), s) for s in c.body)
    temps = tuple(s.buffers[-1] for s in sums)
    keep = {r for r in k.reads if _reads(tuple(k.prelude) + body, r)}
    rest = replace(k, body=body, reads=tuple(b.name for b in temps) + tuple(r for r in k.reads if r in keep),
                   buffers=tuple(b for b in k.buffers if b.name in keep or b.name in k.writes) + temps)
    return (*firsts, *sums, rest.with_knob("QGEMM", "int8"))



def _rows(k: TileKernel, load: Load, m: str, loop: Loop) -> bool:
    """Whether `load` reads the activations as rows of K from the buffer's start (the layout the
    kernel quantizes): flat index m * K + k. Else they are stored so first (attention's output,
    head-major, before o_proj)."""
    flat = flat_index(load.index, k.shape_of(load.buf))
    zero = {v: np.int64(0) for v in free_vars(flat)}
    return coefficient(flat, loop.var) == 1 and coefficient(flat, m) == loop.extent and \
        free_vars(flat) <= {m, loop.var} and int(evaluate(flat, zero)) == 0


def _reads(body, buf: str) -> bool:
    return any(isinstance(s, Load) and s.buf == buf for s in walk(body))
