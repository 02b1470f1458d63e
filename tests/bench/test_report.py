"""Report tables, markdown and JSON from given numbers: ratios, geomeans, roofline, failed rows."""
import json
import math

import numpy as np
import pytest
from rich.console import Console

from strata.bench import report as R
from strata.bench.results import (
    EAGER,
    MAX_AUTOTUNE,
    STRATA,
    TORCH_COMPILE,
    CaseResult,
    Ceilings,
    Env,
    KernelRow,
    Timing,
    VariantRow,
    case_from_dict,
)

CEIL = Ceilings(copy_gbps=3000.0, mm_tflops={"bf16": 800.0, "f32": 50.0})
ENV = Env(device="NVIDIA H100 80GB HBM3", date="2026-11-22T10:00:00+00:00", torch="2.11.0",
          cuda="13.0", strata="0.1.0+abc123", python="3.12.3", extra={"triton": "3.5.0"})


def t(ms):
    return Timing(ms, ms * 0.9, ms * 0.95, ms * 1.05, 100)


def case(name, eager, tc, ma, strata, bytes_=3_000_000, flops=0, dtype="bf16", accuracy="PASS  max abs err 1e-3  rel err 1e-4",
         kernels=()):
    rows = []
    for vname, ms in ((EAGER, eager), (TORCH_COMPILE, tc), (MAX_AUTOTUNE, ma), (STRATA, strata)):
        rows.append(VariantRow(vname, "ok", t(ms)) if isinstance(ms, float) else VariantRow(vname, ms))
    return CaseResult(name, dtype, bytes_, flops, rows, accuracy, list(kernels))


CASES = [
    case("rmsnorm a", 0.020, 0.010, 0.010, 0.005,
         kernels=[KernelRow("k_rms_norm_reduce", 32, 256, 8192, 40, 0.0042)]),
    case("softmax b", 0.080, 0.040, "failed: BackendCompilerFailed: boom", 0.010),
    case("sdpa c", 0.5, 0.4, 0.4, "unsupported: unsupported op aten.scaled_dot_product_attention"),
    case("gelu d", 0.010, 0.010, 0.010, 0.020, accuracy="FAIL  max abs err 1  rel err 0.5"),
]


def render(renderable) -> str:
    console = Console(record=True, width=250)
    console.print(renderable)
    return console.export_text()


def test_timing_quantiles_match_numpy():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 7.0]
    tm = Timing.from_samples(xs)
    assert tm.median_ms == 4.0 and tm.min_ms == 1.0 and tm.runs == 7
    assert tm.p20_ms == pytest.approx(np.percentile(xs, 20))
    assert tm.p80_ms == pytest.approx(np.percentile(xs, 80))


def test_speedups_and_geomeans():
    a, b, c, _ = CASES
    assert R.speedup(a, STRATA, EAGER) == pytest.approx(4.0)
    assert R.speedup(a, STRATA, TORCH_COMPILE) == pytest.approx(2.0)
    assert R.speedup(b, STRATA, MAX_AUTOTUNE) is None
    assert R.speedup(c, STRATA, EAGER) is None
    g = R.geomeans(CASES)
    # d's accuracy failed and c did not run: only a (4x, 2x) and b (8x, 4x) count
    assert g["vs_eager"] == pytest.approx(math.sqrt(4 * 8))
    assert g["vs_torch_compile"] == pytest.approx(math.sqrt(2 * 4))
    assert g["vs_max_autotune"] == pytest.approx(2.0) and g["vs_max_autotune_cases"] == 1
    assert (g["strata_ran"], g["cases"], g["vs_eager_cases"]) == (2, 4, 2)
    assert R.geomean([]) is None and R.geomean([2.0, 0.5]) == pytest.approx(1.0)


