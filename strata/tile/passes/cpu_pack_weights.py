"""cpu_pack_weights: a CPU contraction's panel of a weight is packed by a kernel of its own,
for every block at once, into a buffer in the panel's layout; the contraction then reads its
panel from there (PACK=once, the default where the panel's values are a weight as stored).

Why: cpu_matmul's blocks each pack their K x TILE_N panel (AMX's and vdpbf16ps's K pairs, or
the outer form's columns) from the operand as it lies, a transposition of every weight on every
call. For a model's linear layers that is most of the time: a 128 x 2048 by 5632 bf16 linear on
AMX tiles took 6.9 ms with its packing and 2.3 ms without (one core, Emerald Rapids; eager 4.3).
A weight is a constant, so the packing kernel's result is one too: the program lists the kernel
as run once (KernelProgram.once) and the native runtime runs it when the program is loaded,
keeping the packed weight beside the others (runtime/native.py); every other runtime runs it per
call like any kernel, which is still correct.

A panel qualifies when its values are one load of a buffer of kind "weight" (no prologue), in
the panel's own dtype (no widening: a wider copy would cost more memory than it saves time; but
an FP8 weight in a bf16 panel, exact, which a matrix product then runs on vdpbf16ps: packed per
call, the 128 x 2048 by 5632 FP8Linear took 528 ms reading the weight across K), and
its index reads only K and N (no batch axis). The packed buffer `<weight>_amx` (`_panel` in the
other forms) is (ceil(N / TILE_N), K rows of the panel, the panel's row), so block n0's panel is
contiguous at n0 / TILE_N; columns past N repeat the last row (the points there are not stored).
PACK=call keeps the packing in the contraction.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...core import dtypes
from ...core.context import Context
from ...core.expr import Const, Var, add, call, evaluate, floordiv, free_vars, mod, mul, substitute
from ...loop.ir import BufferInfo, Load, Store
from ..ir import Mode, StageTile, TileKernel, map_body, walk

CHUNK_K = 16                # panel rows per step of the packing loop: each column's 16 rows are
                            # read along K, the strip of the block's columns written within L1


def _source(k: TileKernel, st: StageTile) -> Load | None:
    """The weight load a panel copies, or None when the panel is not a weight as stored."""
    if len(st.body) != 1 or not isinstance(st.body[0], Load) or st.x_var is None:
        return None
    load, info = st.body[0], {b.name: b for b in k.buffers}.get(st.body[0].buf)
    reads = set().union(*(free_vars(i) for i in load.index))
    width = st.x_extent * (2 if st.pairs else 1)
    if info is None or info.kind != "weight" or load.pred is not None \
            or info.dtype != st.dtype and not (info.dtype in dtypes.FLOAT8 and st.dtype == "bf16") \
            or not reads <= {st.k_var, st.x_var} or st.stride != width:
        return None
    return load


def _pack_kernel(k: TileKernel, st: StageTile, load: Load, name: str, buf: BufferInfo) -> TileKernel:
    """An elementwise kernel storing every block's panel: buf[b][kk][x (2x + h in pairs)]."""
    n = k.extent(st.x_var)
    column = add(mul(Var("pk_b"), Const(st.x_extent)), Var("pk_x"))
    if n % st.x_extent:
        column = call("minimum", column, Const(n - 1))
    chunk = CHUNK_K if st.k_extent % CHUNK_K == 0 else 1
    pairs = 2 if st.pairs else 1                # a row of the inner loop: `chunk` K (rows) of
    j = Var("pk_j")                             # one column, contiguous in the weight
    row = add(mul(Var("pk_ko"), Const(chunk)), floordiv(j, pairs))
    at = {st.k_var: add(mul(Var("pk_ko"), Const(chunk * pairs)), j), st.x_var: column}
    value = Load(load.var, load.buf, tuple(substitute(i, at) for i in load.index), load.dtype)
    x = add(mul(Var("pk_x"), Const(2)), mod(j, 2)) if st.pairs else Var("pk_x")
    domain = (("pk_b", buf.shape[0]), ("pk_ko", st.k_extent // chunk), ("pk_x", st.x_extent),
              ("pk_j", chunk * pairs))
    source = next(b for b in k.buffers if b.name == load.buf)
    return TileKernel(name, "elementwise", domain, (), (value, Store(buf.name, (Var("pk_b"), row, x),
                                                                       Var(load.var))),
                      reads=(load.buf,), writes=(buf.name,), buffers=(source, buf),
                      src=k.src).with_knob("PACK", "once")


def cpu_pack_weights(k: TileKernel, ctx: Context):
    if k.mode is not Mode.MATMUL or k.block != 1:
        return k
    panels = [(s, _source(k, s)) for s in k.body if isinstance(s, StageTile)]
    panels = [(s, load) for s, load in panels if load is not None]
    if not panels:
        return k
    if ctx.knob("PACK", "once") == "call":
        ctx.log(f"cpu_pack_weights: {k.name}: declined, PACK=call pinned")
        return k.with_knob("PACK", "call")
    firsts, moved = [], {}
    for i, (st, load) in enumerate(panels):
        suffix = st.name[len(st.value):]            # the panel's name for it: _panel, _amx
        blocks = -(-k.extent(st.x_var) // st.x_extent)
        # a panel of part of the weight (one projection of several merged into one weight,
        # tensor/merge_projections.py, read by a kernel of its own) is a buffer of its own
        origin = [int(evaluate(i, {v: np.zeros((), np.int64) for v in free_vars(i)}))
                  for i in load.index]
        part = "_at" + "_".join(map(str, origin)) if any(origin) else ""
        buf = BufferInfo(f"{load.buf}{part}{suffix}", (blocks, st.k_extent, st.stride), st.dtype,
                         "temp")
        firsts.append(_pack_kernel(k, st, load, f"{k.name}_pack{i or ''}", buf))
        moved[st.name] = (buf, st)
        ctx.log(f"cpu_pack_weights: {k.name}: the panel of {load.buf} packed for every block into "
                f"{buf.name} {list(buf.shape)} by {firsts[-1].name} (run once: a weight)")

    def read_packed(s):
        if isinstance(s, StageTile) and s.name in moved:
            return ()
        if isinstance(s, Load) and s.buf in moved:
            buf, st = moved[s.buf]
            return replace(s, buf=buf.name, index=(floordiv(Var(st.origin), st.x_extent), *s.index))
        return s
    body = map_body(k.body, read_packed)
    still = {s.buf for s in walk(tuple(k.prelude) + body) if isinstance(s, Load)}   # (a 0-d operand: in the prelude)
    news = tuple(b for b, _ in moved.values())
    out = replace(k, body=body, reads=tuple(b.name for b in news) + tuple(r for r in k.reads if r in still),
                  buffers=tuple(b for b in k.buffers if b.name in still or b.name in k.writes) + news)
    return (*firsts, out.with_knob("PACK", "once"))

