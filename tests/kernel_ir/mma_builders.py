"""Hand-built tensor-core kernels: global -> cp.async -> shared -> ldmatrix -> mma.sync -> global,
written the way a tile schedule is expected to write them, for the simulator, CUDA and GPU tests.

Matrices are row-major: A is (m, k), B is (k, n) (so B's fragments come from ldmatrix.trans), and
C = A @ B is (m, n) in f32. Also a probe that exposes ldmatrix's register layout, and `rewrite`,
which the negative tests use to break a kernel one statement at a time."""
from __future__ import annotations


from strata.core import expr as E
from strata.kernel_ir.ir import (BlockIdx, Buffer, CpAsync, CpAsyncCommit, CpAsyncWait, For, If, Kernel,
                              KernelProgram, LdMatrix, Let, Mma, Param, Smem, Store, StoreVec, Sync,
                              ThreadIdx)

from ir_rewrite import rewrite  # noqa: F401  (the tests import it from here)
from kernel_builders import I, V, program


def regs(name: str, n: int) -> tuple[str, ...]:
    return tuple(f"{name}{r}" for r in range(n))


def mma_16x8(dtype: str = "f16", m: int = 16) -> KernelProgram:
    """One warp computes C (m x 8) = A (m x 16) @ B (16 x 8), m <= 16: one 16-byte cp.async per
    lane for A (rows from m on are zero-filled), one per lane < 16 for B, then ldmatrix.x4 for A,
    ldmatrix.x2.trans for B, one mma and the C fragment stored element by element."""
    lane, g, t = V("lane", "i32"), V("g", "i32"), V("t", "i32")
    a_row = E.floordiv(lane, 2)
    c = regs("c", 4)
    a_src = E.add(E.mul(a_row, 16), E.mul(E.mod(lane, 2), 8))
    a_copy = CpAsync("a_s", E.mul(lane, 8), "A", a_src, 16, cache="cg")
    if m < 16:                  # rows from m on: read nothing (clamped address), zero-fill
        a_src = E.add(E.mul(E.call("minimum", a_row, I(m - 1)), 16), E.mul(E.mod(lane, 2), 8))
        a_copy = CpAsync("a_s", E.mul(lane, 8), "A", a_src, 16, cache="cg",
                         src_bytes=E.call("where", E.call("lt", a_row, I(m)), I(16), I(0)))
    body = [
        Let("lane", "i32", ThreadIdx()),
        Smem("a_s", dtype, 16 * 16),
        Smem("b_s", dtype, 16 * 8),
        a_copy,
        If(E.call("lt", lane, I(16)), (CpAsync("b_s", E.mul(lane, 8), "B", E.mul(lane, 8), 16),)),
        CpAsyncCommit(),
        CpAsyncWait(0),
        Sync(),
        LdMatrix(regs("a", 4), "a_s", E.add(E.mul(E.mod(lane, 16), 16), E.mul(E.floordiv(lane, 16), 8))),
        LdMatrix(regs("b", 2), "b_s", E.mul(E.mod(lane, 16), 8), trans=True),
        *(Let(v, "f32", E.Const(0.0, "f32")) for v in c),
        Mma(c, regs("a", 4), regs("b", 2), c, dtype),
        Let("g", "i32", E.floordiv(lane, 4)),
        Let("t", "i32", E.mod(lane, 4)),
    ]
    for half in (0, 1):
        row = E.add(g, 8 * half)
        stores = tuple(Store("C", E.add(E.mul(row, 8), E.add(E.mul(t, 2), j)), V(c[2 * half + j], "f32"))
                       for j in (0, 1))
        body += [If(E.call("lt", row, I(m)), stores)] if m < 8 * (half + 1) else list(stores)
    params = (Param("A", dtype, m * 16), Param("B", dtype, 16 * 8), Param("C", "f32", m * 8, output=True))
    k = Kernel(f"k_mma_16x8_{dtype}", params, 1, 32, tuple(body), src=f"C = A @ B, {m}x8x16 {dtype}")
    return program(k, [Buffer("A", dtype, (m, 16), "input"), Buffer("B", dtype, (16, 8), "input"),
                       Buffer("C", "f32", (m, 8), "output")])


BM, BN, BK = 64, 64, 32        # block tile; 4 warps as 2 x 2, each 32 x 32 = 2 x 4 mma tiles


