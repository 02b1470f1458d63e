"""`python -m strata.bench.suite`: the LLM op suite on this machine's GPU (or, with --device cpu,
natively on its CPU: cpu_suite.py), against eager and torch.compile, written as a markdown and a
JSON report.

Each case: build the module on the GPU, compile it with strata, check its accuracy against eager
float64, then time every variant (harness.py) and every strata kernel. A case strata cannot
compile yet is a row "unsupported: <sentence>" and the suite goes on; the reports are rewritten
after every case, so a run cut short still leaves what it measured.

    python -m strata.bench.suite --list
    python -m strata.bench.suite --model tinyllama --dtype bf16 --seq 128 --out docs/bench
    python -m strata.bench.suite --device cpu --threads 1
"""
from __future__ import annotations

import argparse
import sys
import time

from ..core.command import guarded
from ..core.errors import StrataError
from . import cases as C, cpu_suite
from .accuracy import check_program, verdict_line
from .cpu_bench import cpu_ceilings
from .env import collect_cpu_env, collect_env, cpu_class, slug
from .harness import (L2Flush, input_copies, l2_bytes, measure_ceilings, require_cuda,
                      rotating_arg_sets, tensor_bytes, time_cuda)
from .report import (_env_lines, fmt_flops, fmt_ms, fmt_ratio, geomeans, speedup, summary_table,
                     write_reports)
from .results import MAX_AUTOTUNE, VARIANTS, CaseResult, VariantRow
from .runtime_adapter import compile_cuda, kernel_rows, kernel_times, with_times
from .threads_option import use_threads
from .variants import measure_variants, reason, strata_status
from .work import estimate_work

VARIANT_ALIASES = {"max-autotune": MAX_AUTOTUNE, "compile": "torch.compile",
                   **{v: v for v in VARIANTS}}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m strata.bench.suite",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default) or cpu: strata's native C + OpenMP kernels")
    p.add_argument("--threads", type=int, default=None,
                   help="--device cpu: threads for torch and strata's OpenMP (default: every core)")
    p.add_argument("--rounds", type=int, default=None,
                   help="--device cpu: interleaved timing rounds per case (default 11)")
    p.add_argument("--dtype", help="fp32,bf16 (default both)")
    p.add_argument("--seq", help="tokens: 1,128,2048 (default all three; 1,128 on the CPU)")
    p.add_argument("--model", help=f"{','.join(C.MODELS)} (default both; tinyllama on the CPU)")
    p.add_argument("--ops", help=f"a subset of: {','.join(C.OPS)}")
    p.add_argument("--variants", help="eager,torch.compile,max-autotune,strata (default all; "
                                      "on the CPU all but max-autotune)")
    p.add_argument("--out", default="docs/bench", help="report folder (default docs/bench)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new case after this many seconds; the rest are listed as skipped")
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return p


def select(args) -> tuple[list[C.Case], list[str]]:
    cpu = getattr(args, "device", "cuda") == "cpu"
    try:
        seqs = [int(s) for s in args.seq.split(",") if s.strip()] if args.seq else \
            list(cpu_suite.SEQS if cpu else C.SEQS)
    except ValueError:
        raise StrataError(f"--seq {args.seq!r}: expected comma-separated integers") from None
    if any(s < 1 for s in seqs):
        raise StrataError("--seq: every sequence length must be at least 1")
    models = C.parse_list(args.model or (",".join(cpu_suite.MODELS) if cpu else None),
                          tuple(C.MODELS), "model")
    dts = C.parse_list(args.dtype, ("f32", "bf16", "f16"), "dtype", C.DTYPE_ALIASES) if args.dtype \
        else list(C.DTYPES)
    ops = C.parse_list(args.ops, tuple(C.OPS), "op")
    default = ",".join(v for v in VARIANTS if v != MAX_AUTOTUNE) if cpu else None
    which = C.parse_list(args.variants or default, VARIANTS, "variant", VARIANT_ALIASES)
    which = [v for v in VARIANTS if v in which]        # table order
    return C.cases(models, seqs, dts, ops), which


def print_list(cases: list[C.Case], console) -> None:
    import torch
    from rich.table import Table

    table = Table(title=f"LLM op suite: {len(cases)} cases", title_justify="left")
    for col in ("#", "case", "inputs", "ideal FLOPs"):
        table.add_column(col, justify="right" if col in ("#", "ideal FLOPs") else "left")
    for i, c in enumerate(cases, 1):
        shapes = ", ".join("×".join(map(str, x.shape)) for x in
                           C._inputs(c.op, c.model, c.seq, torch.float32, "meta"))
        table.add_row(str(i), c.name, shapes, fmt_flops(c.flops()) if c.flops() else "—")
    console.print(table)
    for op in dict.fromkeys(c.op for c in cases):
        console.print(f"  {op}: {C.OPS[op][0]}")


