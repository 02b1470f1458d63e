"""causal_pieces (CPUs): causal attention's three kernels run in pieces of query rows, each piece
over the keys its rows can see, so the work above the diagonal is skipped.

Without a fused attention schedule on a CPU, softmax(q @ k^T * s, causal) @ v runs as three
kernels: A stores the scores S, B the softmax rows P, C sums P * v over the keys. Past the line
j > i + c (key j, query i) the scores are masked: B reads S there only under a predicate that is
false (SDPA's is_causal), or A stores a score plus a huge negative there (transformers' mask:
the dtype's minimum). Either way B's reductions over keys add their identity there and B stores
P = 0 there, so C's sum over keys adds nothing there either. Cut into pieces of query rows
[r0, r1), the three kernels' key loops stop at r1 + c: at 2048 queries in 8 pieces the matmuls
do 56% of their work. Each piece is an ordinary rectangular kernel, scheduled as before.

A small fold proves "adds nothing" by running one key iteration past the line on constants. It
takes, as a flash-attention kernel that skips those blocks does, scores and v to be finite and
far from the mask's minimum: exp(-inf - m) = 0, score + min is -inf to max and exp, 0 * v = 0.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from ..core import dtypes
from ..core.expr import (
    Cast, Const, Expr, Op, Var, add, affine_terms, evaluate, simplify, substitute, value_range)
from ..core.scalar_ops import reduce_identity
from .ir import Accum, Let, Load, Loop, LoopKernel, Store, walk

MIN_PIECE = 64              # query rows a piece: at least this, at most MAX_PIECES pieces
MAX_PIECES = 8              # (each piece is three kernels to compile: 8 of 256 rows ran as
                            # fast as 16 of 128 at 2048 queries)
HUGE = 1e30                 # a constant below -HUGE is a mask: score + it acts as -inf


@dataclass(frozen=True)
class _Cut:
    i: str                  # the kernel's query-row loop
    keys: frozenset         # its loops over keys, cut at r1 + c
    rows: int               # queries
    c: int
    piece: int              # query rows a piece


def _outer(k: LoopKernel) -> list[Loop]:
    """The leading chain of free loops (the kernel's parallel domain), Lets hoisted between."""
    out, body = [], k.body
    while len(loops := [s for s in body if isinstance(s, Loop)]) == 1 and loops[0].kind == "free" \
            and all(isinstance(s, (Loop, Let)) for s in body):
        out.append(loops[0])
        body = loops[0].body
    return out


def _within(k: LoopKernel, var: str) -> tuple:
    """The body of loop `var` of the outer chain, after the Lets hoisted out of it."""
    out, body = [], k.body
    while True:
        out += [s for s in body if isinstance(s, Let)]
        loop = next(s for s in body if isinstance(s, Loop))
        if loop.var == var:
            return tuple(out) + loop.body
        body = loop.body


def _line(pred: Expr, i: str, j: str) -> tuple[int, bool] | None:
    """(c, True) where pred is exactly `j <= i + c`, (c, False) where it is `j > i + c`."""
    if not isinstance(pred, Op) or pred.op not in ("le", "lt", "ge", "gt"):
        return None
    a, b = pred.args if pred.op in ("le", "lt") else pred.args[::-1]
    lin = affine_terms(Op("subtract", (b, a), "i64"))         # b - a >= 0 (or > 0)
    if lin is None:
        return None
    k = lin[1] - (pred.op in ("lt", "gt"))                     # b - a + k' >= 0 ... as >= 0
    if lin[0] == {Var(i): 1, Var(j): -1}:                       # i - j + k >= 0
        return k, True
    if lin[0] == {Var(j): 1, Var(i): -1}:                       # j - i + k >= 0: j > i - k - 1
        return -k - 1, False
    return None


def _fold(e: Expr, env: dict, past, bounds: dict) -> Expr:
    """e with what is known past the line folded (`past(pred)`: the predicate's value there, or
    None; `bounds`: the loops' extents, which decide index comparisons such as a1 < 0)."""
    if isinstance(e, Var):
        return env.get(e.name, e)
    if isinstance(e, Cast):
        a = _fold(e.arg, env, past, bounds)
        return Const(a.value, e.dtype) if isinstance(a, Const) else e
    if not isinstance(e, Op):
        return e
    e = Op(e.op, tuple(_fold(a, env, past, bounds) for a in e.args), e.dtype)
    if dtypes.is_int(e.dtype) and not isinstance(e := simplify(e, bounds), Op):
        return e
    if (known := past(e)) is not None:
        return Const(known, "bool")
    args, val = e.args, [a.value if isinstance(a, Const) else None for a in e.args]
    if all(isinstance(a, Const) for a in args):
        return Const(evaluate(e, {}).item(), e.dtype)
    if e.op in ("le", "lt", "ge", "gt") and (r := value_range(simplify(
            Op("subtract", (args[1], args[0]), "i64")), bounds)) is not None:
        lo, hi = r if e.op in ("le", "lt") else (-r[1], -r[0])      # of the side that is larger
        least = int(e.op in ("lt", "gt"))                           # by at least this
        if lo >= least or hi < least:                               # always, or never
            return Const(lo >= least, "bool")
    if e.op in ("logical_and", "logical_or"):
        absorbs = e.op == "logical_or"              # True absorbs an or, False an and
        for x, y in (args, args[::-1]):
            if isinstance(x, Const):
                return x if bool(x.value) == absorbs else y
    if e.op == "where" and isinstance(args[0], Const):
        return args[1] if args[0].value else args[2]
    if e.op == "where" and isinstance(args[1], Const) and args[1] == args[2]:
        return args[1]
    if e.op in ("subtract", "add") and val[0] is not None and val[0] < -HUGE or \
            e.op == "add" and val[1] is not None and val[1] < -HUGE:    # the other term finite
        return Const(-np.inf, e.dtype)
    if e.op == "multiply" and 0 in val or e.op == "divide" and val[0] == 0:
        return Const(0.0, e.dtype)
    return e


def _past_line(body, past, read, bounds: dict) -> tuple[bool, list]:
    """One iteration of a key loop's body past the line, on what is known there (`read(load)`:
    what a load reads, or None): whether each accumulation adds its identity, and the values
    stored. Nested loops are skipped (their accumulators stay unknown)."""
    env, adds, stores = {}, True, []
    for s in body:
        if isinstance(s, Load) and (v := read(s)) is not None:
            env[s.var] = v
        elif isinstance(s, Let):
            env[s.var] = _fold(s.value, env, past, bounds)
        elif isinstance(s, Accum):
            v = _fold(s.value, env, past, bounds)
            adds &= s.op in ("sum", "prod", "max", "min") and isinstance(v, Const) and \
                v.value == reduce_identity(s.op, s.value.dtype)
        elif isinstance(s, Store):
            stores.append(_fold(s.value, env, past, bounds))
    return adds, stores


def _zero(v) -> bool:
    return isinstance(v, Const) and v.value == 0


def _loads(k: LoopKernel, buf: str) -> list[Load]:
    return [s for s in walk(k.body) if isinstance(s, Load) and s.buf == buf]


def _bounds(k: LoopKernel) -> dict:
    return {l.var: l.extent for l in walk(k.body) if isinstance(l, Loop)}


def _lines(body, i: str, j: str, bounds: dict) -> set:
    """The offsets c of the lines (i, j) that body's comparisons draw, Lets substituted."""
    found = set()

    def note(e):
        if (line := _line(e, i, j)) is not None:
            found.add(line[0])
    _past_line(body, note, lambda s: note(s.pred) if s.pred is not None else None, bounds)
    return found


def _chain(s_buf: str, by: dict, readers: dict, writers: dict, temps: set) -> dict | None:
    """{kernel name: its cut} for the kernels A, B, C of one causal attention whose scores are
    s_buf, or None when s_buf is not such scores."""
    if s_buf not in temps or len(readers[s_buf]) != 1 or len(writers[s_buf]) != 1:
        return None
    a, b = by[writers[s_buf][0]], by[readers[s_buf][0]]
    if a.writes != (s_buf,) or len(b.writes) != 1 or b.writes[0] not in temps:
        return None
    p_buf = b.writes[0]
    if len(readers[p_buf]) != 1:
        return None
    c = by[readers[p_buf][0]]
    # A: stores S at [.., i, j], both outer loops
    st = [s for s in walk(a.body) if isinstance(s, Store)]
    if len(st) != 1 or len(st[0].index) < 2:
        return None
    outer_a = {l.var: l for l in _outer(a)}
    ia, ja = st[0].index[-2:]
    if not (isinstance(ia, Var) and isinstance(ja, Var) and {ia.name, ja.name} <= outer_a.keys()):
        return None
    # B: the query loop outer, every other loop over keys reading S at [.., i, j] once
    outer_b = _outer(b)
    loads = _loads(b, s_buf)
    i = loads[0].index[-2] if loads else None
    if not isinstance(i, Var) or i.name not in {l.var for l in outer_b}:
        return None
    inner = [s for s in walk(outer_b[-1].body) if isinstance(s, Loop)]
    if len(loads) != len(inner) or any(isinstance(x, Loop) for l in inner for x in l.body):
        return None
    for loop in inner:
        mine = [l for l in loop.body if isinstance(l, Load) and l.buf == s_buf]
        if len(mine) != 1 or mine[0].index[-2:] != (i, Var(loop.var)):
            return None
    bounds_a, bounds_b = _bounds(a), _bounds(b)
    offsets = _lines(_within(a, ja.name), ia.name, ja.name, bounds_a).union(
        *(_lines(l.body, i.name, l.var, bounds_b) for l in inner))
    if len(offsets) != 1 or (off := offsets.pop()) < 0:
        return None
    # past the line: what A stores, then whether B adds and stores nothing there
    at = lambda i, j: lambda e: None if (x := _line(e, i, j)) is None or x[0] != off else not x[1]
    _, (s_past,) = _past_line(_within(a, ja.name), at(ia.name, ja.name), lambda s: None, bounds_a)
    s_past = s_past if isinstance(s_past, Const) and s_past.value == -np.inf else None
    for loop in inner:
        past = at(i.name, loop.var)
        read = lambda s: (Const(0.0, s.dtype) if s.pred is not None and past(s.pred) is False
                          else s_past if s.buf == s_buf else None)
        adds, stores = _past_line(loop.body, past, read, bounds_b)
        if not adds or not all(map(_zero, stores)):
            return None
    stores = [(s, l.var) for l in inner for s in l.body if isinstance(s, Store)]
    if len(stores) != 1 or stores[0][0].index[-2:] != (i, Var(stores[0][1])):
        return None
    # C: P read unpredicated at [.., i, j], j a reduce loop whose iterations add nothing past it
    pl = _loads(c, p_buf)
    if len(pl) != 1 or pl[0].pred is not None or len(pl[0].index) < 2 or \
            not isinstance(ic := pl[0].index[-2], Var) or ic.name not in {l.var for l in _outer(c)}:
        return None
    red = [s for s in walk(c.body) if isinstance(s, Loop) and s.kind == "reduce"
           and Var(s.var) == pl[0].index[-1]]
    zero = lambda s: Const(0.0, s.dtype) if s.buf == p_buf else None
    if len(red) != 1 or not _past_line(red[0].body, lambda e: None, zero, _bounds(c))[0]:
        return None
    rows = outer_a[ia.name].extent
    if rows < 2 * MIN_PIECE:
        return None
    piece = max(MIN_PIECE, (-(-rows // MAX_PIECES) + 7) // 8 * 8)  # rows / 8, rounded up to 8s
    return {a.name: _Cut(ia.name, frozenset({ja.name}), rows, off, piece),
            b.name: _Cut(i.name, frozenset(l.var for l in inner), rows, off, piece),
            c.name: _Cut(ic.name, frozenset({red[0].var}), rows, off, piece)}


def _piece(k: LoopKernel, cut: _Cut, r0: int, r1: int) -> LoopKernel:
    shift = {cut.i: add(Var(cut.i), Const(r0))}

    def go(body):
        out = []
        for s in body:
            if isinstance(s, Loop):
                extent = r1 - r0 if s.var == cut.i else \
                    min(s.extent, r1 + cut.c) if s.var in cut.keys else s.extent
                out.append(replace(s, extent=extent, body=go(s.body)))
            else:
                out.append(s.map_exprs(lambda e: substitute(e, shift)))
        return tuple(out)
    return replace(k, name=f"{k.name}_q{r0}", body=go(k.body))


def causal_pieces(kernels: list[LoopKernel], buffers, log) -> list[LoopKernel]:
    temps = {b.name for b in buffers if b.kind == "temp"}
    by = {k.name: k for k in kernels}
    readers, writers = defaultdict(list), defaultdict(list)
    for k in kernels:
        for r in dict.fromkeys(k.reads):
            readers[r].append(k.name)
        for w in k.writes:
            writers[w].append(k.name)
    cuts: dict = {}
    for s_buf in sorted(temps):
        chain = _chain(s_buf, by, readers, writers, temps)
        if chain and not cuts.keys() & chain.keys():
            cuts.update(chain)
            cut = next(iter(chain.values()))
            log(f"causal_pieces: {', '.join(chain)}: {cut.rows} queries in pieces of "
                f"{cut.piece}, keys up to the piece's last query + {cut.c}", 2)
    out = []
    for k in kernels:
        cut = cuts.get(k.name)
        if cut is None:
            out.append(k)
            continue
        out += [_piece(k, cut, r0, min(r0 + cut.piece, cut.rows))
                for r0 in range(0, cut.rows, cut.piece)]
    return out
