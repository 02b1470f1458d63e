"""What one call of a compiled Program costs on the host, beside eager: a tiny op (RMSNorm over
2048 bf16 values, a few µs on the GPU) called back to back, so the time per call is the launch
path. Then cProfile's heaviest functions over the same calls, to say where that time goes.
`python -m strata.gpu_check.overhead` prints both; gpu_check quotes it."""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch

import strata

CALLS = 2000


def per_call_us(fn, x, calls: int = CALLS) -> float:
    for _ in range(20):
        fn(x)
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
    with torch.no_grad():
        rows = [("eager", per_call_us(gpu_norm, xc)), ("strata, CUDA graph", per_call_us(graph, xc)),
                ("strata, plain launches", per_call_us(plain, xc))]
    print("| variant | µs per call (host-bound: the kernel itself takes a few µs) |")
    print("| --- | --- |")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")
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
