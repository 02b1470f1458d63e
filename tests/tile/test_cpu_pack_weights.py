"""cpu_pack_weights: a contraction's panel of a weight is packed by its own kernel, which the native
runtime runs once when it loads the program (KernelProgram.once); compared with float64 eager at
odd shapes (N not a multiple of the panel, K not a multiple of 32, M edge tiles) in the AMX form
(emulated tiles and, where the CPU has AMX, the instructions), the pairs form and the f32 outer
form; a weight given as an input and PACK=call keep the packing in the block; a runtime short
of memory packs on every call."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import HAS_CC
from strata.runtime import native
from test_cpu_amx import tiles  # noqa: F401  (the fixture: emulated tiles, and real ones on AMX)
from test_cpu_dot import BF16, HAS_DP, assert_matches, cpu_compile, knobs_of

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


def linear(k, n, dtype=BF16, bias=False):
    torch.manual_seed(k + n)
    return nn.Linear(k, n, bias=bias, dtype=dtype).eval()


def packed_names(prog) -> tuple:
    return prog.lowered.kernel.once


@pytest.mark.parametrize("m,n,k", [(64, 61, 106), (67, 96, 64)], ids=str)
def test_a_weight_packed_once_on_tiles_matches_eager(m, n, k, tiles):  # noqa: F811
    layer, x = linear(k, n, bias=True), torch.randn(m, k).to(BF16)
    prog, log = cpu_compile(layer, (x,), {"FORM": "amx"})
    assert packed_names(prog) == ("k_linear_reduce_pack",), log
    assert "p_weight_amx" in prog.source("c") and "st_prefetch_l2(" in prog.source("c")
    runtime = prog.runtime
    assert runtime._once == [0], "the packing kernel ran when the program was loaded"
    assert "p_weight_amx" in runtime.weights and "p_weight_amx" not in runtime.plan.offsets
    assert_matches(prog, layer, (x,))
    before = prog(x)
    runtime.weights["p_weight"].zero_()     # the calls read the packed copy, not the weight
    assert torch.equal(prog(x), before)


def test_the_mlp_packs_each_weight_once_and_matches_eager(tiles):  # noqa: F811
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up, self.down = linear(64, 48), linear(64, 48), linear(48, 64)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))
    mlp, x = MLP(), torch.randn(66, 64).to(BF16)
    prog, log = cpu_compile(mlp, (x,), {"FORM": "amx"})
    assert len(packed_names(prog)) == 3, log
    assert_matches(prog, mlp, (x,))


@pytest.mark.parametrize("form,dtype", [("pairs", BF16), ("outer", torch.float32)])
def test_the_pairs_and_outer_forms_read_packed_weights(form, dtype):
    layer, x = linear(70, 45, dtype), torch.randn(37, 70).to(dtype)
    runs = form == "outer" or HAS_DP            # the pairs form needs AVX512-BF16: else compiled
    prog, log = cpu_compile(layer, (x,), {"FORM": form}, None if runs else "cpu-znver4")
    assert knobs_of(prog, "k_linear_reduce")["FORM"] == form
    assert packed_names(prog) == ("k_linear_reduce_pack",), log
    assert "p_weight_panel" in prog.source("c")
    if runs:
        assert_matches(prog, layer, (x,))


def test_a_weight_given_as_an_input_and_pack_call_keep_the_block_packing():
    x, w = torch.randn(64, 96).to(BF16), torch.randn(40, 96).to(BF16)
    prog, _ = cpu_compile(F.linear, (x, w), {"FORM": "amx"})     # w is an input: not a constant
    assert packed_names(prog) == () and len(prog.lowered.kernel.kernels) == 1
    layer = linear(96, 40)
    prog, log = cpu_compile(layer, (x,), {"FORM": "amx", "PACK": "call"})
    assert packed_names(prog) == () and "PACK=call pinned" in log
    assert_matches(prog, layer, (x,))


def test_short_of_memory_the_packing_kernel_runs_on_every_call(monkeypatch, capfd):
    monkeypatch.setattr(native, "available_bytes", lambda: 1000)
    layer, x = linear(64, 48), torch.randn(64, 64).to(BF16)
    prog, _ = cpu_compile(layer, (x,), {"FORM": "amx"})
    assert prog.runtime._once == [] and "packed on every call" in capfd.readouterr().err
    assert_matches(prog, layer, (x,))
