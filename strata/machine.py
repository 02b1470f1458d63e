"""What strata knows about this CPU, measured once and cached: `strata machine`.

Why: speed that fits one machine's constants does not carry over (issue 26). The profile names
the CPU (model, family/model, the named target it is closest to), its ISA features, cores and
cache sizes (sysfs), and ceilings measured by programs strata itself compiles and runs natively:
sums of rows over DRAM-, LLC- and L2-sized tensors (read GB/s), the peaks of fp32 FMAs,
vdpbf16ps and AMX tiles in registers, and in-cache matmuls on each (FORM=outer, pairs, amx),
where the CPU has the instructions (GFLOP/s: what strata's own micro-kernels reach against what
the units can do). The cost
model reads its bandwidths (tune/cost.py). A profile is cached per CPU model, feature flags and
core count under the user cache dir; `strata machine --measure` measures again.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .runtime.cc import cpu_features
from .targets import TARGETS, host
from .user_cache import user_cache_dir

FORMAT = 1
# family 6 models of the Intel server parts the named targets stand for
_INTEL = {143: "Sapphire Rapids", 207: "Emerald Rapids", 173: "Granite Rapids",
          106: "Ice Lake-SP", 85: "Skylake-SP / Cascade Lake"}
_AMD = {(25, 17): "Zen 4 (Genoa)", (25, 160): "Zen 4c (Bergamo)", (25, 1): "Zen 3 (Milan)",
        (23, 49): "Zen 2 (Rome)", (26, 2): "Zen 5 (Turin)"}


@dataclass
class Profile:
    model: str                       # /proc/cpuinfo's model name
    part: str                        # what family/model say it is, where known
    machine: str                     # x86_64, aarch64
    cores: int
    features: list[str]              # what targets.host() reads
    caches: dict[str, int]           # "L1d", "L2", "L3" -> bytes (one core's L1/L2; L3 shared)
    closest: str                     # the named CPU target whose features this CPU has
    ceilings: dict[str, float] = field(default_factory=dict)   # see CEILINGS
    measured: str = ""               # UTC time of the measurement
    format: int = FORMAT


CEILINGS = {                         # name -> unit, in the order printed
    "DRAM read": "GB/s", "LLC read": "GB/s", "L2 read": "GB/s",
    "fp32 FMA peak": "GFLOP/s", "bf16 vdpbf16ps peak": "GFLOP/s", "bf16 AMX peak": "GFLOP/s",
    "fp32 matmul (FMA)": "GFLOP/s", "bf16 matmul (vdpbf16ps)": "GFLOP/s",
    "bf16 matmul (AMX)": "GFLOP/s"}

# The peaks: 12 independent accumulators in registers on every core, nothing loaded (C, built
# by runtime/cc.py's path); st_peak returns the seconds `n` steps took.
PEAK_C = r"""
#include <omp.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
typedef float v16 __attribute__((vector_size(64)));
double st_peak(int bf16, long n) {
    double t0 = omp_get_wtime();
    float sink = 0.0f;
    #pragma omp parallel reduction(+:sink)
    {
        v16 x = (v16){0} + 1.0001f, y = (v16){0} + 0.9999f;
        // twelve different starts: equal ones made gcc compute one chain and count it 12 times
        v16 a0 = x * 0, a1 = x * 1, a2 = x * 2, a3 = x * 3, a4 = x * 4, a5 = x * 5,
            a6 = x * 6, a7 = x * 7, a8 = x * 8, a9 = x * 9, a10 = x * 10, a11 = x * 11;
#define ST_STEP(OP) OP(a0) OP(a1) OP(a2) OP(a3) OP(a4) OP(a5) OP(a6) OP(a7) OP(a8) OP(a9) OP(a10) OP(a11)
#define ST_FMA(a) a = __builtin_ia32_vfmaddps512_mask(x, y, a, -1, 4);
#if defined(__AVX512BF16__)
#define ST_DOT(a) a = (v16)_mm512_dpbf16_ps((__m512)a, (__m512bh)x, (__m512bh)y);
#else
#define ST_DOT(a) ST_FMA(a)
#endif
        for (long i = 0; i < n; i++) {
            if (bf16) { ST_STEP(ST_DOT) } else { ST_STEP(ST_FMA) }
            __asm__ volatile("" : "+v"(x));
        }
        v16 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
        for (int j = 0; j < 16; j++) sink += s[j];
    }
    return omp_get_wtime() - t0 + (sink == 1.0f ? 1e-9 : 0.0);
}
"""


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpuinfo(text: str) -> dict[str, str]:
    """The first processor's `key : value` lines of a /proc/cpuinfo text."""
    facts: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if not line.strip():
            if facts:
                break                              # the first processor is enough
            continue
        facts.setdefault(key.strip(), value.strip())
    return facts


