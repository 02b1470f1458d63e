"""Tile IR -> Kernel IR for a tensor-core contraction (mode "mma", see tile/passes/mma_tile.py).

blockIdx.x enumerates (batch axes..., M tile, N tile), N fastest; warp w of the block is
(warp_m, warp_n) = (w // WARPS_N, w % WARPS_N). Per `MmaLoop`, each K step fills one stage of
the shared A and B tiles (cp.async 16-byte chunks zero-filled outside the matrix, or plain
loads + the prologue + st.shared), and each 16-wide slice of the step is one ldmatrix.x4 per
16 rows of A, one ldmatrix.x4 per 16 columns of B (.trans when the tile is stored along K) and
one mma.sync per 16x8 accumulator tile. With STAGES = S > 1 the loop is software-pipelined:
S-1 fills issued up front, then per step wait_group(S-2) + barrier, the fill of step + S-1 into
the buffer freed a step earlier, the multiply. The accumulators sit in the PTX C layout (lane
holds rows g, g + 8 and columns 2t, 2t + 1 of each tile, g = lane / 4, t = lane % 4); the
epilogue runs once per element, at its (M, N), guarded at the edges.
"""
from __future__ import annotations

from math import prod

from dataclasses import replace

from ..core import dtypes
from ..core.expr import Const, Var, add, call, floordiv, mod, mul, rename
from ..loop.ir import Let as LLet, Load as LLoad
from ..tile.ir import Guard, MmaLoop, MmaOperand, TileKernel, flat_index, rename_stmt, subst_body
from ..tile.tensor_core import row_stride, stage_elems, tile_rows_cols
from .ir import (BlockIdx, CpAsync, CpAsyncCommit, CpAsyncWait, For, If, Kernel, LdMatrix, Let,
                 Mma, Param, Smem, Store, Sync, ThreadIdx)
from .lowerer import bind_domain, Lowerer

NAMES = ("tid", "lane", "warp_m", "warp_n", "m0", "n0", "lane_g", "lane_t", "kt", "ks", "q",
         "a_smem", "b_smem")


def xor_low(a, b, bits: int):
    """a ^ b for integers a >= 0 and 0 <= b < 2**bits, spelled with // and % (Kernel IR has no
    bitwise operators): bit i of the result is (a // 2^i + b // 2^i) % 2."""
    top = 1 << bits
    out = mul(floordiv(a, top), top)
    for i in range(bits):
        out = add(out, mul(mod(add(floordiv(a, 1 << i), floordiv(b, 1 << i)), 2), 1 << i))
    return out


def regs(name: str, n: int) -> tuple[str, ...]:
    return tuple(f"{name}{r}" for r in range(n))