def test_roofline_picks_the_binding_ceiling():
    mem = R.achieved(3_000_000, 0, 0.002, "bf16", CEIL)          # 1.5 TB/s of 3 TB/s
    assert mem.unit == "GB/s" and mem.value == pytest.approx(1500) and mem.fraction == pytest.approx(0.5)
    mm = R.achieved(1_000_000, 2 * 4096 ** 3, 0.5, "bf16", CEIL)
    assert mm.unit == "TFLOP/s" and mm.value == pytest.approx(2 * 4096 ** 3 / 0.5e-3 / 1e12)
    assert mm.fraction == pytest.approx(mm.value / 800.0)
    f32 = R.achieved(1_000_000, 2 * 4096 ** 3, 5.0, "f32", CEIL)   # uses the f32 matmul ceiling
    assert f32.fraction == pytest.approx(f32.value / 50.0)
    assert R.achieved(0, 0, 1.0, "bf16", CEIL) is None and R.achieved(10, 0, None, "bf16", CEIL) is None


def test_comparison_table_renders_failed_and_unsupported_rows():
    text = render(R.comparison_table(CASES[1], CEIL))
    assert "failed: BackendCompilerFailed: boom" in text
    assert "8.00×" in text and "4.00×" in text             # strata vs eager, vs torch.compile
    assert "ceiling: copy 3,000 GB/s" in text
    text = render(R.comparison_table(CASES[2], CEIL))
    assert "unsupported: unsupported op aten.scaled_dot_product_attention" in text
    rows = R.comparison_rows(CASES[0], CEIL)
    assert rows[0][:5] == ("eager", "0.0200", "0.0190–0.0210", "1.00×", "0.50×")
    assert rows[3][5] == "600 GB/s" and rows[3][6] == "20%"


def test_kernel_table():
    ks = [KernelRow("k_a", (64, 1, 1), (256, 1, 1), 4096, 32, 0.0123), KernelRow("k_b", 8, 128)]
    assert R.kernel_rows_text(ks) == [("k_a", "64", "256", "4096", "32", "12.3"),
                                      ("k_b", "8", "128", "—", "—", "—")]
    assert "k_a" in render(R.kernel_table(ks))


def test_markdown_report():
    md = R.markdown_report(CASES, ENV, CEIL)
    assert "NVIDIA H100 80GB HBM3" in md and "2026-11-22" in md
    assert "torch 2.11.0, CUDA 13.0, strata 0.1.0+abc123" in md and "triton 3.5.0" in md
    assert "geomean speedup vs eager: **5.66×** over 2 cases (meets the goal ≥ 1.5×)" in md
    assert "geomean speedup vs torch.compile: **2.83×** over 2 cases" in md
    assert "| softmax b | PASS | 0.0800 | 0.0400 | failed | 0.0100 | 8.00× | 4.00× |" in md
    assert "| sdpa c | PASS | 0.500 | 0.400 | 0.400 | unsupported | — | — | — | — |" in md
    # not-run reasons are listed once, with their cases
    assert "- strata unsupported: unsupported op aten.scaled_dot_product_attention (sdpa c)" in md
    assert "- torch.compile max-autotune failed: BackendCompilerFailed: boom (softmax b)" in md
    # the shortfalls name the case and the kernels
    below = md.split("## Below goal")[1].split("##")[0]
    assert "gelu d" in below and "accuracy FAIL" in below and "0.50× vs eager" in below
    assert "| rmsnorm a | 20% of copy bandwidth | k_rms_norm_reduce (4.2 µs) |" in below
    assert "| rmsnorm a | k_rms_norm_reduce | 32 | 256 | 8192 | 40 | 4.2 |" in md


def test_json_report_round_trips(tmp_path):
    md_path, js_path = R.write_reports(tmp_path / "out", "suite-h100", CASES, ENV, CEIL)
    assert md_path.read_text().startswith("# strata LLM op suite")
    data = json.loads(js_path.read_text())
    assert data["env"]["device"] == ENV.device and data["env"]["torch"] == "2.11.0"
    assert data["env"]["cuda"] == "13.0" and data["env"]["strata"] == "0.1.0+abc123"
    assert data["ceilings"]["copy_gbps"] == 3000.0
    assert data["geomean"]["vs_eager"] == pytest.approx(math.sqrt(32))
    assert data["geomean"]["vs_torch_compile"] == pytest.approx(math.sqrt(8))
    first = data["cases"][0]
    assert first["speedup"]["vs_eager"] == pytest.approx(4.0)
    assert first["strata_achieved"]["unit"] == "GB/s"
    assert data["cases"][2]["variants"][3]["status"].startswith("unsupported:")
    back = [case_from_dict(c) for c in data["cases"]]
    assert back == CASES
    assert not list((tmp_path / "out").glob("*.tmp"))


