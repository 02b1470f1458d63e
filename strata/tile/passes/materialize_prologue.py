"""materialize_prologue: on sm_90a, compute a contraction operand that has a prologue once, into
a 16-bit temp buffer, so that wgmma_tile (TMA copies tensors as they are) can take the kernel.

Why: in an LLM layer nearly every projection reads a computed operand (RMSNorm's normed x for
q/k/v and gate/up, SiLU(gate) * up for down); fused, wgmma_tile declines them all and Hopper
runs prefill on mma.sync. The kernel becomes two: `<name>_prologue` (elementwise over the
operand's axes and K) stores the operand, rounded to the 16-bit dtype eager holds it in (as
mma.sync rounds it on its way into shared memory) or to the FP8 dtype its prologue rounds it to
last (FP8Linear's activations), into the temp `<name>_operand`; the
contraction then loads that buffer plainly. Equal operands of several reductions share one.

PROLOGUE=fuse|materialize pins the choice (INSTR=wgmma alone does not: it still refuses a
prologue, so that the extra kernel is asked for). By default
an operand is materialized when it is small next to the other (at most 1/MAX_SHARE of its
bytes: activations against a weight, so the extra write and read are cheap) and the work is
big enough to want wgmma (M >= 64 and M*N*K >= MIN_WORK); an FP8 operand always (FP8 has no
tensor-core path but wgmma: fused, the product would run on CUDA cores), and on any GPU the
vector of a matrix-vector product rounded to FP8 last (FP8Linear's decode activations: stored
once in FP8, not divided and rounded again for every weight row; tile/gemv.py then reads both
by 16-byte loads). On any GPU too, a vector computed with a transcendental before byte (or,
INSTR=fma pinned, bf16) rows: SiLU(gate) * up before a Q4_0 down_proj (`_byte_gemv`). Declines,
saying why, off sm_90a, for a vector M side, INSTR=mma|fma pinned, and when wgmma would refuse.
"""
from __future__ import annotations

from math import prod

from ...core import dtypes
from ...core.context import Context
from ...loop.ir import Let, Load
from ...core.expr import nodes
from ...core.scalar_ops import TRANSCENDENTAL
from ..contraction import closure, depends, match, product, split_prologues, uses
from ..gemv import row_vec
from ..ir import TileKernel
from ..tensor_core import HALF, half_dtype, operands, tma_dims

MAX_SHARE = 4           # materialize an operand of at most a quarter of the other's bytes
MIN_WORK = 1 << 24      # multiply-adds below which mma.sync with the prologue fused is as good


def materialize_prologue(k: TileKernel, ctx: Context):
    if k.mode != "rows":
        return k
    c = match(k)
    if isinstance(c, str):
        return k                        # tile_matmul says why it is not a contraction
    out_half = all(k.dtype_of(w) in HALF for w in k.writes)
    found = []
    for loop in c.loops:
        got = operands(k, loop, c.m, c.n, out_half, fp8=True)
        if isinstance(got, str):
            return k                    # not for tensor cores: mma_tile says why
        found.append((loop, *got))
    computed = [(loop, op, other) for loop, _, a, b, _ in found
                for op, other in ((a, b), (b, a)) if not _plain(op)]
    if not computed:
        return k
    pinned = ctx.knob("PROLOGUE", "")
    instr = ctx.knob("INSTR", "")
    if ctx.arch.is_gpu and pinned != "fuse" and (byte := _byte_gemv(k, c, ctx)):
        return byte

    def decline(why: str, knob: bool = True):
        ctx.log(f"materialize_prologue: {k.name}: declined, {why}")
        return k.with_knob("PROLOGUE", "fuse") if knob else k
    fp8_vector = c.m is None and found[0][-1] in dtypes.FLOAT8 and ctx.arch.is_gpu
    if not ctx.arch.has("wgmma") and not fp8_vector:
        return decline(f"target {ctx.arch} has no wgmma (needs sm_90a)", knob=False)
    if pinned == "fuse" or instr in ("mma", "fma") and not fp8_vector:
        return decline(f"PROLOGUE=fuse pinned" if pinned == "fuse" else f"INSTR={instr} pinned")
    if c.m is None and not fp8_vector:
        return decline("its M side is a vector (one row): wgmma takes it neither way")
    if len({dt for *_, dt in found}) > 1:
        return decline("its reductions mix dtypes: wgmma takes it neither way")
    axes = {v for v, _ in k.domain}
    work = k.extent(c.m) * k.extent(c.n) * c.loops[0].extent if c.m else 0
    forced = pinned == "materialize" or found[0][-1] in dtypes.FLOAT8
    for loop, op, other in computed:
        deps = depends(loop.body, axes)
        mine, theirs = (prod(k.extent(v) for v in deps[x.value]) * loop.extent for x in (op, other))
        where = f"operand {op.side} of {loop.accs[0].acc}"
        if loop.extent % 8:
            return decline(f"{where}: K={loop.extent} rows would not be 16-byte aligned for TMA")
        if not forced and mine * MAX_SHARE > theirs:
            return decline(f"{where}: {mine} elements is not small next to the other operand's "
                           f"{theirs} (PROLOGUE=materialize pins it)")
        if not forced and (k.extent(c.m) < 64 or work < MIN_WORK):
            return decline(f"{where}: {k.extent(c.m)}x{k.extent(c.n)}x{loop.extent} is too small "
                           f"to want wgmma (PROLOGUE=materialize pins it)")
        defined = {s.var for s in (*k.prelude, *closure(loop.body, op.value))
                   if isinstance(s, (Load, Let))} | axes | {loop.var}
        outside = set().union(*map(uses, closure(loop.body, op.value))) - defined
        if outside:
            return decline(f"{where}: its prologue reads {sorted(outside)[0]}, computed before the row")
    for loop, _, a, b, _ in found:
        for op in (a, b):
            dims = tma_dims(k, op, loop.var, loop.extent) if _plain(op) else ()
            if isinstance(dims, str):
                return decline(f"operand {op.side} of {loop.accs[0].acc}: {dims}, so wgmma "
                               f"would decline it anyway")
    return split_prologues(k, c, [(loop, op.value, other.value, f"operand {op.side} of "
                                   f"{loop.accs[0].acc}") for loop, op, other in computed],
                           found[0][-1], axes, ctx, "materialize_prologue")


def _byte_gemv(k: TileKernel, c, ctx: Context):
    """A vector times byte weights (tile/gemv.py's rows) whose vector holds a transcendental
    (SiLU(gate) * up): fused, every weight row's threads compute all of it again (2048 x 5632
    exps for TinyLlama's down_proj); stored once in the dtype eager holds it in. Else None."""
    if len(c.loops) != 1 or not row_vec(k, c, c.loops[0], ctx):
        return None
    (loop,) = c.loops
    found = product(loop.body)
    if isinstance(found, str):
        return None
    (a, b, _), axes = found, {v for v, _ in k.domain}
    deps = depends(loop.body, axes)
    vector, weight = (a, b) if c.n not in deps[a] else (b, a)
    stmts = closure(loop.body, vector)
    if not any(getattr(x, "op", None) in TRANSCENDENTAL for s in stmts if isinstance(s, Let)
               for x in nodes(s.value)):
        return None
    dtype = half_dtype(k, stmts, all(k.dtype_of(w) in HALF for w in k.writes))
    return split_prologues(k, c, [(loop, vector, weight, "the vector of a byte GEMV")],
                           dtype if dtype in HALF else "f32", axes, ctx,
                           "materialize_prologue")


def _plain(op) -> bool:
    return len(op.body) == 1 and isinstance(op.body[0], Load)
