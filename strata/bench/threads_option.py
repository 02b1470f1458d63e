"""`--threads N`, shared by the commands that run CPU programs (run, generate, tune) and the
benchmarks: strata's team (runtime/threads.py) and torch's own threads, set together so that a
comparison runs both on the same cores."""
from __future__ import annotations

import os

from ..core.errors import StrataError
from ..runtime.threads import set_threads


def add_threads_option(parser) -> None:
    """`--threads N` of run, generate and tune (the benchmarks have their own)."""
    parser.add_argument("--threads", type=int, metavar="N",
                        help="on the CPU, run strata's kernels (and torch's, for comparisons) on N "
                             "threads (default: the cores other processes leave free, looked at "
                             "again every 0.2 s)")


def use_threads(n: int | None) -> None:
    """`--threads N`: strata's programs (runtime/threads.py) and torch's own ops (the baselines a
    command times) on n threads; OMP_NUM_THREADS too, for the reports that print it."""
    if n is None:
        return
    if n < 1:
        raise StrataError(f"--threads must be at least 1, not {n}")
    import torch
    set_threads(n)
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
