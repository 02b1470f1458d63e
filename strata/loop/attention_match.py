"""Find softmax(scores) @ v in Tensor IR, where scores is an elementwise function of one q @ k^T.

This is the shape both SDPA's rule and a user's explicit attention take (tensor/rules_attention.py,
the matmul and softmax rules), with casts, scales, masks, GQA index maps and torch's safe-softmax
`where(max == -inf, 0, p)` allowed around the pieces. A match is fused by loop/attention.py into
one flash-attention kernel; a near miss (a softmax feeding a matmul) is logged with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.expr import Const, Var, free_vars, simplify, substitute, to_str
from ..tensor.ir import Elementwise, IndexMap, Input, Reduce


@dataclass(frozen=True)
class AttentionMatch:
    out: str            # the output node: out[*batch, i, e], or pv itself (out[*batch, i, 0, e])
    pv: str             # the sum over keys of p * v (keepdim), out's operand
    qk: str             # the sum over d of q * k (keepdim): the raw scores
    q_bc: str           # q broadcast into the (*batch, Lq, D, Lk) product space
    k_bc: str
    v_bc: str           # v broadcast into the (*batch, Lq, Lk, Dv) product space
    x: str              # the softmax input (*batch, Lq, Lk): scores after scale and mask
    safe: bool          # rows whose scores are all -inf give 0 (SDPA), else NaN (plain softmax)
    internal: frozenset  # nodes the fused kernel replaces (no other user may read them)
    batch: tuple
    lq: int
    lk: int
    d: int
    dv: int
    norm: str = "softmax"   # or "sum": out = sum over keys of x * v (weights rebuilt from an lse)
    lse: str | None = None  # softmax: the node of each row's log-sum-exp, written by the kernel too
    qk2: str | None = None  # sum: a second q @ k^T that x reads (a gradient's g @ v^T)
    q2_bc: str | None = None
    k2_bc: str | None = None
    d2: int = 0


class _NoMatch(Exception):
    pass


def _need(cond, why: str):
    if not cond:
        raise _NoMatch(why)


def _iv(d: int) -> str:
    return f"i{d}"


def _index_is(n: IndexMap, want) -> bool:
    """n reads its operand at `want` (var names or ints), a size-1 output axis counting as 0."""
    ones = {f"i{d}": Const(0) for d, s in enumerate(n.type.shape) if s == 1}
    norm = lambda e: to_str(simplify(substitute(e, ones)))
    want = [Var(w) if isinstance(w, str) else Const(w) for w in want]
    return n.valid is None and len(n.index) == len(want) and \
        all(norm(e) == norm(w) for e, w in zip(n.index, want))


def _strip_casts(by, name: str, seen: set) -> str:
    while isinstance(by[name], Elementwise) and by[name].op == "cast":
        seen.add(name)
        name = by[name].args[0]
    return name


def _row_reduce(by, name: str, op: str, arg: str, seen: set) -> None:
    """name is an IndexMap broadcasting back a keepdim `op` over the last axis of `arg`."""
    bc = by[name]
    red_name = name if isinstance(bc, Reduce) else bc.arg    # one key: no broadcast needed
    _need(isinstance(bc, Reduce) or (isinstance(bc, IndexMap) and bc.valid is None),
          f"{name} is not a broadcast")
    red = by[red_name]
    _need(isinstance(red, Reduce) and red.op == op and red.arg == arg
          and red.axes == (len(red.type.shape) - 1,), f"{red_name} is not a row {op} of {arg}")
    seen.update((name, red_name))


def _split_product(by, prod: str, lhs_free: int, rhs_free: int, seen: set) -> tuple[str, str]:
    """The two IndexMap operands of multiply `prod`: the one not using i<lhs_free>, then the other."""
    n = by[prod]
    _need(isinstance(n, Elementwise) and n.op == "multiply" and len(n.operands()) == 2,
          f"{prod} is not a product of two tensors")
    a, b = n.args
    for x, y in ((a, b), (b, a)):
        nx, ny = by[x], by[y]
        if isinstance(nx, IndexMap) and isinstance(ny, IndexMap) and nx.valid is None \
                and ny.valid is None:
            fx = set().union(*map(free_vars, nx.index))
            fy = set().union(*map(free_vars, ny.index))
            if f"i{rhs_free}" not in fx and f"i{lhs_free}" not in fy:
                seen.add(prod)
                return x, y
    raise _NoMatch(f"{prod}: operands are not broadcasts of a row and a column side")


def _score_nodes(by, x: str, materialized: set, is_qk, most: int = 1) -> tuple[list, set]:
    """The raw q @ k^T products that the scores x are an elementwise function of (the
    unmaterialized reductions x depends on that `is_qk` accepts: one, or up to `most`), and the
    nodes between. Other reductions x reads (a mask computed with a cumsum, as transformers
    builds it) stay outside the path: they get kernels of their own (reductions_to_materialize)
    and the fused kernel loads them."""
    found: list[str] = []
    seen: set[str] = set()

    def reductions(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        n = by[name]
        if isinstance(n, Reduce) and name not in materialized:
            found.append(name)
        elif not isinstance(n, Input) and name not in materialized:
            for o in n.operands():
                reductions(o)

    reductions(x)
    qks = [r for r in found if is_qk(r)]
    _need(1 <= len(qks) <= most, f"the scores {x} depend on {len(qks)} q @ k^T reductions, not "
          + ("one" if most == 1 else f"1 to {most}"))
    depends: dict[str, bool] = {}
    path: set[str] = set()

    def visit(name: str) -> bool:
        if name not in depends:
            n = by[name]
            if name in qks:
                depends[name] = True
            elif isinstance(n, (Input, Reduce)) or name in materialized:
                depends[name] = False
            else:
                depends[name] = any([visit(o) for o in n.operands()])
            if depends[name]:
                path.add(name)
        return depends[name]

    visit(x)
    return qks, path


def _pv(by, users, red: str) -> tuple:
    """The sum over keys of weights * v at `red`: (out, seen, p_bc, v_bc, weights, batch, lq, dv)
    with out the squeezed matmul when that is all its user reads."""
    pv = by[red]
    _need(isinstance(pv, Reduce) and pv.op == "sum" and len(pv.axes) == 1, f"{red} is not a sum")
    r = len(pv.type.shape)            # (*batch, Lq, 1, Dv)
    br = r - 3
    _need(br >= 0 and pv.axes == (br + 1,), f"{red} is not a matmul over keys")
    out, seen = red, set()
    (only,) = users[red] if len(users[red]) == 1 else (None,)
    o = by.get(only)
    if isinstance(o, IndexMap) and _index_is(o, [_iv(d) for d in range(br + 1)] + [0, _iv(br + 1)]):
        out, seen = only, {red}
    p_bc, v_bc = _split_product(by, pv.arg, br, br + 2, seen)
    p_src = by[p_bc]
    _need(_index_is(p_src, [_iv(d) for d in range(br + 2)]), f"{p_bc} is not the weights' broadcast")
    seen.add(p_bc)
    return out, seen, p_bc, v_bc, _strip_casts(by, p_src.arg, seen), pv.type.shape[:br], \
        pv.type.shape[br], pv.type.shape[br + 2]


def _qk_test(by, batch, lq: int, lk: int):
    br = len(batch)

    def is_qk(r: str) -> bool:
        n = by[r]
        if not (n.op == "sum" and n.axes == (br + 1,) and n.type.shape == (*batch, lq, 1, lk)):
            return False
        try:
            _split_product(by, n.arg, br, br + 2, set())
        except _NoMatch:
            return False
        return True
    return is_qk


def _closed(by, users, seen: set, materialized: set, outs: set) -> None:
    """No node the kernel replaces is read outside it or is a program output (but `outs`)."""
    for n in seen - outs:
        outside = [u for u in users[n] if u not in seen and u not in outs]
        if outside:
            raise _NoMatch(f"{n} is also read by {outside[0]}")
        _need(n not in materialized, f"{n} is an output of the program")


def _lse_of(by, users, max_red: str, sum_red: str, seen: set, br: int) -> str | None:
    """The node of max + log(sum) (the rows' log-sum-exp; -inf for a row with no key; squeezed
    or not) if the softmax's max and sum are read there too, else None; its nodes join `seen`."""
    outside = lambda n: [u for u in users[n] if u not in seen]
    logs = outside(sum_red)
    if len(logs) != 1 or not (isinstance(by[logs[0]], Elementwise) and by[logs[0]].op == "log"):
        return None
    adds = outside(max_red)
    if len(adds) != 1 or users[logs[0]] != adds:
        return None
    add_ = by[adds[0]]
    if not (isinstance(add_, Elementwise) and add_.op == "add"
            and set(add_.args) == {max_red, logs[0]}):
        return None
    lse = adds[0]
    seen.update((logs[0], lse))
    (only,) = users[lse] if len(users[lse]) == 1 else (None,)
    w = by.get(only)        # where(max == -inf, -inf, lse): a row with no key (torch's value)
    if isinstance(w, Elementwise) and w.op == "where" and w.args[1:] == (float("-inf"), lse) \
            and w.args[0] in seen:
        lse = only
    (only,) = users[lse] if len(users[lse]) == 1 else (None,)
    if isinstance(by.get(only), IndexMap) and _index_is(by[only], [_iv(d) for d in range(br + 1)] + [0]):
        seen.add(lse)
        lse = only
    return lse


