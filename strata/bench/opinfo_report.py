"""`python -m strata.bench.opinfo_report`: every PyTorch OpInfo sample of every op strata covers,
through the whole pipeline on the simulator (strata/bench/opinfo_cases.py), as a markdown table:
per op the samples, how many passed, how many strata refused with a clear error (and why), how
many failed (a wrong result or an internal error, and the cause); then the totals and the pass
rate. docs/opinfo.md is its output.

    python -m strata.bench.opinfo_report                  # float32 samples, every in-scope op
    python -m strata.bench.opinfo_report --op sum --op diff --dtype bfloat16 -j 2 -o report.md
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
import os
import platform
import sys
import time
from collections import defaultdict
from datetime import date

from .opinfo_cases import (FAILED, OpResult, PASSED, UNSUPPORTED, cause_key, in_scope_ops, op_id,
                           run_op)

COLUMNS = ("op", "samples", "passed", "unsupported", "failed",
           "why (unsupported: reason; failed: cause)")


def _md_row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _reasons(result: OpResult) -> str:
    """The distinct causes of one op's samples that did not pass, with their counts."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for o in result.outcomes:
        if o.status != PASSED:
            counts[(o.status, cause_key(o.cause))] += 1
    return "; ".join(f"{status}: {key} (×{n})" for (status, key), n in counts.items())


def totals(results: list[OpResult]) -> dict:
    n = sum(len(r.outcomes) for r in results)
    out = {"ops": len(results), "samples": n, "excluded": sum(len(r.excluded) for r in results)}
    for status in (PASSED, UNSUPPORTED, FAILED):
        out[status] = sum(r.count(status) for r in results)
    out["pass_rate"] = out[PASSED] / n if n else 0.0
    return out


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def summary_line(t: dict) -> str:
    return (f"{_n(t['samples'], 'sample')} of {_n(t['ops'], 'op')}: {t[PASSED]} passed "
            f"({100 * t['pass_rate']:.1f}%), {t[UNSUPPORTED]} unsupported with a clear error, "
            f"{t[FAILED]} failed (wrong result or internal error)")


def scope_lines(results: list[OpResult]) -> list[str]:
    """The totals of the first scope (issue 11's ops) and of the ops added since, when both ran."""
    first = [r for r in results if r.first]
    more = [r for r in results if not r.first]
    if not first or not more:
        return []
    return [f"- the first scope (opinfo_cases.IN_SCOPE): {summary_line(totals(first))}",
            f"- the ops added since (opinfo_cases.MORE): {summary_line(totals(more))}"]


def by_cause(results: list[OpResult], status: str) -> list[tuple[str, int, list[str]]]:
    """[(cause, samples, ["op sampleK", ...])] of one status, most frequent first."""
    groups: dict[str, list[str]] = defaultdict(list)
    for r in results:
        for o in r.outcomes:
            if o.status == status:
                groups[cause_key(o.cause)].append(f"{r.op} {o.case}")
    return sorted(((k, len(v), v) for k, v in groups.items()), key=lambda x: (-x[1], x[0]))


def _examples(names: list[str], limit: int = 4) -> str:
    more = f", … ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def render(results: list[OpResult], header: list[str]) -> str:
    """The markdown report; `header`: lines about where and when it ran."""
    t = totals(results)
    lines = ["# PyTorch OpInfo samples through strata", ""] + header
    lines += ["", f"**{summary_line(t)}.**", ""]
    scopes = scope_lines(results)
    lines += scopes + ([""] if scopes else [])
    lines += [
        ("Every sample `op.sample_inputs(\"cpu\", dtype)` gives for the in-scope ops and variants "
         "(zero-size and 0-d ones included), and each again with its inputs strided (`.nc`: "
         "every other element, the gaps NaN) and stored transposed (`.t`) where that differs, "
         "compiled with `strata.compile` (all samples of one op as one program; a program that "
         "fails is split until each error has its own sample), its CUDA compiled by NVRTC, run "
         "on the simulator and checked by `strata.bench.check.verify` (values against eager in float64, "
         "shape, dtype, output count) and through the Tensor IR evaluator. *unsupported*: strata "
         "raised a StrataError with the sentence shown; *failed*: a wrong result or any other "
         "error."), "",
        _md_row(COLUMNS), "|" + "|".join(["---"] + ["---:"] * 4 + ["---"]) + "|"]
    for r in results:
        lines.append(_md_row((r.op, len(r.outcomes), r.count(PASSED), r.count(UNSUPPORTED),
                              r.count(FAILED), _reasons(r))))
    lines.append(_md_row(("**total**", t["samples"], t[PASSED], t[UNSUPPORTED], t[FAILED],
                          f"pass rate {100 * t['pass_rate']:.1f}%")))
    for status, title in ((FAILED, "Failures by cause"), (UNSUPPORTED, "Unsupported by reason")):
        lines += ["", f"## {title}", ""]
        groups = by_cause(results, status)
        lines += [f"- {k} — {n} sample{'s' if n != 1 else ''}: {_examples(v)}"
                  for k, n, v in groups] or ["- none"]
    excluded = [(r.op, name, why) for r in results for name, why in r.excluded]
    if excluded:
        lines += ["", "## Not run (eager itself rejects the sample)", ""]
        lines += [f"- {op} {name}: {why}" for op, name, why in excluded]
    return "\n".join(lines) + "\n"


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{os.cpu_count()}-core {model or platform.processor() or platform.machine()} CPU"


def _run_one(args) -> OpResult:
    op_name, dtype_name, nvrtc = args
    import torch
    op = next(o for o in in_scope_ops() if op_id(o) == op_name)
    return run_op(op, nvrtc=nvrtc, dtype=getattr(torch, dtype_name))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.opinfo_report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--op", action="append", default=[],
                   help="only this op (as in the table: sum, div.floor_rounding); repeatable")
    p.add_argument("--dtype", default="float32", help="the samples' dtype (default float32)")
    p.add_argument("--no-nvrtc", action="store_true", help="skip compiling the CUDA with NVRTC")
    p.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("-o", "--out", help="also write the markdown to this file")
    args = p.parse_args(argv)
    import torch
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        p.error(f"unknown dtype {args.dtype!r}")
    ops = in_scope_ops()
    known = [op_id(o) for o in ops]
    for name in args.op:
        if name not in known:
            p.error(f"{name!r} is not an in-scope op; choose from {', '.join(known)}")
    chosen = [o for o in ops if (not args.op or op_id(o) in args.op)
              and dtype in o.supported_dtypes("cpu")]
    work = [(op_id(o), args.dtype, not args.no_nvrtc) for o in chosen]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_run_one, work))
    else:
        results = []
        for item in work:
            results.append(_run_one(item))
            r = results[-1]
            print(f"{r.op}: {len(r.outcomes)} samples, {r.count(PASSED)} passed, "
                  f"{r.count(UNSUPPORTED)} unsupported, {r.count(FAILED)} failed",
                  file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0
    header = [f"- date: {date.today().isoformat()}",
              f"- machine: {machine()}; kernels run on strata's simulator "
              f"(NVRTC {'skipped' if args.no_nvrtc else 'compiles every program for sm_90'})",
              f"- torch {torch.__version__}, samples of dtype {args.dtype}",
              f"- run time: {seconds:.0f} s with {args.jobs} "
              f"process{'es' if args.jobs > 1 else ''}"]
    text = render(results, header)
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 1 if totals(results)[FAILED] else 0


if __name__ == "__main__":
    sys.exit(main())
