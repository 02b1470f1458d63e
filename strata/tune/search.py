"""Measured search over each kernel's schedule knobs, on the device at hand, kept in the tuning
database so that later compiles use the winner.

How: a worker process (worker.py) compiles the program with its default schedule and checks it
against eager; then, kernel by kernel, each candidate pins knobs for that kernel only (Context's
kernel_knobs) and is compiled, checked against eager (a wrong one is discarded and reported: a
compiler bug) and timed interleaved with the default in the same rounds. Candidates are first
every other allowed value of each knob the kernel's schedule consulted, one knob at a time, then
the combination of the knobs that helped; the best is timed again with more rounds and kept only
when it beats the default by more than the noise margin, so the default is always a candidate and
a tuned schedule is never slower than it was measured to be; every candidate timed is kept with
its time (strata view lists them). On the CPU a kernel is timed alone
(its launches on buffers a whole run filled), which sees a small kernel's gain that a long
program's time would drown; the whole program is then timed with every winner, and when it is
not faster the program's winners are dropped. A crash or a hang (timeout) kills
the worker, is reported, and the search goes on with a fresh one. A kernel already in the
database is not measured again (--force re-measures). A search the budget cut short is recorded
with the candidates it did not get to, which `--continue` tries later; one cut short by Ctrl-C
is recorded so too, and the next run goes on from there by itself.
"""
from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..core.cpu_load import OtherLoad, busy_sentence
from ..core.knobs import KNOBS
from .calibrate import calibrated, kind, learned
from .cost import spearman
from .db import TuningDB

# the values tried for each knob (filtered by the knob's own rule)
VALUES = {
    "TILE_M": (16, 32, 48, 64, 96, 128, 192, 256), "TILE_N": (4, 8, 16, 32, 64, 128),
    "THREAD_M": (1, 2, 3, 4, 5, 6, 8), "PROLOGUE": ("fuse", "materialize"),
    "TILE_K": (8, 16, 32, 64, 128), "THREAD_N": (1, 2, 4, 8), "SPLIT_K": (1, 2, 4, 8),
    "STAGES": (2, 3, 4), "WARPS_M": (1, 2, 4), "WARPS_N": (1, 2, 4), "VEC": (1, 2, 4, 8),
    "BLOCK": (64, 128, 256, 512), "GROUP": (1, 32, 64, 128, 256), "CHUNKS": (1, 2, 4, 8),
    "BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (16, 32, 64, 128), "KV_SPLITS": (1, 2, 4, 8),
    "THREADS": (0, 1, 2, 4, 8), "KEEP": (True, False), "PREFETCH": (True, False),
    "FORM": ("outer", "dot", "pairs", "amx"), "K_CHUNK": (512, 1024, 2048, 4096),
    "QDOT": ("vnni", "float"), "QGEMM": ("int8", "bf16"), "ORDER": ("mn", "nm"),
    "L2_PREFETCH": (0, 2048, 8192, 32768), "STORE": (0, 1, 2, 3),
}
NOISE = 0.97            # a candidate must take under 97% of the default's time to win
MINOR, MINOR_MS = 0.02, 0.05    # kernels under 2% of a program's kernel time (when that is over
                                # 50 us: below it every kernel is launch overhead) are not searched
ROUNDS, CONFIRM_ROUNDS = 7, 15
TIMEOUT_S = 120         # one candidate's compile, check and timing
PREPARE_S = 1800        # the program's first compile and check: a whole model's takes minutes


