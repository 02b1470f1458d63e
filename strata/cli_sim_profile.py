"""`strata run -c CODE --device sim --profile`: the simulator's access counters per kernel
(kernel/sim_profile.py), after the accuracy verdict: how a GPU schedule uses memory, measured
without a GPU."""
from __future__ import annotations

import sys


def profile_snippet_sim(code: str, ctx) -> int:
    from rich.console import Console
    from rich.table import Table

    from .api import compile_snippet
    from .check import compare_with_eager, print_report
    from .kernel.sim_profile import profiling
    program, snippet = compile_snippet(code, ctx, device="sim")
    with profiling() as kernels:
        report = compare_with_eager(program, snippet)
    print_report(program, report)
    table = Table(title="per warp request, actual / ideal (1.00: coalesced, no bank "
                        "conflicts); bytes against the kernel's minimum")
    for col in ("kernel", "ld sectors", "st sectors", "smem ld", "smem st", "read", "written"):
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
                      moved("global store", prof.minimum_written))
    Console(highlight=False).print(table)
    for prof in kernels.values():
        print(f"{prof.name}: warp issues " + ", ".join(f"{k} {n}" for k, n in
                                                     prof.issued.most_common()))
    print("Not counted: ldmatrix, cp.async, TMA and wgmma traffic; registers, spills and "
          "occupancy need ptxas (--device cuda --profile).", file=sys.stderr)
    return 0 if report.passed else 1
