"""Tile IR -> Kernel IR for a Hopper contraction (mode "wgmma", see tile/passes/wgmma_tile.py).

blockIdx.x enumerates (batch axes..., M tile, N tile) as in lower_mma.py. Warpgroup g of the
block owns rows 64 g .. 64 g + 63 of the tile and all TILE_N columns: one wgmma m64nNk16 per 16
of K (k32 per 32 for FP8: 32 bytes either way), A and B read from shared memory through
descriptors (K-major: the swizzle of a TILE_K-element row; MN-major, for an operand contiguous
along M or N: boxes of 64 elements by TILE_K rows, 128B swizzle, read with wgmma's transpose
bit). Per `MmaLoop`, thread 0 issues the TMA copies of a K step's A and B tiles
into one of STAGES buffers (dynamic shared memory) and arms that buffer's mbarrier with their
bytes; every thread waits on the barrier with the parity of the buffer's use count, issues the
step's wgmmas (fence, commit), and once the step before is done (k_loop says when), after a
barrier, thread 0 refills that step's buffer with the tile STAGES steps ahead.
Accumulator d[4 j + r] of a thread sits where m16n8k16's C fragment r of 8-column tile j would
for warp tid / 32, so the epilogue is lower_mma.py's, run per element, guarded at the edges.
"""
from __future__ import annotations

from math import prod

from ..core import dtypes
from ..core.expr import Const, Var, add, call, floordiv, mod, mul
from ..tile.ir import MmaLoop, MmaOperand, TileKernel
from ..tile.tensor_core import mn_major, tma_dims
from .ir import (
    BlockIdx,
    FenceProxyAsync,
    For,
    If,
    Kernel,
    Let,
    MbarArrive,
    MbarInit,
    MbarWait,
    Param,
    Smem,
    Sync,
    TensorMap,
    ThreadIdx,
    TmaLoad,
    Wgmma,
    WgmmaCommit,
    WgmmaDesc,
    WgmmaFence,
    WgmmaWait,
)
from .lower_mma import MmaLowerer, regs
from .lowerer import bind_domain

EXTRA = ("wg", "stage", "da", "db", "bar")
MN_RUN = 64             # elements of an MN-major operand's contiguous run: one 128B-swizzle row


