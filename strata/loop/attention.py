"""Loop IR for a fused attention: one `Attention` statement, the whole kernel.

    out[*b, i, e] = sum_j softmax_j(x(s_ij)) * v[*b, j, e],   s_ij = sum_d q[*b, i, d] * k[*b, j, d]

or, in the sum form (a flash-attention backward's gradients, whose weights x are rebuilt from a
saved log-sum-exp), out[*b, i, e] = sum_j x(s_ij, t_ij) * v[*b, j, e], with an optional second
score t_ij = sum_d2 q2[*b, i, d2] * k2[*b, j, d2]. The softmax form may also write each row's
log-sum-exp of x (`lse`: what a training forward saves for that backward).

Each operand (q, k, v, and x as a function of the raw score `s`) is a short list of Loop IR
statements computed at symbolic indices, with whatever was inlined into it (casts, scale folded
into q, GQA head maps, RoPE, masks). The scores and weights are never stored: the Tile IR
schedule (tile/attention.py) runs the softmax online over blocks of keys. `safe` says what a row
whose scores are all -inf gives: 0 (SDPA's safe softmax) or NaN (a plain softmax, like eager).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.expr import (Cast, Const, Expr, Op, Var, affine_terms, free_vars, rename, simplify,
                         substitute, to_str, value_range)
from .attention_match import AttentionMatch
from .builder import LoopBuilder, Scope
from .ir import Let, Load, Loop, LoopKernel, Stmt, format_stmt


@dataclass(frozen=True)
class Operand:
    """One value the kernel reads, computed at `vars` by Load/Let statements into `value`."""
    vars: tuple[str, ...]
    body: tuple
    value: Expr
    dtype: str                      # storage dtype of the tensor (how a tile of it is staged)


@dataclass(frozen=True)
class Attention(Stmt):
    batch: tuple[tuple[str, int], ...]
    i: tuple[str, int]              # query axis and Lq
    j: tuple[str, int]              # key axis and Lk
    d: tuple[str, int]              # head dim of q and k
    e: tuple[str, int]              # head dim of v (and of the output)
    q: Operand                      # at (*batch, i, d)
    k: Operand                      # at (*batch, j, d)
    x: Operand                      # at (*batch, i, j), reading the raw score Var(score)
    v: Operand                      # at (*batch, j, e)
    score: str
    safe: bool
    out: str
    out_index: tuple[Expr, ...]
    norm: str = "softmax"           # or "sum": no softmax, out = sum_j x * v
    lse: tuple[str, tuple[Expr, ...]] | None = None     # (buffer, index at (*batch, i))
    d2: tuple[str, int] | None = None                   # head dim of the second score
    q2: Operand | None = None       # at (*batch, i, d2)
    k2: Operand | None = None       # at (*batch, j, d2)
    score2: str | None = None

    def operands(self) -> dict:
        """The operands by role, the second score's only when there is one."""
        ops = {"q": self.q, "k": self.k, "x": self.x, "v": self.v}
        return {**ops, "q2": self.q2, "k2": self.k2} if self.q2 is not None else ops

    def format(self, depth: int, out: list[str]) -> None:      # as loop/ir.py's format_stmt asks
        pad = "    " * depth
        batch = ", ".join(f"{v}:{n}" for v, n in self.batch)
        axes = ", ".join(f"{name}={v}:{n}" for name, (v, n) in zip("ijde", (self.i, self.j, self.d, self.e)))
        if self.d2:
            axes += f", d2={self.d2[0]}:{self.d2[1]}"
        note = "sum form" if self.norm == "sum" else \
            f"fully masked rows -> {'0' if self.safe else 'NaN'}"
        out.append(f"{pad}attention(batch=({batch}), {axes}):  # {note}")
        for name, op in (("q", self.q), ("k", self.k)):
            _operand(name, op, depth + 1, out)
        out.append(f"{pad}    {self.score} = sum over {self.d[0]} of q * k")
        if self.q2 is not None:
            for name, op in (("q2", self.q2), ("k2", self.k2)):
                _operand(name, op, depth + 1, out)
            out.append(f"{pad}    {self.score2} = sum over {self.d2[0]} of q2 * k2")
        _operand("x", self.x, depth + 1, out)
        _operand("v", self.v, depth + 1, out)
        weights = "x" if self.norm == "sum" else f"softmax_{self.j[0]}(x)"
        out.append(f"{pad}    {self.out}[{', '.join(to_str(e) for e in self.out_index)}] = "
                   f"sum over {self.j[0]} of {weights} * v  # online")
        if self.lse:
            out.append(f"{pad}    {self.lse[0]}[{', '.join(to_str(e) for e in self.lse[1])}] = "
                       f"logsumexp_{self.j[0]}(x)")