@dataclass
class KernelResult:
    name: str
    label: str
    signature: str
    default_knobs: dict
    knobs: dict = field(default_factory=dict)       # the winner's pins ({}: the default won)
    default_ms: float = 0.0
    ms: float = 0.0
    tried: int = 0
    rejected: list[str] = field(default_factory=list)
    note: str = ""                                  # why nothing was measured
    stopped: str = ""           # "budget" or "interrupted": ended before its last candidate
    untried: list = field(default_factory=list)     # the candidates it did not get to
    model_rank: float | None = None     # Spearman of the cost model against the measured times
    model_top_ok: bool | None = None    # its top pick within 1.2x of the measured best
    spread: float = 1.0                 # slowest / fastest measured schedule
    dropped: str = ""                   # why a winner was not kept (the program was not faster)
    other_load: float | None = None     # share of the CPU other processes took while it was timed
    measured: list = field(default_factory=list)    # [pins, ms, default ms] of each timed one

    @property
    def complete(self) -> bool:
        return not self.stopped

    @property
    def speedup(self) -> float:
        return self.default_ms / self.ms if self.ms else 1.0


class WorkerProcess:
    """worker.py in a child process; `ask` answers {"error": "crashed" | "hung"} instead of
    raising when the child dies or overruns, and restarts it."""

    def __init__(self, prepare: dict, command: list[str] | None = None):
        self.prepare, self.proc, self.info = prepare, None, {}
        self.command = command or [sys.executable, "-m", "strata.tune.worker"]

    def start(self) -> dict:
        self.proc = subprocess.Popen(self.command, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.info = self.ask(self.prepare, timeout=PREPARE_S, restart=False)
        return self.info

    def ask(self, req: dict, timeout: float | None = None, restart: bool = True) -> dict:
        timeout = TIMEOUT_S if timeout is None else timeout
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            line = self.proc.stdout.readline() if ready else None
        except (BrokenPipeError, OSError):
            line = ""
        if line:
            return json.loads(line)
        if line is None:
            reply = {"error": "hung", "why": f"no answer within {timeout:.0f} s"}
        else:
            reply = {"error": "crashed", "why": f"the process exited with code {self.proc.wait()}"}
        self.close()
        if restart:
            self.start()
        return reply

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def candidates(default_knobs: dict, cores: int = 1 << 10, stores: int = 8,
               team: int = 0) -> list[dict]:
    """One knob changed at a time, to every other value it may take (no more THREADS than
    the target has cores, no more STORE than the kernel has values to store). `team`: the
    threads the default already runs on (1 serial, the cores in parallel; 0 unknown): THREADS
    set to it builds the default's loops again, which only measures noise."""
    out = []
    for name, value in default_knobs.items():
        for v in VALUES.get(name, ()):
            if v != value and KNOBS[name].ok(v) and \
                    not (name == "THREADS" and (v == team or v > cores)) and \
                    not (name == "STORE" and v > stores):
                out.append({name: v})
    return out


def _show(knobs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "default"


def tune_kernel(worker: WorkerProcess, k: dict, deadline: float, say, cores: int = 1 << 10,
                before: dict | None = None) -> KernelResult:
    """Search one kernel's knobs until `deadline` (time.monotonic()); `before`: how an earlier
    search of it stopped (TuningDB.search), whose timed candidates count and whose untried ones
    are what is left to try. Ctrl-C ends it with what it had not tried (stopped "interrupted")."""
    r = KernelResult(k["name"], k["label"], k["signature"], k["knobs"])
    pending = candidates(r.default_knobs, cores, k.get("stores", 8), k.get("team", 0))
    try:
        return _search(worker, r, pending, deadline, say, before, cores, k.get("ratios", {}))
    except KeyboardInterrupt:
        r.stopped, r.untried, r.knobs = "interrupted", pending, {}
        return r


def _key(pins: dict) -> str:
    return json.dumps(pins, sort_keys=True)


def _search(worker, r: KernelResult, pending: list, deadline: float, say, before,
            cores: int, ratios: dict) -> KernelResult:
    """tune_kernel's search; `pending` is emptied from the front as candidates are tried."""
    sig, measured = r.signature, {}          # {pins as json: ratio to the default}
    if before:
        r.measured, r.rejected, r.tried = list(before["measured"]), list(before["rejected"]), before["tried"]
        measured.update((_key(pins), ms / default) for pins, ms, default in r.measured)
        r.default_ms = r.ms = before["default_ms"]
        left = {_key(p) for p in before["untried"]}
        pending[:] = [p for p in pending if _key(p) in left]

    def attempt(pins: dict, rounds: int = ROUNDS) -> float | None:
        reply = worker.ask({"op": "try", "kernel_knobs": {sig: pins}, "rounds": rounds})
        r.tried += 1
        if "error" in reply:
            if reply["error"] != "does not fit":
                r.rejected.append(f"{_show(pins)}: {reply['error']}: {reply['why']}")
            return None
        if reply.get("same"):
            return None
        ratio = reply["ms"] / reply["default_ms"]
        r.measured.append([pins, reply["ms"], reply["default_ms"]])
        r.default_ms = r.ms = r.default_ms or reply["default_ms"]
        measured[_key(pins)] = ratio
        best = min(measured.values())
        say(f"{r.name}: {r.tried} candidates, best {1 / best:.2f}x the default")
        return ratio

    estimates, left = {}, deadline - time.monotonic()
    if left > 0 and pending:    # the cost model's order, the likeliest winners first, in half the time
        reply = worker.ask({"op": "estimate", "candidates": [{sig: {}}] + [{sig: p} for p in pending],
                            "seconds": left / 2}, timeout=TIMEOUT_S + left / 2)
        if "ms" in reply:
            roofline = {_key(p): e for p, e in zip([{}] + pending, reply["ms"])}
            estimates = calibrated(roofline, ratios, r.default_ms or None)
            pending.sort(key=lambda p: estimates.get(_key(p), float("inf")))
    built = set()       # candidates compiled ahead, a batch of one per core (worker "build")
    while pending:
        if time.monotonic() > deadline:
            r.stopped, r.untried = "budget", list(pending)
            break
        if getattr(worker, "info", {}).get("builds") and _key(pending[0]) not in built:
            batch = pending[:max(1, cores)]
            worker.ask({"op": "build", "kernel_knobs": [{sig: p} for p in batch]})
            built |= {_key(p) for p in batch}
        first = not r.default_ms
        attempt(pending[0])
        pending.pop(0)
        if first and r.default_ms and estimates:    # sizes compared by the measured default now
            estimates = calibrated(roofline, ratios, r.default_ms)
            pending.sort(key=lambda p: estimates.get(_key(p), float("inf")))
    _judge_model(r, estimates, measured)
    best_single: dict[str, tuple] = {}          # knob -> (value, ratio) of its best change
    for key, ratio in measured.items():
        (name, value), = json.loads(key).items()
        if ratio < NOISE and ratio < best_single.get(name, (None, 2.0))[1]:
            best_single[name] = (value, ratio)
    helped = {name: value for name, (value, _) in best_single.items()}
    if len(helped) > 1 and time.monotonic() < deadline:
        attempt(helped)
    if measured:
        key = min(measured, key=measured.get)
        if measured[key] < NOISE:
            pins = json.loads(key)
            reply = worker.ask({"op": "try", "kernel_knobs": {sig: pins}, "rounds": CONFIRM_ROUNDS})
            if "ms" in reply and reply["ms"] < NOISE * reply["default_ms"]:
                r.knobs, r.ms, r.default_ms = pins, reply["ms"], reply["default_ms"]
                return r
            if "ms" in reply:
                r.ms = r.default_ms = reply["default_ms"]
            else:
                r.rejected.append(f"{_show(pins)}: {reply['error']} when timed again: {reply['why']}")
    return r


def _judge_model(r: KernelResult, estimates: dict, measured: dict) -> None:
    """How well the cost model ordered what was measured (the default counts, at ratio 1)."""
    points = [(estimates[key], ratio) for key, ratio in measured.items() if key in estimates]
    if "{}" in estimates and points:
        points.append((estimates["{}"], 1.0))
        r.model_rank = spearman([e for e, _ in points], [t for _, t in points])
        pick, best = min(points)[1], min(t for _, t in points)
        r.model_top_ok = pick <= 1.2 * best
        r.spread = max(t for _, t in points) / best


def tune_program(prepare: dict, budget_s: float, db: TuningDB, force: bool = False,
                 say=lambda text: None, command=None, go_on: bool = False
                 ) -> tuple[list[KernelResult], str, tuple | None]:
    """Tune every kernel of one program (worker.py's prepare request) within `budget_s`;
    returns the results, the target's key and the whole program's (default ms, tuned ms) when
    this run measured something. A kernel searched before is not searched again (`force`: it
    is), but for one whose search was interrupted, which goes on from where it stopped, as one
    the budget cut short does with `go_on` (farm.py: the same over a Ray cluster's nodes). Raises
    RuntimeError when the default schedule itself cannot be compiled or is wrong;
    KeyboardInterrupt once the interrupted search is stored."""
    worker = WorkerProcess(prepare, command)
    try:
        say("compiling and checking the default schedule")
        info = worker.start()
        if "error" in info:
            raise RuntimeError(info["why"])
        start = time.monotonic()        # the budget is the search's: a model's compile is not in it
        results, todo = plan(info, prepare, db, force, go_on)
        for i, k in enumerate(todo):
            left = budget_s - (time.monotonic() - start)
            rest = sum(t.get("ms", 0.0) for t in todo[i:])
            share = k["ms"] / rest if rest and "ms" in k else 1 / (len(todo) - i)
            deadline = time.monotonic() + left * share
            def progress(text, i=i):
                say(f"kernel {i + 1}/{len(todo)}, {text}")
            r = tune_loaded(worker, k, deadline, progress, info.get("cores", 1 << 10))
            results.append(keep(db, info["target"], r))
        return finish(worker.ask, info, results, db, say, bool(todo))
    finally:
        worker.close()


def tune_loaded(worker: WorkerProcess, k: dict, deadline: float, say, cores: int) -> KernelResult:
    """tune_kernel, with the share of the CPU other processes took meanwhile (never this one's,
    nor its measuring process's), from where k's earlier search stopped (plan's k["before"])."""
    load = OtherLoad([worker.proc.pid])
    r = tune_kernel(worker, k, deadline, say, cores, k.get("before"))
    r.other_load = load.share()
    return r


def plan(info: dict, prepare: dict, db: TuningDB, force: bool, go_on: bool
         ) -> tuple[list[KernelResult], list[dict]]:
    """(the kernels not to search, each with its note; those to search, slowest first: the
    budget goes where the time is, each a share in proportion to its time alone)."""
    results, todo, target = [], [], info["target"]
    pinned = set(prepare.get("knobs", {}))     # the user's pins are not searched
    measurements = db.measurements(target)     # what the cost model learns from (calibrate.py)
    kernels = _distinct(info["kernels"])
    total_ms = sum(k.get("ms", 0.0) for k in kernels)
    for k in kernels:
        k["knobs"] = {n: v for n, v in k["knobs"].items() if n.upper() not in pinned}
        r = KernelResult(k["name"], k["label"], k["signature"], k["knobs"])
        k["before"] = None if force else db.search(k["signature"], target)
        k["ratios"] = learned(measurements, k["signature"],         # this machine's (calibrate.py)
                              kind(candidates(k["knobs"], info.get("cores", 1 << 10),
                                              k.get("stores", 8), k.get("team", 0))))
        if k["before"] and k["before"]["stopped"] == "budget" and not go_on:
            left = len(k["before"]["untried"])
            r.note = (f"tuned before; its budget ran out with {left} candidate"
                      f"{'s' * (left != 1)} left (--continue tries them)")
        elif k["before"] and k["before"]["stopped"] == "minor":
            r.note = (f"{k['before']['default_ms'] * 1e3:.1f} us alone when first timed, under "
                      f"{MINOR:.0%} of the program's kernels: not searched (--force times it again)")
        elif k["before"] and k["before"]["stopped"] not in ("budget", "interrupted"):
            r.note = "tuned before (--force measures again)"
        elif not k["knobs"]:
            r.note = "its schedule has no knobs"
        elif total_ms and k.get("ms", total_ms) < MINOR * total_ms and total_ms > MINOR_MS:
            r.note = (f"{k['ms'] * 1e3:.1f} us alone, under {MINOR:.0%} of the program's "
                      f"kernels: not worth its budget")
            # kept, so that a run whose timings put it just over the line does not search it
            db.put(k["signature"], target, {}, k["label"], k["ms"], k["ms"], 0, [],
                   stopped="minor")
        else:
            todo.append(k)
            continue
        results.append(r)
    todo.sort(key=lambda k: -k.get("ms", 0.0))
    return results, todo


def keep(db: TuningDB, target: str, r: KernelResult) -> KernelResult:
    """Store a kernel's search, unless a busy machine timed it (never keep what it crowned);
    after an interrupted one, stop (KeyboardInterrupt)."""
    if busy_sentence(r.other_load):
        r.dropped = f"not stored: {busy_sentence(r.other_load)}"
        r.knobs, r.ms = {}, r.default_ms
    else:
        db.put(r.signature, target, r.knobs, r.label, r.default_ms, r.ms, r.tried, r.rejected,
               r.other_load, r.spread, r.measured, r.stopped or None, r.untried)
    if r.stopped == "interrupted":
        raise KeyboardInterrupt
    return r


def finish(ask, info: dict, results: list[KernelResult], db: TuningDB, say, searched: bool
           ) -> tuple[list[KernelResult], str, tuple | None]:
    """tune_program's answer: the results in launch order, and the whole program timed with
    every winner, compiled whole and checked against eager (`ask`: the worker's); the winners
    are dropped when it is not faster, or not right."""
    target = info["target"]
    order = [k["name"] for k in info["kernels"]]
    results.sort(key=lambda r: order.index(r.name))         # launch order, for the report
    reply = _program_times(ask, results, db, target, say) if searched else None
    times = (reply["default_ms"], reply["ms"]) if reply and "ms" in reply else None
    why = (f"the whole program was not faster with it ({times[0] / times[1]:.2f}x)"
           if times and times[1] >= times[0] else
           f"the whole program with every winner: {reply['error']}: {reply['why']}"
           if reply and "error" in reply else None)
    if why:
        for r in results:
            if r.knobs and not r.note:
                r.dropped = f"{_show(r.knobs)} dropped: {why}"
                r.knobs, r.ms = {}, r.default_ms
                db.put(r.signature, target, {}, r.label, r.default_ms, r.default_ms, r.tried,
                       r.rejected, r.other_load, r.spread, r.measured, r.stopped or None,
                       r.untried)
        times = None
    return results, target, times


def _distinct(kernels: list[dict]) -> list[dict]:
    """One entry per signature: a model's layers repeat their kernels, a candidate changes every
    kernel of its signature and the worker times them together (its `ms` is already all of them),
    so each repeat counted again made every kernel of a 22-layer model under 2% of the total."""
    first: dict[str, dict] = {}
    for k in kernels:
        if k["signature"] in first:
            first[k["signature"]]["alike"] = first[k["signature"]].get("alike", 0) + 1
        else:
            first[k["signature"]] = k
    for k in first.values():
        if k.get("alike"):
            k["label"] += f" (and {k['alike']} kernels alike)"
    return list(first.values())


def _program_times(ask, results, db: TuningDB, target: str, say) -> dict | None:
    """The worker's answer to timing the whole program with every tuned schedule against the
    defaults, interleaved in the same rounds; None when no kernel has a tuned schedule."""
    pins = {r.signature: db.get(r.signature, target) for r in results}
    pins = {sig: knobs for sig, knobs in pins.items() if knobs}
    if not pins:
        return None
    say("timing the program with every tuned schedule")
    return ask({"op": "try", "kernel_knobs": pins, "rounds": CONFIRM_ROUNDS, "scope": "program"})