def match_at(prog, by, users, red: str, materialized: set) -> AttentionMatch:
    out, seen, p_bc, v_bc, p, batch, lq, dv = _pv(by, users, red)
    br = len(batch)
    safe = False
    pn = by[p]
    if isinstance(pn, Elementwise) and pn.op == "where":
        cond, zero, inner = pn.args
        _need(isinstance(zero, (int, float)) and zero == 0 and isinstance(cond, str),
              f"{p}: a where that is not the safe softmax")
        cbc = by[cond]
        empty_name = cbc.arg if isinstance(cbc, IndexMap) else cond    # one key: no broadcast
        empty = by[empty_name]
        _need(isinstance(empty, Elementwise) and empty.op == "eq" and empty.args[1] == float("-inf"),
              f"{p}: a where that is not the safe softmax")
        seen.update((p, cond, empty_name))
        safe, empty_max = True, empty.args[0]
        p = _strip_casts(by, inner, seen)
        pn = by[p]
    _need(isinstance(pn, Elementwise) and pn.op == "divide", f"{p} is not a softmax")
    e, sum_bc = pn.args
    seen.add(p)
    en = by[e]
    _need(isinstance(en, Elementwise) and en.op == "exp", f"{e} is not exp of the shifted scores")
    sh = by[en.args[0]]
    _need(isinstance(sh, Elementwise) and sh.op == "subtract", f"{en.args[0]} is not x - max")
    x, max_bc = sh.args
    seen.update((e, en.args[0]))
    _row_reduce(by, sum_bc, "sum", e, seen)
    _row_reduce(by, max_bc, "max", x, seen)
    mx = max_bc if isinstance(by[max_bc], Reduce) else by[max_bc].arg
    if safe:
        _need(empty_max == mx, f"{p}: the safe softmax tests another max")
    xs = by[x].type.shape
    _need(xs == (*batch, lq, xs[-1]), f"the scores {x} have shape {xs}")
    lk = xs[-1]
    (qk,), path = _score_nodes(by, x, materialized, _qk_test(by, batch, lq, lk))
    q_bc, k_bc = _split_product(by, by[qk].arg, br, br + 2, seen)
    d = by[by[qk].arg].type.shape[br + 1]
    seen.update(path)
    seen.add(qk)
    lse = _lse_of(by, users, mx, sum_bc if isinstance(by[sum_bc], Reduce) else by[sum_bc].arg,
                  seen, br)
    _closed(by, users, seen, materialized, {out, lse})
    return AttentionMatch(out, red, qk, q_bc, k_bc, v_bc, x, safe, frozenset(seen), tuple(batch),
                          lq, lk, d, dv, lse=lse)


