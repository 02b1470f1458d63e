"""The suite's command line: it lists its cases anywhere, and on a machine without a GPU it says
so in one sentence and exits 2; bench_snippet does the same through DeviceUnavailable."""
import subprocess
import sys

import pytest
import torch

from strata.bench import suite
from strata.core.errors import DeviceUnavailable

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@no_gpu
def test_suite_without_gpu_exits_2_with_one_sentence():
    out = subprocess.run([sys.executable, "-m", "strata.bench.suite"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "GPU" in lines[0] and "Traceback" not in out.stderr
    assert out.stdout == ""


@no_gpu
def test_bench_snippet_without_gpu_is_device_unavailable():
    from strata.bench.cli_bench import bench_snippet
    with pytest.raises(DeviceUnavailable) as e:
        bench_snippet("torch.relu(torch.randn(4))", None)
    assert e.value.exit_code == 2


def test_list_prints_the_cases(capsys):
    assert suite.main(["--list", "--model", "qwen2.5-7b", "--seq", "1,128", "--dtype", "bf16",
                       "--ops", "sdpa,mlp"]) == 0
    out = capsys.readouterr().out
    assert "4 cases" in out and "sdpa qwen2.5-7b seq=128 bf16" in out and "1×28×128×128" in out
    assert "mlp qwen2.5-7b seq=1 bf16" in out and "407 MFLOP" in out


@pytest.mark.parametrize("argv,words", [
    (["--list", "--seq", "1,x"], "--seq"),
    (["--list", "--model", "llama3"], "unknown model 'llama3'"),
    (["--list", "--dtype", "int8"], "unknown dtype"),
    (["--list", "--variants", "tensorrt"], "unknown variant"),
])
def test_bad_arguments_are_one_sentence(argv, words, capsys):
    assert suite.main(argv) == 1
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_variant_selection_keeps_table_order():
    args = suite.build_parser().parse_args(["--variants", "strata,max-autotune,eager", "--ops", "gelu",
                                            "--seq", "1", "--model", "tinyllama", "--dtype", "fp32"])
    cases, which = suite.select(args)
    assert which == ["eager", "torch.compile max-autotune", "strata"]
    assert [c.name for c in cases] == ["gelu tinyllama seq=1 f32"]


def test_cpu_suite_defaults_to_tinyllama_at_1_and_128_tokens_without_max_autotune():
    args = suite.build_parser().parse_args(["--device", "cpu", "--ops", "rmsnorm"])
    cases, which = suite.select(args)
    assert [c.name for c in cases] == [f"rmsnorm tinyllama seq={s} {d}" for d in ("f32", "bf16")
                                       for s in (1, 128)]
    assert which == ["eager", "torch.compile", "strata"]


def test_cpu_suite_bad_threads_is_one_sentence(capsys):
    assert suite.main(["--device", "cpu", "--threads", "0", "--ops", "rmsnorm"]) == 1
    assert capsys.readouterr().err.strip() == "strata: --threads must be at least 1, not 0"


def test_a_cpu_case_is_checked_then_timed_natively(monkeypatch):
    """A real case through cpu_suite: strata compiled to C and checked against eager float64,
    then every variant timed in interleaved rounds (torch.compile with dynamo's eager backend
    here, to keep the test short)."""
    from strata.bench import cases as C
    from strata.bench import cpu_suite, variants
    from conftest import HAS_CC
    if not HAS_CC:
        pytest.skip("no C compiler: the CPU target cannot be built here (install gcc)")
    monkeypatch.setattr(variants, "torch_compile",
                        lambda fn, mode: torch.compile(fn, backend="eager", dynamic=False))
    [case] = C.cases(["tinyllama"], [3], ["bf16"], ["add_rmsnorm"])
    steps = []
    r = cpu_suite.run_cpu_case(case, ["eager", "torch.compile", "strata"], steps.append, rounds=3)
    assert r.accuracy.startswith("PASS"), r.accuracy
    assert [v.name for v in r.variants] == ["eager", "torch.compile", "strata"]
    assert all(v.ok and v.timing.runs == 3 and v.ms > 0 for v in r.variants)
    assert r.kernels and r.bytes > 0
    assert steps[:3] == ["building", "compiling with strata", "checking accuracy"]
