"""cpu_int8_rows: a prefill's product by a block-quantized weight on int8 dot products.

Why: such a product (M > 1, a QuantLinear's weight) ran as a kernel storing the weight in bf16,
then a bf16 GEMM (cpu_prologue), near the vdpbf16ps peak; vpdpbusd does two to three times the
work a cycle (Zen 5: 2841 against 1023 G/s), and llama.cpp's prefill multiplies int8 by int8
(issue 56). So each reduction becomes a kernel over groups of INT8_ROWS weight rows: for each
row, for each of the M activation rows, its dot product into an f32 temp [M, N], as a decode
step's QuantRows (cpu_block_loops, kernel_ir/lower_quant.py: nothing new to simulate or verify);
the epilogue reads the sums as rows. kernel_ir/lower_quant_rows.py states a group as one
QuantRows form, which codegen/c_int8_rows.py prints as preludes/c_int8_rows.h's kernel
(activation rows as vpdpbusd's lanes, the weights read as stored: no packing, no copy).

QGEMM=int8|bf16 pins the choice; int8 is the default where the CPU has AVX512-VNNI (and BW, VL),
or AVX2 without AVX-512 (vpmaddubsw: Zen 3), but no AMX (its bf16 tiles take the dequantized
weight faster; AMX-INT8 rows are not written), M >= MIN_M, M * N * K >= MIN_WORK, the N sides
dequantized in blocks of 16 or more, K a multiple of 32 and N of INT8_ROWS.
`python -m strata.bench.quant_prefill` measures it (Zen 5, 128 x 2048 x 5632: 1.4x to 1.7x the
bf16 path for blocks of 32, Q6_K's 16 1.1x to 1.2x). The activations are rounded to int8 blocks
of 32 as llama.cpp and QDOT=vnni round them (~0.6% of the output's norm).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...core import dtypes
from ...core.context import Context
from ...core.expr import Const, Var, add, coefficient, evaluate, free_vars, mul, simplify
from ...loop.ir import BufferInfo, Load, Loop, Store
from ..contraction import (closure, dequantized, divisors, held, match, sides, split_prologues,
                           value_dtype)
from ..ir import Mode, TileKernel, flat_index, subst_body, walk

INT8_ROWS = 8               # weight rows a group (preludes/c_int8_rows.h's ST_IR)
MIN_M = 16                  # activation rows: fewer are a decode's, rows of dot products
MIN_WORK = 1 << 22          # multiply-adds: below, the activations' quantization and the extra
                            # kernel cost more than they save (16 x 256 x 64: 0.022 ms, bf16 0.011)
NEEDS = ("avx512_vnni", "avx512bw", "avx512vl")
AVX2 = ("avx2", "fma", "f16c")      # without AVX-512: the kernel on vpmaddubsw (Zen 3, Haswell)


def cpu_int8_rows(k: TileKernel, ctx: Context):
    """k as: its computed M-side operands stored in f32 (as cpu_prologue stores them), a kernel
    per reduction storing its sums, and k's epilogue reading them; or k (module docstring)."""
    if k.mode is not Mode.ROWS or isinstance(c := match(k), str) or c.m is None:
        return k
    n_sides = [(loop, closure(loop.body, sides(c, loop)[1])) for loop in c.loops]
    if not all(len(side) > 1 and held(loop) == "bf16" and value_dtype(side[-1]) == "bf16" and
               dequantized(k, side) for loop, side in n_sides) or not _wanted(k, c, n_sides, ctx):
        return k                        # (no product by dequantized weights: cpu_prologue's)
    computed, firsts = [], ()
    for loop in c.loops:
        a, b = sides(c, loop)
        side = closure(loop.body, a)
        if not (len(side) == 1 and isinstance(side[0], Load) and _rows(k, side[0], c.m, loop)):
            computed.append((loop, a, b, f"the M-side operand of {loop.accs[0].acc}", "f32"))
    if computed:
        *firsts, k = split_prologues(k, c, computed, "f32", {v for v, _ in k.domain}, ctx,
                                     "cpu_int8_rows")
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


def _wanted(k: TileKernel, c, n_sides, ctx: Context) -> bool:
    """Whether the product, every N side a dequantized bf16 weight, takes int8 rows."""
    pinned = ctx.knob("QGEMM", "")
    has = ctx.arch.has
    default = (all(map(has, NEEDS)) or all(map(has, AVX2)) and not has("avx512f")) and not has("amx_bf16")
    if pinned == "bf16" or not (pinned == "int8" or default):
        return False
    m, n = k.extent(c.m), k.extent(c.n)
    others = [v for v, e in k.domain if e > 1 and v not in (c.m, c.n)]
    work = m * n * sum(l.extent for l in c.loops)
    return (m >= MIN_M and n % INT8_ROWS == 0 and not others
            and all(l.extent % 32 == 0 and len(l.accs) == 1 for l in c.loops)
            and (pinned == "int8" or work >= MIN_WORK and _blocks(n_sides) >= 16))


def _blocks(n_sides) -> int:
    """The smallest block the N sides' indices cut K into (`k // c`, `k % c`): below Q6_K's 16
    the kernel's float part (once a block) would outweigh its dot products."""
    sizes = [c for loop, side in n_sides for s in side if isinstance(s, Load)
             for i in s.index for c in divisors(simplify(i), loop.var)]
    return min(sizes, default=32)


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
