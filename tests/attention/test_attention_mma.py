"""The tensor-core attention (INSTR=mma, kernel_ir/lower_attention_mma.py): mma.sync m16n8k16 for
S = Q K^T and O += P V, the online softmax on the accumulator fragments. Run through the
simulator (exact fragment layouts, races) against eager float64 at awkward shapes; the knob pins
both ways and declines where it must; a wrong P packing gives wrong answers; a long causal
bf16 prefill is one kernel with mma.sync that NVRTC compiles for sm_80 and sm_90."""
import pytest
import torch
from attention_helpers import check_fused, masked_sdpa, sdpa_mask
from conftest import compile_with_nvrtc, run_and_compare

import strata
from strata.bench import check
from strata.core.context import Context
from strata.kernel_ir import lower_attention_mma
from strata.kernel_ir.ir import Mma

F = torch.nn.functional
DT = {"f16": torch.float16, "bf16": torch.bfloat16}


def _sdpa(causal=False, gqa=False):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def _qkv(b, hq, hk, lq, lk, d, dtype, e=None):
    return (torch.randn(b, hq, lq, d, dtype=dtype), torch.randn(b, hk, lk, d, dtype=dtype),
            torch.randn(b, hk, lk, e or d, dtype=dtype))


def _mma_kernels(prog) -> int:
    """How many of the program's tile kernels took the mma path (and their Kernel IR has Mma)."""
    n = 0
    for tk, k in zip(prog.lowered.tile.kernels, prog.lowered.kernel.kernels):
        if dict(tk.knobs).get("INSTR") == "mma":
            assert any(isinstance(s, Mma) for s in _walk(k.body))
            n += 1
    return n


def _walk(body):
    for s in body:
        yield s
        for sub in (getattr(s, "body", ()), getattr(s, "then", ()), getattr(s, "orelse", ())):
            yield from _walk(sub)


def _fma(prog) -> bool:
    """The CUDA-core schedule: ROW_THREADS recorded, no INSTR=mma (INSTR=fma when pinned)."""
    knobs = dict(prog.lowered.tile.kernels[0].knobs)
    return "ROW_THREADS" in knobs and knobs.get("INSTR", "fma") == "fma"


def _check(fn, inputs, knobs=None, kernels=None):
    """Through the simulator vs eager float64; one mma kernel (and a combine with split-KV)."""
    prog = run_and_compare(fn, inputs, contraction=True, ctx=Context(knobs=dict(knobs or {})))
    splits = dict(prog.lowered.tile.kernels[0].knobs)["KV_SPLITS"]
    assert len(prog.lowered.kernel.kernels) == (kernels or (2 if splits > 1 else 1))
    assert _mma_kernels(prog) == 1
    return prog


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("lq,lk,d,causal", [
    (1, 70, 64, False),         # decode row: one warp, 15 rows past Lq
    (7, 33, 128, True),         # Lq != Lk causal, key tail
    (33, 7, 64, False),         # one short key block, query tail
    (70, 70, 128, True),        # two query blocks, whole + diagonal key blocks
    (70, 1, 64, True),          # one key
])
def test_sdpa_mma(dtype, lq, lk, d, causal):
    x = _qkv(1, 2, 2, lq, lk, d, DT[dtype])
    _check(_sdpa(causal), x)


def test_value_head_dim_differs_and_not_16():
    """d = 40, e = 24: zero-padded to 48 and 32 in shared memory, the output guarded."""
    _check(_sdpa(), _qkv(1, 2, 2, 33, 33, 40, torch.float16, e=24))


