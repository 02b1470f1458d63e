"""The strata command: printed stages, verdicts, and one-sentence errors with exit codes."""
import subprocess
import sys

import pytest
import torch

from strata.cli import main

RMS = "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))"


@pytest.mark.parametrize("stage", ["torch", "tensor", "loop", "tile", "kernel", "cuda"])
def test_compile_prints_every_stage(stage, capsys):
    assert main(["compile", "-c", RMS, "--ir", stage]) == 0
    out = capsys.readouterr().out
    assert "rms_norm" in out


def test_compile_writes_file(tmp_path, capsys):
    path = tmp_path / "kernels.cu"
    assert main(["compile", "-c", RMS, "--ir", "cuda", "--target", "sm_80", "-o", str(path)]) == 0
    assert "k_rms_norm_reduce" in path.read_text()


def test_run_passes_and_fails(capsys):
    assert main(["run", "-c", "torch.softmax(torch.randn(4, 1000), dim=-1)", "--device", "sim"]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("argv,code,words", [
    (["run", "-c", "torch.median(torch.randn(4, 5), 0).values"], 1, "unsupported op aten.median"),
    (["run", "-c", "torch.randn(4"], 1, "not a Python expression"),
    (["run", "-c", "torch.relu(torch.randn(4))", "--bench"], 2, "--device cpu or --device cuda"),
    (["compile", "-c", RMS, "--knob", "BLOCK"], 1, "NAME=VALUE"),
])
def test_errors_are_one_sentence(argv, code, words, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "strata.cli", "compile", "-c", "torch.randn(3) * 2",
                          "--ir", "loop"], capture_output=True, text=True)
    assert out.returncode == 0 and "=== k_" in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_exits_2_with_one_sentence(capsys):
    assert main(["run", "-c", "torch.relu(torch.randn(4))", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == ("strata: --device cuda needs an NVIDIA GPU visible to torch; none is; "
                   "use --device sim\n")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("code", [
    RMS,
    "torch.softmax(torch.randn(4, 1000), dim=-1)",
    "torch.relu(torch.matmul(torch.randn(16,64) + torch.randn(64), torch.randn(64,16)))",
])
def test_run_on_the_gpu_passes(code, capsys):
    assert main(["run", "-c", code, "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "CUDA" in out and "registers" in out


def test_threads_option_fixes_strata_and_torch_threads(capsys, monkeypatch):
    """--threads N: strata's team and torch's threads (the comparison's) both N; 0 is refused."""
    from strata.runtime import threads
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", str(before))        # use_threads writes it back
    try:
        assert main(["run", "-c", "torch.randn(4099) * 2 + 1", "--device", "cpu", "--threads", "1"]) == 0
        assert "PASS" in capsys.readouterr().out
        assert threads.THREADS.current() == 1 and torch.get_num_threads() == 1
    finally:
        threads.set_threads(None)
        torch.set_num_threads(before)
    assert main(["generate", "x", "--prompt-ids", "1", "--threads", "0"]) == 1
    assert capsys.readouterr().err.strip() == "strata: --threads must be at least 1, not 0"
