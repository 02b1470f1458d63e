"""`python -m strata.bench.contractions` (issue 3's GPU table): the cases derived from the
bundled configs, causal FLOPs halved, the table and goal verdicts from given numbers, one case
driven end to end on the simulator, the no-GPU exit; a --quick run where a GPU exists."""
import json
import subprocess
import sys

import pytest
import torch

from strata.bench import contraction_cases as C
from strata.bench import contraction_report as R
from strata.bench.env import strata_target
from strata.bench.results import (
    EAGER,
    STRATA,
    CaseResult,
    Ceilings,
    Env,
    Timing,
    VariantRow,
)
from strata.models.source import resolve

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_decode_shapes_come_from_the_bundled_configs():
    projs = {(p.k, p.n, p.bias): p.label for p in C.decode_projections()}
    qwen = resolve("Qwen/Qwen2.5-7B").config
    h, inter = qwen["hidden_size"], qwen["intermediate_size"]
    assert (h, h, True) in projs and "Qwen2.5-7B q_proj" == projs[(h, h, True)]
    assert projs[(h, h, False)] == "Qwen2.5-7B o_proj"              # Qwen2: no bias on o_proj
    assert projs[(h, 4 * 128, True)] == "Qwen2.5-7B k_proj/v_proj"
    assert projs[(inter, h, False)] == "Qwen2.5-7B down_proj"
    # TinyLlama and Llama-3.2-1B share q/o (2048x2048) but not k/v (4 vs 8 KV heads of 64)
    assert projs[(2048, 2048, False)] == ("TinyLlama-1.1B q_proj/o_proj, "
                                          "Llama-3.2-1B q_proj/o_proj")
    assert projs[(2048, 256, False)] == "TinyLlama-1.1B k_proj/v_proj"
    assert projs[(2048, 512, False)] == "Llama-3.2-1B k_proj/v_proj"
    assert projs[(8192, 2048, False)] == "Llama-3.2-1B down_proj"
    assert len(projs) == 12


def test_projections_follow_a_changed_config():
    cfg = dict(resolve("meta-llama/Llama-3.2-1B").config, num_key_value_heads=2, head_dim=128,
               num_attention_heads=16, attention_bias=True)
    got = {p.label.split()[-1]: (p.k, p.n, p.bias) for p in C.projections(cfg, "x")}
    assert got["q_proj/o_proj"] == (2048, 2048, True)
    assert got["k_proj/v_proj"] == (2048, 256, True)


def test_case_list_order_goals_and_quick():
    cs = C.cases()
    assert cs[0].name == "mm 4096×4096×4096" and cs[0].goal == C.GOAL_MM
    linears = [c for c in cs if isinstance(c, C.MatmulCase) and c.linear]
    assert {c.m for c in linears} == {1, 16} and len(linears) == 24
    assert all(c.goal == C.GOAL_DECODE and c.group == "decode matmul" for c in linears)
    assert [c.name for c in cs[:3]] == ["mm 4096×4096×4096", "mm 8192×8192×8192",
                                        "fp8 scaled_mm 4096×4096×4096"]
    att = [c for c in cs if isinstance(c, C.AttentionCase)]
    plain = [(c.heads, c.seq, c.head_dim, c.causal) for c in att if not c.knobs]
    assert len(plain) == 16 and {(s, d, causal) for _, s, d, causal in plain} == {
        (s, d, causal) for s in C.ATTENTION_SEQS for d in (64, 128) for causal in (True, False)}
    assert all(h == C.LONG_HEADS for h, s, _, _ in plain if s >= 8192)
    pinned = [c for c in att if c.knobs]
    assert [(c.heads, c.seq, c.head_dim) for c in pinned] == [(32, 2048, 64), (28, 2048, 128)]
    assert pinned[0].name == "causal attention 1×32×2048×64 (INSTR=wgmma)"
    assert C.AttentionCase(32, 2048, 64, causal=False).name == "attention 1×32×2048×64"
    assert all(c.goal == C.GOAL_ATTENTION == 1.0 for c in att) and {c.dtype for c in cs} == {"bf16", "f8e4m3"}
    fp8 = [c for c in cs if isinstance(c, C.ScaledMmCase)]
    assert [(c.m, c.k, c.n, c.goal) for c in fp8] == [(4096, 4096, 4096, C.GOAL_FP8)]
    prefill = [c for c in cs if isinstance(c, C.PrefillCase)]
    assert len(prefill) == 24 and all(c.goal == C.GOAL_PREFILL for c in prefill)
    quick = C.cases(quick=True)
    assert len(quick) == 12 and quick[0] == cs[0] and isinstance(quick[-1], C.AttentionCase)


