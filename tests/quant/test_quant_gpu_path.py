"""A QuantLinear compiled for the GPU (sm_90): its dequantization fuses into the product (one
kernel), the simulator's result matches eager on the same quantized weights, and NVRTC compiles
the CUDA (skipped, saying why, where NVRTC is not installed). The GPU itself has not run it."""
import pytest
import torch

import strata
from strata.check import verify
from strata.quant.formats import QuantLinear


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("m", [1, 37])
def test_a_quantized_linear_for_the_gpu(fmt, m):
    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(96, 40), fmt).eval()
    x = torch.randn(1, m, 96).to(torch.bfloat16)
    prog = strata.compile(layer, (x,), device="sim")
    assert len(prog.lowered.kernel.kernels) == 1
    assert all(r.passed for r in verify(prog, layer, (x,), True).outputs)
    nvrtc = pytest.importorskip("strata.runtime.nvrtc")
    try:
        nvrtc.nvrtc_version()
    except Exception as e:  # noqa: BLE001 - the library or its bindings are missing
        pytest.skip(f"NVRTC is not usable here: {e}")
    assert nvrtc.compile_cuda(prog.ir("cuda"), "sm_90", want="ptx")
