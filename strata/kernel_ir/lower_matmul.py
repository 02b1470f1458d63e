"""Tile IR -> Kernel IR for a contraction (mode "matmul"): the block tile becomes block and
thread indices, register points become one scalar per point, staged tiles become a cooperative
fill of shared memory followed by a barrier.

blockIdx.x enumerates (batch axes..., M tile, N tile), the N tile fastest (on a CPU with a short
last M piece, 3/4 of the others or less, the M tile), giving the tile's origin (m0, n0);
threadIdx.x = tm * threads_n + tn. In a register `Points` region a value that depends on the M
axis only is one scalar per row of points, `<v>_m<i>`; on N only, `<v>_n<j>`; on both,
`<v>_<i>_<j>`; on neither, one `<v>`. So a K step loads THREAD_M + THREAD_N operand
values and does THREAD_M x THREAD_N multiply-adds. A `Guard` inside such a region (the edge of
the matrix) is tested per point. Points run in turn are loops over (i, j).

A serial tile (a CPU's, block = 1) has no thread indices: its `MicroTiles` become a loop over the
block's register tiles along M, m0 rebound to each one's first row (skipped past the end of M).
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from ..core import dtypes
from ..core.expr import Const, Var, add, call, floordiv, mod, mul, rename, substitute
from ..loop.ir import Accum, Let as LLet, Load as LLoad, Loop
from ..tile.contraction import uses
from ..tile.ir import (Guard, MicroTiles, Points, Registers, StageTile, Sync as TSync,
                       TileKernel, rename_stmt, subst_body, walk)
from .ir import BlockIdx, For, If, Kernel, Let, Load, Param, Smem, Store, Sync, ThreadIdx
from .lowerer import bind_domain, reduce_identity, Lowerer


class _MatmulLowerer(Lowerer):
    def __init__(self, tk: TileKernel):
        super().__init__(tk)
        self.mt = tk.matmul
        self.tiles = {s.name: s for s in walk(tk.body) if isinstance(s, StageTile)}
        self.kind: dict[str, str] = {}          # register value -> the axes it depends on
        taken = {b.name for b in tk.buffers}
        self.v.update({n: n if n not in taken else f"{n}_idx" for n in ("m0", "n0", "tm", "tn", "i", "j",
                                                                       "mi", "mr0", "kc")})
        self.special: dict = {}                 # Tile IR's m0, n0, tm, tn -> kernel expressions
        self.binds: dict = {}                   # (i, j) -> special + the point's M and N

    def flat(self, buf: str, index) -> object:
        st = self.tiles.get(buf)
        if st is not None:
            return add(mul(index[0], st.stride), index[1])
        return super().flat(buf, index)

    # -------------------------------------------------------------- points
    def coords(self, i, j) -> dict:
        mt, out = self.mt, {}
        for axis, p in ((mt.m, i), (mt.n, j)):
            if axis:
                out[axis] = substitute(mt.coord(axis, p), self.special)
        return out

    def depends_on(self, read: set[str]) -> str:
        """"m", "n", "mn" or "": the point axes that values computed from `read` vary along."""
        kinds = "".join(self.kind.get(v, "") for v in read)
        return "m" * (self.mt.m in read or "m" in kinds) + "n" * (self.mt.n in read or "n" in kinds)

    def suffix(self, kind: str, i: int, j: int) -> str:
        m = "m" in kind and self.mt.thread_m > 1
        n = "n" in kind and self.mt.thread_n > 1
        return f"_{i}_{j}" if m and n else f"_m{i}" if m else f"_n{j}" if n else ""

    def names(self, i: int, j: int) -> dict:
        return {v: v + self.suffix(kind, i, j) for v, kind in self.kind.items()}

    def bind(self, i: int, j: int) -> dict:
        if (i, j) not in self.binds:
            self.binds[i, j] = {**self.special, **self.coords(Const(i), Const(j))}
        return self.binds[i, j]

    def at(self, s, i: int, j: int, names: dict) -> tuple:
        """Statement s at point (i, j): registers renamed, M and N bound."""
        return subst_body((rename_stmt(s, names),), self.bind(i, j))

    def register_points(self, p: Points) -> list:
        mt, out = self.mt, []
        for s in p.body:
            if isinstance(s, Guard):
                out += self.guarded(s)
                continue
            kind = self.kind[s.acc] if isinstance(s, Accum) else self.depends_on(uses(s))
            if isinstance(s, (LLet, LLoad)):
                self.kind[s.var] = kind
            for i in range(mt.thread_m if "m" in kind else 1):
                for j in range(mt.thread_n if "n" in kind else 1):
                    for x in self.at(s, i, j, self.names(i, j)):
                        out += self.stmt(x)
        return out

    def guarded(self, g: Guard) -> list:
        """An edge guard inside register points: tested, and its body run, point by point."""
        mt, out = self.mt, []
        local = {s.var for s in walk(g.body) if isinstance(s, (LLet, LLoad))}
        for i in range(mt.thread_m):
            for j in range(mt.thread_n):
                names = {**self.names(i, j), **{v: v + self.suffix("mn", i, j) for v in local}}
                cond = substitute(rename(g.cond, names), self.bind(i, j))
                body = [x for s in g.body for x in self.at(s, i, j, names)]
                out.append(If(cond, tuple(self.stmts(body))))
        return out

    def points_in_turn(self, p: Points) -> list:
        mt = self.mt
        i = Var(self.v["i"], self.idx) if mt.thread_m > 1 else Const(0)
        j = Var(self.v["j"], self.idx) if mt.thread_n > 1 else Const(0)
        body = self.stmts(subst_body(p.body, {**self.special, **self.coords(i, j)}))
        for var, n in ((j, mt.thread_n), (i, mt.thread_m)):
            if n > 1:
                body = [For(var.name, Const(0), Const(n), 1, tuple(body), dtype=self.idx)]
        return body

    # -------------------------------------------------------------- statements
    def stmts(self, body) -> list:
        out: list = []
        for pos, s in enumerate(body):
            out += self.stmt(s)
            last_fill = pos + 1 == len(body) or not isinstance(body[pos + 1], StageTile)
            if isinstance(s, StageTile) and last_fill:
                out.append(Sync())          # one barrier after consecutive fills
        return out

    def stmt(self, s) -> list:
        if isinstance(s, Points):
            return self.register_points(s) if s.registers else self.points_in_turn(s)
        if isinstance(s, Registers):
            out = []
            for a in s.accs:
                self.kind[a.acc] = "mn"
                out += [Let(a.acc + self.suffix("mn", i, j), a.dtype, reduce_identity(a.op, a.dtype))
                        for i in range(self.mt.thread_m) for j in range(self.mt.thread_n)]
            return out
        if isinstance(s, Guard):
            return [If(substitute(s.cond, self.special), tuple(self.stmts(s.body)))]
        if isinstance(s, StageTile):
            return self.stage(s)
        if isinstance(s, TSync):
            return [Sync()]
        if isinstance(s, MicroTiles):
            return self.micro_tiles(s)
        return super().stmt(s)

    def micro_tiles(self, s: MicroTiles) -> list:
        """The block's register tiles along M in turn, m0 bound to each one's first row."""
        mt, idx, outer = self.mt, self.idx, self.special
        mi, m0 = Var(self.v["mi"], idx), Var(self.v["mr0"], idx)
        self.special, self.binds = {**outer, "m0": m0}, {}
        if s.k_chunk:
            return self.chunked_tiles(s, mi, m0, outer)
        body, tail = self.register_tile(s.body), self.register_tile(s.tail)
        self.special, self.binds = outer, {}
        rows = Const(self.tk.extent(mt.m))
        within = call("lt", m0, rows)
        if tail:
            full = call("le", add(m0, mt.thread_m), rows)
            return self.tiles_loop(s, mi, m0, outer, [If(full, tuple(body), (If(within, tuple(tail)),))])
        return self.tiles_loop(s, mi, m0, outer, body, guard=True)

    def tiles_loop(self, s: MicroTiles, mi, m0, outer, body, guard=False) -> list:
        """The loop over the block's register tiles; with `guard`, a tile starting past the end
        of M (the block overhangs it) is skipped."""
        rows = self.tk.extent(self.mt.m)
        if guard and rows % self.mt.tile_m:
            body = [If(call("lt", m0, Const(rows)), tuple(body))]
        return [For(mi.name, Const(0), Const(s.tiles), 1,
                    (Let(m0.name, self.idx, add(outer["m0"], mul(mi, self.mt.thread_m))), *body),
                    dtype=self.idx)]

    def chunked_tiles(self, s: MicroTiles, mi, m0, outer) -> list:
        """MicroTiles with K in chunks: per chunk, every register tile loads its sums from the
        block's scratch `<acc>_part` (zeroed first), runs its K loops over the chunk and stores
        them back; then every tile's epilogue reads them."""
        mt, idx = self.mt, self.idx
        n, kc = mt.thread_n, Var(self.v["kc"], idx)
        accs = [a for r in s.body if isinstance(r, Registers) for a in r.accs]
        extent = next(x.extent for x in s.body if isinstance(x, Loop))
        size = mt.tile_m * n
        out = [Smem(f"{a.acc}_part", a.dtype, size) for a in accs]
        f = Var(self.v["i"], idx)
        out += [For(f.name, Const(0), Const(size), 1, tuple(Store(f"{a.acc}_part", f, reduce_identity(a.op, a.dtype))
                                                          for a in accs), dtype=idx)]
        def at(i, j):                   # point (i, j) of register tile mi in the block's scratch
            return add(mul(add(mul(mi, mt.thread_m), i), n), j)
        start, stop = mul(kc, s.k_chunk), call("minimum", add(mul(kc, s.k_chunk), s.k_chunk), Const(extent))
        tile = self.k_loops(s.body[:-1], lambda acc, i, j: (f"{acc}_part", at(i, j)), (start, stop))
        i, j = (Var(self.v[v], idx) if e > 1 else Const(0) for v, e in (("i", mt.thread_m), ("j", n)))
        loads = [Let(a.acc, a.dtype, Load(f"{a.acc}_part", at(i, j), a.dtype)) for a in accs]
        epilogue = _prepend(self.points_in_turn(s.body[-1]), loads)
        self.special, self.binds = outer, {}
        chunks = -(-extent // s.k_chunk)
        out.append(For(kc.name, Const(0), Const(chunks), 1,
                       tuple(self.tiles_loop(s, mi, m0, outer, tile, guard=True)), dtype=idx))
        return out + self.tiles_loop(s, mi, m0, outer, epilogue, guard=True)

    def register_tile(self, body) -> list:
        """One register tile of a serial (CPU) block. Its accumulators are stored to a scratch
        tile after the K loop and the epilogue runs from there, point by point in a loop: gcc's
        SLP vectoriser turns the K loop's scalar FMAs into SIMD ones only from one contiguous
        store of the accumulators, which a 16-bit or computed epilogue would not give it."""
        if not body or not isinstance(body[-1], Points) or not any(isinstance(s, Registers) for s in body):
            return self.stmts(body)
        n, epilogue, loads = self.mt.thread_n, body[-1], []
        out = [Smem(f"{a.acc}_tile", a.dtype, self.mt.thread_m * n)
               for r in body if isinstance(r, Registers) for a in r.accs]
        out += self.k_loops(body[:-1], lambda acc, i, j: (f"{acc}_tile", Const(i * n + j)))
        for a in (a for r in body if isinstance(r, Registers) for a in r.accs):
            i = Var(self.v["i"], self.idx) if self.mt.thread_m > 1 else Const(0)
            j = Var(self.v["j"], self.idx) if n > 1 else Const(0)
            loads.append(Let(a.acc, a.dtype, Load(f"{a.acc}_tile", add(mul(i, n), j), a.dtype)))
        lowered = self.points_in_turn(epilogue)
        return out + _prepend(lowered, loads)

    def k_loops(self, body, place, chunk=None) -> list:
        """A register tile's K loops, each one's accumulators stored to place(acc, i, j) = (buffer,
        index) right after it (live across the next loop, they would crowd its registers). With
        `chunk` = (start, stop) the loops run over that part of K only, their accumulators loaded
        from where they were stored first."""
        out, accs = [], ()
        for s in body:
            if isinstance(s, Registers) and chunk:
                accs = s.accs
                for a in accs:
                    self.kind[a.acc] = "mn"
                    out += [Let(a.acc + self.suffix("mn", i, j), a.dtype, Load(*place(a.acc, i, j), a.dtype))
                            for i in range(self.mt.thread_m) for j in range(self.mt.thread_n)]
                continue
            accs = s.accs if isinstance(s, Registers) else accs
            low = self.stmt(s)
            if chunk and isinstance(s, Loop):
                low = [replace(x, start=chunk[0], stop=chunk[1]) if isinstance(x, For) else x for x in low]
            out += low
            if isinstance(s, Loop):
                out += [Store(*place(a.acc, i, j), Var(a.acc + self.suffix("mn", i, j), a.dtype))
                        for a in accs for i in range(self.mt.thread_m) for j in range(self.mt.thread_n)]
                accs = ()
        return out

    def stage(self, st: StageTile) -> list:
        """Smem and a loop of the whole block over the tile's elements (stmts adds the barrier)."""
        idx = self.idx
        f, kv, xv = (Var(f"{st.name}_{s}", idx) for s in ("f", "k", "x"))
        if st.fast == "k":
            k, x = mod(f, st.k_extent), floordiv(f, st.k_extent)
        else:
            k, x = floordiv(f, st.x_extent), mod(f, st.x_extent)
        bind = {**self.special, st.k_var: kv}
        fill = [Let(kv.name, idx, k)]
        if st.x_var:
            bind[st.x_var] = add(self.special[st.origin], xv)
            fill.append(Let(xv.name, idx, x))
        at = add(mul(kv, st.stride), xv if st.x_var else Const(0))
        value = st.body[-1]
        cdt = dtypes.compute_dtype(value.dtype if isinstance(value, LLoad) else value.value.dtype)
        compute = self.stmts(subst_body(st.body, bind)) + [Store(st.name, at, Var(st.value, cdt))]
        if st.bounds is None:
            fill += compute
        else:
            fill.append(If(substitute(st.bounds, bind), tuple(compute), (Store(st.name, at, Const(0, cdt)),)))
        n, block = st.k_extent * st.x_extent, self.tk.block
        smem = Smem(st.name, st.dtype, st.k_extent * st.stride)
        if st.pairs:            # (a CPU's) each (k, x) stores K rows 2k and 2k + 1 side by side
            fill = []
            for h in (0, 1):
                names = {d.var: f"{d.var}_{h}" for d in st.body if h and hasattr(d, "var")}
                body = [rename_stmt(d, names) for d in st.body]
                at = add(add(mul(kv, st.stride), mul(xv, 2)), h)
                fill += self.stmts(subst_body(body, {**bind, st.k_var: add(mul(kv, 2), h)})) + \
                    [Store(st.name, at, Var(names.get(st.value, st.value), cdt))]
            assert block == 1 and st.bounds is None, "a pairs panel is a CPU's, its edge clamped"
            if st.fast == "x":
                inner = For(xv.name, Const(0), Const(st.x_extent), 1, tuple(fill), dtype=idx)
                return [smem, For(kv.name, Const(0), Const(st.k_extent), 1, (inner,), dtype=idx)]
            chunk = 16 if st.k_extent % 16 == 0 else 1   # K contiguous: rows read 16 pairs at a
            ko, ki = Var(f"{kv.name}o", idx), Var(f"{kv.name}i", idx)     # time, written in L1
            fill = [Let(kv.name, idx, add(mul(ko, chunk), ki))] + fill
            for var, extent in ((ki, chunk), (xv, st.x_extent), (ko, st.k_extent // chunk)):
                fill = [For(var.name, Const(0), Const(extent), 1, tuple(fill), dtype=idx)]
            return [smem, *fill]
        if block == 1:          # one thread (a CPU): two loops, the contiguous axis innermost
            loops = [(kv.name, st.k_extent), (xv.name, st.x_extent)]
            if st.fast == "k":
                loops.reverse()
            fill = fill[2 if st.x_var else 1:]
            for var, extent in reversed(loops):
                if var != xv.name or st.x_var:
                    fill = [For(var, Const(0), Const(extent), 1, tuple(fill), dtype=idx)]
            return [smem] + fill
        unroll = n % block == 0 and n // block <= 8
        return [smem, For(f.name, Var(self.v["t"], idx), Const(n), block, tuple(fill), unroll=unroll,
                          dtype=idx)]


def _prepend(loops: list, stmts: list) -> list:
    """stmts put at the top of the innermost loop of a nest (points_in_turn's (i, j) loops)."""
    if len(loops) == 1 and isinstance(loops[0], For):
        return [replace(loops[0], body=tuple(_prepend(list(loops[0].body), stmts)))]
    return stmts + loops


def lower_matmul_kernel(tk: TileKernel) -> Kernel:
    low = _MatmulLowerer(tk)
    mt, idx, v = tk.matmul, low.idx, low.v
    t = Var(v["t"], idx)
    body: list = [Let(v["t"], idx, ThreadIdx())]
    tiles = [("bm", -(-tk.extent(mt.m) // mt.tile_m)), ("bn", -(-tk.extent(mt.n) // mt.tile_n))]
    if mt.order == "nm":
        tiles.reverse()             # M tiles fastest (the ORDER knob, cpu_matmul's rule)
    block = dict(bind_domain(BlockIdx(), list(tk.batch) + tiles, {"blockIdx.x": tk.grid}))
    body += [Let(var, idx, block[var]) for var, _ in tk.batch]
    if mt.m:
        body.append(Let(v["m0"], idx, mul(block["bm"], mt.tile_m)))
    body.append(Let(v["n0"], idx, mul(block["bn"], mt.tile_n)))
    special = {"m0": Var(v["m0"], idx) if mt.m else Const(0), "n0": Var(v["n0"], idx),
               "tm": Const(0), "tn": t}
    if mt.threads_m > 1:
        body += [Let(v["tm"], idx, floordiv(t, mt.threads_n)), Let(v["tn"], idx, mod(t, mt.threads_n))]
        special.update(tm=Var(v["tm"], idx), tn=Var(v["tn"], idx))
    low.special = special
    body += low.stmts(tk.prelude) + low.stmts(tk.body)
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes) for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)
