"""Benchmark reports: rich tables for the terminal, a markdown and a JSON report for docs/.

Pure functions of measured numbers (results.py records): nothing here touches a GPU, so every
table, ratio and geomean is unit-tested on the CPU with given numbers. The roofline decides
per program whether it is memory- or compute-bound: the ideal time is max(bytes / copy
bandwidth, FLOPs / matmul throughput), and "% of ceiling" is that ideal time over the measured
time, shown as GB/s for memory-bound programs and TFLOP/s for compute-bound ones.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .results import (
    EAGER,
    MAX_AUTOTUNE,
    STRATA,
    TORCH_COMPILE,
    VARIANTS,
    CaseResult,
    Ceilings,
    Env,
    KernelRow,
    to_dict,
)

GOAL_VS_EAGER = 1.5            # geomean goals from issue 4
GOAL_VS_COMPILE = 1.2
GOAL_MEMORY_FRACTION = 0.85    # memory-bound kernels: fraction of the measured copy bandwidth
GOAL_CPU_VS_BEST = 1.2         # CPU goals from issue 12: vs the faster of eager and torch.compile
GOAL_CPU_MEMORY_FRACTION = 0.8  # ... and of the read bandwidth a large sum reaches
METHOD = {
    "cuda": ("Median of CUDA-event timings after warm-up, L2 flushed before every timed call."),
    "cpu": ("Median of interleaved rounds (each round times every variant once, averaging as many "
            "calls as fill 20 ms), inputs warm in the caches as in a model's step."),
}


# ---- numbers --------------------------------------------------------------------------------

@dataclass
class Achieved:
    value: float        # GB/s or TFLOP/s
    unit: str           # "GB/s" or "TFLOP/s"
    fraction: float     # of the device ceiling, 0..1 (can exceed 1 for cache-resident data)

    @property
    def bound(self) -> str:
        return "memory" if self.unit == "GB/s" else "compute"


def achieved(bytes_: int, flops: int, ms: float | None, dtype: str, ceilings: Ceilings) -> Achieved | None:
    """Achieved throughput of one run against the roofline of the measured ceilings."""
    if ms is None or ms <= 0 or (not bytes_ and not flops):
        return None
    seconds = ms * 1e-3
    bw = ceilings.read_gbps or ceilings.copy_gbps
    peak = _peak(ceilings, dtype)
    t_mem = bytes_ / (bw * 1e9) if bw and bytes_ else 0.0
    t_flop = flops / (peak * 1e12) if peak and flops else 0.0
    if flops and (t_flop > t_mem or not bytes_):
        return Achieved(flops / seconds / 1e12, "TFLOP/s", t_flop / seconds if peak else math.nan)
    return Achieved(bytes_ / seconds / 1e9, "GB/s", t_mem / seconds if bw else math.nan)


def _peak(ceilings: Ceilings, dtype: str) -> float | None:
    """The compute ceiling of `dtype`: the machine profile's peak, else torch.mm's rate."""
    return ceilings.peak_tflops.get(dtype) or ceilings.mm_tflops.get(dtype) or \
        ceilings.mm_tflops.get("bf16")


def case_achieved(case: CaseResult, variant: str, ceilings: Ceilings) -> Achieved | None:
    v = case.variant(variant)
    return achieved(case.bytes, case.flops, v.ms if v else None, case.dtype, ceilings)


def speedup(case: CaseResult, variant: str, reference: str) -> float | None:
    """reference time / variant time (> 1: the variant is faster); None if either did not run."""
    v, r = case.variant(variant), case.variant(reference)
    if v is None or r is None or v.ms is None or r.ms is None or v.ms <= 0:
        return None
    return r.ms / v.ms


def geomean(xs) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def counted(case: CaseResult) -> bool:
    """A case enters the geomeans when strata ran it and its accuracy did not fail."""
    s = case.variant(STRATA)
    return bool(s and s.ok and case.accuracy_passed is not False)


def speedup_vs_best(case: CaseResult) -> float | None:
    """strata's speedup over the faster of eager and torch.compile (whichever of them ran)."""
    ratios = [r for r in (speedup(case, STRATA, EAGER), speedup(case, STRATA, TORCH_COMPILE))
              if r is not None]
    return min(ratios) if ratios else None


