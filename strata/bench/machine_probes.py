"""The ceilings of this CPU's profile (tune/machine.py), measured by programs strata itself compiles and
runs natively: `strata machine --measure`.

What: sums of rows over DRAM-, LLC- and L2-sized tensors (read GB/s), the peaks of fp32 FMAs,
vdpbf16ps and AMX tiles in registers, and in-cache matmuls on each (FORM=outer, pairs, amx),
where the CPU has the instructions (GFLOP/s: what strata's own micro-kernels reach against what
the units can do). Why here and not in machine.py: measuring compiles with strata.compile and
times with bench/cpu_bench.py, while the cached profile is read below them (the cost model).

A figure is only cached when it can be trusted (issue 51: under load a profile said L2 0.3 GB/s
below DRAM 11.3, and an fp32 peak of 8.4 GFLOP/s against 90 quiet): a probe during which other
processes took over cpu_load.BUSY of the CPU, a cache level read slower than the level below it,
a matmul faster than its unit's peak, or a peak under half the last profile's is measured again,
up to ATTEMPTS times; then `measure` refuses in one sentence and caches nothing. Every probe runs
on every core, whatever the load (runtime/threads.py would otherwise give it fewer).
"""
from __future__ import annotations

import ctypes
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import torch

from ..api import compile as strata_compile
from ..core.context import Context
from ..core.cpu_load import BUSY, OtherLoad
from ..core.errors import StrataError
from ..runtime.native_build import build_library, load_library
from ..runtime.threads import set_threads
from ..tune.machine import Profile, cache_path, cached, facts
from .amx_probe import TILE_FLOP, load_kernel
from .cpu_bench import time_once

# The peaks: 12 independent accumulators in registers on every core, nothing loaded (C, built
# by runtime/cc.py's path); st_peak returns the seconds `n` steps took.
PEAK_C = r"""
#include <omp.h>
#include <immintrin.h>
#if defined(__AVX512F__)
typedef float vec __attribute__((vector_size(64)));
#define ST_FMA(a) a = (vec)_mm512_fmadd_ps((__m512)x, (__m512)y, (__m512)a);
#else
typedef float vec __attribute__((vector_size(32)));
#define ST_FMA(a) a = (vec)_mm256_fmadd_ps((__m256)x, (__m256)y, (__m256)a);
#endif
int st_lanes(void) { return sizeof(vec) / 4; }
double st_peak(int bf16, long n) {
    double t0 = omp_get_wtime();
    float sink = 0.0f;
    #pragma omp parallel reduction(+:sink)
    {
        vec x = (vec){0} + 1.0001f, y = (vec){0} + 0.9999f;
        // twelve different starts: equal ones made gcc compute one chain and count it 12 times
        vec a0 = x * 0, a1 = x * 1, a2 = x * 2, a3 = x * 3, a4 = x * 4, a5 = x * 5,
            a6 = x * 6, a7 = x * 7, a8 = x * 8, a9 = x * 9, a10 = x * 10, a11 = x * 11;
#define ST_STEP(OP) OP(a0) OP(a1) OP(a2) OP(a3) OP(a4) OP(a5) OP(a6) OP(a7) OP(a8) OP(a9) OP(a10) OP(a11)
#if defined(__AVX512BF16__)
#define ST_DOT(a) a = (vec)_mm512_dpbf16_ps((__m512)a, (__m512bh)x, (__m512bh)y);
#else
#define ST_DOT(a) ST_FMA(a)
#endif
        for (long i = 0; i < n; i++) {
            if (bf16) { ST_STEP(ST_DOT) } else { ST_STEP(ST_FMA) }
            __asm__ volatile("" : "+v"(x));
        }
        vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
        for (int j = 0; j < (int)(sizeof(vec) / 4); j++) sink += s[j];
    }
    return omp_get_wtime() - t0 + (sink == 1.0f ? 1e-9 : 0.0);
}
"""


