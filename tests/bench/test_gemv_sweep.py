"""The GEMV sweep's plumbing on the CPU: the simulator compiles each candidate, a fake timer
stands in for CUDA events; the rows, the fastest per shape and the budget are what is checked."""
import torch

import strata
from strata.bench import gemv_sweep as G
from strata.bench.contractions import kernel_summary
from strata.core.context import Context


def _compiler(module, x, knobs):
    return strata.compile(module, (x,), device="sim", ctx=Context(target="sm_90a", knobs=knobs))


def _timer(fn, args):
    """1 for CUDA-core kernels, 2 for tensor cores, 1.5 for cuBLAS: the rows form is fastest."""
    if not hasattr(fn, "kernels"):
        return 1.5
    return 1.0 if kernel_summary(fn).endswith("(no tensor cores)") else 2.0


def test_every_candidate_is_checked_and_the_fastest_named(monkeypatch):
    monkeypatch.setattr(G, "VARIANTS", {"bf16": ({}, {"INSTR": "fma"}, {"SPLIT_K": 3}),
                                        "q4_0": ({}, {"SPLIT_K": 2})})
    shapes = [G.Shape("tiny", 256, 40)]
    with torch.no_grad():
        rows = G.sweep(shapes, ["bf16", "q4_0"], _compiler, _timer, budget_s=600)
    assert [(r.fmt, G.show(r.knobs)) for r in rows] == [
        ("bf16", "default"), ("bf16", "INSTR=fma"), ("bf16", "SPLIT_K=3"), ("q4_0", "default"),
        ("q4_0", "SPLIT_K=2")]
    by = {(r.fmt, G.show(r.knobs)): r for r in rows}
    assert by["bf16", "INSTR=fma"].ms == 1.0 and by["bf16", "default"].ms == 2.0
    assert by["bf16", "SPLIT_K=3"].ms is None and "SPLIT_K" in by["bf16", "SPLIT_K=3"].status
    assert all(r.ref_ms == 1.5 for r in rows)
    head, body, notes = G.table(rows, copy_gbps=100.0)
    assert len(body) == 5 and all(len(b) == len(head) for b in body)
    assert "**INSTR=fma**" in [b[3] for b in body]
    assert any(n.startswith("tiny bf16: fastest INSTR=fma") for n in notes)
    # weight bytes over time: 256 x 40 bf16 in 1 ms
    assert abs(by["bf16", "INSTR=fma"].gbps - 2 * 256 * 40 / 1e6) < 1e-9


def test_a_spent_budget_leaves_rows_saying_so():
    rows = G.sweep([G.Shape("tiny", 256, 40)], ["bf16"], _compiler, _timer, budget_s=0)
    assert rows and all(r.ms is None and "budget" in r.status for r in rows)


def test_the_step_shapes_merge_siblings_as_the_step_runs_them():
    from strata.models.source import resolve
    shapes = [(s.label, s.k, s.n) for s in G.step_shapes(resolve(G.MODEL).config)]
    assert shapes == [("gate/up", 2048, 11264), ("down", 5632, 2048), ("q/k/v", 2048, 2560),
                      ("o", 2048, 2048), ("lm_head", 2048, 32000)]
