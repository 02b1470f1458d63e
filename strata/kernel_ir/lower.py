"""Tile IR -> Kernel IR: materialise the schedule as thread/block indices, loops, shuffles,
shared memory and barriers.

Rows: `row` comes from blockIdx (and the thread's group when rows are packed into a block),
`t` is the thread's position in its group; a StridedLoop is `for (a = t; a < n; a += group)`;
a Combine is a butterfly of warp shuffles, then, for groups wider than a warp, one partial per
warp through shared memory and a second butterfly. Elementwise: one thread per VEC elements,
with a predicated tail when the domain does not fill the last block.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from math import prod

from .. import dtypes, scalar_ops
from ..expr import (Cast, Const, Expr, Op, Var, call, coefficient, floordiv, free_vars, mod,
                    rename, simplify, substitute, add, mul)
from ..loop.ir import Accum, Let as LLet, Load as LLoad, Loop, Store as LStore
from ..tile.ir import Combine, Scratch, Stage, StridedLoop, TileKernel, TileProgram, flat_index
from .ir import (WARP, Assign, BlockIdx, Buffer, For, If, Kernel, KernelProgram, Let, Load, LoadVec,
                 Param, ShflXor, Smem, Store, StoreVec, Sync, ThreadIdx)
from .twins import tile_key, twin


def reduce_identity(op: str, dtype: str) -> Const:
    return Const(scalar_ops.reduce_identity(op, dtype), dtype)


class Lowerer:
    def __init__(self, tk: TileKernel):
        self.tk = tk
        self.smem: set[str] = {s.name for s in tk.body if isinstance(s, (Stage, Scratch))}
        big = any(b.shape and prod(b.shape) >= 2 ** 31 for b in tk.buffers)
        self.idx = "i64" if big else "i32"
        self.has_warp_ids = False
        self.takes = 0
        # the kernel's own index names, renamed if a buffer already uses one
        taken = {b.name for b in tk.buffers}
        self.v = {n: n if n not in taken else f"{n}_idx" for n in ("t", "row", "lane", "warp", "gid")}

    def flat(self, buf: str, index) -> Expr:
        if buf in self.smem:
            return index[0]
        return flat_index(index, self.tk.shape_of(buf))

    # -------------------------------------------------------------- statements
    def stmts(self, body) -> list:
        out: list = []
        for s in body:
            out.extend(self.stmt(s))
        return out

    def stmt(self, s) -> list:
        if isinstance(s, LLoad):
            load = Load(s.buf, self.flat(s.buf, s.index), s.dtype)
            if s.pred is None:
                return [Let(s.var, s.dtype, load)]
            return [Let(s.var, s.dtype, Const(0, s.dtype)), If(s.pred, (Assign(s.var, load),))]
        if isinstance(s, LLet):
            return [Let(s.var, dtypes.compute_dtype(s.value.dtype), s.value)]
        if isinstance(s, LStore):
            return [Store(s.buf, self.flat(s.buf, s.index), s.value)]
        if isinstance(s, Accum):
            return self.accumulate(s.acc, s.op, s.value, s.index)
        if isinstance(s, (Loop, StridedLoop)):
            init = []
            for a in s.accs:
                init.append(Let(a.acc, a.dtype, reduce_identity(a.op, a.dtype)))
                if a.op in ("argmax", "argmin"):
                    init.append(Let(a.acc + "_i", "i64", Const(0, "i64")))
            start = Var(self.v["t"], self.idx) if isinstance(s, StridedLoop) else Const(0)
            step = s.step if isinstance(s, StridedLoop) else 1
            vec = getattr(s, "vec", 1)
            if vec > 1:
                body = _vector_body(self, s.body, s.var, vec)
                return init + [For(s.var, mul(start, vec), Const(s.extent), step * vec, tuple(body),
                                   unroll=s.unroll, dtype=self.idx)]
            return init + [For(s.var, start, Const(s.extent), step, tuple(self.stmts(s.body)),
                               unroll=s.unroll, dtype=self.idx)]
        if isinstance(s, Combine):
            return self.combine(s)
        if isinstance(s, Scratch):
            return [Smem(s.name, s.dtype, s.size)]
        if isinstance(s, Stage):
            f = Var(f"{s.name}_f", self.idx)
            cdt = dtypes.compute_dtype(s.dtype)
            if s.vec > 1:
                parts = tuple(f"{f.name}{j}" for j in range(s.vec))
                fill = (LoadVec(parts, s.buf, add(s.base, f), cdt),
                        StoreVec(s.name, f, tuple(Var(p, cdt) for p in parts)))
            else:
                fill = (Store(s.name, f, Load(s.buf, add(s.base, f), cdt)),)
            start = mul(Var(self.v["t"], self.idx), s.vec)
            return [Smem(s.name, s.dtype, s.size),
                    For(f.name, start, Const(s.size), self.tk.group * s.vec, fill, dtype=self.idx),
                    Sync()]
        raise TypeError(f"cannot lower {s!r}")

    def accumulate(self, acc: str, op: str, value: Expr, index: Expr | None,
                   other_index: Expr | None = None) -> list:
        if op in ("argmax", "argmin"):
            a, ai = Var(acc, value.dtype), Var(acc + "_i", "i64")
            idx = index if other_index is None else other_index
            self.takes += 1
            return _arg_update(f"{acc}_take{self.takes}", acc, a, ai, value,
                               Cast(idx, "i64") if idx.dtype != "i64" else idx,
                               op, strict_index=other_index is not None)
        if op == "sum" and isinstance(value, Op) and value.op == "multiply" \
                and dtypes.is_float(value.dtype):          # a product written in place: one fma
            return [Assign(acc, call("fma", *value.args, Var(acc, value.dtype)))]
        combine = scalar_ops.REDUCE_COMBINE[op]
        return [Assign(acc, call(combine, Var(acc, value.dtype), value))]

    def combine(self, c: Combine) -> list:
        out: list = []
        nwarps = c.threads // WARP
        for a in c.accs:
            arg = a.op in ("argmax", "argmin")
            out += self.butterfly(a, 16)
            if nwarps > 1:
                self.has_warp_ids = True
                lane, warp = Var(self.v["lane"], self.idx), Var(self.v["warp"], self.idx)
                names = [(a.acc, a.dtype)] + ([(a.acc + "_i", "i64")] if arg else [])
                for name, dt in names:
                    out.append(Smem(f"{name}_smem", dt, nwarps))
                out.append(If(call("eq", lane, Const(0)),
                              tuple(Store(f"{n}_smem", warp, Var(n, dt)) for n, dt in names)))
                out.append(Sync())
                resets = [Assign(a.acc, reduce_identity(a.op, a.dtype))] + \
                         ([Assign(a.acc + "_i", Const(0, "i64"))] if arg else [])
                loads = tuple(Assign(n, Load(f"{n}_smem", lane, dt)) for n, dt in names)
                out += resets
                out.append(If(call("lt", lane, Const(nwarps)), loads))
                out += self.butterfly(a, 16)
        return out

    def butterfly(self, a, top: int) -> list:
        out = []
        arg = a.op in ("argmax", "argmin")
        m = top
        while m >= 1:
            other = ShflXor(Var(a.acc, a.dtype), m, a.dtype)
            if arg:
                oi = ShflXor(Var(a.acc + "_i", "i64"), m, "i64")
                self.takes += 1      # unique names: a wide group runs a second butterfly
                tag = f"{a.acc}_s{m}_{self.takes}"
                out += [Let(tag, a.dtype, other), Let(tag + "_i", "i64", oi)]
                out += self.accumulate(a.acc, a.op, Var(tag, a.dtype), None, Var(tag + "_i", "i64"))
            else:
                out.append(Assign(a.acc, call(scalar_ops.REDUCE_COMBINE[a.op], Var(a.acc, a.dtype), other)))
            m //= 2
        return out


def _arg_update(t: str, acc: str, a: Var, ai: Var, v: Expr, vi: Expr, op: str, strict_index: bool) -> list:
    """Keep (value, index) of the max (min); NaN counts as the max like torch; ties keep the
    smaller index (a thread's own sequence already visits indices in increasing order)."""
    better = "gt" if op == "argmax" else "lt"
    floating = dtypes.is_float(a.dtype)
    take = call(better, v, a)
    if strict_index:
        take = call("logical_or", take, call("logical_and", call("eq", v, a), call("lt", vi, ai)))
    if floating:
        vn, an = call("isnan", v), call("isnan", a)
        take = call("logical_or", call("logical_and", vn, call("logical_not", an)),
                    call("logical_and", call("logical_not", an), take))
        if strict_index:
            take = call("logical_or", take, call("logical_and", call("logical_and", vn, an), call("lt", vi, ai)))
    return [Let(t, "bool", take), Assign(acc, call("where", Var(t, "bool"), v, a)),
            Assign(acc + "_i", call("where", Var(t, "bool"), vi, ai))]


def bind_domain(flat: Expr, domain, bounds) -> list:
    """Let statements binding each domain variable from a flat row/element index."""
    out, stride = [], prod([e for _, e in domain])
    for var, extent in domain:
        stride //= extent
        out.append((var, simplify(mod(floordiv(flat, stride, bounds), extent, bounds), bounds)))
    return out


def lower_kernel(tk: TileKernel) -> Kernel:
    if tk.mode == "custom":          # st.custom_op: the author's Kernel IR, on these buffers
        op = tk.body[0]
        return op.kernel.kernel_ir(tk.name, op.args, op.out,
                                   {b.name: (b.dtype, tuple(b.shape)) for b in tk.buffers})
    if tk.mode == "attention":
        from .lower_attention import lower_attention_kernel  # flash attention (tile/attention.py)
        return lower_attention_kernel(tk)
    if tk.mode == "mma":
        from .lower_mma import lower_mma_kernel            # tensor cores (sm_80+)
        return lower_mma_kernel(tk)
    if tk.mode == "wgmma":
        from .lower_wgmma import lower_wgmma_kernel        # TMA + wgmma (sm_90a)
        return lower_wgmma_kernel(tk)
    if tk.mode == "matmul":
        from .lower_matmul import lower_matmul_kernel      # it builds on Lowerer below
        return lower_matmul_kernel(tk)
    low = Lowerer(tk)
    idx = low.idx
    v = low.v
    body: list = []
    t = Var(v["t"], idx)
    if tk.mode == "rows":
        per_block = tk.block // tk.group
        if per_block == 1:
            row: Expr = BlockIdx()
            body.append(Let(v["t"], idx, ThreadIdx()))
        else:
            body.append(Let(v["t"], idx, mod(ThreadIdx(), tk.group)))
            row = add(mul(BlockIdx(), per_block), floordiv(ThreadIdx(), tk.group))
        body.append(Let(v["row"], idx, row))
        bounds = {v["row"]: tk.rows}
        for var, e in bind_domain(Var(v["row"], idx), tk.domain, bounds):
            body.append(Let(var, idx, e))
        inner = low.stmts(tk.prelude)
        for s in tk.body:
            # a row-level result is stored once per row, by the group's first thread
            if isinstance(s, LStore) and tk.group > 1:
                inner.append(If(call("eq", t, Const(0)), tuple(low.stmt(s))))
            else:
                inner.extend(low.stmt(s))
        if low.has_warp_ids:
            body += [Let(v["lane"], idx, mod(ThreadIdx(), WARP)), Let(v["warp"], idx, floordiv(ThreadIdx(), WARP))]
        if per_block > 1 and tk.rows % per_block:
            body.append(If(call("lt", Var(v["row"], idx), Const(tk.rows)), tuple(inner)))
        else:
            body += inner
    else:
        body.append(Let(v["gid"], idx, add(mul(BlockIdx(), tk.block), ThreadIdx())))
        n = tk.rows // tk.vec
        first = mul(Var(v["gid"], idx), tk.vec)
        bounds = {v["gid"]: n}
        binds = [Let(v, idx, e) for v, e in bind_domain(first, tk.domain, bounds)]
        inner = binds + low.stmts(tk.prelude) + (low.stmts(tk.body) if tk.vec == 1 else _vector_body(low, tk.body, tk.domain[-1][0], tk.vec))
        if n % tk.block:
            body.append(If(call("lt", Var(v["gid"], idx), Const(n)), tuple(inner)))
        else:
            body += inner
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes)
                   for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)


