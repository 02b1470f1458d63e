"""The acceptance run's steps. Each runs commands in child processes (a hang or a crash ends that
child, not the run) under its own timeout, cut to what is left of the run's limit, and returns
a `Step` for the report. With `dry_run` (a CPU machine) each step takes the same path with the
simulator standing in for the GPU, or says what it would run, and is marked "dry-run"."""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from .environment import _version
from .ncu_slowest import profile_case, slowest
from .report import Step

SANITIZER_TOOLS = ("memcheck", "racecheck")


@dataclass
class Proc:
    rc: int | None           # None: killed at its timeout
    text: str
    seconds: float


@dataclass
class Run:
    """What every step shares: the repository, the log folder, the clock and the mode."""
    repo: Path
    logs: Path
    deadline: float           # time.monotonic() after which nothing new starts
    dry_run: bool

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def env(self) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.repo), env.get("PYTHONPATH")) if p)
        return env

    def call(self, cmd: list[str], timeout: float, log: str, env: dict | None = None) -> Proc:
        """Run `cmd` in the repository with stdout and stderr into logs/`log`; the whole process
        group is killed at `timeout` seconds (or at the run's deadline, if sooner)."""
        timeout = max(1.0, min(timeout, self.left()))
        path = self.logs / log
        t0 = time.monotonic()
        with open(path, "w") as f:
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            p = subprocess.Popen(cmd, cwd=self.repo, stdout=f, stderr=subprocess.STDOUT,
                                 env=env or self.env(), start_new_session=True)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                rc = None
                f.write(f"\n[gpu_check: killed after {timeout:.0f} s]\n")
        return Proc(rc, path.read_text(errors="replace"), time.monotonic() - t0)


def _status(proc: Proc, ok: bool, dry_run: bool) -> str:
    if proc.rc is None:
        return "timeout"
    return ("dry-run" if dry_run else "pass") if ok else "fail"


def _tail(text: str, n: int = 8) -> list[str]:
    lines = [ln for ln in text.splitlines() if ln.strip()][-n:]
    return ["```", *lines, "```"] if lines else []


# ---- 1. the environment ---------------------------------------------------------------------