def geomeans(cases: list[CaseResult]) -> dict:
    """Geomean speedups of strata, each over the cases where both sides ran."""
    out = {}
    for key, ref in (("vs_eager", EAGER), ("vs_torch_compile", TORCH_COMPILE),
                     ("vs_max_autotune", MAX_AUTOTUNE), ("vs_best", None)):
        ratios = [speedup(c, STRATA, ref) if ref else speedup_vs_best(c) for c in cases if counted(c)]
        ratios = [r for r in ratios if r is not None]
        out[key] = geomean(ratios)
        out[key + "_cases"] = len(ratios)
    out["cases"] = len(cases)
    out["strata_ran"] = sum(1 for c in cases if counted(c))
    return out


def shortfalls(case: CaseResult, ceilings: Ceilings) -> list[str]:
    """Why this case misses a goal, one phrase each (empty when strata did not run)."""
    s = case.variant(STRATA)
    if not (s and s.ok):
        return []
    out = []
    if case.accuracy_passed is False:
        out.append("accuracy FAIL")
    for ref, label in ((EAGER, "eager"), (TORCH_COMPILE, "torch.compile")):
        r = speedup(case, STRATA, ref)
        if r is not None and r < 1.0:
            out.append(f"{fmt_ratio(r)} vs {label}")
    a = case_achieved(case, STRATA, ceilings)
    goal = GOAL_CPU_MEMORY_FRACTION if ceilings.read_gbps else GOAL_MEMORY_FRACTION
    if a and a.bound == "memory" and a.fraction < goal:
        out.append(f"{fmt_pct(a.fraction)} of {_memory_ceiling(ceilings)[0]}")
    return out


# ---- formatting -----------------------------------------------------------------------------

def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms:.3f}" if ms >= 0.1 else f"{ms:.4f}"


def fmt_us(ms: float | None) -> str:
    return "—" if ms is None else f"{ms * 1e3:.1f}"


def fmt_ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}×"


def fmt_pct(f: float | None) -> str:
    if f is None or math.isnan(f):
        return "—"
    return f"{f * 100:.0f}%" if f >= 0.095 else f"{f * 100:.1f}%"


def fmt_achieved(a: Achieved | None) -> str:
    return "—" if a is None else fmt_value(a.value, a.unit)


def fmt_value(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def _memory_ceiling(ceilings: Ceilings) -> tuple[str, float | None]:
    """The name and GB/s of the memory ceiling that "% of ceiling" uses."""
    if ceilings.read_gbps:
        return "a large sum's read bandwidth", ceilings.read_gbps
    return "copy bandwidth", ceilings.copy_gbps


def fmt_launch(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, (tuple, list)):
        dims = list(x)
        while len(dims) > 1 and dims[-1] == 1:
            dims.pop()
        return "×".join(str(d) for d in dims)
    return str(x)


def fmt_opt(x) -> str:
    return "—" if x is None else str(x)


def short_status(status: str) -> str:
    """"failed: long reason" -> "failed" for table cells; reasons are listed elsewhere."""
    return status.split(":", 1)[0]


def fmt_flops(n: int) -> str:
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} FLOP"


# ---- rich tables ----------------------------------------------------------------------------

COMPARISON_COLUMNS = ("variant", "median ms", "p20–p80 ms", "vs eager", "vs torch.compile",
                      "achieved", "% of ceiling", "note")


