"""What one call of a compiled Program costs on the host, beside eager and torch.compile's
reduce-overhead mode: a tiny op (RMSNorm over 2048 bf16 values, a few µs on the GPU) called back
to back, so the time per call is the launch path. Rounds interleave the variants; the table gives
each one's median. Then cProfile's heaviest functions over strata's calls, to say where the time
goes. `python -m strata.gpu_check.overhead` prints both; gpu_check quotes it."""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

import strata

CALLS, ROUNDS = 1000, 7


def per_call_us(fn, x, calls: int = CALLS) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    norm = torch.nn.RMSNorm(2048).to(torch.bfloat16).requires_grad_(False)
    x = torch.randn(1, 2048).bfloat16()
    graph = strata.compile(norm, (x,), device="cuda", use_graph=True)
    plain = strata.compile(norm, (x,), device="cuda", use_graph=False)
    xc, gpu_norm = x.cuda(), norm.cuda()
    out = torch.empty_like(xc)
    variants = {"eager": gpu_norm, "strata, CUDA graph": graph,
                "strata, CUDA graph, out=": lambda x: graph(x, out=out),
                "strata, plain launches": plain,
                "torch.compile reduce-overhead": torch.compile(gpu_norm, mode="reduce-overhead")}
    times = {name: [] for name in variants}
    with torch.no_grad():
        for fn in variants.values():
            for _ in range(20):
                fn(xc)
        for _ in range(ROUNDS):
            for name, fn in variants.items():
                times[name].append(per_call_us(fn, xc))
    print(f"| variant | µs per call, median of {ROUNDS} rounds of {CALLS} (host-bound: the kernel "
          f"itself takes a few µs) |")
    print("| --- | --- |")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.1f} |")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        graph(xc)
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    print(f"\ncProfile of {CALLS} calls of the CUDA-graph program, by own time:\n```")
    print("\n".join(ln for ln in text.getvalue().splitlines() if ln.strip())[:6000])
    print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
