"""Tile IR -> Kernel IR for a fused attention on tensor cores (tile/attention.py, INSTR=mma):
FlashAttention-2 with mma.sync m16n8k16 (f16/bf16 in, f32 accumulate), sm_80+.

blockIdx.x enumerates (batch..., query block[, KV split]) as in lower_attention.py; the block
has BLOCK_M / 16 warps and warp w owns rows 16w .. 16w + 15 of the block (a row being a query,
or with GQA_GROUP > 1 a (head of the group, query) pair). Lane L holds, of every 16x8
accumulator tile, rows g and g + 8 (g = L / 4) and columns 2t, 2t + 1 (t = L % 4): the PTX C
layout, so each lane has two rows (h = 0, 1) and the four lanes of a row are L ^ 1, L ^ 2.

Shared memory, all in the mma dtype, rows padded by 8 elements (16 bytes): the Q tile
(BLOCK_M x d16, filled once, operand prologues included, 0 past Lq and past the head dim), its
A fragments then read once by ldmatrix into registers; per key block the K tile (BLOCK_N x d16)
and V tile (BLOCK_N x e16), 0 past Lk and past the head dims.

K and V tiles that are plain rows of 16-byte pieces are double-buffered where two fit
(`double_buffered`): the first key block's copies start before the loop, and each step waits for
its own, syncs (every warp is done with the other buffer) and starts the next block's copies into
that buffer before it computes, so a block's loads run under the previous block's products.

Per key block: fill K, V; Sync; S = Q K^T (ldmatrix.x4 of K, one mma per 16x8 tile and 16 of d);
x = the score expression per S element (scale, masks; -inf past Lk or Lq), only on the edge
blocks with the causal mask and bounds (key_range); the online softmax on the fragments: the
row max over the lane's elements and the 4 lanes of the row (two xor shuffles), m_use (0 for a
row with no finite score yet), corr = exp(m_old - m_use), p = exp(x - m_use), the lane's partial
row sum l = l * corr + sum p (the 4 partial sums are added once at the end); P's A fragments are
packed in registers from its C fragments (PackHalf2, rounded to the mma dtype: A fragment k of P
is the C fragments of n8 tiles 2k and 2k + 1, `p_fragment`); O (f32 C fragments over e) = O *
corr + P V with V by ldmatrix.trans; Sync before the refill. (P went through shared memory, a
Sync and ldmatrix before: 8 KB a key block at 64 x 64.)
At the end out = O / l, or the split's (m, l, O) partials for the combine kernel.
The sum form (a backward's gradients, loop/attention.py) has no softmax: P = x (0 past the
ends), O += P V, out = O; its second score T = Q2 K2^T is a second set of fragments from Q2 and
K2 tiles, filled as Q's and K's are.
"""
from __future__ import annotations

from math import prod

from ..core import dtypes
from ..core.expr import Const, Expr, Var, add, call, floordiv, mod, mul, sub
from ..core.targets import STATIC_SMEM_BYTES
from ..tile.attention import MMA_PAD, ceil16
from ..tile.ir import TileKernel, flat_index
from .ir import Assign, CpAsyncWait, For, If, Kernel, LdMatrix, Let, Mma, PackHalf2, Param, \
    ShflXor, Smem, Store, Sync, ThreadIdx
from .lowerer import Lowerer
from .lower_attention import (NEG_INF, _and, _f, _guarded, block_origin, bound_load,
                              cp_async_source, fill_kv, key_range, operand, rescale,
                              unmasked_scores)
from .lower_mma import regs

F32 = "f32"
LOG2E = 1.4426950408889634


def p_fragment(kk: int) -> tuple[tuple[int, int, int], ...]:
    """The A fragment of P for keys 16kk .. 16kk + 15, register by register, as (score tile,
    its element for the low half, for the high half): a0 and a1 are rows g and g + 8 of keys
    2t, 2t + 1 (tile 2kk's c0 c1 and c2 c3), a2 and a3 the same of tile 2kk + 1 (keys 8 on).
    The C layout of two n8 tiles is the A layout of one k16 tile (a test breaks this on purpose
    and expects wrong answers)."""
    return ((2 * kk, 0, 1), (2 * kk, 2, 3), (2 * kk + 1, 0, 1), (2 * kk + 1, 2, 3))


