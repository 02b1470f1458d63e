"""Tile IR -> Kernel IR for split-KV's combine (tile/attention.py `CombineTile`).

One thread per output element (row of (batch..., query), head-dim column e) reads the KV_SPLITS
partials (m_s, l_s, acc_s) its split kernel wrote and merges them exactly:
out = sum_s acc_s w_s / sum_s l_s w_s with w_s = exp(m_s - M), M = max_s m_s. A split that saw no
finite score (m_s = -inf) has weight 0; a row with none at all gives 0 (safe) or 0/0 = NaN.
"""
from __future__ import annotations

from math import prod
from ..core.expr import Const, Expr, Var, add, call, floordiv, mod, mul
from ..tile.ir import TileKernel, flat_index
from .ir import Assign, BlockIdx, For, If, Kernel, Let, Load, Param, Store, ThreadIdx
from .lowerer import bind_domain

F32 = "f32"
NEG_INF = Const(float("-inf"), F32)


def combine_weight(m_s: Expr, m_max: Expr) -> Expr:
    """A split's weight: a test breaks it on purpose and expects wrong answers."""
    return call("exp", call("subtract", m_s, m_max))


def lower_combine_kernel(tk: TileKernel) -> Kernel:
    c = tk.attention
    op, S = c.op, c.kv_splits
    ml, acc = c.partials
    idx = "i64" if any(prod(b.shape) >= 2 ** 31 for b in tk.buffers) else "i32"
    I = lambda name: Var(name, idx)
    f = lambda name: Var(name, F32)
    (iv, lq), (ev, dv) = op.i, op.e
    rows = c.rows
    inner: list = [Let("c_row", idx, floordiv(I("c_gid"), dv)), Let(ev, idx, mod(I("c_gid"), dv))]
    axes = (*op.batch, op.i)
    inner += [Let(v, idx, e) for v, e in bind_domain(I("c_row"), axes, {"c_row": rows})]
    m_at = Load(ml, mul(add(mul(I("kv_s"), rows), I("c_row")), 2), F32)
    l_at = Load(ml, add(mul(add(mul(I("kv_s"), rows), I("c_row")), 2), 1), F32)
    a_at = Load(acc, add(mul(add(mul(I("kv_s"), rows), I("c_row")), dv), I(ev)), F32)
    inner += [Let("m_max", F32, NEG_INF),
              For("kv_s", Const(0), Const(S), 1, (Assign("m_max", call("maximum", f("m_max"), m_at)),),
                  dtype=idx),
              Let("m_use", F32, call("where", call("eq", f("m_max"), NEG_INF), Const(0.0, F32), f("m_max"))),
              Let("l_sum", F32, Const(0.0, F32)), Let("a_sum", F32, Const(0.0, F32)),
              For("kv_s", Const(0), Const(S), 1, (
                  Let("w_s", F32, combine_weight(m_at, f("m_use"))),
                  Assign("l_sum", call("add", f("l_sum"), call("multiply", l_at, f("w_s")))),
                  Assign("a_sum", call("add", f("a_sum"), call("multiply", a_at, f("w_s"))))),
                  dtype=idx)]
    value = call("divide", f("a_sum"), f("l_sum"))
    if op.safe:
        value = call("where", call("eq", f("m_max"), NEG_INF), Const(0.0, F32), value)
    inner.append(Store(op.out, flat_index(op.out_index, tk.shape_of(op.out)), value))
    n = rows * dv
    body: list = [Let("c_gid", idx, add(mul(BlockIdx(), tk.block), ThreadIdx()))]
    body += [If(call("lt", I("c_gid"), Const(n)), tuple(inner))] if n % tk.block else inner
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes) for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)
