"""GQA: the query heads of one KV head share a block, so each K/V tile is loaded once for all
of them (GQA_GROUP). Proved from the operands (an MHA program gets no group, and pinning one is
an error), exact with causal Lq != Lk, head-dependent masks, splits and 16-bit inputs."""
import pytest
import torch
from attention_helpers import check_fused

import strata
from strata.core.context import Context

F = torch.nn.functional


def _qkv(b, hq, hk, lq, lk, d, dtype=torch.float32):
    return (torch.randn(b, hq, lq, d, dtype=dtype), torch.randn(b, hk, lk, d, dtype=dtype),
            torch.randn(b, hk, lk, d, dtype=dtype))


def _sdpa(causal=False):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


@pytest.mark.parametrize("lq,lk,knobs", [
    (1, 70, {}),                                             # decode, default group of 4
    (3, 40, {"KV_SPLITS": "2", "BLOCK_N": "16"}),            # causal, Lq != Lk, split
    (5, 9, {"GQA_GROUP": "2", "BLOCK_M": "8"}),              # half a group per block
])
def test_grouped_heads_share_kv(lq, lk, knobs):
    x = _qkv(2, 8, 2, lq, lk, 16)
    splits = int(knobs.get("KV_SPLITS", "1"))
    prog = check_fused(_sdpa(True), x, knobs=knobs, kernels=2 if splits > 1 else 1)
    group = int(knobs.get("GQA_GROUP", "4"))
    tk = prog.lowered.tile.kernels[0]
    assert dict(tk.knobs)["GQA_GROUP"] == group
    assert tk.grid == 2 * 8 // group * tk.attention.m_blocks * splits


def test_head_dependent_mask():
    q, k, v = _qkv(1, 4, 2, 2, 33, 16)
    mask = torch.randn(1, 4, 2, 33)
    mask[:, 1, 0] = float("-inf")

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    prog = check_fused(fn, (q, k, v, mask))
    assert "GQA_GROUP=2" in prog.lowered.text("tile")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    check_fused(_sdpa(), _qkv(1, 4, 1, 1, 50, 64, dtype=dtype), knobs={"KV_SPLITS": "2"}, kernels=2)


def test_mha_gets_no_group_and_pinning_one_fails():
    x = _qkv(1, 4, 4, 1, 20, 16)
    prog = strata.compile(_sdpa(), x, until="tile")
    assert "GQA_GROUP=1" in prog.lowered.text("tile")
    with pytest.raises(ValueError, match="GQA_GROUP=2"):
        strata.compile(_sdpa(), x, ctx=Context(knobs={"GQA_GROUP": "2"}), until="tile")
