"""bf16 and fp16 weights as rows of 16-byte loads (tile/gemv.py) where INSTR=fma is pinned.

Why: a decode projection (M <= 4) on mma.sync runs 16-row tiles for one row of activations; the
CUDA-core rows read each weight row with 16-byte loads and no shared memory, the form cuBLAS's
GEMV takes. Which is faster is for a GPU run to say (`strata.bench.gemv_sweep`), so the rows are
a pinnable choice, checked here against eager on the simulator.
"""
import pytest
import torch

import strata
from strata.bench import check
from strata.core.context import Context

ARCH = "sm_90a"


def _compile(layer, x, knobs):
    with torch.no_grad():
        return strata.compile(layer.eval(), (x,), device="sim", ctx=Context(target=ARCH, knobs=knobs))


def _passes(prog, layer, x):
    for res in check.verify(prog, layer, (x,), True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("m,n", [(1, 64), (3, 37), (4, 64)])
def test_two_byte_weights_take_the_rows_when_fma_is_pinned(dtype, m, n):
    torch.manual_seed(0)
    layer = torch.nn.Linear(1024, n, bias=True, dtype=dtype)
    x = torch.randn(m, 1024, dtype=dtype)
    prog = _compile(layer, x, {"INSTR": "fma"})
    _passes(prog, layer, x)
    gemv = prog.lowered.tile.kernels[0]
    assert gemv.mode == "rows" and dict(gemv.knobs)["VEC"] == 8, (gemv.name, gemv.mode, gemv.knobs)


def test_rows_split_along_k_when_the_rows_are_few():
    """8 weight rows cannot fill the SMs: K is split and a second kernel adds the partials."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(2048, 8, bias=False, dtype=torch.bfloat16)
    x = torch.randn(1, 2048, dtype=torch.bfloat16)
    prog = _compile(layer, x, {"INSTR": "fma"})
    _passes(prog, layer, x)
    split = prog.lowered.tile.kernels[0]
    assert split.name.endswith("_splitk") and split.mode == "rows" and dict(split.knobs)["SPLIT_K"] > 1


@pytest.mark.parametrize("m,k,pinned", [(5, 1024, {"INSTR": "fma"}), (1, 1001, {"INSTR": "fma"}),
                                         (1, 1024, {})], ids=["five-rows", "k-odd", "default"])
def test_other_contractions_keep_their_schedule(m, k, pinned):
    """Past 4 rows, a K that is no whole number of 8-element (16-byte) runs, and the default
    (mma) are not rows; each still matches eager."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(k, 48, bias=False, dtype=torch.bfloat16)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    prog = _compile(layer, x, pinned)
    _passes(prog, layer, x)
    assert all(t.mode != "rows" or dict(t.knobs).get("VEC", 1) == 1 for t in prog.lowered.tile.kernels)


@pytest.mark.parametrize("fmt,vec,got", [("bf16", 32, 32), ("bf16", 64, 64), ("q4_0", 64, 32)])
def test_a_pinned_vec_takes_more_points_a_step(fmt, vec, got):
    """VEC=32 or 64: two or four 16-byte windows of a bf16 weight row a step, still eager's
    numbers; where its windows are not whole (Q4_0's scales at 64) the rows keep their own."""
    from strata.quant.formats import QuantLinear
    torch.manual_seed(0)
    dense = torch.nn.Linear(1024, 40, bias=True)
    layer = dense.to(torch.bfloat16) if fmt == "bf16" else QuantLinear.from_linear(dense, fmt)
    x = torch.randn(1, 1024, dtype=torch.bfloat16)
    prog = _compile(layer, x, {"INSTR": "fma", "VEC": vec} if fmt == "bf16" else {"VEC": vec})
    _passes(prog, layer, x)
    gemv = prog.lowered.tile.kernels[0]
    assert gemv.mode == "rows" and dict(gemv.knobs)["VEC"] == got, (gemv.name, gemv.knobs)


def test_a_transcendental_vector_is_stored_once_before_bf16_rows():
    """down(SiLU(gate) * up) on bf16 rows (INSTR=fma pinned): as before byte weights, an
    elementwise kernel stores SiLU(gate) * up once instead of every weight row's threads
    computing it again; PROLOGUE=fuse keeps it fused. Both give eager's numbers."""
    class GatedDown(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down = torch.nn.Linear(256, 37, bias=False, dtype=torch.bfloat16)

        def forward(self, gate, up):
            return self.down(torch.nn.functional.silu(gate) * up)

    torch.manual_seed(1)
    layer = GatedDown().eval()
    args = tuple(torch.randn(1, 2, 256, dtype=torch.bfloat16) for _ in range(2))
    for knobs, stored in (({"INSTR": "fma"}, True), ({"INSTR": "fma", "PROLOGUE": "fuse"}, False)):
        with torch.no_grad():
            prog = strata.compile(layer, args, device="sim", ctx=Context(target=ARCH, knobs=knobs))
        names = [t.name for t in prog.lowered.tile.kernels]
        assert any(n.endswith("_prologue") for n in names) == stored, (knobs, names)
        assert any(t.mode == "rows" for t in prog.lowered.tile.kernels), names
        for res in check.verify(prog, layer, args, True).outputs:
            assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g}"
