"""Tile IR -> Kernel IR for a fused attention on a CPU (tile/passes/cpu_attention.py): one thread
a block of BLOCK_M queries, what it holds in scratch arrays (Smem: one set per OpenMP thread).

The block stages its queries once (q_s, 0 past Lq), then walks the keys BLOCK_N a step up to its
causal limit (lower_attention.py's key_range; only a diagonal or tail block, j0 >= kv_mid,
checks Lk and evaluates the mask), copying K and V (0 past Lk, V's head dim padded to whole
vectors). The scores are kept transposed, st_s = k_s @ q_s (keys x queries), so that everything
a query's softmax needs runs along vectors of queries: x (scale, masks), the new running max (an
elementwise max down the keys, no sum across vector lanes), exp(m_old - m_new) once a query and
key block, and p = exp(x - m_new) with its sum. Then o_s = o_s * c + p @ v_s (c applied as the
product's tiles load o_s). Both products are register tiles of AttentionTile.tile_rows rows (a
tail tile of fewer) by `points` columns that kernel_ir/lower_cpu.py makes OuterFma (f32,
FORM=outer: Q and P transposed) or PairsBf16 (bf16 on AVX512-BF16, FORM=pairs: Q and P as pairs
of their K side by side, V and O transposed, V the one block transposed a step).
After the last block out = o_s / l (and the log-sum-exp m + log l where the program saves it).
"""
from __future__ import annotations

from math import prod

from ..core.expr import Const, Var, add, as_expr, call, floordiv, mod, mul, sub
from ..tile.ir import TileKernel, flat_index
from .ir import Assign, For, If, Kernel, Let, Load, Param, Smem, Store
from .lower_attention import (F32, NEG_INF, _f, _guarded, _imin, block_origin, bound_load,
                              key_range, operand, rescale, unmasked_scores)
from .lowerer import Lowerer


