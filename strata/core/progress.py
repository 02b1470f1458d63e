"""A benchmark's progress, on stderr: a spinner on a terminal, one timed line per step in a log.

Why: rich's status spinner draws nothing where stderr is not a terminal, so a benchmark run into
a log (the GPU acceptance run, CI, `nohup`) said nothing for minutes, and a timeout left no trace
of the step it stopped in. (The CLI commands keep the spinner: their bad input is one sentence
on stderr, found after their first step; `-v` logs their steps.)
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class _Lines:
    """status.update(text) as `[  12.3 s] text` on stderr, flushed."""

    def __init__(self):
        self.t0 = time.monotonic()

    def update(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f} s] {text}", file=sys.stderr, flush=True)


@contextmanager
def status(text: str):
    """A context whose value has update(text): rich's spinner on a terminal, else _Lines."""
    from rich.console import Console
    console = Console(stderr=True, highlight=False)
    if console.is_terminal:
        with console.status(text) as spinner:
            yield spinner
    else:
        lines = _Lines()
        lines.update(text)
        yield lines
