"""`strata run -c CODE --device sim --profile`: the simulator's access counters per kernel
(kernel_ir/sim_profile.py), after the accuracy verdict: how a GPU schedule uses memory, measured
without a GPU."""
from __future__ import annotations

import sys

from ..kernel_ir.sim_profile import profiling
from ..runtime.nvrtc import resource_usage
from ..tune.cost import gpu_roofline_us


def profile_snippet_sim(code: str, ctx) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..api import compile_snippet
    from .check import compare_with_eager, print_report
    program, snippet = compile_snippet(code, ctx, device="sim")
    with profiling() as kernels:
        report = compare_with_eager(program, snippet)
    print_report(program, report)
    gpu, why_not = gpu_columns(program, kernels)
    target = program.lowered.target
    table = Table(title="per warp request, actual / ideal (1.00: coalesced, no bank "
                        "conflicts); bytes against the kernel's minimum; ptxas for "
                        f"{target.isa}; roofline of {target} (reference part)")
    for col in ("kernel", "ld sectors", "st sectors", "smem ld", "smem st", "read", "written",
                *GPU_COLUMNS):
        table.add_column(col, justify="left" if col == "kernel" else "right",
                         overflow="fold")
    for prof in kernels.values():
        acc = prof.accesses

        def ratio(kind: str) -> str:
            return f"{acc[kind].ratio:.2f}" if acc[kind].requests else "-"

        def moved(kind: str, minimum: int) -> str:
            return f"{acc[kind].bytes / minimum:.2f}x" if minimum else "-"
        table.add_row(prof.name, ratio("global load"), ratio("global store"), ratio("shared load"),
                      ratio("shared store"), moved("global load", prof.minimum_read),
                      moved("global store", prof.minimum_written), *gpu[prof.name])
    Console(highlight=False, width=None if sys.stdout.isatty() else 160).print(table)
    for prof in kernels.values():
        print(f"{prof.name}: warp issues " + ", ".join(f"{k} {n}" for k, n in
                                                     prof.issued.most_common()))
    print("Not counted: ldmatrix, cp.async, TMA and wgmma traffic (the estimate reads every "
          "parameter at least once)." + (f" No ptxas columns: {why_not}." if why_not else ""),
          file=sys.stderr)
    return 0 if report.passed else 1


GPU_COLUMNS = ("regs", "spills", "occupancy", "est us")


def gpu_columns(program, profiles: dict) -> tuple[dict, str]:
    """Per profiled kernel: ptxas's registers per thread and spill bytes, the occupancy they
    and the block's shared memory allow on the program's Target (active warps per SM of the
    most, and the limit), and the roofline estimate (tune/cost.py); plus why ptxas's columns
    are empty, if they are."""
    target, why = program.lowered.target, ""
    try:
        units, ptxas = program.lowered.units, {}
        for unit in units.sources:                       # each translation unit; a twin: its own
            ptxas.update(resource_usage(unit, target.isa))
        ptxas.update({k: ptxas[f] for k, f in units.function_of.items() if f in ptxas})
    except ImportError as e:
        ptxas, why = {}, f"NVRTC is not installed ({e.name})"
    except Exception as e:          # noqa: BLE001 - a compile error is a bug, but not this report's
        ptxas, why = {}, f"NVRTC failed: {str(e).splitlines()[0]}"
    kernels = {k.name: k for k in program.kernels}
    out = {}
    for name, prof in profiles.items():
        est = gpu_roofline_us(prof, target)
        cells = ["-", "-", "-", f"{est:.2f}" if est is not None else "-"]
        use, k = ptxas.get(name), kernels.get(name)
        if use and k is not None:
            smem = max(use["smem"], k.smem_bytes) + getattr(k, "dynamic_smem_bytes", 0)
            blocks, limit = target.occupancy(k.block, use["registers"], smem)
            warps = blocks * -(-k.block // target.warp_size)
            cells[:3] = [str(use["registers"]), str(use["spill_stores"] + use["spill_loads"]),
                         f"{100 * warps * target.warp_size // target.sm_threads}% ({limit})"]
        out[name] = cells
    return out, why
