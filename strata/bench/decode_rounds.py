"""`python -m strata.bench.decode --rounds R`: strata and a baseline (llama.cpp with --gguf, else
HF eager on the CPU) in turn, R rounds.

Why: the 2-core machines' memory bandwidth moves within minutes, and a decode step reads the
weights at about that bandwidth, so strata measured first and llama.cpp a minute later gave
ratios from 0.94x to 1.26x for one file on one day (docs/models.md, 2026-11-30); a 2048-token
fp32 prefill read 0.80x eager timed one after the other and 1.10x-1.37x in turn (Zen 3,
2026-12-03). Each round times strata's programs (compiled once) and then the baseline; the rows
are the medians of the rounds' medians, and a note lists each round's prefill and decode ratios,
so a drift shows instead of deciding.
"""
from __future__ import annotations

import statistics

from .decode_report import STRATA, DecodeVariant, measure


def more_rounds(rows: list[DecodeVariant], strata_run, baseline, rounds: int, n: int,
                repeats: int, say) -> tuple[list[DecodeVariant], list[str]]:
    """`rows` (strata's row, then the baseline's of the first round) after rounds 2..`rounds`:
    strata_run(n) as measure() times it, baseline() -> the baseline's rows of a round; the rows
    combined and a note of every round's prefill and tokens/s ratios. Rows that failed, or one
    side missing, stay as they are."""
    ours = next((r for r in rows if r.name == STRATA and r.ok), None)
    theirs = next((r for r in rows if r.name != STRATA and r.ok), None)
    if rounds < 2 or ours is None or theirs is None:
        return rows, []
    seen = {ours.name: [ours], theirs.name: [theirs]}
    for r in range(2, rounds + 1):
        say(f"round {r} of {rounds}: strata, then {theirs.name}")
        seen[ours.name].append(measure(STRATA, strata_run, n, repeats, warmups=()))
        seen[theirs.name].append(next((x for x in baseline() if x.name == theirs.name), None)
                                 or DecodeVariant(theirs.name, "failed: no row"))
    if not all(v.ok for vs in seen.values() for v in vs):
        bad = next(v for vs in seen.values() for v in vs if not v.ok)
        return rows, [f"rounds 2 to {rounds} not counted: {bad.name} {bad.status}"]
    pairs = list(zip(seen[ours.name], seen[theirs.name]))
    ratios = [a.tokens_per_s / b.tokens_per_s for a, b in pairs]
    prefill = [b.prefill_ms / a.prefill_ms for a, b in pairs]
    note = (f"{rounds} interleaved rounds (strata, then {theirs.name}; medians of the rounds' "
            f"medians), strata's speed over {theirs.name}'s per round: prefill "
            + ", ".join(f"{x:.2f}x" for x in prefill) + "; decode tokens/s "
            + ", ".join(f"{x:.2f}x" for x in ratios))
    return [_combined(seen[r.name]) if r.name in seen else r for r in rows], [note]


def _combined(runs: list[DecodeVariant]) -> DecodeVariant:
    last = runs[-1]
    return DecodeVariant(last.name, "ok", statistics.median(r.prefill_ms for r in runs),
                         statistics.median(r.tokens_per_s for r in runs), last.steps,
                         sum(r.runs for r in runs), last.ids)