def test_prefill_products_come_from_the_configs():
    cs = {(c.label, c.m): (c.k, c.n, c.epilogue) for c in C.prefill_cases()}
    assert cs["Llama-3-8B gate/up_proj", 2048] == (4096, 14336, "silu_gate")
    assert cs["Llama-3-8B down_proj", 128] == (14336, 4096, "residual")
    assert cs["TinyLlama-1.1B q_proj", 512] == (2048, 2048, "none")
    assert C.PrefillCase(128, 4096, 14336, "silu_gate").flops() == 2 * 2 * 128 * 4096 * 14336
    assert C.PrefillCase(128, 64, 32, "residual").name == "prefill 128×64×32 + residual"


def test_dense_peaks_by_device_name():
    assert R.dense_peak_tflops("NVIDIA H100 80GB HBM3")["bf16"] == 989.4
    assert R.dense_peak_tflops("NVIDIA H100 PCIe")["f8e4m3"] == 1513.0
    assert R.dense_peak_tflops("NVIDIA H200")["bf16"] == 989.4 and R.dense_peak_tflops("RTX 4090") == {}


def test_flops_matmul_and_causal_attention_halved():
    assert C.MatmulCase(16, 2048, 5632, linear=True).flops() == 2 * 16 * 2048 * 5632
    full = C.attention_flops(1, 32, 2048, 2048, 64, causal=False)
    assert full == 4 * 32 * 2048 * 2048 * 64
    assert C.AttentionCase(32, 2048, 64).flops() == full // 2


def test_cases_build_with_the_right_shapes_on_meta():
    m, inputs, timed = C.MatmulCase(16, 3584, 512, linear=True, bias=True).build("meta")
    assert tuple(m.weight.shape) == (512, 3584) and m.bias is not None
    assert [tuple(x.shape) for x in inputs] == [(16, 3584)] and timed is m
    m, inputs, timed = C.AttentionCase(28, 2048, 128).build("meta")
    assert [tuple(x.shape) for x in inputs] == [(1, 28, 2048, 128)] * 3
    assert isinstance(timed, C.FastestSDPA) and inputs[0].dtype == torch.bfloat16


@pytest.mark.parametrize("cap, want", [((9, 0), "sm_90a"), ((8, 0), "sm_80"), ((8, 9), "sm_89")])
def test_strata_target_from_the_capability(cap, want):
    assert strata_target(cap) == want


def _row(torch_ms, strata_ms, goal=1.0, accuracy="PASS  max abs err 0  rel err 0", flops=2 * 10**12,
         strata_status="ok"):
    t = lambda ms: Timing(ms, ms, ms, ms, 10)
    variants = [VariantRow(EAGER, "ok", t(torch_ms)),
                VariantRow(STRATA, strata_status, t(strata_ms) if strata_status == "ok" else None)]
    return R.ContractionRow(CaseResult("mm x", "bf16", 0, flops, variants, accuracy=accuracy),
                            "matmul", goal, "torch (cuBLAS)", "lbl", {"strata_kernels": "1 (wgmma)"})


def test_verdicts_and_cells():
    met = _row(1.0, 1.0, goal=0.9)                     # ratio 1.0 >= 0.9
    assert R.verdict(met) == "met" and R.ratio(met) == 1.0
    assert R.verdict(_row(1.0, 1.25, goal=0.9)) == "not met"        # 0.8x
    assert R.verdict(_row(1.0, 0.5, accuracy="FAIL  max abs err 1  rel err 1")) == \
        "not met (accuracy FAIL)"
    assert R.verdict(_row(1.0, 0, strata_status="unsupported: op x")) == "not met (strata unsupported)"
    cells = R.table_rows([_row(2.0, 1.0)])[0]
    assert cells[:4] == ("mm x", "lbl", "PASS", "1 (wgmma)")
    assert cells[4:] == ("2.000", "1.000", "1,000.0", "2,000.0", "—", "2.00×", "≥ 1× torch (cuBLAS)", "met")
    peaked = _row(2.0, 1.0)
    peaked.extra["peak_tflops"] = 4000.0
    assert R.table_rows([peaked])[0][8] == "50%"


