"""`strata tune`: measure schedule candidates of a program's kernels on this machine and keep the
fastest correct ones in the tuning database (strata/tune/), which later compiles use.

    strata tune -c CODE [--device cpu] [--budget S] [--force]
    strata tune MODEL [--layer N] [--seq-len S] [--dtype bf16|fp16|fp32] [--budget S]
                     (its prefill of S tokens and the decode step after it; one layer's prefill)
    strata tune --suite [--ops rmsnorm,mlp] [--seqs 1,128] [--dtypes f32] [--budget S]
    strata tune ... --target CPU     (rank schedules for another CPU by llvm-mca; nothing timed)
    strata tune --show
    strata tune --export FILE | --import FILE [--force]   (share winners with machines alike)
    strata tune ... --ray ADDRESS|local      (every node of a Ray cluster searches, on its CPU)
    strata tune ... --continue               (go on with searches an earlier budget cut short)
"""
from __future__ import annotations

import json
from math import exp, log
import os
from pathlib import Path
from statistics import median
import sys
import time

from ..bench.threads_option import add_threads_option
from ..core.context import Context
from ..core.errors import DeviceUnavailable, StrataError
from ..core.targets import get_target
from ..core.user_cache import caching_enabled
from ..models.source import resolve
from ..runtime.mca import NEWER, llvm_mca, mcpu
from ..runtime.threads import THREADS, set_threads
from ..tune.db import TuningDB, db_path
from ..tune.farm import tune_on_farm

DEFAULT_BUDGET_S = 60
MODEL_BUDGET_S = 150    # a model's programs: TinyLlama's prefill and decode tune in 4.5 minutes
                        # (2 Zen 5 cores, docs/tune/model-tinyllama-...)


def add_parser(sub) -> None:
    t = sub.add_parser("tune", help="search each kernel's schedule knobs by measuring them here; "
                                    "later compiles use the winners")
    t.add_argument("model", nargs="?", help="a bundled model name or a directory, as for "
                                            "`strata compile MODEL` (use --layer N for one layer)")
    t.add_argument("-c", "--code", help="the program to tune, as for `strata run -c`")
    t.add_argument("--layer", type=int, metavar="N", help="with MODEL: only decoder layer N")
    t.add_argument("--seq-len", type=int, default=128, metavar="S",
                   help="with MODEL: prompt length (default 128)")
    t.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                   help="with MODEL: weight and activation dtype (default: the config's)")
    t.add_argument("--suite", action="store_true", help="tune the op suite's cases instead")
    t.add_argument("--ops", help="with --suite: only these ops (comma-separated)")
    t.add_argument("--seqs", default="1,128", help="with --suite: token counts (default 1,128)")
    t.add_argument("--dtypes", default="f32,bf16", help="with --suite: dtypes (default f32,bf16)")
    t.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where candidates are timed (default cpu)")
    t.add_argument("--budget", type=float, metavar="S",
                   help=f"seconds of search per program (default {DEFAULT_BUDGET_S}; for a whole "
                        f"MODEL's prefill and decode step, {MODEL_BUDGET_S} each)")
    t.add_argument("--force", action="store_true", help="measure kernels tuned before again")
    t.add_argument("--ray", metavar="ADDRESS",
                   help="search on every node of this Ray cluster, each timing on its own "
                        "hardware (`local`: start one on this machine; needs pip install -e "
                        "\".[ray]\")")
    t.add_argument("--continue", dest="go_on", action="store_true",
                   help="go on with the searches an earlier run's budget cut short (a search "
                        "Ctrl-C cut short goes on without it)")
    t.add_argument("--show", action="store_true", help="print the tuning database and exit")
    t.add_argument("--export", metavar="FILE", help="write this strata version's rows of the "
                   "tuning database to FILE (JSON) and exit")
    t.add_argument("--import", dest="import_", metavar="FILE",
                   help="add the rows of a FILE written by --export (keyed by each machine's "
                        "target, so rows from other machines serve only those) and exit; "
                        "--force lets them replace rows already here")
    t.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="pin a knob for every kernel (the search leaves it alone)")
    t.add_argument("--cost", choices=("count", "mca"), default="count",
                   help="how candidates are ranked before they are timed: tune/cost.py's "
                        "operation count (default), or llvm-mca's cycles for each candidate's "
                        "hot loop (each is compiled first; needs llvm)")
    t.add_argument("--target", metavar="CPU",
                   help="rank each kernel's schedules for this CPU target (cpu-spr, cpu-znver4, "
                        "cpu-neoverse ...) by llvm-mca's model, without timing or storing "
                        "anything: for a CPU strata is not running on")
    add_threads_option(t)
    t.add_argument("--debug", action="store_true", help="show Python tracebacks")


