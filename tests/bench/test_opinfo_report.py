"""The OpInfo report (python -m strata.bench.opinfo_report) from given outcomes: totals, pass rate,
the per-op row and the causes grouped across samples; and how an exception is classified."""
from strata.bench import opinfo_cases as oc
from strata.bench import opinfo_report as R
from strata.core.errors import CompileError, DataDependentShape, SimError, UnsupportedOp


def result(op, outcomes, excluded=()):
    return oc.OpResult(op, [oc.Outcome(name, status, cause, "5x5 float32")
                            for name, status, cause in outcomes], list(excluded))


RESULTS = [
    result("sum", [("sample0", oc.PASSED, ""), ("sample0.nc", oc.PASSED, "")]),
    result("narrow", [("sample0", oc.PASSED, ""),
                      ("sample1", oc.UNSUPPORTED, "unsupported op aten.x (at t.py:3 `f(x)`)"),
                      ("sample1.nc", oc.UNSUPPORTED, "unsupported op aten.x (at t.py:3 `f(x)`)")]),
    result("prod", [("sample0", oc.FAILED, "wrong values: f32 rel err 1, max abs err 9e-57 "
                                           "(tolerance 1e-05)"),
                    ("sample2", oc.FAILED, "wrong values: f32 rel err 0.5, max abs err 2 "
                                           "(tolerance 1e-05)"),
                    ("sample3", oc.FAILED, "KeyError: 'a' (at strata/loop/lower.py:12)")],
           excluded=[("sample4.t", "eager raises RuntimeError: view size")]),
]


def test_totals_and_summary():
    t = R.totals(RESULTS)
    assert (t["samples"], t[oc.PASSED], t[oc.UNSUPPORTED], t[oc.FAILED]) == (8, 3, 2, 3)
    assert R.summary_line(t) == ("8 samples of 3 ops: 3 passed (37.5%), 2 unsupported with a "
                                 "clear error, 3 failed (wrong result or internal error)")


def test_causes_group_across_samples_and_keep_the_strata_line():
    failed = R.by_cause(RESULTS, oc.FAILED)
    assert failed[0] == ("wrong values: f32 rel err N, max abs err N (tolerance 1e-05)", 2,
                         ["prod sample0", "prod sample2"])
    assert failed[1][0] == "KeyError: 'a' (at strata/loop/lower.py:12)"
    assert R.by_cause(RESULTS, oc.UNSUPPORTED) == [
        ("unsupported op aten.x", 2, ["narrow sample1", "narrow sample1.nc"])]


def test_markdown():
    text = R.render(RESULTS, ["- date: 2026-11-24"])
    assert "| narrow | 3 | 1 | 2 | 0 | unsupported: unsupported op aten.x (×2) |" in text
    assert "| **total** | 8 | 3 | 2 | 3 | pass rate 37.5% |" in text
    assert "## Failures by cause" in text and "## Unsupported by reason" in text
    assert "- prod sample4.t: eager raises RuntimeError: view size" in text


def test_classify():
    assert oc.classify(UnsupportedOp("aten.x")) == (oc.UNSUPPORTED, "unsupported op aten.x")
    assert oc.classify(DataDependentShape("aten.nonzero"))[0] == oc.UNSUPPORTED
    assert oc.classify(CompileError("bad"))[0] == oc.FAILED
    assert oc.classify(SimError("race"))[0] == oc.FAILED
    status, cause = oc.classify(KeyError("k"))
    assert status == oc.FAILED and cause.startswith("KeyError: 'k'")


def test_scope_lines_split_the_first_scope_from_the_ops_added():
    added = result("log2", [("sample0", oc.PASSED, "")])
    added.first = False
    assert R.scope_lines(RESULTS) == []
    lines = R.scope_lines(RESULTS + [added])
    assert lines[0].endswith("8 samples of 3 ops: 3 passed (37.5%), 2 unsupported with a clear "
                             "error, 3 failed (wrong result or internal error)")
    assert lines[1] == ("- the ops added since (opinfo_cases.MORE): 1 sample of 1 op: 1 passed "
                        "(100.0%), 0 unsupported with a clear error, 0 failed (wrong result or "
                        "internal error)")
    assert "- the ops added since" in R.render(RESULTS + [added], [])


def _cases(*fns):
    import torch
    return [oc.Case(f"sample{k}", fn, (torch.randn(3, 4),), 1) for k, fn in enumerate(fns)]


def test_runner_splits_a_failing_program_until_each_error_has_its_sample():
    import torch
    cases = _cases(lambda x: x + 1, lambda x: torch.nonzero(x > 0), lambda x: x.sum(0),
                   lambda x: x * 2)
    runner = oc._Runner(None, nvrtc=False, evaluator=True)
    runner.run(cases)
    got = {k: o.status for k, o in runner.out.items()}
    assert got == {"sample0": oc.PASSED, "sample1": oc.UNSUPPORTED, "sample2": oc.PASSED,
                   "sample3": oc.PASSED}
    assert "depends on the data" in runner.out["sample1"].cause


def test_runner_blames_an_error_that_shows_only_with_other_samples(monkeypatch):
    from strata import api
    run_flat = api.Program.run_flat

    def only_together(self, inputs):
        if len(inputs) > 1:
            raise KeyError("boom")
        return run_flat(self, inputs)
    monkeypatch.setattr(api.Program, "run_flat", only_together)
    runner = oc._Runner(None, nvrtc=False, evaluator=False)
    runner.run(_cases(lambda x: x + 1, lambda x: x - 1))
    for o in runner.out.values():
        assert o.status == oc.FAILED and o.cause.startswith("(only with other samples) KeyError")