def lower_attention_cpu_kernel(tk: TileKernel) -> Kernel:
    at = tk.attention
    op, bm, bn = at.op, at.block_m, at.block_n
    pairs = at.instr == "cpu-bf16"          # bf16 blocks, products on vdpbf16ps (PairsBf16)
    low = Lowerer(tk)
    idx = low.idx
    I = lambda name: Var(name, idx)
    (iv, lq), (jv, lk), (dv_, d), (ev, dv) = op.i, op.j, op.d, op.e
    ep = -(-dv // 16) * 16                  # v and o rows: whole vectors on every ISA
    dp = d + d % 2 if pairs else d          # q and k rows: whole pairs
    r, n, e, dd, t = I("fa_r"), I("fa_n"), I("fa_e"), I("fa_d"), I("fa_t")
    query = Let(iv, idx, add(mul(I("q_blk"), bm), r))
    key = Let(jv, idx, add(I("j0"), n))
    row_ok = call("lt", I(iv), Const(lq)) if lq % bm else None
    both = lambda a, b: a if b is None else b if a is None else call("logical_and", a, b)
    stored = "bf16" if pairs else F32
    keys = I("kv_e") if pairs else I("kv_n")    # the keys before kv_hi (key_step), bf16 in pairs

    def loop(var: str, stop, body, step=1) -> For:
        return For(var, Const(0), Const(stop) if isinstance(stop, int) else stop, step,
                   tuple(body), dtype=idx)

    def staged(o, binds, ok, dest: str, at_) -> list:
        """dest[at_] = operand o after binds, 0 where ok is false."""
        value = [Let("fa_val", F32, Const(0.0, F32))]
        compute = operand(low, o, binds, "fa_val", False)
        value += compute if ok is None else _guarded(ok, compute)
        return value + [Store(dest, at_, _f("fa_val"))]

    def paired(x, rows: int):   # element (x, q) of a [x/2][rows][2] panel: q's pair of x, x + 1
        return lambda q: add(mul(add(mul(floordiv(x, 2), rows), q), 2), mod(x, 2))

    def tiles(dest, acc_at, rows, rows_at, panel, panel_at, k_stop, width, init, live=None) -> list:
        """dest[acc_at(a, p)] = init(a, p) + sum over k < k_stop of rows_at(a, k) times
        panel_at(k, p), as register tiles of at.tile_rows of the `rows` x `points` columns: each
        K loop an OuterFma (f32), or a PairsBf16 over pairs of K (bf16: both operands' k and
        k + 1 side by side); with `live`, only the tiles starting below it."""
        out, r0 = [], lambda a: add(I("fa_r0"), a)
        ks = [mul(t, 2), add(mul(t, 2), 1)] if pairs else [I("fa_k")]
        def tile(nr: int, c0: int, w: int) -> list:     # nr rows from fa_r0 by columns c0..c0 + w
            accs = [[f"fa_{c0}_{a}_{p}" for p in range(w)] for a in range(nr)]
            body = [Let(accs[a][p], F32, init(r0(a), c0 + p)) for a in range(nr) for p in range(w)]
            k_body = [Let(f"fa_u{a}_{h}", stored, Load(rows_at[0], rows_at[1](r0(a), k), stored))
                      for a in range(nr) for h, k in enumerate(ks)]
            k_body += [Let(f"fa_w{p}_{h}", stored, Load(panel, panel_at(k, c0 + p), stored))
                       for p in range(w) for h, k in enumerate(ks)]
            for a in range(nr):
                for p in range(w):
                    if not pairs:
                        k_body.append(Assign(accs[a][p], call("fma", _f(f"fa_u{a}_0"), _f(f"fa_w{p}_0"),
                                                              _f(accs[a][p]))))
                        continue
                    for h in range(2):
                        k_body += [Let(f"fa_x{a}_{p}_{h}", F32, call("multiply", Var(f"fa_u{a}_{h}", stored),
                                                                     Var(f"fa_w{p}_{h}", stored))),
                                   Assign(accs[a][p], call("add", _f(accs[a][p]), _f(f"fa_x{a}_{p}_{h}")))]
            pair_stop = k_stop // 2 if isinstance(k_stop, int) else floordiv(add(k_stop, 1), 2)
            body.append(loop("fa_t" if pairs else "fa_k", pair_stop if pairs else k_stop, k_body))
            return body + [Store(dest, acc_at(r0(a), c0 + p), _f(accs[a][p]))
                           for a in range(nr) for p in range(w)]
        R = at.tile_rows
        whole = rows - rows % R
        upto = lambda n: Const(n) if live is None else _imin(Const(n), live)
        for c0 in range(0, width, at.points):
            w = min(at.points, width - c0)
            if whole:
                out.append(loop("fa_r0", upto(whole), tile(R, c0, w), step=R))
            if rows % R:                # the rows past the last whole tile: one tile of fewer
                out.append(For("fa_r0", Const(whole), upto(rows), R, tuple(tile(rows % R, c0, w)),
                               dtype=idx))
        return out

    # where each block lives: f32, S and P transposed; bf16, Q and P as pairs of their K and
    # O and V transposed (each product's rows broadcast a pair, its panel holds the pairs)
    if pairs:
        q_at, k_at = (lambda: paired(dd, bm)(r)), (lambda: add(mul(n, dp), dd))
        v_at, o_at = (lambda: add(mul(e, bn), n)), (lambda x, y: add(mul(y, bm), x))
    else:
        q_at, k_at = (lambda: add(mul(dd, bm), r)), (lambda: add(mul(n, d), dd))
        v_at, o_at = (lambda: add(mul(n, ep), e)), (lambda x, y: add(mul(x, ep), y))

    def fill(edge: bool) -> list:
        past = call("lt", I(jv), Const(lk)) if edge else None
        ok_k = both(past, call("lt", dd, Const(d)) if dp > d else None)
        ok_v = both(past, call("lt", e, Const(dv)) if ep > dv else None)
        return [loop("fa_n", keys, [key, loop("fa_d", dp, staged(
                    op.k, [Let(dv_, idx, dd)], ok_k, "k_s", k_at()))]),
                loop("fa_n", keys, [key, loop("fa_e", ep, staged(
                    op.v, [Let(ev, idx, e)], ok_v, "v_s", v_at()))])]

    def scores(edge: bool) -> list:
        """x, each query's new running max (along the query vector: no sums across lanes)."""
        xs = op.x.body if edge else unmasked_scores(at)
        ok = both(call("lt", n, I("kv_n")) if edge else None, row_ok)   # kv_n: within Lk too
        compute = operand(low, op.x, [], "fa_x", False, xs)
        return [loop("fa_n", keys, [key, loop("fa_r", bm, [
            query, Let(op.score, F32, Load("st_s", add(mul(n, bm), r), F32)),
            Let("fa_x", F32, NEG_INF), *(compute if ok is None else _guarded(ok, compute)),
            Store("st_s", add(mul(n, bm), r), _f("fa_x")),
            Store("mx_s", r, call("maximum", Load("mx_s", r, F32), _f("fa_x")))])])]

    def key_step() -> list:
        """One block of keys: only a diagonal or tail block (j0 >= kv_mid) checks Lk and
        evaluates the mask; the products are written once (half the C to compile). Keys past
        kv_hi (Lk or the causal limit) are masked for every query: the copies, scores (-inf),
        exps and products stop at kv_n (1.04x-1.07x at 512 tokens, Zen 3, 2026-12-03)."""
        whole = call("lt", I("j0"), I("kv_mid"))
        live = I("kv_n")
        step = [Let("kv_n", idx, _imin(Const(bn), sub(I("kv_hi"), I("j0"))))]
        step += [Let("kv_e", idx, add(I("kv_n"), mod(I("kv_n"), 2)))] if pairs else []
        step.append(If(whole, tuple(fill(False)), tuple(fill(True))))
        # the scores transposed (keys x queries): register tiles of keys over the head dim
        step += tiles("st_s", lambda a, p: add(mul(a, bm), p), bn,
                      ("k_s", lambda a, k: add(mul(a, dp), k)), "q_s",
                      (lambda k, p: paired(k, bm)(p)) if pairs else (lambda k, p: add(mul(k, bm), p)),
                      dp, bm, lambda a, p: Const(0.0, F32), live)
        step.append(If(whole, tuple(scores(False)), tuple(scores(True))))
        # a query with no finite score yet: -inf - -inf would be NaN; shift by 0 (every p is 0)
        mu = call("where", call("eq", Load("mx_s", r, F32), NEG_INF), Const(0.0, F32), Load("mx_s", r, F32))
        step.append(loop("fa_r", bm, [
            Let("fa_mu", F32, mu), Store("c_s", r, rescale(Load("m_s", r, F32), _f("fa_mu"))),
            Store("mu_s", r, _f("fa_mu")), Store("m_s", r, Load("mx_s", r, F32)),
            Store("l_s", r, call("multiply", Load("l_s", r, F32), Load("c_s", r, F32)))]))
        p = call("exp_shifted", call("subtract", Load("st_s", add(mul(n, bm), r), F32), Load("mu_s", r, F32)))
        step.append(loop("fa_n", keys, [loop("fa_r", bm, [
            Let("fa_p", F32, p), Store("p_s", paired(n, bm)(r) if pairs else add(mul(n, bm), r), _f("fa_p")),
            Store("l_s", r, call("add", Load("l_s", r, F32), _f("fa_p")))])]))
        # o = o * c + p @ v: tiles of queries (f32) or of v's head dim (bf16) over the keys, c
        # applied as a tile loads o_s (a pass fewer: 1.007x at 2048 tokens f32, Zen 3, 2026-12-03)
        scaled = lambda q, x: call("multiply", Load("o_s", o_at(q, x), F32),
                                   Load("c_s", as_expr(q), F32))
        if pairs:
            step += tiles("o_s", lambda a, q: o_at(q, a), ep, ("v_s", lambda a, k: add(mul(a, bn), k)),
                          "p_s", lambda k, q: paired(k, bm)(q), live, bm, lambda a, q: scaled(q, a))
        else:
            step += tiles("o_s", o_at, bm, ("p_s", lambda a, k: add(mul(k, bm), a)), "v_s",
                          lambda k, q: add(mul(k, ep), q), live, ep, scaled)
        return step

    body, _ = block_origin(at, idx)
    body += bound_load(low, at)
    body += [Smem(name, dtype, size) for name, dtype, size in (
        ("q_s", stored, dp * bm), ("k_s", stored, bn * dp), ("v_s", stored, bn * ep),
        ("st_s", F32, bn * bm), ("p_s", stored, bn * bm), ("o_s", F32, bm * ep),
        ("m_s", F32, bm), ("l_s", F32, bm), ("mx_s", F32, bm), ("mu_s", F32, bm), ("c_s", F32, bm))]
    body.append(loop("fa_r", bm, [query, loop("fa_d", dp, staged(
        op.q, [Let(dv_, idx, dd)], both(row_ok, call("lt", dd, Const(d)) if dp > d else None),
        "q_s", q_at()))]))
    body.append(loop("fa_r", bm, [Store("m_s", r, NEG_INF), Store("mx_s", r, NEG_INF),
                                  Store("l_s", r, Const(0.0, F32)),
                                  loop("fa_e", ep, [Store("o_s", o_at(r, e), Const(0.0, F32))])]))
    body += key_range(at, I, idx)
    body.append(For("j0", I("kv_lo"), I("kv_hi"), bn, tuple(key_step()), dtype=idx))
    body.append(loop("fa_r", bm, [query] + _guarded(row_ok, _store_out(tk, low, o_at(r, e)))))
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes) for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, 1, tuple(body), src=tk.src)


def _store_out(tk: TileKernel, low: Lowerer, o_at) -> list:
    """Row fa_r's output o_s / l (0 for a row of -inf scores where the softmax is safe), and its
    log-sum-exp where the program saves it."""
    op, idx = tk.attention.op, low.idx
    r, e = Var("fa_r", idx), Var("fa_e", idx)
    (ev, dv) = op.e
    value = call("divide", Load("o_s", o_at, F32), _f("fa_l"))
    if op.safe:
        value = call("where", call("eq", _f("fa_m"), NEG_INF), Const(0.0, F32), value)
    out = [Let("fa_l", F32, Load("l_s", r, F32)), Let("fa_m", F32, Load("m_s", r, F32)),
           For("fa_e", Const(0), Const(dv), 1, (Let(ev, idx, e), Store(
               op.out, flat_index(op.out_index, tk.shape_of(op.out)), value)), dtype=idx)]
    if op.lse:
        buf, index = op.lse
        out.append(Store(buf, flat_index(index, tk.shape_of(buf)),
                         call("add", _f("fa_m"), call("log", _f("fa_l")))))
    return out