def _vector_body(low: Lowerer, body, inner: str, vec: int) -> list:
    """Each thread computes VEC consecutive points of `inner`: unit-stride loads and stores become
    one vector access, values that do not move along `inner` are computed once, and an Accum
    takes the VEC values in order (so argmax still sees increasing indices)."""
    varying = {inner}
    out: list = []

    def at(e: Expr, j: int) -> Expr:
        names = {v: f"{v}_{j}" for v in varying if v != inner}
        return substitute(rename(e, names), {inner: add(Var(inner, low.idx), j)})

    for s in body:
        if isinstance(s, LLoad):
            flat = low.flat(s.buf, s.index)
            if coefficient(flat, inner) == 0:
                out.extend(low.stmt(s))
            else:
                varying.add(s.var)
                out.append(LoadVec(tuple(f"{s.var}_{j}" for j in range(vec)), s.buf, flat, s.dtype))
        elif isinstance(s, LLet):
            if free_vars(s.value) & varying:
                varying.add(s.var)
                for j in range(vec):
                    out.append(Let(f"{s.var}_{j}", dtypes.compute_dtype(s.value.dtype), at(s.value, j)))
            else:
                out.extend(low.stmt(s))
        elif isinstance(s, LStore):
            flat = low.flat(s.buf, s.index)
            out.append(StoreVec(s.buf, flat, tuple(at(s.value, j) for j in range(vec))))
        elif isinstance(s, Accum):
            for j in range(vec):
                index = None if s.index is None else at(s.index, j)
                out.extend(low.accumulate(s.acc, s.op, at(s.value, j), index))
        else:
            raise TypeError(f"vectorized body cannot hold {s!r}")
    return out


