"""The closing step the CPU benchmarks share (busy, generate_compile, backend_overhead, train):
their rows printed as a rich table and written as a markdown report, named with what was
measured, the CPU class and the time, that says the machine, date and versions first.
"""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

from .env import cpu_class, slug


def write_report(head: list[str], body: list[list[str]], *, title: str, heading: str, env,
                 notes: list[str], out: str, stem: str) -> Path:
    """Print the table (`title`, with the device) and write `out/<stem>-<device>-<class>-<time>.md`
    (`heading`, the environment, one line per note, the table); returns the path."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    t = Table(title=f"{title} ({env.device})")
    for h in head:
        t.add_column(h, justify="left" if h == "case" else "right")
    for r in body:
        t.add_row(*r)
    console.print(t)
    lines = [f"# {heading}", "", f"- device: {env.device}", f"- date: {env.date}",
             f"- strata {env.strata}, torch {env.torch}, Python {env.python}",
             *(f"- {k}: {v}" for k, v in (env.extra or {}).items()),     # threads, compiler, ISA
             *(f"- {n}" for n in notes), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
             *("| " + " | ".join(r) + " |" for r in body)]
    path = Path(out) / (f"{stem}-{slug(env.device)}-{cpu_class()}-"
                        f"{datetime.now(timezone.utc):%Y-%m-%d-%H%M}.md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    console.print(f"wrote {path}")
    return path