ATTEMPTS = 3                    # measurements of one probe before the profile is refused
SLOWER = ("DRAM read", "LLC read", "L2 read")       # each level reads at least as fast as the last
UNIT = {"fp32 matmul (FMA)": "fp32 FMA peak", "bf16 matmul (vdpbf16ps)": "bf16 vdpbf16ps peak",
        "bf16 matmul (AMX)": "bf16 AMX peak"}        # a matmul cannot beat its unit's peak


class UntrustedProfile(StrataError):
    """A ceiling stayed busy or self-contradictory after ATTEMPTS measurements: nothing cached."""


def measure(say=lambda text: None) -> Profile:
    """Measure the ceilings (about a minute) and cache the profile, if every figure can be
    trusted (see the module docstring); else raise UntrustedProfile."""
    p, last = facts(), cached()
    probes = dict(_probes(p))
    set_threads(p.cores)
    try:
        for name, fn in probes.items():
            _keep(p.ceilings, name, _trusted(name, fn, p.ceilings, last, say))
        for matmul, peak in UNIT.items():        # a peak under strata's own matmul: measure again
            if peak in p.ceilings and matmul in p.ceilings and implausible(peak, p.ceilings[peak],
                                                                           p.ceilings, last):
                _keep(p.ceilings, peak, _trusted(peak, probes[peak], p.ceilings, last, say))
    finally:
        set_threads(None)
    p.measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path = cache_path(p)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(p), indent=1))
    tmp.replace(path)
    return p


def _keep(ceilings: dict, name: str, value: float | None) -> None:
    if value is not None:      # a tiny figure keeps two digits instead of reading 0
        ceilings[name] = round(value, 1) if value >= 1 else float(f"{value:.2g}")


def _trusted(name: str, fn, ceilings: dict, last: Profile | None, say) -> float | None:
    """`fn`'s value once neither the load nor the figures so far contradict it."""
    for attempt in range(ATTEMPTS):
        say(f"measuring {name}" + (f" (attempt {attempt + 1} of {ATTEMPTS})" if attempt else ""))
        load = OtherLoad()
        value = fn()
        if value is None:
            return None
        share = load.share()
        why = (f"other processes took {100 * share:.0f}% of the CPU" if share is not None
               and share > BUSY else implausible(name, value, ceilings, last))
        if why is None:
            return value
        say(f"{name}: {why}; measuring it again")
    raise UntrustedProfile(f"{name} could not be trusted after {ATTEMPTS} measurements ({why}): "
                           f"no profile was cached; run `strata machine --measure` on a quiet "
                           f"machine" + (f" (or delete {cache_path()} if this CPU is slower than "
                                         f"when it was measured)" if "last profile" in why else ""))


def implausible(name: str, value: float, ceilings: dict, last: Profile | None) -> str | None:
    """Why `value` cannot be `name`'s ceiling beside the `ceilings` measured before it and the
    `last` cached profile, or None."""
    if name in SLOWER:
        for below in SLOWER[:SLOWER.index(name)]:
            if below in ceilings and value < 0.9 * ceilings[below]:
                return f"{value:.1f} GB/s is slower than {below} ({ceilings[below]:.1f} GB/s)"
    for matmul in (m for m, unit in UNIT.items() if unit == name and m in ceilings):
        if ceilings[matmul] > 1.1 * value:
            return f"{value:.1f} GFLOP/s is under what {matmul} reached ({ceilings[matmul]:.1f})"
    before = last.ceilings.get(name) if last is not None else None
    if name.endswith("peak") and before and value < 0.5 * before:
        return f"{value:.1f} GFLOP/s is under half the last profile's {before:.1f}"
    return None