def install(run: Run) -> Step:
    """strata into this Python without the network: an editable install with no dependencies
    (the GPU machine has torch, numpy, rich, cuda-bindings, transformers, safetensors); children
    also get the repository on PYTHONPATH, so a failed install still leaves strata importable."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--no-index", "-e", "."]
    step = Step("install", command=shlex.join(cmd))
    if run.dry_run or _version("strata") != "not installed":
        step.status = "dry-run" if run.dry_run else "pass"
        step.summary = f"strata {_version('strata')} is already installed; not reinstalled"
        return step
    proc = run.call(cmd, 120, "install.log")
    step.status, step.seconds = _status(proc, proc.rc == 0, False), proc.seconds
    step.summary = ("installed (editable, no dependencies)" if proc.rc == 0 else
                    "pip failed; the steps run strata from the source tree (PYTHONPATH)")
    step.details = _tail(proc.text) if proc.rc else []
    return step


# ---- 2. the GPU tests -------------------------------------------------------------------------

def gpu_tests(run: Run, workers: int) -> Step:
    """Every test that skips without a GPU (`-m gpu`, marked in tests/conftest.py), each with a
    time limit where pytest-timeout is installed, spread over `workers` processes."""
    junit = run.logs / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "tests", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", f"--junitxml={junit}"]
    if _importable("pytest_timeout"):
        cmd += ["--timeout", "150"]
    if _importable("xdist") and workers > 1 and not run.dry_run:
        cmd += ["-n", str(workers)]
    step = Step("GPU tests", command=shlex.join(cmd))
    proc = run.call(cmd, 240, "gpu_tests.log")
    step.seconds = proc.seconds
    counts, failures, uncollected = _junit(junit)
    ran = counts["tests"] - counts["skipped"]
    if run.dry_run:
        ok = proc.rc in (0, 1, 5) and ran == 0 and counts["tests"] > 0 and not failures
        step.summary = f"{counts['tests']} GPU tests collected; all skip here (no GPU)"
    else:
        ok = proc.rc in (0, 1) and ran > 0 and not failures and not counts["failures"]
        step.summary = (f"{ran - counts['failures'] - counts['errors']} passed, "
                        f"{counts['failures']} failed, {counts['errors']} errors, "
                        f"{counts['skipped']} skipped of {counts['tests']}")
    step.status = _status(proc, ok, run.dry_run)
    if uncollected:
        step.summary += f"; {len(uncollected)} test modules could not be imported here"
    step.details = [step.summary, ""] + [f"- `{name}`: {msg}" for name, msg in failures[:40]] + \
        [f"- not collected: {m}" for m in uncollected]
    if not ok:
        step.details += _tail(proc.text, 15)
    return step


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _junit(path: Path) -> tuple[dict, list[tuple[str, str]], list[str]]:
    """Counts (tests, failures, errors, skipped; a module that failed to import is not counted
    among the errors), failing tests with their first message line, and the modules that could
    not be collected (with why: their GPU tests, if any, did not run)."""
    counts = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    failures, uncollected = [], []
    if not path.exists():
        return counts, failures, uncollected
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for k in counts:
            counts[k] += int(suite.get(k, 0))
        for case in suite.iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is None:
                continue
            if bad.get("message") == "collection failure":
                last = [ln for ln in (bad.text or "").splitlines() if ln.startswith("E ")][-1:]
                uncollected.append(f"{case.get('name')} ({last[0][1:].strip() if last else 'no reason'})")
                counts["errors"] -= 1
                counts["tests"] -= 1
                continue
            msg = (bad.get("message") or "").strip().splitlines()
            failures.append((f"{case.get('classname')}::{case.get('name')}",
                             (msg[0] if msg else "")[:300]))
    return counts, failures, uncollected


# ---- 3. compute-sanitizer over the acceptance cases ------------------------------------------

def sanitizer(run: Run) -> Step:
    """memcheck and racecheck over gpu_check/cases.py (one process per tool; torch's caching
    allocator off, so an out-of-bounds access cannot land in a neighbour's block unseen). In a
    dry run the cases run on the simulator, which checks bounds and races itself."""
    cases = [sys.executable, "-m", "strata.gpu_check.cases"]
    step = Step("compute-sanitizer")
    exe = shutil.which("compute-sanitizer")
    if run.dry_run or exe is None:
        proc = run.call(cases + ["--device", "sim"], 120, "cases_sim.log")
        step.seconds, step.command = proc.seconds, shlex.join(cases + ["--device", "sim"])
        would = [f"compute-sanitizer --tool {t} --error-exitcode 9 {shlex.join(cases)}"
                 for t in SANITIZER_TOOLS]
        step.status = _status(proc, proc.rc == 0, run.dry_run) if run.dry_run else "skipped"
        step.summary = (("the cases on the simulator: " + _verdicts(proc.text)) +
                        ("" if exe else "; compute-sanitizer not found"))
        step.details = [step.summary, "", "On a GPU it runs:", ""] + [f"- `{w}`" for w in would] + \
            ["", "```", *_case_lines(proc.text), "```"]
        return step
    env = dict(run.env(), PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    verdicts, worst, t0 = [], "pass", time.monotonic()
    for tool in SANITIZER_TOOLS:
        # API errors are not reported: strata checks every driver call it makes itself, and
        # cuda-bindings probes with cuGetProcAddress for symbols the driver lacks (34 benign
        # CUDA_ERROR_INVALID_VALUE "errors" per run on the H100 of 2026-11-26, nothing else).
        cmd = [exe, "--tool", tool, "--report-api-errors", "no", "--error-exitcode", "9",
               "--print-limit", "20", *cases]
        proc = run.call(cmd, 150, f"sanitizer_{tool}.log", env)
        errors = [ln for ln in proc.text.splitlines() if ln.startswith("=========")
                  and "SUMMARY:" in ln]          # memcheck's ERROR, racecheck's RACECHECK
        ok = proc.rc == 0
        status = _status(proc, ok, False)
        worst = worst if status == "pass" else status
        verdicts.append(f"{tool}: {status} ({errors[-1].split('SUMMARY:')[1].strip() if errors else 'no summary'};"
                        f" {_verdicts(proc.text)})")
        step.details += [f"### {tool}: {status}", "", f"`{shlex.join(cmd)}`", "", "```",
                         *_case_lines(proc.text), *[ln for ln in proc.text.splitlines()
                                                    if "=========" in ln][:30], "```", ""]
        if not ok:
            step.details += _tail(proc.text, 10) + [""]
    step.status, step.seconds, step.summary = worst, time.monotonic() - t0, "; ".join(verdicts)
    return step


def _case_lines(text: str) -> list[str]:
    from .cases import NAMES
    return [ln for ln in text.splitlines() if ln.split(" ", 1)[0] in NAMES]


def _verdicts(text: str) -> str:
    lines = _case_lines(text)
    passed = sum(" PASS " in ln + " " for ln in lines)
    return f"{passed}/{len(lines)} cases pass"


# ---- 4. the benchmarks ---------------------------------------------------------------------

BENCHES = {
    # name: (module args, timeout s, what it measures)
    "op suite": (["strata.bench.suite", "--model", "tinyllama", "--dtype", "bf16", "--seq", "1,128",
                  "--variants", "eager,torch.compile,strata", "--budget-s", "100"], 130,
                 "TinyLlama's ops in bf16 at 1 and 128 tokens vs eager and torch.compile"),
    "contractions": (["strata.bench.contractions", "--quick"], 80,
                     "4096³ bf16 mm and decode projections vs cuBLAS, 4096³ FP8 (e4m3) vs "
                     "torch._scaled_mm, a 512-token prefill's products, causal attention vs the "
                     "fastest SDPA backend"),
    "decode": (["strata.bench.decode", "--new-tokens", "64", "--repeats", "2"], 200,
               "TinyLlama-shaped bf16 greedy decode: tokens/s vs HF eager and torch.compile, "
               "fraction of the bandwidth limit, with and without programmatic edges; the step's "
               "kernels one by one, summed by role, and its weight-reading ones' GB/s; the "
               "prompt's prefill against torch.compile's compiled prefill"),
    "decode q4_0": (["strata.bench.decode", "--quant", "q4_0", "--new-tokens", "64", "--repeats", "2",
                     "--no-hf", "--no-compile"], 120,
                    "the same decode with Q4_0 weights (issue 53: >= 1.8x strata's bf16 decode)"),
}
BENCHES["gemv sweep"] = (["strata.bench.gemv_sweep", "--budget-s", "90"], 130,
                         "the decode step's GEMVs (bf16, Q4_0; M = 1) under each candidate "
                         "schedule against cuBLAS, the fastest named (issue 53 item 3)")
BENCHES["attention sweep"] = (["strata.bench.contractions", "--sweep"], 90,
                              "causal attention at 2048 x 64 and x 128 under each tensor-core "
                              "schedule (mma.sync, wgmma; BLOCK_M, BLOCK_N) vs the fastest SDPA "
                              "backend (issue 54)")
BENCHES["contractions full"] = (["strata.bench.contractions"], 400,
                                "issue 54's whole table: mm 4096³ and 8192³, FP8, decode and prefill "
                                "products with epilogues, attention at head dims 64/128, causal and "
                                "not, seq 512 to 16k vs the fastest SDPA backend")
BENCHES["training"] = (["strata.bench.train", "--device", "cuda", "--ops", "decoder_block", "--seq",
                        "1024", "--dtype", "bf16", "--rounds", "3"], 150,
                       "one bf16 training step of a TinyLlama-shaped decoder block at 1024 tokens "
                       "vs eager and Inductor (issue 58: flash attention forward and backward)")
LIST_FLAG = {"op suite": "--list", "contractions": "--list", "contractions full": "--list"}
BENCHES["call overhead"] = (["strata.gpu_check.overhead"], 80,
                            "host time per call of a tiny program (eager, strata's CUDA graph, "
                            "with out=, plain launches, torch.compile reduce-overhead) and where "
                            "it goes (cProfile)")


def bench(run: Run, name: str) -> Step:
    """One benchmark script, its report written into logs/<name>; the report's tables are quoted.
    In a dry run the script lists its cases, or says in one sentence that it needs a GPU."""
    args, timeout, what = BENCHES[name]
    folder = run.logs / name.replace(" ", "_")
    cmd = [sys.executable, "-m", *args] + (["--out", str(folder)] if args[0].startswith("strata.bench") else [])
    if run.dry_run and name in LIST_FLAG:
        cmd = [sys.executable, "-m", args[0], LIST_FLAG[name]]
    step = Step(name, command=shlex.join(cmd))
    proc = run.call(cmd, timeout, f"{name.replace(' ', '_')}.log")
    step.seconds = proc.seconds
    if run.dry_run:
        ok = proc.rc == 0 or (proc.rc == 2 and "GPU" in proc.text)
        step.status = _status(proc, ok, True)
        step.summary = f"would measure {what}"
        step.details = [step.summary] + _tail(proc.text, 12)
        return step
    if not args[0].startswith("strata.bench"):          # prints its report on stdout
        step.status, step.summary = _status(proc, proc.rc == 0, False), what
        step.details = proc.text.splitlines()[1:]
        return step
    reports = sorted(folder.glob("*.md")) if folder.exists() else []
    step.status = _status(proc, proc.rc == 0 and bool(reports), False)
    step.summary = what + ("" if reports else " (no report written)")
    step.details = [ln for r in reports for ln in r.read_text().splitlines()] or _tail(proc.text, 15)
    return step


# ---- 5. Nsight Compute on the slowest cases --------------------------------------------------

def ncu_slowest(run: Run, count: int = 3) -> Step:
    """The `count` op-suite cases where strata is furthest behind the faster of eager and
    torch.compile, each profiled by ncu (only strata's kernels): duration, DRAM and SM
    throughput, occupancy, registers, and the achieved GB/s and TFLOP/s of the whole case."""
    step = Step("ncu on the slowest kernels")
    suite = sorted((run.logs / "op_suite").glob("*.json")) if (run.logs / "op_suite").exists() else []
    if run.dry_run or not suite:
        step.status = "dry-run" if run.dry_run else "skipped"
        step.summary = (f"would profile the {count} op-suite cases slowest relative to eager and "
                        f"torch.compile with ncu" if run.dry_run else "no op-suite report to rank")
        return step
    cases = slowest(json.loads(suite[-1].read_text()), count)
    t0, lines, worst = time.monotonic(), [], "pass"
    for case in cases:
        text, ok = profile_case(run, case)
        worst = worst if ok else "fail"
        lines += text + [""]
    step.status, step.seconds = worst, time.monotonic() - t0
    step.summary = "; ".join(f"{c['name']} ({c['speedup']['vs_best']:.2f}x)" for c in cases) or \
        "no case with a strata timing"
    step.details = lines or [step.summary]
    return step
