"""Tile IR -> Kernel IR for a fused attention (mode "attention", tile/attention.py).

blockIdx.x enumerates (batch..., query block[, KV split]), threadIdx.x = row * ROW_THREADS + t,
a row being a query (or, with GQA_GROUP > 1, a (head of the group, query) pair: the group's
K/V operands are staged once at its first head). The key loop covers `key_range`: whole
blocks first without bounds or causal mask, then the diagonal/tail blocks with them. With
KV_SPLITS > 1 the block writes its (m, l, acc) partials (lower_attention_combine.py merges).
Per key block: a cooperative fill of the K and V tiles into shared memory (row stride padded to
a multiple of ROW_THREADS, zero past Lk and past the head dim, so the inner loops need no
guards), a barrier, then for each of the BLOCK_N keys a partial dot product, a butterfly of
warp shuffles, and x (scale, masks) under the query's and key's bounds; then one online-softmax
step for the whole block of keys and a barrier before the tiles are refilled. Registers are
named per element: q_u, acc_u (u < head dim / ROW_THREADS) and x_n, p_n (n < BLOCK_N).
"""
from __future__ import annotations

from math import prod
from dataclasses import replace

from ..core import dtypes
from ..core.expr import (Cast, Const, Expr, Var, add, affine_terms, call, floordiv, mod, mul,
                         substitute)
from ..loop.ir import Let as LLet, Load as LLoad
from ..tile.ir import TileKernel, flat_index, subst_body
from .ir import (
    Assign,
    BlockIdx,
    CpAsync,
    CpAsyncCommit,
    CpAsyncWait,
    For,
    If,
    Kernel,
    Let,
    Load,
    Param,
    ShflXor,
    Smem,
    Store,
    Sync,
    ThreadIdx,
    walk,
)
from .lowerer import bind_domain, Lowerer

F32 = "f32"
NEG_INF = Const(float("-inf"), F32)


def rescale(m_old: Expr, m_new: Expr) -> Expr:
    """The factor the running sum and accumulator are multiplied by when the max moves: the
    heart of the online softmax (a test breaks it on purpose and expects wrong answers)."""
    return call("exp", call("subtract", m_old, m_new))


def _f(name: str) -> Var:
    return Var(name, F32)


def _and(*conds):
    out = None
    for c in conds:
        if c is not None:
            out = c if out is None else call("logical_and", out, c)
    return out


def _guarded(cond, body: list, orelse: list = ()) -> list:
    """body under cond; always a block of its own, since each copy redeclares its names."""
    return [If(Const(True, "bool") if cond is None else cond, tuple(body), tuple(orelse))]


def _imin(a, b) -> Expr:
    return call("minimum", a, b)


def _imax(a, b) -> Expr:
    return call("maximum", a, b)


