"""Every examples/kernels/*.py kernel against PyTorch (float64) on the simulator, natively on
the CPU and on OpenCL (PoCL), and its CUDA through NVRTC for sm_80 and sm_90."""
import importlib.util
import pathlib

import pytest
import torch

from dsl_devices import DEVICES

EXAMPLES = sorted((pathlib.Path(__file__).parents[2] / "examples" / "kernels").glob("*.py"))


def load(path):
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_matches_torch(path, device):
    m = load(path)
    torch.manual_seed(0)
    got, want = m.run(device)
    assert got.shape == want.shape
    torch.testing.assert_close(got.double(), want.double(), atol=m.TOL, rtol=m.TOL)


def launched_kernels(path) -> list:
    """Every @strata.kernel of an example, each specialised by one run on the simulator."""
    m = load(path)
    m.run("sim")
    return [v for v in vars(m).values() if type(v).__name__ == "KernelFunction" and v.last]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_cuda_compiles(path, arch):
    pytest.importorskip("cuda.bindings.nvrtc")
    from strata.runtime.nvrtc import compile_cuda
    for kernel in launched_kernels(path):
        source = kernel.source("cuda")
        assert "__global__ void __launch_bounds__" in source
        assert len(compile_cuda(source, arch)) > 0, kernel.__name__


@pytest.mark.parametrize("path", [p for p in EXAMPLES if p.stem != "decode_loop"],
                         ids=lambda p: p.stem)
def test_example_runs_as_a_script_and_prints_its_check(path):
    """`python examples/kernels/X.py` checks itself (issue 29: most printed nothing)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-1000:]
    assert "sim: PASS" in out.stdout and ("cpu: PASS" in out.stdout or "cpu: skipped" in out.stdout)
