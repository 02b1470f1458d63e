"""A prefill's linear by a block-quantized weight, one per format: strata with QGEMM=int8 (int8
dot products, activation rows as vpdpbusd's lanes: tile/passes/cpu_int8_rows.py), strata with
QGEMM=bf16 (the weight dequantized to bf16 by a kernel of its own, then a bf16 GEMM) and torch
eager on the same QuantLinear, interleaved, each path's error against float64.

Why: issue 56 asks for prefill >= 1.5x llama.cpp's, which multiplies int8 by int8; this isolates
the product that decides it, per format, on the machine at hand.

    python -m strata.bench.quant_prefill [--m 128 --k 2048 --n 5632 --rounds 15 --out docs/bench]

Prints the table (ms and GOPS, medians of interleaved rounds) and writes it as a markdown report
named with the CPU class and the time.
"""
from __future__ import annotations

import argparse
import sys

import torch

from ..api import compile as compile_program
from ..core.context import Context
from ..quant.formats import QuantLinear
from .cpu_bench import interleaved
from .env import collect_cpu_env
from .table_report import write_report

FORMATS = ("q4_0", "q8_0", "q4_k", "q5_k", "q6_k")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.quant_prefill",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=128, help="activation rows (default 128)")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=5632)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default="docs/bench", help="report folder (default docs/bench)")
    args = p.parse_args(argv)
    if min(args.m, args.k, args.n, args.rounds) < 1:
        print("quant_prefill: --m, --k, --n and --rounds must be at least 1", file=sys.stderr)
        return 2
    flops = 2 * args.m * args.k * args.n
    head = ["format", "QGEMM=int8 ms (GOPS)", "QGEMM=bf16 ms (GOPS)", "eager ms (GOPS)",
            "int8 / bf16", "error int8", "error bf16"]
    body = []
    for fmt in FORMATS:
        torch.manual_seed(0)
        layer = QuantLinear.from_linear(torch.nn.Linear(args.k, args.n, bias=False), fmt).eval()
        x = torch.randn(args.m, args.k).to(torch.bfloat16)
        ref = x.double() @ layer.weight(torch.float64).t()
        runs = {q: compile_program(layer, (x,), device="cpu", ctx=Context(knobs={"QGEMM": q}))
                for q in ("int8", "bf16")}
        runs["eager"] = layer
        err = {q: float((runs[q](x).double() - ref).norm() / ref.norm()) for q in ("int8", "bf16")}
        ms = interleaved(runs, (x,), args.rounds, min_s=0)           # one call a timing
        cell = lambda name: f"{ms[name]:.3f} ({flops / ms[name] / 1e6:.0f})"     # noqa: E731
        body.append([fmt, cell("int8"), cell("bf16"), cell("eager"),
                     f"{ms['bf16'] / ms['int8']:.2f}x", f"{err['int8']:.2g}", f"{err['bf16']:.2g}"])
    write_report(head, body, title="a quantized linear at prefill",
                 heading="A prefill's quantized linear: int8 rows, the bf16 path, eager",
                 env=collect_cpu_env(torch.get_num_threads()),
                 notes=[f"M={args.m} K={args.k} N={args.n}, bf16 activations, a QuantLinear per "
                        f"format; median of {args.rounds} interleaved rounds; error: |out - "
                        f"float64| / |float64| by norm (QGEMM=int8 rounds the activations to int8 "
                        f"blocks of 32); `python -m strata.bench.quant_prefill --m {args.m} --k "
                        f"{args.k} --n {args.n}`"],
                 out=args.out, stem="quant-prefill")
    return 0


if __name__ == "__main__":
    sys.exit(main())
