"""On a GPU of sm_80 or newer: the tensor-core kernels (cp.async -> ldmatrix -> mma.sync) compute
what the simulator computes, which checks the simulator's fragment layouts against the hardware.
Skipped where no such GPU is present.

ldmatrix moves bits, so it must agree exactly; mma sums in an order the PTX ISA leaves open, so
GPU and simulator agree to about f32 rounding (1e-4, where a wrong lane mapping gives errors of
order 1), and both agree with float64 within 1e-3."""
import sys
from pathlib import Path

import numpy as np
import pytest

from strata.core import dtypes
from strata.kernel_ir.sim import simulate

from test_gpu_matches_sim import ARCH, run_on_gpu  # noqa: E402  (skips without cuda-bindings)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import mma_builders as MB  # noqa: E402

pytestmark = pytest.mark.skipif(ARCH is None or int(ARCH[3:]) < 80, reason="no sm_80+ GPU")

RNG = np.random.default_rng(17)


def operands(shape_a, shape_b, dtype):
    a, b = (RNG.standard_normal(s).astype(np.float32) for s in (shape_a, shape_b))
    if dtype == "f16":
        return a.astype(np.float16), b.astype(np.float16)
    return dtypes.round_to(a, "bf16"), dtypes.round_to(b, "bf16")


@pytest.mark.parametrize("num,trans", [(1, False), (2, True), (4, False), (4, True)])
def test_ldmatrix_layout_on_gpu(num, trans):
    prog = MB.ldmatrix_probe(num, trans)
    np.testing.assert_array_equal(run_on_gpu(prog, {})["out"], simulate(prog, {})["out"])


CASES = [("16x8", 16, 8, 16, lambda dt: MB.mma_16x8(dt)),
         ("13x8", 13, 8, 16, lambda dt: MB.mma_16x8(dt, 13)),
         ("tiled_64", 64, 64, 128, lambda dt: MB.mma_tiled(64, 64, 128, dt)),
         ("tiled_128", 128, 128, 256, lambda dt: MB.mma_tiled(128, 128, 256, dt))]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_mma_kernels_on_gpu(case, dtype):
    _, m, n, k, make = case
    prog = make(dtype)
    a, b = operands((m, k), (k, n), dtype)
    got = run_on_gpu(prog, {"A": a, "B": b})["C"].astype(np.float64)
    want = simulate(prog, {"A": a, "B": b})["C"].astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert not np.isnan(got).any()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4    # a wrong layout: ~1
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3
