"""Everything the page shows, as one JSON-able dict: the stages' texts, the ops, the kernels
with their lines in every stage, knobs and pass histories, and the measured verdict.

Why one dict of plain lists: the page embeds it once; each text is stored once (`texts`) and
referred to by index, so a decoder layer's page repeats no stage and no diff."""
from __future__ import annotations

import datetime
import re

from ..pipeline import schedule_passes
from ..tune import machine
from ..version import __version__
from .knob_sources import kernel_sources, knob_rows, tuning_record, tuning_rows
from .measured import sim_counters
from .passes import family_of, kernel_histories, parse_log
from .provenance import assignments, line_owners, loop_kernel_nodes, source_ranges, tensor_owner
from .record import recorded_lowering
from .roofline import roofline

STAGE_TITLES = {"torch": "Torch IR", "tensor": "Tensor IR", "loop": "Loop IR",
                "tile": "Tile IR", "kernel": "Kernel IR", "cuda": "CUDA", "c": "C"}
STAGE_TIMING = re.compile(r"^(decompose -> tensor|fuse -> loop|schedule -> tile|lower -> kernel|"
                          r"emit -> \w+|capture.*|build model)\s+([\d.]+) ms$")


class Texts:
    """Each distinct string once; an index refers to it."""

    def __init__(self):
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        if s not in self.index:
            self.index[s] = len(self.items)
            self.items.append(s)
        return self.index[s]


def collect(program, verdict=None, title: str = "", profiles=None, bench=None) -> dict:
    """The page's data for a compiled `program` (api.Program); `verdict` a check.Report,
    `profiles` the simulator's counters of that run (kernel_ir/sim_profile.py), `bench` the CPU
    timings (bench/cpu_bench.py's view_bench)."""
    lowered, ctx = recorded_lowering(program)
    texts = Texts()
    target = lowered.target or ctx.arch
    stages = ["torch", "tensor", "loop", "tile", "kernel", target.language]
    text = {s: lowered.text(s) for s in stages}
    tp = lowered.torch
    loop_kernels = list(lowered.loop.kernels)
    loop_names = [k.name for k in loop_kernels]
    origin = dict(getattr(lowered.tile, "origin", {}) or {})

    # ops and their Tensor IR nodes
    owner = tensor_owner(tp.nodes, lowered.tensor.nodes)
    op_index = {n.name: i for i, n in enumerate(tp.nodes)}
    ops = [{"name": n.name, "op": n.packet, "where": str(n.where) if n.where else "",
            "module": n.module, "kernels": [], "tensor": []} for n in tp.nodes]
    for t, o in owner.items():
        if t != o:
            ops[op_index[o]]["tensor"].append(t)

    # loop kernel -> ops it computes
    fam_ops: dict[str, list[int]] = {}
    for k in loop_kernels:
        idx = {op_index[owner[t]] for t in loop_kernel_nodes(k, lowered.tensor) if t in owner}
        fam_ops[k.name] = sorted(idx)

    # kernels (the Kernel IR's, in launch order) with their family, ops and knobs
    tile_by = {k.name: k for k in lowered.tile.kernels}
    sources = kernel_sources(lowered.loop, ctx)
    rows = tuning_rows(ctx)
    final = list(lowered.kernel.kernels)
    kernels = []
    for k in final:
        fam = family_of(k.name, origin, loop_names)
        tk = tile_by.get(k.name)
        extra, source, sig = sources.get(fam, ({}, "", ""))
        kernels.append({
            "name": k.name, "family": fam, "src": k.src, "grid": k.grid, "block": k.block,
            "smem": getattr(k, "smem_bytes", 0), "ops": fam_ops.get(fam, []),
            "knobs": knob_rows(getattr(tk, "knobs", ()), extra, source, ctx),
            "tuning": tuning_record(rows, sig, target.key), "lines": {}})
    fam_kernels: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        fam_kernels.setdefault(k["family"], []).append(i)
        for o in k["ops"]:
            ops[o]["kernels"].append(i)

    # lines of every stage: ops own Torch / Tensor IR lines, kernels the rest
    op_lines = {"torch": {}, "tensor": {}}
    for stage, names in (("torch", lambda o: [o["name"]]), ("tensor", lambda o: o["tensor"])):
        at = assignments(text[stage])
        for i, o in enumerate(ops):
            got = sorted(at[n] for n in names(o) if n in at)
            if stage == "tensor" and o["name"] in at:
                got = sorted(got + [at[o["name"]]])
            if got:
                op_lines[stage][str(i)] = got
    owned = {"loop": line_owners(text["loop"], lambda n: n),
             "tile": line_owners(text["tile"], lambda n: n),
             "kernel": line_owners(text["kernel"], lambda n: n),
             stages[-1]: source_ranges(text[stages[-1]], [k["name"] for k in kernels])}
    for i, k in enumerate(kernels):
        for stage, by in owned.items():
            lines = by.get(k["family"] if stage == "loop" else k["name"])
            if lines:
                k["lines"][stage] = _runs(lines)

    # pass histories
    pass_names = [name for name, _ in schedule_passes(target)]
    steps = parse_log(ctx.messages, pass_names)
    hist, replayed = kernel_histories(text["loop"], text["tile"], steps, origin, loop_names)
    families = []
    for fam in loop_names:
        families.append({
            "name": fam, "kernels": fam_kernels.get(fam, []), "ops": fam_ops.get(fam, []),
            "passes": [[h.num, int(h.changed), texts(h.diff) if h.changed else -1,
                        [texts(n) for n in h.notes]] for h in hist.get(fam, [])]})
    passes = [{"num": s.num, "name": s.name, "ms": s.ms, "diff": texts(s.diff) if s.diff else -1,
               "notes": len(s.notes)} for s in steps]

    log = [m for m in ctx.messages if not m.startswith(">>> t:")]
    return {
        "title": title or _title(ops),
        "version": __version__,
        "made": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "target": str(target), "device": getattr(program, "device", ""),
        "stages": [{"name": s, "title": STAGE_TITLES[s], "text": texts(text[s])} for s in stages],
        "ops": ops, "opLines": op_lines, "kernels": kernels, "families": families,
        "passes": passes, "replayed": replayed,
        "fusion": [m[len("fuse: "):] for m in log if m.startswith("fuse: ")],
        "timings": [[m[1], float(m[2])] for m in map(STAGE_TIMING.match, log) if m],
        "log": texts("\n".join(log)),
        "verdict": _verdict(verdict),
        "counters": sim_counters(profiles or {}),
        "bench": bench,
        "roofline": _roofline(final, bench),
        "texts": texts.items,
    }


def _roofline(kernels, bench):
    """Only with --bench's times, against the cached profile (never measured here)."""
    if not bench:
        return None
    return roofline(kernels, bench, machine.cached())


def _runs(lines: list[int]) -> list[list[int]]:
    """Sorted line numbers as [first, last] runs (a kernel is a few runs, not thousands of ints)."""
    out = []
    for n in sorted(set(lines)):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


def _title(ops) -> str:
    wheres = {o["where"] for o in ops if o["where"]}
    return next(iter(wheres)) if len(wheres) == 1 else f"{len(ops)} aten ops"


def _verdict(report) -> dict | None:
    if report is None:
        return None
    return {"passed": report.passed,
            "outputs": [{"name": o.name, "dtype": o.dtype, "max_abs": o.max_abs, "rel": o.rel,
                         "tol": o.tol, "passed": o.passed, "problem": o.problem}
                        for o in report.outputs]}
