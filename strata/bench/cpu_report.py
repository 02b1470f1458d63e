"""`python -m strata.bench.cpu_report`: strata's native CPU kernels against eager and torch.compile
on LLM-shaped ops (TinyLlama sizes), one interleaved run, written to docs/cpu-perf-DATE.md.

Every case is first checked against eager in float64 (the same verdict as `strata run`); a case
that fails is reported as such and not timed. Ratios are against the faster of eager and
torch.compile measured in the same run; GB/s is the ideal traffic (strata/bench/work.py) over
the median time, next to a large copy measured in the same run."""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib

import torch
import torch.nn.functional as F

from ..api import compile as strata_compile
from . import check
from .cpu_bench import copy_gbps, interleaved
from .env import cpu_name
from .work import estimate_work

H, I, V = 2048, 5632, 32000          # TinyLlama: hidden, MLP, vocabulary
BF16 = torch.bfloat16


def _cases():
    r = torch.randn
    w_norm = r(H)
    return {
        "rmsnorm (32, 2048)": (lambda x: F.rms_norm(x, (H,), w_norm), (r(32, H),), 31),
        "residual + rmsnorm (32, 2048)": (lambda x, y: F.rms_norm(x + y, (H,), w_norm),
                                          (r(32, H), r(32, H)), 31),
        "softmax over the vocabulary (4, 32000)": (lambda x: x.softmax(-1), (r(4, V),), 31),
        "silu(gate) * up (32, 5632)": (lambda g, u: F.silu(g) * u, (r(32, I), r(32, I)), 31),
        "gemv fp32 1 x 2048 -> 5632": (lambda x, w: F.linear(x, w), (r(1, H), r(I, H)), 15),
        "gemv bf16 weights 1 x 2048 -> 5632": (lambda x, w: F.linear(x, w.float()),
                                               (r(1, H), r(I, H).to(BF16)), 15),
        "gemv bf16 1 x 2048 -> 5632": (lambda x, w: F.linear(x, w),
                                       (r(1, H).to(BF16), r(I, H).to(BF16)), 15),
        "gemm fp32 64 x 2048 x 5632": (lambda x, w: F.linear(x, w), (r(64, H), r(I, H)), 5),
        "gemm fp32 512 x 2048 x 5632": (lambda x, w: x @ w, (r(512, H), r(H, I)), 5),
        "gemm bf16 512 x 2048 x 5632": (lambda x, w: x @ w,
                                        (r(512, H).to(BF16), r(H, I).to(BF16)), 5),
    }


def run(names=None) -> str:
    torch.manual_seed(0)
    lines = [f"# strata on the CPU: LLM-shaped ops against eager and torch.compile",
             "", f"Measured {datetime.date.today()} on {cpu_name()}; torch {torch.__version__}, "
             f"{torch.get_num_threads()} torch threads, OpenMP threads: "
             f"{os.environ.get('OMP_NUM_THREADS', 'all cores')}. Median ms of interleaved rounds "
             f"(each round times every variant once); `vs best` is the faster of eager and "
             f"torch.compile over strata (above 1: strata is faster).", ""]
    ceiling = copy_gbps()
    lines += [f"Copy ceiling in this run: {ceiling:.1f} GB/s (read + write of 256 MiB).", "",
              "| case | verdict | eager ms | torch.compile ms | strata ms | strata GB/s | "
              "strata GFLOP/s | vs best |", "|---|---|---|---|---|---|---|---|"]
    for name, (fn, inputs, rounds) in _cases().items():
        if names and not any(n in name for n in names):
            continue
        print(f"{name} ...", flush=True)
        program = strata_compile(fn, inputs, device="cpu")
        report = check.verify(program, fn, [x.clone() for x in inputs])
        verdict = "PASS" if report.passed else "FAIL"
        if not report.passed:
            lines.append(f"| {name} | FAIL | | | | | | |")
            continue
        torch._dynamo.reset()
        ms = interleaved({"eager": fn, "compile": torch.compile(fn, dynamic=False),
                          "strata": program}, inputs, rounds=rounds)
        work = estimate_work(fn, inputs)
        t = ms["strata"]
        gflops = f"{work.flops / t / 1e6:.1f}" if work.flops else "-"
        lines.append(f"| {name} | {verdict} | {ms['eager']:.3f} | {ms['compile']:.3f} | {t:.3f} | "
                     f"{work.bytes / t / 1e6:.1f} | {gflops} | "
                     f"{min(ms['eager'], ms['compile']) / t:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="run the cases whose name contains one of these")
    p.add_argument("-o", "--output", help="markdown report (default docs/cpu-perf-DATE.md)")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="threads for torch and for strata's OpenMP (default: every core); on a "
                        "machine with other work running, 1 keeps the comparison fair")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)     # read when strata's library loads
    text = run(args.only)
    print(text)
    out = pathlib.Path(args.output or f"docs/cpu-perf-{datetime.date.today()}-{args.threads}t.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
