"""Tile IR -> Kernel IR for a fused attention (mode "attention", tile/attention.py).

blockIdx.x enumerates (batch..., query block), threadIdx.x = query-in-block * ROW_THREADS + t.
Per key block: a cooperative fill of the K and V tiles into shared memory (row stride padded to
a multiple of ROW_THREADS, zero past Lk and past the head dim, so the inner loops need no
guards), a barrier, then for each of the BLOCK_N keys a partial dot product, a butterfly of
warp shuffles, and x (scale, masks) under the query's and key's bounds; then one online-softmax
step for the whole block of keys and a barrier before the tiles are refilled. Registers are
named per element: q_u, acc_u (u < head dim / ROW_THREADS) and x_n, p_n (n < BLOCK_N).
"""
from __future__ import annotations

from .. import dtypes
from ..expr import Const, Expr, Var, add, call, floordiv, mod, mul
from ..tile.ir import TileKernel, flat_index
from .ir import (
    Assign,
    BlockIdx,
    For,
    If,
    Kernel,
    Let,
    Load,
    Param,
    ShflXor,
    Smem,
    Store,
    Sync,
    ThreadIdx,
)
from .lower import _decompose, _Lowerer, _numel

F32 = "f32"
NEG_INF = Const(float("-inf"), F32)


def rescale(m_old: Expr, m_new: Expr) -> Expr:
    """The factor the running sum and accumulator are multiplied by when the max moves: the
    heart of the online softmax (a test breaks it on purpose and expects wrong answers)."""
    return call("exp", call("subtract", m_old, m_new))


def _f(name: str) -> Var:
    return Var(name, F32)


def _and(*conds):
    out = None
    for c in conds:
        if c is not None:
            out = c if out is None else call("logical_and", out, c)
    return out


def _guarded(cond, body: list, orelse: list = ()) -> list:
    """body under cond; always a block of its own, since each copy redeclares its names."""
    return [If(Const(True, "bool") if cond is None else cond, tuple(body), tuple(orelse))]