def match_sum_at(prog, by, users, red: str, materialized: set) -> AttentionMatch:
    """out = sum over keys of x * v, x an elementwise function of one or two q @ k^T products
    holding exp(y - r) with r from outside them: attention's weights rebuilt from a saved
    log-sum-exp, as a flash-attention backward's three gradients read them."""
    out, seen, p_bc, v_bc, x, batch, lq, dv = _pv(by, users, red)
    br = len(batch)
    xs = by[x].type.shape
    _need(xs == (*batch, lq, xs[-1]), f"the weights {x} have shape {xs}")
    lk = xs[-1]
    qks, path = _score_nodes(by, x, materialized, _qk_test(by, batch, lq, lk), most=2)
    _need(any(_shift_of(by, n) not in (None, *path) for n in path | {x}),
          f"the weights {x} are not rebuilt from a log-sum-exp (no exp(scores - rows))")
    pairs = [_split_product(by, by[qk].arg, br, br + 2, seen) for qk in qks]
    dims = [by[by[qk].arg].type.shape[br + 1] for qk in qks]
    seen.update(path)
    seen.add(x)
    seen.update(qks)
    _closed(by, users, seen, materialized, {out})
    two = len(qks) == 2
    return AttentionMatch(out, red, qks[0], *pairs[0], v_bc, x, False, frozenset(seen),
                          tuple(batch), lq, lk, dims[0], dv, norm="sum",
                          qk2=qks[1] if two else None, q2_bc=pairs[1][0] if two else None,
                          k2_bc=pairs[1][1] if two else None, d2=dims[1] if two else 0)


