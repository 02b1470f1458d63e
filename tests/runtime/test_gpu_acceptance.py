"""The acceptance run's cases (strata/gpu_check/cases.py) and the GPU paths no other test covers:
torch.compile(backend="strata") on CUDA tensors, and `strata generate --device cuda` (prefill,
the in-place KV cache and CUDA-graph replay of the decode step) agreeing with Hugging Face.
On a CPU machine the cases run on the simulator, so the GPU run checks the same expectations."""
import sys
from pathlib import Path

import pytest
import torch

import strata  # noqa: F401  (registers the backend)
from strata.bench import check
from strata.gpu_check import cases

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("name", cases.NAMES)
def test_case_passes_on_the_simulator(name):
    assert cases.run_case(name, "sim") == ""


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_case_compiles_with_nvrtc_for_its_target(name):
    """What NVRTC does on the GPU machine, here: the attention cases once failed there because
    their graph inputs were named in0, in1, in2 (a function taking *args) and the attention
    kernel's loads declared variables of the same names."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from strata.runtime.nvrtc import compile_cuda
    prog, _, _ = cases.build(name, "sim")
    arch = prog.lowered.target.isa
    assert all(len(compile_cuda(unit, arch, want="ptx")) > 0 for unit in prog.lowered.units.sources)


def test_a_case_that_takes_another_path_fails(monkeypatch):
    """The source check is real: a case demanding an instruction its kernel lacks fails."""
    case = cases.CASES["matmul_f32"]
    monkeypatch.setitem(cases.CASES, "matmul_f32",
                        cases.GpuCase(case.what, case.make, case.target, ("wgmma",)))
    assert "took another path" in cases.run_case("matmul_f32", "sim")


@gpu
@pytest.mark.parametrize("name", cases.NAMES)
def test_case_passes_on_the_gpu(name):
    assert cases.run_case(name, "cuda") == ""


@gpu
def test_torch_compile_backend_on_cuda_tensors():
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.LayerNorm(96))
    x = torch.randn(7, 64)
    ref = check.eager_reference(model, (x,))[0]
    compiled = torch.compile(model.cuda(), backend="strata")
    with torch.no_grad():
        out = compiled(x.cuda())
    assert out.is_cuda and out.dtype == torch.float32
    res = check.compare("out", "f32", out.double().cpu().numpy(), ref, check.tolerance("f32", True))
    assert res.passed, f"rel {res.rel:.3g}"


@gpu
def test_generate_on_the_gpu_agrees_with_hf(tmp_path, capsys):
    pytest.importorskip("transformers")
    from model_helpers import hf_model, write_checkpoint
    from strata.cli import main
    d = write_checkpoint(hf_model("llama", seed=3), tmp_path)
    rc = main(["generate", str(d), "--prompt-ids", "3,1,4,1,5", "--max-new-tokens", "8",
               "--max-len", "16", "--device", "cuda", "--compare"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "ids agree with hf eager" in out and ": yes" in out.split("ids agree with hf eager")[1], out
