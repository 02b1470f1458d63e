"""Place a program's temp buffers in one slab of device memory, reusing the space of dead ones.

Why: a program of many kernels passes intermediates between them through "temp" buffers. One
allocation per call (and one static allocation for a CUDA graph) is cheaper than one per buffer,
and a temp that no later kernel reads can lend its bytes to the next one.

A temp is *live* from the first kernel that names it to the last (kernels run in order, so these
indices are the whole story). Two temps whose live ranges share a kernel must not share a byte;
all others may. Placement is greedy by size, best fit: the largest buffer first, each at the
smallest gap (between buffers it conflicts with) that holds it, else above them. Offsets are
multiples of ALIGN (256 bytes: enough for any vector access and for the L2 sector rules).
Pure Python: it runs, and is tested, without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import dtypes

ALIGN = 256


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int       # bytes from the start of the slab, a multiple of the alignment
    nbytes: int       # numel * itemsize (what a kernel touches)
    first: int        # index of the first kernel that uses the buffer
    last: int         # index of the last one

    def overlaps_in_time(self, other: Slot) -> bool:
        return self.first <= other.last and other.first <= self.last

    def overlaps_in_space(self, other: Slot, align: int = ALIGN) -> bool:
        return (self.offset < other.offset + _round_up(other.nbytes, align)
                and other.offset < self.offset + _round_up(self.nbytes, align))


@dataclass(frozen=True)
class SlabPlan:
    slots: tuple[Slot, ...]      # in the program's buffer order
    total_bytes: int
    align: int = ALIGN

    @property
    def offsets(self) -> dict[str, int]:
        return {s.name: s.offset for s in self.slots}

    def slot(self, name: str) -> Slot:
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def unshared_bytes(self) -> int:
        """What one buffer per temp would take (the saving is this minus total_bytes)."""
        return sum(_round_up(s.nbytes, self.align) for s in self.slots)

    def __str__(self) -> str:
        head = (f"slab: {self.total_bytes} bytes for {len(self.slots)} temps "
                f"({self.unshared_bytes} without reuse)")
        lines = [head]
        for s in sorted(self.slots, key=lambda s: (s.offset, s.first)):
            lines.append(f"  {s.name:<24} @ {s.offset:>10}  {s.nbytes:>10} B  kernels {s.first}..{s.last}")
        return "\n".join(lines)


def _round_up(n: int, align: int) -> int:
    return max(align, -(-n // align) * align)


def live_ranges(program) -> dict[str, tuple[int, int]]:
    """First and last kernel index using each temp buffer (temps no kernel uses are left out)."""
    temps = {b.name for b in program.buffers if b.kind == "temp"}
    ranges: dict[str, tuple[int, int]] = {}
    for i, k in enumerate(program.kernels):
        for p in k.params:
            if p.name in temps:
                first, _ = ranges.get(p.name, (i, i))
                ranges[p.name] = (first, i)
    return ranges


def plan_slab(program, align: int = ALIGN) -> SlabPlan:
    """Offsets for every used temp of a KernelProgram in one slab (see the module docstring)."""
    if align <= 0 or align & (align - 1):
        raise ValueError(f"alignment must be a power of two, not {align}")
    ranges = live_ranges(program)
    sized = [Slot(b.name, 0, b.numel * dtypes.ITEMSIZE[b.dtype], *ranges[b.name])
             for b in program.buffers if b.name in ranges]
    placed: list[Slot] = []
    for s in sorted(sized, key=lambda s: (-s.nbytes, s.first, s.name)):
        need = _round_up(s.nbytes, align)
        busy = sorted((p for p in placed if p.overlaps_in_time(s)), key=lambda p: p.offset)
        best, best_gap, end = None, None, 0
        for p in busy:
            gap = p.offset - end
            if gap >= need and (best_gap is None or gap < best_gap):
                best, best_gap = end, gap
            end = max(end, p.offset + _round_up(p.nbytes, align))
        placed.append(Slot(s.name, end if best is None else best, s.nbytes, s.first, s.last))
    by_name = {p.name: p for p in placed}
    slots = tuple(by_name[s.name] for s in sized)
    total = max((p.offset + _round_up(p.nbytes, align) for p in placed), default=0)
    return SlabPlan(slots, total, align)


def check_plan(plan: SlabPlan) -> None:
    """Raise ValueError if the plan is unsafe: a misaligned offset, a slot past the end, or two
    temps live in one kernel that share a byte."""
    for s in plan.slots:
        if s.offset % plan.align:
            raise ValueError(f"temp {s.name} at offset {s.offset} is not {plan.align}-byte aligned")
        if s.offset + s.nbytes > plan.total_bytes:
            raise ValueError(f"temp {s.name} ends past the slab ({plan.total_bytes} bytes)")
    for i, a in enumerate(plan.slots):
        for b in plan.slots[i + 1:]:
            if a.overlaps_in_time(b) and a.overlaps_in_space(b, plan.align):
                raise ValueError(f"temps {a.name} and {b.name} are both live in kernel "
                                 f"{max(a.first, b.first)} and share bytes of the slab")
