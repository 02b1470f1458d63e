"""`python -m strata.bench.gemv_sweep`: the decode step's GEMVs under several schedules, on a GPU.

Why: the H200 run read the decode step's weights at 14% to 40% of its copy bandwidth, and which
schedule a one-row GEMV wants (mma.sync tiles or CUDA-core rows, how deep a pipeline, how many
K slices) is for the GPU to say: a lent GPU's minutes are few, so one run times every candidate
of every shape a TinyLlama-shaped step runs (q/k/v and gate/up merged, o, down, lm_head; bf16
and Q4_0 at M = 1) and the report names the fastest, for the defaults to follow.

    python -m strata.bench.gemv_sweep [--budget-s 120] [--out docs/gpu]

Each candidate pins knobs (`--knob` values), is checked against eager in float64 and timed with
CUDA events with the L2 flushed before each call (the step's weights do not stay in L2), against
cuBLAS's bf16 F.linear of the same shape. GB/s counts the weight's bytes (Q4_0: 18 per 32).
A candidate that fails to compile or to match eager is a row saying why.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import dataclass

from ..core.command import guarded
from ..core.context import Context
from ..models.source import resolve
from .runtime_adapter import compile_cuda
from .variants import reason

MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
# knob pins per weight format; {} is the default schedule
VARIANTS = {
    "bf16": ({}, {"STAGES": 4}, {"SPLIT_K": 2}, {"SPLIT_K": 4}, {"TILE_N": 32},
             {"INSTR": "fma"}, {"INSTR": "fma", "VEC": 16}, {"INSTR": "fma", "VEC": 32},
             {"INSTR": "fma", "SPLIT_K": 2},
             {"INSTR": "fma", "SPLIT_K": 4}, {"INSTR": "fma", "BLOCK": 128}),
    "q4_0": ({}, {"SPLIT_K": 2}, {"SPLIT_K": 4}, {"BLOCK": 128}, {"BLOCK": 64},
             {"INSTR": "mma"}),      # the tensor cores dequantizing into shared memory
}
WEIGHT_BYTES = {"bf16": lambda k, n: 2 * k * n, "q4_0": lambda k, n: 18 * (k // 32) * n}


@dataclass(frozen=True)
class Shape:
    label: str
    k: int
    n: int


@dataclass
class Row:
    shape: Shape
    fmt: str
    knobs: dict
    status: str = "ok"          # "ok", or why the candidate has no time
    kernels: str = ""
    ms: float | None = None
    ref_ms: float | None = None

    @property
    def gbps(self) -> float | None:
        return WEIGHT_BYTES[self.fmt](self.shape.k, self.shape.n) / self.ms / 1e6 if self.ms else None


def step_shapes(cfg: dict) -> list[Shape]:
    """The weight-reading products of one decode step of a Llama config, siblings merged as the
    step runs them (tensor/merge_projections.py), the most bytes a step first (a run cut short by
    its budget loses the least)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, hd = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or h // heads
    inter, layers = cfg["intermediate_size"], cfg["num_hidden_layers"]
    per_layer = [Shape("q/k/v", h, (heads + 2 * kv) * hd), Shape("o", heads * hd, h),
                 Shape("gate/up", h, 2 * inter), Shape("down", inter, h)]
    head = Shape("lm_head", h, cfg["vocab_size"])
    step = [(s.k * s.n * layers, s) for s in per_layer] + [(head.k * head.n, head)]
    return [s for _, s in sorted(step, key=lambda t: -t[0])]


def build(shape: Shape, fmt: str, device: str):
    """(module strata compiles, its input, the bf16 nn.Linear cuBLAS runs)."""
    import torch

    torch.manual_seed(0)
    base = torch.nn.Linear(shape.k, shape.n, bias=False)
    dense = copy.deepcopy(base).to(device, torch.bfloat16).eval()
    module = dense
    if fmt != "bf16":
        from ..quant.formats import QuantLinear
        module = QuantLinear.from_linear(base, fmt).to(device).eval()
    x = torch.randn(1, shape.k, dtype=torch.bfloat16).to(device)
    return module, x, dense


