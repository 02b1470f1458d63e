"""What strata knows about this CPU, measured once and cached: `strata machine`.

Why: speed that fits one machine's constants does not carry over (issue 26). The profile names
the CPU (model, family/model, the named target it is closest to), its ISA features, cores and
cache sizes (sysfs), and ceilings measured by programs strata itself compiles and runs natively
(bench/machine_probes.py: read bandwidths, register peaks, in-cache matmuls). The cost model
reads its bandwidths (tune/cost.py), the view its roofline. A profile is cached per CPU model,
feature flags and core count under the user cache dir; `strata machine --measure` measures again.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..core.targets import TARGETS, host, sysfs_caches
from ..core.user_cache import user_cache_dir
from ..runtime.cc import cpu_features

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
                   sysfs_caches() if cpuinfo is None else {}, _closest(here.features, here.machine))


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
