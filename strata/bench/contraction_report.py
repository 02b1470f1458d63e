"""The table of `python -m strata.bench.contractions`: strata against torch (cuBLAS, the fastest SDPA)
per case, in TFLOP/s, with the ratio and whether issue 3's goal for that case is met.

Pure functions of measured numbers (results.py records), so every cell is tested on the CPU.
The torch reference is stored as the "eager" variant of a CaseResult (it is the eager call:
torch.mm / F.linear, or SDPA with the flash backend forced) and shown under its own name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .report import (
    _atomic_write,
    _env_lines,
    _md_table,
    fmt_ms,
    fmt_ratio,
    short_status,
    speedup,
)
from .results import EAGER, STRATA, CaseResult, Ceilings, Env, to_dict

COLUMNS = ("case", "layers", "accuracy", "strata kernels", "torch ms", "strata ms", "torch TFLOP/s",
           "strata TFLOP/s", "strata % of dense peak", "strata / torch", "goal", "met")
# NVIDIA's dense tensor-core peaks (TFLOP/s, no sparsity) by a part of the device's name, first match
DENSE_PEAKS = (("H100 PCIe", {"bf16": 756.0, "f8e4m3": 1513.0}),
               ("H100", {"bf16": 989.4, "f8e4m3": 1978.9}), ("H200", {"bf16": 989.4, "f8e4m3": 1978.9}))


def dense_peak_tflops(device: str) -> dict[str, float]:
    """{dtype: TFLOP/s} of this GPU's dense peak, {} for a GPU not in DENSE_PEAKS."""
    return next((p for part, p in DENSE_PEAKS if part in device), {})


@dataclass
class ContractionRow:
    """One measured case: its CaseResult plus what the table needs from the case."""
    result: CaseResult
    group: str            # "matmul", "fp8 matmul", "decode matmul", "attention"
    goal: float           # minimum strata / torch ratio
    reference: str        # "torch (cuBLAS)", "torch SDPA (flash)"
    label: str = ""
    extra: dict = field(default_factory=dict)     # strata_kernels: "1 (wgmma)", ...


def tflops(flops: int, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else flops / (ms * 1e-3) / 1e12


def fmt_tflops(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def ratio(row: ContractionRow) -> float | None:
    """torch time over strata time (> 1: strata is faster)."""
    return speedup(row.result, STRATA, EAGER)


def verdict(row: ContractionRow) -> str:
    """"met", or "not met" with the reason when it is not the ratio itself."""
    r = row.result
    s, ref = r.variant(STRATA), r.variant(EAGER)
    if s is None or not s.ok:
        return f"not met (strata {short_status(s.status) if s else 'not run'})"
    if r.accuracy_passed is False:
        return "not met (accuracy FAIL)"
    if ref is None or not ref.ok:
        return "— (torch did not run)"
    return "met" if ratio(row) >= row.goal else "not met"


def _ms(r: CaseResult, name: str) -> str:
    v = r.variant(name)
    return "—" if v is None else fmt_ms(v.ms) if v.ok else short_status(v.status)


def table_rows(rows: list[ContractionRow]) -> list[tuple[str, ...]]:
    out = []
    for row in rows:
        r = row.result
        t, s = r.variant(EAGER), r.variant(STRATA)
        mine, peak = tflops(r.flops, s.ms if s else None), row.extra.get("peak_tflops")
        out.append((r.name, row.label, "—" if r.accuracy is None else r.accuracy.split()[0],
                    row.extra.get("strata_kernels", "—"), _ms(r, EAGER), _ms(r, STRATA),
                    fmt_tflops(tflops(r.flops, t.ms if t else None)), fmt_tflops(mine),
                    f"{100 * mine / peak:.0f}%" if mine and peak else "—",
                    fmt_ratio(ratio(row)), f"≥ {row.goal:g}× {row.reference}", verdict(row)))
    return out


def goal_summary(rows: list[ContractionRow]) -> list[str]:
    """One line per group: how many of its cases meet the goal."""
    lines = []
    for group in dict.fromkeys(r.group for r in rows):
        mine = [r for r in rows if r.group == group]
        met = sum(verdict(r) == "met" for r in mine)
        lines.append(f"{group}: goal ≥ {mine[0].goal:g}× {mine[0].reference}, met in {met} of "
                     f"{len(mine)} cases")
    return lines


def notes(rows: list[ContractionRow]) -> list[str]:
    """Every variant that did not run, with its full reason."""
    out = []
    for row in rows:
        for v in row.result.variants:
            if not v.ok:
                who = row.reference if v.name == EAGER else v.name
                out.append(f"{row.result.name}: {who} {v.status}")
    return out


def rich_table(rows: list[ContractionRow], title: str = "strata vs torch: contractions (bf16)"):
    from rich.table import Table
    table = Table(title=title, title_justify="left")
    for c in COLUMNS:
        table.add_column(c, justify="left" if c in ("case", "layers", "accuracy", "goal", "met")
                         else "right", overflow="fold")
    for r in table_rows(rows):
        table.add_row(*r)
    return table


def markdown(rows: list[ContractionRow], env: Env, ceilings: Ceilings) -> str:
    lines = ["# strata vs torch: matmul and attention (bf16, FP8)", ""] + _env_lines(env, ceilings)
    lines += [f"- strata target: {env.extra.get('strata target', '—')}"]
    lines += [f"- {s}" for s in goal_summary(rows)] + [""]
    lines += [("Median of CUDA-event timings after warm-up, L2 flushed before every timed call. "
               "TFLOP/s from 2·M·N·K for a matmul (twice for SiLU(gate)·up) and 4·B·H·S²·D for "
               "attention, halved when causal (half the scores are masked); the dense peak is "
               "NVIDIA's for the part (no sparsity). \"strata / torch\": torch's time over strata's (> 1: "
               "strata is faster). Accuracy: strata's output against eager in float64 "
               "(1e-2 for bf16); a case whose accuracy fails does not meet its goal."), ""]
    lines += _md_table(COLUMNS, table_rows(rows)) + [""]
    n = notes(rows)
    if n:
        lines += ["## Not run", ""] + [f"- {x}" for x in n] + [""]
    return "\n".join(lines)


def json_report(rows: list[ContractionRow], env: Env, ceilings: Ceilings) -> dict:
    out = []
    for row in rows:
        d = to_dict(row.result)
        r = row.result
        t, s = r.variant(EAGER), r.variant(STRATA)
        d.update(group=row.group, label=row.label, reference=row.reference, goal=row.goal,
                 ratio=ratio(row), verdict=verdict(row),
                 torch_tflops=tflops(r.flops, t.ms if t else None),
                 strata_tflops=tflops(r.flops, s.ms if s else None), **row.extra)
        out.append(d)
    return {"schema": 1, "benchmark": "contractions", "env": to_dict(env),
            "ceilings": to_dict(ceilings), "summary": goal_summary(rows), "cases": out}


def write(out_dir, stem: str, rows: list[ContractionRow], env: Env,
          ceilings: Ceilings) -> tuple[Path, Path]:
    """<out_dir>/<stem>.md and .json, rewritten whole (a run cut short keeps what it measured)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    _atomic_write(md, markdown(rows, env, ceilings) + "\n")
    _atomic_write(js, json.dumps(json_report(rows, env, ceilings), indent=1, default=str) + "\n")
    return md, js


def stem_for(kind: str, env: Env) -> str:
    """"contractions-nvidia-h100-80gb-hbm3-2025-01-31": the device and the date of the run."""
    from .env import slug
    return f"{kind}-{slug(env.device)}-{env.date[:10]}"
