"""A kernel of many threads per block -> the same kernel with one thread per block, for the CPU.

Why: the C target runs one thread per block (codegen/c.py) while a kernel written by hand
(@strata.kernel) is SIMT: `block` threads that meet at barriers and exchange values through
shared memory and warp shuffles. The classic CPU answer (as OpenCL CPU drivers do it) is used:
  - each stretch of statements between barriers becomes a loop over the block's threads, so a
    barrier is where one thread loop ends and the next begins; a loop, `if` or `while` that holds
    a barrier is uniform (every thread takes it alike, which the simulator checks) and stays
    outside, around the thread loops of its body;
  - a variable one thread loop sets and another reads (or a uniform loop bound or condition
    reads) lives on in a per-thread array `v__t[block]`, read at thread 0 where uniform;
  - a shuffle `x = shfl(v, ...)` becomes: every thread stores v, barrier, every thread reads its
    source lane's slot, barrier.
Kernels with vector accesses, tensor cores or asynchronous copies are left to the C target's
refusal (they come from GPU schedules, which the CPU schedules replace).
"""
from __future__ import annotations

from dataclasses import replace

from ..core.expr import Cast, Const, Expr, Op, Var, children, free_vars, map_expr
from .ir import (Assign, For, If, Kernel, Let, Load, ShflIdx, ShflXor, Smem, Stmt, Store, Sync,
                 ThreadIdx, walk)

T = "st_thread"              # the thread loop's variable


def to_thread_loops(k: Kernel) -> Kernel:
    """`k` with block == 1 computing what its `block` threads compute (k itself if block == 1)."""
    if k.block == 1:
        return k
    exchange: dict[str, str] = {}                  # shuffle slots: dtype -> Smem name
    body = _shuffles(_inline_indices(k), exchange)
    decls = [s for s in walk(body) if isinstance(s, Smem)]
    decls += [Smem(name, dtype, k.block) for dtype, name in exchange.items()]
    split = _split(tuple(s for s in body if not isinstance(s, Smem)), k.block,
                   {name for name, _ in k.scalars})
    types = {s.var: s.dtype for s in walk(split) if isinstance(s, Let)}
    promoted = _promoted(split) & set(types)
    decls += [Smem(f"{v}__t", types[v], k.block) for v in sorted(promoted)]
    body = tuple(decls) + _rewrite(split, {v: types[v] for v in promoted}, False)
    return replace(k, block=1, body=body)


def exchange_shuffles(k: Kernel) -> Kernel:
    """`k` with its warp shuffles done through shared memory between barriers (for targets
    without 32-lane shuffles, such as OpenCL): the same block, the same results."""
    exchange: dict[str, str] = {}
    body = _shuffles(k.body, exchange)
    if not exchange:
        return k
    return replace(k, body=tuple(Smem(name, dtype, k.block) for dtype, name in exchange.items())
                   + body)


# ---------------------------------------------------------------- index variables

def _inline_indices(k: Kernel) -> tuple:
    """The kernel's body with top-level `let v = <ids, scalars and constants>` (never assigned)
    substituted into their uses: `row = program_id(0)` need not live in a per-thread array."""
    assigned = {s.var for s in walk(k.body) if isinstance(s, Assign)}
    known = {name for name, _ in k.scalars}
    inline: dict[str, Expr] = {}
    for s in k.body:
        if (isinstance(s, Let) and s.var not in assigned and _pure(s.value)
                and free_vars(s.value) <= known | set(inline)):
            inline[s.var] = _subst(s.value, inline)
    if not inline:
        return k.body
    return _rewrite_body(tuple(s for s in k.body if not (isinstance(s, Let) and s.var in inline)),
                         lambda e: _subst(e, inline))


def _pure(e: Expr) -> bool:
    return not isinstance(e, (Load, ShflXor, ShflIdx)) and all(_pure(c) for c in children(e))


def _subst(e: Expr, inline: dict) -> Expr:
    return map_expr(e, lambda x: inline.get(x.name, x) if isinstance(x, Var) else None)


def _rewrite_body(body, ex) -> tuple:
    return tuple(s.map_exprs(ex).map_bodies(lambda b: _rewrite_body(b, ex)) for s in body)


# ---------------------------------------------------------------- shuffles

def _lane_xor(mask: int) -> Expr:
    """thread ^ mask with arithmetic only: each set bit of mask flips that bit of the thread."""
    e: Expr = ThreadIdx()
    for bit in range(mask.bit_length()):
        m = 1 << bit
        if mask & m:
            flipped = Op("eq", (Op("mod", (Op("floordiv", (ThreadIdx(), Const(m, "i32")), "i32"),
                                           Const(2, "i32")), "i32"), Const(1, "i32")), "bool")
            e = Op("add", (e, Op("where", (flipped, Const(-m, "i32"), Const(m, "i32")), "i32")),
                   "i32")
    return e


