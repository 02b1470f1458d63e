"""`python -m strata.gpu_check --out DIR [--limit-s 480] [--dry-run]`: see __init__.py."""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import steps as S
from .environment import facts
from .report import Report, Step

REPO = Path(__file__).resolve().parents[2]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m strata.gpu_check",
                                description="The GPU acceptance run: environment, GPU tests, "
                                            "compute-sanitizer, benchmarks and ncu, in one call.")
    p.add_argument("--out", default="gpu_check_out",
                   help="folder for the report (gpu_check.md, .json) and the packed logs")
    p.add_argument("--limit-s", type=float, default=570.0,
                   help="start nothing after this many seconds (default 570: a device command "
                        "may run 600, its machine's start not counted; the report is packed after)")
    p.add_argument("--dry-run", action="store_true",
                   help="on a CPU machine: the same steps, the simulator standing in for the GPU")
    # the GPU tests are mostly NVRTC compiles on the host: every core but the two the sanitizer
    # (running beside them) and the benchmarks' host side want (run 6: 203 s on 8 of 16 cores)
    p.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 4) - 2)),
                   help="pytest processes for the GPU tests (default: every core but two, at most 14)")
    p.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                   help=f"a subset of: {','.join(STEPS)} (default all but contractions-full; a "
                        f"rerun takes only what failed)")
    return p


STEPS = ("install", "tests", "sanitizer", "overhead", "decode", "contractions", "decode-q4",
         "gemv-sweep", "attention-sweep", "suite", "training", "ncu", "contractions-full")
DEFAULT_STEPS = STEPS[:-1]      # the whole table takes a second call: --steps contractions-full


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.limit_s <= 0 or args.workers < 1:
        print("--limit-s and --workers must be positive", file=sys.stderr)
        return 2
    chosen = [s.strip() for s in args.steps.split(",") if s.strip()]
    if not chosen or any(s not in STEPS for s in chosen):
        print(f"--steps {args.steps!r}: choose from {', '.join(STEPS)}", file=sys.stderr)
        return 2
    import torch
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA GPU is visible to torch; run with --dry-run on a CPU machine",
              file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    logs = Path(tempfile.mkdtemp(prefix="strata-gpu-check-"))
    run = S.Run(REPO, logs, time.monotonic() + args.limit_s, args.dry_run)
    os.environ.setdefault("STRATA_CACHE_DIR", tempfile.mkdtemp(prefix="strata-gpu-check-cache-"))
    mode = "dry run (no GPU: the simulator stands in)" if args.dry_run else "GPU run"
    report = Report(f"strata GPU acceptance run, {mode}, "
                    f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    lock = threading.Lock()

    def record(step: Step) -> None:
        with lock:
            report.steps.append(step)
            report.write(out, logs)
            print(f"[gpu_check] {step.name}: {step.status} ({step.seconds:.0f} s) {step.summary}",
                  file=sys.stderr, flush=True)

    def timed(name: str, fn, *a) -> None:
        if run.left() < 10:
            record(Step(name, "skipped", 0.0, "the run's time limit was reached first"))
            return
        t0 = time.monotonic()
        try:
            step = fn(run, *a)
        except Exception as e:        # a broken step is a row of the report, not the end of it
            step = Step(name, "fail", summary=f"gpu_check itself failed: {type(e).__name__}: {e}")
        step.seconds = step.seconds or time.monotonic() - t0
        record(step)

    if "install" in chosen:
        timed("install", S.install)
    report.facts = facts()
    report.facts["limit"] = f"{args.limit_s:.0f} s"
    report.facts["steps"] = ", ".join(chosen)
    with ThreadPoolExecutor(2) as pool:      # correctness checks together: neither is timed
        jobs = [("tests", "GPU tests", S.gpu_tests, args.workers),
                ("sanitizer", "compute-sanitizer", S.sanitizer)]
        for f in [pool.submit(timed, *job[1:]) for job in jobs if job[0] in chosen]:
            f.result()
    # one at a time (they time the GPU), the issues' headline numbers first: a run cut short
    # by its time limit loses the op suite (and ncu, which ranks its cases), not the decode
    for step, name in (("overhead", "call overhead"), ("decode", "decode"),
                       ("contractions", "contractions"), ("decode-q4", "decode q4_0"),
                       ("gemv-sweep", "gemv sweep"), ("attention-sweep", "attention sweep"),
                       ("suite", "op suite"), ("training", "training")):
        if step in chosen:
            timed(name, S.bench, name)
    if "ncu" in chosen:
        timed("ncu on the slowest kernels", S.ncu_slowest)
    if "contractions-full" in chosen:
        timed("contractions full", S.bench, "contractions full")
    report.write(out, logs)
    print(report.markdown())
    bad = [s.name for s in report.steps if s.status in ("fail", "timeout")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