class _WgmmaLowerer(MmaLowerer):
    def __init__(self, tk: TileKernel):
        super().__init__(tk)
        taken = {b.name for b in tk.buffers}
        self.v.update({n: n if n not in taken else f"{n}_idx" for n in EXTRA})
        mt = self.mt
        self.item = dtypes.ITEMSIZE[mt.dtype]          # bytes of an element (2, or 1 for FP8)
        self.swizzle_bytes = self.item * mt.tile_k
        self.a_stage, self.b_stage = mt.tile_m * mt.tile_k, mt.tile_n * mt.tile_k
        self.maps: dict[str, TensorMap] = {}      # buffer -> its map (one per buffer: checked)
        self.axes: dict[tuple, tuple] = {}        # (K var, side) -> the axis of each coordinate
        self.mn: dict[tuple, bool] = {}           # (K var, side) -> MN-major
        for lp in self.loops:
            for op in (lp.a, lp.b):
                self.mn[lp.k_var, op.side] = mn_major(tk, lp, op)
                self.maps[op.body[0].buf], self.axes[lp.k_var, op.side] = self.tensor_map(op, lp)

    def acc(self, li: int, i: int, j: int) -> tuple[str, ...]:
        return self.d(li)[4 * j:4 * j + 4]

    def d(self, li: int) -> tuple[str, ...]:
        return regs(f"wd{li}_", self.mt.tile_n // 2)

    def bar(self, li: int) -> str:
        return f"{self.v['bar']}{li}"

    def tensor_map(self, op: MmaOperand, lp: MmaLoop):
        mt = self.mt
        dims = tma_dims(self.tk, op, lp.k_var, lp.extent)
        xtile = mt.tile_m if op.side == "A" else mt.tile_n
        if self.mn[lp.k_var, op.side]:      # boxes of MN_RUN x-contiguous elements by TILE_K
            box, swz = (MN_RUN, mt.tile_k), "128B"
        else:
            box, swz = (mt.tile_k, xtile), f"{self.swizzle_bytes}B"
        tm = TensorMap(tuple(e for _, e, _ in dims), tuple(self.item * c for _, _, c in dims[1:]),
                       box + (1,) * (len(dims) - 2), swz)
        return tm, tuple(v for v, _, _ in dims)

    def issue(self, li: int, lp: MmaLoop, kstep, stage) -> tuple:
        """Thread 0: arm the stage's barrier with the step's bytes and start the TMA copies: one
        box per K-major operand, TILE / 64 boxes (64 apart along X, MN_RUN * TILE_K elements
        apart in shared memory) per MN-major one."""
        mt = self.mt
        out = [MbarArrive(self.bar(li), stage, self.item * (self.a_stage + self.b_stage))]
        for op, size in ((lp.a, self.a_stage), (lp.b, self.b_stage)):
            buf = op.body[0].buf
            axes = self.axes[lp.k_var, op.side]
            runs = size // (MN_RUN * mt.tile_k) if self.mn[lp.k_var, op.side] else 1
            for j in range(runs):
                at = {lp.k_var: mul(kstep, mt.tile_k), op.x_var: add(self.origin(op), MN_RUN * j)}
                coords = tuple(at.get(v, Var(v, self.idx)) for v in axes)
                out.append(TmaLoad(self.smem_name(op), add(mul(stage, size), MN_RUN * mt.tile_k * j),
                                   buf, coords, self.bar(li), stage))
        return tuple(out)

    def desc(self, lp: MmaLoop, op: MmaOperand, at) -> tuple:
        """(descriptor, its advance per wgmma in 16-byte units, MN-major) of the operand's tile.
        K-major: rows of TILE_K elements, SBO 8 rows, +32 bytes per k16 (or FP8's k32). MN-major
        (PTX canonical ((8,8,m),(8,k)):((1,8,LBO),(64,SBO)) under the 128B swizzle): LBO between
        the 64-element X runs (one TMA box, MN_RUN * TILE_K elements), SBO between groups of 8
        K rows of 128 bytes, +16 rows of 128 bytes per k16."""
        if self.mn[lp.k_var, op.side]:
            return WgmmaDesc(self.smem_name(op), at, 2 * MN_RUN * self.mt.tile_k, 1024, "128B"), \
                128, True
        return WgmmaDesc(self.smem_name(op), at, 16, 8 * self.swizzle_bytes,
                         f"{self.swizzle_bytes}B"), 2, False

    def k_loop(self, li: int, lp: MmaLoop) -> list:
        """The K loop, U = 4, 2 or 1 steps a pass: a step's group stays in flight while the next
        one waits for its tile and issues (wait_group 1), and none past the pass (wait_group 0):
        ptxas serializes every wgmma (C7514) when a group is in flight across the back edge (the
        next step's mbarrier wait being a loop); within a pass the groups overlap."""
        mt, s = self.mt, lp.stages
        steps = -(-lp.extent // mt.tile_k)
        unroll = next(u for u in (4, 2, 1) if steps % u == 0) if s > 1 else 1
        i, is0 = self.var("kt"), call("eq", self.var("tid"), self.const(0))
        out: list = [Let(v, "f32", Const(0.0, "f32")) for v in self.d(li)]
        if li:
            out.append(Sync())              # the previous loop's wgmmas are done with the buffers
        out.append(If(is0, tuple(x for st in range(min(s, steps))
                                 for x in self.issue(li, lp, self.const(st), self.const(st)))))

        def refill(kt, stage) -> list:      # after a barrier: step kt's buffer gets step kt + s
            if steps <= s:
                return [Sync()]
            ok = call("logical_and", is0, call("lt", add(kt, s), self.const(steps)))
            return [Sync(), If(ok, self.issue(li, lp, add(kt, s), stage))]
        body, done = [], []
        for u in range(unroll):
            kt = add(mul(i, unroll), u) if unroll > 1 else i
            stage, da, db = (Var(f"{self.v[n]}{u if unroll > 1 else ''}", t)
                             for n, t in (("stage", self.idx), ("da", "i64"), ("db", "i64")))
            # warpgroup g's 64 rows of A: 64 K-major rows, or (MN-major) the g-th 64-element run
            a_desc, a_step, a_mn = self.desc(lp, lp.a, add(mul(stage, self.a_stage),
                                                           mul(self.var("wg"), 64 * mt.tile_k)))
            b_desc, b_step, b_mn = self.desc(lp, lp.b, mul(stage, self.b_stage))
            body += [Let(stage.name, self.idx, mod(kt, s)),
                     MbarWait(self.bar(li), stage, mod(floordiv(kt, s), 2)), WgmmaFence(),
                     Let(da.name, "i64", a_desc), Let(db.name, "i64", b_desc)]
            body += [Wgmma(self.d(li), add(da, Const(a_step * kk, "i64")),
                           add(db, Const(b_step * kk, "i64")), mt.tile_n, mt.dtype,
                           trans_a=a_mn, trans_b=b_mn) for kk in range(mt.tile_k * self.item // 32)]
            body += [WgmmaCommit()]
            if done:                        # the step before is done: its buffer is free
                body += [WgmmaWait(1)] + refill(*done)
            done = [kt, stage]
        body += [WgmmaWait(0)] + refill(*done)
        out.append(For(i.name, self.const(0), self.const(steps // unroll), 1, tuple(body),
                       dtype=self.idx))
        return out


def lower_wgmma_kernel(tk: TileKernel) -> Kernel:
    low = _WgmmaLowerer(tk)
    mt, idx = tk.matmul, low.idx
    tid = low.var("tid")
    body: list = [Let(tid.name, idx, ThreadIdx()),
                  Let(low.v["lane"], idx, mod(tid, 32)),
                  Let(low.v["warp_m"], idx, floordiv(tid, 32)),
                  Let(low.v["warp_n"], idx, low.const(0)),
                  Let(low.v["wg"], idx, floordiv(tid, 128))]
    tiles = [("bm", -(-tk.extent(mt.m) // mt.tile_m)), ("bn", -(-tk.extent(mt.n) // mt.tile_n))]
    block = dict(bind_domain(BlockIdx(), list(tk.batch) + tiles, {"blockIdx.x": tk.grid}))
    body += [Let(var, idx, block[var]) for var, _ in tk.batch]
    body += [Let(low.v["m0"], idx, mul(block["bm"], mt.tile_m)),
             Let(low.v["n0"], idx, mul(block["bn"], mt.tile_n))]
    stages = max(lp.stages for lp in low.loops)
    body += [Smem(low.v["a_smem"], mt.dtype, stages * low.a_stage, dynamic=True),
             Smem(low.v["b_smem"], mt.dtype, stages * low.b_stage, dynamic=True)]
    body += [Smem(low.bar(li), "i64", stages) for li in range(len(low.loops))]
    body += low.stmts(tk.prelude)
    inits = tuple(MbarInit(low.bar(li), low.const(st), 1) for li in range(len(low.loops))
                  for st in range(stages))
    body += [If(call("eq", tid, low.const(0)), inits + (FenceProxyAsync(),)), Sync()]
    for li, lp in enumerate(low.loops):
        body += low.k_loop(li, lp)
    body += [Let(low.v["lane_g"], idx, floordiv(low.var("lane"), 4)),
             Let(low.v["lane_t"], idx, mod(low.var("lane"), 4))]
    body += low.epilogue(tuple(s for s in tk.body if not isinstance(s, MmaLoop)))
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes,
                         tensor_map=low.maps.get(b.name))
                   for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)
