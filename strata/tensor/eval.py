"""NumPy evaluation of Tensor IR: the reference every later stage is compared against.

precision="f64": every floating value is computed and kept in float64 (the high-precision
reference); only explicit `cast` nodes, which are the user's own conversions, round. precision="native": each node computes in
its compute type (f32 for f16/bf16) and rounds its result to its own dtype, as a GPU would when
it stores the node; bf16 values are held in float32.

`evaluate` returns {output name: array}; `evaluate_all` returns every node's value, which is how
a test finds the first node where two executors disagree.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..core import dtypes, scalar_ops
from ..core.expr import cast_values, evaluate as eval_expr
from .ir import (Custom, Elementwise, Full, Gather, IndexMap, Input, Iota, Node, Reduce, Scatter,
                 TensorProgram)


def value_type(dtype: str, precision: str):
    if dtypes.is_float(dtype):
        return np.float64 if precision == "f64" else dtypes.to_numpy(dtypes.compute_dtype(dtype))
    return dtypes.to_numpy(dtype)


def _store(v, dtype: str, precision: str) -> np.ndarray:
    v = np.asarray(v)
    if precision == "f64" or not dtypes.is_float(dtype):
        with np.errstate(all="ignore"):
            if dtypes.is_int(dtype) and v.dtype.kind == "f":
                return cast_values(v, dtype)
            return v.astype(value_type(dtype, precision))
    return dtypes.round_to(v, dtype)


def _load(v: np.ndarray, dtype: str, precision: str) -> np.ndarray:
    """An operand in the type arithmetic on it runs in."""
    return np.asarray(v, dtype=value_type(dtype, precision))


def _grid(shape) -> dict[str, np.ndarray]:
    return {f"i{d}": g for d, g in enumerate(np.indices(shape, dtype=np.int64))} if shape else {}


def _read(n: Node, src: np.ndarray, index, env, valid=None) -> np.ndarray:
    shape = n.type.shape
    idx = [np.broadcast_to(np.asarray(eval_expr(e, env), dtype=np.int64), shape) for e in index]
    mask = None if valid is None else np.broadcast_to(np.asarray(eval_expr(valid, env), dtype=bool), shape)
    safe = []
    for d, ix in enumerate(idx):
        bad = (ix < 0) | (ix >= src.shape[d])
        if mask is not None:
            bad &= mask
        if bad.any():
            raise IndexError(f"{n.name}: index along dim {d} out of range 0..{src.shape[d] - 1}")
        safe.append(np.where(mask, ix, 0) if mask is not None else ix)
    out = src[tuple(safe)] if safe else np.broadcast_to(src, shape)
    if mask is not None:
        out = np.where(mask, out, np.asarray(n.fill).astype(out.dtype))
    return np.asarray(out)


def _reduce(op: str, v: np.ndarray, axes: tuple) -> np.ndarray:
    if op in ("argmax", "argmin"):
        rest = [d for d in range(v.ndim) if d not in axes]
        moved = np.transpose(v, rest + list(axes))
        flat = moved.reshape(moved.shape[:len(rest)] + (-1,))
        r = (np.argmax if op == "argmax" else np.argmin)(flat, axis=-1)
        keep = tuple(1 if d in axes else s for d, s in enumerate(v.shape))
        return r.reshape(keep).astype(np.int64)
    fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    return fn(v, axis=axes, keepdims=True)


def _node(n: Node, vals: dict, inputs: Mapping, weights: Mapping, precision: str):
    dt = n.type.dtype
    if isinstance(n, Input):
        src = inputs[n.name] if n.kind == "input" else weights[n.name]
        if hasattr(src, "detach"):                      # a torch tensor
            src = src.detach().cpu()
            src = (src.float() if dt in ("bf16", *dtypes.FLOAT8) else src).numpy()
        src = np.asarray(src)
        return _store(src, dt, precision) if precision == "f64" else dtypes.round_to(src, dt)
    if isinstance(n, Full):
        return np.full(n.type.shape, n.value, dtype=value_type(dt, precision))
    if isinstance(n, Iota):
        shape = n.type.shape
        ar = np.arange(shape[n.axis], dtype=np.int64).reshape(
            [-1 if d == n.axis else 1 for d in range(len(shape))])
        return np.broadcast_to(ar, shape).copy()
    if isinstance(n, Elementwise):
        args = [vals[a] if isinstance(a, str) else a for a in n.args]
        if n.op == "cast":
            v = args[0]
            if precision == "f64" and dtypes.is_float(dt):     # a user's cast rounds, even here
                return np.asarray(cast_values(v, dt), dtype=np.float64)
            return cast_values(v, dt)
        op = scalar_ops.get(n.op)
        if op.result != "bool" and n.op != "where":
            args = [_load(a, dt, precision) if isinstance(a, np.ndarray) else a for a in args]
        with np.errstate(all="ignore"):
            r = op.numpy(*args)
        return _store(np.broadcast_to(r, n.type.shape), dt, precision)
    if isinstance(n, Reduce):
        src = vals[n.arg]
        if n.op in ("sum", "prod") and dtypes.is_float(dt):
            src = _load(src, dt, precision)
        with np.errstate(all="ignore"):
            return _store(_reduce(n.op, src, n.axes), dt, precision)
    if isinstance(n, IndexMap):
        return _read(n, vals[n.arg], n.index, _grid(n.type.shape), n.valid)
    if isinstance(n, Gather):
        env = _grid(n.type.shape)
        env["idx"] = np.asarray(vals[n.indices], dtype=np.int64)
        return _read(n, vals[n.data], n.index, env)
    if isinstance(n, Scatter):
        out = np.array(vals[n.dest], copy=True)
        idx = np.asarray(vals[n.indices], dtype=np.int64)
        np.moveaxis(out, n.axis, 0)[idx] = np.moveaxis(np.asarray(vals[n.values]), n.axis, 0)
        return out
    if isinstance(n, Custom):         # the op itself, eagerly (st.custom_op)
        return n.kernel.reference([vals[a] if isinstance(a, str) else a for a in n.args],
                                  n.type.dtype, precision)
    raise TypeError(f"cannot evaluate {n!r}")


def evaluate_all(prog: TensorProgram, inputs: Mapping[str, np.ndarray],
                 precision: str = "f64") -> dict[str, np.ndarray]:
    """Every node's value, by name."""
    if precision not in ("f64", "native"):
        raise ValueError(f"precision must be 'f64' or 'native', not {precision!r}")
    vals: dict[str, np.ndarray] = {}
    for n in prog.nodes:
        vals[n.name] = _node(n, vals, inputs, prog.weights, precision)
    return vals


def evaluate(prog: TensorProgram, inputs: Mapping[str, np.ndarray],
             precision: str = "f64") -> dict[str, np.ndarray]:
    """{output name: value}; inputs by name (NumPy arrays, bf16 values as float32)."""
    vals = evaluate_all(prog, inputs, precision)
    return {o: vals[o] for o in prog.outputs}