def tune_command(args) -> int:
    db = TuningDB()
    if args.show:
        return _show(db.rows())
    if args.export or args.import_:
        return _export(db, args.export) if args.export else _import(db, args.import_, args.force)
    if (bool(args.code) + bool(args.suite) + bool(args.model)) != 1:
        raise StrataError("give one of MODEL, -c CODE or --suite (or --show)")
    if (args.cost == "mca" or args.target) and llvm_mca()[0] is None:
        raise DeviceUnavailable(f"{'--target' if args.target else '--cost mca'} needs llvm-mca, "
                                f"which is not installed (apt-get install llvm)")
    if args.target:
        _check_llvm_knows(get_target(args.target))
        return _rank(args)
    if not caching_enabled():
        raise StrataError("STRATA_NO_CACHE is set: the tuning database would not be written")
    if args.budget is None:
        args.budget = MODEL_BUDGET_S if args.model and args.layer is None else DEFAULT_BUDGET_S
    if args.budget <= 0:
        raise StrataError(f"--budget {args.budget:g}: give a number of seconds above 0")
    from ..api import check_device
    check_device(args.device)
    if args.device == "cuda":
        raise DeviceUnavailable("strata tune measures on the CPU target so far: use --device cpu")
    pins = dict(item.partition("=")[::2] for item in args.knob)
    Context(knobs=pins)                            # a bad pin is one sentence here
    requests = _requests(args, pins)
    warning = busy_warning(os.getloadavg()[0], os.cpu_count() or 1)
    if warning:
        print(f"strata: {warning}", file=sys.stderr)
    if args.threads is None:            # what the database keeps is timed on every core, not on
        set_threads(THREADS.cores)      # the cores a passing load left (runtime/threads.py)
    from rich.console import Console
    console = Console(stderr=True, highlight=False)
    from ..tune.search import tune_program
    total, speedups, failed, t0 = [], [], 0, time.perf_counter()
    for i, (label, req) in enumerate(requests, start=1):
        where = f"[{i}/{len(requests)}] {label}" if len(requests) > 1 else label
        with console.status(f"{where}: starting") as status:
            def say(text, where=where):
                status.update(f"{where}: {text}")
            try:
                if args.ray:
                    results, _, times = tune_on_farm(args.ray, req, args.budget, db, args.force,
                                                     say, None, args.go_on)
                else:
                    results, _, times = tune_program(req, args.budget, db, args.force, say,
                                                     go_on=args.go_on)
            except KeyboardInterrupt:
                print(f"strata: interrupted: what was measured is kept; the same command goes "
                      f"on from there", file=sys.stderr)
                return 130
            except RuntimeError as e:
                print(f"strata: {label}: {e}", file=sys.stderr)
                failed += 1
                continue
        _print_results(label, results, times)
        if any(not r.note for r in results):       # measured now: no tuned schedule counts 1x
            speedups.append(times[0] / times[1] if times else 1.0)
        total += results
    if failed == len(requests):                     # the error said it all: no summary of nothing
        return 1
    measured = [r for r in total if not r.note and r.default_ms]
    if len(requests) > 1 and speedups:
        better = [x for x in speedups if x != 1.0]
        print(f"programs measured: {len(speedups)}, {len(better)} with a tuned schedule; geomean "
              f"of default / tuned program time {exp(sum(map(log, speedups)) / len(speedups)):.2f}x"
              f" (those {len(better)}: {min(better, default=1):.2f}x to {max(better, default=1):.2f}x)")
    judged = [r for r in measured if r.model_rank is not None]
    if judged:
        hits = sum(bool(r.model_top_ok) for r in judged)
        wide = [r for r in judged if r.spread > 1.2]
        model = "llvm-mca's hot-loop cycles" if args.cost == "mca" else "tune/cost.py's counts"
        print(f"cost model ({model}) on {len(judged)} kernels with 3+ measured schedules: "
              f"median Spearman {median(r.model_rank for r in judged):.2f}; its top pick within "
              f"1.2x of the measured best on {hits} ({100 * hits / len(judged):.0f}%); on the "
              f"{len(wide)} whose schedules differ by more than 1.2x: "
              f"{sum(bool(r.model_top_ok) for r in wide)}")
    sys.stdout.flush()
    print(f"strata: {len(measured)} kernels timed, {len(total) - len(measured)} not (tuned "
          f"before, no knobs, or no budget left) in {time.perf_counter() - t0:.0f} s; database: "
          f"{db_path()}", file=sys.stderr)
    return 1 if failed else 0


