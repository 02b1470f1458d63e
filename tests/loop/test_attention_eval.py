"""Loop IR stays executable with a fused Attention statement: loop/eval.py runs it as a plain
float64 softmax attention on the statement's operands, matching eager float64 (SDPA causal with
Lq != Lk and GQA, boolean masks with a fully masked row -> 0, the explicit pattern's -inf row ->
NaN like eager, fp16 within its tolerance; fp32 to 1e-6: the IR holds f32 constants such as
the scale), and a wrong result would be caught."""
import numpy as np
import pytest
import torch

import strata
from strata.bench import check
from strata.loop import eval as loop_eval
from strata.loop.attention import attention_of

F = torch.nn.functional


def _eval(fn, inputs):
    prog = strata.compile(fn, inputs, until="loop")
    lp = prog.lowered.loop
    assert any(attention_of(k) for k in lp.kernels)
    feed = {name: x.numpy() for name, x in zip(prog.torch_program.inputs, inputs)}
    return list(loop_eval.run(lp, feed).values())[0], check.eager_reference(fn, inputs)[0]


def _rel(got, ref):
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    return np.linalg.norm(got[ok] - ref[ok]) / np.linalg.norm(ref[ok])


@pytest.mark.parametrize("lq,lk", [(7, 33), (33, 7), (1, 257)])
def test_sdpa_causal_gqa(lq, lk):
    q, k, v = torch.randn(2, 4, lq, 16), torch.randn(2, 2, lk, 16), torch.randn(2, 2, lk, 24)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.3)
    got, ref = _eval(fn, (q, k, v))
    assert _rel(got, ref) < 1e-6


def test_bool_mask_fully_masked_row_gives_zeros():
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    mask = torch.rand(5, 9) > 0.5
    mask[2] = False

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got, ref = _eval(fn, (q, k, v, mask))
    assert (got[:, :, 2] == 0).all() and _rel(got, ref) < 1e-6


def test_explicit_pattern_minus_inf_row_is_nan():
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    mask = torch.randn(5, 9)
    mask[3] = float("-inf")

    def fn(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.5 + mask, -1) @ v
    got, ref = _eval(fn, (q, k, v, mask))
    assert np.isnan(got[:, :, 3]).all() and _rel(got, ref) < 1e-6


def test_fp16_llama_style():
    q, k, v = (torch.randn(1, 2, 7, 32, dtype=torch.float16) for _ in range(3))

    def fn(q, k, v):
        w = torch.softmax(q @ k.transpose(2, 3) * 32 ** -0.5, dim=-1, dtype=torch.float32)
        return w.to(q.dtype) @ v
    got, ref = _eval(fn, (q, k, v))
    assert _rel(got, ref) < 1e-2


def test_wrong_scale_is_caught():
    """The comparison can fail: a different scale in the reference gives a clear mismatch."""
    q, k, v = (torch.randn(1, 2, 7, 16) for _ in range(3))
    got, _ = _eval(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), (q, k, v))
    ref = check.eager_reference(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.4),
                                (q, k, v))[0]
    assert _rel(got, ref) > 1e-3