CPU_CEIL = Ceilings(copy_gbps=40.0, read_gbps=50.0, mm_tflops={"f32": 0.2}, mm_n=2048)
CPU_ENV = Env(device="AMD EPYC, 2 cores", date="2026-11-24T10:00:00+00:00", torch="2.13.0",
              strata="0.1.0+abc123", python="3.11.7", extra={"threads": "1"})


def test_cpu_report_compares_with_the_faster_baseline_and_the_read_bandwidth():
    # a: eager 0.020, compile 0.010 -> 2x the faster; b: 0.080 / 0.040 over 0.010 -> 4x
    a, b, _, _ = CASES
    assert R.speedup_vs_best(a) == pytest.approx(2.0) and R.speedup_vs_best(b) == pytest.approx(4.0)
    assert R.geomeans(CASES)["vs_best"] == pytest.approx(math.sqrt(8))
    mem = R.achieved(3_000_000, 0, 0.1, "f32", CPU_CEIL)     # 30 GB/s of a 50 GB/s sum
    assert mem.fraction == pytest.approx(0.6)
    md = R.markdown_report(CASES, CPU_ENV, CPU_CEIL, device="cpu")
    assert "geomean speedup vs the faster of eager and torch.compile: **2.83×** over 2 cases " \
           "(meets the goal ≥ 1.2×)" in md
    assert "memory copy 40 GB/s (read + write bytes), a large sum 50 GB/s read" in md
    assert "torch.mm 2048³ f32 0.2 TFLOP/s" in md and "interleaved rounds" in md
    assert "CUDA-event" not in md
    below = md.split("## Below goal")[1].split("##")[0]
    # rmsnorm a: 3 MB in 0.005 ms = 600 GB/s, above the sum: no shortfall; gelu d: 150 GB/s
    assert "rmsnorm a" not in below and "gelu d" in below
    assert R.json_report(CASES, CPU_ENV, CPU_CEIL, "cpu")["goals"]["geomean_vs_best"] == 1.2


def test_the_machine_profiles_peak_is_the_cpu_compute_ceiling():
    """On a CPU the units' measured peak (strata machine), not torch.mm's rate, bounds a
    contraction: bf16 torch.mm on an AVX2 CPU runs under a GFLOP/s."""
    ceil = Ceilings(copy_gbps=40.0, read_gbps=50.0, mm_tflops={"bf16": 0.0003}, mm_n=2048,
                    peak_tflops={"bf16": 0.2})
    a = R.achieved(1_000, 10 ** 9, 10.0, "bf16", ceil)        # 0.1 TFLOP/s of a 0.2 peak
    assert a.unit == "TFLOP/s" and a.fraction == pytest.approx(0.5)
    md = R.markdown_report(CASES, CPU_ENV, ceil, device="cpu")
    assert "compute ceilings (`strata machine`'s profile, the units' peaks on every core): " \
           "bf16 0.2 TFLOP/s" in md and "FLOPs / the machine profile's peak throughput" in md


def test_profile_peaks_take_the_fastest_unit_for_bf16(monkeypatch):
    from strata.tune import machine
    from strata.bench import cpu_bench
    p = machine.facts()
    p.ceilings = {"fp32 FMA peak": 200.0, "DRAM read": 30.0}
    monkeypatch.setattr(machine, "cached", lambda: p)
    assert cpu_bench.profile_peaks() == {"f32": 0.2, "bf16": 0.2}      # AVX2: bf16 on the FMAs
    p.ceilings["bf16 AMX peak"] = 1800.0
    assert cpu_bench.profile_peaks() == {"f32": 0.2, "bf16": 1.8}
    monkeypatch.setattr(machine, "cached", lambda: None)
    assert cpu_bench.profile_peaks() == {}                             # not measured: torch.mm