def mma_tiled(m: int = 64, n: int = 64, k: int = 128, dtype: str = "f16") -> KernelProgram:
    """C = A @ B with 64 x 64 block tiles, 4 warps of 32 x 32, and a K loop over 32-wide slabs
    double-buffered in shared memory: slab kt + 1 is copied (cp.async, one group per slab) while
    slab kt is multiplied; wait_group 1 + Sync before using a slab, Sync before refilling it."""
    assert m % BM == 0 and n % BN == 0 and k % BK == 0
    tid, lane = V("tid", "i32"), V("lane", "i32")
    wm, wn, bm, bn = V("wm", "i32"), V("wn", "i32"), V("bm", "i32"), V("bn", "i32")
    kt, kk = V("kt", "i32"), V("kk", "i32")
    slab = BM * BK                  # elements of one stage of a_s (and of b_s: BK * BN)
    ktiles = k // BK

    def load_slab(kt_e, stage_e):
        q = V("q", "i32")           # 16-byte chunk: 256 for A (4 per row), 256 for B (8 per row)
        return For("q", tid, I(256), 128, (
            CpAsync("a_s", E.add(E.mul(stage_e, slab), E.mul(q, 8)), "A",
                    E.add(E.mul(E.add(E.mul(bm, BM), E.floordiv(q, 4)), k),
                          E.add(E.mul(kt_e, BK), E.mul(E.mod(q, 4), 8))), 16, cache="cg"),
            CpAsync("b_s", E.add(E.mul(stage_e, slab), E.mul(q, 8)), "B",
                    E.add(E.mul(E.add(E.mul(kt_e, BK), E.floordiv(q, 8)), n),
                          E.add(E.mul(bn, BN), E.mul(E.mod(q, 8), 8))), 16, cache="cg"),
        ), unroll=True)

    acc = {(i, j): regs(f"c{i}{j}_", 4) for i in range(2) for j in range(4)}
    stage = E.mul(E.mod(kt, 2), slab)
    step = []
    for i in range(2):              # A: rows wm*32 + 16i + lane % 16, cols kk + 8 * (lane // 16)
        row = E.add(E.add(E.mul(wm, 32), 16 * i), E.mod(lane, 16))
        step.append(LdMatrix(regs(f"a{i}_", 4), "a_s", E.add(stage, E.add(
            E.mul(row, BK), E.add(kk, E.mul(E.floordiv(lane, 16), 8))))))
    for jp in range(2):             # B: k rows kk + lane % 16, cols of n tiles 2jp and 2jp + 1
        col = E.add(E.add(E.mul(wn, 32), 16 * jp), E.mul(E.floordiv(lane, 16), 8))
        step.append(LdMatrix(regs(f"b{2 * jp}_", 2) + regs(f"b{2 * jp + 1}_", 2), "b_s", E.add(
            stage, E.add(E.mul(E.add(kk, E.mod(lane, 16)), BN), col)), trans=True))
    step += [Mma(acc[i, j], regs(f"a{i}_", 4), regs(f"b{j}_", 2), acc[i, j], dtype)
             for i in range(2) for j in range(4)]

    body = [
        Let("tid", "i32", ThreadIdx()),
        Let("lane", "i32", E.mod(tid, 32)),
        Let("wm", "i32", E.floordiv(E.floordiv(tid, 32), 2)),
        Let("wn", "i32", E.mod(E.floordiv(tid, 32), 2)),
        Let("bm", "i32", E.floordiv(BlockIdx(), n // BN)),
        Let("bn", "i32", E.mod(BlockIdx(), n // BN)),
        Smem("a_s", dtype, 2 * slab),
        Smem("b_s", dtype, 2 * slab),
        *(Let(v, "f32", E.Const(0.0, "f32")) for vs in acc.values() for v in vs),
        load_slab(I(0), I(0)),
        CpAsyncCommit(),
        For("kt", I(0), I(ktiles), 1, (
            If(E.call("lt", E.add(kt, 1), I(ktiles)), (load_slab(E.add(kt, 1), E.mod(E.add(kt, 1), 2)),)),
            CpAsyncCommit(),
            CpAsyncWait(1),
            Sync(),
            For("kk", I(0), I(BK), 16, tuple(step), unroll=True),
            Sync(),
        )),
        Let("g", "i32", E.floordiv(lane, 4)),
        Let("t", "i32", E.mod(lane, 4)),
    ]
    g, t = V("g", "i32"), V("t", "i32")
    for (i, j), c in acc.items():
        for half in (0, 1):
            row = E.add(E.add(E.mul(bm, BM), E.mul(wm, 32)), E.add(g, 16 * i + 8 * half))
            col = E.add(E.add(E.mul(bn, BN), E.mul(wn, 32)), E.add(E.mul(t, 2), 8 * j))
            body.append(StoreVec("C", E.add(E.mul(row, n), col),
                                 (V(c[2 * half], "f32"), V(c[2 * half + 1], "f32"))))
    params = (Param("A", dtype, m * k), Param("B", dtype, k * n), Param("C", "f32", m * n, output=True))
    kern = Kernel(f"k_mma_tiled_{dtype}", params, (m // BM) * (n // BN), 128, tuple(body),
                  src=f"C = A @ B, {m}x{n}x{k} {dtype}, 64x64 tiles, 4 warps, 2-stage cp.async")
    return program(kern, [Buffer("A", dtype, (m, k), "input"), Buffer("B", dtype, (k, n), "input"),
                          Buffer("C", "f32", (m, n), "output")])


def ldmatrix_probe(num: int, trans: bool, unused_row: int = 0) -> KernelProgram:
    """Shared s[i] = i (int16); lane 8 * m + r points at row r of matrix m, rows placed out of
    order ((3r) % 8) with a 16-element pitch; lanes past 8 * num give `unused_row`, which
    ldmatrix ignores. out[reg * 32 + lane] = the register."""
    lane = V("lane", "i32")
    m, r = E.floordiv(lane, 8), E.mod(lane, 8)
    good = E.add(E.mul(m, 128), E.mul(E.mod(E.mul(r, 3), 8), 16))
    row = E.call("where", E.call("lt", lane, I(8 * num)), good, I(unused_row))
    names = tuple(f"r{k}" for k in range(num))
    body = (Let("lane", "i32", ThreadIdx()), Smem("s", "i16", 512),
            For("f", lane, I(512), 32, (Store("s", V("f", "i32"), V("f", "i32")),)), Sync(),
            LdMatrix(names, "s", row, trans),
            *(Store("out", E.add(lane, 32 * k), V(v, "i32")) for k, v in enumerate(names)))
    name = f"k_ldmatrix_x{num}{'_trans' if trans else ''}"
    k = Kernel(name, (Param("out", "i32", 32 * num, output=True),), 1, 32, body)
    return program(k, [Buffer("out", "i32", (num, 32), "output")])


