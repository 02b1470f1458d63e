"""The explicit softmax(q @ k^T * s + mask) @ v pattern fuses into the same one kernel: scale on
the scores or folded into q, additive mask, GQA written as repeat_kv (expand + reshape), fp16
with the softmax in float32 (Llama's eager attention). A row whose scores are all -inf gives NaN,
as eager does."""
import numpy as np
import torch
from attention_helpers import check_fused


def _qkv(b, h, lq, lk, d, dtype=torch.float32):
    return (torch.randn(b, h, lq, d, dtype=dtype), torch.randn(b, h, lk, d, dtype=dtype),
            torch.randn(b, h, lk, d, dtype=dtype))


def test_scale_on_scores():
    def fn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v
    check_fused(fn, _qkv(2, 2, 7, 33, 16))


def test_scale_folded_into_q():
    def fn(q, k, v):
        return torch.softmax((q * 0.25) @ k.transpose(-1, -2), dim=-1) @ v
    check_fused(fn, _qkv(1, 3, 33, 7, 40))


def test_additive_mask_fully_masked_row_is_nan_like_eager():
    q, k, v = _qkv(1, 2, 7, 33, 16)
    mask = torch.randn(7, 33)
    mask[4] = float("-inf")

    def fn(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-1, -2) / 4 + mask, -1) @ v
    prog = check_fused(fn, (q, k, v, mask))
    out = prog.run_numpy((q, k, v, mask))[0]
    assert np.isnan(out[:, :, 4]).all() and not np.isnan(np.delete(out, 4, axis=2)).any()


def test_repeat_kv_gqa():
    q = torch.randn(1, 4, 9, 16)
    k, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)

    def repeat_kv(x, n):
        b, h, s, d = x.shape
        return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)

    def fn(q, k, v):
        return torch.softmax(q @ repeat_kv(k, 2).transpose(2, 3) * 0.25, dim=-1) @ repeat_kv(v, 2)
    check_fused(fn, (q, k, v))


def test_llama_style_fp16_softmax_in_float32():
    q, k, v = _qkv(1, 2, 7, 7, 32, dtype=torch.float16)
    causal = torch.full((7, 7), float("-inf")).triu(1).half()

    def fn(q, k, v, causal):
        w = torch.matmul(q, k.transpose(2, 3)) * 32 ** -0.5 + causal
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)
    check_fused(fn, (q, k, v, causal))