def _operand(name: str, op: Operand, depth: int, out: list[str]) -> None:
    pad = "    " * depth
    out.append(f"{pad}{name}[{', '.join(op.vars[-2:])}] = {to_str(op.value)}" + (":" if op.body else ""))
    for st in op.body:
        format_stmt(st, depth + 1, out)


# ---------------------------------------------------------------- building from Tensor IR

def _flatten(body) -> list:
    out = []
    for s in body:
        if isinstance(s, Loop):
            out.extend(_flatten(s.body))
        else:
            out.append(s)
    return out


def _build_operand(prog, materialized, counts, node: str, index, axes) -> tuple[list, Expr]:
    """Statements computing `node` at `index` (over the free variables `axes`), inlining what is
    not materialized. A reduction is never inlined here (fuse.py materializes it first)."""
    b = LoopBuilder(prog, materialized, set())
    b.counts = counts
    for var, extent in axes:
        scope = Scope(b.stack[-1], var, extent, "free")
        b.stack.append(scope)
        b.home[var], b.bounds[var] = scope, extent
    value = b.value(node, tuple(index))
    while len(b.stack) > 1:
        b.close_loop()
    body = _flatten(b.root.stmts)
    if any(isinstance(s, Loop) for s in body):
        raise AssertionError(f"attention operand {node} holds a loop")
    return body, value, b.reads


def build_attention_kernel(prog, m: AttentionMatch, materialized: set, name: str) -> LoopKernel:
    br = len(m.batch)
    n_axes = br + (5 if m.qk2 else 4)
    names = [f"a{d}" for d in range(n_axes)]
    taken = set(prog.by_name)
    names = [n if n not in taken else f"{n}_ax" for n in names]
    bvars, (i, j, d, e, *d2) = names[:br], names[br:]
    d2 = d2[0] if d2 else None
    B = [Var(v) for v in bvars]
    axes_b = list(zip(bvars, m.batch))
    counts = {"a": n_axes}
    reads: list[str] = []

    def operand(node, index, axes, dtype, extra=()):
        body, value, rd = _build_operand(prog, materialized | set(extra), counts, node, index, axes)
        for r in rd:
            if r not in reads and r not in extra:
                reads.append(r)
        return body, value, dtype

    by = prog.by_name
    qb, qv, qdt = operand(m.q_bc, [*B, Var(i), Var(d), Const(0)], axes_b + [(i, m.lq), (d, m.d)],
                          by[m.q_bc].type.dtype)
    kb, kv, kdt = operand(m.k_bc, [*B, Const(0), Var(d), Var(j)], axes_b + [(j, m.lk), (d, m.d)],
                          by[m.k_bc].type.dtype)
    vb, vv, vdt = operand(m.v_bc, [*B, Const(0), Var(j), Var(e)], axes_b + [(j, m.lk), (e, m.dv)],
                          by[m.v_bc].type.dtype)
    second = {}
    if m.qk2:
        q2b, q2v, q2dt = operand(m.q2_bc, [*B, Var(i), Var(d2), Const(0)],
                                 axes_b + [(i, m.lq), (d2, m.d2)], by[m.q2_bc].type.dtype)
        k2b, k2v, k2dt = operand(m.k2_bc, [*B, Const(0), Var(d2), Var(j)],
                                 axes_b + [(j, m.lk), (d2, m.d2)], by[m.k2_bc].type.dtype)
        second = dict(q2=Operand((*bvars, i, d2), tuple(q2b), q2v, q2dt),
                      k2=Operand((*bvars, j, d2), tuple(k2b), k2v, k2dt), d2=(d2, m.d2))
    xb, xv, xdt = operand(m.x, [*B, Var(i), Var(j)], axes_b + [(i, m.lq), (j, m.lk)],
                          by[m.x].type.dtype, extra=(m.qk,) + ((m.qk2,) if m.qk2 else ()))
    fresh = lambda name: name if name not in taken else fresh(name + "_")
    score = fresh("s")
    scores = {m.qk: score}
    if m.qk2:
        second["score2"] = scores[m.qk2] = fresh("s2")
    ones = {v: Const(0) for v, n in [*axes_b, (i, m.lq), (j, m.lk)] if n == 1}
    norm = lambda e: to_str(simplify(substitute(e, ones)))
    want = [norm(x) for x in (*B, Var(i), Const(0), Var(j))]
    xb2, ren = [], {}
    for s in xb:
        if isinstance(s, Load) and s.buf in scores:
            if [norm(x) for x in s.index] != want:
                raise ValueError(f"the scores read {s.buf} at [{', '.join(map(to_str, s.index))}]")
            ren[s.var] = scores[s.buf]
            continue
        xb2.append(_rename(s, ren))
    xv = rename(xv, ren)
    lse = None
    if m.lse:
        lse = (m.lse, (*B, Var(i)) if len(by[m.lse].type.shape) == br + 1 else (*B, Var(i), Const(0)))
    att = Attention(tuple(axes_b), (i, m.lq), (j, m.lk), (d, m.d), (e, m.dv),
                    Operand((*bvars, i, d), tuple(qb), qv, qdt),
                    Operand((*bvars, j, d), tuple(kb), kv, kdt),
                    Operand((*bvars, i, j), tuple(xb2), xv, xdt),
                    Operand((*bvars, j, e), tuple(vb), vv, vdt),
                    score, m.safe, m.out,
                    (*B, Var(i), Var(e)) if m.out != m.pv else (*B, Var(i), Const(0), Var(e)),
                    norm=m.norm, lse=lse, **second)
    return LoopKernel(name, (att,), tuple(reads), (m.out,) + ((m.lse,) if m.lse else ()),
                      src=by[m.out].src)