def _shuffles(body, exchange: dict) -> tuple:
    """Each `Let(x, shfl(v, ...))` as a store, barrier, load, barrier through a shared slot."""
    out: list[Stmt] = []
    for s in body:
        v = getattr(s, "value", None)
        if isinstance(s, Let) and isinstance(v, (ShflXor, ShflIdx)):
            slot = exchange.setdefault(s.dtype, f"st_shfl_{s.dtype}")
            src = (_lane_xor(v.mask) if isinstance(v, ShflXor) else
                   Op("add", (Op("subtract", (ThreadIdx(), Op("mod", (ThreadIdx(), Const(32, "i32")),
                                                                "i32")), "i32"),
                              Op("mod", (Cast(v.lane, "i32"), Const(32, "i32")), "i32")), "i32"))
            out += [Store(slot, ThreadIdx(), v.value), Sync(), Let(s.var, s.dtype,
                                                                 Load(slot, src, s.dtype)), Sync()]
        else:
            out.append(s.map_bodies(lambda b: _shuffles(b, exchange)))
    return tuple(out)


# ---------------------------------------------------------------- splitting at barriers

def _has_sync(s) -> bool:
    return isinstance(s, Sync) or any(isinstance(x, Sync) for x in walk([s]))


def _split(body, block: int, uniform: set[str]) -> tuple:
    """Thread loops between the barriers of `body` (a uniform stretch of the kernel)."""
    out: list[Stmt] = []
    run: list[Stmt] = []

    def flush():
        if run:
            out.append(For(T, Const(0, "i32"), Const(block, "i32"), 1, tuple(run)))
            run.clear()
    for s in body:
        strided = _strided(s, block, uniform)
        if strided is not None:         # for c = t; c < n; c += block: threads innermost
            flush()
            out.append(strided)
            continue
        if not _has_sync(s):
            run.append(s)
            continue
        flush()
        if s.bodies():                  # uniform control flow around thread loops (not a Sync)
            inner = uniform | {s.var} if isinstance(s, For) else uniform
            out.append(s.map_bodies(lambda b: _split(b, block, inner)))
    flush()
    return tuple(out)


def _strided(s, block: int, uniform: set[str]) -> For | None:
    """`for c = thread + u; c < n; c += block` (u and n the same for every thread) as
    `for c0 = u; c0 < n; c0 += block: for thread: c = c0 + thread; if c < n: body`: each thread
    still takes its iterations in order, and between barriers threads may interleave, so the
    threads become the inner, contiguous (vectorisable) loop."""
    if not (isinstance(s, For) and s.step == block and not _has_sync(s)):
        return None
    start = s.start
    if isinstance(start, ThreadIdx):
        offset = None
    elif isinstance(start, Op) and start.op == "add" and isinstance(start.args[0], ThreadIdx):
        offset = start.args[1]
    else:
        return None
    if any(_thread_dependent(e, uniform) for e in (s.stop,) + ((offset,) if offset else ())):
        return None
    c0 = f"{s.var}__0"
    first = Const(0, s.dtype) if offset is None else offset
    me = Op("add", (Var(c0, s.dtype), Cast(ThreadIdx(), s.dtype)), s.dtype)
    inner = (Let(s.var, s.dtype, me), If(Op("lt", (Var(s.var, s.dtype), s.stop), "bool"), s.body))
    return For(c0, first, s.stop, block, (For(T, Const(0, "i32"), Const(block, "i32"), 1, inner),),
               dtype=s.dtype)


def _thread_dependent(e: Expr, uniform: set[str]) -> bool:
    """Whether e may differ between threads (a thread id, a load, a variable not known to be
    uniform: only the kernel's scalar arguments and the enclosing uniform loops' are)."""
    if isinstance(e, (ThreadIdx, Load, ShflXor, ShflIdx)):
        return True
    if isinstance(e, Var):
        return e.name not in uniform
    return any(_thread_dependent(c, uniform) for c in children(e))


def _is_thread_loop(s) -> bool:
    return isinstance(s, For) and s.var == T


def _promoted(body) -> set[str]:
    """Variables set in one thread loop and used outside it."""
    where: dict[str, set] = {}

    def note(names, place):
        for n in names:
            where.setdefault(n, set()).add(place)

    def visit(stmts, place):
        for s in stmts:
            if _is_thread_loop(s):
                inner = id(s)
                for x in walk(s.body):
                    note(_names(x), inner)
                continue
            note(_names(s), place)
            for sub in s.bodies():
                visit(sub, place)
    visit(body, "uniform")
    return {n for n, places in where.items() if len(places) > 1}


def _names(s) -> set[str]:
    out = {s.var} if isinstance(s, (Let, Assign)) else set()
    for e in s.exprs():
        out |= free_vars(e)
    return out


# ---------------------------------------------------------------- rewriting

def _rewrite(body, promoted: dict[str, str], in_thread: bool) -> tuple:
    """Thread ids as the loop variable, promoted variables as their per-thread arrays."""
    me = Var(T, "i32") if in_thread else Const(0, "i32")

    def one(x: Expr) -> Expr | None:
        if isinstance(x, ThreadIdx):
            return me
        if isinstance(x, Var) and x.name in promoted:
            return Load(f"{x.name}__t", me, x.dtype)
        return None

    def ex(e: Expr) -> Expr:
        return map_expr(e, one)

    out: list[Stmt] = []
    for s in body:
        if _is_thread_loop(s):
            out.append(replace(s, body=_rewrite(s.body, promoted, True)))
        elif isinstance(s, (Let, Assign)) and s.var in promoted:
            out.append(Store(f"{s.var}__t", me, ex(s.value)))
        else:
            out.append(s.map_exprs(ex).map_bodies(lambda b: _rewrite(b, promoted, in_thread)))
    return tuple(out)
