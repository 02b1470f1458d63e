"""The accuracy verdict that comes before any speed: a strata program's outputs on the GPU against
PyTorch eager in float64, with the tolerances of strata/bench/check.py (1e-5 float32, 1e-4 with a
contraction, 1e-2 fp16/bf16, integers exact)."""
from __future__ import annotations

import torch

from ..api import to_numpy
from ..core import dtypes
from . import check


def has_contraction(program) -> bool:
    tp = getattr(program, "torch_program", None)
    return bool(tp) and any(n.op.startswith(check.CONTRACTIONS) for n in tp.nodes)


def output_names(program, n: int) -> list[str]:
    lowered = getattr(program, "lowered", None)
    names = list(getattr(getattr(lowered, "kernel", None), "outputs", None) or [])
    return names if len(names) == n else [f"out{i}" for i in range(n)]


def check_program(program, fn, inputs, outputs=None) -> check.Report:
    """Run `program(*inputs)` (unless its `outputs` are given) and compare with eager float64."""
    if outputs is None:
        with torch.no_grad():
            outputs = program(*inputs)
    got, _ = torch.utils._pytree.tree_flatten(outputs)
    ref = check.eager_reference(fn, inputs)
    mm = has_contraction(program)
    checks = []
    for name, g, r in zip(output_names(program, len(got)), got, ref):
        dt = dtypes.from_torch(g.dtype)
        checks.append(check.compare(name, dt, to_numpy(g), r, check.tolerance(dt, mm)))
    if len(got) != len(ref):
        checks.append(check.OutputCheck("outputs", "", float("inf"), float("inf"), 0.0, False))
    return check.Report(checks)


def verdict_line(report: check.Report) -> str:
    worst_abs = max((o.max_abs for o in report.outputs), default=0.0)
    worst_rel = max((o.rel for o in report.outputs), default=0.0)
    return f"{'PASS' if report.passed else 'FAIL'}  max abs err {worst_abs:.3g}  rel err {worst_rel:.3g}"


def print_verdict(report: check.Report, console) -> None:
    check.print_checks(report, console)
    console.print(verdict_line(report) + "  (CUDA vs eager float64)")
