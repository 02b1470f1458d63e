"""A QuantLinear compiled for the GPU (sm_90): its dequantization fuses into the product (one
kernel, or a split-K pair; no dequantized weight stored), the simulator's result matches eager on the same quantized weights, and NVRTC compiles
the CUDA (skipped, saying why, where NVRTC is not installed). The GPU itself has not run it."""
import math

import pytest
import torch

import strata
from strata.bench.check import verify
from strata.quant.formats import QuantLinear


@pytest.mark.parametrize("fmt,k", [("q8_0", 96), ("q4_0", 96), ("q4_k", 512), ("q6_k", 512)])
@pytest.mark.parametrize("m", [1, 37])
def test_a_quantized_linear_for_the_gpu(fmt, k, m):
    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(k, 40), fmt).eval()
    x = torch.randn(1, m, k).to(torch.bfloat16)
    prog = strata.compile(layer, (x,), device="sim")
    kp = prog.lowered.kernel              # fused: no dequantized weight is ever stored
    assert not any(b.kind not in ("input", "weight", "output") and math.prod(b.shape) >= 40 * k
                   for b in kp.buffers), [(b.name, b.kind, b.shape) for b in kp.buffers]
    assert len(kp.kernels) == 1 or any("splitk" in kn.name for kn in kp.kernels)
    assert all(r.passed for r in verify(prog, layer, (x,), True).outputs)
    nvrtc = pytest.importorskip("strata.runtime.nvrtc")
    try:
        nvrtc.nvrtc_version()
    except Exception as e:  # noqa: BLE001 - the library or its bindings are missing
        pytest.skip(f"NVRTC is not usable here: {e}")
    assert nvrtc.compile_cuda(prog.ir("cuda"), "sm_90", want="ptx")
