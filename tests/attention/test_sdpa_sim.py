"""aten.scaled_dot_product_attention as one flash-attention kernel, through the simulator, against
eager float64: causal (torch's top-left convention, also for Lq != Lk), boolean and additive masks
(broadcast, with fully masked rows), explicit scale, GQA, decode shapes, odd head dims."""
import pytest
import torch
from attention_helpers import check_fused

F = torch.nn.functional


def _qkv(b, hq, hk, lq, lk, d, dv=None, dtype=torch.float32):
    dv = dv or d
    return (torch.randn(b, hq, lq, d, dtype=dtype), torch.randn(b, hk, lk, d, dtype=dtype),
            torch.randn(b, hk, lk, dv, dtype=dtype))


@pytest.mark.parametrize("lq,lk", [(1, 1), (7, 7), (33, 33), (7, 33), (33, 7)])
def test_causal(lq, lk):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    check_fused(fn, _qkv(2, 2, 2, lq, lk, 16))


@pytest.mark.parametrize("d,dv", [(40, 40), (64, 64), (16, 24)])
def test_head_dims(d, dv):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=0.2)
    check_fused(fn, _qkv(1, 2, 2, 7, 33, d, dv))


def test_bool_mask_broadcast_with_fully_masked_row():
    q, k, v = _qkv(2, 2, 2, 7, 33, 16)
    mask = torch.rand(7, 33) > 0.4
    mask[3] = False                        # eager gives zeros for this row, not NaN

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    prog = check_fused(fn, (q, k, v, mask))
    out = prog.run_numpy((q, k, v, mask))[0]
    assert (out[:, :, 3] == 0).all()


def test_additive_mask_with_inf_and_finite_min_rows():
    q, k, v = _qkv(2, 3, 3, 7, 33, 16)
    mask = torch.randn(2, 1, 7, 33)
    mask[:, :, 2] = float("-inf")                       # eager: zeros
    mask[:, :, 5] = torch.finfo(torch.float32).min      # eager: uniform weights
    mask[:, :, 6, :20] = float("-inf")

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    check_fused(fn, (q, k, v, mask))


def test_gqa_with_explicit_scale():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True, is_causal=True)
    check_fused(fn, _qkv(1, 6, 2, 9, 9, 16))


@pytest.mark.parametrize("causal", [False, True])
def test_decode_long_kv(causal):
    """One query against 257 keys (not a multiple of BLOCK_N); causal keeps only key 0 (top-left).
    Decode splits the keys by default (split kernel + combine)."""
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    prog = check_fused(fn, _qkv(1, 2, 2, 1, 257, 64), kernels=2)
    assert dict(prog.lowered.tile.kernels[0].knobs)["KV_SPLITS"] > 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    q, k, v = _qkv(1, 4, 2, 7, 33, 64, dtype=dtype)
    mask = torch.rand(1, 1, 7, 33) > 0.3

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    prog = check_fused(fn, (q, k, v, mask))
    assert prog.lowered.kernel.kernels[0].params[-1].dtype == ("f16" if dtype == torch.float16 else "bf16")


def test_decode_bf16_head_dim_128():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)
    check_fused(fn, _qkv(1, 2, 2, 1, 70, 128, dtype=torch.bfloat16))


@pytest.mark.slow
def test_long_prefill_257():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    check_fused(fn, _qkv(1, 1, 1, 257, 257, 16))
