"""cpu_split_guards: a CPU row loop whose loads are guarded by comparing its index with constants
(a concat's halves: RoPE's rotate_half; a pad's edges) runs as one loop per interval between
those constants, each with the guards it meets decided.

Why: a guarded load vectorises only as a masked load, which AVX2 has for 32-bit floats
(vmaskmovps) and not for 16-bit ones, so gcc left the whole loop scalar: bf16 RoPE on
TinyLlama's q and k at seq 128 ran 0.66x eager on a 2-core Zen 3 EPYC (AVX2, 2026-11-27).
Split, each loop's loads are plain and contiguous on every ISA, and no lane loads what it throws
away. Only guarded loads of floats count (a Q4_0 block's guarded nibble loads are printed whole
by codegen/c_qdot.py), only comparisons of the index plus a constant with a constant (what
concat and pad produce), and at most MAX_PIECES loops come out of one.
"""
from __future__ import annotations

import operator
from dataclasses import replace

from ...core import dtypes
from ...core.context import Context
from ...core.expr import Cast, Const, Op, Var, affine_terms, free_vars, substitute, value_range
from ...loop.ir import Let, Load, Loop
from ..ir import Mode, TileKernel, map_body, walk

MAX_PIECES = 4
_FLIP = {"lt": 0, "ge": 0, "le": 1, "gt": 1}      # x < c, x >= c change at c; x <= c, x > c at c + 1
_TEST = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}


def cpu_split_guards(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode is not Mode.ROWS:
        return k
    split = []

    def fn(s):
        if not isinstance(s, Loop) or s.kind != "free" or s.accs:
            return s
        cuts = _cuts(s)
        if not cuts or len(cuts) >= MAX_PIECES:
            return s
        split.append(f"{s.var} at {', '.join(map(str, cuts))}")
        edges = (0, *cuts, s.extent)
        return tuple(_piece(s, lo, hi) for lo, hi in zip(edges, edges[1:]))
    body = map_body(k.body, fn)
    if not split:
        return k
    ctx.log(f"cpu_split_guards: {k.name}: splits the loop of {'; '.join(split)}", 2)
    return replace(k, body=body)


def _cuts(loop: Loop) -> list[int]:
    """The indices inside the loop where a guard of one of its loads changes value."""
    guarded = [s for s in walk(loop.body) if isinstance(s, Load) and s.pred is not None
               and loop.var in free_vars(s.pred)]
    if any(not dtypes.is_float(s.dtype) for s in guarded):
        return []                               # a quantized block's nibbles (c_qdot prints it)
    guards = [s.pred for s in guarded]
    cuts = set()
    for pred in guards:
        for e in _comparisons(pred):
            if loop.var not in free_vars(e):
                continue                        # (an outer index's: the same all along)
            at = _cut(e, loop.var)
            if at is None:
                return []                       # a guard the split would not decide
            if 0 < at < loop.extent:
                cuts.add(at)
    return sorted(cuts)


def _comparisons(e):
    """The comparisons a guard is made of (conjunctions of them; anything else is returned as
    itself, and _cut refuses it)."""
    if isinstance(e, Op) and e.op == "logical_and":
        return [c for a in e.args for c in _comparisons(a)]
    return [e]


def _cut(e, var: str) -> int | None:
    """Where `var + c0 <op> c1` changes value, or None if e is not of that form."""
    if not (isinstance(e, Op) and e.op in _FLIP and isinstance(e.args[1], Const)):
        return None
    lin = affine_terms(e.args[0])
    if lin is None or len(lin[0]) != 1:
        return None
    (atom, coeff), = lin[0].items()
    if coeff != 1 or not (isinstance(atom, Var) and atom.name == var):
        return None
    return int(e.args[1].value) - lin[1] + _FLIP[e.op]


def _piece(loop: Loop, lo: int, hi: int) -> Loop:
    """The loop over [lo, hi), its index shifted to start at 0 and its decided comparisons
    folded (a load whose guard is always true loads plainly)."""
    shift = {loop.var: Op("add", (Var(loop.var, "i64"), Const(lo)), "i64")} if lo else {}
    bounds = {loop.var: hi - lo}

    def fold(e):
        return _fold(substitute(e, shift) if shift else e, bounds)

    def stmt(s):
        s = s.map_exprs(fold)
        if isinstance(s, Load) and isinstance(s.pred, Const):
            return replace(s, pred=None) if s.pred.value else Let(s.var, Const(0.0, s.dtype))
        return s
    return replace(loop, extent=hi - lo, body=map_body(loop.body, stmt))


def _fold(e, bounds):
    """e with each comparison of an index with a constant that the loop's range decides as True
    or False, and each where() or conjunction of a decided condition reduced, bottom-up."""
    if isinstance(e, Cast):
        return Cast(_fold(e.arg, bounds), e.dtype)
    if not isinstance(e, Op):
        return e
    e = Op(e.op, tuple(_fold(a, bounds) for a in e.args), e.dtype)
    first = e.args[0]
    if e.op in _FLIP and isinstance(e.args[1], Const):
        r, c, test = value_range(first, bounds), int(e.args[1].value), _TEST[e.op]
        if r is not None and test(r[0], c) == test(r[1], c):
            return Const(bool(test(r[0], c)), "bool")
    elif e.op == "where" and isinstance(first, Const):
        return e.args[1] if first.value else e.args[2]
    elif e.op == "logical_and" and any(isinstance(a, Const) for a in e.args):
        decided, other = (first, e.args[1]) if isinstance(first, Const) else (e.args[1], first)
        return other if decided.value else decided
    return e
