"""Nsight Compute on the op-suite cases where strata is furthest behind: rank the suite's JSON
by strata's speedup over the faster of eager and torch.compile, profile each of the slowest in a
child that builds the case, compiles it and calls it once (`python -m strata.bench.ncu --case
"CASE NAME"`), and report ncu's numbers per strata kernel beside the case's achieved
GB/s and TFLOP/s (its ideal bytes and FLOPs over the summed kernel durations)."""
from __future__ import annotations

import re
import shutil

from ..bench.ncu import ncu_command, ncu_errors, parse_ncu_csv


def slowest(suite: dict, count: int) -> list[dict]:
    timed = [c for c in suite.get("cases", []) if (c.get("speedup") or {}).get("vs_best")]
    return sorted(timed, key=lambda c: c["speedup"]["vs_best"])[:count]


def profile_case(run, case: dict) -> tuple[list[str], bool]:
    """Markdown lines for one case and whether ncu gave numbers."""
    names = list(dict.fromkeys(k["name"] for k in case.get("kernels", [])))
    head = [f"### {case['name']}: {case['speedup']['vs_best']:.2f}x the faster baseline", ""]
    ncu = shutil.which("ncu")
    if ncu is None or not names:
        return head + ["ncu is not on PATH" if ncu is None else "the case has no strata kernels"], False
    cmd = ncu_command(ncu, case["name"], [k["name"] for k in case["kernels"]], "--case")
    proc = run.call(cmd, 45, "ncu_" + re.sub(r"[^A-Za-z0-9]+", "_", case["name"]) + ".log")
    kernels = parse_ncu_csv(proc.text)
    if not kernels:
        errors = ncu_errors(proc.text)
        why = errors[0] if errors else f"no kernel profiled (exit {proc.rc})"
        return head + [f"ncu: {why}"], False
    total_us = sum(k.duration_us or 0.0 for k in kernels)
    achieved = []
    if total_us:
        achieved.append(f"{case['bytes'] / total_us / 1e3:.0f} GB/s")
        if case.get("flops"):
            achieved.append(f"{case['flops'] / total_us / 1e6:.1f} TFLOP/s")
    lines = head + [f"ncu (replayed, caches flushed, base clocks): {total_us:.1f} µs in all, "
                    f"{', '.join(achieved) or 'no duration'} of the case's ideal work", "",
                    "| kernel | µs | DRAM % | SM % | occupancy % | registers |",
                    "| --- | --- | --- | --- | --- | --- |"]
    fmt = lambda v, spec: "—" if v is None else format(v, spec)
    for k in kernels:
        lines.append(f"| {k.base_name} | {fmt(k.duration_us, '.1f')} | {fmt(k.value('dram'), '.1f')} "
                     f"| {fmt(k.value('sm'), '.1f')} | {fmt(k.value('occupancy'), '.1f')} "
                     f"| {fmt(k.value('registers'), '.0f')} |")
    return lines, True

