"""What of the harness, variants, runtime adapter and accuracy check runs without a GPU: input
rotation, work estimates, failing variants becoming rows, kernel rows from the runtime or the
Kernel IR, and the verdict on a program's outputs."""
from types import SimpleNamespace

import pytest
import torch

from strata.bench import harness, runtime_adapter, variants
from strata.bench.accuracy import check_program, verdict_line
from strata.bench.results import Timing
from strata.bench.work import estimate_work
from strata.core.errors import CompileError, UnsupportedOp


def test_input_copies_and_rotation():
    l2 = 50 << 20
    assert harness.input_copies(1 << 20, l2) == harness.MAX_INPUT_COPIES
    assert harness.input_copies(40 << 20, l2) == 3
    assert harness.input_copies(60 << 20, l2) == 1 and harness.input_copies(10, None) == 1
    assert harness.flush_bytes(l2) == 100 << 20 and harness.flush_bytes(None) == 256 << 20
    x = torch.randn(4)
    sets = harness.rotating_arg_sets((x, 3), 3)
    assert len(sets) == 3 and sets[0][0] is x and sets[2][1] == 3
    assert torch.equal(sets[1][0], x) and sets[1][0].data_ptr() != x.data_ptr()
    assert harness.tensor_bytes((x, [torch.zeros(2, dtype=torch.bfloat16)])) == 20


def test_estimate_work_of_a_linear():
    lin = torch.nn.Linear(64, 32).requires_grad_(False)
    x = torch.randn(8, 64)
    w = estimate_work(lin, (x,))
    assert w.flops == 2 * 8 * 64 * 32
    assert w.bytes == 4 * (8 * 64 + 64 * 32 + 32 + 8 * 32)
    assert estimate_work(lin, (x,), bytes=7, flops=9) == type(w)(7, 9)


def test_failing_variants_become_rows(monkeypatch):
    def broken(fn, mode):
        raise RuntimeError(f"backend='inductor' raised:\nCompilationError: no C++ compiler ({mode})")
    monkeypatch.setattr(variants, "torch_compile", broken)
    fn = torch.nn.Linear(4, 4)
    def timer(call, sets):
        return Timing.from_samples([1.0, 2.0, 3.0])
    steps = []
    rows = variants.measure_variants(fn, [(torch.randn(2, 4),)], timer, None,
                                     "unsupported: unsupported op aten.foo", on_step=steps.append)
    assert [r.name for r in rows] == ["eager", "torch.compile", "torch.compile max-autotune", "strata"]
    assert rows[0].ok and rows[0].ms == 2.0
    assert rows[1].status == ("failed: RuntimeError: backend='inductor' raised: "
                              "CompilationError: no C++ compiler (None)")
    assert rows[2].status.endswith("(max-autotune-no-cudagraphs)")
    assert rows[3].status == "unsupported: unsupported op aten.foo" and not rows[3].ok
    assert "timing eager" in steps

    def bad_timer(call, sets):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    rows = variants.measure_variants(fn, [(torch.randn(2, 4),)], bad_timer, which=["eager"])
    assert rows[0].status == "failed: RuntimeError: CUDA error: an illegal memory access was encountered"


def test_strata_status():
    assert variants.strata_status(UnsupportedOp("aten.cumsum", "x.py:3")) == \
        "unsupported: unsupported op aten.cumsum (at x.py:3)"
    assert variants.strata_status(CompileError("nvrtc said no")) == "failed: nvrtc said no"
    assert variants.strata_status(KeyError("k")).startswith("failed: internal error: KeyError")
    assert len(variants.reason(ValueError("x" * 500))) == variants.MAX_REASON


def test_kernel_rows_and_times_from_the_runtime_or_the_kernel_ir():
    rows = [{"name": "k_a", "grid": 8, "block": 256, "smem_bytes": 1024, "registers": 32},
            {"name": "k_b", "grid": 4, "block": 64, "smem_bytes": 0, "registers": 16}]
    timed = [{"name": "k_a", "grid": 8, "block": 256, "ms": 0.01}, {"name": "k_b", "ms": 0.02}]
    calls = []
    prog = SimpleNamespace(runtime=SimpleNamespace(
        kernel_rows=lambda: rows, time_kernels=lambda inputs: calls.append(inputs) or timed))
    a, b = runtime_adapter.kernel_rows(prog)
    assert (a.name, a.grid, a.smem_bytes, a.registers) == ("k_a", 8, 1024, 32)
    x = torch.zeros(1)
    assert runtime_adapter.kernel_times(prog, (x,)) == [0.01, 0.02] and calls == [[x]]
    assert [r.time_ms for r in runtime_adapter.with_times([a, b], [0.01, None])] == [0.01, None]
    old = SimpleNamespace(kernels=[SimpleNamespace(name="k_c", grid=4, block=64, smem_bytes=0)])
    (row,) = runtime_adapter.kernel_rows(old)
    assert (row.name, row.grid, row.registers) == ("k_c", 4, None)


class _SimOnly:
    kernels = ()

    @property
    def runtime(self):
        raise CompileError("this program was compiled for device 'sim', not cuda")


def test_a_program_without_runtime_has_no_rows():
    assert runtime_adapter.kernel_rows(_SimOnly()) == []


def test_normalize_times():
    names = ["k_a", "k_b"]
    assert runtime_adapter.normalize_times({"k_b": 0.5}, names) == [None, 0.5]
    assert runtime_adapter.normalize_times([0.5, None], names) == [0.5, None]
    assert runtime_adapter.normalize_times([{"name": "k_b", "ms": 0.3}], names) == [None, 0.3]
    assert runtime_adapter.normalize_times(None, names) == [None, None]


def test_accuracy_of_a_programs_outputs():
    norm = torch.nn.RMSNorm(64).requires_grad_(False)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    norm = norm.to(torch.bfloat16)
    good = check_program(norm, norm, (x,))
    assert good.passed and good.outputs[0].dtype == "bf16" and good.outputs[0].tol == 1e-2
    assert verdict_line(good).startswith("PASS")
    bad = check_program(lambda t: norm(t) * 1.1, norm, (x,))
    assert not bad.passed and verdict_line(bad).startswith("FAIL")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_require_cuda_says_so():
    with pytest.raises(Exception, match="needs a CUDA GPU") as e:
        harness.require_cuda("benchmarking")
    assert e.value.exit_code == 2