def _check_llvm_knows(target) -> None:
    """A CPU only a newer LLVM models (Zen 4: LLVM 16) needs that llvm-mca: an older one models
    an older CPU (znver3), which rejects the target's instructions."""
    name, since = NEWER.get(target.name, ("", 0))
    exe, version = llvm_mca()
    here = f"{exe} (LLVM {version})" if version else f"{exe}, whose name gives no version"
    if version < since:
        raise DeviceUnavailable(f"--target {target.name} needs llvm-mca from LLVM {since} or newer "
                                f"(it models {name}), but the newest here is {here}: apt-get "
                                f"install llvm-19 (Debian's llvm-19 package gives llvm-mca-19)")


def _rank(args) -> int:
    """--target: each kernel's schedules ranked by llvm-mca's model for that CPU, printed."""
    target = get_target(args.target)
    if target.kind != "cpu":
        raise StrataError(f"--target {args.target} is not a CPU: strata tune ranks CPU schedules")
    pins = dict(item.partition("=")[::2] for item in args.knob)
    from ..tune.search import _show
    from ..tune.worker import Worker
    for label, req in _requests(args, pins):
        print(f"strata: {label}: compiling each schedule for {target.name} ...", file=sys.stderr)
        reply = Worker().rank({**req, "target": target.name})
        print(f"{label} on {target.name} (llvm-mca -mcpu={mcpu(target)}; modelled, "
              f"not timed; nothing stored)")
        for k in reply["kernels"]:
            default = next(ms for p, ms in k["ranked"] if not p)
            best = ", ".join(f"{_show(p)} {default / ms:.2f}x" for p, ms in k["ranked"][:3]
                             if ms != float("inf"))
            unpriced = f" ({k['unpriced']} llvm-mca cannot price)" if k["unpriced"] else ""
            print(f"  {k['name']:<28} default {default * 1e3:10.1f} us modelled, "
                  f"{len(k['ranked'])} schedules{unpriced}; fastest: {best}")
    return 0


def busy_warning(load: float, cores: int) -> str | None:
    """A sentence when other processes keep the CPU busy: a schedule timed against them can look
    many times faster than the default only because the default's threads waited (an OpenMP team
    spinning against another process), and the database would keep that."""
    if load < 0.75:
        return None
    return (f"the machine is busy (load {load:.1f} over the last minute on {cores} cores): "
            f"timings will be noisy and may crown a schedule that only looked faster; tune on a "
            f"quiet machine")


def _requests(args, pins: dict) -> list[tuple[str, dict]]:
    base = {"op": "prepare", "device": args.device, "knobs": pins, "cost": args.cost}
    if args.model:
        resolve(args.model)                      # an unknown MODEL is one sentence here
        model = {**base, "model": args.model, "layer": args.layer, "seq_len": args.seq_len,
                 "dtype": args.dtype}
        if args.layer is not None:
            return [(f"{args.model} layer {args.layer}", model)]
        # the prefill and decode step `strata generate` compiles for a prompt of --seq-len tokens
        from ..models.decode import NEW_TOKENS, cache_positions
        max_len = cache_positions(args.seq_len + NEW_TOKENS)
        model["max_len"] = max_len
        return [(f"{args.model} prefill of {args.seq_len} tokens", model),
                (f"{args.model} decode step ({max_len}-position cache)", {**model, "decode": True})]
    if args.code:
        return [(args.code if len(args.code) <= 40 else args.code[:37] + "...",
                 {**base, "code": args.code})]
    from ..bench.cases import DTYPE_ALIASES, OPS, SEQS, cases, parse_list
    ops = parse_list(args.ops, tuple(OPS), "op") if args.ops else tuple(OPS)
    seqs = [int(s) for s in parse_list(args.seqs, tuple(str(s) for s in SEQS), "seq")]
    dtypes = parse_list(args.dtypes, ("f32", "bf16"), "dtype", DTYPE_ALIASES)
    chosen = cases(models=("tinyllama",), seqs=tuple(seqs), dtypes=tuple(dtypes), ops=tuple(ops))
    return [(c.name, {**base, "case": c.name}) for c in chosen]


