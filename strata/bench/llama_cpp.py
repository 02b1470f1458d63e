"""llama.cpp's rows of `python -m strata.bench.decode --gguf FILE` (issue 27): the same GGUF file,
prompt ids, number of new tokens and threads through llama-cpp-python, greedy, timed as strata's
loops are (bench/decode_loops.py): the prefill is `Llama.eval(prompt ids)` and the argmax of its
last logits, then one `eval([token])` per new token; `reset()` before each run; warm-up runs, then
the median of --repeats.

Why a child process: llama.cpp's CPU build from PyPI can die on an illegal instruction (on a Xeon
with AMX, gcc 12 compiled its AMX tile code without the tile-configuration stores and `tilezero`
raised SIGILL on Q8_0/Q4_0 weights), which would end the whole benchmark. So each try runs
`python -m strata.bench.llama_cpp FILE ...` in a child that prints one JSON line; a signal becomes a
row "crashed (signal N, NAME)" and the run is tried again with no_repack: llama.cpp's --no-repack,
no extra weight buffer types, so neither the AMX nor the CPU_REPACK weight layout. llama-cpp-python
0.3.36's Llama() has no no_repack argument (an unknown keyword vanishes into its **kwargs), so the
child sets what --no-repack sets: llama_model_params.use_extra_bufts = False. The child runs
llama.cpp with its load log on (its stderr, captured here) to tell which weight buffers it used.
"""
from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version as v
import importlib.util
import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .decode_report import LLAMA_CPP, DecodeVariant, measure

NO_REPACK = f"{LLAMA_CPP} (no_repack)"
NOT_INSTALLED = ("not run, llama-cpp-python is not installed (pip install llama-cpp-python adds "
                 "this row)")
TIMEOUT_S = 3600
BUFFERS = re.compile(r"\b([A-Za-z_]+) model buffer size\s*=\s*([0-9.]+) MiB")


def installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def version() -> str:
    try:
        return v("llama-cpp-python")
    except PackageNotFoundError:
        return "not installed"


def measure_llama_cpp(path, prompt: list[int], n: int, threads: int, repeats: int,
                      say=print, command=None) -> tuple[list[DecodeVariant], list[str]]:
    """llama.cpp's rows (the default path; after a crash, another try with no_repack) and the
    notes for the report. `command`: the child's argv before its arguments (tests swap it)."""
    if not installed() and command is None:
        return [DecodeVariant(LLAMA_CPP, NOT_INSTALLED)], []
    rows, notes = [], [f"llama.cpp: llama-cpp-python {version()}, Llama(n_threads={threads}, "
                        f"n_threads_batch={threads}, n_ctx={len(prompt) + n}, logits_all=False), "
                        f"a child process per try"]
    for no_repack in (False, True):
        name = NO_REPACK if no_repack else LLAMA_CPP
        say(f"decoding with {name} (a child process)")
        row, buffers = _child(path, prompt, n, threads, repeats, no_repack, command)
        row.name = name
        rows.append(row)
        if buffers:
            notes.append(f"{name} weight buffers at load: {buffers}")
        if not row.status.startswith("crashed"):
            break
        row.status += "; retried with no_repack=True" if not no_repack else ""
    return rows, notes


def _child(path, prompt, n, threads, repeats, no_repack, command) -> tuple[DecodeVariant, str]:
    argv = [*(command or [sys.executable, "-m", "strata.bench.llama_cpp"]), str(path),
            "--prompt-ids", ",".join(map(str, prompt)), "--new-tokens", str(n),
            "--threads", str(threads), "--repeats", str(repeats)]
    try:
        out = subprocess.run(argv + (["--no-repack"] if no_repack else []), capture_output=True,
                             text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return DecodeVariant(LLAMA_CPP, f"failed: no result in {TIMEOUT_S} s"), ""
    buffers = ", ".join(f"{k} {float(mib):,.0f} MiB" for k, mib in BUFFERS.findall(out.stderr))
    if out.returncode < 0:
        sig = -out.returncode
        try:
            what = signal.Signals(sig).name
        except ValueError:
            what = "unknown"
        return DecodeVariant(LLAMA_CPP, f"crashed (signal {sig}, {what})"), buffers
    line = next((s for s in reversed(out.stdout.splitlines()) if s.startswith("{")), None)
    if out.returncode != 0 or line is None:
        last = next((s for s in reversed(out.stderr.splitlines()) if s.strip()), "no output")
        status = f"failed: exit code {out.returncode}: {last.strip()}"
        return DecodeVariant(LLAMA_CPP, status), buffers
    return DecodeVariant(**json.loads(line)), buffers


def argmax_last(llm) -> int:
    """The argmax of the last evaluated position's logits. (With logits_all=False, 0.3.36's
    eval no longer copies them into llm.scores, which stays zero: read llama.cpp's own.)"""
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))
    return int(np.argmax(logits))


def greedy(llm, prompt: list[int], n: int):
    """(ids, prefill s, decode s, steps) of one greedy run, as decode_loops' loops return."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    toks = [argmax_last(llm)]
    t_prefill = time.perf_counter() - t0
    steps, t0 = 0, time.perf_counter()
    while len(toks) < n:
        llm.eval([toks[-1]])
        toks.append(argmax_last(llm))
        steps += 1
    return toks, t_prefill, time.perf_counter() - t0, steps


def _no_extra_buffers(llama_module) -> None:
    """What llama.cpp's --no-repack sets: the model's default params without extra buffer types."""
    lib = llama_module.llama_cpp
    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p
    lib.llama_model_default_params = params


def run(path, prompt: list[int], n: int, threads: int, repeats: int, no_repack: bool) -> dict:
    """In this process: load the file with llama.cpp, measure as strata.bench.decode does."""
    import llama_cpp.llama as llama_module

    if no_repack:
        _no_extra_buffers(llama_module)
    batch = max(512, len(prompt))
    llm = llama_module.Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads,
                             n_ctx=len(prompt) + n, n_batch=batch, n_ubatch=batch,
                             logits_all=False, verbose=True)   # the load log: stderr, for BUFFERS
    return asdict(measure(NO_REPACK if no_repack else LLAMA_CPP,
                          lambda k: greedy(llm, prompt, k), n, repeats))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.llama_cpp",
                                description="One llama.cpp run for strata.bench.decode --gguf: "
                                            "prints one JSON line (a DecodeVariant).")
    p.add_argument("file")
    p.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-repack", action="store_true")
    a = p.parse_args(argv)
    prompt = [int(x) for x in a.prompt_ids.split(",") if x]
    result = run(Path(a.file), prompt, a.new_tokens, a.threads, a.repeats, a.no_repack)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
