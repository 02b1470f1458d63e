"""The fused kernel's structure: one kernel, knobs printed and pinnable, NVRTC at a real size,
no S x S buffer, and the online-softmax rescale is load-bearing (breaking it must fail)."""
import pytest
import torch
from attention_helpers import check_fused
from conftest import compile_with_nvrtc

import strata
from strata.core.context import Context
from strata.core.expr import Const
from strata.kernel_ir import lower_attention

F = torch.nn.functional


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_causal_1x8x512x64_is_one_kernel_and_compiles():
    x = [torch.randn(1, 8, 512, 64) for _ in range(3)]
    prog = strata.compile(_causal, x, until="cuda")
    kernels = prog.lowered.kernel.kernels
    assert len(kernels) == 1
    assert [b.shape for b in prog.lowered.kernel.buffers if b.kind == "temp"] == []
    compile_with_nvrtc(prog)
    tile = prog.lowered.text("tile")
    for knob in ("BLOCK_M=", "BLOCK_N=", "ROW_THREADS=", "KV_SPLITS=1", "GQA_GROUP=1"):
        assert knob in tile


def test_knobs_pin_the_schedule():
    x = [torch.randn(1, 2, 13, 16) for _ in range(3)]
    prog = check_fused(_causal, x, knobs={"BLOCK_M": "4", "BLOCK_N": "8", "ROW_THREADS": "8"})
    assert "BLOCK_M=4, BLOCK_N=8, GQA_GROUP=1, KV_SPLITS=1, ROW_THREADS=8" in prog.lowered.text("tile")
    k = prog.lowered.kernel.kernels[0]
    assert k.block == 32 and k.grid == 2 * 4


def test_bad_knob_is_one_clear_error():
    x = [torch.randn(1, 2, 13, 16) for _ in range(3)]
    with pytest.raises(ValueError, match="ROW_THREADS=3"):
        strata.compile(_causal, x, ctx=Context(knobs={"ROW_THREADS": "3"}), until="tile")


def test_broken_rescale_fails(monkeypatch):
    """With the accumulator never rescaled when the running max moves, results must be wrong."""
    q, k, v = torch.randn(1, 1, 4, 16), torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16)
    k[:, :, 20:] *= 4                               # later key blocks raise the running max

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)
    knobs = {"BLOCK_N": "8"}
    check_fused(fn, (q, k, v), knobs=knobs)        # correct as built
    monkeypatch.setattr(lower_attention, "rescale", lambda m_old, m_new: Const(1.0, "f32"))
    with pytest.raises(AssertionError, match="rel err"):
        check_fused(fn, (q, k, v), knobs=knobs)


def test_partial_pattern_is_not_fused():
    """Attention weights that are also returned cannot be fused away: the softmax stays."""
    def fn(q, k, v):
        w = torch.softmax(q @ k.transpose(-1, -2), -1)
        return w @ v, w
    x = [torch.randn(1, 2, 7, 16) for _ in range(3)]
    ctx = Context()
    prog = strata.compile(fn, x, ctx=ctx, until="tile")
    assert all(k.mode != "attention" for k in prog.lowered.tile.kernels)
    assert any("attention at" in m and "declined" in m for m in ctx.messages)
