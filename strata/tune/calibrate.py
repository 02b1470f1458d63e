"""The cost model calibrated by this machine's own measurements (the tuning database).

Why: the roofline (cost.py) cannot tell a register tile of 6 rows from one of 8, and those
are most of a CPU contraction's candidates; on Zen 5 its median rank correlation with what was
measured fell to 0.03 on TinyLlama's kernels. What a knob's value did to other kernels of the
same kind on this machine is a better guess: each candidate that changes one knob is ranked by
the median time ratio that change had, measured against the default, on the other kernels
(other signatures: never the kernel's own earlier result) whose schedules have the same knobs;
a change never measured keeps the roofline's ratio.
"""
from __future__ import annotations

import json
import statistics

MIN_SEEN = 2        # kernels a change must have been measured on to be believed


def kind(candidates: list[dict]) -> frozenset:
    """The knobs a kernel's candidates change: kernels with the same are alike (a bf16 pairs
    contraction, a row kernel with KEEP ...)."""
    return frozenset(name for pins in candidates for name in pins)


def learned(rows: list[tuple[str, list, list]], signature: str, like: frozenset) -> dict:
    """{candidate as JSON: median ratio to the default} of single-knob changes measured on
    MIN_SEEN or more other kernels of kind `like` (db.measurements' rows)."""
    seen: dict[str, dict[str, float]] = {}
    for sig, measured, untried in rows:
        if sig == signature or kind([p for p, *_ in measured] + untried) != like:
            continue
        for pins, ms, default_ms in measured:
            if len(pins) == 1 and default_ms > 0:
                seen.setdefault(json.dumps(pins, sort_keys=True), {})[sig] = ms / default_ms
    return {key: statistics.median(by_sig.values()) for key, by_sig in seen.items()
            if len(by_sig) >= MIN_SEEN}


def calibrated(estimates: dict, ratios: dict) -> dict:
    """The roofline's estimates ({candidate JSON: ms}, "{}" the default's) with each learned
    change's time put at the default's times its measured ratio."""
    base = estimates.get("{}")
    if not base or base == float("inf"):
        return estimates
    return {key: base * ratios[key] if key in ratios and est != float("inf") else est
            for key, est in estimates.items()}
