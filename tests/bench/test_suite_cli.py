"""The suite's command line: it lists its cases anywhere, and on a machine without a GPU it says
so in one sentence and exits 2; bench_snippet does the same through DeviceUnavailable."""
import subprocess
import sys

import pytest
import torch

from strata.bench import suite
from strata.errors import DeviceUnavailable

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