def run_case(case: C.Case, which, step, flush=None, l2=None, device: str = "cuda", timer=None,
             compiler=None) -> CaseResult:
    """Build, compile, check and time one case on the GPU. (Tests drive it on the CPU with
    device="cpu", the simulator as `compiler` and a fake `timer`.)"""
    import torch

    timer = timer or (lambda f, s: time_cuda(f, s, flush))
    compiler = compiler or compile_cuda
    step("building")
    module, inputs = case.build(device)
    work = estimate_work(module, inputs, flops=case.flops())
    result = CaseResult(case.name, case.dtype, work.bytes, work.flops, [], op=case.op,
                        model=case.model.name, seq=case.seq)
    program, status = None, "ok"
    if "strata" in which:
        step("compiling with strata")
        try:
            program = compiler(module, inputs)
        except Exception as e:  # noqa: BLE001 - "unsupported: ..." / "failed: ..." row, suite goes on
            status = strata_status(e)
    if program is not None:
        step("checking accuracy")
        try:
            result.accuracy = verdict_line(check_program(program, module, inputs))
        except Exception as e:  # noqa: BLE001 - the program failed to run: a row, not the end
            program, status = None, f"failed: {reason(e)}"
    arg_sets = rotating_arg_sets(inputs, input_copies(tensor_bytes(inputs), l2))
    result.variants = measure_variants(module, arg_sets, timer, program, status, which, on_step=step)
    strata_row = result.variant("strata")
    if program is not None and strata_row is not None and strata_row.ok:
        step("timing kernels")
        try:
            times = kernel_times(program, inputs, flush)
        except Exception:  # noqa: BLE001 - no per-kernel time: the kernel table shows "—"
            times = []
        result.kernels = with_times(kernel_rows(program), times)
    del module, inputs, arg_sets, program
    torch.cuda.empty_cache()
    return result


def _failed_case(case: C.Case, which, status: str) -> CaseResult:
    return CaseResult(case.name, case.dtype, 0, case.flops(), [VariantRow(v, status) for v in which],
                      op=case.op, model=case.model.name, seq=case.seq)


def _case_line(r: CaseResult) -> str:
    cells = []
    for v in r.variants:
        cells.append(f"{v.name} {fmt_ms(v.ms)} ms" if v.ok else f"{v.name} {v.status.split(':')[0]}")
    acc = f"  {r.accuracy.split()[0]}" if r.accuracy else ""
    return (f"{r.name}{acc}: " + ", ".join(cells) +
            f"  (strata {fmt_ratio(speedup(r, 'strata', 'eager'))} eager, "
            f"{fmt_ratio(speedup(r, 'strata', 'torch.compile'))} torch.compile)")


def run_suite(cases: list[C.Case], which, out_dir: str, budget_s: float | None, console,
              device: str = "cuda", rounds: int | None = None) -> int:
    import torch
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    cpu = device == "cpu"
    env = collect_cpu_env(torch.get_num_threads()) if cpu else collect_env()
    console.print(f"[bold]{env.device}[/]  torch {env.torch}  CUDA {env.cuda}  strata {env.strata}")
    with console.status("measuring the ceilings (memory bandwidth, torch.mm)"):
        if cpu:
            ceilings = cpu_ceilings(sorted({c.dtype for c in cases}))
        else:
            ceilings = measure_ceilings(sorted({c.dtype for c in cases}))
            flush, l2 = L2Flush(), l2_bytes()
    console.print(_env_lines(env, ceilings)[-1][2:])
    where = f"-{cpu_class()}-{env.extra['threads']}t" if cpu else ""
    stem = f"suite-{slug(env.device)}{where}-{env.date[:10]}-{env.date[11:13]}{env.date[14:16]}"
    results: list[CaseResult] = []
    t0 = time.monotonic()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with torch.no_grad(), Progress(*columns, console=console) as progress:
        task = progress.add_task("suite", total=len(cases))
        for case in cases:
            if budget_s is not None and time.monotonic() - t0 > budget_s:
                results.append(_failed_case(case, which, f"skipped: time budget of {budget_s:g} s spent"))
            else:
                def step(what, name=case.name):
                    progress.update(task, description=f"{name}: {what}")
                try:
                    results.append(cpu_suite.run_cpu_case(case, which, step, rounds or cpu_suite.ROUNDS)
                                   if cpu else run_case(case, which, step, flush, l2))
                except Exception as e:  # noqa: BLE001 - e.g. out of memory building the case
                    results.append(_failed_case(case, which, f"failed: {reason(e)}"))
                    torch.cuda.empty_cache()
                progress.console.print(_case_line(results[-1]))
            write_reports(out_dir, stem, results, env, ceilings, device=device)
            progress.advance(task)
    console.print(summary_table(results, ceilings))
    g = geomeans(results)
    console.print(f"geomean strata speedup: {fmt_ratio(g['vs_eager'])} vs eager "
                  f"({g['vs_eager_cases']} cases), {fmt_ratio(g['vs_torch_compile'])} vs torch.compile "
                  f"({g['vs_torch_compile_cases']} cases), {fmt_ratio(g['vs_best'])} vs the faster "
                  f"of the two")
    md, js = write_reports(out_dir, stem, results, env, ceilings, device=device)
    console.print(f"wrote {md} and {js}")
    return 0


def main(argv=None) -> int:
    from rich.console import Console
    args = build_parser().parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

    def command() -> int:
        cases, which = select(args)
        if args.list:
            print_list(cases, console)
            return 0
        if args.device == "cpu":
            use_threads(args.threads)
        else:
            require_cuda("the benchmark suite")
        return run_suite(cases, which, args.out, args.budget_s, console, args.device, args.rounds)
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
