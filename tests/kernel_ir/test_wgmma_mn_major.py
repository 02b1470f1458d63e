"""wgmma with an MN-major ("transposed", imm-trans-b = 1) B operand in the simulator: the
descriptor reading against the PTX ISA's canonical layouts (transcribed here from the ISA's CuTe
notation, independently of sim_wgmma.py), and a hand-built TMA -> wgmma kernel computing
C = A @ B with B stored (k, n), N contiguous, against NumPy; a wrong LBO, SBO or a missing
transpose bit gives wrong numbers."""
import numpy as np
import pytest
import wgmma_builders as W

from strata.core import dtypes
from strata.kernel_ir import sim_wgmma
from strata.kernel_ir.sim import simulate
from strata.kernel_ir.verify import verify_program

RNG = np.random.default_rng(31)


def bf16(shape):
    return dtypes.round_to(RNG.standard_normal(shape).astype(np.float32), "bf16")


def cute(shape, stride, coord):
    """A CuTe layout (nested shape:stride) at a flat coordinate, colexicographic."""
    if isinstance(shape, int):
        return coord * stride
    out = 0
    for s, d in zip(shape, stride):
        size = int(np.prod(_flat(s)))
        out += cute(s, d, coord % size)
        coord //= size
    return out


def _flat(s):
    return [s] if isinstance(s, int) else [x for y in s for x in _flat(y)]


def cute_swizzle(bits: int, byte: int) -> int:
    """Swizzle<bits, 4, 3> of a byte offset: bits 7.. (bits of them) XORed into bits 4.."""
    return byte ^ ((byte >> 3) & (((1 << bits) - 1) << 4))


# The PTX ISA (9.7.15.5.1.2.1.3, Canonical Layouts) for bf16 (T = 8), MN-major; the first three
# are the ISA's worked examples (Figures 168-170) with their LBO / SBO, the 128B one its
# canonical ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) with m = 2 (LBO, SBO in elements there).
ISA_MN = [
    ("none", 0, ((8, 1, 2), (8, 2)), ((1, 8, 64), (8, 128)), 128 * 2, 64 * 2),
    ("32B", 1, ((8, 2, 2), (8, 2)), ((1, 8, 128), (16, 256)), 128 * 2, 256 * 2),
    ("64B", 2, ((8, 4, 2), (8, 2)), ((1, 8, 256), (32, 512)), 256 * 2, 512 * 2),
    ("128B", 3, ((8, 8, 2), (8, 2)), ((1, 8, 4096), (64, 512)), 4096 * 2, 512 * 2),
]


@pytest.mark.parametrize("mode,bits,shape,stride,lbo,sbo", ISA_MN, ids=[c[0] for c in ISA_MN])
def test_mn_major_descriptor_reads_the_isa_layout(mode, bits, shape, stride, lbo, sbo):
    rows = int(np.prod(_flat(shape[0])))
    start = 4096                                   # a 1024-byte aligned pattern start
    desc = int(sim_wgmma.encode(np.array([start]), lbo, sbo, mode)[0])
    addr = sim_wgmma.operand_addresses(desc, rows, mn_major=True)
    assert addr.shape == (rows, 16)
    for r in range(rows):
        for k in range(16):
            want = start + cute_swizzle(bits, 2 * cute(shape, stride, r + rows * k))
            assert addr[r, k] == want, (r, k)
    # every element of the (rows, 16) operand at its own address
    assert len(np.unique(addr)) == rows * 16
    # K-major reading of the same descriptor is another layout
    assert (sim_wgmma.operand_addresses(desc, rows) != addr).any()


def reference_kn(a, b):
    """C = A @ B (B (k, n)) in f32, one k at a time in increasing k (the simulator's order)."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc += a[:, k, None] * b[None, k, :]
    return acc


@pytest.mark.parametrize("m,n,k,bn,stages", [(64, 64, 64, 64, 2), (64, 128, 192, 128, 1),
                                             (70, 128, 72, 64, 2), (128, 192, 16, 64, 2),
                                             (64, 64, 200, 64, 2)], ids=str)
def test_mn_major_b_gemm(m, n, k, bn, stages):
    a, b = bf16((m, k)), bf16((k, n))
    prog = W.wgmma_gemm(m, n, k, bn, stages, b_kn=True)
    verify_program(prog)
    c = simulate(prog, {"A": a, "B": b})["C"]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-5
    np.testing.assert_array_equal(c, reference_kn(a, b))


@pytest.mark.parametrize("bug,k", [("lbo_of_k_major", 128), ("sbo_half", 128), ("no_transpose", 16),
                                   ("tma_no_swizzle", 64)])
def test_wrong_mn_major_descriptor_gives_wrong_numbers(bug, k):
    m, n, bn = 64, 128, 128
    a, b = bf16((m, k)), bf16((k, n))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    good = simulate(W.wgmma_gemm(m, n, k, bn, 1, b_kn=True), {"A": a, "B": b})["C"]
    assert np.linalg.norm(good - ref) / np.linalg.norm(ref) < 1e-5
    if bug == "tma_no_swizzle":        # A stays K-major 128B; only B's map loses its swizzle
        prog = _unswizzled_b(W.wgmma_gemm(m, n, k, bn, 1, b_kn=True))
    else:
        kw = {"lbo_of_k_major": {"b_lbo": 16}, "sbo_half": {"b_sbo": 512},
              "no_transpose": {"trans_b": False}}[bug]
        prog = W.wgmma_gemm(m, n, k, bn, 1, b_kn=True, **kw)
    verify_program(prog)
    out = simulate(prog, {"A": a, "B": b})["C"]
    finite = np.nan_to_num(out.astype(np.float64), nan=0.0)
    assert np.linalg.norm(finite - ref) / np.linalg.norm(ref) > 0.1


def _unswizzled_b(prog):
    from dataclasses import replace
    k = prog.kernels[0]
    params = tuple(replace(p, tensor_map=replace(p.tensor_map, swizzle="none"))
                   if p.name == "B" else p for p in k.params)
    return replace(prog, kernels=[replace(k, params=params)])