def _rename(s, names: dict):
    if not names:
        return s
    if isinstance(s, Load):
        return Load(s.var, s.buf, tuple(rename(x, names) for x in s.index), s.dtype,
                    None if s.pred is None else rename(s.pred, names))
    if isinstance(s, Let):
        return Let(s.var, rename(s.value, names))
    raise TypeError(f"unexpected statement {s!r} in an attention operand")


def attention_of(k: LoopKernel) -> Attention | None:
    """The Attention statement of a fused attention kernel, else None."""
    return k.body[0] if len(k.body) == 1 and isinstance(k.body[0], Attention) else None


@dataclass
class AttentionPlan:
    """fuse.py's plan entry for a fused attention (KernelPlan's counterpart)."""
    target: str
    match: AttentionMatch
    reduces: tuple = ()
    merged: tuple = ()

    def build(self, prog, materialized: set, name: str, alias: dict | None = None) -> LoopKernel:
        """The kernel; `alias` maps buffers that live in another (a scatter done in place)."""
        k = build_attention_kernel(prog, self.match, materialized,
                                   name if name.endswith("attention") else name + "_attention")
        return _aliased(k, alias) if alias else k


def _aliased(k: LoopKernel, alias: dict) -> LoopKernel:
    att = attention_of(k)

    def ops(o: Operand) -> Operand:
        body = tuple(replace(s, buf=alias.get(s.buf, s.buf)) if isinstance(s, Load) else s
                     for s in o.body)
        return replace(o, body=body)
    att = replace(att, **{n: ops(o) for n, o in att.operands().items()},
                  out=alias.get(att.out, att.out),
                  lse=att.lse and (alias.get(att.lse[0], att.lse[0]), att.lse[1]))
    names = lambda bufs: tuple(dict.fromkeys(alias.get(b, b) for b in bufs))
    return LoopKernel(k.name, (att,), names(k.reads), names(k.writes), src=k.src)


def operand_roots(m: AttentionMatch) -> tuple[str, ...]:
    """The nodes the kernel computes its operands from (x: everything but the raw scores)."""
    return (m.q_bc, m.k_bc, m.v_bc, m.x) + ((m.q2_bc, m.k2_bc) if m.qk2 else ())


def reductions_to_materialize(prog, m: AttentionMatch, materialized: set) -> set[str]:
    """Reductions an operand would inline: they get kernels of their own (a q projection, a norm)."""
    by, out, seen = prog.by_name, set(), set()
    stack = list(operand_roots(m))
    while stack:
        n = stack.pop()
        if n in seen or n in materialized or n in (m.qk, m.qk2):
            continue
        seen.add(n)
        node = by[n]
        if node.__class__.__name__ == "Reduce":
            out.add(n)
            continue
        stack.extend(node.operands())
    return out


