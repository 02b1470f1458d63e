"""The CPU's instruction forms as Kernel IR statements: what a register tile's K loop runs as.

Why statements: the GPU's Mma and Wgmma are Kernel IR, printed by `--ir kernel`, checked by the
verifier and run by the simulator; the CPU's vdpbf16ps rows, AMX tiles and explicit FMA vectors
are chosen once, in Kernel IR (kernel_ir/lower_cpu.py, from the schedule's FORM), and the C
emitter prints each with a printer of its own instead of recognising loop shapes.

Each form is a `For` (a subclass): the loop as written is its meaning. The simulator runs it so,
the verifier checks it as a loop plus the form's rule (`check`), and the C printer prints the
instruction under `#if` with the loop as written after `#else` (one C source for every CPU).
Where the instruction's result differs from the loop's it is only in the order of float sums and
in bf16 subnormals flushed to zero (vdpbf16ps, tdpbf16ps), both inside a bf16 result's tolerance.
Operands are named by the variables the loop defines (its loads) and the accumulators it adds to,
so renaming and substitution passes keep them valid. Adding a form: a class here, its choice in
lower_cpu.py, its printer in codegen/c.py's FORMS table.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import For, Let, Load


@dataclass(frozen=True)
class CpuForm(For):
    """A loop that runs as one CPU instruction form; subclasses name its operands."""

    instruction = "a CPU instruction form"

    def loads(self) -> dict:
        """variable -> the Load it holds, for each load the loop's body makes."""
        return {s.var: s.value for s in self.body if isinstance(s, Let) and isinstance(s.value, Load)}

    def operands(self) -> tuple[str, ...]:
        """Every load variable the form reads (each must be one of loads())."""
        return ()

    def accumulators(self) -> tuple[str, ...]:
        """The float sums the form adds to (declared before the loop)."""
        return ()

    def summary(self) -> str:
        return ""

    def check(self) -> str | None:
        """What is wrong with the form's operands, or None (the verifier's rule)."""
        loads = self.loads()
        missing = [v for v in self.operands() if v not in loads]
        if missing:
            return f"{self.instruction} reads {missing}, which the loop does not load"
        if self.step != 1:
            return f"{self.instruction} runs a loop of step {self.step}, not 1"
        return None

    def to_text(self, fmt):
        return f"{type(self).__name__.lower()} {self.summary()} ({self.instruction}) " + super().to_text(fmt)


@dataclass(frozen=True)
class DotBf16(CpuForm):
    """acc += a * b for each (acc, a, b) of `accs`, a and b bf16 loads contiguous along the loop:
    32 products a step on vdpbf16ps, partial sums in CHAINS vectors added up after the loop."""
    accs: tuple = ()            # ((accumulator, a, b), ...)

    instruction = "vdpbf16ps along K"

    def operands(self):
        return tuple(x for _, a, b in self.accs for x in (a, b))

    def accumulators(self):
        return tuple(acc for acc, _, _ in self.accs)

    def summary(self):
        return f"{len(self.accs)} sums"


@dataclass(frozen=True)
class PairsBf16(CpuForm):
    """Each K step of a pairs-form register tile: per row vector (u, w, accs), the row's bf16 pair
    at u (K and K + 1, one 32-bit broadcast) times the panel's 16 column pairs from w, added to 16
    accumulators: one vdpbf16ps."""
    vectors: tuple = ()         # ((row load, panel load, (16 accumulators)), ...)

    instruction = "vdpbf16ps on pairs of K"

    def operands(self):
        return tuple(x for u, w, _ in self.vectors for x in (u, w))

    def accumulators(self):
        return tuple(a for _, _, accs in self.vectors for a in accs)

    def summary(self):
        return f"{len(self.vectors)} x 16 sums"

    def check(self):
        if any(len(accs) != 16 for _, _, accs in self.vectors):
            return f"{self.instruction}: a vector of other than 16 accumulators"
        return super().check()


@dataclass(frozen=True)
class AmxTiles(CpuForm):
    """A pairs-form register tile of 16 or 32 rows and 16 or 32 columns as AMX tiles: 32 K a
    step, tdpbf16ps into up to 2 x 2 C tiles of 16 x 16 fp32, then added to the accumulators; K
    pairs past a multiple of 16 run as the loop is written."""
    rows: tuple = ()            # the M-side row load of each row (16 or 32)
    cols: tuple = ()            # per row: ((panel load, (16 accumulators)), ...) (1 or 2)
    lda: int | None = None      # elements between rows; None: not constant (rows copied first)
    ldb: int = 0                # elements between the panel's pair rows
    prefetch: tuple = ()        # a packed weight's panel: (elements per panel, the register
                                # tiles' loop variable or None, their count)

    instruction = "AMX tdpbf16ps"

    def operands(self):
        return self.rows + tuple(w for c in self.cols for w, _ in c)

    def accumulators(self):
        return tuple(a for c in self.cols for _, accs in c for a in accs)

    def summary(self):
        return f"{len(self.rows) // 16} x {len(self.cols[0]) if self.cols else 0} tiles"

    def check(self):
        if len(self.rows) not in (16, 32) or len(self.cols) != len(self.rows) \
                or len({len(c) for c in self.cols}) != 1 or len(self.cols[0]) not in (1, 2):
            return f"{self.instruction}: {len(self.rows)} rows of {len(self.cols[0]) if self.cols else 0} " \
                   f"column tiles (16 or 32 rows of 1 or 2)"
        return super().check()


@dataclass(frozen=True)
class OuterFma(CpuForm):
    """Each K step of an outer-form register tile as vectors: per row, one broadcast of its value
    times consecutive panel values, a vector FMA per `lanes` accumulators (lanes of the widest
    vector ISA the tile fits, codegen/c_outer.py's ISAS); each lane runs the loop's fmaf calls in
    order, so the results are the loop's bits."""
    rows: tuple = ()            # ((row load, ((accumulator, panel load), ...)), ...)
    tiles: str | None = None    # the loop over the block's register tiles (prefetch), if any
    tiles_dtype: str = "i32"

    instruction = "vector FMAs"

    def operands(self):
        return tuple(x for u, points in self.rows for x in (u, *(w for _, w in points)))

    def accumulators(self):
        return tuple(a for _, points in self.rows for a, _ in points)

    def summary(self):
        return f"{len(self.rows)} rows x {len(self.rows[0][1]) if self.rows else 0}"


FORMS = (DotBf16, PairsBf16, AmxTiles, OuterFma)
# (lanes, vector registers) of each vector ISA an OuterFma tile may run on: AVX-512, AVX2 with
# FMA, AArch64 NEON (codegen/c_outer.py prints each under its `#if`)
VECTOR_ISAS = ((16, 32), (8, 16), (4, 32))


def fits(rows: tuple, lanes: int, registers: int) -> bool:
    """Whether an OuterFma tile's rows are whole vectors of `lanes` and its accumulators, a row
    of panel vectors and a broadcast fit in `registers`."""
    widths = {len(points) for _, points in rows}
    if len(widths) != 1 or widths.pop() % lanes:
        return False
    vectors = len(rows[0][1]) // lanes
    return len(rows) * vectors + vectors + 1 <= registers
