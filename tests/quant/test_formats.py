"""Quantizing a weight: each value comes back within half a step of the scale the format stores."""
import pytest
import torch

from strata.quant.formats import BLOCK, dequantize, quantize_weight


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
