"""An FP8Linear (`--quant fp8`: e4m3 weights and activations, row scales, torch._scaled_mm) on
the CPU at decode and prefill shapes: strata against torch eager on the same layer and against
a bf16 nn.Linear of the same shape (strata's and eager's), interleaved.

Why: FP8 is Hopper's format (issue 54); on a CPU it is only worth what it costs next to bf16,
and eager's CPU `_scaled_mm` is an emulation. This says, on the machine at hand, what a user of
`--quant fp8` gets here.

    python -m strata.bench.fp8_linear [--k 2048 --n 5632 --rows 1,128 --rounds 15 --out docs/bench]

Each timed call comes after a 256 MB write, so that its weights come from memory as in a decode
step (repeated back to back, a 23 MB bf16 weight stays in a 32 MB L3 and reads at 175 GB/s).
Prints the table (ms, medians of interleaved rounds) and writes it as a markdown report named
with the CPU class and the time.
"""
from __future__ import annotations

import argparse
import sys

import torch

from ..api import compile as compile_program
from ..quant.fp8 import FP8Linear
from .cpu_bench import interleaved
from .env import collect_cpu_env
from .table_report import write_report

FLUSH_BYTES = 256 << 20     # written before every timed call: more than any CPU's last-level cache


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.fp8_linear",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=5632)
    p.add_argument("--rows", default="1,128", help="activation rows, comma-separated")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default="docs/bench", help="report folder (default docs/bench)")
    args = p.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        rows = []
    if not rows or min(rows + [args.k, args.n, args.rounds]) < 1:
        print("fp8_linear: --rows (comma-separated), --k, --n and --rounds must be at least 1",
              file=sys.stderr)
        return 2
    head = ["rows", "FP8 strata ms", "FP8 eager ms", "bf16 strata ms", "bf16 eager ms",
            "FP8 strata / eager", "FP8 / bf16 (strata)", "error vs eager"]
    body = []
    torch.manual_seed(0)
    linear = torch.nn.Linear(args.k, args.n, bias=False).to(torch.bfloat16).requires_grad_(False)
    fp8 = FP8Linear.from_linear(linear).eval()
    flush = torch.zeros(FLUSH_BYTES // 4)
    for m in rows:
        x = torch.randn(m, args.k).to(torch.bfloat16)
        runs = {"fp8": compile_program(fp8, (x,), device="cpu"), "fp8 eager": fp8,
                "bf16": compile_program(linear, (x,), device="cpu"), "bf16 eager": linear}
        with torch.no_grad():
            want = fp8(x).double()
            err = float((runs["fp8"](x).double() - want).norm() / want.norm())
        # each call after a write that puts the weights out of the caches: a decode step reads
        # each layer's weights once, from memory
        ms = interleaved(runs, (x,), args.rounds, min_s=0, before=lambda: flush.add_(1))
        body.append([str(m), f"{ms['fp8']:.3f}", f"{ms['fp8 eager']:.3f}", f"{ms['bf16']:.3f}",
                     f"{ms['bf16 eager']:.3f}", f"{ms['fp8 eager'] / ms['fp8']:.1f}x",
                     f"{ms['bf16'] / ms['fp8']:.2f}x", f"{err:.2g}"])
    write_report(head, body, title="an FP8 linear on the CPU",
                 heading="FP8Linear (e4m3, row scales) against eager and against bf16",
                 env=collect_cpu_env(torch.get_num_threads()),
                 notes=[f"K={args.k} N={args.n}, bf16 activations; median of {args.rounds} "
                        f"interleaved rounds, each call after a 256 MB write (weights from "
                        f"memory); FP8 / bf16 above 1 means FP8 is faster; error: "
                        f"|strata - eager| / |eager| by norm on the FP8 layer; `python -m "
                        f"strata.bench.fp8_linear --k {args.k} --n {args.n} --rows {args.rows}`"],
                 out=args.out, stem="fp8-linear")
    return 0


if __name__ == "__main__":
    sys.exit(main())