def computed_operands(prog, m: AttentionMatch, materialized: set) -> set[str]:
    """Q, K and V where computed (RoPE on a projection: sines and cosines of the positions): a
    flash kernel fills its K and V blocks again for every block of queries, and its Q blocks
    for every head, so a prompt's are stored once by kernels of their own, whose sines the
    STORE rule then computes once a position (Zen 4, a TinyLlama layer's attention at 2048
    tokens: 273 -> 112 ms for K and V, -> 94 with Q). On a GPU the stored K is plain rows, so
    its tiles are cp.async copies as V's (not measured on a GPU yet). Reached through index
    maps and casts."""
    by, out = prog.by_name, set()
    for n in (m.q_bc, m.k_bc, m.v_bc):
        while n not in materialized:
            node = by[n]
            if node.__class__.__name__ == "IndexMap":
                n = node.arg
            elif node.__class__.__name__ == "Elementwise" and node.op == "cast":
                n = node.args[0]
            else:
                break
        if n not in materialized and by[n].__class__.__name__ == "Elementwise":
            out.add(n)
    return out


def reached_buffers(prog, m: AttentionMatch, materialized: set) -> set[str]:
    """The materialized nodes and inputs the fused kernel loads."""
    by, out, seen = prog.by_name, set(), set()
    stack = list(operand_roots(m))
    while stack:
        n = stack.pop()
        if n in seen or n in (m.qk, m.qk2):
            continue
        seen.add(n)
        if n in materialized or by[n].__class__.__name__ == "Input":
            out.add(n)
            continue
        stack.extend(by[n].operands())
    return out


# ---------------------------------------------------------------- causal structure

@dataclass(frozen=True)
class CausalLimit:
    """x is -inf (0 in the sum form) wherever key j > query i + offset (set by the Let `cond`):
    the tile schedule stops each query block's key loop there and masks only the diagonal
    blocks. `lower`: wherever j < i + offset instead (a backward's dk and dv, whose rows are
    keys): the loop starts at the block's first row's limit."""
    cond: str
    offset: int
    lower: bool = False
    loaded: Load | None = None      # a decode step's: keys j <= this scalar's value + offset
    keep: bool = True               # cond's value on the keys kept (False: the mask's own test,
                                    # where(j - i >= 1, MIN, 0) as transformers builds it)


ADDITIVE_MIN = -1e30        # an additive mask at most this: exp gives exactly 0 after the shift


def causal_limit(att: Attention) -> CausalLimit | None:
    """The causal bound of x: x = where(j <= i + c, ..., -inf), or y + where(cond, 0, MIN)
    (transformers' additive masks; through casts), or in the sum form a product (through casts)
    of which one factor is exp(where(cond, ..., -inf) - r) (the weights are 0 where cond fails);
    else None. The bound may be a scalar the kernel loads (a decode step's position: j <= P)."""
    lets = {s.var: s.value for s in att.x.body if isinstance(s, Let)}

    def follow(e):
        while isinstance(e, Var) and e.name in lets:
            e = lets[e.name]
        while isinstance(e, Cast) or (isinstance(e, Op) and e.op == "cast"):
            e = follow(e.arg if isinstance(e, Cast) else e.args[0])
        return e

    def masked(e):      # (cond, additive, keep) of where(cond, ..., -inf), y + where(cond, 0, MIN)
        if isinstance(e, Op) and e.op == "add":         # an additive mask of the dtype's minimum
            found = [masked(follow(a)) for a in e.args]
            return found[0] if found[0][0] else found[1]
        if isinstance(e, Op) and e.op == "where" and isinstance(e.args[0], Var):
            c, (y, n) = e.args[0].name, e.args[1:]
            if isinstance(n, Const) and n.value == float("-inf"):
                return c, False, True
            if isinstance(n, Const) and n.value <= ADDITIVE_MIN and isinstance(y, Const) and y.value == 0:
                return c, True, True
            if isinstance(y, Const) and y.value <= ADDITIVE_MIN and isinstance(n, Const) and n.value == 0:
                return c, True, False                   # where(masked, MIN, 0)
        return None, False, True

    def zero_where(e):      # (cond, additive) outside which the sum form's weight e is 0
        e = follow(e)
        if isinstance(e, Op) and e.op == "multiply":
            found = [c for c in map(zero_where, e.args) if c[0]]
            return found[0] if len(found) == 1 else (None, False, True)
        if isinstance(e, Op) and e.op == "exp":
            arg = follow(e.args[0])
            if isinstance(arg, Op) and arg.op == "subtract":
                return masked(follow(arg.args[0]))
        return None, False, True
    # an additive mask leaves a row with no key uniform weights, not 0: only bounds that give
    # every row key 0 (j <= i + c, c >= 0; j <= P + c, P a position) may skip its keys
    cond, additive, keep = zero_where(att.x.value) if att.norm == "sum" else masked(follow(att.x.value))
    c = lets.get(cond)
    if keep and isinstance(c, Op) and c.op == "logical_and":   # a causal test and another one
        # (transformers' packed sequences: the same sequence, which the diagonal key always is)
        # bound the kept keys by the causal test alone; whole blocks drop only that test
        tests = [a.name for a in c.args if isinstance(a, Var) and isinstance(lets.get(a.name), Op)
                 and lets[a.name].op in _NEGATED]
        return next((x for x in (_limit(att, lets, t, additive, keep) for t in tests) if x), None)
    return _limit(att, lets, cond, additive, keep)