def _sysfs_caches() -> dict[str, int]:
    """One core's caches from /sys/devices/system/cpu/cpu0/cache (L1d, L2, L3)."""
    out: dict[str, int] = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind = (d / "level").read_text().strip(), (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        out[f"L{level}{'d' if level == '1' else ''}"] = int(size.rstrip("KMG")) * scale
    return out


_ARM = {"0xd0c": "Neoverse N1", "0xd40": "Neoverse V1", "0xd49": "Neoverse N2",
        "0xd4f": "Neoverse V2"}      # Arm's CPU part numbers (implementer 0x41)


def _part(info: dict[str, str]) -> str:
    try:
        family, model = int(info.get("cpu family", "")), int(info.get("model", ""))
    except ValueError:
        part = info.get("CPU part", "")
        return f"{_ARM.get(part, 'unknown part')} (CPU part {part})" if part else \
            info.get("uarch", "unknown part")
    vendor = info.get("vendor_id", "")
    name = _INTEL.get(model) if vendor == "GenuineIntel" and family == 6 else \
        _AMD.get((family, model)) if vendor == "AuthenticAMD" else None
    return f"{name or 'unknown part'} (family {family}, model {model})"


def _closest(features: frozenset, machine: str) -> str:
    """The named CPU target with the most features this CPU has all of."""
    fits = [t for t in TARGETS.values() if t.kind == "cpu" and t.machine == machine
            and t.features <= features]
    return max(fits, key=lambda t: len(t.features)).name if fits else "cpu"


def facts(cpuinfo: str | None = None) -> Profile:
    """The profile without ceilings: what the OS says (cheap). `cpuinfo`: another machine's
    /proc/cpuinfo text (tests), whose cores are its processor lines and caches unknown."""
    text = _read_cpuinfo() if cpuinfo is None else cpuinfo
    info, here = _cpuinfo(text), host(text)
    cores = (os.cpu_count() or 1) if cpuinfo is None else max(1, text.count("processor\t"))
    model = info.get("model name") or info.get("uarch") or \
        (f"ARM implementer {info['CPU implementer']}" if "CPU implementer" in info else "unknown")
    return Profile(model, _part(info), here.machine, cores, sorted(here.features),
                   _sysfs_caches() if cpuinfo is None else {}, _closest(here.features, here.machine))


def cache_path(p: Profile | None = None) -> Path:
    p = p or facts()
    record = json.dumps([FORMAT, p.model, p.part, p.cores, cpu_features()])
    key = hashlib.sha256(record.encode()).hexdigest()
    return user_cache_dir() / "machine" / f"{key[:16]}.json"


def cached() -> Profile | None:
    """This machine's measured profile, if one was cached (never measures)."""
    try:
        data = json.loads(cache_path().read_text())
        return Profile(**data) if data.get("format") == FORMAT else None
    except (OSError, ValueError, TypeError):
        return None


def measure(say=lambda text: None) -> Profile:
    """Measure the ceilings (about a minute) and cache the profile."""
    p = facts()
    for name, fn in _probes(p):
        say(f"measuring {name}")
        value = fn()
        if value is not None:
            p.ceilings[name] = round(value, 1)
    p.measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path = cache_path(p)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(p), indent=1))
    tmp.replace(path)
    return p


