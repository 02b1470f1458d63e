"""NumPy evaluation of Loop IR: checks fusion and indexing independently of any GPU schedule.

Loops are not iterated one by one: a loop at nesting depth d binds its variable to an
arange along NumPy axis d, statements compute on broadcast arrays, an accumulation reduces
its loop's axis, and a store scatters with fancy indexing. Floats compute in float64.
A fused `Attention` statement (loop/attention.py) runs as a plain softmax attention: its operands
on broadcast axes (*batch, i, j, d, e), scores, x, a softmax over j in one piece.
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes
from ..core.expr import Expr, evaluate as eval_expr
from .attention import Attention
from .ir import Accum, CustomCall, Let, Load, Loop, LoopProgram, Store


def _reduce(op: str, vals: np.ndarray, axis: int):
    with np.errstate(all="ignore"):
        if op == "sum":
            return vals.sum(axis=axis, keepdims=True)
        if op == "prod":
            return vals.prod(axis=axis, keepdims=True)
        if op in ("max", "min"):
            nan = np.isnan(vals).any(axis=axis, keepdims=True) if vals.dtype.kind == "f" else False
            out = (vals.max if op == "max" else vals.min)(axis=axis, keepdims=True)
            return np.where(nan, np.nan, out) if vals.dtype.kind == "f" else out
    raise KeyError(op)


def _arg_reduce(op: str, vals: np.ndarray, axis: int):
    if vals.dtype.kind == "f":
        nan = np.isnan(vals)
        has_nan = nan.any(axis=axis, keepdims=True)
        key = np.where(nan, 0, vals)
        idx = (np.argmax if op == "argmax" else np.argmin)(key, axis=axis, keepdims=True)
        return np.where(has_nan, np.argmax(nan, axis=axis, keepdims=True), idx)
    return (np.argmax if op == "argmax" else np.argmin)(vals, axis=axis, keepdims=True)


class _Evaluator:
    def __init__(self, buffers: dict[str, np.ndarray], ndim: int):
        self.buffers, self.ndim = buffers, ndim

    def expr(self, e: Expr, env):
        return eval_expr(e, env)

    def run(self, body, env: dict, depth: int, accs: dict | None = None):
        for s in body:
            if isinstance(s, Load):
                buf = self.buffers[s.buf]
                idx = [np.asarray(self.expr(e, env)) for e in s.index]
                if s.pred is not None:
                    p = np.asarray(self.expr(s.pred, env), dtype=bool)
                    shape = np.broadcast_shapes(p.shape, *[i.shape for i in idx])
                    idx = [np.where(p, i, 0) for i in idx]
                    vals = buf[tuple(np.broadcast_to(i, shape) for i in idx)]
                    vals = np.where(np.broadcast_to(p, shape), vals, np.zeros((), vals.dtype))
                else:
                    vals = buf[tuple(idx)] if idx else buf[()]
                env[s.var] = vals
            elif isinstance(s, Let):
                env[s.var] = self.expr(s.value, env)
            elif isinstance(s, Accum):
                accs[s.acc] = (s, self.expr(s.value, env))
            elif isinstance(s, Store):
                val = np.asarray(self.expr(s.value, env))
                idx = [np.asarray(self.expr(e, env)) for e in s.index]
                shape = np.broadcast_shapes(val.shape, *[i.shape for i in idx])
                buf = self.buffers[s.buf]
                buf[tuple(np.broadcast_to(i, shape) for i in idx)] = np.broadcast_to(val, shape)
            elif isinstance(s, Attention):
                self.attention(s)
            elif isinstance(s, CustomCall):
                args = [self.buffers[a] if isinstance(a, str) else a for a in s.args]
                out = self.buffers[s.out]
                out[...] = s.kernel.reference(args, s.dtype, "f64")
            elif isinstance(s, Loop):
                shape = [1] * self.ndim
                shape[depth] = s.extent
                inner = dict(env)
                inner[s.var] = np.arange(s.extent, dtype=np.int64).reshape(shape)
                found: dict = {}
                self.run(s.body, inner, depth + 1, found)
                for a in s.accs:
                    stmt, vals = found[a.acc]
                    full = np.broadcast_to(vals, np.broadcast_shapes(np.shape(vals), tuple(shape)))
                    if a.op in ("argmax", "argmin"):
                        env[a.acc + "_i"] = _arg_reduce(a.op, full, depth)
                    else:
                        env[a.acc] = _reduce(a.op, full, depth)

    def attention(self, s: Attention) -> None:
        """out = softmax_j(x(sum_d q k)) @ v in float64 (a row of -inf gives 0 if safe, else NaN),
        or x(s, t) @ v in the sum form; lse = logsumexp_j(x) if asked."""
        names = [v for v, _ in s.batch] + [s.i[0], s.j[0], s.d[0], s.e[0]]
        extents = [n for _, n in s.batch] + [s.i[1], s.j[1], s.d[1], s.e[1]]
        if s.d2:
            names, extents = names + [s.d2[0]], extents + [s.d2[1]]
        nd = len(names)
        env: dict = {}
        for ax, (v, n) in enumerate(zip(names, extents)):
            shape = [1] * nd
            shape[ax] = n
            env[v] = np.arange(n, dtype=np.int64).reshape(shape)

        def operand(o, extra=None) -> np.ndarray:
            inner = dict(env, **(extra or {}))
            self.run(o.body, inner, 0)
            return np.asarray(self.expr(o.value, inner), dtype=np.float64)
        nb = len(s.batch)
        j_ax, d_ax = nb + 1, nb + 2
        with np.errstate(all="ignore"):
            scores = {s.score: (operand(s.q) * operand(s.k)).sum(axis=d_ax, keepdims=True)}
            if s.q2 is not None:
                scores[s.score2] = (operand(s.q2) * operand(s.k2)).sum(axis=nd - 1, keepdims=True)
            x = np.broadcast_to(operand(s.x, scores),
                                np.broadcast_shapes(*(a.shape for a in scores.values()),
                                                    tuple(extents[:nb + 2]) + (1,) * (nd - nb - 2)))
            if s.norm == "sum":
                out = (x * operand(s.v)).sum(axis=j_ax, keepdims=True)
            else:
                m = x.max(axis=j_ax, keepdims=True)
                p = np.exp(x - np.where(s.safe & (m == -np.inf), 0.0, m))
                out = (p * operand(s.v)).sum(axis=j_ax, keepdims=True) / p.sum(axis=j_ax, keepdims=True)
                if s.safe:
                    out = np.where(m == -np.inf, 0.0, out)
                if s.lse:
                    self._store(s.lse[0], s.lse[1], env, m + np.log(p.sum(axis=j_ax, keepdims=True)))
        self._store(s.out, s.out_index, env, out)

    def _store(self, buf: str, index, env: dict, value) -> None:
        idx = [np.asarray(self.expr(e, env)) for e in index]
        shape = np.broadcast_shapes(value.shape, *[i.shape for i in idx])
        self.buffers[buf][tuple(np.broadcast_to(i, shape) for i in idx)] = np.broadcast_to(value, shape)


def _depth(body) -> int:
    return max((1 + _depth(s.body) for s in body if isinstance(s, Loop)), default=0)


def run(prog: LoopProgram, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute every kernel; returns the program outputs by name (float64 for float outputs)."""
    buffers: dict[str, np.ndarray] = {}
    for b in prog.buffers:
        if b.kind in ("input", "weight"):
            src = inputs[b.name] if b.name in inputs else prog.weights[b.name]
            arr = np.asarray(src)
            buffers[b.name] = arr.astype(np.float64) if dtypes.is_float(b.dtype) else arr
        else:
            dt = np.float64 if dtypes.is_float(b.dtype) else dtypes.to_numpy(b.dtype)
            buffers[b.name] = np.full(b.shape, np.nan) if dtypes.is_float(b.dtype) \
                else np.zeros(b.shape, dtype=dt)
    for k in prog.kernels:
        ev = _Evaluator(buffers, max(_depth(k.body), 1))
        ev.run(k.body, {}, 0)
        for w in k.writes:
            b = prog.buffer(w)
            if not dtypes.is_float(b.dtype):
                buffers[w] = buffers[w].astype(dtypes.to_numpy(b.dtype))
    return {o: buffers[o] for o in prog.outputs}