def lower_attention_kernel(tk: TileKernel) -> Kernel:
    at = tk.attention
    op, g, bm, bn = at.op, at.row_threads, at.block_m, at.block_n
    low = _Lowerer(tk)
    idx = low.idx
    I = lambda name: Var(name, idx)
    (iv, lq), (jv, lk), (dv_, d), (ev, dv) = op.i, op.j, op.d, op.e
    du, eu = at.d_per_thread, at.e_per_thread
    dp, ep = du * g, eu * g                 # padded tile rows
    t, r = low.v["t"], "q_row"
    body: list = [Let(t, idx, mod(ThreadIdx(), g)), Let(r, idx, floordiv(ThreadIdx(), g)),
                  Let("q_blk", idx, mod(BlockIdx(), at.m_blocks)),
                  Let("b_flat", idx, floordiv(BlockIdx(), at.m_blocks))]
    if op.batch:
        body += [Let(v, idx, e) for v, e in _decompose(I("b_flat"), op.batch,
                                                        {"b_flat": _numel([n for _, n in op.batch])})]
    body.append(Let(iv, idx, add(mul(I("q_blk"), bm), I(r))))
    row_ok = call("lt", I(iv), Const(lq)) if lq % bm or bm > lq else None

    def operand(o, binds: list, value_var: str, declare: bool) -> list:
        out = list(binds) + low.stmts(o.body)
        return out + [Assign(value_var, o.value)] if not declare else out + [Let(value_var, F32, o.value)]

    # q: this thread's slice of the query row, in registers
    for u in range(du):
        dcoord = add(I(t), g * u)
        body.append(Let(f"q_{u}", F32, Const(0.0, F32)))
        ok = _and(row_ok, call("lt", dcoord, Const(d)) if dp > d else None)
        body += _guarded(ok, operand(op.q, [Let(dv_, idx, dcoord)], f"q_{u}", False))
    body += [Let("m_run", F32, NEG_INF), Let("l_run", F32, Const(0.0, F32))]
    body += [Let(f"acc_{u}", F32, Const(0.0, F32)) for u in range(eu)]

    step: list = []
    for tile, o, width, extent, ax in (("k_tile", op.k, dp, d, dv_), ("v_tile", op.v, ep, dv, ev)):
        f = I(f"{tile}_f")
        fill = [Let(f"{tile}_j", idx, floordiv(f, width)), Let(f"{tile}_x", idx, mod(f, width))]
        j = add(I("j0"), I(f"{tile}_j"))
        ok = _and(call("lt", j, Const(lk)) if lk % bn or bn > lk else None,
                  call("lt", I(f"{tile}_x"), Const(extent)) if width > extent else None)
        compute = operand(o, [Let(jv, idx, j), Let(ax, idx, I(f"{tile}_x"))], f"{tile}_val", True)
        compute.append(Store(tile, f, _f(f"{tile}_val")))
        fill += _guarded(ok, compute, [Store(tile, f, Const(0.0, F32))]) if ok is not None else compute
        step.append(For(f.name, ThreadIdx(), Const(bn * width), tk.block, tuple(fill), dtype=idx))
    step.append(Sync())
    for n in range(bn):
        for u in range(du):
            term = call("multiply", _f(f"q_{u}"), Load("k_tile", add(Const(n * dp), add(I(t), g * u)), F32))
            step.append(Let(f"dot_{n}", F32, term) if u == 0 else
                        Assign(f"dot_{n}", call("add", _f(f"dot_{n}"), term)))
        m = g // 2
        while m >= 1:
            step.append(Assign(f"dot_{n}", call("add", _f(f"dot_{n}"),
                                                ShflXor(_f(f"dot_{n}"), m, F32))))
            m //= 2
        step.append(Let(f"x_{n}", F32, NEG_INF))
        j = add(I("j0"), n)
        ok = _and(row_ok, call("lt", j, Const(lk)) if lk % bn or bn > lk else None)
        xs = [Let(jv, idx, j), Let(op.score, F32, _f(f"dot_{n}"))]
        step += _guarded(ok, operand(op.x, xs, f"x_{n}", False))
    step.append(Let("m_new", F32, _f("m_run")))
    step += [Assign("m_new", call("maximum", _f("m_new"), _f(f"x_{n}"))) for n in range(bn)]
    # a row with no finite score yet: -inf - -inf would be NaN; shift by 0 (every p is 0)
    step.append(Let("m_use", F32, call("where", call("eq", _f("m_new"), NEG_INF),
                                       Const(0.0, F32), _f("m_new"))))
    step.append(Let("corr", F32, rescale(_f("m_run"), _f("m_use"))))
    step += [Let(f"p_{n}", F32, call("exp", call("subtract", _f(f"x_{n}"), _f("m_use"))))
             for n in range(bn)]
    step.append(Assign("l_run", call("multiply", _f("l_run"), _f("corr"))))
    step += [Assign("l_run", call("add", _f("l_run"), _f(f"p_{n}"))) for n in range(bn)]
    for u in range(eu):
        step.append(Assign(f"acc_{u}", call("multiply", _f(f"acc_{u}"), _f("corr"))))
        for n in range(bn):
            vval = Load("v_tile", add(Const(n * ep), add(I(t), g * u)), F32)
            step.append(Assign(f"acc_{u}", call("add", _f(f"acc_{u}"),
                                                call("multiply", _f(f"p_{n}"), vval))))
    step += [Assign("m_run", _f("m_new")), Sync()]
    body += [Smem("k_tile", op.k.dtype, bn * dp), Smem("v_tile", op.v.dtype, bn * ep)]
    body.append(For("j0", Const(0), Const(lk), bn, tuple(step), dtype=idx))

    shape = tk.shape_of(op.out)
    for u in range(eu):
        ecoord = add(I(t), g * u)
        value = call("divide", _f(f"acc_{u}"), _f("l_run"))
        if op.safe:
            value = call("where", call("eq", _f("m_run"), NEG_INF), Const(0.0, F32), value)
        ok = _and(row_ok, call("lt", ecoord, Const(dv)) if ep > dv else None)
        body += _guarded(ok, [Let(ev, idx, ecoord), Store(op.out, flat_index(op.out_index, shape), value)])
    params = tuple(Param(b.name, b.dtype, _numel(b.shape), b.name in tk.writes) for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)


__all__ = ["dtypes", "lower_attention_kernel", "rescale"]