def _probes(p: Profile):
    """(ceiling, function returning its value or None) for what this CPU has."""
    l2, l3 = p.caches.get("L2", 1 << 20), p.caches.get("L3", 0)
    yield "DRAM read", lambda: _read_gbps(256 << 20)
    if l3 >= 8 * l2 * p.cores:                       # an LLC well past the L2s
        yield "LLC read", lambda: _read_gbps(min(l3 // 4, 32 << 20))
    yield "L2 read", lambda: _read_gbps(l2 * p.cores // 2)
    if p.machine == "x86_64" and "avx512f" in p.features:
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
    from .bench.cpu_bench import time_once          # (bench imports torch: measuring only)
    fn()
    return min(time_once(fn, ()) for _ in range(rounds))


def _peak_gflops(bf16: bool) -> float:
    """GFLOP/s of PEAK_C on every core: 12 zmm FMAs (32 flops each) or vdpbf16ps (64) a step."""
    import ctypes

    from .runtime.native_build import build_library, load_library
    peak = load_library(build_library(PEAK_C)).st_peak
    peak.argtypes, peak.restype = [ctypes.c_int, ctypes.c_long], ctypes.c_double
    n, threads = 2_000_000, os.cpu_count() or 1
    peak(int(bf16), n // 10)                                    # wakes the threads and the clocks
    return 12 * (64 if bf16 else 32) * n * threads / min(peak(int(bf16), n) for _ in range(5)) / 1e9


def _amx_peak_gflops() -> float:
    """GFLOP/s of tdpbf16ps on four accumulator tiles, nothing loaded in the loop, one thread per
    core (bench/amx_probe.py's kernel, which asks Linux for the tiles)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from .bench.amx_probe import TILE_FLOP, load_kernel
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
    import torch

    from .api import compile as strata_compile     # (the compiler sits above this module)
    x = torch.ones(256, max(1, nbytes // 1024))
    program = strata_compile(lambda t: t.sum(1), (x,), device="cpu")
    return nbytes / _best_seconds(lambda: program(x)) / 1e9


def _matmul_gflops(dtype: str, m: int, n: int, k: int, knobs: dict) -> float:
    """GFLOP/s of strata's matmul of an (m, k) input by a (k, n) weight, with `knobs` pinned."""
    import torch

    from .api import compile as strata_compile
    from .context import Context
    lin = torch.nn.Linear(k, n, bias=False).to(getattr(torch, dtype))
    x = torch.randn(m, k, dtype=getattr(torch, dtype))
    program = strata_compile(lin, (x,), device="cpu", ctx=Context(target="host", knobs=knobs))
    with torch.no_grad():
        return 2 * m * n * k / _best_seconds(lambda: program(x)) / 1e9


def describe(p: Profile) -> str:
    """The profile as `strata machine` prints it."""
    kib = lambda b: f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"   # noqa: E731
    lines = [f"cpu       {p.model}: {p.part}, {p.machine}",
             f"cores     {p.cores}",
             f"features  {' '.join(p.features) or '(none strata uses)'}",
             f"caches    {', '.join(f'{k} {kib(v)}' for k, v in p.caches.items()) or 'unknown'}",
             f"target    host (closest named target: {p.closest})"]
    if not p.ceilings:
        return "\n".join(lines + ["ceilings  not measured (strata machine --measure)"])
    lines.append(f"ceilings  measured {p.measured} on {p.cores} threads by strata's own kernels:")
    lines += [f"  {name:<26}{p.ceilings[name]:>10.1f} {unit}" for name, unit in CEILINGS.items()
              if name in p.ceilings]
    missing = [n for n in CEILINGS if n not in p.ceilings]
    if missing:
        lines.append(f"  (not measured here: {', '.join(missing)})")
    return "\n".join(lines)
