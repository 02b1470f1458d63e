"""`strata view`: one offline HTML page of a whole compilation (issue 31).

Why a package of small files: collecting (record.py: the lowering with its -vv log kept,
passes.py: the log turned into per-kernel pass histories, provenance.py: which Torch IR op
became which kernel and which lines, knob_sources.py: where each knob value came from) is
separate from drawing (page.py with page.css and page.js inlined), so tests check the data
without a browser and the browser tests check only the page.

    from strata.view import collect, render, write_page
    write_page(program, "report.html")          # what Program.view(path) calls
"""
from __future__ import annotations

from ..core.errors import StrataError
from .collect import collect
from .page import render


def write_page(program, path, verdict=None, title: str = "", profiles=None, bench=None) -> int:
    """Write `program`'s page to `path`; returns its size in bytes. `verdict`: a check.Report;
    `profiles`: the simulator's {kernel: KernelProfile} from that run; `bench`: the CPU timings
    of bench/cpu_bench.py's view_bench."""
    html = render(collect(program, verdict=verdict, title=title, profiles=profiles, bench=bench))
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(html)
    except OSError as e:
        raise StrataError(f"cannot write {path}: {e.strerror}") from None
    return len(html.encode())


__all__ = ["collect", "render", "write_page"]
