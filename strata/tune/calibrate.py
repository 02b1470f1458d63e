"""The cost model calibrated by this machine's own measurements (the tuning database).

Why: the roofline (cost.py) cannot tell a register tile of 6 rows from one of 8, and those
are most of a CPU contraction's candidates; on Zen 5 its median rank correlation with what was
measured fell to 0.03 on TinyLlama's kernels. What a knob's value did to other kernels of the
same kind on this machine is a better guess: each candidate that changes one knob is ranked by
the median time ratio that change had, measured against the default, on the other kernels
(other signatures: never the kernel's own earlier result) whose schedules have the same knobs;
a change never measured keeps the roofline's ratio. A change's effect follows the kernel's
size (a taller register tile pays on a big product, not on a small one), so the ratio is the
median over the NEAREST kernels by default time: the kernel's own measured default once it has
one, the roofline's estimate of it before (`python -m strata.tune.calibrate`, leave-one-out
over Zen 5's database of 2026-12-01: rank correlation median 0.80, mean 0.67 over all kernels
alike; 0.92 and 0.78 over the 8 nearest).
"""
from __future__ import annotations

import json
import math
import statistics
import sys

MIN_SEEN = 2        # kernels a change must have been measured on to be believed
NEAREST = 8         # kernels alike in size whose ratios a change's estimate takes


def kind(candidates: list[dict]) -> frozenset:
    """The knobs a kernel's candidates change: kernels with the same are alike (a bf16 pairs
    contraction, a row kernel with KEEP ...)."""
    return frozenset(name for pins in candidates for name in pins)


def learned(rows: list[tuple], signature: str, like: frozenset) -> dict:
    """{candidate as JSON: [[ratio to the default, the default's ms], ...]} of single-knob
    changes measured on MIN_SEEN or more other kernels of kind `like` (db.measurements' rows)."""
    seen: dict[str, dict[str, list]] = {}
    for sig, measured, untried, *_ in rows:
        if sig == signature or kind([p for p, *_ in measured] + untried) != like:
            continue
        for pins, ms, default_ms in measured:
            if len(pins) == 1 and default_ms > 0:
                seen.setdefault(json.dumps(pins, sort_keys=True), {})[sig] = [ms / default_ms,
                                                                              default_ms]
    return {key: list(by_sig.values()) for key, by_sig in seen.items() if len(by_sig) >= MIN_SEEN}


def ratio(seen: list, default_ms: float, nearest: int = NEAREST) -> float:
    """The median ratio over the `nearest` kernels to `default_ms` (log distance)."""
    near = sorted(seen, key=lambda rd: abs(math.log(rd[1] / default_ms)))[:nearest]
    return statistics.median(r for r, _ in near)


def calibrated(estimates: dict, ratios: dict, default_ms: float | None = None) -> dict:
    """The roofline's estimates ({candidate JSON: ms}, "{}" the default's) with each learned
    change's time put at the default's times its ratio on the kernels nearest in size to
    `default_ms` (the measured default; else the roofline's)."""
    base = estimates.get("{}")
    if not base or base == float("inf"):
        return estimates
    size = default_ms or base
    return {key: base * ratio(ratios[key], size) if key in ratios and est != float("inf")
            else est for key, est in estimates.items()}


def leave_one_out(rows: list[tuple], nearest: int = NEAREST) -> list[float]:
    """The rank correlation, per kernel with two or more measured one-knob changes, between
    its measured ratios (and the default's 1) and those learned from the other kernels (other
    labels: not the same kernel measured by another strata version), sized by its measured
    default: how well calibration would have ordered what was measured."""
    from .cost import spearman
    out = []
    for sig, measured, untried, label in rows:
        got = [(json.dumps(p, sort_keys=True), ms / d, d) for p, ms, d in measured
               if len(p) == 1 and d > 0]
        others = [row for row in rows if row[3] != label]
        seen = learned(others, sig, kind([p for p, *_ in measured] + untried))
        points = [(ratio(seen[key], d, nearest), t) for key, t, d in got if key in seen]
        rank = spearman(*zip(*(points + [(1.0, 1.0)]))) if len(points) >= 2 else None
        if rank is not None:
            out.append(rank)
    return out


if __name__ == "__main__":     # python -m strata.tune.calibrate [TARGET]: this machine's ranks
    from ..core.targets import host
    from .db import TuningDB
    rows = TuningDB().measurements(sys.argv[1] if len(sys.argv) > 1 else host().key)
    for n, what in ((10 ** 6, "all kernels alike"), (NEAREST, f"the {NEAREST} nearest in size")):
        ranks = leave_one_out(rows, n)
        if ranks:
            print(f"{what}: {len(ranks)} kernels, rank correlation median "
                  f"{statistics.median(ranks):.2f}, mean {statistics.mean(ranks):.2f}")
