"""`strata run -c CODE --device cpu --bench`: strata's native CPU kernels against PyTorch eager and
torch.compile (Inductor's C++ backend) on the same inputs, after the accuracy verdict.

Why interleaved rounds: these machines are shared and noisy, so each round times every variant
once, in turn, and the table quotes medians of many rounds; ratios are against the faster of
eager and torch.compile in the same run, and GB/s against a large copy measured in the same run
(the read+write bandwidth a memory-bound kernel can hope for)."""
from __future__ import annotations

import os
import statistics
import time

import torch

from ..api import compile_snippet
from ..core import dtypes
from ..core.cpu_load import OtherLoad, busy_sentence
from ..tune import machine
from .check import compare_with_eager, print_report
from .results import Ceilings
from .work import estimate_work

ROUNDS, MIN_ROUND_S = 31, 0.02
VIEW_ROUNDS = 11            # `strata view --bench`: fewer, the page is a first look


def time_once(fn, args, min_s: float = MIN_ROUND_S) -> float:
    """Seconds per call of fn(*args), averaged over as many calls as fill `min_s`."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn(*args)
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_s:
            return dt / n


def interleaved_samples(variants: dict, args, rounds: int = ROUNDS, min_s: float = MIN_ROUND_S,
                        before=None) -> dict[str, list[float]]:
    """Milliseconds per call of each variant in each of `rounds` rounds, one timing of each per
    round (calls filling `min_s`; 0: one call), after one warm-up call each (torch.compile
    compiles there); `before()` runs untimed before each timing (a cache flush)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for fn in variants.values():
            fn(*args)
        for _ in range(rounds):
            for name, fn in variants.items():
                if before is not None:
                    before()
                times[name].append(time_once(fn, args, min_s) * 1e3)
    return times


def interleaved(variants: dict, args, rounds: int = ROUNDS, **how) -> dict[str, float]:
    """Median milliseconds of each variant over `rounds` interleaved rounds (`how`: min_s,
    before, as interleaved_samples takes them)."""
    return {name: statistics.median(ts)
            for name, ts in interleaved_samples(variants, args, rounds, **how).items()}


def copy_gbps(nbytes: int = 256 << 20) -> float:
    """Read + write GB/s of a large tensor copy: the memory ceiling of this run."""
    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    ms = interleaved({"copy": lambda: dst.copy_(src)}, (), rounds=7)["copy"]
    return 2 * nbytes / ms / 1e6


def read_gbps(nbytes: int = 512 << 20) -> float:
    """GB/s read by torch.sum over a large tensor: the ceiling of a kernel that mostly reads
    (a GEMV's weights, a norm's rows); higher than a copy's, which also writes. The best of 9
    rounds, not the median: a ceiling is what the memory can do, and on a shared machine a
    median of a bandwidth drifts with the neighbours (42 to 75 GB/s between two runs here)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    ms = min(interleaved_samples({"sum": lambda: src.sum()}, (), rounds=9)["sum"])
    return nbytes / ms / 1e6


def mm_tflops(dtype: str, n: int = 2048) -> float:
    """torch.mm at n^3 in TFLOP/s: the compute ceiling of this run for `dtype`."""
    a, b = (torch.randn(n, n).to(dtypes.to_torch(dtype)) for _ in range(2))
    ms = interleaved({"mm": lambda: torch.mm(a, b)}, (), rounds=5)["mm"]
    return 2 * n ** 3 / ms / 1e9


def cpu_ceilings(mm_dtypes=("f32",)):
    return Ceilings(copy_gbps=copy_gbps(), read_gbps=read_gbps(),
                    mm_tflops={d: mm_tflops(d) for d in dict.fromkeys(mm_dtypes)}, mm_n=2048,
                    peak_tflops=profile_peaks())


def profile_peaks() -> dict:
    """TFLOP/s per dtype from the cached machine profile (`strata machine --measure`): the
    units' peak, where torch.mm gives only what its library reaches (bf16 on an AVX2 CPU: under
    a GFLOP/s). bf16 takes the fastest unit that computes it: AMX, vdpbf16ps, else fp32 FMAs."""
    p = machine.cached()
    c = p.ceilings if p else {}
    bf16 = [c[k] for k in ("bf16 AMX peak", "bf16 vdpbf16ps peak", "fp32 FMA peak") if k in c]
    peaks = {"f32": c.get("fp32 FMA peak"), "bf16": max(bf16, default=None)}
    return {dt: v / 1e3 for dt, v in peaks.items() if v}


def bench_snippet_cpu(code: str, ctx) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    program, snippet = compile_snippet(code, ctx, device="cpu")
    report = compare_with_eager(program, snippet)
    print_report(program, report, console)
    if not report.passed:
        return 1
    module, inputs = snippet.module, snippet.example_inputs
    torch._dynamo.reset()
    variants = {"eager": module, "torch.compile": torch.compile(module, dynamic=False),
                "strata": program}
    load = OtherLoad()
    ms = interleaved(variants, inputs)
    busy = busy_sentence(load.share())
    work = estimate_work(module, inputs)
    ceiling = copy_gbps()
    best = min(ms["eager"], ms["torch.compile"])
    table = Table(title=f"CPU timings ({torch.get_num_threads()} torch threads, "
                        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'all')}; median of "
                        f"{ROUNDS} interleaved rounds; copy ceiling {ceiling:.1f} GB/s)",
                  title_justify="left", caption=f"warning: {busy}" if busy else None,
                  caption_justify="left")
    for col in ("variant", "ms", "GB/s", "% of copy", "GFLOP/s", "vs faster of eager/compile"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for name, t in ms.items():
        gbs = work.bytes / t / 1e6
        table.add_row(name, f"{t:.4f}", f"{gbs:.1f}", f"{100 * gbs / ceiling:.0f}%",
                      f"{work.flops / t / 1e6:.1f}" if work.flops else "-", f"{best / t:.2f}x")
    console.print(table)
    return 0


def view_bench(program, snippet) -> dict:
    """`strata view --device cpu --bench`: medians of interleaved rounds (this module's
    method) of eager, torch.compile and strata's whole program, and of each strata kernel run
    alone on the buffers a whole run filled (the tuner's way, runtime/native.py); plus the
    sentence saying when other processes took the CPU meanwhile."""
    module, inputs = snippet.module, snippet.example_inputs
    torch._dynamo.reset()
    load = OtherLoad()
    whole = interleaved({"eager": module, "torch.compile": torch.compile(module, dynamic=False),
                         "strata": program}, inputs, rounds=VIEW_ROUNDS)
    run = program.runtime.kernel_runner([x.clone() for x in inputs])
    kernels = {}
    for k, kernel in enumerate(program.kernels):
        samples = interleaved_samples({"k": lambda: run(k)}, (), rounds=5)["k"]
        kernels[kernel.name] = statistics.median(samples)
    return {"whole": whole, "kernels": kernels, "rounds": VIEW_ROUNDS,
            "busy": busy_sentence(load.share()) or ""}
