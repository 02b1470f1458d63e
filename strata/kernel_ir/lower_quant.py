"""Kernel IR for a CPU: a loop over blocks of Q8_0/Q4_0/Q4_K/Q5_K/Q6_K weights becomes a QuantRow.

Matched by evaluation, not syntax: a QuantLinear's dequantization is a few torch ops, so by Kernel
IR the block loop (cpu_block_loops) is Lets, masked loads and selects. The inner loop's weight
expression is substituted into one and evaluated on random blocks and scales: only if it equals a
format's dequantization for every lane, exactly or rounded to bf16, is the loop a QuantRow (q4_k's
and q5_k's two lane-free parts, scale and minimum, told apart so too). QDOT=vnni takes the row to int8
activations where it reads whole, aligned blocks of them, contiguous bytes and f16 or bf16 scales.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..core.expr import (
    Cast, Const, Expr, Op, Var, from_linear, affine_terms, cast_values, children, coefficient, evaluate, free_vars, map_expr, substitute)
from .cpu_ir import BLOCK_BYTES, BLOCK_LANES, KQ, LANES, QuantRow
from .ir import Assign, For, If, Let, Load, Store


def quant_row(loop: For, bufs: dict, qdot: str | None) -> QuantRow | None:
    """`loop` as a QuantRow (see the module docstring), or None."""
    qb = match_quant_blocks(loop, bufs)
    row = qb and QuantRow.of(loop, **qb)
    if row and qdot == "vnni" and vnni_rows(loop, row, bufs):
        row = replace(row, vnni=k_parts(loop, row, bufs) if row.fmt in (*KQ, "q6_k") else (row.scale,))
    return row


def match_quant_blocks(loop: For, bufs: dict) -> dict | None:
    """`loop` (over blocks) as Lets of outer values, then a loop of 32 lanes (q6_k: 16) adding
    x[lane] * w(lane) to partial sums, or storing w(lane) (a prefill's weight dequantized once,
    cpu_prologue), w a format's dequantization (see the module docstring): QuantRow's operands;
    else None."""
    *lets, inner = loop.body or (None,)
    if loop.step != 1 or not isinstance(inner, For) or not _lanes(inner) \
            or not all(isinstance(s, Let) for s in lets):
        return None
    outer = _inlined(lets, {})
    if outer is None:
        return None
    zero = {inner.var: Const(0, "i64")}
    found = _lane_sum(inner, outer)
    if found is None:
        store = _lane_store(inner, outer, bufs)
        fmt = store and _format_of(store[2], inner.var, bufs, _lanes(inner))
        return fmt and _operands(fmt, None, None, store[0], substitute(store[1], zero))
    lanes, lanes_at, product = found
    for x, w in ((product.args[0], product.args[1]), (product.args[1], product.args[0])):
        if isinstance(x, Load) and bufs.get(x.buf) in ("f32", "bf16") and x.dtype == "f32" \
                and coefficient(x.index, inner.var) == 1:
            fmt = _format_of(w, inner.var, bufs, _lanes(inner))
            if fmt is not None:
                return _operands(fmt, x.buf, substitute(x.index, zero), lanes, substitute(lanes_at, zero))
    return None


def _operands(fmt: tuple, x, x_at, dest, dest_at) -> dict:
    return dict(fmt=fmt[0], scale=fmt[1], qs=fmt[2], qs_at=fmt[3], x=x, x_at=x_at, dest=dest,
                dest_at=dest_at, low=fmt[4])


def _lanes(inner: For) -> int | None:
    """The block's weights, 32 or 16, where `inner` runs over them from 0."""
    trips = [getattr(e, "value", None) for e in (inner.start, inner.stop)]
    return trips[1] if inner.step == 1 and trips[0] == 0 and trips[1] in (16, LANES) else None


def _inlined(body, env: dict) -> dict | None:
    """var -> its value with earlier Lets substituted (Loads kept as leaves), for a body of Lets
    and of Ifs that assign one loaded value (a masked load); None for anything else."""
    env = dict(env)
    for s in body:
        if isinstance(s, Let):
            env[s.var] = substitute(s.value, env)
        elif isinstance(s, If) and not s.orelse and len(s.then) == 1 \
                and isinstance(s.then[0], Assign) and s.then[0].var in env:
            a = s.then[0]
            prev = env[a.var]
            env[a.var] = Op("where", (substitute(s.cond, env), substitute(a.value, env), prev),
                            prev.dtype)
        else:
            return None
    return env


def _lane_sum(inner: For, outer: dict):
    """(partial sums buffer, its index, the product added) of a lane loop whose last two
    statements read lanes[i] and store lanes[i] + product; None otherwise."""
    if len(inner.body) < 3:
        return None
    *body, read, store = inner.body
    if not (isinstance(read, Let) and isinstance(read.value, Load) and isinstance(store, Store)
            and store.buf == read.value.buf and store.index == read.value.index
            and isinstance(store.value, Op) and store.value.op == "add"
            and store.value.args[0] == Var(read.var, read.dtype)
            and coefficient(store.index, inner.var) == 1):
        return None
    env = _inlined(body, outer)
    if env is None:
        return None
    product = substitute(store.value.args[1], env)
    if not (isinstance(product, Op) and product.op == "multiply" and product.dtype == "f32"):
        return None
    return store.buf, store.index, product