def sweep(shapes, fmts, compiler, timer, budget_s: float, say=lambda s: None) -> list[Row]:
    """Every (shape, format, variant) in turn until `budget_s` runs out (the rest: rows saying
    so). compiler(module, x, knobs) -> a Program; timer(fn, args) -> ms."""
    import torch

    from .accuracy import check_program, verdict_line
    from .contractions import kernel_summary

    end, rows = time.monotonic() + budget_s, []
    for shape in shapes:
        for fmt in fmts:
            module, x, dense = build(shape, fmt, "cuda" if torch.cuda.is_available() else "cpu")
            ref_ms = timer(dense, (x,)) if time.monotonic() < end else None
            for knobs in VARIANTS[fmt]:
                row = Row(shape, fmt, knobs, ref_ms=ref_ms)
                rows.append(row)
                if time.monotonic() >= end:
                    row.status = "not run: the budget ran out"
                    continue
                try:
                    prog = compiler(module, x, knobs)
                    row.kernels = kernel_summary(prog)
                    verdict = verdict_line(check_program(prog, module, (x,)))
                    if not verdict.startswith("PASS"):
                        row.status = verdict
                        continue
                    row.ms = timer(prog, (x,))
                except Exception as e:  # noqa: BLE001 - a refused or broken candidate is a row
                    row.status = reason(e)
                took = row.status if row.ms is None else f"{row.ms * 1e3:.1f} us"
                say(f"{shape.label} {fmt} {show(knobs)}: {took}")
    return rows


def show(knobs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "default"


def table(rows: list[Row], copy_gbps: float | None) -> tuple[list[str], list[list[str]], list[str]]:
    """(head, body, notes): a row per candidate, the fastest of each shape and format in bold,
    and a note per shape and format saying the fastest against the default."""
    head = ["shape", "K x N", "weights", "knobs", "kernels", "µs", "GB/s", "% of copy",
            "vs cuBLAS bf16", "status"]
    body, notes, best = [], [], {}
    for r in (r for r in rows if r.ms is not None):
        if (r.shape, r.fmt) not in best or r.ms < best[r.shape, r.fmt].ms:
            best[r.shape, r.fmt] = r
    for r in rows:
        mark = "**" if best.get((r.shape, r.fmt)) is r else ""
        cells = [f"{r.ms * 1e3:.1f}", f"{r.gbps:,.0f}",
                 f"{100 * r.gbps / copy_gbps:.0f}%" if copy_gbps else "—",
                 f"{r.ref_ms / r.ms:.2f}x" if r.ref_ms else "—"] if r.ms else ["—"] * 4
        body.append([r.shape.label, f"{r.shape.k} x {r.shape.n}", r.fmt,
                     f"{mark}{show(r.knobs)}{mark}", r.kernels or "—", *cells, r.status])
    for (shape, fmt), b in best.items():
        default = next((r for r in rows if r.shape == shape and r.fmt == fmt and not r.knobs), None)
        gain = f"{default.ms / b.ms:.2f}x the default" if default and default.ms \
            else "the default has no time"
        notes.append(f"{shape.label} {fmt}: fastest {show(b.knobs)}, {b.gbps:,.0f} GB/s, {gain}")
    return head, body, notes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.gemv_sweep",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-s", type=float, default=120.0,
                   help="start no candidate after this many seconds (default 120)")
    p.add_argument("--formats", default="bf16,q4_0", help="weight formats: bf16,q4_0 (default both)")
    p.add_argument("--out", default="docs/gpu", help="report folder (default docs/gpu)")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    args = p.parse_args(argv)

    def command() -> int:
        import torch

        from .env import collect_env, strata_target
        from .harness import L2Flush, measure_copy_gbps, require_cuda, time_cuda
        from .table_report import write_report

        fmts = [f.strip() for f in args.formats.split(",") if f.strip()]
        if not fmts or any(f not in VARIANTS for f in fmts):
            raise SystemExit(f"--formats {args.formats!r}: choose from {', '.join(VARIANTS)}")
        require_cuda("the GEMV sweep")
        env, target, flush = collect_env(), strata_target(), L2Flush()
        copy = measure_copy_gbps()
        compiler = lambda m, x, knobs: compile_cuda(m, (x,), Context(target=target, knobs=knobs))
        timer = lambda fn, a: time_cuda(fn, [a], flush, warmup_ms=10, rep_ms=30).median_ms
        with torch.no_grad():
            rows = sweep(step_shapes(resolve(MODEL).config), fmts, compiler, timer, args.budget_s,
                         lambda s: print(s, file=sys.stderr, flush=True))
        head, body, notes = table(rows, copy)
        notes = [f"strata target {target}; device-to-device copy {copy:,.0f} GB/s (this run)", *notes]
        write_report(head, body, title="decode GEMVs by schedule", env=env, notes=notes,
                     out=args.out, stem="gemv-sweep",
                     heading=f"Decode GEMVs by schedule ({MODEL}'s step, M = 1)")
        return 0
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