def lower_attention_mma_kernel(tk: TileKernel) -> Kernel:
    return _MmaAttention(tk).kernel()


class _MmaAttention:
    """One kernel's lowering, step by step (the module docstring says what each step computes);
    the lane's registers are named fa_* and live across the steps."""

    def __init__(self, tk: TileKernel):
        self.tk, self.at = tk, tk.attention
        at = self.at
        self.op, self.bm, self.bn, self.splits = at.op, at.block_m, at.block_n, at.kv_splits
        self.dt = self.op.q.dtype
        self.low = Lowerer(tk)
        self.idx = self.low.idx
        (self.iv, self.lq), (self.jv, self.lk), (self.dv_, d), (self.ev, dv) = \
            self.op.i, self.op.j, self.op.d, self.op.e
        self.d, self.dv = d, dv
        self.dp, self.ep = ceil16(d), ceil16(dv)
        self.QS, self.KS = self.dp + MMA_PAD, self.dp + MMA_PAD
        self.VS = self.ep + MMA_PAD
        self.qb = at.q_per_block
        self.nt, self.et = self.bn // 8, self.ep // 8    # score tiles, output tiles per warp row block
        self.softmax_form = self.op.norm != "sum"
        self.d2 = self.op.d2[1] if self.op.d2 else 0     # the sum form's second score's head dim
        self.d2p = ceil16(self.d2) if self.d2 else 0
        self.Q2S = self.K2S = self.d2p + MMA_PAD
        self.lane_g, self.lane_t = self.I("fa_g"), self.I("fa_t")
        self.mi, self.r8 = self.I("fa_mi"), self.I("fa_r8")
        self.wrow = mul(self.I("fa_warp"), 16)
        self.origin, self.kv_ops = block_origin(self.at, self.idx)
        self.pipelined = self.double_buffered()
        self.stage = self.I("fa_stage")             # which K/V buffer a key block reads

    def I(self, name: str) -> Var:
        return Var(name, self.idx)

    def kernel(self) -> Kernel:
        tk = self.tk
        body = self.lanes()
        body += self.q_tile()
        body += self.state()
        self.unmasked = unmasked_scores(self.at)
        body += bound_load(self.low, self.at)
        body += key_range(self.at, self.I, self.idx)
        if self.pipelined:          # the first key block's copies, in flight before the loop
            body.append(If(call("lt", self.I("kv_lo"), self.I("kv_hi")), tuple(
                self.fill(True, self.I("kv_lo"), 0, wait=False))))
        body.append(For("j0", self.I("kv_lo"), self.I("kv_mid"), self.bn, tuple(self.key_step(False)),
                        dtype=self.idx))
        body.append(For("j0", self.I("kv_mid"), self.I("kv_hi"), self.bn, tuple(self.key_step(True)),
                        dtype=self.idx))
        body += self.outputs()
        params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes) for b in tk.buffers)
        return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)

    # ------------------------------------------------------------ rows and lanes

    def row_coords(self, row: Expr) -> list:
        """Lets of the query (and head) of block row `row`."""
        at, I, idx = self.at, self.I, self.idx
        if at.group > 1:
            hg = f"{at.head}_grp"
            return [Let(at.head, idx, add(mul(I(hg), at.group), floordiv(row, self.qb))),
                    Let(self.iv, idx, add(mul(I("q_blk"), self.qb), mod(row, self.qb)))]
        return [Let(self.iv, idx, add(mul(I("q_blk"), self.bm), row))]

    def row_ok(self, query: Expr):
        return call("lt", query, Const(self.lq)) if self.lq % self.qb or self.qb > self.lq else None

    def lane_row(self, h: int) -> list:
        out = [Let(self.iv, self.idx, self.I(f"fa_i{h}"))]
        if self.at.group > 1:
            out.insert(0, Let(self.at.head, self.idx, self.I(f"fa_h{h}")))
        return out

    def lanes(self) -> list:
        """The lane's ids, the block's origin and this lane's two rows as plain registers."""
        at, I, idx = self.at, self.I, self.idx
        body: list = [Let("fa_tid", idx, ThreadIdx()), Let("fa_lane", idx, mod(I("fa_tid"), 32)),
                      Let("fa_warp", idx, floordiv(I("fa_tid"), 32)),
                      Let("fa_g", idx, floordiv(I("fa_lane"), 4)), Let("fa_t", idx, mod(I("fa_lane"), 4)),
                      Let("fa_mi", idx, floordiv(I("fa_lane"), 8)), Let("fa_r8", idx, mod(I("fa_lane"), 8))]
        body += self.origin
        for h in (0, 1):
            row = add(add(self.wrow, self.lane_g), 8 * h)
            if at.group > 1:
                body.append(Let(f"fa_h{h}", idx, add(mul(I(f"{at.head}_grp"), at.group),
                                                     floordiv(row, self.qb))))
                body.append(Let(f"fa_i{h}", idx, add(mul(I("q_blk"), self.qb), mod(row, self.qb))))
            else:
                body.append(Let(f"fa_i{h}", idx, add(mul(I("q_blk"), self.bm), row)))
        return body

    def a_row(self, tile_stride: int, col0: int) -> Expr:
        """ldmatrix.x4 row address of an A fragment (rows of the warp, columns col0..col0+15):
        matrix mi covers rows 8 * (mi % 2) and columns 8 * (mi // 2)."""
        mi = self.mi
        r = add(add(self.wrow, mul(mod(mi, 2), 8)), self.r8)
        return add(mul(r, tile_stride), add(col0, mul(floordiv(mi, 2), 8)))

    # ------------------------------------------------------------ Q, once

    def q_tile(self) -> list:
        """The shared tiles, Q (and the sum form's Q2) filled for the block's rows and read into
        A fragments."""
        bm, bn, dt, dp, d, QS = self.bm, self.bn, self.dt, self.dp, self.d, self.QS
        n = 2 if self.pipelined else 1
        body = [Smem("q_tile", dt, bm * QS), Smem("k_tile", dt, n * bn * self.KS),
                Smem("v_tile", dt, n * bn * self.VS)]
        if self.d2:
            body += [Smem("q2_tile", dt, bm * self.Q2S), Smem("k2_tile", dt, n * bn * self.K2S)]
        body += self.fill_rows("q_tile", self.op.q, self.dv_, d, dp, QS, "fa_qa")
        if self.d2:
            body += self.fill_rows("q2_tile", self.op.q2, self.op.d2[0], self.d2, self.d2p, self.Q2S,
                                   "fa_q2a")
        return body

    def fill_rows(self, tile: str, o, ax: str, d: int, dp: int, QS: int, frag: str) -> list:
        """A row operand's tile (q, or the second score's q2) filled for the block's rows and
        read into A fragments `frag`."""
        I, idx = self.I, self.idx
        body = []
        f = I("fa_qf")
        qrow, qx = I("fa_qrow"), I("fa_qx")
        fill = [Let("fa_qrow", idx, floordiv(f, dp)), Let("fa_qx", idx, mod(f, dp))]
        inner = self.row_coords(qrow)
        ok = _and(self.row_ok(I(self.iv)), call("lt", qx, Const(d)) if dp > d else None)
        compute = operand(self.low, o, [Let(ax, idx, qx)], "fa_qval", True)
        compute.append(Store(tile, add(mul(qrow, QS), qx), _f("fa_qval")))
        inner += _guarded(ok, compute, [Store(tile, add(mul(qrow, QS), qx), Const(0.0, F32))]) \
            if ok is not None else compute
        fill += _guarded(None, inner)
        body.append(For("fa_qf", ThreadIdx(), Const(self.bm * dp), self.tk.block, tuple(fill), dtype=idx))
        body.append(Sync())
        for kk in range(dp // 16):
            body.append(LdMatrix(regs(f"{frag}{kk}_", 4), tile, self.a_row(QS, 16 * kk)))
        return body

    def o(self, e: int) -> tuple:
        return regs(f"fa_o{e}_", 4)

    def state(self) -> list:
        """The running max and sum of each row, and O, all zero (max: -inf)."""
        body = []
        for h in (0, 1) if self.softmax_form else ():
            body += [Let(f"m_run{h}", F32, NEG_INF), Let(f"l_run{h}", F32, Const(0.0, F32))]
        return body + [Let(v, F32, Const(0.0, F32)) for e in range(self.et) for v in self.o(e)]

    # ------------------------------------------------------------ one key block

    def kv_tiles(self) -> tuple:
        tiles = [("k_tile", "k", self.dp, self.d, self.dv_, self.KS),
                 ("v_tile", "v", self.ep, self.dv, self.ev, self.VS)]
        if self.d2:
            tiles.append(("k2_tile", "k2", self.d2p, self.d2, self.op.d2[0], self.K2S))
        return tuple(tiles)

    def copied_async(self) -> bool:
        """Whether every K/V tile is a cp.async copy (its rows plain 16-byte pieces)."""
        return all(cp_async_source(self.low, self.kv_ops[w], ax, width, extent, stride)
                   for _, w, width, extent, ax, stride in self.kv_tiles())

    def double_buffered(self) -> bool:
        """Two buffers of each K/V tile where every tile is a cp.async copy and both fit in
        static shared memory beside Q's tiles; not in the sum form (a backward's gradients:
        its dv kernel spilled with them, at 128 registers)."""
        if not self.softmax_form or not self.copied_async():
            return False
        elems = self.bm * self.QS + (self.bm * self.Q2S if self.d2 else 0) \
            + 2 * sum(self.bn * stride for *_, stride in self.kv_tiles())
        return elems * dtypes.ITEMSIZE[self.dt] <= STATIC_SMEM_BYTES

    def key_step(self, edge: bool) -> list:
        """One key block. Double-buffered: wait for this block's copies, Sync (every warp done
        with the other buffer), start the next block's copies into it, then compute."""
        if self.pipelined:
            nxt = add(self.I("j0"), self.bn)
            step = [Let("fa_stage", self.idx, mod(floordiv(sub(self.I("j0"), self.I("kv_lo")),
                                                           self.bn), 2)),
                    CpAsyncWait(0), *self.landed(), Sync(),
                    If(call("lt", nxt, self.I("kv_hi")), tuple(self.fill(
                        True, nxt, sub(Const(1, self.idx), self.stage), wait=False)))]
        else:
            step = self.fill(edge) + self.landed() + [Sync()]
        step += self.scores()
        if self.d2:
            step += self.scores("fa_t", "fa_q2a", "k2_tile", self.K2S, self.d2p, "fa_k2b")
        step += self.masked(edge)
        step += self.softmax() if self.softmax_form else []
        step += self.pv()
        if self.softmax_form:
            step += [Assign(f"m_run{h}", _f(f"fa_mx{h}")) for h in (0, 1)]
        return step if self.pipelined else step + [Sync()]

    place = None        # where a K/V element sits in its tile: rows of `stride` (fill_kv's default)

    def fill(self, edge: bool, j0: Expr | None = None, stage: Expr | int = 0,
             wait: bool = True) -> list:
        """The K/V tiles of the key block at j0 (lower_attention.fill_kv), into buffer `stage`."""
        return fill_kv(self.low, self.at, self.kv_ops, self.kv_tiles(), edge, self.tk.block, True,
                       j0, stage, wait, place=self.place)

    def landed(self) -> list:
        """What each thread does once its K/V copies have landed, before the barrier (nothing:
        mma.sync reads shared memory as ordinary loads do)."""
        return []

    def at_stage(self, stride: int) -> Expr:
        """Where the current key block's buffer of a K/V tile with rows of `stride` starts."""
        return mul(self.stage, self.bn * stride) if self.pipelined else Const(0, self.idx)

    def s(self, j: int, name: str = "fa_s") -> tuple:
        return regs(f"{name}{j}_", 4)

    @staticmethod
    def xs(j: int, r: int) -> str:
        return f"fa_x{j}_{r}"

    def scores(self, name: str = "fa_s", qa: str = "fa_qa", tile: str = "k_tile", KS: int = 0,
               dp: int = 0, kb_name: str = "fa_kb") -> list:
        """S = Q K^T (or the sum form's second score T = Q2 K2^T): ldmatrix.x4 of K, one mma per
        16x8 tile and 16 of d."""
        mi, r8, KS, dp = self.mi, self.r8, KS or self.KS, dp or self.dp
        s = lambda j: self.s(j, name)
        step = [Let(v, F32, Const(0.0, F32)) for j in range(self.nt) for v in s(j)]
        for kk in range(dp // 16):
            for jp in range(self.nt // 2):
                # B = K^T, K stored [key][d] (K-major): matrix mi covers keys 8 * (mi // 2), d 8 * (mi % 2)
                r = add(add(16 * jp, mul(floordiv(mi, 2), 8)), r8)
                addr = add(add(mul(r, KS), add(16 * kk, mul(mod(mi, 2), 8))), self.at_stage(KS))
                kb = regs(f"{kb_name}{kk}_{jp}_", 4)
                step.append(LdMatrix(kb, tile, addr))
                step.append(Mma(s(2 * jp), regs(f"{qa}{kk}_", 4), kb[:2], s(2 * jp), self.dt))
                step.append(Mma(s(2 * jp + 1), regs(f"{qa}{kk}_", 4), kb[2:], s(2 * jp + 1), self.dt))
        return step

    def masked(self, edge: bool) -> list:
        """x = the score expression per S element (-inf past Lk or Lq on an edge block)."""
        op, I, idx = self.op, self.I, self.idx
        step = []
        for j in range(self.nt):
            for r in range(4):
                h = r // 2
                # a key past the end weighs nothing: -inf before a softmax, 0 in the sum form
                step.append(Let(self.xs(j, r), F32, NEG_INF if self.softmax_form else Const(0.0, F32)))
                key = add(add(I("j0"), 8 * j), add(mul(self.lane_t, 2), r % 2))
                ok = _and(self.row_ok(I(f"fa_i{h}")), call("lt", key, Const(self.lk)) if edge else None)
                binds = self.lane_row(h) + [Let(self.jv, idx, key), Let(op.score, F32, _f(self.s(j)[r]))]
                if self.d2:
                    binds.append(Let(op.score2, F32, _f(self.s(j, "fa_t")[r])))
                step += _guarded(ok, operand(self.low, op.x, binds, self.xs(j, r), False,
                                             op.x.body if edge else self.unmasked))
        return step

    def softmax(self) -> list:
        """The online softmax on the fragments; P at its C-fragment place in shared memory."""
        xs, step = self.xs, []
        for h in (0, 1):
            mx = f"fa_mx{h}"
            step.append(Let(mx, F32, _f(f"m_run{h}")))
            step += [Assign(mx, call("maximum", _f(mx), _f(xs(j, r)))) for j in range(self.nt)
                     for r in (2 * h, 2 * h + 1)]
            for m in (1, 2):
                step.append(Assign(mx, call("maximum", _f(mx), ShflXor(_f(mx), m, F32))))
            # a row with no finite score yet: -inf - -inf would be NaN; shift by 0 (every p is 0)
            step.append(Let(f"fa_mu{h}", F32, call("where", call("eq", _f(mx), NEG_INF),
                                                   Const(0.0, F32), _f(mx))))
            step.append(Let(f"fa_corr{h}", F32, rescale(_f(f"m_run{h}"), _f(f"fa_mu{h}"))))
            step.append(Assign(f"l_run{h}", call("multiply", _f(f"l_run{h}"), _f(f"fa_corr{h}"))))
            step.append(Let(f"fa_ml{h}", F32, call("multiply", _f(f"fa_mu{h}"), Const(LOG2E, F32))))
        for j in range(self.nt):
            for r in range(4):
                h = r // 2
                p = self.ps(j, r)
                # exp(x - mu) as 2^(x log2 e - mu log2 e): one fma and one ex2 (expf is a longer
                # exact routine on the GPU: 3 instructions fewer per score in the SASS)
                step.append(Let(p, F32, call("exp2", call("fma", _f(xs(j, r)), Const(LOG2E, F32),
                                                          call("negative", _f(f"fa_ml{h}"))))))
                step.append(Assign(f"l_run{h}", call("add", _f(f"l_run{h}"), _f(p))))
                step += self.packs(j, r)      # at once: the f32 values need no registers after
        return step

    def packs(self, j: int, r: int | None = None) -> list:
        """P's A-fragment registers whose two values are ready once element r of score tile j
        is (every one of tile j's where r is None)."""
        return [PackHalf2(f"fa_pa{kk}_{i}", _f(self.ps(tj, lo)), _f(self.ps(tj, hi)), self.dt)
                for kk in range(self.bn // 16) for i, (tj, lo, hi) in enumerate(p_fragment(kk))
                if tj == j and (r is None or r == max(lo, hi))]

    def ps(self, j: int, r: int) -> str:
        """P's element r of score tile j: exp's result, or the sum form's x itself."""
        return f"fa_p{j}_{r}" if self.softmax_form else self.xs(j, r)

    def pv(self) -> list:
        """O = O * corr + P V (O + P V in the sum form), P's A fragments packed from its C
        fragments, V by ldmatrix.trans."""
        mi, r8, o, step = self.mi, self.r8, self.o, []
        for e in range(self.et if self.softmax_form else 0):
            for r in range(4):
                step.append(Assign(o(e)[r], call("multiply", _f(o(e)[r]), _f(f"fa_corr{r // 2}"))))
        if not self.softmax_form:           # the sum form's P is x, packed here
            step += [x for j in range(self.nt) for x in self.packs(j)]
        for kk in range(self.bn // 16):
            pa = regs(f"fa_pa{kk}_", 4)
            for ej in range(0, self.et, 2):
                # B = V, stored [key][e] (N-major): .trans; matrix mi covers keys 8 * (mi % 2), e 8 * (mi // 2)
                r = add(add(16 * kk, mul(mod(mi, 2), 8)), r8)
                addr = add(add(mul(r, self.VS), add(8 * ej, mul(floordiv(mi, 2), 8))),
                           self.at_stage(self.VS))
                vb = regs(f"fa_vb{kk}_{ej}_", 4)
                step.append(LdMatrix(vb, "v_tile", addr, trans=True))
                step.append(Mma(o(ej), pa, vb[:2], o(ej), self.dt))
                step.append(Mma(o(ej + 1), pa, vb[2:], o(ej + 1), self.dt))
        return step

    # ------------------------------------------------------------ the end

    def outputs(self) -> list:
        """The row sums over the 4 lanes, then out = O / l (and m + log l where the log-sum-exp
        is asked), or the split's (m, l, O) partials."""
        at, op, I, idx, o, lane_t = self.at, self.op, self.I, self.idx, self.o, self.lane_t
        body = []
        for h in (0, 1) if self.softmax_form else ():
            for m in (1, 2):
                body.append(Assign(f"l_run{h}", call("add", _f(f"l_run{h}"),
                                                     ShflXor(_f(f"l_run{h}"), m, F32))))
        shape = self.tk.shape_of(op.out) if self.splits == 1 else None
        for h in (0, 1):
            out: list = self.lane_row(h)
            if self.splits > 1:
                ml, acc = at.partials
                flat = flat_index(tuple(I(v) for v, _ in (*op.batch, op.i)),
                                  tuple(n for _, n in (*op.batch, op.i)))
                out.append(Let("part_row", idx, add(mul(I("kv_split"), at.rows), flat)))
                out += _guarded(call("eq", lane_t, Const(0)), [
                    Store(ml, mul(I("part_row"), 2), _f(f"m_run{h}")),
                    Store(ml, add(mul(I("part_row"), 2), 1), _f(f"l_run{h}"))])
            if op.lse and self.splits == 1:     # the row's log-sum-exp, by its first lane
                buf, index = op.lse
                lse = call("add", _f(f"m_run{h}"), call("log", _f(f"l_run{h}")))
                out += _guarded(call("eq", lane_t, Const(0)),
                                [Store(buf, flat_index(index, self.tk.shape_of(buf)), lse)])
            for e in range(self.et):
                for r in (2 * h, 2 * h + 1):
                    ecoord = add(add(mul(lane_t, 2), 8 * e), r % 2)
                    ok = call("lt", ecoord, Const(self.dv)) if self.ep > self.dv else None
                    if self.splits > 1:
                        st = [Store(at.partials[1], add(mul(I("part_row"), self.dv), ecoord), _f(o(e)[r]))]
                    else:
                        value = call("divide", _f(o(e)[r]), _f(f"l_run{h}")) \
                            if self.softmax_form else _f(o(e)[r])
                        if op.safe:
                            value = call("where", call("eq", _f(f"m_run{h}"), NEG_INF), Const(0.0, F32),
                                         value)
                        st = [Let(self.ev, idx, ecoord), Store(op.out, flat_index(op.out_index, shape), value)]
                    out += _guarded(ok, st) if ok is not None else _guarded(None, st)
            body += _guarded(self.row_ok(I(f"fa_i{h}")), out)
        return body


__all__ = ["lower_attention_mma_kernel", "p_fragment_pack"]
