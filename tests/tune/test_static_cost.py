"""tune/static_cost.py: a contraction's compute term from llvm-mca's cycles for its hot loop, on
a CPU strata may not be running on (issue 26's static cost), and `strata tune --cost mca`."""
import shutil

import pytest
import torch

import strata
from conftest import HAS_CC
from strata.cli import main
from strata.core.context import Context
from strata.tune import cost, static_cost

needs_mca = pytest.mark.skipif(shutil.which("llvm-mca") is None or not HAS_CC,
                               reason="llvm-mca or a C compiler is not installed (apt-get install "
                                      "llvm gcc)")
MATMUL = "torch.randn(96, 256) @ torch.randn(256, 128)"


def test_flops_per_iteration_count_lanes_and_products():
    assert static_cost.flops_per_iteration([
        "vmovaps (%rdx),%zmm1", "vfmadd231ps %zmm1,%zmm7,%zmm17",   # 16 lanes x 2
        "vfmadd231ps 0x20(%rax),%ymm2,%ymm3",                        # 8 x 2, a memory operand
        "vdpbf16ps %zmm1,%zmm2,%zmm3",                               # 16 x 2 products x 2
        "jne strata_loop"]) == 32 + 16 + 64
    assert static_cost.flops_per_iteration(["tdpbf16ps %tmm2,%tmm1,%tmm0"]) == 16 * 16 * 32 * 2
    assert static_cost.flops_per_iteration(["fmla	v0.4s, v1.4s, v2.4s",
                                            "bfdot	v3.4s, v1.8h, v2.8h"]) == 8 + 16
    assert static_cost.flops_per_iteration(["vaddps %ymm1,%ymm2,%ymm3",      # not an FMA
                                            "fmla	z0.s, p0/m, z1.s, z2.s"]) == 0   # SVE: no width


def test_compute_ms_is_iterations_times_cycles_over_the_cores():
    # 1e9 FLOPs at 100 a pass: 1e7 passes of 4 cycles, 2 GHz, 2 cores: 10 ms
    assert static_cost.compute_ms(1e9, (4.0, 100.0), 2) == pytest.approx(10.0)


def _lowered(target: str, **knobs):
    a, w = torch.randn(96, 256), torch.randn(256, 128)
    if target == "cpu-spr":
        a, w = a.bfloat16(), w.bfloat16()
    ctx = Context(target=target, knobs=knobs, tuned=False)
    return strata.compile(lambda a, w: a @ w, (a, w), ctx=ctx, device="cpu", until="c").lowered


@needs_mca
def test_a_foreign_cpus_contraction_is_priced_from_its_machine_code():
    """cpu-spr's bf16 contraction (AMX) and cpu-avx2's fp32 one, compiled here for their CPUs:
    the hot loop's FLOPs come from its tile or ymm FMAs, llvm-mca prices it, and a 1-row register
    tile (a load for every FMA) is modelled slower than the default."""
    spr = _lowered("cpu-spr")
    [(name, loop)] = static_cost.hot_loop_costs(spr.source, spr.target).items()
    assert name == spr.kernel.kernels[0].name and loop[1] % (16 * 16 * 32 * 2) == 0 and loop[0] > 0
    low = _lowered("cpu-avx2")
    [(_, (cycles, flops))] = static_cost.hot_loop_costs(low.source, low.target).items()
    assert flops % 16 == 0 and flops >= 64 and cycles > 0
    default = cost.program_ms(low.kernel.kernels, low.target, low.source)
    one_row = _lowered("cpu-avx2", THREAD_M=1)
    assert cost.program_ms(one_row.kernel.kernels, one_row.target, one_row.source) > 1.5 * default


@needs_mca
def test_a_source_the_compiler_hangs_on_is_ranked_last(monkeypatch):
    low = _lowered("cpu-avx2")
    monkeypatch.setattr(static_cost, "COMPILE_S", 0.001)
    assert cost.program_ms(low.kernel.kernels, low.target, low.source) == float("inf")


def test_cost_mca_without_llvm_is_one_sentence(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("strata.runtime.mca.shutil.which", lambda name: None)
    assert main(["tune", "-c", MATMUL, "--cost", "mca"]) != 0
    assert "--cost mca needs llvm-mca, which is not installed" in capsys.readouterr().err


@needs_mca
def test_tune_ranks_schedules_for_a_cpu_it_does_not_run_on(monkeypatch, capsys, tmp_path):
    """`strata tune --target cpu-spr` on any x86 machine: every schedule that fits is compiled
    for Sapphire Rapids and ranked by llvm-mca; nothing is run, timed or stored."""
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    assert main(["tune", "-c", MATMUL, "--target", "cpu-spr", "--knob", "TILE_N=16"]) == 0
    out = capsys.readouterr().out
    assert "on cpu-spr (llvm-mca -mcpu=sapphirerapids; modelled, not timed; nothing stored)" in out
    line = next(ln for ln in out.splitlines() if "k_matmul_reduce" in ln)
    assert " us modelled, " in line and "fastest: " in line and "TILE_N" not in line
    assert not (tmp_path / "tuning.sqlite").exists()
    assert main(["tune", "-c", MATMUL, "--target", "sm_90a"]) != 0
    assert "--target sm_90a is not a CPU" in capsys.readouterr().err


def test_a_cpu_only_a_newer_llvm_models_names_the_llvm_mca_it_needs(monkeypatch, capsys):
    """Issue 51: with Debian's default llvm-mca (LLVM 14) --target cpu-znver4 said only "llvm-mca
    cannot model it on znver3"."""
    monkeypatch.setattr("strata.cli.tune.llvm_mca", lambda: ("/usr/bin/llvm-mca-14", 14))
    assert main(["tune", "-c", MATMUL, "--target", "cpu-znver4"]) != 0
    err = capsys.readouterr().err.strip()
    assert err == ("strata: --target cpu-znver4 needs llvm-mca from LLVM 16 or newer (it models "
                   "znver4), but the newest here is /usr/bin/llvm-mca-14 (LLVM 14): apt-get "
                   "install llvm-19 (Debian's llvm-19 package gives llvm-mca-19)")


@needs_mca
def test_a_hot_loop_llvm_mca_cannot_price_is_one_sentence(monkeypatch, capsys, tmp_path):
    """A price from the count model would not compare with llvm-mca's: no ranking, one sentence."""
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(static_cost, "cycles_per_iteration",
                        lambda body, target: (None, "llvm-mca cannot model it on x (vfoo)"))
    assert main(["tune", "-c", MATMUL, "--target", "cpu-avx2"]) != 0
    assert "k_matmul_reduce's hot loop has no price on cpu-avx2: llvm-mca cannot model it on x " \
           "(vfoo)" in capsys.readouterr().err
