"""Split-KV (flash-decoding): KV_SPLITS blocks share one query block's keys and a combine kernel
merges their partials exactly. Awkward splits (257 keys; splits that do not divide the key
blocks, one left empty), masks, GQA, 16-bit, the default for decode and prefill, and a broken
combine that must fail."""
import numpy as np
import pytest
import torch
from attention_helpers import check_fused

import strata
from strata.core.context import Context
from strata.core.expr import Const
from strata.kernel_ir import lower_attention_combine

F = torch.nn.functional


def _qkv(b, hq, hk, lq, lk, d, dtype=torch.float32):
    return (torch.randn(b, hq, lq, d, dtype=dtype), torch.randn(b, hk, lk, d, dtype=dtype),
            torch.randn(b, hk, lk, d, dtype=dtype))


def _sdpa(causal=False):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


@pytest.mark.parametrize("splits,block_n", [("2", "32"), ("4", "32"), ("3", "16")])
def test_decode_257_keys(splits, block_n):
    """9 key blocks in 2 (5 + 4) or 4 (3 + 3 + 3 + an empty one); 17 of 16 in 3 (6 + 6 + 5)."""
    prog = check_fused(_sdpa(), _qkv(1, 2, 2, 1, 257, 64),
                       knobs={"KV_SPLITS": splits, "BLOCK_N": block_n}, kernels=2)
    names = [k.name for k in prog.lowered.kernel.kernels]
    assert names[0].endswith("_splitkv") and names[1].endswith("_combine")
    assert f"KV_SPLITS={splits}" in prog.lowered.text("tile")


def test_gqa_causal_short_queries():
    """Lq = 3 < Lk causal (top-left): every split but the first sees no key at all."""
    check_fused(_sdpa(True), _qkv(2, 4, 2, 3, 100, 32), knobs={"KV_SPLITS": "3", "BLOCK_N": "16"},
                kernels=2)


def test_bool_mask_fully_masked_row_gives_zeros():
    q, k, v = _qkv(1, 2, 2, 2, 70, 16)
    mask = torch.rand(2, 70) > 0.5
    mask[1] = False
    mask[0, :40] = False                   # the first split of row 0 sees only masked keys

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    prog = check_fused(fn, (q, k, v, mask), knobs={"KV_SPLITS": "3", "BLOCK_N": "16"}, kernels=2)
    out = prog.run_numpy((q, k, v, mask))[0]
    assert (out[:, :, 1] == 0).all() and np.isfinite(out).all()


def test_explicit_pattern_fully_masked_row_is_nan_like_eager():
    q, k, v = _qkv(1, 2, 2, 2, 40, 16)
    mask = torch.randn(2, 40)
    mask[1] = float("-inf")

    def fn(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + mask, -1) @ v
    prog = check_fused(fn, (q, k, v, mask), knobs={"KV_SPLITS": "2", "BLOCK_N": "8"}, kernels=2)
    out = prog.run_numpy((q, k, v, mask))[0]
    assert np.isnan(out[:, :, 1]).all() and not np.isnan(out[:, :, 0]).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_decode(dtype):
    check_fused(_sdpa(), _qkv(1, 4, 2, 1, 100, 64, dtype=dtype), knobs={"KV_SPLITS": "3"}, kernels=2)


def test_broken_combine_fails(monkeypatch):
    """With every split weighted 1 instead of exp(m_s - M), the result must be wrong."""
    q, k, v = _qkv(1, 1, 1, 1, 64, 16)
    k[:, :, 32:] *= 3                       # the splits see different maxima
    knobs = {"KV_SPLITS": "2", "BLOCK_N": "16"}
    check_fused(_sdpa(), (q, k, v), knobs=knobs, kernels=2)
    monkeypatch.setattr(lower_attention_combine, "combine_weight", lambda m_s, m: Const(1.0, "f32"))
    with pytest.raises(AssertionError, match="rel err"):
        check_fused(_sdpa(), (q, k, v), knobs=knobs, kernels=2)


def test_default_splits_fill_the_gpu_for_decode_not_prefill():
    """TinyLlama decode (32 query heads sharing 4 KV heads, one query, 2048 keys): a block per
    KV head group (GQA_GROUP=8), split so that the blocks about fill the GPU; MHA decode splits
    its 32 heads; the causal (1, 8, 512, 64) prefill stays one kernel. Compile only (no sim)."""
    dec = strata.compile(_sdpa(), _qkv(1, 32, 4, 1, 2048, 64), until="tile")
    (first, comb) = dec.lowered.tile.kernels
    knobs = dict(first.knobs)
    assert knobs["GQA_GROUP"] == 8 and first.grid == 4 * knobs["KV_SPLITS"] >= 128
    mha = strata.compile(_sdpa(), _qkv(1, 32, 32, 1, 2048, 64), until="tile").lowered.tile.kernels[0]
    knobs = dict(mha.knobs)
    assert knobs["GQA_GROUP"] == 1 and mha.grid == 32 * knobs["KV_SPLITS"] >= 132
    assert comb.name.endswith("_combine")
    ctx = Context()
    pre = strata.compile(_sdpa(True), [torch.randn(1, 8, 512, 64) for _ in range(3)], ctx=ctx,
                         until="tile")
    assert len(pre.lowered.tile.kernels) == 1 and "KV_SPLITS=1" in pre.lowered.text("tile")
    assert any("KV_SPLITS declined" in m and "prefill" in m for m in ctx.messages)


def test_bad_split_knob_is_one_clear_error():
    with pytest.raises(ValueError, match="KV_SPLITS=20"):
        strata.compile(_sdpa(), _qkv(1, 2, 2, 1, 257, 64), ctx=Context(knobs={"KV_SPLITS": "20"}),
                       until="tile")
