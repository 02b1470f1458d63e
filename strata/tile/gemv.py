"""A vector times a matrix of byte weights (Q8_0, Q4_0 ..., FP8) as rows read by 16-byte loads.

Why: the CUDA-core matmul stages every operand element into shared memory by a scalar load, so
a quantized weight was read a byte at a time (LDG.E.U8) and its fp16 scales two bytes at a
time. With one row of activations (decode) columns share nothing: each weight row (its slice
when K is split) goes to a group of GROUP <= 32 threads, each taking VEC points of K at a time
through the gather plan (tile/gather.py: whole 16-byte windows of the quants, of the activations,
and the aligned window around a block's scale), multiplying in registers; the group adds its
partials by warp shuffles. VEC is the shortest run (8 to 64 points) whose byte windows are
read whole: 16 for Q8_0 (one load of its bytes; its block's scale read by both halves), 32
for Q4_0 (one load of 32 nibbles), 8 for bf16 weights (one 16-byte load; a warp's 32 loads one
contiguous 512 bytes). Up to ROWS_MAX rows of activations (a few tokens at once) take
the same rows, one group per (weight row, activation row), the activation rows innermost so that
a weight row's groups sit in one block and its bytes come from DRAM once.
"""
from __future__ import annotations

from dataclasses import replace
from math import gcd

from ..core import dtypes
from ..core.context import Context
from .gather import Plan, full_windows, moving, plan
from .ir import Combine, StridedLoop, TileKernel

VECS = (8, 16, 32, 64)
GROUP_MAX = WARP = 32           # a row's group stays within a warp (shuffles only)


# rows of activations a byte GEMV takes (decode, a short draft): each row's group dequantizes
# the weights again, so CUDA-core work grows M-fold while the bytes do not; past 4 rows it would
# outrun the DRAM time of an H100 (estimated: Q4_0, 2048^2, 0.8 us of bytes against 0.4 us of
# dequantize-and-FMA a row), and the tensor cores' shared dequantization takes the product
ROWS_MAX = 4


def byte_vec(k: TileKernel, c, loop, wide: bool = False, vecs=VECS) -> int | None:
    """VEC when `loop` of contraction `c` (at most ROWS_MAX rows of activations) reads 1-byte
    weights (integer blocks, or FP8) that the gather plan can read whole, else None: the first
    of `vecs` that does. wide: also 2-byte float weights (bf16, fp16), which take these rows
    where INSTR=fma is pinned."""
    if c.m is not None and k.extent(c.m) > ROWS_MAX:
        return None
    loads = moving(loop.body, loop.var, k.shape_of)
    size = lambda b: dtypes.ITEMSIZE[k.dtype_of(b)]
    if not any(size(s.buf) == 1 and k.dtype_of(s.buf) != "bool" for s in loads) and not (
            wide and any(k.dtype_of(s.buf) in ("bf16", "f16") for s in loads)):   # or FP8
        return None
    bounds = {**dict(k.domain), loop.var: loop.extent}
    for vec in vecs:
        if loop.extent % vec == 0:
            p = plan(loads, k.shape_of, k.dtype_of, loop.var, vec, bounds)
            if isinstance(p, Plan) and full_windows(p, size):
                return vec
    return None


def row_vec(k: TileKernel, c, loop, ctx: Context) -> int | None:
    """byte_vec as this context schedules it: 2-byte float weights too where INSTR=fma is pinned
    (the CUDA cores), and a pinned VEC of 8 to 64 points (more 16-byte loads a step in flight)
    first, where its windows are whole; another pinned VEC is the vector width of other
    kernels."""
    vec = ctx.knob("VEC", 0)
    return byte_vec(k, c, loop, ctx.knob("INSTR", "") == "fma", (vec,) * (vec in VECS) + VECS)


def group_of(steps: int, rows: int) -> int:
    """Threads per row: a power of two, one per VEC-point step of the row at most, unless the
    rows would not fill whole warps (a partial warp's lanes would sit out its shuffles)."""
    g = 1
    while g * 2 <= min(steps, GROUP_MAX):
        g *= 2
    return max(g, WARP // gcd(rows, WARP))


def gemv_rows(k: TileKernel, c, ctx: Context) -> TileKernel | None:
    """The rows kernel of a byte GEMV, or None when `c` is not one."""
    if len(c.loops) != 1:
        return None
    (loop,) = c.loops
    vec = row_vec(k, c, loop, ctx)
    if vec is None:
        return None
    group = group_of(loop.extent // vec, k.rows)
    threads = k.rows * group
    fits = [b for b in (256, 128, 64) if -(-threads // b) >= ctx.arch.cores]
    block = ctx.knob("BLOCK", fits[0] if fits else 32)     # whole warps: any BLOCK fits
    body = []
    for s in c.body:
        if s is loop:
            body += [StridedLoop(loop.var, loop.extent, group, "reduce", loop.body, loop.accs,
                                 vec=vec), Combine(loop.accs, group)]
        else:
            body.append(s)
    ctx.log(f"tile_matmul: {k.name}: a vector times byte weights: rows of {group} threads, "
            f"{vec} points of K per thread and step, blocks of {block}", 2)
    # several rows of activations: their points of one weight row in neighbouring groups of a
    # block (M innermost), so the row's bytes come from DRAM once and from L1 for the others
    domain = tuple(d for d in k.domain if d[0] != c.m) + tuple(d for d in k.domain if d[0] == c.m)
    out = replace(k, domain=domain, body=tuple(body), group=group, block=block)
    return out.with_knob("GROUP", group).with_knob("VEC", vec).with_knob("BLOCK", block)