def key_range(at, I, idx) -> list:
    """Lets kv_lo, kv_mid, kv_hi: this block's keys [kv_lo, kv_hi) (its split, cut at the causal
    limit of its last query), of which [kv_lo, kv_mid) are whole key blocks that no mask or bound
    touches for any of its queries (a test breaks this on purpose and expects wrong answers)."""
    op, bn = at.op, at.block_n
    lq, lk = op.i[1], op.j[1]
    whole = Const(lk // bn * bn)
    lo, hi = Const(0), Const(lk)
    if at.kv_splits > 1:
        lo = mul(I("kv_split"), at.split_blocks * bn)
        hi = _imin(add(I("kv_lo"), at.split_blocks * bn), Const(lk))
    if at.causal and at.causal.loaded is not None:    # keys up to a loaded scalar (a position)
        end = add(Var("kv_pos", idx), at.causal.offset + 1)
        hi = _imin(hi, _imax(Const(0), end))
        whole = _imin(whole, mul(floordiv(_imax(Const(0), end), bn), bn))
        return [Let("kv_lo", idx, lo), Let("kv_hi", idx, hi),
                Let("kv_mid", idx, _imax(I("kv_lo"), _imin(I("kv_hi"), whole)))]
    if at.causal and at.causal.lower:        # keys from the first query's limit, all masked
        first = mul(I("q_blk"), at.q_per_block)
        lo = mul(floordiv(_imax(Const(0), add(first, at.causal.offset)), bn), bn)
        return [Let("kv_lo", idx, _imin(lo, Const(lk))), Let("kv_hi", idx, hi),
                Let("kv_mid", idx, I("kv_lo"))]
    out = [Let("kv_lo", idx, lo)]
    if at.causal:
        c = at.causal.offset
        first = mul(I("q_blk"), at.q_per_block)
        last = _imin(add(first, at.q_per_block), Const(lq))   # one past the block's last query
        hi = _imin(hi, _imax(Const(0), add(last, c)))
        whole = _imin(whole, mul(floordiv(_imax(Const(0), add(first, c + 1)), bn), bn))
    out.append(Let("kv_hi", idx, hi))
    out.append(Let("kv_mid", idx, _imax(I("kv_lo"), _imin(I("kv_hi"), whole))))
    return out


def bound_load(low: Lowerer, at) -> list:
    """kv_pos, the scalar a loaded causal bound reads (a decode step's position), for key_range:
    the x operand's own Load of it, once per block."""
    if not (at.causal and at.causal.loaded is not None):
        return []
    ld = at.causal.loaded
    return low.stmts((replace(ld, var="kv_pos_raw"),)) + [
        Let("kv_pos", low.idx, Cast(Var("kv_pos_raw", ld.dtype), low.idx))]


def block_origin(at, idx: str) -> tuple[list, dict]:
    """Lets decoding blockIdx.x into (batch..., query block[, KV split]), and the K and V
    operands with GQA's head substitution (the block's group reads its first head's K/V)."""
    I = lambda name: Var(name, idx)
    body, blk = [], BlockIdx()
    if at.kv_splits > 1:
        body += [Let("kv_split", idx, mod(BlockIdx(), at.kv_splits)),
                 Let("qb_flat", idx, floordiv(BlockIdx(), at.kv_splits))]
        blk = I("qb_flat")
    body += [Let("q_blk", idx, mod(blk, at.m_blocks)), Let("b_flat", idx, floordiv(blk, at.m_blocks))]
    op, batch, kv_sub = at.op, at.op.batch, {}
    if at.group > 1:
        hg = f"{at.head}_grp"
        batch = tuple((hg, n // at.group) if v == at.head else (v, n) for v, n in batch)
        kv_sub = {at.head: mul(I(hg), at.group)}
    if batch:
        body += [Let(v, idx, e) for v, e in bind_domain(I("b_flat"), batch,
                                                        {"b_flat": prod([n for _, n in batch])})]
    staged = (("k", op.k), ("v", op.v)) + ((("k2", op.k2),) if op.k2 is not None else ())
    kv_ops = {n: replace(o, body=tuple(subst_body(o.body, kv_sub)), value=substitute(o.value, kv_sub))
              if kv_sub else o for n, o in staged}
    return body, kv_ops


def operand(low: Lowerer, o, binds: list, value_var: str, declare: bool, stmts=None) -> list:
    """The statements computing operand `o` (prologue included) into value_var, after binds."""
    out = list(binds) + low.stmts(o.body if stmts is None else stmts)
    return out + [Let(value_var, F32, o.value)] if declare else out + [Assign(value_var, o.value)]


def unmasked_scores(at) -> tuple:
    """The score statements of a whole (below-diagonal) key block: the causal test is true."""
    if not at.causal or at.causal.lower:
        return at.op.x.body
    return tuple(replace(s, value=Const(at.causal.keep, "bool")) if isinstance(s, LLet) and
                 s.var == at.causal.cond else s for s in at.op.x.body)


def fill_kv(low: Lowerer, at, kv_ops: dict, tiles, edge: bool, block: int,
            async_copy: bool = False, j0: Expr | None = None, stage: Expr | int = 0,
            wait: bool = True, place=None) -> list:
    """Fill the K and V tiles of the key block at j0: tiles are (smem, "k"|"v", width, extent,
    axis, row stride); 0 past Lk (edge blocks only) and past the head dim (width > extent).
    With `async_copy` (sm_80+, 16-bit tiles) a tile whose operand is a plain load along rows
    of whole 16-byte pieces is copied 16 bytes a thread by cp.async (`cp_async_source`), waited for
    here (or, not `wait`, only committed: the pipelined mma form fills the next key block, at
    `j0`, into buffer `stage` of two); any other element by element through
    registers (2-byte loads before, for all). place(row, col): where an element of the tile sits
    (default row * stride + col; the wgmma form's swizzled rows)."""
    idx = low.idx
    I = lambda name: Var(name, idx)
    (jv, lk), out = at.op.j, []
    j0 = I("j0") if j0 is None else j0
    for tile, which, width, extent, ax, stride in tiles:
        f, jj, x = I(f"{tile}_f"), I(f"{tile}_j"), I(f"{tile}_x")
        offset = mul(stage, at.block_n * stride)
        src = cp_async_source(low, kv_ops[which], ax, width, extent, stride) if async_copy else None
        if src is not None:
            buf, index = src
            fill = [Let(jj.name, idx, floordiv(f, width)), Let(x.name, idx, mod(f, width)),
                    Let(jv, idx, add(j0, jj)), Let(ax, idx, x)]
            dst = add(place(jj, x) if place else add(mul(jj, stride), x), offset)
            ok = call("lt", I(jv), Const(lk)) if edge else None
            fill.append(CpAsync(tile, dst, buf, index, 16, cache="cg") if ok is None else
                        CpAsync(tile, dst, buf, call("where", ok, index, Const(0, idx)), 16,
                                src_bytes=call("where", ok, Const(16, idx), Const(0, idx)),
                                cache="cg"))
            out.append(For(f.name, mul(ThreadIdx(), 8), Const(at.block_n * width), block * 8,
                           tuple(fill), dtype=idx))
            continue
        fill = [Let(jj.name, idx, floordiv(f, width)), Let(x.name, idx, mod(f, width))]
        j = add(j0, jj)
        at_ = add(place(jj, x) if place else f if stride == width else add(mul(jj, stride), x),
                  offset)
        ok = _and(call("lt", j, Const(lk)) if edge else None,
                  call("lt", x, Const(extent)) if width > extent else None)
        compute = operand(low, kv_ops[which], [Let(jv, idx, j), Let(ax, idx, x)], f"{tile}_val", True)
        compute.append(Store(tile, at_, _f(f"{tile}_val")))
        fill += _guarded(ok, compute, [Store(tile, at_, Const(0.0, F32))]) if ok is not None else compute
        out.append(For(f.name, ThreadIdx(), Const(at.block_n * width), block, tuple(fill), dtype=idx))
    if any(isinstance(s, CpAsync) for s in walk(out)):
        out += [CpAsyncCommit(), CpAsyncWait(0)] if wait else [CpAsyncCommit()]
    return out


def cp_async_source(low: Lowerer, o, ax: str, width: int, extent: int, stride: int):
    """(buffer, flat index) where operand `o` is one plain 16-bit load, contiguous along `ax`,
    every other step and the start a multiple of 8 elements, and the tile's rows are whole
    16-byte pieces (the head dim padded alike): a cp.async source. Else None."""
    body = o.body
    if len(body) != 1 or not isinstance(body[0], LLoad) or body[0].pred is not None \
            or not (isinstance(o.value, Var) and o.value.name == body[0].var) \
            or dtypes.ITEMSIZE[low.tk.dtype_of(body[0].buf)] != 2 or width % 8 or extent % 8 \
            or width != extent or stride % 8:
        return None
    index = flat_index(body[0].index, low.tk.shape_of(body[0].buf))
    terms = affine_terms(index)
    if terms is None or not isinstance(terms[1], int) or terms[1] % 8:
        return None
    coef = {getattr(v, "name", v): c for v, c in terms[0].items()}
    if coef.get(ax) != 1 or any(c % 8 for v, c in coef.items() if v != ax):
        return None
    return body[0].buf, index


def lower_attention_kernel(tk: TileKernel) -> Kernel:
    """The CUDA-core flash attention (lower.py chooses it, the mma one or the split combine)."""
    at = tk.attention
    op, g, bm, bn, S = at.op, at.row_threads, at.block_m, at.block_n, at.kv_splits
    low = Lowerer(tk)
    idx = low.idx
    I = lambda name: Var(name, idx)
    (iv, lq), (jv, lk), (dv_, d), (ev, dv) = op.i, op.j, op.d, op.e
    du, eu = at.d_per_thread, at.e_per_thread
    dp, ep = du * g, eu * g                 # padded tile rows
    t, r = low.v["t"], "q_row"
    body: list = [Let(t, idx, mod(ThreadIdx(), g)), Let(r, idx, floordiv(ThreadIdx(), g))]
    origin, kv_ops = block_origin(at, idx)
    body += origin
    qb = at.q_per_block
    if at.group > 1:            # rows are (head in the group, query); the block's heads share K/V
        body.append(Let(at.head, idx, add(mul(I(f"{at.head}_grp"), at.group), floordiv(I(r), qb))))
        body.append(Let(iv, idx, add(mul(I("q_blk"), qb), mod(I(r), qb))))
    else:
        body.append(Let(iv, idx, add(mul(I("q_blk"), bm), I(r))))
    row_ok = call("lt", I(iv), Const(lq)) if lq % qb or qb > lq else None

    # q (and q2): this thread's slice of the query row, in registers
    rows = [("q", op.q, dv_, d, du)]
    if op.q2 is not None:
        rows.append(("q2", op.q2, op.d2[0], op.d2[1], at.d2_per_thread))
    for name, o, ax, extent, per in rows:
        for u in range(per):
            dcoord = add(I(t), g * u)
            body.append(Let(f"{name}_{u}", F32, Const(0.0, F32)))
            ok = _and(row_ok, call("lt", dcoord, Const(extent)) if per * g > extent else None)
            body += _guarded(ok, operand(low, o, [Let(ax, idx, dcoord)], f"{name}_{u}", False))
    softmax = op.norm != "sum"
    if softmax:
        body += [Let("m_run", F32, NEG_INF), Let("l_run", F32, Const(0.0, F32))]
    body += [Let(f"acc_{u}", F32, Const(0.0, F32)) for u in range(eu)]
    unmasked = unmasked_scores(at)

    def key_step(edge: bool) -> list:
        """One key block: fill K and V tiles, scores, online-softmax step. Only an edge block
        (past the whole ones) checks Lk and applies the causal mask."""
        tiles = [("k_tile", "k", dp, d, dv_, dp), ("v_tile", "v", ep, dv, ev, ep)]
        dots = [("dot", "q", "k_tile", du, dp)]
        if op.q2 is not None:
            d2p = at.d2_per_thread * g
            tiles.append(("k2_tile", "k2", d2p, op.d2[1], op.d2[0], d2p))
            dots.append(("dot2", "q2", "k2_tile", at.d2_per_thread, d2p))
        step = fill_kv(low, at, kv_ops, tiles, edge, tk.block)
        step.append(Sync())
        for n in range(bn):
            for dot, q, tile, per, width in dots:
                for u in range(per):
                    kval = Load(tile, add(Const(n * width), add(I(t), g * u)), F32)
                    term = call("multiply", _f(f"{q}_{u}"), kval)
                    step.append(Let(f"{dot}_{n}", F32, term) if u == 0 else
                                Assign(f"{dot}_{n}", call("add", _f(f"{dot}_{n}"), term)))
                m = g // 2
                while m >= 1:
                    step.append(Assign(f"{dot}_{n}", call("add", _f(f"{dot}_{n}"),
                                                          ShflXor(_f(f"{dot}_{n}"), m, F32))))
                    m //= 2
            # a key past the end weighs nothing: -inf before a softmax, 0 in the sum form
            step.append(Let(f"x_{n}", F32, NEG_INF if softmax else Const(0.0, F32)))
            j = add(I("j0"), n)
            ok = _and(row_ok, call("lt", j, Const(lk)) if edge else None)
            xs = [Let(jv, idx, j), Let(op.score, F32, _f(f"dot_{n}"))]
            if op.q2 is not None:
                xs.append(Let(op.score2, F32, _f(f"dot2_{n}")))
            step += _guarded(ok, operand(low, op.x, xs, f"x_{n}", False, op.x.body if edge else unmasked))
        if not softmax:
            for u in range(eu):
                for n in range(bn):
                    vval = Load("v_tile", add(Const(n * ep), add(I(t), g * u)), F32)
                    step.append(Assign(f"acc_{u}", call("add", _f(f"acc_{u}"),
                                                        call("multiply", _f(f"x_{n}"), vval))))
            return step + [Sync()]
        step.append(Let("m_new", F32, _f("m_run")))
        step += [Assign("m_new", call("maximum", _f("m_new"), _f(f"x_{n}"))) for n in range(bn)]
        # a row with no finite score yet: -inf - -inf would be NaN; shift by 0 (every p is 0)
        step.append(Let("m_use", F32, call("where", call("eq", _f("m_new"), NEG_INF),
                                           Const(0.0, F32), _f("m_new"))))
        step.append(Let("corr", F32, rescale(_f("m_run"), _f("m_use"))))
        step += [Let(f"p_{n}", F32, call("exp", call("subtract", _f(f"x_{n}"), _f("m_use"))))
                 for n in range(bn)]
        step.append(Assign("l_run", call("multiply", _f("l_run"), _f("corr"))))
        step += [Assign("l_run", call("add", _f("l_run"), _f(f"p_{n}"))) for n in range(bn)]
        for u in range(eu):
            step.append(Assign(f"acc_{u}", call("multiply", _f(f"acc_{u}"), _f("corr"))))
            for n in range(bn):
                vval = Load("v_tile", add(Const(n * ep), add(I(t), g * u)), F32)
                step.append(Assign(f"acc_{u}", call("add", _f(f"acc_{u}"),
                                                    call("multiply", _f(f"p_{n}"), vval))))
        step += [Assign("m_run", _f("m_new")), Sync()]
        return step

    body += bound_load(low, at)
    body += [Smem("k_tile", op.k.dtype, bn * dp), Smem("v_tile", op.v.dtype, bn * ep)]
    if op.k2 is not None:
        body.append(Smem("k2_tile", op.k2.dtype, bn * at.d2_per_thread * g))
    body += key_range(at, I, idx)
    body.append(For("j0", I("kv_lo"), I("kv_mid"), bn, tuple(key_step(False)), dtype=idx))
    body.append(For("j0", I("kv_mid"), I("kv_hi"), bn, tuple(key_step(True)), dtype=idx))
    tv = I(t)
    body += _store_partials(at, tv, I, idx, row_ok) if S > 1 else _store_out(at, tk, tv, idx, row_ok)
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes) for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)


def _store_out(at, tk, t, idx, row_ok) -> list:
    op, g = at.op, at.row_threads
    ev, dv = op.e
    ep = at.e_per_thread * g
    shape = tk.shape_of(op.out)
    out = []
    for u in range(at.e_per_thread):
        ecoord = add(t, g * u)
        value = _f(f"acc_{u}")
        if op.norm != "sum":
            value = call("divide", value, _f("l_run"))
        if op.safe:
            value = call("where", call("eq", _f("m_run"), NEG_INF), Const(0.0, F32), value)
        ok = _and(row_ok, call("lt", ecoord, Const(dv)) if ep > dv else None)
        out += _guarded(ok, [Let(ev, idx, ecoord), Store(op.out, flat_index(op.out_index, shape), value)])
    if op.lse:          # the row's log-sum-exp, by its first thread (-inf for a row of -inf)
        buf, index = op.lse
        lse = call("add", _f("m_run"), call("log", _f("l_run")))
        out += _guarded(_and(row_ok, call("eq", t, Const(0))),
                        [Store(buf, flat_index(index, tk.shape_of(buf)), lse)])
    return out


def _store_partials(at, t, I, idx, row_ok) -> list:
    """Split-KV: this split's (m, l) (by the query's first thread) and unnormalized acc."""
    op, g = at.op, at.row_threads
    dv = op.e[1]
    ep = at.e_per_thread * g
    ml, acc = at.partials
    flat = flat_index(tuple(I(v) for v, _ in (*op.batch, op.i)), tuple(n for _, n in (*op.batch, op.i)))
    row = add(mul(I("kv_split"), at.rows), flat)
    out = [Let("part_row", idx, row)]
    first = call("eq", t, Const(0))
    out += _guarded(_and(row_ok, first), [
        Store(ml, mul(I("part_row"), 2), _f("m_run")),
        Store(ml, add(mul(I("part_row"), 2), 1), _f("l_run"))])
    for u in range(at.e_per_thread):
        ecoord = add(t, g * u)
        ok = _and(row_ok, call("lt", ecoord, Const(dv)) if ep > dv else None)
        out += _guarded(ok, [Store(acc, add(mul(I("part_row"), dv), ecoord), _f(f"acc_{u}"))])
    return out


__all__ = ["dtypes", "key_range", "lower_attention_kernel", "rescale"]
