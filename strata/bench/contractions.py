"""`python -m strata.bench.contractions`: issue 3's GPU table in one run. bf16 matmul at 4096³
and F.linear at Llama/Qwen decode shapes against torch (cuBLAS), causal flash attention at seq
2048 against torch's SDPA with the flash backend forced; TFLOP/s, the ratio, the accuracy verdict
and whether each goal is met. Written as markdown and JSON named with the device and the date.

    python -m strata.bench.contractions --list
    python -m strata.bench.contractions [--quick | --sweep] [--out docs]

strata compiles for this device's architecture (bench/env.strata_target: sm_90a on H100/H200,
so its tile passes may pick wgmma) with default knobs. A case strata cannot compile or run is a
row saying why, and the run goes on.
"""
from __future__ import annotations

import argparse
import sys

from ..core import progress
from ..core.command import guarded
from ..core.context import Context
from ..kernel_ir.ir import Mma, Wgmma, walk
from . import contraction_cases as C
from .accuracy import check_program, verdict_line
from .contraction_report import (ContractionRow, dense_peak_tflops, goal_summary, rich_table,
                                 stem_for, table_rows, write)
from .env import collect_env, strata_target
from .harness import (L2Flush, input_copies, l2_bytes, measure_ceilings, require_cuda,
                      rotating_arg_sets, tensor_bytes, time_cuda)
from .report import fmt_flops
from .results import EAGER, STRATA, CaseResult, VariantRow
from .runtime_adapter import compile_cuda
from .variants import measure_variants, reason, strata_status
from .work import estimate_work


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m strata.bench.contractions",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs", help="report folder (default docs)")
    p.add_argument("--quick", action="store_true",
                   help="a few cases only: 4096³ mm, TinyLlama's projections at M=1 and at a "
                        "512-token prefill, causal attention at 2048 x 64")
    p.add_argument("--sweep", action="store_true",
                   help="causal attention (head dims 64, 128) under each tensor-core schedule "
                        "instead: INSTR mma/wgmma, BLOCK_M, BLOCK_N pinned")
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return p


def kernel_summary(program) -> str:
    """"2 (wgmma)": how many kernels the program launches and which tensor-core instruction
    they use (wgmma, mma.sync, or none: CUDA cores)."""
    kernels = list(program.kernels)
    stmts = [s for k in kernels for s in walk(k.body)]
    instr = ("wgmma" if any(isinstance(s, Wgmma) for s in stmts)
             else "mma.sync" if any(isinstance(s, Mma) for s in stmts) else "no tensor cores")
    return f"{len(kernels)} ({instr})"


def run_case(case, flush=None, l2=None, ctx=None, device: str = "cuda", timer=None,
             compiler=None) -> ContractionRow:
    """Build, compile, check and time one case. (Tests drive it on the CPU with device="cpu",
    the simulator as `compiler` and a fake `timer`.)"""
    import torch

    timer = timer or (lambda f, s: time_cuda(f, s, flush))
    compiler = compiler or (lambda fn, inputs: compile_cuda(fn, inputs, ctx))
    module, inputs, timed = case.build(device)
    work = estimate_work(module, inputs, flops=case.flops())
    result = CaseResult(case.name, case.dtype, work.bytes, work.flops, [], op=case.group)
    row = ContractionRow(result, case.group, case.goal, case.reference, case.label)
    program, status = None, "ok"
    try:
        program = compiler(module, inputs)
        row.extra["strata_kernels"] = kernel_summary(program)
    except Exception as e:  # noqa: BLE001 - "unsupported: ..." / "failed: ..." row, run goes on
        status = strata_status(e)
    if program is not None:
        try:
            result.accuracy = verdict_line(check_program(program, module, inputs))
        except Exception as e:  # noqa: BLE001 - the program failed to run: a row, not the end
            program, status = None, f"failed: {reason(e)}"
    arg_sets = rotating_arg_sets(inputs, input_copies(tensor_bytes(inputs), l2))
    result.variants = measure_variants(timed, arg_sets, timer, program, status, (EAGER, STRATA))
    if getattr(timed, "chosen", None):          # the SDPA backend torch ran fastest
        row.label += f"; torch ran {timed.chosen.split('_')[0].lower()}"
    del module, inputs, arg_sets, program
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def failed_row(case, status: str) -> ContractionRow:
    result = CaseResult(case.name, case.dtype, 0, case.flops(),
                        [VariantRow(EAGER, status), VariantRow(STRATA, status)], op=case.group)
    return ContractionRow(result, case.group, case.goal, case.reference, case.label)


def print_list(cs, console) -> None:
    from rich.table import Table

    table = Table(title=f"contractions: {len(cs)} cases (bf16; FP8 where named)", title_justify="left")
    for col in ("#", "case", "layers", "FLOPs", "goal"):
        table.add_column(col, justify="right" if col in ("#", "FLOPs") else "left")
    for i, c in enumerate(cs, 1):
        table.add_row(str(i), c.name, c.label, fmt_flops(c.flops()), f"≥ {c.goal:g}× {c.reference}")
    console.print(table)


def run(cs, out_dir: str, console) -> int:
    import torch

    env = collect_env()
    target = strata_target()
    env.extra["strata target"] = target
    console.print(f"[bold]{env.device}[/]  torch {env.torch}  CUDA {env.cuda}  strata {env.strata}"
                  f"  target {target}")
    with progress.status("measuring the device ceilings (copy bandwidth, torch.mm)"):
        ceilings = measure_ceilings(("bf16",))
    flush, l2 = L2Flush(), l2_bytes()
    stem = stem_for("contractions", env)
    peaks = dense_peak_tflops(env.device)
    rows: list[ContractionRow] = []
    with torch.no_grad():
        for i, case in enumerate(cs, 1):
            with progress.status(f"[{i}/{len(cs)}] {case.name}"):
                try:
                    pins = dict(getattr(case, "knobs", ()))
                    rows.append(run_case(case, flush, l2, Context(target=target, knobs=pins)))
                except Exception as e:  # noqa: BLE001 - e.g. out of memory building the case
                    rows.append(failed_row(case, f"failed: {reason(e)}"))
                    torch.cuda.empty_cache()
            r = rows[-1]
            if case.dtype in peaks:
                r.extra["peak_tflops"] = peaks[case.dtype]
            console.print(f"{r.result.name}: {' | '.join(rich_cells(r))}")
            write(out_dir, stem, rows, env, ceilings)
    console.print(rich_table(rows))
    for line in goal_summary(rows):
        console.print(line)
    md, js = write(out_dir, stem, rows, env, ceilings)
    console.print(f"wrote {md} and {js}")
    return 0


def rich_cells(row: ContractionRow) -> list[str]:
    cells = table_rows([row])[0]
    return [f"{h} {c}" for h, c in zip(("accuracy", "kernels", "torch ms", "strata ms", "torch TFLOP/s",
                                        "strata TFLOP/s", "of peak", "ratio", "goal", ""), cells[2:])]


def main(argv=None) -> int:
    from rich.console import Console

    args = build_parser().parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)

    def command() -> int:
        cs = C.sweep_cases() if args.sweep else C.cases(quick=args.quick)
        if args.list:
            print_list(cs, console)
            return 0
        require_cuda("the contractions benchmark")
        return run(cs, args.out, console)
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
