"""Each kernel's knobs (what its header prints) and where each value came from.

Why three sources: a value is the pass's default rule unless the user pinned it (--knob,
STRATA_KNOBS: `Context.knobs`) or `strata tune` recorded it for this kernel on this machine
(`Context.for_kernel`, keyed by the Loop IR kernel's signature); the page says which, and shows
the tuning database's record (default and tuned time, each candidate measured with its time)
when there is one."""
from __future__ import annotations

import json

from ..core.knobs import KNOBS, show
from ..loop.ir import signature


def kernel_sources(loop_program, ctx) -> dict[str, tuple[dict, str, str]]:
    """{loop kernel: (its extra knobs, "tuned"/"candidate"/"", signature)}."""
    buffers = {b.name: b for b in loop_program.buffers}
    out = {}
    for k in loop_program.kernels:
        sig = signature(k, buffers)
        kctx, source = ctx.for_kernel(sig)
        extra = {n: v for n, v in kctx.knobs.items() if n not in ctx.knobs} if source else {}
        out[k.name] = (extra, source, sig)
    return out


def knob_rows(knobs, extra: dict, source: str, ctx) -> list[list[str]]:
    """[name, value, source, meaning] for each knob a kernel's header prints."""
    rows = []
    for name, value in knobs:
        if name in ctx.knobs:
            where = "pinned"
        elif name in extra:
            where = source                  # "tuned" (the database) or "candidate" (a tune run)
        else:
            where = "default rule"
        meaning = KNOBS[name].meaning if name in KNOBS else ""
        rows.append([name, show(value), where, meaning])
    return rows


def tuning_rows(ctx) -> list[dict]:
    """The tuning database's records (none when --no-tuned or caching is off)."""
    db = ctx.tuned
    return db.rows() if db and hasattr(db, "rows") else []


def tuning_record(rows: list[dict], signature: str, target_key: str) -> dict | None:
    """The tuning database's row for this kernel on this target, when one exists."""
    for row in rows:
        if signature and row["signature"] == signature and row["target"] == target_key:
            record = {k: row[k] for k in ("knobs", "label", "default_ms", "tuned_ms",
                                          "candidates", "rejected") if k in row}
            record["measured"] = _measured(row.get("measured"), row["knobs"], row["default_ms"])
            return record
    return None


def _measured(text: str | None, winner: str, default_ms: float) -> list[dict] | None:
    """Each candidate the search timed, fastest first, with the default's own row (its time as
    recorded) and the winner marked; None for a row written before candidates were kept."""
    if text is None:
        return None
    won = json.loads(winner)
    rows = [{"knobs": show_pins(pins), "ms": ms, "ratio": ms / default, "default": False,
             "winner": bool(won) and pins == won} for pins, ms, default in json.loads(text)]
    rows.append({"knobs": "default", "ms": default_ms, "ratio": 1.0, "default": True,
                 "winner": not won})
    return sorted(rows, key=lambda r: r["ms"])


def show_pins(pins: dict) -> str:
    return ", ".join(f"{k}={show(v)}" for k, v in sorted(pins.items())) or "default"