def comparison_rows(case: CaseResult, ceilings: Ceilings) -> list[tuple[str, ...]]:
    rows = []
    for v in case.variants:
        if not v.ok:
            rows.append((v.name, "—", "—", "—", "—", "—", "—", v.status))
            continue
        t = v.timing
        a = case_achieved(case, v.name, ceilings)
        rows.append((v.name, fmt_ms(t.median_ms), f"{fmt_ms(t.p20_ms)}–{fmt_ms(t.p80_ms)}",
                     fmt_ratio(speedup(case, v.name, EAGER)),
                     fmt_ratio(speedup(case, v.name, TORCH_COMPILE)),
                     fmt_achieved(a), fmt_pct(a.fraction if a else None), ""))
    return rows


def ceiling_note(case: CaseResult, ceilings: Ceilings) -> str:
    """Which measured ceiling the case's "% of ceiling" refers to."""
    a = case_achieved(case, STRATA, ceilings) or case_achieved(case, EAGER, ceilings)
    if a is None:
        return ""
    if a.bound == "memory":
        if ceilings.read_gbps:
            return f"ceiling: a large sum reads {fmt_value(ceilings.read_gbps, 'GB/s')}"
        return f"ceiling: copy {fmt_value(ceilings.copy_gbps, 'GB/s')}" if ceilings.copy_gbps else ""
    peak = _peak(ceilings, case.dtype)
    what = "the machine profile's peak" if case.dtype in ceilings.peak_tflops else "torch.mm"
    return f"ceiling: {what} {fmt_value(peak, 'TFLOP/s')}" if peak else ""


def comparison_table(case: CaseResult, ceilings: Ceilings, title: str | None = None):
    from rich.table import Table
    note = ceiling_note(case, ceilings)
    ceiling = f"  ({note})" if note else ""
    table = Table(title=(title or case.name) + ceiling, title_justify="left")
    rows = comparison_rows(case, ceilings)
    has_note = any(r[-1] for r in rows)
    cols = COMPARISON_COLUMNS if has_note else COMPARISON_COLUMNS[:-1]
    for c in cols:
        table.add_column(c, justify="left" if c in ("variant", "note") else "right",
                         overflow="fold")
    for r in rows:
        table.add_row(*r[:len(cols)])
    return table


KERNEL_COLUMNS = ("kernel", "grid", "block", "smem bytes", "registers", "time µs")


def kernel_rows_text(kernels: list[KernelRow]) -> list[tuple[str, ...]]:
    return [(k.name, fmt_launch(k.grid), fmt_launch(k.block), fmt_opt(k.smem_bytes),
             fmt_opt(k.registers), fmt_us(k.time_ms)) for k in kernels]


def kernel_table(kernels: list[KernelRow], title: str = "strata kernels"):
    from rich.table import Table
    table = Table(title=title, title_justify="left")
    for c in KERNEL_COLUMNS:
        table.add_column(c, justify="left" if c == "kernel" else "right")
    for r in kernel_rows_text(kernels):
        table.add_row(*r)
    return table


SUMMARY_COLUMNS = ("case", "accuracy", "eager ms", "torch.compile ms", "max-autotune ms",
                   "strata ms", "vs eager", "vs torch.compile", "strata achieved", "% of ceiling")


def summary_rows(cases: list[CaseResult], ceilings: Ceilings) -> list[tuple[str, ...]]:
    rows = []
    for c in cases:
        cells = [c.name, _accuracy_cell(c)]
        for name in VARIANTS:
            v = c.variant(name)
            cells.append("—" if v is None else fmt_ms(v.ms) if v.ok else short_status(v.status))
        a = case_achieved(c, STRATA, ceilings)
        cells += [fmt_ratio(speedup(c, STRATA, EAGER)), fmt_ratio(speedup(c, STRATA, TORCH_COMPILE)),
                  fmt_achieved(a), fmt_pct(a.fraction if a else None)]
        rows.append(tuple(cells))
    return rows


def _accuracy_cell(c: CaseResult) -> str:
    return "—" if c.accuracy is None else c.accuracy.split()[0]


