"""causal_pieces (CPUs): causal attention's three kernels run in pieces of query rows, each piece
over the keys its rows can see, so the work above the diagonal is skipped.

Without a fused attention schedule on a CPU, softmax(q @ k^T * s, causal) @ v runs as three
kernels: A stores the scores S, B the softmax rows P, C sums P * v over the keys. When every
load of S is predicated `j <= i + c` (key j, query i: SDPA's is_causal), nothing reads S past
that line, B's reductions over keys add their identity there and B stores P = 0 there, so C's
sum over keys adds nothing there either. Cut into pieces of PIECE_ROWS query rows [r0, r1), the
three kernels' key loops stop at r1 + c: at 2048 queries in pieces of 256 the matmuls do 56% of
their work. Each piece is an ordinary rectangular kernel, scheduled by the CPU passes as before.

The folds that prove "adds nothing" take, as a flash-attention kernel does when it skips those
blocks, scores and v to be finite: exp(-inf - m) = 0 and 0 * v = 0.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from ..expr import Cast, Const, Expr, Op, Var, add, affine_terms, evaluate, substitute
from ..scalar_ops import reduce_identity
from .ir import Accum, Let, Load, Loop, LoopKernel, Store, walk

MIN_PIECE = 64              # query rows a piece: at least this, at most MAX_PIECES pieces
MAX_PIECES = 8              # (each piece is three kernels to compile: 8 of 256 rows ran as
                            # fast as 16 of 128 at 2048 queries)


@dataclass(frozen=True)
class _Cut:
    i: str                  # the kernel's query-row loop
    keys: frozenset         # its loops over keys, cut at r1 + c
    rows: int               # queries
    c: int
    piece: int              # query rows a piece


def _outer(k: LoopKernel) -> list[Loop]:
    """The leading chain of free loops (the kernel's parallel domain)."""
    out, body = [], k.body
    while len(body) == 1 and isinstance(body[0], Loop) and body[0].kind == "free":
        out.append(body[0])
        body = body[0].body
    return out


def _offset(pred: Expr | None, i: str, j: str) -> int | None:
    """c where pred is exactly `j <= i + c`, else None."""
    if not isinstance(pred, Op) or pred.op not in ("le", "lt", "ge", "gt"):
        return None
    a, b = pred.args if pred.op in ("le", "lt") else pred.args[::-1]
    lin = affine_terms(Op("subtract", (b, a), "i64"))
    if lin is None or lin[0] != {Var(i): 1, Var(j): -1}:
        return None
    return lin[1] - (pred.op in ("lt", "gt"))


def _fold(e: Expr, env: dict, past) -> Expr:
    """e with what is known past the line (`past(pred)`: the predicate is false there) folded."""
    if isinstance(e, Var):
        return env.get(e.name, e)
    if isinstance(e, Cast):
        a = _fold(e.arg, env, past)
        return Const(a.value, e.dtype) if isinstance(a, Const) else e
    if not isinstance(e, Op):
        return e
    if past(e):
        return Const(False, "bool")
    args = [_fold(a, env, past) for a in e.args]
    val = [a.value if isinstance(a, Const) else None for a in args]
    if all(isinstance(a, Const) for a in args):
        return Const(evaluate(Op(e.op, tuple(args), e.dtype), {}).item(), e.dtype)
    if e.op == "where" and isinstance(args[0], Const):
        return args[1] if args[0].value else args[2]
    if e.op == "where" and isinstance(args[1], Const) and args[1] == args[2]:
        return args[1]
    if e.op in ("subtract", "add") and val[0] == -np.inf:       # the other term finite
        return Const(-np.inf, e.dtype)
    if e.op == "multiply" and 0 in val or e.op == "divide" and val[0] == 0:
        return Const(0.0, e.dtype)
    return Op(e.op, tuple(args), e.dtype)


def _adds_nothing(body, past, zero: str | None = None) -> bool:
    """Whether one iteration of a key loop's body, past the line, accumulates only identities
    and stores only zeros (loads predicated false, and loads of `zero`, read 0)."""
    env: dict = {}
    for s in body:
        if isinstance(s, Load):
            if s.buf == zero or s.pred is not None and past(s.pred):
                env[s.var] = Const(0.0, s.dtype)
        elif isinstance(s, Let):
            env[s.var] = _fold(s.value, env, past)
        elif isinstance(s, Accum):
            v = _fold(s.value, env, past)
            if s.op not in ("sum", "prod", "max", "min") or not isinstance(v, Const) or \
                    v.value != reduce_identity(s.op, s.value.dtype):
                return False
        elif isinstance(s, Store):
            v = _fold(s.value, env, past)
            if not (isinstance(v, Const) and v.value == 0):
                return False
        else:
            return False
    return True


def _loads(k: LoopKernel, buf: str) -> list[Load]:
    return [s for s in walk(k.body) if isinstance(s, Load) and s.buf == buf]


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
    # B: the query loop outer, every other loop over keys, each load of S predicated j <= i + c
    outer_b = _outer(b)
    loads = _loads(b, s_buf)
    i = loads[0].index[-2] if loads else None
    if not isinstance(i, Var) or i.name not in {l.var for l in outer_b}:
        return None
    inner = [s for s in walk(outer_b[-1].body) if isinstance(s, Loop)]
    offsets = set()
    for loop in inner:
        mine = [l for l in loop.body if isinstance(l, Load) and l.buf == s_buf]
        if len(mine) != 1 or mine[0].index[-1] != Var(loop.var) or mine[0].index[-2] != i:
            return None
        offsets.add(_offset(mine[0].pred, i.name, loop.var))
    if len(offsets) != 1 or None in offsets or (off := offsets.pop()) < 0 or \
            len(loads) != len(inner) or any(isinstance(x, Loop) for l in inner for x in l.body):
        return None
    for loop in inner:
        if not _adds_nothing(loop.body, lambda e, j=loop.var: _offset(e, i.name, j) == off):
            return None
    stores = [(s, l.var) for l in inner for s in l.body if isinstance(s, Store)]
    if len(stores) != 1 or stores[0][0].index[-2:] != (i, Var(stores[0][1])):
        return None
    # A: stores S at [.., i, j], both outer loops (stores past the line are never read)
    st = next(s for s in walk(a.body) if isinstance(s, Store))
    outer_a = {l.var: l.extent for l in _outer(a)}
    ia, ja = st.index[-2], st.index[-1]
    if not (isinstance(ia, Var) and isinstance(ja, Var) and {ia.name, ja.name} <= outer_a.keys()):
        return None
    # C: P read unpredicated at [.., i, j], j a reduce loop whose iterations add nothing past it
    pl = _loads(c, p_buf)
    if len(pl) != 1 or pl[0].pred is not None or not isinstance(ic := pl[0].index[-2], Var) or \
            ic.name not in {l.var for l in _outer(c)}:
        return None
    red = [s for s in walk(c.body) if isinstance(s, Loop) and s.kind == "reduce"
           and Var(s.var) == pl[0].index[-1]]
    if len(red) != 1 or not _adds_nothing(red[0].body, lambda e: False, zero=p_buf):
        return None
    rows = outer_a[ia.name]
    if rows < 2 * MIN_PIECE:
        return None
    piece = max(MIN_PIECE, (-(-rows // MAX_PIECES) + 7) // 8 * 8)
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
