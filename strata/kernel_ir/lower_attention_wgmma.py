"""Tile IR -> Kernel IR for a fused attention on Hopper's warpgroup MMA (tile/attention.py,
INSTR=wgmma, sm_90a): lower_attention_mma.py's FlashAttention-2 with both products on wgmma.

Why: mma.sync reads every K and V fragment through ldmatrix into registers, a warp at a time;
wgmma reads K and V straight from shared memory for a whole warpgroup (64 rows) and runs at
twice the rate. Everything but the two products is the mma form's (its class is the base): the
block has BLOCK_M / 16 warps, warp w owns rows 16w .. 16w + 15, so warpgroup g owns 64g ..
64g + 63; a wgmma's accumulators sit where the mma form's fragments do (register i of the n8 tile
i // 4, element i % 4), so the masks and the online softmax on them are the mma form's.

S = Q K^T: m64nBLOCK_N k16 per 16 of the head dim, A = Q's fragments (ldmatrix, once, as in
the mma form) in registers, B = the K tile by descriptor (K-major). O = O * corr + P V: m64n{dv}
k16 per 16 keys, A = P's fragments packed from the scores in registers (PackHalf2), B = the V
tile by descriptor (MN-major: V is [key][e], read with the transpose bit). Each product is one
commit group waited for before its accumulators are read (a wgmma.fence after any ordinary
write of them or of the A registers).

K and V tiles are sub-tiles of 64 columns (128 bytes, `ceil64` of the head dims) by BLOCK_N
rows in the 128-byte swizzle: element (row r, column c) of sub-tile c // 64 at r * 64 +
((c % 64 // 8) ^ (r % 8)) * 8 + c % 8, each sub-tile and array 1024-byte aligned (dynamic shared
memory, aligned by the emitter; the simulator's addresses do the same), so they are not bound by
the 48 KB of static shared memory. Filled by cp.async where the rows are plain loads (two buffers
where the tile schedule made room: AttentionTile.kv_stages), element by element otherwise, as in
the mma form; either way ordinary writes, which each thread fences for wgmma's async proxy
(fence.proxy.async) before the barrier that publishes them.
"""
from __future__ import annotations

from ..core.expr import Const, Expr, add, call, floordiv, mod, mul
from ..tile.attention import ceil64
from ..tile.ir import TileKernel
from .ir import (Assign, FenceProxyAsync, Kernel, Let, Smem, Wgmma, WgmmaCommit, WgmmaDesc,
                 WgmmaFence, WgmmaWait)
from .lower_attention import _f
from .lower_attention_mma import F32, _MmaAttention
from .lower_mma import regs

ROW = 64                    # elements of one swizzled row: 128 bytes of a 16-bit type
SBO = 8 * 2 * ROW           # bytes between groups of 8 rows


def lower_attention_wgmma_kernel(tk: TileKernel) -> Kernel:
    return _WgmmaAttention(tk).kernel()


class _WgmmaAttention(_MmaAttention):
    def __init__(self, tk: TileKernel):
        op = tk.attention.op        # K and V tile widths, before the base asks double_buffered
        self.kw, self.vw = ceil64(op.d[1]), ceil64(op.e[1])
        super().__init__(tk)
        self.ep, self.et = self.vw, self.vw // 8    # O: whole swizzled rows (guarded at dv)

    def kv_tiles(self) -> tuple:
        return (("k_tile", "k", self.kw, self.d, self.dv_, self.kw),
                ("v_tile", "v", self.vw, self.dv, self.ev, self.vw))

    def double_buffered(self) -> bool:
        """Two K/V buffers where the tile schedule made room (AttentionTile.kv_stages) and every
        tile is a cp.async copy."""
        return self.at.kv_stages == 2 and self.copied_async()

    def q_tile(self) -> list:
        n = self.at.kv_stages
        body = [Smem("q_tile", self.dt, self.bm * self.QS),
                Smem("k_tile", self.dt, n * self.bn * self.kw, dynamic=True),
                Smem("v_tile", self.dt, n * self.bn * self.vw, dynamic=True)]
        return body + self.fill_rows("q_tile", self.op.q, self.dv_, self.d, self.dp, self.QS, "fa_qa")

    def state(self) -> list:
        """The base's, and the score accumulators declared once (every wgmma reads its d)."""
        return super().state() + [Let(v, F32, Const(0.0, F32)) for j in range(self.nt)
                                  for v in self.s(j)]

    def place(self, row: Expr, col: Expr) -> Expr:
        """Element (row, col) of a tile of 64-column swizzled sub-tiles of BLOCK_N rows."""
        c = mod(col, ROW)
        chunk = call("bitwise_xor", floordiv(c, 8), mod(row, 8))
        return add(add(mul(floordiv(col, ROW), self.bn * ROW), mul(row, ROW)),
                   add(mul(chunk, 8), mod(c, 8)))

    def landed(self) -> list:
        """wgmma reads shared memory through the async proxy: each thread's stores and cp.async
        copies of K and V are fenced for it before the barrier (the simulator fails without)."""
        return [FenceProxyAsync()]

    def scores(self, *_) -> list:
        """S = Q K^T: per 16 of the head dim one wgmma, K-major B at 32 bytes a step within a
        swizzled row, the next sub-tile every 4 steps; the first step overwrites S."""
        d = tuple(v for j in range(self.nt) for v in self.s(j))
        base = self.at_stage(self.kw)
        step: list = [WgmmaFence()]
        for kk in range(self.dp // 16):
            at = add(base, (kk // 4) * self.bn * ROW + (kk % 4) * 16)
            step.append(Wgmma(d, None, WgmmaDesc("k_tile", at, 16, SBO), self.bn, self.dt,
                              scale_d=Const(int(kk > 0), "i32"), a_regs=regs(f"fa_qa{kk}_", 4)))
        return step + [WgmmaCommit(), WgmmaWait(0)]

    def pv(self) -> list:
        """O = O * corr + P V: per 16 keys one wgmma, A = P's packed fragments, B = V MN-major
        (64-column sub-tiles LBO apart, 16 rows of 128 bytes a step)."""
        o = self.o
        step = [Assign(o(e)[r], call("multiply", _f(o(e)[r]), _f(f"fa_corr{r // 2}")))
                for e in range(self.et) for r in range(4)]
        d = tuple(v for e in range(self.et) for v in o(e))
        base = self.at_stage(self.vw)
        step.append(WgmmaFence())
        for kk in range(self.bn // 16):
            desc = WgmmaDesc("v_tile", add(base, kk * 16 * ROW), self.bn * 2 * ROW, SBO)
            step.append(Wgmma(d, None, desc, self.ep, self.dt, trans_b=True,
                              a_regs=regs(f"fa_pa{kk}_", 4)))
        return step + [WgmmaCommit(), WgmmaWait(0)]