def summary_table(cases: list[CaseResult], ceilings: Ceilings, title: str = "LLM op suite"):
    from rich.table import Table
    table = Table(title=title, title_justify="left")
    for col in SUMMARY_COLUMNS:
        table.add_column(col, justify="left" if col in ("case", "accuracy") else "right")
    for r in summary_rows(cases, ceilings):
        table.add_row(*r)
    return table


# ---- markdown and JSON ----------------------------------------------------------------------

def _md_table(header, rows) -> list[str]:
    def esc(s):
        return str(s).replace("|", "\\|").replace("\n", " ")
    out = ["| " + " | ".join(esc(h) for h in header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return out


def _env_lines(env: Env, ceilings: Ceilings) -> list[str]:
    versions = [f"torch {env.torch}", f"CUDA {env.cuda or '—'}", f"strata {env.strata}"]
    if env.python:
        versions.append(f"Python {env.python}")
    versions += [f"{k} {v}" for k, v in env.extra.items()]
    mm = ", ".join(f"{dt} {fmt_value(v, 'TFLOP/s')}" for dt, v in ceilings.mm_tflops.items()) or "—"
    copy = fmt_value(ceilings.copy_gbps, "GB/s") if ceilings.copy_gbps else "—"
    if ceilings.read_gbps:
        memory = (f"memory copy {copy} (read + write bytes), a large sum "
                  f"{fmt_value(ceilings.read_gbps, 'GB/s')} read (the memory ceiling)")
    else:
        memory = f"device-to-device copy {copy} (read + write bytes)"
    return [f"- device: {env.device}", f"- date: {env.date}", f"- versions: {', '.join(versions)}",
            f"- measured ceilings (same run): {memory}; torch.mm {ceilings.mm_n}³ {mm}"] + (
        [f"- compute ceilings (`strata machine`'s profile, the units' peaks on every core): "
         + ", ".join(f"{dt} {fmt_value(v, 'TFLOP/s')}" for dt, v in ceilings.peak_tflops.items())]
        if ceilings.peak_tflops else [])


def _geomean_line(label: str, value: float | None, n: int, goal: float) -> str:
    if value is None:
        return f"- geomean speedup {label}: — (no case where both ran)"
    mark = "meets" if value >= goal else "below"
    return f"- geomean speedup {label}: **{fmt_ratio(value)}** over {n} cases ({mark} the goal ≥ {goal}×)"


def markdown_report(cases: list[CaseResult], env: Env, ceilings: Ceilings,
                    title: str = "strata LLM op suite", device: str = "cuda") -> str:
    g = geomeans(cases)
    if device == "cpu":
        goals = [_geomean_line("vs the faster of eager and torch.compile", g["vs_best"],
                               g["vs_best_cases"], GOAL_CPU_VS_BEST),
                 _geomean_line("vs eager", g["vs_eager"], g["vs_eager_cases"], GOAL_CPU_VS_BEST),
                 _geomean_line("vs torch.compile", g["vs_torch_compile"],
                               g["vs_torch_compile_cases"], GOAL_CPU_VS_BEST)]
    else:
        goals = [_geomean_line("vs eager", g["vs_eager"], g["vs_eager_cases"], GOAL_VS_EAGER),
                 _geomean_line("vs torch.compile", g["vs_torch_compile"],
                               g["vs_torch_compile_cases"], GOAL_VS_COMPILE)]
    memory = _memory_ceiling(ceilings)[0]
    peak = "the machine profile's peak" if ceilings.peak_tflops else "torch.mm"
    lines = [f"# {title}", ""] + _env_lines(env, ceilings) + goals + [
        (f"- strata ran {g['strata_ran']} of {g['cases']} cases (accuracy checked against eager "
         f"in float64 first; a case whose accuracy fails is not counted)"),
        "",
        (f"{METHOD[device]} \"vs\" columns: the other variant's time over strata's (> 1: strata "
         f"is faster). \"% of ceiling\": the roofline time (bytes / {memory} or FLOPs / "
         f"{peak} throughput) over the measured time."), "",
    ]
    lines += _md_table(SUMMARY_COLUMNS, summary_rows(cases, ceilings)) + [""]
    short = [(c, shortfalls(c, ceilings)) for c in cases]
    short = [(c, s) for c, s in short if s]
    if short:
        lines += ["## Below goal", ""]
        rows = [(c.name, "; ".join(s), ", ".join(_slowest_kernels(c))) for c, s in short]
        lines += _md_table(("case", "short of", "slowest kernels"), rows) + [""]
    notes = _status_notes(cases)
    if notes:
        lines += ["## Not run", ""] + [f"- {n}" for n in notes] + [""]
    kernel_rows = [(c.name, *r) for c in cases for r in kernel_rows_text(c.kernels)]
    if kernel_rows:
        lines += ["## strata kernels", ""] + _md_table(("case",) + KERNEL_COLUMNS, kernel_rows) + [""]
    return "\n".join(lines)


def _slowest_kernels(c: CaseResult, n: int = 2) -> list[str]:
    timed = sorted((k for k in c.kernels if k.time_ms is not None), key=lambda k: -k.time_ms)
    ks = timed or [k for k in c.kernels if not k.name.endswith("(once, at load)")]
    return [f"{k.name} ({fmt_us(k.time_ms)} µs)" if k.time_ms is not None else k.name for k in ks[:n]]


def _status_notes(cases: list[CaseResult]) -> list[str]:
    """"variant: reason (cases...)" for every variant that did not run, grouped by reason."""
    groups: dict[tuple[str, str], list[str]] = {}
    for c in cases:
        for v in c.variants:
            if not v.ok:
                groups.setdefault((v.name, v.status), []).append(c.name)
    return [f"{name} {status} ({', '.join(names)})" for (name, status), names in groups.items()]


def json_report(cases: list[CaseResult], env: Env, ceilings: Ceilings, device: str = "cuda") -> dict:
    out_cases = []
    for c in cases:
        d = to_dict(c)
        a = case_achieved(c, STRATA, ceilings)
        d["speedup"] = {"vs_best": speedup_vs_best(c), "vs_eager": speedup(c, STRATA, EAGER),
                        "vs_torch_compile": speedup(c, STRATA, TORCH_COMPILE),
                        "vs_max_autotune": speedup(c, STRATA, MAX_AUTOTUNE)}
        d["strata_achieved"] = None if a is None else {"value": a.value, "unit": a.unit,
                                                      "fraction_of_ceiling": a.fraction}
        d["shortfalls"] = shortfalls(c, ceilings)
        out_cases.append(d)
    goals = ({"geomean_vs_best": GOAL_CPU_VS_BEST, "memory_bound_fraction": GOAL_CPU_MEMORY_FRACTION}
             if device == "cpu" else
             {"geomean_vs_eager": GOAL_VS_EAGER, "geomean_vs_torch_compile": GOAL_VS_COMPILE,
              "memory_bound_fraction": GOAL_MEMORY_FRACTION})
    return {"schema": 1, "device": device, "env": to_dict(env), "ceilings": to_dict(ceilings),
            "goals": goals,
            "geomean": geomeans(cases), "cases": out_cases}


def write_reports(out_dir, stem: str, cases: list[CaseResult], env: Env, ceilings: Ceilings,
                  title: str = "strata LLM op suite", device: str = "cuda") -> tuple[Path, Path]:
    """Write <out_dir>/<stem>.md and <stem>.json; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    _atomic_write(md, markdown_report(cases, env, ceilings, title, device) + "\n")
    _atomic_write(js, json.dumps(json_report(cases, env, ceilings, device), indent=1, default=str)
                  + "\n")
    return md, js


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
