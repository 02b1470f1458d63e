"""VEC points of a byte GEMV's loop per thread, loaded by the gather plan (tile/gather.py).

Why a lowering of its own: `_vector_body` turns unit-stride loads into one vector each, but a
Q4_0 block's 32 points read 16 bytes twice over (low nibbles, then high) and its scale is one
element for all of them. Here each 16-byte window of the plan is one LoadVec, issued before
any arithmetic so that all of a thread's loads are in flight together; each point's load is an
element of a window (or 0 where its predicate is false, or the element chosen at run time for
a block's scale), and every Let and Accum runs once per point with the loop index folded.
"""
from __future__ import annotations

from ..core import dtypes
from ..core.expr import Const, Var, call, coefficient, floordiv, free_vars, rename
from ..loop.ir import Accum, Let as LLet, Load as LLoad
from ..tile.gather import at, moving, plan
from ..tile.ir import flat_index
from .ir import Let, LoadVec


def gathers(low, body, inner: str, vec: int) -> bool:
    """Does a load of `body` move with `inner` other than by one vector of consecutive points?"""
    tk = low.tk
    if any(isinstance(s, LLoad) and s.buf in low.smem for s in body):
        return False                # staged rows (RMSNorm's) take `_vector_body`
    return any(s.pred is not None or vec * dtypes.ITEMSIZE[tk.dtype_of(s.buf)] > 16
               or coefficient(flat_index(s.index, tk.shape_of(s.buf)), inner) != 1
               for s in moving(body, inner, tk.shape_of))


def gather_body(low, body, inner: str, vec: int, extent: int) -> list:
    tk = low.tk
    bounds = {**dict(tk.domain), inner: extent}
    p = plan(moving(body, inner, tk.shape_of), tk.shape_of, tk.dtype_of, inner, vec, bounds)
    if isinstance(p, str):
        raise TypeError(f"{tk.name}: no gather plan for {vec} points of {inner}: {p}")
    bounds[p.q] = extent // vec
    out: list = [Let(p.q, low.idx, floordiv(Var(inner, low.idx), vec))]
    names = [f"{inner}_w{i}" for i in range(len(p.windows))]
    for name, w in zip(names, p.windows):
        out.append(LoadVec(tuple(f"{name}_{e}" for e in range(w.width)), w.buf, w.start, w.dtype))
    varying = {inner}

    def point(e, j):
        names_j = {v: f"{v}_{j}" for v in varying if v != inner}
        return at(rename(e, names_j), inner, p.q, vec, j, bounds)

    for s in body:
        if isinstance(s, LLoad) and s.var in p.points:
            varying.add(s.var)
            picked = {}
            for j, pt in enumerate(p.points[s.var]):
                if pt is None:
                    value = Const(0, s.dtype)
                elif isinstance(pt[1], int):
                    value = Var(f"{names[pt[0]]}_{pt[1]}", s.dtype)
                else:                           # one element of the window, known at run time
                    if pt not in picked:
                        picked[pt] = f"{s.var}_pick{len(picked)}"
                        width = p.windows[pt[0]].width
                        out.append(Let(picked[pt], s.dtype,
                                       _select(names[pt[0]], pt[1], width, s.dtype)))
                    value = Var(picked[pt], s.dtype)
                out.append(Let(f"{s.var}_{j}", s.dtype, value))
        elif isinstance(s, LLoad):
            out.extend(low.stmt(s))
        elif isinstance(s, (LLet, Accum)):
            out.extend(lane_stmts(low, s, vec, point, varying))
        else:
            raise TypeError(f"a gathered body cannot hold {s!r}")
    return out


def lane_stmts(low, s, vec: int, at, varying: set) -> list:
    """A Let or an Accum of a body computed VEC points at a time (here and the lowerer's vector
    body; at(e, j) is e at point j): a Let whose value moves with the points is one Let per point
    (and its variable moves too), an Accum takes the points in order."""
    if isinstance(s, LLet):
        if not free_vars(s.value) & varying:
            return list(low.stmt(s))
        varying.add(s.var)
        dt = dtypes.compute_dtype(s.value.dtype)
        return [Let(f"{s.var}_{j}", dt, at(s.value, j)) for j in range(vec)]
    out = []
    for j in range(vec):
        index = None if s.index is None else at(s.index, j)
        out.extend(low.accumulate(s.acc, s.op, at(s.value, j), index))
    return out


def _select(window: str, elem, width: int, dtype: str):
    value = Var(f"{window}_{width - 1}", dtype)
    for e in reversed(range(width - 1)):
        value = call("where", call("eq", elem, Const(e)), Var(f"{window}_{e}", dtype), value)
    return value
