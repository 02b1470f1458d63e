"""Causal key blocks past a query block's diagonal are never read, and only the diagonal (and
tail) blocks apply the mask: keys no query may see are poisoned with NaN and the result must not
change; treating every block as whole (masks skipped) must fail; exact for Lq != Lk."""
import pytest
import torch
from attention_helpers import check_fused, compare_with

from strata.core.expr import Const, Var
from strata.kernel_ir import lower_attention
from strata.kernel_ir.ir import Let

F = torch.nn.functional


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _qkv(lq, lk, d=16):
    return torch.randn(1, 2, lq, d), torch.randn(1, 2, lk, d), torch.randn(1, 2, lk, d)


@pytest.mark.parametrize("splits", ["1", "2"])
def test_keys_past_the_causal_limit_are_never_read(splits):
    """20 queries (top-left causal) see keys 0..19; keys from 32 on are NaN and must not matter
    (an unskipped block would add 0 * NaN)."""
    q, k, v = _qkv(20, 200)
    knobs = {"BLOCK_M": "16", "BLOCK_N": "16", "ROW_THREADS": "2", "KV_SPLITS": splits}
    prog = check_fused(_causal, (q, k, v), knobs=knobs, kernels=1 if splits == "1" else 2)
    kp, vp = k.clone(), v.clone()
    kp[:, :, 32:], vp[:, :, 32:] = float("nan"), float("nan")
    compare_with(prog, _causal, (q, kp, vp), (q, k, v))


@pytest.mark.parametrize("lq,lk", [(40, 40), (24, 56), (56, 24)])
def test_causal_several_query_blocks(lq, lk):
    knobs = {"BLOCK_M": "16", "BLOCK_N": "8", "ROW_THREADS": "2"}
    check_fused(_causal, _qkv(lq, lk), knobs=knobs)


def test_whole_blocks_skip_the_mask(monkeypatch):
    """If every block in the range counted as whole (no mask), causal results must be wrong:
    the mask really is applied in the diagonal blocks and only there."""
    x = _qkv(32, 32)
    knobs = {"BLOCK_M": "16", "BLOCK_N": "8", "ROW_THREADS": "2"}
    check_fused(_causal, x, knobs=knobs)
    real = lower_attention.key_range

    def broken(at, I, idx):
        return [Let("kv_mid", idx, Var("kv_hi", idx)) if s.var == "kv_mid" else s
                for s in real(at, I, idx)]
    monkeypatch.setattr(lower_attention, "key_range", broken)
    with pytest.raises(AssertionError, match="rel err"):
        check_fused(_causal, x, knobs=knobs)


def test_unbounded_key_loop_reads_the_poison(monkeypatch):
    """The poison test can fail: with the key loop running to Lk, NaN keys reach the result."""
    q, k, v = _qkv(20, 200)
    knobs = {"BLOCK_M": "16", "BLOCK_N": "16", "ROW_THREADS": "2"}
    real = lower_attention.key_range

    def unbounded(at, I, idx):
        return [Let("kv_hi", idx, Const(200)) if s.var == "kv_hi" else s for s in real(at, I, idx)]
    monkeypatch.setattr(lower_attention, "key_range", unbounded)
    prog = check_fused(_causal, (q, k, v), knobs=knobs)          # still exact: masked anyway
    kp, vp = k.clone(), v.clone()
    kp[:, :, 32:], vp[:, :, 32:] = float("nan"), float("nan")
    with pytest.raises(AssertionError, match="rel err"):
        compare_with(prog, _causal, (q, kp, vp), (q, k, v))


def _decode(q, k, v, position):
    """A decode step's attention over a static cache: transformers' additive mask of the
    dtype's minimum past the position, the position an input."""
    slots = torch.arange(k.shape[-2])
    mask = torch.where(slots <= position, 0.0, torch.finfo(q.dtype).min).view(1, -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("splits", ["1", "4"])
def test_a_decode_step_reads_keys_only_up_to_its_position(splits):
    """The bound is loaded once per block (kv_pos): with the position at 37 of 256 slots, the
    slots from 48 on are NaN and must not matter; whole splits past it read nothing."""
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 256, 16), torch.randn(1, 2, 256, 16)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    position = torch.tensor([37])
    knobs = {"BLOCK_N": "16", "KV_SPLITS": splits}
    prog = check_fused(_decode, (q, k, v, position), knobs=knobs, kernels=1 if splits == "1" else 2)
    (tk,) = [t for t in prog.lowered.tile.kernels if getattr(t.attention, "causal", None)]
    assert tk.attention.causal.loaded.buf == "position"
    kp, vp = k.clone(), v.clone()
    kp[:, :, 48:], vp[:, :, 48:] = float("nan"), float("nan")
    compare_with(prog, _decode, (q, kp, vp, position), (q, k, v, position))
    compare_with(prog, _decode, (q, k, v, torch.tensor([200])), (q, k, v, torch.tensor([200])))


def test_an_additive_mask_that_can_leave_a_row_without_keys_is_not_a_bound():
    """where(j <= i - 1, 0, MIN): query 0 sees no key, and eager gives it uniform weights over
    every key, so the key loop must not stop at its limit."""
    def fn(q, k, v):
        i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.where(j <= i - 1, 0.0, torch.finfo(q.dtype).min))
    prog = check_fused(fn, _qkv(20, 20), knobs={"BLOCK_M": "16", "BLOCK_N": "8", "ROW_THREADS": "2"})
    assert all(getattr(t.attention, "causal", None) is None for t in prog.lowered.tile.kernels)
