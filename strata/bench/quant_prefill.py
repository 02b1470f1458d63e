"""A prefill's linear by a block-quantized weight, one per format: strata with QGEMM=int8 (int8
dot products, activation rows as vpdpbusd's lanes: tile/passes/cpu_int8_rows.py), strata with
QGEMM=bf16 (the weight dequantized to bf16 by a kernel of its own, then a bf16 GEMM) and torch
eager on the same QuantLinear, interleaved, each path's error against float64.

Why: issue 56 asks for prefill >= 1.5x llama.cpp's, which multiplies int8 by int8; this isolates
the product that decides it, per format, on the machine at hand.

    python -m strata.bench.quant_prefill [--m 128 --k 2048 --n 5632 --rounds 15]

Prints a markdown table (ms and GOPS, medians of interleaved rounds).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from ..api import compile as compile_program
from ..context import Context
from ..quant.formats import QuantLinear
from .env import cpu_name

FORMATS = ("q4_0", "q8_0", "q4_k", "q6_k")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.quant_prefill",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=128, help="activation rows (default 128)")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=5632)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    if min(args.m, args.k, args.n, args.rounds) < 1:
        print("quant_prefill: --m, --k, --n and --rounds must be at least 1", file=sys.stderr)
        return 2
    flops = 2 * args.m * args.k * args.n
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, M={args.m} K={args.k} N={args.n}, "
          f"bf16 activations; ms (GOPS), median of {args.rounds} interleaved rounds; error: "
          f"|out - float64| / |float64| by norm\n")
    print("| format | QGEMM=int8 | QGEMM=bf16 | eager | int8 / bf16 | error int8 | error bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for fmt in FORMATS:
        torch.manual_seed(0)
        layer = QuantLinear.from_linear(torch.nn.Linear(args.k, args.n, bias=False), fmt).eval()
        x = torch.randn(args.m, args.k).to(torch.bfloat16)
        ref = x.double() @ layer.weight(torch.float64).t()
        runs = {q: compile_program(layer, (x,), device="cpu", ctx=Context(knobs={"QGEMM": q}))
                for q in ("int8", "bf16")}
        runs["eager"] = layer
        err = {q: float((runs[q](x).double() - ref).norm() / ref.norm()) for q in ("int8", "bf16")}
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                t = time.perf_counter()
                run(x)
                times[name].append(time.perf_counter() - t)
        ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
        cell = lambda name: f"{ms[name]:.3f} ({flops / ms[name] / 1e6:.0f})"     # noqa: E731
        print(f"| {fmt} | {cell('int8')} | {cell('bf16')} | {cell('eager')} | "
              f"{ms['bf16'] / ms['int8']:.2f}x | {err['int8']:.2g} | {err['bf16']:.2g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
