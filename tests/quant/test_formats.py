"""Quantizing a weight: each value comes back within half a step of the scale the format stores."""
import pytest
import torch

from torch._subclasses.fake_tensor import FakeTensorMode

from strata.core.errors import StrataError
from strata.quant.formats import BLOCK, QuantLinear, dequantize, int8_blocks, quantize, quantize_weight
from strata.quant.kquants import ROWS


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_strata_formats_round_by_the_scale_they_store(fmt):
    """int8 and int4 (a Hugging Face checkpoint quantized at load) quantize by the bf16 scale
    they store, so no value is off by more than half its step; an fp32 scale rounded to bf16
    afterwards put the largest values of a row up to a quarter step further off."""
    w = torch.randn(257, 3 * BLOCK + 5, generator=torch.Generator().manual_seed(3)) \
        * torch.rand(257, 1, generator=torch.Generator().manual_seed(4)) * 10
    w[7] = 0                                                        # an all-zero row
    qs, d = quantize_weight(w, fmt)
    back = dequantize(qs, d, fmt)[:, :w.shape[1]]
    step = d.float().reshape(len(w), -1)
    step = step.repeat_interleave(BLOCK, 1)[:, :w.shape[1]] if step.shape[1] > 1 else step
    assert torch.all((back - w).abs() <= 0.5 * step * (1 + 1e-6) + 1e-30)
    assert back[7].abs().max() == 0
    if fmt == "int8":
        assert qs.abs().max() <= 127


def test_int8_activations_round_whole_blocks_as_the_kernels_do():
    """The eager reference of QDOT=vnni (cli_generate's near-tie verdict): x rounded per block of
    32 to q * max|x| / 127, q an integer within 127; a row of partial blocks is left as it is."""
    torch.manual_seed(0)
    x = torch.randn(3, 64)
    b = int8_blocks(x).view(3, 2, 32)
    d = x.view(3, 2, 32).abs().amax(-1, keepdim=True) / 127
    q = b / d
    assert torch.allclose(q, q.round(), atol=1e-3) and q.abs().max() <= 127 + 1e-3
    assert (b - x.view(3, 2, 32)).abs().le(d / 2 + 1e-7).all() and not torch.equal(b.flatten(1), x)
    for k in (64, 40):
        layer = QuantLinear.from_linear(torch.nn.Linear(k, 5), "q8_0")
        x = torch.randn(2, k)
        plain = layer(x)
        layer.int8_activations = True
        assert torch.equal(layer(x), plain) == (k % 32 != 0)


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k"])
def test_k_quant_linears_dequantize_as_gguf_does_and_pad_k(fmt):
    """A K-quant QuantLinear's parts dequantize bit for bit as the gguf package dequantizes the
    GGUF bytes they came from, and hold about as many bytes (q6_k: its 6-bit q, 12 bytes a
    block; q5_k: 20 bytes a block of 32); K = 300 is padded to 512 with zeros and sliced back; an all-zero super-block stays
    zero; quantizing works on fake tensors (a model compiled without weights)."""
    gguf = pytest.importorskip("gguf")
    torch.manual_seed(0)
    linear = torch.nn.Linear(300, 7)
    with torch.no_grad():
        linear.weight[2, :256] = 0
    layer = QuantLinear.from_linear(linear, fmt)
    padded = torch.nn.functional.pad(linear.weight.detach(), (0, 212))
    rows = ROWS[fmt](padded)
    want = gguf.quants.dequantize(rows.numpy(), gguf.GGMLQuantizationType[fmt.upper()])
    assert torch.equal(layer.weight(torch.float32), torch.from_numpy(want)[:, :300])
    assert layer.weight(torch.float32)[2, :256].abs().max() == 0
    held = sum(b.numel() * b.element_size() for b in layer.buffers())
    assert held <= rows.numel() + 7 * 2 * 512 // 32, held    # q4_k, q5_k: + 6-bit scales and mins
    err = (layer.weight(torch.float32) - linear.weight).abs().max().item()
    assert err < {"q4_k": 0.01, "q5_k": 0.005, "q6_k": 0.002}[fmt], err
    with FakeTensorMode():
        fake = QuantLinear.from_linear(torch.nn.Linear(512, 3), fmt)
    assert {n: tuple(b.shape) for n, b in fake.named_buffers()} == \
        {n: (3, *b.shape[1:]) for n, b in QuantLinear.from_linear(torch.nn.Linear(512, 5), fmt).named_buffers()}


def test_q4_k_m_and_q5_k_m_pick_q6_k_for_the_output_and_down_projections():
    def model():
        return torch.nn.ModuleDict({"lm_head": torch.nn.Linear(256, 8),
                                    "mlp": torch.nn.ModuleDict({"down_proj": torch.nn.Linear(256, 8),
                                                                "up_proj": torch.nn.Linear(256, 8)})})
    for mix, rest in (("q4_k_m", "q4_k"), ("q5_k_m", "q5_k")):
        m = quantize(model(), mix)
        assert [m.lm_head.fmt, m.mlp.down_proj.fmt, m.mlp.up_proj.fmt] == ["q6_k", "q6_k", rest]
    with pytest.raises(StrataError, match="unknown quantization 'q3_k'"):
        quantize(model(), "q3_k")
    for fmt in ("q4_k_m", "q6_k"):      # more than one (qs, d) pair: one sentence, not q4_0's
        with pytest.raises(StrataError, match=rf"{fmt} is not one \(qs, d\) pair"):
            quantize_weight(torch.zeros(2, 32), fmt)
    with pytest.raises(StrataError, match=r"q4_k is not one \(qs, d\) pair"):
        dequantize(torch.zeros(2, 1, 16, dtype=torch.uint8), torch.zeros(2, 1, 1), "q4_k")