def _lane_store(inner: For, outer: dict, bufs: dict):
    """(buffer, its index, the value) of a lane loop of Lets and masked loads ending in one store
    to consecutive f32 or bf16 elements; None otherwise."""
    if not inner.body:
        return None
    *body, store = inner.body
    env = _inlined(body, outer)
    if env is None or not isinstance(store, Store) or bufs.get(store.buf) not in ("f32", "bf16") \
            or coefficient(store.index, inner.var) != 1:
        return None
    return store.buf, store.index, substitute(store.value, env)


def _leaves(e: Expr, stop):
    """The nodes of e for which stop(node) holds, not looking inside them."""
    if stop(e):
        return [e]
    return [x for c in children(e) for x in _leaves(c, stop)]


def _format_of(w: Expr, lane: str, bufs: dict, lanes: int):
    """(fmt, scale, qs buffer, block start, low) if w dequantizes one block of a q8_0, q4_0, q4_k,
    q5_k or q6_k buffer for every lane, found by evaluating it (see the module docstring); else None.
    The scale is w's one leaf besides the lane, constants and the bytes (a load of the scales or
    a variable), or else the largest part of w free of the lane and the bytes (q6_k's d * sc);
    q4_k's and q5_k's two such parts are its scale and its minimum (d * sc and dmin * mn,
    quant/kquants.py)."""
    leaves = set(_leaves(w, lambda x: isinstance(x, (Load, Var, Const))))
    qs = {x.buf for x in leaves if isinstance(x, Load) and bufs.get(x.buf) in ("i8", "u8")
          and lane in free_vars(x.index)}          # the bytes: read per lane (q4_k's scales: not)
    scales = [x for x in leaves if not isinstance(x, Const) and x != Var(lane, x.dtype)
              and getattr(x, "buf", None) not in qs]
    if len(qs) != 1 or not scales or any(lane in free_vars(x) for x in scales):
        return None
    qs = qs.pop()
    indices = [x.index for x in leaves if getattr(x, "buf", None) == qs]
    terms = [affine_terms(i) for i in indices]
    starts = {frozenset((a, c) for a, c in t[0].items() if lane not in free_vars(a))
              for t in terms if t is not None}
    if None in terms or len(starts) != 1 or any(coefficient(i, lane) not in (0, 1) for i in indices):
        return None                         # every byte read from one block start
    consts, start = {t[1] for t in terms}, dict(starts.pop())
    params, formats, original = (scales[0],), ("q8_0", "q4_0", "q6_k"), {}
    if len(scales) > 1:                     # evaluated as variables, emitted as written
        params = _block_params(w, lane, qs)
        original = {Var(f"st_block_param{i}", "f32"): p for i, p in enumerate(params)}
        w = map_expr(w, {p: v for v, p in original.items()}.get)
        params, formats = tuple(original), {1: ("q6_k",), 2: KQ}.get(len(params), ())
    for fmt in (f for f in formats if BLOCK_LANES.get(f, LANES) == lanes):
        dtype, nbytes = BLOCK_BYTES[fmt]
        for c in sorted(consts | {c + nbytes for c in consts}):     # where the block starts
            for order in ((0, 1), (1, 0)) if len(params) == 2 else ((0,),):
                ps = tuple(params[i] for i in order)
                if bufs[qs] == dtype and _dequantizes(w, fmt, nbytes, qs, ps, lane, c):
                    ps = tuple(original.get(p, p) for p in ps) + (None,)
                    return fmt, ps[0], qs, from_linear(start, c), ps[1]
    return None


def _block_params(w: Expr, lane: str, qs: str) -> tuple:
    """The largest parts of w free of the lane and of the bytes `qs`, constants left out."""
    if isinstance(w, Const):
        return ()
    reads = {x.buf for x in _leaves(w, lambda x: isinstance(x, Load)) if isinstance(x, Load)}
    if lane not in free_vars(w) and qs not in reads:
        return (w,)
    if isinstance(w, Load):
        return ()
    return tuple(dict.fromkeys(p for c in children(w) for p in _block_params(c, lane, qs)))


