"""`python -m strata.bench.busy [MODEL]`: strata's CPU decode on a quiet machine and beside busy
processes, with the default team (runtime/threads.py) and with each fixed thread count, so
the default can be held to the best of them (issue 51: >= 0.9x under load, within 5% of every
core when quiet).

    python -m strata.bench.busy                          # TinyLlama-shaped, bf16, busy 0,1,2
    python -m strata.bench.busy HuggingFaceTB/SmolLM2-135M --busy 0,1,2 --new-tokens 64

A busy process is a Python loop that never sleeps (what a build or a second job is to the
machine); each stops by itself after --max-s seconds and all are killed when their rows are done.
Within a busy level the variants run interleaved, one decode each per round, and the row keeps
each one's median tokens/s. MODEL is a bundled name (random weights) or a local directory.
Markdown report under --out, named with model, CPU class and date.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from ..core import progress
from ..core.command import guarded
from ..core.errors import StrataError
from ..models.build import DTYPES, build
from ..models.decode import compile_decoder, new_caches
from ..runtime.threads import THREADS, set_threads
from .decode import prompt_ids
from .decode_loops import strata_greedy
from .env import collect_cpu_env, slug
from .table_report import write_report

DEFAULT_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
SETTLE_S = 0.5            # a new busy process is spinning before a row starts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m strata.bench.busy",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"a bundled model name or a local directory (default {DEFAULT_MODEL})")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--busy", default="0,1,2", help="busy processes beside the decode (default 0,1,2)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens per decode (default 32)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per row (default 3)")
    p.add_argument("--max-s", type=float, default=900, help="a busy process stops after this many "
                                                            "seconds at most (default 900)")
    p.add_argument("--out", default="docs/bench", help="report folder (default docs/bench)")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return p


def busy_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise StrataError(f"--busy {text!r}: expected comma-separated counts, like 0,1,2") from None
    if not levels or min(levels) < 0:
        raise StrataError(f"--busy {text!r}: give counts of 0 or more, like 0,1,2")
    return levels


def start_busy(n: int, max_s: float) -> list[subprocess.Popen]:
    loop = f"import time\nend = time.time() + {max_s}\nwhile time.time() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]
    time.sleep(SETTLE_S if n else 0)
    return procs


def stop_busy(procs) -> None:
    for p in procs:
        p.kill()
        p.wait()


def variants(cores: int) -> dict[str, int | None]:
    """The default team and each fixed count (1, 2, 4 ... and every core)."""
    counts = sorted({1, cores, *(1 << k for k in range(1, cores.bit_length()) if 1 << k < cores)})
    return {"default": None, **{f"{n} thread{'s' if n > 1 else ''}": n for n in counts}}


def run(args, say) -> tuple[list[dict], str]:
    levels = busy_levels(args.busy)
    say(f"building {args.model}")
    built = build(args.model, dtype=args.dtype, materialise=True)
    max_len = args.prompt_len + args.new_tokens
    prefill, step = compile_decoder(built.model, args.prompt_len, max_len, "cpu", progress=say)
    caches = new_caches(built.config, max_len, DTYPES[args.dtype], "cpu")
    prompt = prompt_ids(built.config.vocab_size, args.prompt_len)

    def tokens_per_s(threads) -> tuple[float, int]:
        set_threads(threads)
        _, _, t_decode, steps = strata_greedy(prefill, step, caches, prompt, args.new_tokens,
                                              device="cpu")
        return steps / t_decode, THREADS.n if threads is None else threads
    rows, teams = [], variants(THREADS.cores)
    try:
        tokens_per_s(None)                                  # warm: weights, pages, the pool
        for busy in levels:
            procs = start_busy(busy, args.max_s)
            try:
                rates: dict[str, list[float]] = {name: [] for name in teams}
                chosen = []
                for r in range(args.rounds):
                    for name, threads in teams.items():
                        say(f"{busy} busy: {name}, round {r + 1} of {args.rounds}")
                        rate, n = tokens_per_s(threads)
                        rates[name].append(rate)
                        if threads is None:
                            chosen.append(n)
            finally:
                stop_busy(procs)
            rows.append({"busy": busy, "chosen": chosen,
                         **{name: statistics.median(v) for name, v in rates.items()}})
    finally:
        set_threads(None)
    return rows, built.what


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    names = [k for k in rows[0] if k not in ("busy", "chosen")]
    fixed = names[1:]
    head = ["busy processes", *[f"{n} tok/s" for n in names], "default / best fixed",
            "default / every core", "threads the default chose"]
    body = []
    for row in rows:
        best = max(row[n] for n in fixed)
        body.append([str(row["busy"]), *[f"{row[n]:.2f}" for n in names],
                     f"{row['default'] / best:.2f}x", f"{row['default'] / row[fixed[-1]]:.2f}x",
                     ",".join(map(str, row["chosen"]))])
    return head, body


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def command() -> int:
        import torch
        busy_levels(args.busy)
        for flag, value in (("--prompt-len", args.prompt_len), ("--new-tokens", args.new_tokens),
                            ("--rounds", args.rounds)):
            if value < 1:
                raise StrataError(f"{flag} must be at least 1, not {value}")
        env = collect_cpu_env(torch.get_num_threads())
        with progress.status("starting") as status:
            rows, what = run(args, status.update)
        head, body = table(rows)
        name = slug(args.model.rstrip("/").split("/")[-1])
        write_report(head, body, title=f"{what}: decode tokens/s beside busy processes",
                     heading=f"strata decode beside busy processes: {what}", env=env, notes=[
                         f"{args.dtype}, {args.prompt_len}-token prompt, {args.new_tokens} new "
                         f"tokens, {args.rounds} interleaved rounds (medians); `python -m "
                         f"strata.bench.busy {args.model} --busy {args.busy}`"],
                     out=args.out, stem=f"busy-{name}-{args.dtype}")
        return 0
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