class MmaLowerer(Lowerer):
    def __init__(self, tk: TileKernel):
        super().__init__(tk)
        self.mt = tk.matmul
        taken = {b.name for b in tk.buffers}
        self.v.update({n: n if n not in taken else f"{n}_idx" for n in NAMES})
        self.loops = [s for s in tk.body if isinstance(s, MmaLoop)]

    def var(self, name: str) -> Var:
        return Var(self.v[name], self.idx)

    def const(self, value: int) -> Const:
        return Const(value, self.idx)

    def origin(self, op: MmaOperand):
        if op.side == "B":
            return self.var("n0")
        return self.var("m0") if self.mt.m else self.const(0)

    # -------------------------------------------------------------- shared layout
    def smem_at(self, op: MmaOperand, stage, row, col, aligned: bool):
        """Element index of (row, col) of the operand's tile in buffer `stage`."""
        mt = self.mt
        _, cols = tile_rows_cols(op, mt)
        if mt.swizzle == "xor":
            chunks = cols // 8
            bits = min(chunks, 8).bit_length() - 1
            spread = max(1, 8 // chunks)       # rows sharing a 128-byte line get the same f
            f = mod(floordiv(row, spread), 1 << bits)
            moved = mul(xor_low(floordiv(col, 8), f, bits), 8)
            col = moved if aligned else add(moved, mod(col, 8))
        at = add(mul(row, row_stride(cols, mt.swizzle)), col)
        return add(mul(stage, stage_elems(op, mt)), at)

    def smem_name(self, op: MmaOperand) -> str:
        return self.v["a_smem" if op.side == "A" else "b_smem"]

    # -------------------------------------------------------------- fills
    def bounds(self, op: MmaOperand, loop: MmaLoop, gx, gk):
        """The condition that (gx, gk) lies inside the operand, None where it always does."""
        mt = self.mt
        xtile = mt.tile_m if op.side == "A" else mt.tile_n
        cond = None
        if op.x_extent % xtile:
            cond = call("lt", gx, self.const(op.x_extent))
        if loop.extent % mt.tile_k:
            k_in = call("lt", gk, self.const(loop.extent))
            cond = k_in if cond is None else call("logical_and", cond, k_in)
        return cond

    def fill(self, op: MmaOperand, loop: MmaLoop, kstep, stage) -> list:
        """One K step of the operand into buffer `stage`, by the whole block."""
        mt, idx = self.mt, self.idx
        rows, cols = tile_rows_cols(op, mt)
        q = self.var("q")
        per = cols // 8 if op.fill == "cp.async" else cols
        row, col = floordiv(q, per), mod(q, per)
        if op.fill == "cp.async":
            col = mul(col, 8)
        x, kk = (row, col) if op.kmajor else (col, row)
        gx, gk = add(self.origin(op), x), add(mul(kstep, mt.tile_k), kk)
        bind = {loop.k_var: gk}
        if op.x_var:
            bind[op.x_var] = gx
        ok = self.bounds(op, loop, gx, gk)
        name = self.smem_name(op)
        if op.fill == "cp.async":
            load = op.body[0]
            src = subst_body((load,), bind)[0]
            src = flat_index(src.index, self.tk.shape_of(load.buf))
            dst = self.smem_at(op, stage, row, col, aligned=True)
            if ok is None:
                stmt = CpAsync(name, dst, load.buf, src, 16, cache="cg")
            else:
                stmt = CpAsync(name, dst, load.buf, call("where", ok, src, self.const(0)), 16,
                               src_bytes=call("where", ok, self.const(16), self.const(0)), cache="cg")
            body = (stmt,)
        else:
            last = op.body[-1]
            cdt = dtypes.compute_dtype(last.dtype if isinstance(last, LLoad) else last.value.dtype)
            dst = self.smem_at(op, stage, row, col, aligned=False)
            compute = self.stmts(subst_body(op.body, bind)) + [Store(name, dst, Var(op.value, cdt))]
            body = tuple(compute) if ok is None else \
                (If(ok, tuple(compute), (Store(name, dst, Const(0, cdt)),)),)
        n, block = rows * per, self.tk.block
        return [For(q.name, self.var("tid"), self.const(n), block, body,
                    unroll=n % block == 0 and n // block <= 16, dtype=idx)]

    def fills(self, loop: MmaLoop, kstep, stage) -> list:
        return self.fill(loop.a, loop, kstep, stage) + self.fill(loop.b, loop, kstep, stage)

    # -------------------------------------------------------------- the multiply
    def frag_row(self, op: MmaOperand, stage, xbase, num: int):
        """ldmatrix row address of this lane: matrix mi = lane / 8 covers rows xsel and K half
        ksel of the fragment (A: mi = xsel + 2 ksel; B: mi = ksel + 2 xsel)."""
        lane = self.var("lane")
        lane = lane if num == 4 else mod(lane, 16)
        mi, r = floordiv(lane, 8), mod(lane, 8)
        xsel, ksel = (mod(mi, 2), floordiv(mi, 2)) if op.side == "A" else (floordiv(mi, 2), mod(mi, 2))
        x, k = add(xbase, mul(xsel, 8)), add(self.var("ks"), mul(ksel, 8))
        if op.kmajor:
            return self.smem_at(op, stage, add(x, r), k, aligned=True)
        return self.smem_at(op, stage, add(k, r), x, aligned=True)

    def acc(self, li: int, i: int, j: int) -> tuple[str, ...]:
        return regs(f"mc{li}_{i}_{j}_", 4)

    def multiply(self, li: int, loop: MmaLoop, stage) -> list:
        mt = self.mt
        mi_n, nj_n = mt.warp_m // 16, mt.warp_n // 8
        body = []
        for i in range(mi_n):
            xbase = add(mul(self.var("warp_m"), mt.warp_m), 16 * i)
            body.append(LdMatrix(regs(f"fa{i}_", 4), self.smem_name(loop.a),
                                 self.frag_row(loop.a, stage, xbase, 4), trans=not loop.a.kmajor))
        j = 0
        while j < nj_n:
            num = 4 if j + 1 < nj_n else 2
            xbase = add(mul(self.var("warp_n"), mt.warp_n), 8 * j)
            names = regs(f"fb{j}_", 2) + (regs(f"fb{j + 1}_", 2) if num == 4 else ())
            body.append(LdMatrix(names, self.smem_name(loop.b), self.frag_row(loop.b, stage, xbase, num),
                                 trans=not loop.b.kmajor))
            j += num // 2
        body += [Mma(self.acc(li, i, j), regs(f"fa{i}_", 4), regs(f"fb{j}_", 2), self.acc(li, i, j), mt.dtype)
                 for i in range(mi_n) for j in range(nj_n)]
        return [For(self.v["ks"], self.const(0), self.const(mt.tile_k), 16, tuple(body), unroll=True,
                    dtype=self.idx)]

    def k_loop(self, li: int, loop: MmaLoop) -> list:
        mt, s = self.mt, loop.stages
        steps = -(-loop.extent // mt.tile_k)
        kt = self.var("kt")
        out = [Let(v, "f32", Const(0.0, "f32")) for i in range(mt.warp_m // 16)
               for j in range(mt.warp_n // 8) for v in self.acc(li, i, j)]
        if li:
            out.append(Sync())              # the previous loop is done with the buffers
        if s == 1:
            body = self.fills(loop, kt, self.const(0)) + [CpAsyncCommit(), CpAsyncWait(0), Sync()] \
                + self.multiply(li, loop, self.const(0)) + [Sync()]
            return out + [For(kt.name, self.const(0), self.const(steps), 1, tuple(body), dtype=self.idx)]
        for st in range(s - 1):             # prologue: the first S-1 steps in flight
            if st < steps:
                out += self.fills(loop, self.const(st), self.const(st))
            out.append(CpAsyncCommit())

        def step(refill: bool) -> tuple:
            body = [CpAsyncWait(s - 2), Sync()]
            if refill:
                ahead = add(kt, s - 1)
                body += self.fills(loop, ahead, mod(ahead, s))
            return tuple(body + [CpAsyncCommit()] + self.multiply(li, loop, mod(kt, s)))
        steady = steps - (s - 1)
        if steady > 0:
            out.append(For(kt.name, self.const(0), self.const(steady), 1, step(True), dtype=self.idx))
        out.append(For(kt.name, self.const(max(0, steady)), self.const(steps), 1, step(False),
                       dtype=self.idx))
        return out

    # -------------------------------------------------------------- the epilogue
    def stmt(self, s) -> list:
        if isinstance(s, Guard):
            return [If(s.cond, tuple(self.stmts(s.body)))]
        return super().stmt(s)

    def epilogue(self, stmts) -> list:
        """The row statements after the loops, once per accumulator element of the thread."""
        mt = self.mt
        g, t = self.var("lane_g"), self.var("lane_t")
        local = _defined(stmts)
        out = []
        for i in range(mt.warp_m // 16):
            for j in range(mt.warp_n // 8):
                for r in range(4):
                    row = add(add(mul(self.var("warp_m"), mt.warp_m), 16 * i + 8 * (r // 2)), g)
                    col = add(add(mul(self.var("warp_n"), mt.warp_n), 8 * j + r % 2), mul(t, 2))
                    bind = {mt.n: add(self.var("n0"), col)}
                    if mt.m:
                        bind[mt.m] = add(self.var("m0"), row)
                    names = {v: f"{v}_{i}_{j}_{r}" for v in local}
                    names.update({lp.acc.acc: self.acc(li, i, j)[r] for li, lp in enumerate(self.loops)})
                    body = self.stmts(subst_body(tuple(_rename(s, names) for s in stmts), bind))
                    if mt.m is None:        # a vector M side: only row 0 exists
                        body = [If(call("lt", row, self.const(1)), tuple(body))]
                    out += body
        return out


def _defined(stmts) -> set[str]:
    out = set()
    for s in stmts:
        if isinstance(s, Guard):
            out |= _defined(s.body)
        elif isinstance(s, (LLet, LLoad)):
            out.add(s.var)
    return out


def _rename(s, names: dict):
    if isinstance(s, Guard):
        return replace(s, cond=rename(s.cond, names), body=tuple(_rename(x, names) for x in s.body))
    return rename_stmt(s, names)


def lower_mma_kernel(tk: TileKernel) -> Kernel:
    low = MmaLowerer(tk)
    mt, idx = tk.matmul, low.idx
    tid = low.var("tid")
    body: list = [Let(tid.name, idx, ThreadIdx()),
                  Let(low.v["lane"], idx, mod(tid, 32)),
                  Let(low.v["warp_m"], idx, floordiv(floordiv(tid, 32), mt.warps_n)),
                  Let(low.v["warp_n"], idx, mod(floordiv(tid, 32), mt.warps_n))]
    tiles = [("bm", -(-tk.extent(mt.m) // mt.tile_m)), ("bn", -(-tk.extent(mt.n) // mt.tile_n))]
    block = dict(bind_domain(BlockIdx(), list(tk.batch) + tiles, {"blockIdx.x": tk.grid}))
    body += [Let(var, idx, block[var]) for var, _ in tk.batch]
    if mt.m:
        body.append(Let(low.v["m0"], idx, mul(block["bm"], mt.tile_m)))
    body.append(Let(low.v["n0"], idx, mul(block["bn"], mt.tile_n)))
    stages = max(lp.stages for lp in low.loops)
    for side in ("a", "b"):
        size = max(stage_elems(getattr(lp, side), mt) for lp in low.loops)
        body.append(Smem(low.v[f"{side}_smem"], mt.dtype, stages * size))
    body += low.stmts(tk.prelude)
    for li, lp in enumerate(low.loops):
        body += low.k_loop(li, lp)
    body += [Let(low.v["lane_g"], idx, floordiv(low.var("lane"), 4)),
             Let(low.v["lane_t"], idx, mod(low.var("lane"), 4))]
    body += low.epilogue(tuple(s for s in tk.body if not isinstance(s, MmaLoop)))
    params = tuple(Param(b.name, b.dtype, prod(b.shape), b.name in tk.writes) for b in tk.buffers)
    return Kernel(tk.name, params, tk.grid, tk.block, tuple(body), src=tk.src)