_NEGATED = {"le": "gt", "lt": "ge", "ge": "lt", "gt": "le"}


def _fold(e, bounds: dict):
    """Index arithmetic with what its variables' ranges decide taken: comparisons, the branch of
    a negative index's wrap where(i < 0, i + n, i), and i % n of an i in [0, n) (how
    transformers' mask functions index the positions)."""
    if not isinstance(e, Op):
        return e
    args = tuple(_fold(a, bounds) for a in e.args)
    e = Op(e.op, args, e.dtype)
    if e.op in _NEGATED:
        ra, rb = value_range(args[0], bounds), value_range(args[1], bounds)
        if ra and rb:
            lo, hi = ra[0] - rb[1], ra[1] - rb[0]                          # of a - b
            yes, no = {"lt": (hi < 0, lo >= 0), "le": (hi <= 0, lo > 0),
                       "gt": (lo > 0, hi <= 0), "ge": (lo >= 0, hi < 0)}[e.op]
            if yes or no:
                return Const(yes, "bool")
    if e.op == "where" and isinstance(args[0], Const):
        return args[1] if args[0].value else args[2]
    if e.op == "mod" and isinstance(args[1], Const):
        r = value_range(args[0], bounds)
        if r and 0 <= r[0] and r[1] < args[1].value:
            return args[0]
    return simplify(e, bounds) if e.dtype in ("i32", "i64") else e


def _limit(att: Attention, lets: dict, cond: str, additive: bool, keep: bool) -> CausalLimit | None:
    """The causal limit that the comparison `cond` (of the kept keys, or of the masked ones
    where not `keep`) sets, or None."""
    c = lets.get(cond)
    if not isinstance(c, Op) or c.op not in _NEGATED:
        return None
    if not keep:        # the test of the masked keys: the kept ones are its negation
        c = Op(_NEGATED[c.op], c.args, c.dtype)
    index = {v: e for v, e in lets.items() if getattr(e, "dtype", None) in ("i32", "i64", "bool")}
    args = c.args
    for _ in range(8):                              # the index Lets it reads, through Lets
        args = tuple(substitute(a, index) for a in args)
    bounds = {att.i[0]: att.i[1], att.j[0]: att.j[1], **dict(att.batch)}
    c = Op(c.op, tuple(_fold(a, bounds) for a in args), c.dtype)    # j - i >= 1
    a, b = c.args if c.op in ("le", "lt") else c.args[::-1]       # a <= b  (or a < b)
    lin = affine_terms(Op("subtract", (b, a), "i64"))              # b - a >= 0 (or > 0)
    if lin is None:
        return None
    terms = {k.name: v for k, v in lin[0].items() if isinstance(k, Var)}
    const = lin[1] - (1 if c.op in ("lt", "gt") else 0)            # b - a - const' >= 0
    if len(terms) != len(lin[0]):
        return None
    loads = {s.var: s for s in att.x.body if isinstance(s, Load)}
    scalar = [n for n in terms if n in loads and not {att.i[0], att.j[0]} & set().union(
        *map(free_vars, loads[n].index)) and loads[n].pred is None]
    if additive and const < 0:
        return None
    if att.norm != "sum" and len(scalar) == 1 and terms == {scalar[0]: 1, att.j[0]: -1}:
        return CausalLimit(cond, const, loaded=loads[scalar[0]], keep=keep)    # j <= P + const
    if terms == {att.i[0]: 1, att.j[0]: -1}:                       # j <= i + const
        return CausalLimit(cond, const, keep=keep)
    if terms == {att.i[0]: -1, att.j[0]: 1} and not additive:     # j >= i - const
        return CausalLimit(cond, -const, lower=True)
    return None
