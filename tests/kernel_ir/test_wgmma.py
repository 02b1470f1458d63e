"""Hopper in the simulator: wgmma's accumulator layout and descriptors, TMA boxes with swizzle and
zero fill, and whole TMA -> wgmma kernels against NumPy; a wrong lane mapping or swizzle gives
wrong numbers. The PTX formulas are transcribed here independently of sim_wgmma.py/sim_tma.py."""
from dataclasses import replace

import numpy as np
import pytest
import wgmma_builders as W
from mma_builders import rewrite

from strata.core import dtypes
from strata.core import expr as E
from strata.kernel_ir import sim_wgmma
from strata.kernel_ir.ir import Wgmma
from strata.kernel_ir.sim import simulate
from strata.kernel_ir.verify import verify_program

RNG = np.random.default_rng(23)


def bf16(shape):
    return dtypes.round_to(RNG.standard_normal(shape).astype(np.float32), "bf16")


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert not np.isnan(out).any(), "NaN in output (unwritten element?)"
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


# ---------------------------------------------------------------- the PTX ISA's formulas

def ptx_d(thread, i):
    """wgmma m64nNk16 D fragment, .f32: thread T of the warpgroup, element d[i]."""
    warp, lane = thread // 32, thread % 32
    row = 16 * warp + lane // 4 + (8 if i % 4 >= 2 else 0)
    return row, (lane % 4) * 2 + i % 2 + 8 * (i // 4)


def ptx_swizzle_128b(byte):
    """128B swizzle: within each 1024-byte block, 16-byte chunk c of 128-byte row r moves to
    chunk c ^ r."""
    row, chunk = (byte // 128) % 8, (byte // 16) % 8
    return byte - 16 * chunk + 16 * (chunk ^ row)


@pytest.mark.parametrize("n", [8, 64, 256])
def test_accumulator_layout_is_the_ptx_one(n):
    rows, cols = sim_wgmma.acc_layout(n)
    hits = np.zeros((64, n), int)
    for t in range(128):
        for i in range(n // 2):
            assert (rows[i, t], cols[i, t]) == ptx_d(t, i)
            hits[rows[i, t], cols[i, t]] += 1
    assert (hits == 1).all()


def test_descriptor_bits():
    d = int(sim_wgmma.encode(np.array([0x12340]), 16, 1024, "128B")[0]) & (2 ** 64 - 1)
    assert d & 0x3FFF == 0x1234 and (d >> 16) & 0x3FFF == 1 and (d >> 32) & 0x3FFF == 64
    assert d >> 62 == 1 and (d >> 46) & 0xFFFF == 0
    assert sim_wgmma.decode(d) == (0x12340, 16, 1024, 0, "128B")
    # 128B swizzle K-major: row r, element k at swz(start + r // 8 * SBO + r % 8 * 128 + 2k)
    addr = sim_wgmma.operand_addresses(int(sim_wgmma.encode(np.array([2048 + 32]), 16, 1024,
                                                            "128B")[0]), 64)
    for r, k in [(0, 0), (1, 0), (7, 15), (9, 3), (63, 8)]:
        want = ptx_swizzle_128b(2048 + 32 + (r // 8) * 1024 + (r % 8) * 128 + 2 * k)
        assert addr[r, k] == want


def test_no_swizzle_descriptor_uses_lbo_and_sbo():
    addr = sim_wgmma.operand_addresses(int(sim_wgmma.encode(np.array([0]), 128, 256, "none")[0]), 16)
    for r, k in [(0, 0), (3, 5), (8, 9), (15, 15)]:   # core matrices of 8 rows x 16 bytes
        assert addr[r, k] == (r // 8) * 256 + (r % 8) * 16 + (k // 8) * 128 + (k % 8) * 2


# ---------------------------------------------------------------- TMA

@pytest.mark.parametrize("case", [
    dict(rows=80, cols=64, box_rows=64, box_cols=64, coords=(0, 16), swizzle="128B"),
    dict(rows=40, cols=48, box_rows=64, box_cols=64, coords=(0, 8), swizzle="128B"),   # OOB
    dict(rows=30, cols=40, box_rows=16, box_cols=24, coords=(-8, 20), swizzle="none"),  # OOB
])
def test_tma_box_layout_and_zero_fill(case):
    rows, cols = case["rows"], case["cols"]
    x = (np.arange(rows * cols) % 251).astype(np.float32).reshape(rows, cols)   # exact in bf16
    out = simulate(W.tma_probe(**case), {"X": x})["out"]
    c0, c1 = case["coords"]
    want = np.full(out.shape, np.nan, np.float32)
    for y in range(case["box_rows"]):
        for xx in range(case["box_cols"]):
            byte = 2 * (y * case["box_cols"] + xx)
            if case["swizzle"] == "128B":
                byte = ptx_swizzle_128b(byte)
            r, c = c1 + y, c0 + xx
            want[byte // 2] = x[r, c] if 0 <= r < rows and 0 <= c < cols else 0.0
    np.testing.assert_array_equal(out, want)


# ---------------------------------------------------------------- whole kernels

def reference(a, b):
    """C = A @ B.T in f32, adding one k at a time in increasing k (the simulator's order)."""
    acc = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for k in range(a.shape[1]):
        acc += a[:, k, None] * b[None, :, k]
    return acc


@pytest.mark.parametrize("shape", [(64, 64, 16), (64, 128, 16), (64, 64, 64), (64, 128, 64),
                                   (50, 64, 80), (128, 64, 192)])
def test_wgmma_gemm(shape):
    m, n, k = shape
    bn = min(n, 128)
    a, b = bf16((m, k)), bf16((n, k))
    prog = W.wgmma_gemm(m, n, k, bn)
    verify_program(prog)
    c = simulate(prog, {"A": a, "B": b})["C"]
    assert rel_err(c, a.astype(np.float64) @ b.astype(np.float64).T) < 1e-5
    np.testing.assert_array_equal(c, reference(a, b))


def test_wgmma_n256():
    a, b = bf16((64, 64)), bf16((256, 64))
    c = simulate(W.wgmma_gemm(64, 256, 64, 256), {"A": a, "B": b})["C"]
    np.testing.assert_array_equal(c, reference(a, b))


def swapped_d(s):
    """Accumulator registers in the wrong order: d[i] <-> d[i ^ 2] (rows g and g + 8 swapped)."""
    if isinstance(s, Wgmma):
        return replace(s, d=tuple(s.d[i ^ 2] for i in range(len(s.d))))
    return s


def wrong_layout(i, w, g, t):
    """Rows of neighbouring lane groups swapped (g ^ 1): a bijective lane-mapping slip, so no
    race hides it, only the numbers."""
    return W.c_layout(i, w, E.sub(E.add(g, 1), E.mul(E.mod(g, 2), 2)), t)


@pytest.mark.parametrize("bug", ["swapped_registers", "wrong_store_mapping", "desc_no_swizzle",
                                 "desc_64b_swizzle", "tma_no_swizzle"])
def test_wrong_mapping_or_swizzle_gives_wrong_numbers(bug):
    a, b = bf16((64, 64)), bf16((64, 64))
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    good = simulate(W.wgmma_gemm(64, 64, 64), {"A": a, "B": b})["C"]
    assert rel_err(good, ref) < 1e-5
    prog = {
        "swapped_registers": lambda: rewrite(W.wgmma_gemm(64, 64, 64), swapped_d),
        "wrong_store_mapping": lambda: W.wgmma_gemm(64, 64, 64, layout=wrong_layout),
        "desc_no_swizzle": lambda: W.wgmma_gemm(64, 64, 64, desc_swizzle="none"),
        "desc_64b_swizzle": lambda: W.wgmma_gemm(64, 64, 64, desc_swizzle="64B"),
        "tma_no_swizzle": lambda: W.wgmma_gemm(64, 64, 64, swizzle="none", desc_swizzle="128B"),
    }[bug]()
    out = simulate(prog, {"A": a, "B": b})["C"]
    finite = np.nan_to_num(out.astype(np.float64), nan=0.0)
    assert np.linalg.norm(finite - ref) / np.linalg.norm(ref) > 0.1
