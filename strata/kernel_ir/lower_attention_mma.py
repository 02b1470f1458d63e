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
and V tile (BLOCK_N x e16), 0 past Lk and past the head dims, and the P tile (BLOCK_M x BLOCK_N).

Per key block: fill K, V; Sync; S = Q K^T (ldmatrix.x4 of K, one mma per 16x8 tile and 16 of d);
x = the score expression per S element (scale, masks; -inf past Lk or Lq), only on the edge
blocks with the causal mask and bounds (key_range); the online softmax on the fragments: the
row max over the lane's elements and the 4 lanes of the row (two xor shuffles), m_use (0 for a
row with no finite score yet), corr = exp(m_old - m_use), p = exp(x - m_use), the lane's partial
row sum l = l * corr + sum p (the 4 partial sums are added once at the end); P rounded to the
mma dtype is stored at its C-fragment position (`p_fragment_pack`), Sync, and read back by
ldmatrix as A fragments (A fragment k of P is the C fragments of n8 tiles 2k and 2k + 1); O
(f32 C fragments over e) = O * corr + P V with V by ldmatrix.trans; Sync before the refill.
(P goes through shared memory because Kernel IR has no f32x2 -> f16x2 register pack yet.)
At the end out = O / l, or the split's (m, l, O) partials for the combine kernel.
"""
from __future__ import annotations

from math import prod

from ..expr import Const, Expr, Var, add, call, floordiv, mod, mul
from ..tile.attention import MMA_PAD, ceil16
from ..tile.ir import TileKernel, flat_index
from .ir import Assign, For, Kernel, LdMatrix, Let, Mma, Param, ShflXor, Smem, Store, Sync, \
    ThreadIdx
from .lowerer import Lowerer
from .lower_attention import (NEG_INF, _and, _f, _guarded, block_origin, fill_kv, key_range, operand,
                              rescale, unmasked_scores)
from .lower_mma import regs

F32 = "f32"


def p_fragment_pack(j: int, r: int, g: Expr, t: Expr) -> tuple[Expr, Expr]:
    """(row within the warp's 16, key column within the block) of accumulator element c_r of
    score tile j (keys 8j .. 8j + 7): where P's value goes so that ldmatrix reads it back as
    the A fragment of P @ V (a test breaks this on purpose and expects wrong answers)."""
    return add(g, 8 * (r // 2)), add(add(mul(t, 2), 8 * j), r % 2)


def lower_attention_mma_kernel(tk: TileKernel) -> Kernel:
    at = tk.attention
    op, bm, bn, S = at.op, at.block_m, at.block_n, at.kv_splits
    dt = op.q.dtype
    low = Lowerer(tk)
    idx = low.idx
    I = lambda name: Var(name, idx)
    (iv, lq), (jv, lk), (dv_, d), (ev, dv) = op.i, op.j, op.d, op.e
    dp, ep = ceil16(d), ceil16(dv)
    QS, KS, VS, PS = dp + MMA_PAD, dp + MMA_PAD, ep + MMA_PAD, bn + MMA_PAD
    qb = at.q_per_block
    nt, et = bn // 8, ep // 8           # score tiles, output tiles per warp row block

    body: list = [Let("fa_tid", idx, ThreadIdx()), Let("fa_lane", idx, mod(I("fa_tid"), 32)),
                  Let("fa_warp", idx, floordiv(I("fa_tid"), 32)),
                  Let("fa_g", idx, floordiv(I("fa_lane"), 4)), Let("fa_t", idx, mod(I("fa_lane"), 4)),
                  Let("fa_mi", idx, floordiv(I("fa_lane"), 8)), Let("fa_r8", idx, mod(I("fa_lane"), 8))]
    lane_g, lane_t, mi, r8 = I("fa_g"), I("fa_t"), I("fa_mi"), I("fa_r8")
    wrow = mul(I("fa_warp"), 16)
    origin, kv_ops = block_origin(at, idx)
    body += origin

    def row_coords(row: Expr) -> list:
        """Lets of the query (and head) of block row `row`."""
        if at.group > 1:
            hg = f"{at.head}_grp"
            return [Let(at.head, idx, add(mul(I(hg), at.group), floordiv(row, qb))),
                    Let(iv, idx, add(mul(I("q_blk"), qb), mod(row, qb)))]
        return [Let(iv, idx, add(mul(I("q_blk"), bm), row))]

    def row_ok(query: Expr):
        return call("lt", query, Const(lq)) if lq % qb or qb > lq else None

    # this lane's two rows: (query, head) coordinates as plain registers
    for h in (0, 1):
        row = add(add(wrow, lane_g), 8 * h)
        if at.group > 1:
            body.append(Let(f"fa_h{h}", idx, add(mul(I(f"{at.head}_grp"), at.group), floordiv(row, qb))))
            body.append(Let(f"fa_i{h}", idx, add(mul(I("q_blk"), qb), mod(row, qb))))
        else:
            body.append(Let(f"fa_i{h}", idx, add(mul(I("q_blk"), bm), row)))

    def lane_row(h: int) -> list:
        out = [Let(iv, idx, I(f"fa_i{h}"))]
        if at.group > 1:
            out.insert(0, Let(at.head, idx, I(f"fa_h{h}")))
        return out

    body += [Smem("q_tile", dt, bm * QS), Smem("k_tile", dt, bn * KS), Smem("v_tile", dt, bn * VS),
             Smem("p_tile", dt, bm * PS)]
    # Q: the whole block's rows, once
    f = I("fa_qf")
    qrow, qx = I("fa_qrow"), I("fa_qx")
    fill = [Let("fa_qrow", idx, floordiv(f, dp)), Let("fa_qx", idx, mod(f, dp))]
    inner = row_coords(qrow)
    ok = _and(row_ok(I(iv)), call("lt", qx, Const(d)) if dp > d else None)
    compute = operand(low, op.q, [Let(dv_, idx, qx)], "fa_qval", True)
    compute.append(Store("q_tile", add(mul(qrow, QS), qx), _f("fa_qval")))
    inner += _guarded(ok, compute, [Store("q_tile", add(mul(qrow, QS), qx), Const(0.0, F32))]) \
        if ok is not None else compute
    fill += _guarded(None, inner)
    body.append(For("fa_qf", ThreadIdx(), Const(bm * dp), tk.block, tuple(fill), dtype=idx))
    body.append(Sync())

    def a_row(tile_stride: int, col0: int) -> Expr:
        """ldmatrix.x4 row address of an A fragment (rows of the warp, columns col0..col0+15):
        matrix mi covers rows 8 * (mi % 2) and columns 8 * (mi // 2)."""
        r = add(add(wrow, mul(mod(mi, 2), 8)), r8)
        return add(mul(r, tile_stride), add(col0, mul(floordiv(mi, 2), 8)))

    for kk in range(dp // 16):
        body.append(LdMatrix(regs(f"fa_qa{kk}_", 4), "q_tile", a_row(QS, 16 * kk)))
    for h in (0, 1):
        body += [Let(f"m_run{h}", F32, NEG_INF), Let(f"l_run{h}", F32, Const(0.0, F32))]
    o = lambda e: regs(f"fa_o{e}_", 4)
    body += [Let(v, F32, Const(0.0, F32)) for e in range(et) for v in o(e)]
    unmasked = unmasked_scores(at)

    def key_step(edge: bool) -> list:
        step = fill_kv(low, at, kv_ops, (("k_tile", "k", dp, d, dv_, KS), ("v_tile", "v", ep, dv, ev, VS)),
                       edge, tk.block)
        step.append(Sync())
        s = lambda j: regs(f"fa_s{j}_", 4)
        step += [Let(v, F32, Const(0.0, F32)) for j in range(nt) for v in s(j)]
        for kk in range(dp // 16):
            for jp in range(nt // 2):
                # B = K^T, K stored [key][d] (K-major): matrix mi covers keys 8 * (mi // 2), d 8 * (mi % 2)
                r = add(add(16 * jp, mul(floordiv(mi, 2), 8)), r8)
                addr = add(mul(r, KS), add(16 * kk, mul(mod(mi, 2), 8)))
                kb = regs(f"fa_kb{kk}_{jp}_", 4)
                step.append(LdMatrix(kb, "k_tile", addr))
                step.append(Mma(s(2 * jp), regs(f"fa_qa{kk}_", 4), kb[:2], s(2 * jp), dt))
                step.append(Mma(s(2 * jp + 1), regs(f"fa_qa{kk}_", 4), kb[2:], s(2 * jp + 1), dt))
        xs = lambda j, r: f"fa_x{j}_{r}"
        for j in range(nt):
            for r in range(4):
                h = r // 2
                step.append(Let(xs(j, r), F32, NEG_INF))
                key = add(add(I("j0"), 8 * j), add(mul(lane_t, 2), r % 2))
                ok = _and(row_ok(I(f"fa_i{h}")), call("lt", key, Const(lk)) if edge else None)
                binds = lane_row(h) + [Let(jv, idx, key), Let(op.score, F32, _f(s(j)[r]))]
                step += _guarded(ok, operand(low, op.x, binds, xs(j, r), False, op.x.body if edge else unmasked))
        for h in (0, 1):
            mx = f"fa_mx{h}"
            step.append(Let(mx, F32, _f(f"m_run{h}")))
            step += [Assign(mx, call("maximum", _f(mx), _f(xs(j, r)))) for j in range(nt)
                     for r in (2 * h, 2 * h + 1)]
            for m in (1, 2):
                step.append(Assign(mx, call("maximum", _f(mx), ShflXor(_f(mx), m, F32))))
            # a row with no finite score yet: -inf - -inf would be NaN; shift by 0 (every p is 0)
            step.append(Let(f"fa_mu{h}", F32, call("where", call("eq", _f(mx), NEG_INF),
                                                   Const(0.0, F32), _f(mx))))
            step.append(Let(f"fa_corr{h}", F32, rescale(_f(f"m_run{h}"), _f(f"fa_mu{h}"))))
            step.append(Assign(f"l_run{h}", call("multiply", _f(f"l_run{h}"), _f(f"fa_corr{h}"))))
        for j in range(nt):
            for r in range(4):
                h = r // 2
                p = f"fa_p{j}_{r}"
                step.append(Let(p, F32, call("exp", call("subtract", _f(xs(j, r)), _f(f"fa_mu{h}")))))
                step.append(Assign(f"l_run{h}", call("add", _f(f"l_run{h}"), _f(p))))
                prow, pcol = p_fragment_pack(j, r, lane_g, lane_t)
                step.append(Store("p_tile", add(mul(add(wrow, prow), PS), pcol), _f(p)))
        step.append(Sync())
        for e in range(et):
            for r in range(4):
                step.append(Assign(o(e)[r], call("multiply", _f(o(e)[r]), _f(f"fa_corr{r // 2}"))))
        for kk in range(bn // 16):
            pa = regs(f"fa_pa{kk}_", 4)
            step.append(LdMatrix(pa, "p_tile", a_row(PS, 16 * kk)))
            for ej in range(0, et, 2):
                # B = V, stored [key][e] (N-major): .trans; matrix mi covers keys 8 * (mi % 2), e 8 * (mi // 2)
                r = add(add(16 * kk, mul(mod(mi, 2), 8)), r8)
                addr = add(mul(r, VS), add(8 * ej, mul(floordiv(mi, 2), 8)))
                vb = regs(f"fa_vb{kk}_{ej}_", 4)
                step.append(LdMatrix(vb, "v_tile", addr, trans=True))
                step.append(Mma(o(ej), pa, vb[:2], o(ej), dt))
                step.append(Mma(o(ej + 1), pa, vb[2:], o(ej + 1), dt))
        step += [Assign(f"m_run{h}", _f(f"fa_mx{h}")) for h in (0, 1)]
        step.append(Sync())
        return step

    body += key_range(at, I, idx)
    body.append(For("j0", I("kv_lo"), I("kv_mid"), bn, tuple(key_step(False)), dtype=idx))
    body.append(For("j0", I("kv_mid"), I("kv_hi"), bn, tuple(key_step(True)), dtype=idx))
    for h in (0, 1):                # the row sums: the 4 lanes' partial sums
        for m in (1, 2):
            body.append(Assign(f"l_run{h}", call("add", _f(f"l_run{h}"), ShflXor(_f(f"l_run{h}"), m, F32))))
    shape = tk.shape_of(op.out) if S == 1 else None
    for h in (0, 1):
        out: list = lane_row(h)
        if S > 1:
            ml, acc = at.partials
            flat = flat_index(tuple(I(v) for v, _ in (*op.batch, op.i)),
                              tuple(n for _, n in (*op.batch, op.i)))
            out.append(Let("part_row", idx, add(mul(I("kv_split"), at.rows), flat)))
            out += _guarded(call("eq", lane_t, Const(0)), [
                Store(ml, mul(I("part_row"), 2), _f(f"m_run{h}")),
                Store(ml, add(mul(I("part_row"), 2), 1), _f(f"l_run{h}"))])
        for e in range(et):
            for r in (2 * h, 2 * h + 1):
                ecoord = add(add(mul(lane_t, 2), 8 * e), r % 2)
                ok = call("lt", ecoord, Const(dv)) if ep > dv else None
                if S > 1:
                    st = [Store(at.partials[1], add(mul(I("part_row"), dv), ecoord), _f(o(e)[r]))]
                else:
                    value = call("divide", _f(o(e)[r]), _f(f"l_run{h}"))
                    if op.safe:
                        value = call("where", call("eq", _f(f"m_run{h}"), NEG_INF), Const(0.0, F32), value)
                    st = [Let(ev, idx, ecoord), Store(op.out, flat_index(op.out_index, shape), value)]
                out += _guarded(ok, st) if ok is not None else _guarded(None, st)
        body += _guarded(row_ok(I(f"fa_i{h}")), out)
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes) for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)


__all__ = ["lower_attention_mma_kernel", "p_fragment_pack"]
