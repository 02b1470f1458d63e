"""Tensor cores in the simulator: mma.sync and ldmatrix follow the PTX ISA fragment layouts (checked
against the ISA's formulas, transcribed here independently of sim_mma.py), whole kernels
(cp.async -> ldmatrix -> mma) compute A @ B, and a wrong lane mapping gives wrong numbers."""
from dataclasses import replace

import numpy as np
import pytest

from strata.core import dtypes, expr as E
from strata.kernel_ir import sim_mma
from strata.kernel_ir.ir import LdMatrix, Mma
from strata.kernel_ir.sim import simulate

import kernel_builders as B
import mma_builders as MB
from strata.kernel_ir.verify import verify_program

RNG = np.random.default_rng(11)


# ---------------------------------------------------------------- the PTX ISA's formulas
# mma.m16n8k16, .f16/.bf16 inputs, .f32 accumulators; element index i of the fragment.

def ptx_a(lane, i):
    g, t = lane >> 2, lane % 4
    row = g if (i < 2 or 4 <= i < 6) else g + 8
    return row, t * 2 + (i & 1) + (8 if i >= 4 else 0)


def ptx_b(lane, i):
    g, t = lane >> 2, lane % 4
    return t * 2 + (i & 1) + (8 if i >= 2 else 0), g


def ptx_c(lane, i):
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


def bits16(x, dtype):
    if dtype == "bf16":
        return int(dtypes.to_bf16_bits(np.array([x], np.float32))[0])
    return int(np.float16(x).view(np.uint16))


