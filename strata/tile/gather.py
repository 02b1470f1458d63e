"""The 16-byte windows that VEC consecutive points of a loop read: a byte GEMV's gather plan.

Why: a Q4_0 row keeps 32 weights in 16 bytes, low nibbles first, so the points of one block do
not read consecutive addresses, and vectorize's unit-stride test cannot see that one 16-byte
load brings them all. Here the loop variable is written VEC * q + j (q a fresh index, j a
constant), each point's index and predicate simplified (`a % 32 < 16` becomes true or false),
and every load that moves with the loop is given, per point, as (window, element) of aligned
16-byte windows shared by the loads that read the same bytes, or as None where its predicate is
false (the value is 0). A load all of whose points read one element (a block's scale) reads the
aligned window around it and picks the element (`elem` an expression). tile/gemv.py chooses VEC
with it; kernel_ir/lowerer.py lowers by it.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..core import dtypes
from ..core.expr import (
    Const, Op, Var, add, coefficient, free_vars, mod, mul, simplify, sub, substitute, value_range)
from ..loop.ir import Load
from .ir import flat_index

_CMP = {"lt": lambda lo, hi: (hi < 0, lo >= 0), "le": lambda lo, hi: (hi <= 0, lo > 0),
        "gt": lambda lo, hi: (lo > 0, hi <= 0), "ge": lambda lo, hi: (lo >= 0, hi < 0)}


@dataclass(frozen=True)
class Window:
    buf: str
    start: object                  # flat index of its first element, a multiple of `width`
    width: int                     # elements in 16 bytes
    dtype: str                     # compute dtype of the values


@dataclass(frozen=True)
class Plan:
    inner: str
    q: str                         # inner = vec * q + j
    vec: int
    windows: tuple                 # Window, in first-use order
    points: dict                   # load var -> per j: (window index, element) or None


def at(e, inner: str, q: str, vec: int, j: int, bounds: dict):
    """e at point j (inner = vec * q + j), simplified, comparisons of known sign folded."""
    return fold(substitute(e, {inner: add(mul(Var(q), vec), j)}, bounds), bounds)


def fold(e, bounds: dict):
    if not isinstance(e, Op):
        return e
    args = tuple(fold(a, bounds) for a in e.args)
    if e.op in _CMP and all(dtypes.is_int(a.dtype) for a in args):
        r = value_range(sub(*args), bounds)
        if r is not None:
            yes, no = _CMP[e.op](*r)
            if yes or no:
                return Const(bool(yes), "bool")
    if e.op in ("logical_and", "logical_or") and any(isinstance(a, Const) for a in args):
        c = next(a for a in args if isinstance(a, Const))
        other = args[1] if c is args[0] else args[0]
        if bool(c.value) == (e.op == "logical_or"):
            return Const(e.op == "logical_or", "bool")
        return other
    if e.op == "where" and isinstance(args[0], Const):
        return args[1] if args[0].value else args[2]
    return Op(e.op, args, e.dtype)


def plan(loads, shape_of, dtype_of, inner: str, vec: int, bounds: dict) -> Plan | str:
    """The gather plan of `loads` (Loop IR Loads that move with `inner`), or why there is none."""
    q = f"{inner}_q"
    bounds = {**bounds, q: bounds[inner] // vec}
    windows: list[Window] = []
    keys: dict = {}
    points: dict = {}

    def window(buf, start, width, dtype) -> int:
        key = (buf, str(start))
        if key not in keys:
            keys[key] = len(windows)
            windows.append(Window(buf, start, width, dtype))
        return keys[key]

    for s in loads:
        flat = flat_index(s.index, shape_of(s.buf))
        width = 16 // dtypes.ITEMSIZE[dtype_of(s.buf)]
        if prod(shape_of(s.buf)) % width:     # its last window would read past its end
            return f"{s.buf} is not a whole number of 16-byte windows"
        live = []
        for j in range(vec):
            pred = Const(True, "bool") if s.pred is None else at(s.pred, inner, q, vec, j, bounds)
            if not isinstance(pred, Const):
                return f"{s.buf} is read under a predicate that depends on the point"
            live.append(j if pred.value else None)
        on = [j for j in live if j is not None]
        if not on:
            points[s.var] = (None,) * vec
            continue
        flats = {j: at(flat, inner, q, vec, j, bounds) for j in on}
        ref = flats[on[0]]
        diffs = {j: simplify(sub(f, ref), bounds) for j, f in flats.items()}
        if not all(isinstance(d, Const) for d in diffs.values()):
            return f"{s.buf}'s points are not a constant distance apart"
        r = mod(ref, width, bounds)
        if not isinstance(r, Const):
            if any(d.value for d in diffs.values()):
                return f"{s.buf}'s points do not start 16-byte aligned"
            w = window(s.buf, sub(ref, r), width, s.dtype)      # one element, chosen at run time
            points[s.var] = tuple(None if j is None else (w, r) for j in live)
            continue
        base = sub(ref, r)
        per = []
        for j in live:
            if j is None:
                per.append(None)
                continue
            off = int(r.value) + int(diffs[j].value)
            per.append((window(s.buf, add(base, width * (off // width)), width, s.dtype),
                        off % width))
        points[s.var] = tuple(per)
    return Plan(inner, q, vec, tuple(windows), points)


def moving(body, inner: str, shape_of) -> list:
    """The loads of `body` whose address or predicate moves with `inner`."""
    out = []
    for s in body:
        if isinstance(s, Load):
            c = coefficient(flat_index(s.index, shape_of(s.buf)), inner)
            if c != 0 or (s.pred is not None and inner in free_vars(s.pred)):
                out.append(s)
    return out


def full_windows(p: Plan, itemsize_of) -> bool:
    """Does every window of a 1-byte buffer have all 16 of its bytes used (read once, whole)?"""
    used: dict = {}
    for per in p.points.values():
        for pt in per:
            if pt is not None and isinstance(pt[1], int):
                used.setdefault(pt[0], set()).add(pt[1])
    return all(used.get(i, set()) == set(range(w.width)) for i, w in enumerate(p.windows)
               if itemsize_of(w.buf) == 1)
