"""The Lowerer every Tile IR -> Kernel IR lowering builds on: loads, lets, stores, loops and
accumulations of a kernel body as Kernel IR statements, a Combine as warp shuffles, VEC points per
thread (`_vector_body`), and `bind_domain`.

Why a module of its own: lower.py chooses the lowering of each kernel (rows and elementwise
below it, lower_matmul.py, lower_mma.py, lower_wgmma.py, lower_attention*.py), and those build on
this; none of them imports lower.py.
"""
from __future__ import annotations

from math import prod

from ..core import dtypes, scalar_ops
from ..core.expr import (
    Cast, Const, Expr, Op, Var, call, coefficient, floordiv, mod, rename, simplify, substitute, add, mul)
from ..loop.ir import Accum, Let as LLet, Load as LLoad, Loop, Store as LStore
from ..tile.ir import Combine, Scratch, Stage, StridedLoop, TileKernel, flat_index
from .ir import (WARP, Assign, For, If, Let, Load, LoadVec, ShflXor, Smem, Store, StoreVec, Sync,
                 ThreadIdx)
from .lower_gather import gather_body, gathers, lane_stmts

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
            start = Const(0) if not isinstance(s, StridedLoop) else \
                ThreadIdx() if s.block_wide else Var(self.v["t"], self.idx)
            step = s.step if isinstance(s, StridedLoop) else 1
            vec = getattr(s, "vec", 1)
            if vec > 1:
                if gathers(self, s.body, s.var, vec):          # a byte GEMV's loads
                    body = gather_body(self, s.body, s.var, vec, s.extent)
                else:
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
            out += self.butterfly(a, min(16, c.threads // 2))     # a group within a warp: its lanes
            if nwarps > 1 and c.block_wide:     # a prelude's: the thread's own index, any lowering
                lane, warp = mod(ThreadIdx(), WARP), floordiv(ThreadIdx(), WARP)
            elif nwarps > 1:
                self.has_warp_ids = True
                lane, warp = Var(self.v["lane"], self.idx), Var(self.v["warp"], self.idx)
            if nwarps > 1:
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
        elif isinstance(s, (LLet, Accum)):
            out.extend(lane_stmts(low, s, vec, at, varying))
        elif isinstance(s, LStore):
            flat = low.flat(s.buf, s.index)
            out.append(StoreVec(s.buf, flat, tuple(at(s.value, j) for j in range(vec))))
        else:
            raise TypeError(f"vectorized body cannot hold {s!r}")
    return out
