"""A QuantLinear compiled for the GPU (sm_90): its dequantization fuses into the product (one
kernel, or a split-K pair; no dequantized weight stored), the simulator's result matches eager on the same quantized weights, and NVRTC compiles
the CUDA (skipped, saying why, where NVRTC is not installed). The GPU itself has not run it."""
import math

import pytest
import torch

import strata
from strata.bench.check import verify
from strata.quant.formats import QuantLinear


@pytest.mark.parametrize("fmt,k", [("q8_0", 96), ("q4_0", 96), ("q4_k", 512), ("q5_k", 512), ("q6_k", 512)])
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


class _GatedDown(torch.nn.Module):
    """down(SiLU(gate) * up) with the two halves given: a decode MLP's last product."""

    def __init__(self, fmt: str, k: int, n: int):
        super().__init__()
        self.down = QuantLinear.from_linear(torch.nn.Linear(k, n, bias=False), fmt)

    def forward(self, gate, up):
        return self.down(torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("m", [1, 3])
def test_a_byte_gemv_stores_a_transcendental_vector_once(fmt, m):
    """Fused, each of the N weight rows' threads would compute SiLU(gate) * up over all of K
    again: an elementwise kernel stores it once (bf16, as eager holds it) and the rows read it;
    PROLOGUE=fuse keeps it fused. Both give eager's numbers. K = 160 (5 blocks a row, 37 x 5
    scales): the scales' last 16-byte window would pass their end, so no byte rows (the
    simulator caught the read past the end before)."""
    from strata.core.context import Context
    torch.manual_seed(1)
    for k, knobs, stored in ((256, {}, True), (256, {"PROLOGUE": "fuse"}, False), (160, {}, False)):
        layer = _GatedDown(fmt, k, 37).eval()
        args = tuple(torch.randn(1, m, k).to(torch.bfloat16) for _ in range(2))
        prog = strata.compile(layer, args, device="sim", ctx=Context(target="sm_90a", knobs=knobs))
        names = [t.name for t in prog.lowered.tile.kernels]
        assert any(n.endswith("_prologue") for n in names) == stored, (k, knobs, names)
        assert all(r.passed for r in verify(prog, layer, args, True).outputs)