def _probes(p: Profile):
    """(ceiling, function returning its value or None) for what this CPU has."""
    l2, l3 = p.caches.get("L2", 1 << 20), p.caches.get("L3", 0)
    yield "DRAM read", lambda: _read_gbps(256 << 20)
    if l3 >= 8 * l2 * p.cores:                       # an LLC well past the L2s
        yield "LLC read", lambda: _read_gbps(min(l3 // 4, 32 << 20))
    yield "L2 read", lambda: _read_gbps(l2 * p.cores // 2)
    if p.machine == "x86_64" and ("avx512f" in p.features or {"avx2", "fma"} <= set(p.features)):
        yield "fp32 FMA peak", lambda: _peak_gflops(False)
        if "avx512_bf16" in p.features:
            yield "bf16 vdpbf16ps peak", lambda: _peak_gflops(True)
    if {"amx_tile", "amx_bf16"} <= set(p.features):
        yield "bf16 AMX peak", _amx_peak_gflops
    yield "fp32 matmul (FMA)", lambda: _matmul_gflops("float32", 192, 512, 512, {"FORM": "outer"})
    if "avx512_bf16" in p.features:
        yield "bf16 matmul (vdpbf16ps)", lambda: _matmul_gflops("bfloat16", 192, 512, 512,
                                                                {"FORM": "pairs"})
    if "amx_bf16" in p.features:
        yield "bf16 matmul (AMX)", lambda: _matmul_gflops("bfloat16", 512, 1024, 1024, {"FORM": "amx"})


def _best_seconds(fn, rounds: int = 7) -> float:
    fn()
    return min(time_once(fn, ()) for _ in range(rounds))


def _peak_gflops(bf16: bool) -> float:
    """GFLOP/s of PEAK_C on every core: 12 FMAs of the widest vector (zmm: 32 flops each, ymm: 16)
    or vdpbf16ps (64) a step."""
    lib = load_library(build_library(PEAK_C))
    peak, lanes = lib.st_peak, lib.st_lanes()
    peak.argtypes, peak.restype = [ctypes.c_int, ctypes.c_long], ctypes.c_double
    n, threads = 2_000_000, os.cpu_count() or 1
    peak(int(bf16), n // 10)                                    # wakes the threads and the clocks
    return 12 * (64 if bf16 else 2 * lanes) * n * threads / min(peak(int(bf16), n) for _ in range(5)) / 1e9


def _amx_peak_gflops() -> float:
    """GFLOP/s of tdpbf16ps on four accumulator tiles, nothing loaded in the loop, one thread per
    core (bench/amx_probe.py's kernel, which asks Linux for the tiles)."""
    lib, src = load_kernel(emulate=False), torch.full((16, 32), 1 / 64, dtype=torch.bfloat16)
    iters, threads, tiles = 200_000, os.cpu_count() or 1, 4

    def run() -> float:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:         # ctypes drops the GIL: one core each
            list(pool.map(lambda _: lib.strata_amx_peak(iters, tiles, src.data_ptr()), range(threads)))
        return time.perf_counter() - t0
    run()
    return threads * iters * tiles * TILE_FLOP / min(run() for _ in range(5)) / 1e9


def _read_gbps(nbytes: int) -> float:
    """GB/s read by strata's sums of 256 rows over `nbytes` of fp32, the best of several rounds
    (rows: its fastest reading kernel; one call, so an L2-sized read includes a call's cost)."""
    x = torch.ones(256, max(1, nbytes // 1024))
    program = strata_compile(lambda t: t.sum(1), (x,), device="cpu")
    return nbytes / _best_seconds(lambda: program(x)) / 1e9


def _matmul_gflops(dtype: str, m: int, n: int, k: int, knobs: dict) -> float:
    """GFLOP/s of strata's matmul of an (m, k) input by a (k, n) weight, with `knobs` pinned."""
    lin = torch.nn.Linear(k, n, bias=False).to(getattr(torch, dtype)).requires_grad_(False)
    x = torch.randn(m, k, dtype=getattr(torch, dtype))
    program = strata_compile(lin, (x,), device="cpu", ctx=Context(target="host", knobs=knobs))
    with torch.no_grad():
        return 2 * m * n * k / _best_seconds(lambda: program(x)) / 1e9