def find_attention(prog, materialized: set, log) -> dict[str, AttentionMatch]:
    """Every attention in the program, by output node; near misses are logged with the reason."""
    by, users, out = prog.by_name, _users(prog), {}
    for n in prog.nodes:
        if not (isinstance(n, Reduce) and n.op == "sum"):
            continue
        matcher = match_at if _feeds_softmax(by, n) else match_sum_at if _feeds_lse(by, n) else None
        if matcher is None:
            continue
        try:
            m = matcher(prog, by, users, n.name, materialized)
        except _NoMatch as why:
            log(f"fuse: attention at {n.name} declined: {why}")
            continue
        if any(m.internal & other.internal for other in out.values()):
            continue
        out[m.out] = m
    return out


def _feeds_softmax(by, red: Reduce) -> bool:
    """Cheap pre-test: the summed product reads, through casts and wheres, a divide by a sum."""
    prod = by.get(red.arg)
    if not isinstance(prod, Elementwise) or prod.op != "multiply":
        return False
    for a in prod.operands():
        n = by[a]
        for _ in range(4):
            if isinstance(n, IndexMap):
                n = by[n.arg]
            elif isinstance(n, Elementwise) and n.op in ("cast", "where"):
                tensors = [x for x in n.args[1 if n.op == "where" else 0:] if isinstance(x, str)]
                if not tensors:            # where(c, 0, 0): no value to follow
                    break
                n = by[tensors[-1]]
            else:
                break
        if isinstance(n, Elementwise) and n.op == "divide" and isinstance(n.args[1], str):
            s = by[n.args[1]]
            if isinstance(s, Reduce) or (isinstance(s, IndexMap) and isinstance(by[s.arg], Reduce)):
                return True
    return False


def _feeds_lse(by, red: Reduce) -> bool:
    """Cheap pre-test of the sum form: the summed product reads, within a few elementwise
    steps, exp(a - b)."""
    prod = by.get(red.arg)
    if not isinstance(prod, Elementwise) or prod.op != "multiply":
        return False
    stack = [(a, 0) for a in prod.operands()]
    while stack:
        name, depth = stack.pop()
        if _shift_of(by, name) is not None:
            return True
        if depth < 4 and isinstance(by[name], (Elementwise, IndexMap)):
            stack += [(o, depth + 1) for o in by[name].operands()]
    return False


def _shift_of(by, name: str):
    """b if node `name` is exp(a - b), else None."""
    n = by[name]
    sub = by[n.args[0]] if isinstance(n, Elementwise) and n.op == "exp" and isinstance(
        n.args[0], str) else None
    return sub.args[1] if isinstance(sub, Elementwise) and sub.op == "subtract" else None


def _users(prog) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {n.name: [] for n in prog.nodes}
    for n in prog.nodes:
        for o in n.operands():
            out[o].append(n.name)
    for o in prog.outputs:
        out[o].append("<output>")
    return out