def fragment(mat, where, nelem, dtype):
    """(nelem // 2, 32) i32 registers of `mat` by the formula `where(lane, i)`."""
    regs = np.zeros((nelem // 2, 32), np.int64)
    for lane in range(32):
        for r in range(nelem // 2):
            lo, hi = (bits16(mat[where(lane, 2 * r + h)], dtype) for h in (0, 1))
            regs[r, lane] = np.int64(np.uint32(lo | hi << 16).view(np.int32))
    return regs


def matrices(m, k, n, dtype):
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    if dtype == "f16":
        return a.astype(np.float16), b.astype(np.float16)
    return dtypes.round_to(a, "bf16"), dtypes.round_to(b, "bf16")


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert not np.isnan(out).any(), "NaN in output (unwritten element?)"
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def test_fragment_tables_cover_each_element_once():
    for rows, cols, shape in ((sim_mma.A_ROW, sim_mma.A_COL, (16, 16)),
                              (sim_mma.B_ROW, sim_mma.B_COL, (16, 8)),
                              (sim_mma.C_ROW, sim_mma.C_COL, (16, 8))):
        hits = np.zeros(shape, int)
        np.add.at(hits, (rows, cols), 1)
        assert (hits == 1).all()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_matches_the_ptx_layout(dtype):
    a, b = matrices(16, 16, 8, dtype)
    c = RNG.standard_normal((16, 8)).astype(np.float32)
    ra, rb = fragment(a, ptx_a, 8, dtype), fragment(b, ptx_b, 4, dtype)
    rc = np.array([[c[ptx_c(lane, i)] for lane in range(32)] for i in range(4)], np.float32)
    d = sim_mma.mma_m16n8k16(ra[None], rb[None], rc[None], dtype)[0]
    got = np.zeros((16, 8), np.float32)
    for lane in range(32):
        for i in range(4):
            got[ptx_c(lane, i)] = d[i, lane]
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    assert rel_err(got, a32.astype(np.float64) @ b32 + c) < 1e-6
    acc = c.copy()                  # the documented order: acc += a[:, k] * b[k, :], k = 0..15
    for k in range(16):
        acc += a32[:, k, None] * b32[None, k, :]
    np.testing.assert_array_equal(got, acc)


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_matches_the_ptx_layout(num, trans):
    out = simulate(MB.ldmatrix_probe(num, trans, unused_row=-1), {})["out"].astype(np.int64) & 0xFFFFFFFF
    for mat in range(num):
        for lane in range(32):
            for h in range(2):        # PTX: thread lane holds row lane / 4, cols 2 (lane % 4) + h
                row, col = lane // 4, 2 * (lane % 4) + h
                if trans:
                    row, col = col, row
                want = mat * 128 + (3 * row) % 8 * 16 + col
                assert (out[mat, lane] >> (16 * h)) & 0xFFFF == want, (mat, lane, h)


# ---------------------------------------------------------------- whole kernels

@pytest.mark.parametrize("m", [16, 13])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_16x8(dtype, m):
    a, b = matrices(m, 16, 8, dtype)
    c = simulate(MB.mma_16x8(dtype, m), {"A": a, "B": b})["C"]
    assert c.shape == (m, 8)
    assert rel_err(c, a.astype(np.float64) @ b.astype(np.float64)) < 1e-3


@pytest.mark.parametrize("shape", [(64, 64, 128), (128, 64, 64)])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_tiled(dtype, shape):
    m, n, k = shape
    a, b = matrices(m, k, n, dtype)
    prog = MB.mma_tiled(m, n, k, dtype)
    verify_program(prog)
    c = simulate(prog, {"A": a, "B": b})["C"]
    assert rel_err(c, a.astype(np.float64) @ b.astype(np.float64)) < 1e-3


def swap_a_registers(s):
    if isinstance(s, Mma):
        a = s.a
        return replace(s, a=(a[0], a[2], a[1], a[3]))
    return s


def a_rows_from_lane_mod_8(s):
    if isinstance(s, LdMatrix) and s.buf == "a_s" and not s.trans:
        lane = B.V("lane", "i32")
        return replace(s, row=E.add(E.mul(E.mod(lane, 8), 16), E.mul(E.floordiv(lane, 16), 8)))
    return s


def b_without_trans(s):
    return replace(s, trans=False) if isinstance(s, LdMatrix) and s.trans else s


@pytest.mark.parametrize("bug", [swap_a_registers, a_rows_from_lane_mod_8, b_without_trans])
def test_wrong_lane_mapping_gives_wrong_numbers(bug):
    a, b = matrices(16, 16, 8, "f16")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    good = MB.mma_16x8("f16")
    assert rel_err(simulate(good, {"A": a, "B": b})["C"], ref) < 1e-3
    bad = MB.rewrite(good, bug)
    verify_program(bad)
    assert rel_err(simulate(bad, {"A": a, "B": b})["C"], ref) > 0.1


def test_tiled_with_swapped_registers_fails():
    a, b = matrices(64, 128, 64, "bf16")
    bad = MB.rewrite(MB.mma_tiled(dtype="bf16"), swap_a_registers)
    assert rel_err(simulate(bad, {"A": a, "B": b})["C"], a.astype(np.float64) @ b) > 0.1


def test_printed_kernel_ir():
    text = str(MB.mma_16x8("f16").kernels[0])
    for line in ("a_s[lane * 8] <- cp.async.cg.16 A[lane * 8]",
                 "    if lane < 16:\n        b_s[lane * 8] <- cp.async.ca.16 B[lane * 8]",
                 "cp.async.commit_group\n    cp.async.wait_group 0\n    Sync",
                 "a0, a1, a2, a3 = ldmatrix.x4 a_s[lane % 16 * 16 + lane // 16 * 8]  : i32",
                 "b0, b1 = ldmatrix.x2.trans b_s[lane % 16 * 8]  : i32",
                 "c0, c1, c2, c3 <- mma.m16n8k16.f16 a=(a0, a1, a2, a3) b=(b0, b1) c=(c0, c1, c2, c3)"):
        assert line in text
    assert ", src_bytes=where(lane // 2 < 13, 16, 0)" in str(MB.mma_16x8("f16", 13).kernels[0])