def _dequantizes(w: Expr, fmt: str, nbytes: int, qs: str, params: tuple, lane: str,
                 base: int) -> bool:
    """w(lane) == fmt's weight `lane` of a random block, for 0 <= lane < 32, exactly or rounded to
    bf16, at three random draws of the block's parameters (its scale, and a K-quant's minimum);
    bytes read outside the block are noise, so they fail."""
    rng = np.random.default_rng(0)
    dtype = np.int8 if BLOCK_BYTES[fmt][0] == "i8" else np.uint8
    for _ in range(3):
        pad = rng.integers(0, 256, 3 * nbytes).astype(np.uint8).view(dtype)
        block = pad[nbytes:2 * nbytes]
        values = [np.float32(rng.normal() * 0.01) for _ in params]
        if fmt == "q8_0":
            want = block.astype(np.float32) * values[0]
        elif fmt == "q6_k":                 # quant/kquants.py's 12 bytes a block of 16
            high = np.concatenate([block[8:] >> s & 3 for s in (0, 2, 4, 6)])
            q = np.concatenate([block[:8] & 15, block[:8] >> 4]) | high << 4
            want = (q.astype(np.float32) - 32) * values[0]
        else:                               # q5_k: q4_k's 16 bytes, then a fifth bit a weight
            q = np.concatenate([block[:16] & 15, block[:16] >> 4]).astype(np.float32)
            q += 16 * np.concatenate([block[16:] >> b & 1 for b in range(8)]) if fmt == "q5_k" else 0
            want = q * values[0] - values[1] if fmt in KQ else (q - 8) * values[0]

        def extra(e, go):
            if isinstance(e, Load) and e.buf == qs:
                at = np.asarray(go(e.index), dtype=np.int64) - base + nbytes
                return pad[np.clip(at, 0, 3 * nbytes - 1)]
            if e in params:
                return values[params.index(e)]
            raise KeyError(e)
        env = _Env(lane, len(want), params, values)
        try:
            got = np.broadcast_to(evaluate(w, env, extra), want.shape).astype(np.float32)
        except Exception:  # noqa: BLE001 - an expression this evaluation cannot take is no match
            return False
        if not (np.array_equal(got, want) or np.array_equal(got, cast_values(want, "bf16"))):
            return False
    return True


class _Env(dict):
    """The lane variable as 0..31 (or 15), the block's parameters (Vars) as drawn, and every
    other outer variable 0: the block is evaluated relative to its start."""

    def __init__(self, lane: str, lanes: int, params: tuple, values: list):
        super().__init__({lane: np.arange(lanes, dtype=np.int64)})
        self.update({p.name: v for p, v in zip(params, values) if isinstance(p, Var)})

    def __missing__(self, key):
        return np.int64(0)


def vnni_rows(loop: For, qb: QuantRow, bufs: dict) -> bool:
    """Whether QDOT=vnni can run the row: activations read in whole blocks of 32 at a multiple
    of 32, the block's bytes contiguous block after block, its scale an f16 or bf16 load, one
    a block (a K-quant's: k_parts)."""
    if qb.x is None:
        return False
    if qb.fmt in (*KQ, "q6_k"):
        parts = k_parts(loop, qb, bufs)
        scales = parts and parts[::2]
    else:
        scales = (qb.scale,) if isinstance(qb.scale, Load) and coefficient(qb.scale.index, loop.var) == 1 \
            else None
    if not scales or any(bufs.get(s.buf) not in ("f16", "bf16") for s in scales):
        return False
    terms, lanes = affine_terms(qb.x_at), BLOCK_LANES.get(qb.fmt, LANES)
    return terms is not None and coefficient(qb.x_at, loop.var) == lanes and terms[1] % LANES == 0 \
        and all(c % LANES == 0 for a, c in terms[0].items() if loop.var not in free_vars(a)) \
        and coefficient(qb.qs_at, loop.var) == BLOCK_BYTES[qb.fmt][1]


def k_parts(loop: For, qb: QuantRow, bufs: dict) -> tuple | None:
    """The loads (d, sc, dmin, mn) of a q4_k or q5_k row whose scale is d * sc and minimum dmin * mn (in
    either order), or (d, sc) of a q6_k row: sc and mn one byte a block, d and dmin one a
    super-block (8 blocks of 32, 16 of 16), the row starting at a super-block; else None (a row
    of one super-block, whose d is a variable, too)."""
    per, byte_type = (8, "u8") if qb.fmt in KQ else (16, "i8")
    if not (isinstance(loop.start, Const) and int(loop.start.value) % per == 0):
        return None
    found = []
    for e in (qb.scale, qb.low) if qb.fmt in KQ else (qb.scale,):
        if not (isinstance(e, Op) and e.op == "multiply"):
            return None
        a, b = e.args
        a, b = (a, b) if isinstance(a, Load) else (b, a)
        byte = b.arg if isinstance(b, Cast) else None
        if not (isinstance(a, Load) and isinstance(byte, Load) and bufs.get(byte.buf) == byte_type
                and coefficient(byte.index, loop.var) == 1 and _per_blocks(a.index, loop, per)):
            return None
        found += [a, byte]
    return tuple(found)


def _per_blocks(index: Expr, loop: For, per: int) -> bool:
    """Whether index steps by one every `per` blocks from the row's start (over its first 2)."""
    trips = loop.stop.value - loop.start.value if isinstance(loop.stop, Const) else 2 * per
    n = max(1, min(2 * per, int(trips)))
    try:
        at = np.asarray(evaluate(index, _Env(loop.var, n, (), [])), dtype=np.int64)
    except Exception:  # noqa: BLE001 - an index this evaluation cannot take is no match
        return False
    return np.array_equal(np.broadcast_to(at, (n,)) - at.flat[0], np.arange(n) // per)


