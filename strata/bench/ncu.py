"""Nsight Compute's view of each strata kernel: `ncu` runs a child process that compiles the snippet
and calls the program once, profiling only strata's kernels, and its `--csv` output is parsed
into duration, DRAM throughput, achieved occupancy, SM throughput and registers per kernel.

ncu replays each kernel with caches flushed and clocks locked to base (its defaults), so its
durations are longer than the CUDA-event times of the bench table; the percentages are the point.
The parser reads both of ncu's CSV layouts: the default one (a row per metric: "Metric Name",
"Metric Unit", "Metric Value") and `--page raw` (a column per metric, a row of units first).
"""
from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from .runtime_adapter import compile_cuda

METRICS = {
    "duration": "gpu__time_duration.sum",
    "dram": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "registers": "launch__registers_per_thread",
}
_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
          "s": 1e6, "second": 1e6}


@dataclass
class NcuKernel:
    id: int
    name: str
    block: str = ""
    grid: str = ""
    metrics: dict[str, tuple[float | None, str]] = field(default_factory=dict)   # name: (value, unit)

    @property
    def base_name(self) -> str:
        return self.name.split("(", 1)[0].strip()

    def value(self, key: str) -> float | None:
        return self.metrics.get(METRICS.get(key, key), (None, ""))[0]

    @property
    def duration_us(self) -> float | None:
        value, unit = self.metrics.get(METRICS["duration"], (None, ""))
        if value is None:
            return None
        return value * _TO_US.get(unit.strip().lower(), 1e-3)    # ncu's base unit is ns


def number(text: str) -> float | None:
    """"1,215,000.50" -> 1215000.5; "n/a", "" -> None."""
    t = (text or "").strip().replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's stdout: from the header ("ID",...) on, lines that look like CSV."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(body))))


def parse_ncu_csv(text: str) -> list[NcuKernel]:
    """Kernels in launch order (by ID) with their metrics; [] when there is no CSV."""
    rows = _csv_rows(text)
    if not rows:
        return []
    header, data = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(header)}
    kernels: dict[int, NcuKernel] = {}

    def kernel(row) -> NcuKernel | None:
        kid = number(row[col["ID"]])
        if kid is None:
            return None
        get = lambda name: row[col[name]] if name in col and col[name] < len(row) else ""
        return kernels.setdefault(int(kid), NcuKernel(int(kid), get("Kernel Name"), get("Block Size"),
                                                      get("Grid Size")))

    if "Metric Name" in col:                       # one row per (kernel, metric)
        for row in data:
            if len(row) < len(header):
                continue
            k = kernel(row)
            name = row[col["Metric Name"]]
            if k is not None and name:
                k.metrics[name] = (number(row[col["Metric Value"]]), row[col["Metric Unit"]])
        return [kernels[i] for i in sorted(kernels)]
    units = {}
    fixed = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
             "Block Size", "Grid Size", "Device", "CC", "Kernel Time", "Kernel Duration"}
    for row in data:                               # --page raw: one row per kernel
        if number(row[col["ID"]]) is None:        # the units row
            units = {h: row[i] for h, i in col.items() if i < len(row)}
            continue
        k = kernel(row)
        for h, i in col.items():
            if h not in fixed and i < len(row):
                k.metrics[h] = (number(row[i]), units.get(h, ""))
    return [kernels[i] for i in sorted(kernels)]


def ncu_errors(text: str) -> list[str]:
    return [ln.split("==ERROR==", 1)[1].strip() for ln in text.splitlines() if "==ERROR==" in ln]


def ncu_command(ncu: str, code: str, kernel_names: list[str], child: str = "--target") -> list[str]:
    """ncu over this module's child: `--target CODE` (a snippet) or `--case NAME` (an op-suite
    case), profiling only `kernel_names`."""
    names = list(dict.fromkeys(kernel_names))
    cmd = [ncu, "--csv", "--print-units", "base", "--metrics", ",".join(METRICS.values())]
    if names:
        cmd += ["--kernel-name", "regex:^(" + "|".join(re.escape(n) for n in names) + ")$",
                "--launch-count", str(len(kernel_names))]
    return cmd + [sys.executable, "-m", "strata.bench.ncu", child, code]


def profile_snippet(code: str, kernel_names: list[str], timeout_s: float = 600.0):
    """(kernels, None) or ([], one-sentence reason)."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return [], "ncu (Nsight Compute) is not on PATH"
    try:
        proc = subprocess.run(ncu_command(ncu, code, kernel_names), capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return [], f"ncu did not finish within {timeout_s:.0f} s"
    text = proc.stdout + "\n" + proc.stderr
    kernels = parse_ncu_csv(proc.stdout)
    if kernels:
        return kernels, None
    errors = ncu_errors(text)
    if errors:
        return [], f"ncu failed: {errors[0]}"
    tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:]
    return [], f"ncu profiled no strata kernel (exit {proc.returncode}{': ' + tail[0] if tail else ''})"


def ncu_table(kernels: list[NcuKernel], title: str = "ncu (per kernel; replayed, base clocks)"):
    from rich.table import Table
    table = Table(title=title, title_justify="left")
    for c in ("kernel", "duration µs", "DRAM throughput %", "achieved occupancy %", "SM throughput %",
              "registers"):
        table.add_column(c, justify="left" if c == "kernel" else "right")
    fmt = lambda v, spec: "—" if v is None else format(v, spec)
    for k in kernels:
        table.add_row(k.base_name, fmt(k.duration_us, ".1f"), fmt(k.value("dram"), ".1f"),
                      fmt(k.value("occupancy"), ".1f"), fmt(k.value("sm"), ".1f"),
                      fmt(k.value("registers"), ".0f"))
    return table


def target(code: str, case_name: str | None = None) -> int:
    """The profiled child: compile the snippet (or the op-suite case) for CUDA and call the
    program once."""
    import torch

    if case_name is not None:
        from . import cases as C
        case = next((c for c in C.cases() if c.name == case_name), None)
        if case is None:
            print(f"no op-suite case named {case_name!r}", file=sys.stderr)
            return 2
        module, inputs = case.build("cuda")
    else:
        from ..frontend.snippet import parse_snippet
        snippet = parse_snippet(code)
        module = snippet.module.to("cuda")
        inputs = tuple(x.to("cuda") for x in snippet.example_inputs)
    program = compile_cuda(module, inputs)
    with torch.no_grad():
        program(*inputs)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--target", "--case"):
        sys.exit(target(sys.argv[2]) if sys.argv[1] == "--target" else target("", sys.argv[2]))
    print("usage: python -m strata.bench.ncu --target CODE | --case NAME (run under ncu by strata "
          "run --profile and python -m strata.gpu_check)", file=sys.stderr)
    sys.exit(2)