def _print_results(label: str, results, times) -> None:
    """One line per kernel: its time with the default schedule and with the winner (interleaved
    medians of the same rounds; on the CPU the kernel's launches alone, on buffers a whole run
    filled), and the winner's knobs; then the program with every tuned schedule against the
    defaults."""
    print(f"{label}   (each kernel alone: default -> tuned schedule)")
    if times:
        print(f"  whole program, every tuned schedule: {times[0] * 1e3:.1f} us -> "
              f"{times[1] * 1e3:.1f} us, {times[0] / times[1]:.2f}x")
    for r in results:
        if r.note:
            print(f"  {r.name:<28} {r.note}")
            continue
        if not r.default_ms:
            why = (f"each of {r.tried} candidates compiled to the default's code or did not fit"
                   if r.complete else f"the budget ran out after {r.tried} candidates")
            print(f"  {r.name:<28} nothing timed: {why}")
            continue
        cut = "" if r.complete else (f", budget ran out with {len(r.untried)} left: --continue "
                                     f"tries them")
        knobs = ", ".join(f"{k}={v}" for k, v in r.knobs.items()) or "default kept"
        model = "" if r.model_rank is None else f", cost model rank {r.model_rank:+.2f}"
        print(f"  {r.name:<28} {r.default_ms * 1e3:9.1f} us -> {r.ms * 1e3:9.1f} us  "
              f"{r.speedup:5.2f}x  {knobs}  ({r.tried} tried{cut}{model})")
        for why in r.rejected:
            print(f"    rejected {why}")
        if r.dropped:
            print(f"    {r.dropped}")


EXPORT_FORMAT = "strata tuning database 1"


def _export(db: TuningDB, path: str) -> int:
    rows = db.rows()
    try:
        Path(path).write_text(json.dumps({"format": EXPORT_FORMAT, "version": db.version,
                                          "rows": rows}, indent=1))
    except OSError as e:
        raise StrataError(f"--export {path}: cannot write it ({e.strerror or e})") from None
    print(f"strata: wrote {len(rows)} rows of strata {db.version} to {path}", file=sys.stderr)
    return 0


def _import(db: TuningDB, path: str, force: bool) -> int:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise StrataError(f"--import {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StrataError(f"--import {path}: not a file `strata tune --export` wrote ({e})") from None
    rows = data.get("rows") if isinstance(data, dict) and data.get("format") == EXPORT_FORMAT else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise StrataError(f"--import {path}: not a file `strata tune --export` wrote")
    try:
        added, kept, skipped = db.merge(rows, replace=force)
    except StrataError as e:
        raise StrataError(f"--import {path}: {e}") from None
    print(f"strata: {added} rows added from {path}"
          + (f", {kept} kept as they were here (--force replaces them)" if kept else "")
          + (f", {skipped} skipped: measured by another strata version ({data.get('version')}), "
             f"whose kernels are not this one's" if skipped else ""), file=sys.stderr)
    return 0


def _show(rows: list[dict]) -> int:
    if not rows:
        print("the tuning database is empty: run `strata tune -c CODE` or `strata tune --suite`")
        return 0
    print(f"{'kernel (what it writes)':<40} {'target':<10} {'default us':>10} {'tuned us':>10} "
          f"{'speedup':>8} {'others':>6}  knobs   (the kernel's launches alone; others: the CPU "
          f"share other processes took while it was timed)")
    for r in rows:
        knobs = ", ".join(f"{k}={v}" for k, v in json.loads(r["knobs"]).items()) or "default"
        speed = r["default_ms"] / r["tuned_ms"] if r["tuned_ms"] else 1.0
        others = "?" if r.get("other_load") is None else f"{100 * r['other_load']:.0f}%"
        print(f"{r['label'][:40]:<40} {r['target'].split(':')[0]:<10} {r['default_ms'] * 1e3:10.1f} "
              f"{r['tuned_ms'] * 1e3:10.1f} {speed:7.2f}x {others:>6}  {knobs}")
    return 0