def test_markdown_and_json(tmp_path):
    rows = [_row(1.0, 2.0, goal=0.9), _row(1.0, 0.5), _row(1.0, 0, strata_status="failed: boom")]
    env = Env("NVIDIA Fake GPU", "2030-01-02T03:04:05+00:00", "2.13", "12.8", "0.1",
              extra={"strata target": "sm_90a"})
    md, js = R.write(tmp_path, R.stem_for("contractions", env), rows, env, Ceilings(3000.0, {"bf16": 700.0}))
    assert md.name == "contractions-nvidia-fake-gpu-2030-01-02.md"
    text = md.read_text()
    assert "device: NVIDIA Fake GPU" in text and "strata target: sm_90a" in text
    assert "matmul: goal ≥ 0.9× torch (cuBLAS), met in 1 of 3 cases" in text
    assert "| mm x | lbl | PASS | 1 (wgmma) | 1.000 | 2.000 |" in text
    assert "- mm x: strata failed: boom" in text
    data = json.loads(js.read_text())
    assert [c["verdict"] for c in data["cases"]] == ["not met", "met", "not met (strata failed)"]
    assert data["cases"][1]["ratio"] == 2.0 and data["cases"][1]["strata_tflops"] == 4000.0


@pytest.mark.parametrize("case", [C.MatmulCase(16, 40, 24, linear=True, bias=True),
                                  C.AttentionCase(2, 24, 16), C.AttentionCase(2, 24, 16, causal=False),
                                  C.ScaledMmCase(33, 64, 40), C.PrefillCase(33, 64, 40, "residual"),
                                  C.PrefillCase(33, 64, 40, "silu_gate")],
                         ids=["linear", "attention", "full-attention", "fp8", "residual", "silu-gate"])
def test_run_case_on_the_simulator(case):
    """The measuring path end to end on the CPU: strata on the simulator, a fake timer."""
    import strata
    from strata.bench.contractions import run_case
    calls = []

    def timer(fn, arg_sets):
        fn(*arg_sets[0])
        calls.append(fn)
        return Timing(1.0, 1.0, 1.0, 1.0, 1)
    row = run_case(case, device="cpu", timer=timer,
                   compiler=lambda fn, inputs: strata.compile(fn, inputs, device="sim"))
    assert row.result.accuracy.startswith("PASS"), row.result.accuracy
    assert [v.name for v in row.result.variants] == [EAGER, STRATA]
    assert all(v.ok for v in row.result.variants) and len(calls) == 2
    assert row.extra["strata_kernels"].split()[0].isdigit()
    assert row.result.flops == case.flops()


@no_gpu
def test_without_gpu_exits_2_with_one_sentence():
    out = subprocess.run([sys.executable, "-m", "strata.bench.contractions", "--quick"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "GPU" in lines[0] and "Traceback" not in out.stderr


def test_the_attention_sweep_pins_each_schedule(capsys):
    from strata.bench.contractions import main
    cs = C.sweep_cases()
    assert len(cs) == 2 * len(C.ATTENTION_SWEEP) and {c.head_dim for c in cs} == {64, 128}
    assert cs[0].knobs == (("INSTR", "mma"),) and cs[4].knobs == (("INSTR", "wgmma"), ("BLOCK_M", 128))
    assert main(["--list", "--sweep"]) == 0
    assert "INSTR=wgmma, BLOCK_N=128" in capsys.readouterr().out


def test_list_needs_no_gpu(capsys):
    from strata.bench.contractions import main
    assert main(["--list", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "12 cases" in out and "causal attention 1×32×2048×64" in out and "fp8 scaled_mm" in out
    assert "(INSTR=wgmma)" in out


@gpu
def test_quick_run_on_the_gpu(tmp_path):
    from strata.bench.contractions import main
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("contractions-*.json")
    data = json.loads(js.read_text())
    assert len(data["cases"]) == len(C.cases(quick=True))
    assert all(c["verdict"] for c in data["cases"])
