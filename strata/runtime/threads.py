"""How many OpenMP threads a native call runs its kernels on: the user's number, else the cores
that other processes leave free, looked at again every PERIOD seconds.

Why: a kernel's blocks are split evenly over the team and every kernel ends at a barrier, so a
team larger than the free cores waits, kernel after kernel, for a thread the OS has taken off its
core. On the 2-core machine beside one busy process, a SmolLM2-135M decode ran 20 tokens/s on two
threads against 57 on one (65 on one when quiet, 2026-11-29, Zen 4). The free cores come from
cpu_load.OtherLoad (what /proc/stat says was busy, less our own processes' time) over the last
period, so our own spinning threads never count against us. A program passes the number to its
library (strata_set_team, read by every parallel kernel's num_threads clause) when it changes;
never omp_set_num_threads, which would change torch's own thread count (its wheel's libgomp is
the one our libraries link).

Fixed instead when the user says: `set_threads(n)` (strata.set_threads, `--threads N`, `threads=`)
or OMP_NUM_THREADS / STRATA_THREADS in the environment. Where /proc cannot be read, every core.
"""
from __future__ import annotations

import math
import os
import time

from ..core.cpu_load import OtherLoad

PERIOD = 0.2          # seconds between looks at the other processes' load
FIRST_LOOK = 0.05     # the shortest window a first decision is taken from
TAKEN = 0.6           # a core others used 40% of the window counts as theirs: floor(others + TAKEN)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def from_environment() -> int | None:
    for name in ("STRATA_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


class Threads:
    """The team size for the next call (see the module docstring); one per process, since every
    program's library shares one OpenMP runtime."""

    def __init__(self):
        self.cores = _cores()
        self.fixed: int | None = None
        self.n = self.cores
        self._load: OtherLoad | None = None
        self._since = self._due = 0.0

    def set(self, n: int | None) -> None:
        """Use n threads from now on; None: choose from the load again."""
        if n is not None and n < 1:
            raise ValueError(f"threads must be at least 1, not {n}")
        self.fixed = n

    def start(self) -> None:
        """Begin watching the load (a program was loaded): its first call then has a window."""
        if self._load is None:
            now = time.monotonic()
            self._load, self._since, self._due = OtherLoad(), now, now + FIRST_LOOK

    def current(self) -> int:
        """The team size for a call starting now."""
        if self.fixed:
            return self.fixed
        now = time.monotonic()
        if now >= self._due:
            self._look(now)
        return self.n

    def _look(self, now: float) -> None:
        share = self._load.share() if self._load is not None else None
        cpus = os.cpu_count() or self.cores          # what /proc/stat's shares are of
        if env := from_environment():
            self.n = env
        elif share is not None and now - self._since >= FIRST_LOOK:
            self.n = max(1, min(self.cores, cpus - math.floor(share * cpus + TAKEN)))
        self._load, self._since, self._due = OtherLoad(), now, now + PERIOD


THREADS = Threads()


def set_threads(n: int | None) -> None:
    """strata.set_threads: run native programs on n threads (None: as many as the load leaves)."""
    THREADS.set(n)