def lower(tp: TileProgram) -> KernelProgram:
    lp = tp.loop_program
    buffers = [Buffer(b.name, b.dtype, b.shape, b.kind) for b in lp.buffers]
    known = {b.name for b in buffers}
    for tk in tp.kernels:           # temps a tile pass introduced (chunk_reduce's partials)
        for b in tk.buffers:
            if b.name not in known:
                known.add(b.name)
                buffers.append(Buffer(b.name, b.dtype, b.shape, b.kind))
    kernels, firsts, twins = [], {}, {}
    for tk in tp.kernels:           # a twin (kernel_ir/twins.py) is the first one renamed
        key = tile_key(tk)
        if key in firsts and firsts[key][0].name != tk.name:
            first, k = firsts[key]
            kernels.append(twin(k, first, tk))
            twins[tk.name] = first.name
            continue
        kernels.append(replace(lower_kernel(tk), threads=dict(tk.knobs).get("THREADS", 0), knobs=tk.knobs))
        firsts.setdefault(key, (tk, kernels[-1]))
    return KernelProgram(buffers, kernels, list(lp.outputs), twins, run_once(tp.kernels, buffers))


def run_once(kernels, buffers) -> tuple[str, ...]:
    """The PACK=once kernels (tile/passes/cpu_pack_weights.py) that read only weights and write
    only temps no other kernel writes: their results are constants."""
    kind = {b.name: b.kind for b in buffers}
    writers = Counter(w for tk in kernels for w in tk.writes)
    return tuple(tk.name for tk in kernels if dict(tk.knobs).get("PACK") == "once"
                 and all(kind[r] == "weight" for r in tk.reads)
                 and all(kind[w] == "temp" and writers[w] == 1 for w in tk.writes))
