"""Scalar expressions shared by every IR: index arithmetic, predicates and scalar math.

An index such as `x[a1 * 2048 + a2]` or a reshape's `(i0 * 2048 + i1) // 64` is an `Expr`.
`simplify` puts integer arithmetic into a canonical affine form and, given the extents of the
loop variables, removes the `//` and `%` that reshapes of reshapes leave behind, so printed IR
stays readable and equal IRs print identically. `evaluate` runs an expression on NumPy arrays
(one element per lane or per output index), which is how every evaluator and the simulator
compute.
"""
from __future__ import annotations

import math

from functools import lru_cache

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from . import dtypes, scalar_ops


class Expr:
    """Base class; subclasses are frozen dataclasses."""
    dtype: str

    def __str__(self) -> str:
        return to_str(self)


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | bool
    dtype: str = "i64"


@dataclass(frozen=True)
class Var(Expr):
    name: str
    dtype: str = "i64"


@dataclass(frozen=True)
class Op(Expr):
    op: str
    args: tuple
    dtype: str

    def __post_init__(self):
        scalar_ops.get(self.op)


@dataclass(frozen=True)
class Cast(Expr):
    arg: Expr
    dtype: str


def const(v, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(v, (bool, np.bool_)) else ("i64" if isinstance(v, (int, np.integer)) else "f32")
    return Const(v, dtype)


def as_expr(v) -> Expr:
    return v if isinstance(v, Expr) else const(v)


def call(op: str, *args) -> Expr:
    """A scalar op applied to args, with its result dtype from the op table."""
    args = tuple(as_expr(a) for a in args)
    return Op(op, args, scalar_ops.result_dtype(op, [a.dtype for a in args]))


# ---------------------------------------------------------------- integer index arithmetic

def _is_int(e: Expr) -> bool:
    return dtypes.is_int(e.dtype)


def add(a, b) -> Expr:
    return simplify(Op("add", (as_expr(a), as_expr(b)), "i64"))


def sub(a, b) -> Expr:
    return simplify(Op("subtract", (as_expr(a), as_expr(b)), "i64"))


def mul(a, b) -> Expr:
    return simplify(Op("multiply", (as_expr(a), as_expr(b)), "i64"))


def floordiv(a, b, bounds: Mapping[str, int] | None = None) -> Expr:
    return simplify(Op("floordiv", (as_expr(a), as_expr(b)), "i64"), bounds)


def mod(a, b, bounds: Mapping[str, int] | None = None) -> Expr:
    return simplify(Op("mod", (as_expr(a), as_expr(b)), "i64"), bounds)


def _linear(e: Expr) -> tuple[dict, int] | None:
    """e as ({atom: coeff}, const) when e is integer affine in its atoms, else None."""
    if isinstance(e, Const) and _is_int(e):
        return {}, int(e.value)
    if isinstance(e, Var) or (isinstance(e, Op) and (e.op in ("floordiv", "mod") or e.op in (
            "minimum", "maximum") and _is_int(e))):     # (a clamped row: min(m, M - 1))
        return {e: 1}, 0
    if not isinstance(e, (Op, Const, Cast)) and _is_int(e):   # IR-specific atoms (threadIdx.x)
        return {e: 1}, 0
    if isinstance(e, Op) and e.op in ("add", "subtract") and _is_int(e):
        a, b = _linear(e.args[0]), _linear(e.args[1])
        if a is None or b is None:
            return None
        sign = 1 if e.op == "add" else -1
        terms = dict(a[0])
        for k, v in b[0].items():
            terms[k] = terms.get(k, 0) + sign * v
        return _merge_div_mod({k: v for k, v in terms.items() if v}, a[1] + sign * b[1])
    if isinstance(e, Op) and e.op == "multiply" and _is_int(e):
        a, b = _linear(e.args[0]), _linear(e.args[1])
        if a is None or b is None:
            return None
        if not a[0]:
            a, b = b, a
        if not b[0]:
            c = b[1]
            return {k: v * c for k, v in a[0].items() if v * c}, a[1] * c
        return {e: 1}, 0
    return None


def _term_key(item):
    atom, coeff = item
    return (coeff < 0, -abs(coeff), to_str(atom))


def from_linear(terms: dict, c: int) -> Expr:
    out: Expr | None = None
    items = sorted(terms.items(), key=_term_key)
    if items and all(v < 0 for _, v in items) and c > 0:   # print `9 - i0`, not `i0 * -1 + 9`
        out, c = Const(c), 0
    for atom, coeff in items:
        if coeff < 0 and out is not None:
            t = atom if coeff == -1 else Op("multiply", (atom, Const(-coeff)), "i64")
            out = Op("subtract", (out, t), "i64")
            continue
        if coeff == 1:
            t = atom
        else:
            t = Op("multiply", (atom, Const(coeff)), "i64")
        out = t if out is None else Op("add", (out, t), "i64")
    if out is None:
        return Const(c)
    if c > 0:
        return Op("add", (out, Const(c)), "i64")
    if c < 0:
        return Op("subtract", (out, Const(-c)), "i64")
    return out


def _merge_div_mod(terms: dict, k: int) -> tuple[dict, int]:
    """x // c * c + x % c is x (with C's division as with floor division): an index split into
    blocks and joined again (a head's dimension, a quantized block) becomes affine in x."""
    for mod in [a for a in terms if isinstance(a, Op) and a.op == "mod"]:
        div = Op("floordiv", mod.args, mod.dtype)
        c, lin = mod.args[1], _linear(mod.args[0])
        if not isinstance(c, Const) or lin is None or terms.get(div) != int(c.value) * terms[mod]:
            continue
        m = terms.pop(mod)
        del terms[div]
        for a, v in lin[0].items():
            terms[a] = terms.get(a, 0) + m * v
        k += m * lin[1]
    return {a: v for a, v in terms.items() if v}, k


def affine_terms(e: Expr) -> tuple[dict, int] | None:
    """e as ({atom: coefficient}, constant) when e is integer-affine in its atoms, else None."""
    return _linear(simplify(e))


def coefficient(e: Expr, var: str) -> int | None:
    """The coefficient of `var` in e if e is affine in it, else None."""
    lin = _linear(simplify(e))
    if lin is None:
        return None
    coeff = lin[0].get(Var(var), 0)
    others = [a for a in lin[0] if a != Var(var) and var in free_vars(a)]
    return None if others else coeff


def value_range(e: Expr, bounds: Mapping[str, int] | None) -> tuple[int, int] | None:
    """Inclusive integer range of e, given variable extents (var in [0, extent)); None if unknown."""
    bounds = bounds or {}
    if isinstance(e, Const):
        return (int(e.value), int(e.value)) if _is_int(e) or e.dtype == "bool" else None
    if isinstance(e, Var):
        return (0, bounds[e.name] - 1) if e.name in bounds else None
    if not isinstance(e, (Op, Cast)):           # IR-specific atoms: bounds keyed by their text
        key = to_str(e)
        return (0, bounds[key] - 1) if key in bounds else None
    if isinstance(e, Op):
        if e.op == "mod":
            r = value_range(e.args[0], bounds)
            c = e.args[1]
            if isinstance(c, Const) and r is not None and r[0] >= 0:
                return (0, min(int(c.value) - 1, r[1]))
            return None
        if e.op == "floordiv":
            r = value_range(e.args[0], bounds)
            c = e.args[1]
            if isinstance(c, Const) and r is not None and int(c.value) > 0:
                return (r[0] // int(c.value), r[1] // int(c.value))
            return None
        lin = _linear(e)
        if lin is None or (len(lin[0]) == 1 and lin[0].get(e) == 1):
            return None
        lo = hi = lin[1]
        for atom, coeff in lin[0].items():
            r = value_range(atom, bounds)
            if r is None:
                return None
            lo += min(coeff * r[0], coeff * r[1])
            hi += max(coeff * r[0], coeff * r[1])
        return lo, hi
    return None


def simplify(e: Expr, bounds: Mapping[str, int] | None = None) -> Expr:
    """Canonical form of integer index arithmetic; other expressions simplify their children."""
    if isinstance(e, (Const, Var)):
        return e
    if not bounds:        # index arithmetic is built up a term at a time: each subtree once
        return _simplify_unbounded(e)
    return _simplify(e, bounds)


@lru_cache(maxsize=1 << 16)
def _simplify_unbounded(e: Expr) -> Expr:
    return _simplify(e, None)


def _simplify(e: Expr, bounds: Mapping[str, int] | None) -> Expr:
    if isinstance(e, (Const, Var)):
        return e
    if isinstance(e, Cast):
        return Cast(simplify(e.arg, bounds), e.dtype)
    if not isinstance(e, Op):
        return e.map_children(lambda c: simplify(c, bounds))
    args = tuple(simplify(a, bounds) for a in e.args)
    if not _is_int(e) or e.op not in ("add", "subtract", "multiply", "floordiv", "mod"):
        if e.op == "where" and isinstance(args[0], Const):
            return args[1] if args[0].value else args[2]
        return Op(e.op, args, e.dtype)
    if e.op in ("floordiv", "mod"):
        x, c = args
        if not isinstance(c, Const) or int(c.value) <= 0:
            return Op(e.op, args, e.dtype)
        c = int(c.value)
        if c == 1:
            return x if e.op == "floordiv" else Const(0)
        # nested: (x // a) // b == x // (a*b); (x % (a*b)) % b == x % b
        if e.op == "floordiv" and isinstance(x, Op) and x.op == "floordiv" and isinstance(x.args[1], Const):
            return simplify(Op("floordiv", (x.args[0], Const(int(x.args[1].value) * c)), "i64"), bounds)
        if e.op == "mod" and isinstance(x, Op) and x.op == "mod" and isinstance(x.args[1], Const) \
                and int(x.args[1].value) % c == 0:
            return simplify(Op("mod", (x.args[0], Const(c)), "i64"), bounds)
        lin = _linear(x)
        if lin is None:
            return Op(e.op, (x, Const(c)), "i64")
        terms, k = lin
        q_terms = {a: v // c for a, v in terms.items() if v % c == 0}
        r_terms = {a: v for a, v in terms.items() if v % c != 0}
        kq, kr = divmod(k, c)
        rest = from_linear(r_terms, kr)
        rng = value_range(rest, bounds)
        fits = rng is not None and rng[0] >= 0 and rng[1] < c
        if e.op == "floordiv":
            q = from_linear(q_terms, kq)
            if fits:
                return q
            if not r_terms and kr == 0:
                return q
            if (split := _split_by_divisor(terms, k, c, bounds)) is not None:
                return split[0]
            inner = Op("floordiv", (rest, Const(c)), "i64")
            return from_linear({**{a: v for a, v in q_terms.items()}, inner: 1}, kq) if q_terms or kq else inner
        if fits:
            return rest
        if not r_terms:
            return Const(kr % c)
        if (split := _split_by_divisor(terms, k, c, bounds)) is not None:
            return split[1]
        return Op("mod", (rest, Const(c)), "i64")
    lin = _linear(Op(e.op, args, e.dtype))
    if lin is None:
        return Op(e.op, args, e.dtype)
    return from_linear(*lin)


def _split_by_divisor(terms: dict, k: int, c: int, bounds):
    """(x // c, x % c) for x = g*y + r with g a divisor of c and 0 <= r < g (r: the terms g does
    not divide): y // (c/g) and (y % (c/g)) * g + r. A block inside a block, (32 k_o + k_i) // 256
    with k_i < 32, is k_o // 8. None where no divisor splits x so."""
    if not bounds:
        return None
    for g in sorted({math.gcd(c, v) for v in terms.values()} - {1, c}, reverse=True):
        r = from_linear({a: v for a, v in terms.items() if v % g}, k % g)
        rng = value_range(r, bounds)
        if rng is not None and rng[0] >= 0 and rng[1] < g:
            y = from_linear({a: v // g for a, v in terms.items() if v % g == 0}, k // g)
            return (simplify(Op("floordiv", (y, Const(c // g)), "i64"), bounds),
                    simplify(add(mul(Op("mod", (y, Const(c // g)), "i64"), g), r), bounds))
    return None


# ---------------------------------------------------------------- traversal

def children(e: Expr) -> tuple:
    """Sub-expressions; IR-specific nodes (kernel loads, shuffles) define `children()`."""
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Cast):
        return (e.arg,)
    if isinstance(e, (Const, Var)):
        return ()
    return e.children()


def nodes(e: Expr):
    """e and every sub-expression, depth first (IR-specific nodes included)."""
    yield e
    for c in children(e):
        yield from nodes(c)


def free_vars(e: Expr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    out: set[str] = set()
    for c in children(e):
        out |= free_vars(c)
    return out


def map_expr(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """e rebuilt top-down: fn(x) gives x's replacement, or None to keep x and visit its
    children (IR-specific nodes, such as kernel loads, included); no simplification."""
    out = fn(e)
    if out is not None:
        return out
    if isinstance(e, (Const, Var)):
        return e
    if isinstance(e, Op):
        return Op(e.op, tuple(map_expr(a, fn) for a in e.args), e.dtype)
    if isinstance(e, Cast):
        return Cast(map_expr(e.arg, fn), e.dtype)
    return e.map_children(lambda c: map_expr(c, fn))


def rename(e: Expr, names: Mapping[str, str]) -> Expr:
    """The same expression with variables renamed (dtypes kept); no simplification."""
    if isinstance(e, Var):
        return Var(names.get(e.name, e.name), e.dtype)
    if isinstance(e, Const):
        return e
    if isinstance(e, Op):
        return Op(e.op, tuple(rename(a, names) for a in e.args), e.dtype)
    if isinstance(e, Cast):
        return Cast(rename(e.arg, names), e.dtype)
    return e.map_children(lambda c: rename(c, names))


def substitute(e: Expr, mapping: Mapping[str, Expr], bounds: Mapping[str, int] | None = None) -> Expr:
    """Replace variables by expressions (and re-simplify integer arithmetic)."""
    def go(x: Expr) -> Expr:
        if isinstance(x, Var):
            return mapping.get(x.name, x)
        if isinstance(x, Const):
            return x
        if isinstance(x, Op):
            return Op(x.op, tuple(go(a) for a in x.args), x.dtype)
        if isinstance(x, Cast):
            return Cast(go(x.arg), x.dtype)
        return x.map_children(go)  # IR-specific expression nodes (e.g. kernel loads)
    return simplify(go(e), bounds)


# ---------------------------------------------------------------- printing

# Python's precedence (higher binds tighter): bits between comparisons and sums
_INFIX = {"add": ("+", 5), "subtract": ("-", 5), "multiply": ("*", 6), "floordiv": ("//", 6),
          "mod": ("%", 6), "left_shift": ("<<", 4), "right_shift": (">>", 4),
          "bitwise_and": ("&", 3), "bitwise_xor": ("^", 2), "bitwise_or": ("|", 1),
          "lt": ("<", 0), "le": ("<=", 0), "gt": (">", 0), "ge": (">=", 0),
          "eq": ("==", 0), "ne": ("!=", 0), "logical_and": ("&&", -2), "logical_or": ("||", -3)}


def format_const(value, dtype: str) -> str:
    if dtype == "bool":
        return "true" if value else "false"
    if dtypes.is_float(dtype):
        v = float(value)
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v) if v != int(v) or abs(v) >= 1e16 else repr(float(v))
    return str(int(value))


def to_str(e: Expr, prec: int = -10) -> str:
    """Readable infix form: index arithmetic infix, everything else as op(args)."""
    if isinstance(e, Const):
        return format_const(e.value, e.dtype)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Cast):
        return f"{e.dtype}({to_str(e.arg)})"
    if isinstance(e, Op):
        if e.op in _INFIX and (_is_int(e.args[0]) or e.args[0].dtype == "bool"):
            sym, p = _INFIX[e.op]
            s = f"{to_str(e.args[0], p)} {sym} {to_str(e.args[1], p + 1)}"
            return f"({s})" if p < prec else s
        return f"{e.op}({', '.join(to_str(a) for a in e.args)})"
    return e.to_text(to_str)   # IR-specific nodes print themselves


# ---------------------------------------------------------------- evaluation

def evaluate(e: Expr, env: Mapping[str, np.ndarray], extra: Callable | None = None):
    """Evaluate on NumPy values; `extra(e, recurse)` handles IR-specific expression nodes."""
    def go(x: Expr):
        if isinstance(x, Const):
            return np.asarray(x.value, dtype=dtypes.to_numpy(x.dtype)) if x.dtype != "bool" \
                else np.asarray(bool(x.value))
        if isinstance(x, Var):
            return env[x.name]
        if isinstance(x, Cast):
            return cast_values(go(x.arg), x.dtype)
        if isinstance(x, Op):
            vals = [go(a) for a in x.args]
            if x.op in ("floordiv", "mod") and _is_int(x):
                return (np.floor_divide if x.op == "floordiv" else np.mod)(*vals)
            with np.errstate(all="ignore"):
                return scalar_ops.get(x.op).numpy(*vals)
        if extra is None:
            raise TypeError(f"cannot evaluate {x!r}")
        return extra(x, go)
    return go(e)


def cast_values(v: np.ndarray, dtype: str) -> np.ndarray:
    """C-like conversion of values to `dtype` (float->int truncates; bf16 rounds to bf16)."""
    v = np.asarray(v)
    with np.errstate(all="ignore"):
        if dtype == "bool":
            return v != 0
        if dtypes.is_int(dtype) and v.dtype.kind == "f":
            return np.trunc(np.nan_to_num(v)).astype(dtypes.to_numpy(dtype))
        return dtypes.round_to(v, dtype)
