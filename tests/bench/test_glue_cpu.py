"""The suite's per-case flow and the --bench flow, driven on the CPU: the simulator stands in for
the CUDA runtime and a fake timer for CUDA events, so everything between them (compile, verdict,
variants, tables, unsupported rows) runs before any GPU does."""
import pytest
from rich.console import Console

import strata
from strata.bench import cases as C
from strata.bench import variants
from strata.bench.cli_bench import bench_module
from strata.bench.results import Ceilings, Timing
from strata.bench.suite import run_case
from strata.core.errors import UnsupportedOp


def sim(fn, inputs, ctx=None):
    return strata.compile(fn, tuple(inputs), device="sim", ctx=ctx)


def timer(call, arg_sets):
    call(*arg_sets[0])
    return Timing.from_samples([0.5, 0.4, 0.6])


def one(op, seq=2, dtype="f32"):
    return C.cases(models=("tinyllama",), seqs=(seq,), dtypes=(dtype,), ops=(op,))[0]


def test_a_case_compiles_checks_and_times():
    steps = []
    r = run_case(one("rmsnorm"), ["eager", "strata"], steps.append, device="cpu", timer=timer,
                 compiler=sim)
    assert r.accuracy.startswith("PASS") and [v.status for v in r.variants] == ["ok", "ok"]
    assert r.bytes == 4 * (2 * 2048 * 2 + 2048) and r.flops == 0
    assert r.kernels and r.kernels[0].name.startswith("k_") and r.kernels[0].time_ms is None
    assert steps[:3] == ["building", "compiling with strata", "checking accuracy"]


def test_a_case_strata_cannot_compile_is_a_row():
    def unsupported(fn, inputs, ctx=None):
        raise UnsupportedOp("aten.scaled_dot_product_attention", "cases.py:120")
    r = run_case(one("sdpa"), ["eager", "strata"], lambda s: None, device="cpu", timer=timer,
                 compiler=unsupported)
    assert r.variants[0].ok and r.accuracy is None and r.kernels == []
    assert r.variants[1].status == ("unsupported: unsupported op aten.scaled_dot_product_attention "
                                    "(at cases.py:120)")


def test_bench_module_prints_verdict_then_tables(monkeypatch):
    def no_compiler(fn, mode):
        raise RuntimeError("inductor needs a C++ compiler")
    monkeypatch.setattr(variants, "torch_compile", no_compiler)
    module, inputs = one("silu_mul").build("cpu")
    console = Console(record=True, width=220)
    code = bench_module(module, inputs, "silu(gate) * up", None, console, timer=timer,
                        ceilings=Ceilings(3000.0, {"f32": 50.0, "bf16": 800.0}), compiler=sim)
    text = console.export_text()
    assert code == 0
    verdict, comparison, kernels = text.index("PASS"), text.index("silu(gate) * up"), text.index("strata kernels")
    assert verdict < comparison < kernels
    assert "failed: RuntimeError: inductor needs a C++ compiler" in text
    assert "1.00×" in text and "GB/s" in text and "ceiling: copy 3,000 GB/s" in text


@pytest.mark.parametrize("op", ["rope", "add_rmsnorm"])
def test_multi_output_cases_check_every_output(op):
    r = run_case(one(op), ["strata"], lambda s: None, device="cpu", timer=timer, compiler=sim)
    assert r.accuracy.startswith("PASS"), r.accuracy