@pytest.mark.parametrize("lq,lk,knobs,kernels", [
    (1, 70, {}, 2),                                 # decode: one block per KV head, split
    (7, 33, {"KV_SPLITS": "1"}, 1),                 # causal prefill, 4 heads x 8 rows... a block
    (33, 70, {"GQA_GROUP": "2", "BLOCK_N": "16"}, 1),
])
def test_gqa_mma(lq, lk, knobs, kernels):
    x = _qkv(1, 8, 2, lq, lk, 64, torch.bfloat16)
    prog = _check(_sdpa(causal=True, gqa=True), x, knobs=knobs, kernels=kernels)
    assert dict(prog.lowered.tile.kernels[0].knobs)["GQA_GROUP"] == int(knobs.get("GQA_GROUP", 4))


@pytest.mark.parametrize("kind", ["additive", "bool"])
def test_mask_mma(kind):
    """A mask (a fully masked row included: NaN like eager for an additive -inf row, as the
    CUDA-core path does)."""
    q, k, v = _qkv(1, 2, 2, 33, 70, 64, torch.float16)
    _check(masked_sdpa, (q, k, v, sdpa_mask(kind)))


def test_knob_pins_fma_and_declines():
    x = _qkv(1, 2, 2, 33, 33, 64, torch.float16)
    prog = check_fused(_sdpa(True), x, knobs={"INSTR": "fma"})
    assert _mma_kernels(prog) == 0 and _fma(prog)
    # fp32: fma by default with a logged reason; pinning mma is an error
    x32 = _qkv(1, 2, 2, 9, 9, 16, torch.float32)
    ctx = Context()
    prog = strata.compile(_sdpa(), x32, ctx=ctx, until="tile")
    assert _fma(prog)
    assert any("INSTR=mma declined" in m and "f32" in m for m in ctx.messages)
    with pytest.raises(ValueError, match="INSTR=mma"):
        strata.compile(_sdpa(), x32, ctx=Context(knobs={"INSTR": "mma"}), until="tile")
    # an older target: fma
    ctx = Context(target="sm_75")
    prog = strata.compile(_sdpa(), x, ctx=ctx, until="tile")
    assert _fma(prog)
    assert any("sm_75" in m for m in ctx.messages)
    # a CUDA-core schedule pinned: fma (a BLOCK_M not a multiple of 16 likewise)
    for knobs in ({"ROW_THREADS": "4"}, {"BLOCK_M": "8"}):
        prog = strata.compile(_sdpa(), x, ctx=Context(knobs=knobs), until="tile")
        assert _fma(prog)


def test_knob_pins_mma():
    x = _qkv(1, 2, 2, 33, 33, 64, torch.float16)
    prog = _check(_sdpa(), x, knobs={"INSTR": "mma", "BLOCK_M": "32", "BLOCK_N": "16"})
    assert prog.lowered.kernel.kernels[0].block == 64       # two warps of 16 rows


def test_wrong_p_packing_fails(monkeypatch):
    """Swapping the two keys of each register pair of P (c0 <-> c1) is a plausible bug: it must
    give wrong answers, so the simulator checks the packing for real."""
    good = lower_attention_mma.p_fragment

    def swapped(kk):
        return tuple((j, hi, lo) for j, lo, hi in good(kk))
    monkeypatch.setattr(lower_attention_mma, "p_fragment", swapped)
    fn = _sdpa()
    x = _qkv(1, 2, 2, 33, 40, 64, torch.float16)
    prog = strata.compile(fn, x, ctx=Context(knobs={"KV_SPLITS": "1"}))
    assert _mma_kernels(prog) == 1
    got = prog.run_numpy(x)
    ref = check.eager_reference(fn, x)
    res = check.compare("out", "f16", got[0], ref[0], check.tolerance("f16", True))
    assert not res.passed


def test_long_causal_bf16_is_one_mma_kernel():
    x = _qkv(1, 8, 8, 512, 512, 64, torch.bfloat16)
    prog = strata.compile(_sdpa(causal=True), x)
    assert len(prog.lowered.kernel.kernels) == 1
    assert _mma_kernels(prog) == 1
    src = prog.source("cuda")
    assert "mma.sync.aligned.m16n8k16" in src and "bf16" in src
    compile_with_nvrtc(prog)
