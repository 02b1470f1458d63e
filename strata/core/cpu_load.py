"""How much of the CPU *other* processes took while something was timed.

Why: on a shared machine a timing is only as good as the quiet around it. The load average
cannot tell (it counts our own timing threads), so this reads /proc/stat (every CPU's busy and
total time, hypervisor steal included) and /proc/<pid>/stat (our processes' own time) at the
start and end of a measurement: what was busy and not ours is the others' share of the machine.
`--bench` warns in its table, and `strata tune` stores no result timed under a share above
BUSY. Where /proc cannot be read (not Linux) the share is None: nothing is claimed either way.
Also the memory available (`available_bytes`): whether a snippet's large inputs, or a program's
packed weights, fit now.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

BUSY = 0.25          # others took more than a quarter of the machine: the timing is not trusted


@dataclass(frozen=True)
class _Sample:
    busy: int         # jiffies every CPU spent not idle
    total: int
    ours: int         # jiffies our processes spent


def _sample(pids) -> _Sample | None:
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        user, nice, system, idle, iowait, irq, softirq, steal = fields
        ours = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()
                ours += sum(int(x) for x in stat[11:15])   # utime, stime, and of its reaped
                                                               # children (the tuner's gcc)
            except (OSError, IndexError, ValueError):
                pass                                            # a process that ended
        busy = user + nice + system + irq + softirq + steal
        return _Sample(busy, busy + idle + iowait, ours)
    except (OSError, ValueError):
        return None


class OtherLoad:
    """Start at construction; `share()` is the fraction of the whole machine (0..1) that
    processes other than `pids` (and this one) used since, or None where unknown."""

    def __init__(self, pids=()):
        self.pids = [os.getpid(), *pids]
        self.start = _sample(self.pids)

    def share(self) -> float | None:
        end = _sample(self.pids)
        if self.start is None or end is None or end.total <= self.start.total:
            return None
        others = (end.busy - self.start.busy) - (end.ours - self.start.ours)
        return min(1.0, max(0.0, others / (end.total - self.start.total)))


def busy_sentence(share: float | None) -> str | None:
    """One sentence when `share` is over BUSY, else None."""
    if share is None or share <= BUSY:
        return None
    return (f"other processes took {100 * share:.0f}% of the CPU while this was timed: the "
            f"timings are not to be trusted; measure on a quiet machine")


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
