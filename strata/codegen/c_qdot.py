"""A loop over blocks of Q8_0/Q4_0/Q4_K/Q6_K weights (a quantized matrix-vector row) as AVX-512/AVX2 code.

Why: cpu_block_loops runs a QuantLinear's row as blocks of 32 with the block's scale hoisted, but
gcc still dequantizes each lane through its scalar chain (nibble masks, selects, a bf16 rounding)
and adds it to a partial sum in memory, so the row is bound by instructions, not by the bytes it
reads (docs/quant-cpu-2026-11-26.md). Here the block loop is matched by what it computes, and a
block becomes: 32 bytes (q8_0) or 16 (q4_0) widened to int32 lanes (two zmm, or four ymm with
AVX2), converted to float, multiplied by the 32 activations, and the sum scaled by the block's
scale once: acc += d * (q[0:16] x[0:16] + q[16:32] x[16:32]), two accumulators for alternate
blocks. After the
loop the accumulators are added into the row's partial sums, which the kernel sums as written.
The K-quants (quant/kquants.py) are blocks too: q4_k's 32 nibbles have a scale and a minimum
(w = a * q - b: its two lane-free parts, found and told apart by evaluation), looked up in a
table of the block's sixteen weights; q6_k's blocks are 16 bytes with one scale.

Matching by evaluation, not by syntax: the inner loop's weight expression (whatever Lets, Ifs and
selects lowering produced) is substituted into one expression and evaluated on random blocks and
scales; only if it equals a format's dequantization for all 32 lanes, exactly or rounded to bf16,
is the loop taken. A rounded weight (QuantLinear's `.to(bf16)`) is not rounded here: the scale is
applied to the block's sum instead, which is nearer the float64 reference, not farther; the order
of the sum differs from the scalar loop's as `omp simd`'s does. The loop is printed as written
under `#else`, for compilers targeting neither (the `cpu` target's x86-64).

QDOT=vnni (cpu_block_loops' default where the CPU has AVX512-VNNI): as llama.cpp does, the
kernel first quantizes the row's activations to int8 blocks of 32 (d = max|x| / 127, q =
round(x / d)), and a row's blocks run 16 at a time on vpdpbusd: the weights' bytes as unsigned
(nibbles 0..15, or q8_0's bytes + 128) times the activations' int8, two blocks per instruction,
each block's int32 sums scaled by its two scales in one FMA and the offset (8 or 128 times the
activations' sum) taken off per row; the next rows' bytes are prefetched. A 5632 x 2048 q4_0
row set, weights streamed from DRAM, 2 threads, Emerald Rapids: 0.73 ms as float lanes, 0.39
with VNNI (the bytes alone stream in 0.32). On AVX2 without AVX-512 (Zen 3, Haswell) the same
blocks run one at a time on vpmaddubsw + vpmaddwd (q8_0 by llama.cpp's sign trick, whose
products cannot saturate int16): the same row set on the 2-core Zen 3, interleaved, 0.68 ms as
float lanes, 0.37 ms so (then 1.13x more with q4_0's nibbles unpacked by one vpsrlvq); a
TinyLlama q4_0 decode 13.9 -> 27 tokens/s. The activations' rounding is llama.cpp's error, not
the float path's: QDOT=float keeps the float lanes. The row must read whole, aligned blocks of
the activations and contiguous bytes and f16 or bf16 scales; the float path takes any other.
q4_k and q6_k rows run so too (k_parts finds their scale bytes and super-block scales): q4_k's
16 scales and minimums a step made from the bytes, the minimums times the activations' block
sums taken off; q6_k's bytes + 128 less 128 times the activations' sums, a scale per 16. The same
5632 x 2048 row set, 2 threads, Zen 4 (another process busy): q4_0 0.33 ms, q4_k 0.37 to 0.48,
q6_k 0.47 to 0.52 (twice q4's bytes); as float lanes 0.61, 1.1 to 1.3 and 1.2 to 1.4.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..expr import (Cast, Const, Expr, Op, Var, from_linear, affine_terms, cast_values, children,
                    coefficient, evaluate, free_vars, map_expr, substitute)
from ..kernel_ir.ir import Assign, For, If, Let, Load, Store
from .cfamily import REL, cname, prelude, strip_parens

LANES = 32                                  # weights per block (strata/quant/formats.py)
BLOCK_BYTES = {"q8_0": ("i8", 32), "q4_0": ("u8", 16), "q4_k": ("u8", 16), "q6_k": ("i8", 16)}
BLOCK_LANES = {"q6_k": 16}                  # the others: LANES

QDOT_PRELUDE = prelude("c_qdot.h")


@dataclass(frozen=True)
class QuantBlocks:
    fmt: str                    # q8_0 | q4_0 | q4_k | q6_k
    scale: Expr                 # the block's scale, free of the lane variable
    qs: str                     # the quantized bytes
    qs_at: Expr                 # the block's first byte
    x: str | None               # the activations (f32 or bf16); None: the weights are stored
    x_at: Expr | None           # the activation of lane 0
    dest: str                   # the row's partial sums, or the dequantized weights (f32, bf16)
    dest_at: Expr               # its element of lane 0
    low: Expr | None = None     # q4_k: the block's minimum (w = scale * nibble - low)


def match_quant_blocks(loop: For, bufs: dict) -> QuantBlocks | None:
    """`loop` (over blocks) as Lets of outer values, then a loop of 32 lanes (q6_k: 16) adding
    x[lane] * w(lane) to partial sums, or storing w(lane) (a prefill's weight dequantized once,
    cpu_prologue), w a format's dequantization (see the module docstring); else None."""
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
        return fmt and QuantBlocks(*fmt[:4], None, None, store[0], substitute(store[1], zero),
                                   fmt[4])
    lanes, lanes_at, product = found
    for x, w in ((product.args[0], product.args[1]), (product.args[1], product.args[0])):
        if isinstance(x, Load) and bufs.get(x.buf) in ("f32", "bf16") and x.dtype == "f32" \
                and coefficient(x.index, inner.var) == 1:
            fmt = _format_of(w, inner.var, bufs, _lanes(inner))
            if fmt is not None:
                return QuantBlocks(*fmt[:4], x.buf, substitute(x.index, zero),
                                   lanes, substitute(lanes_at, zero), fmt[4])
    return None


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
    """(fmt, scale, qs buffer, block start, low) if w dequantizes one block of a q8_0, q4_0, q4_k
    or q6_k buffer for every lane, found by evaluating it (see the module docstring); else None.
    The scale is w's one leaf besides the lane, constants and the bytes (a load of the scales or
    a variable), or else the largest part of w free of the lane and the bytes (q6_k's d * sc);
    q4_k's two such parts are its scale and its minimum (d * sc and dmin * mn, quant/kquants.py)."""
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
        params, formats = tuple(original), {1: ("q6_k",), 2: ("q4_k",)}.get(len(params), ())
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
    bf16, at three random draws of the block's parameters (its scale, and q4_k's minimum);
    bytes read outside the block are noise, so they fail."""
    rng = np.random.default_rng(0)
    dtype = np.int8 if BLOCK_BYTES[fmt][0] == "i8" else np.uint8
    for _ in range(3):
        pad = rng.integers(0, 256, 3 * nbytes).astype(np.uint8).view(dtype)
        block = pad[nbytes:2 * nbytes]
        values = [np.float32(rng.normal() * 0.01) for _ in params]
        if fmt in ("q8_0", "q6_k"):
            want = block.astype(np.float32) * values[0]
        else:
            q = np.concatenate([block & 15, block >> 4]).astype(np.float32)
            want = q * values[0] - values[1] if fmt == "q4_k" else (q - 8) * values[0]

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


def vnni_rows(loop: For, qb: QuantBlocks, bufs: dict) -> bool:
    """Whether QDOT=vnni can run the row: activations read in whole blocks of 32 at a multiple
    of 32, the block's bytes contiguous block after block, its scale an f16 or bf16 load, one
    a block (a K-quant's: k_parts)."""
    if qb.x is None:
        return False
    if qb.fmt in ("q4_k", "q6_k"):
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


def k_parts(loop: For, qb: QuantBlocks, bufs: dict) -> tuple | None:
    """The loads (d, sc, dmin, mn) of a q4_k row whose scale is d * sc and minimum dmin * mn (in
    either order), or (d, sc) of a q6_k row: sc and mn one byte a block, d and dmin one a
    super-block (8 blocks of 32, 16 of 16), the row starting at a super-block; else None (a row
    of one super-block, whose d is a variable, too)."""
    per, byte_type = (8, "u8") if qb.fmt == "q4_k" else (16, "i8")
    if not (isinstance(loop.start, Const) and int(loop.start.value) % per == 0):
        return None
    found = []
    for e in (qb.scale, qb.low) if qb.fmt == "q4_k" else (qb.scale,):
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


def emit_quant_blocks(em, loop: For, qb: QuantBlocks, depth: int, as_written, vnni=False) -> None:
    """Print `loop` as vector code where the compiler targets AVX-512F or AVX2 with FMA, else
    `as_written()`."""
    o, t = cname(loop.var), em.ctype(loop.var, loop.dtype)
    stop = em.expr(loop.stop, REL + 1)
    fn = f"st_{qb.fmt}_{'bf16' if em.bufs[qb.x or qb.dest] == 'bf16' else 'f32'}"
    ctype = "signed char" if BLOCK_BYTES[qb.fmt][0] == "i8" else "unsigned char"

    def at(e: Expr, step: int) -> str:
        if step:
            e = substitute(e, {loop.var: Op("add", (Var(loop.var, loop.dtype), Const(step, loop.dtype)),
                                            loop.dtype)})
        return strip_parens(em.expr(e))

    def value(e: Expr, step: int) -> str:        # fp16 loads by F16C, which these CPUs have
        plain, em.to_float = em.to_float, {**em.to_float, "f16": "st_f16_scale"}
        try:
            return at(e, step)
        finally:
            em.to_float = plain

    def scale(step: int) -> str:
        return value(qb.scale, step)

    def low(step: int) -> str:
        return "" if qb.low is None else f", {value(qb.low, step)}"

    def q(step: int) -> str:
        return f"(const {ctype}*)&{cname(qb.qs)}[{at(qb.qs_at, step)}]"
    if qb.x is None:                        # a weight dequantized and stored
        em.emit(f"#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    // {qb.fmt} "
                f"blocks stored as vector code (codegen/c_qdot.py)", 0)
        em.emit(f"for ({t} {o} = {strip_parens(em.expr(loop.start))}; {o} < {stop}; {o}++) {{", depth)
        em.emit(f"{fn.replace('_f32', '_to_f32').replace('_bf16', '_to_bf16')}"
                f"(&{cname(qb.dest)}[{at(qb.dest_at, 0)}], {q(0)}, {scale(0)}{low(0)});", depth + 1)
        em.emit("}", depth)
        em.emit("#else", 0)
        as_written()
        return em.emit("#endif", 0)

    def block(acc: str, step: int, d: int) -> None:
        em.emit(f"{acc} = {fn}({acc}, {q(step)}, &{cname(qb.x)}[{at(qb.x_at, step)}], "
                f"{scale(step)}{low(step)});", d)
    if vnni:
        em.emit(f"#if ST_VNNI    // {qb.fmt} blocks by int8 dot products, activations in int8 "
                f"(codegen/c_qdot.py)", 0)
        em.emit(f"{{ {t} {o} = {strip_parens(em.expr(loop.start))};", depth)
        scales = k_parts(loop, qb, em.bufs) if qb.fmt in ("q4_k", "q6_k") else (qb.scale,)
        where = ", ".join(f"&{cname(s.buf)}[{at(s.index, 0)}]" for s in scales)
        em.emit(f"st_qlanes(&{cname(qb.dest)}[{strip_parens(em.expr(qb.dest_at))}], "
                f"st_{qb.fmt}_vnni_{em.bufs[scales[0].buf]}({q(0)}, {where}, "
                f"&st_xq_{cname(qb.x)}, ({at(qb.x_at, 0)}) / {LANES}, {stop} - {o}), st_qzero()); }}",
                depth)
        em.emit(f"#elif defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    "
                f"// {qb.fmt} blocks as vector code", 0)
    else:
        em.emit(f"#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    "
                f"// {qb.fmt} blocks as vector code (codegen/c_qdot.py)", 0)
    em.emit("{", depth)
    em.emit("st_qv st_qacc0 = st_qzero(), st_qacc1 = st_qzero();", depth + 1)
    em.emit(f"{t} {o} = {strip_parens(em.expr(loop.start))};", depth + 1)
    em.emit(f"for (; {o} + 2 <= {stop}; {o} += 2) {{", depth + 1)
    block("st_qacc0", 0, depth + 2)
    block("st_qacc1", 1, depth + 2)
    em.emit("}", depth + 1)
    em.emit(f"if ({o} < {stop}) {{", depth + 1)
    block("st_qacc0", 0, depth + 2)
    em.emit("}", depth + 1)
    em.emit(f"st_qlanes(&{cname(qb.dest)}[{strip_parens(em.expr(qb.dest_at))}], st_qacc0, st_qacc1);",
            depth + 1)
    em.emit("}", depth)
    em.emit("#else", 0)
    as_written()
    em.emit("#endif", 0)
