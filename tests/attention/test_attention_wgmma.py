"""The attention on Hopper's wgmma (INSTR=wgmma, kernel_ir/lower_attention_wgmma.py): both
products by warpgroup MMA, A (Q's and P's fragments) in registers, K and V read from 128-byte
swizzled shared rows. Through the simulator (PTX's fragment and swizzle layouts, wgmma's groups,
fences and in-flight registers) against eager float64 at awkward shapes; a wrong swizzle or a
missing fence fails; the pin declines where it must."""
import pytest
import torch
from attention_helpers import masked_sdpa, sdpa_mask

import strata
from strata.bench import check
from strata.core.context import Context
from strata.core.errors import KnobError, SimError
from strata.kernel_ir import lower_attention_wgmma as W
from strata.kernel_ir.ir import Wgmma, WgmmaFence, WgmmaWait, walk

F = torch.nn.functional
ARCH = "sm_90a"


def _sdpa(causal=False, gqa=False):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def _qkv(hq, hk, lq, lk, d, dtype=torch.bfloat16, e=None):
    torch.manual_seed(0)
    return (torch.randn(1, hq, lq, d, dtype=dtype), torch.randn(1, hk, lk, d, dtype=dtype),
            torch.randn(1, hk, lk, e or d, dtype=dtype))


def _run(fn, x, **knobs):
    prog = strata.compile(fn, x, device="sim", ctx=Context(target=ARCH, knobs={"INSTR": "wgmma", **knobs}))
    report = check.verify(prog, fn, x, True)
    return prog, report


def _passes(fn, x, **knobs):
    prog, report = _run(fn, x, **knobs)
    for res in report.outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"
    tk = prog.lowered.tile.kernels[0]
    assert dict(tk.knobs)["INSTR"] == "wgmma"
    assert any(isinstance(s, Wgmma) and s.a_regs for s in walk(prog.lowered.kernel.kernels[0].body))
    return prog


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("lq,lk,d,causal", [
    (100, 100, 64, True),       # double-buffered K/V, two query blocks, query and key tails
    (97, 97, 128, True),        # two 64-column sub-tiles a row, one K/V buffer
    (33, 70, 80, False),        # head dim padded to 128 in K/V, 96 in Q's fragments
    (1, 70, 64, False),         # one query row: 63 rows past Lq
])
def test_wgmma_attention_matches_eager(dtype, lq, lk, d, causal):
    _passes(_sdpa(causal), _qkv(2, 2, lq, lk, d, dtype))


def test_gqa_two_warpgroups_and_kv_splits():
    """Two query heads a K/V tile (BLOCK_M 128: two warpgroups), and a split key range whose
    partials the combine kernel adds."""
    prog = _passes(_sdpa(causal=True, gqa=True), _qkv(4, 2, 64, 64, 64), GQA_GROUP=2)
    assert prog.lowered.tile.kernels[0].block == 256
    prog = _passes(_sdpa(), _qkv(2, 2, 5, 200, 64), KV_SPLITS=2)
    assert len(prog.lowered.kernel.kernels) == 2


def test_value_head_dim_differs():
    _passes(_sdpa(), _qkv(2, 2, 33, 33, 40, torch.float16, e=24))


def test_a_plain_row_layout_gives_wrong_numbers(monkeypatch):
    """The fill writes K and V unswizzled while wgmma reads them swizzled: wrong answers (the
    simulator's addresses swizzle as the hardware's do)."""
    monkeypatch.setattr(W._WgmmaAttention, "place",
                        lambda self, row, col: W.add(W.mul(W.floordiv(col, W.ROW), self.bn * W.ROW),
                                                     W.add(W.mul(row, W.ROW), W.mod(col, W.ROW))))
    _, report = _run(_sdpa(True), _qkv(2, 2, 70, 70, 64))
    assert not all(r.passed for r in report.outputs)


def test_a_missing_fence_before_p_v_fails(monkeypatch):
    """P's registers are written by PackHalf2 and O's by the rescale: without the wgmma.fence
    before P V the simulator stops, as PTX asks."""
    pv = W._WgmmaAttention.pv
    monkeypatch.setattr(W._WgmmaAttention, "pv",
                        lambda self: [s for s in pv(self) if not isinstance(s, WgmmaFence)])
    with pytest.raises(SimError, match="missing wgmma.fence"):
        _run(_sdpa(), _qkv(2, 2, 33, 33, 64))


def test_k_and_v_unfenced_for_the_async_proxy_fail(monkeypatch):
    """K and V come by cp.async (ordinary writes); wgmma reads them through the async proxy, so
    each thread fences its copies before the barrier: without it the simulator stops."""
    monkeypatch.setattr(W._WgmmaAttention, "landed", lambda self: [])
    with pytest.raises(SimError, match="missing fence.proxy.async"):
        _run(_sdpa(True), _qkv(2, 2, 70, 70, 64))


def test_p_rewritten_while_its_wgmma_runs_fails(monkeypatch):
    """Without the wait after P V, the next key block packs P into registers a wgmma in flight
    still reads (or reads O before it is done): the simulator stops."""
    pv = W._WgmmaAttention.pv
    monkeypatch.setattr(W._WgmmaAttention, "pv",
                        lambda self: [s for s in pv(self) if not isinstance(s, WgmmaWait)])
    with pytest.raises(SimError, match="missing wgmma.wait_group"):
        _run(_sdpa(), _qkv(2, 2, 33, 150, 64))


@pytest.mark.parametrize("target,knobs,says", [
    ("sm_80", {}, "has no wgmma"),
    (ARCH, {"BLOCK_M": 32}, "not whole warpgroups"),
])
def test_the_pin_declines_in_one_sentence(target, knobs, says):
    with pytest.raises(KnobError, match=says):
        strata.compile(_sdpa(), _qkv(2, 2, 33, 33, 64), device="sim",
                       ctx=Context(target=target, knobs={"INSTR": "wgmma", **knobs}))


def test_the_default_stays_on_mma_sync():
    """Not measured on a GPU yet: without the pin sm_90a keeps mma.sync."""
    prog = strata.compile(_sdpa(True), _qkv(2, 2, 70, 70, 64), device="sim", ctx=Context(target=ARCH))
    assert dict(prog.lowered.tile.kernels[0].knobs)["INSTR"] == "mma"


@pytest.mark.parametrize("kind", ["additive", "bool"])
def test_a_mask_as_transformers_passes_it(kind):
    """An additive mask with a -inf run, or a boolean one (key 0 always kept), on the fragments
    the wgmma scores land in."""
    _passes(masked_sdpa, (*_qkv(2, 2, 33, 70, 64, torch.float16), sdpa_mask(kind)))
