"""CPU contractions on AMX tiles (cpu_matmul FORM=amx, codegen/c_amx.py): run natively and compared
with float64 eager at odd shapes (M, N not multiples of 16, K not a multiple of 32), with fused
epilogues, on the C emulation of the tile ops (every machine) and on the instructions (where the
CPU has AMX); and the default rule, on targets built by name."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from conftest import HAS_CC
from strata.core.targets import TARGETS, host
from test_cpu_dot import BF16, assert_matches, cpu_compile, knobs_of

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")
HAS_AMX = host().has("amx_bf16")
REAL = pytest.param("real", marks=pytest.mark.skipif(
    not HAS_AMX, reason="this CPU has no AMX-BF16: only the emulation of the tiles runs here"))
AMX = replace(TARGETS["cpu"], name="cpu-amx", features=frozenset(
    {"sse2", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"}))
AVX512 = replace(AMX, name="cpu-avx512", features=AMX.features - {"amx_tile", "amx_bf16"})


@pytest.fixture(params=["emulated", REAL])
def tiles(request, monkeypatch):
    """Which tile ops the kernels run: STRATA_AMX_EMULATE is read on every call."""
    monkeypatch.setenv("STRATA_AMX_EMULATE", "1" if request.param == "emulated" else "0")
    return request.param


def compile_amx(fn, inputs, **knobs):
    prog, log = cpu_compile(fn, inputs, {"FORM": "amx", **knobs})
    return prog, prog.source("c"), log


@pytest.mark.parametrize("m,n,k", [(16, 16, 32), (37, 45, 200), (50, 33, 98), (17, 8, 64),
                                   (70, 64, 2)], ids=str)
def test_a_bf16_linear_on_tiles_matches_eager(m, n, k, tiles):
    x, w = torch.randn(m, k).to(BF16), torch.randn(n, k).to(BF16)
    prog, c, _ = compile_amx(F.linear, (x, w))
    assert knobs_of(prog, "k_linear_reduce")["FORM"] == "amx"
    assert ("st_tile_dp(st_amx" in c) == (k >= 32), "the tile loop runs 32 K a step"
    assert_matches(prog, F.linear, (x, w))


def test_one_row_and_an_odd_k_match_eager(tiles):
    """M=1 is a matrix-vector product and odd K has no pairs: both leave the tiles, correctly."""
    for m, k in ((1, 64), (20, 33)):
        x, w = torch.randn(m, k).to(BF16), torch.randn(24, k).to(BF16)
        prog, c, _ = compile_amx(F.linear, (x, w))
        assert "st_tile_dp(st_amx" not in c
        assert_matches(prog, F.linear, (x, w))


def test_bias_activation_and_gate_up_epilogues_on_tiles_match_eager(tiles):
    def biased(x, w, b):
        return F.gelu(F.linear(x, w, b))

    def mlp(x, wg, wu):                 # two reductions per register tile, SiLU(gate) * up after
        return F.silu(F.linear(x, wg)) * F.linear(x, wu)
    x, w, b = torch.randn(45, 96).to(BF16), torch.randn(40, 96).to(BF16), torch.randn(40).to(BF16)
    wg, wu = torch.randn(50, 96).to(BF16), torch.randn(50, 96).to(BF16)
    for fn, args in ((biased, (x, w, b)), (mlp, (x, wg, wu))):
        prog, c, _ = compile_amx(fn, args)
        assert c.count("st_tile_dp(st_amx, 0") >= (2 if fn is mlp else 1)
        assert_matches(prog, fn, args)


def test_x_at_w_of_a_k_by_n_weight_on_16_row_tiles_matches_eager(tiles):
    x, w = torch.randn(16, 130).to(BF16), torch.randn(130, 70).to(BF16)
    prog, c, _ = compile_amx(torch.matmul, (x, w))
    assert knobs_of(prog, "k_matmul_reduce")["THREAD_M"] == 16 and "st_tile_dp(st_amx" in c
    assert_matches(prog, torch.matmul, (x, w))


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX-BF16: the instructions cannot run")
def test_the_instructions_and_the_emulation_give_the_same_bits(monkeypatch):
    x, w, b = torch.randn(37, 200).to(BF16), torch.randn(45, 200).to(BF16), torch.randn(45).to(BF16)
    prog, _, _ = compile_amx(F.linear, (x, w, b))
    out = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("STRATA_AMX_EMULATE", mode)
        out[mode] = prog(x, w, b)
    assert torch.equal(out["0"], out["1"])


def test_the_default_picks_amx_only_on_a_target_with_amx():
    x, w = torch.randn(64, 256).to(BF16), torch.randn(96, 256).to(BF16)
    forms = {t.name: knobs_of(cpu_compile(F.linear, (x, w), target=t)[0], "k_linear_reduce")["FORM"]
             for t in (AMX, AVX512, TARGETS["cpu"])}
    assert forms == {"cpu-amx": "amx", "cpu-avx512": "dot", "cpu": "outer"}
    f32 = knobs_of(cpu_compile(F.linear, (x.float(), w.float()), target=AMX)[0], "k_linear_reduce")
    assert f32["FORM"] != "amx"
