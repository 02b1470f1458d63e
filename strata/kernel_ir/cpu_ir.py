"""The CPU's instruction forms as Kernel IR statements: what a register tile's K loop runs as.

Why: the GPU's Mma and Wgmma are Kernel IR, printed by `--ir kernel`, checked by the verifier and
run by the simulator; so are the CPU's vdpbf16ps rows, AMX tiles, vector FMAs and quantized rows,
chosen once (kernel_ir/lower_cpu.py, from the schedule's FORM and QDOT) and printed each by its
own printer (codegen/c.py's FORMS), not recognised from loop shapes by the emitter.

Each form is a `For` whose loop, as written, is its meaning: the simulator runs it so, the
verifier checks it as a loop plus the form's rule (`check`), the C printer prints the instruction
under `#if` and the loop after `#else`. The instruction differs from the loop only in the order of
float sums, bf16 subnormals flushed (vdpbf16ps, tdpbf16ps) and QuantRow.vnni's int8 activations.
Operands are the variables the loop's loads define and the sums it adds to. A new form is a class
here, its choice in lower_cpu.py and its printer in codegen/c.py.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..core.operands import BufName
from .ir import For, Let, Load


@dataclass(frozen=True)
class CpuForm(For):
    """A loop that runs as one CPU instruction form; subclasses name its operands."""
    lanes: int = 0              # > 0: the loop as written adds its float sums into this many
                                # vector lanes, then a tree (LaneSum; a form's fallback too)

    instruction = "a CPU instruction form"
    languages, what = ("c",), property(lambda self: self.instruction)     # (codegen/c.py prints it)

    @classmethod
    def of(cls, loop: For, **operands):             # `loop` as this form, with `operands`
        return cls(**{f.name: getattr(loop, f.name) for f in fields(For)}, **operands)

    def loads(self) -> dict:
        """variable -> the Load it holds, for each load the loop's body makes."""
        return {s.var: s.value for s in self.body if isinstance(s, Let) and isinstance(s.value, Load)}

    def operands(self) -> tuple[str, ...]:          # the load variables the form reads
        return ()

    def accumulators(self) -> tuple[str, ...]:
        """The float sums the form adds to (declared before the loop)."""
        return ()

    def summary(self) -> str:
        return f"{len(self.accumulators())} sums"

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

    def check(self):
        if len(self.rows) not in (16, 32) or len(self.cols) != len(self.rows) \
                or len({len(c) for c in self.cols}) != 1 or len(self.cols[0]) not in (1, 2):
            return f"{self.instruction}: not 16 or 32 rows of 1 or 2 column tiles"
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


@dataclass(frozen=True)
class LaneSum(CpuForm):
    """A loop that only sums floats over a short row (a multiple of 16): each sum adds into
    `lanes` lanes (16 or 32), added as a tree after the loop. Why: gcc adds the vector lanes of
    `reduction(+:acc)` one after another (32 dependent adds for a row of 128), which a softmax or
    norm row then waits on."""

    instruction = "float sums in vector lanes"

    def summary(self):
        return f"{self.lanes} lanes"

    def check(self):
        if self.lanes not in (16, 32) or (self.trip_count or 1) % self.lanes:
            return f"{self.instruction}: {self.lanes} lanes over {self.trip_count} iterations"
        return super().check()


LANES = 32                                  # weights per block (strata/quant/formats.py)
BLOCK_BYTES = {"q8_0": ("i8", 32), "q4_0": ("u8", 16), "q4_k": ("u8", 16), "q5_k": ("u8", 20),
               "q6_k": ("u8", 12)}
BLOCK_LANES = {"q6_k": 16}                  # the others: LANES
KQ = ("q4_k", "q5_k")                       # a scale and a minimum a block (w = scale * q - low)


@dataclass(frozen=True)
class QuantRow(CpuForm):
    """A loop over blocks of a quantized weight (kernel_ir/lower_quant.py): each step adds
    x[lane] * w(lane) for the block's 32 lanes (q6_k: 16) to the row's partial sums, w the
    format's dequantization of its bytes (scale * q, q4_k's and q5_k's scale * q - low), in vector lanes, the
    scale applied to the block's sum; with `vnni` the activations are int8 blocks and the bytes
    run on int8 dot products (vpdpbusd, vpmaddubsw). With no activations (x None) each block's
    weights are stored dequantized (a prefill's, once). The expressions are in the loop's scope
    (its variable, the Lets its body starts with), so they are no operands of the statement."""
    fmt: str = ""               # q8_0 | q4_0 | q4_k | q5_k | q6_k
    scale: object = None        # the block's scale, free of the lane variable
    qs: BufName = ""            # the quantized bytes
    qs_at: object = None        # the block's first byte
    x: str | None = None        # the activations (f32 or bf16); None: the weights are stored
    x_at: object = None         # the activation of lane 0
    dest: BufName = ""          # the row's partial sums, or the dequantized weights (f32, bf16)
    dest_at: object = None      # its element of lane 0
    low: object = None          # q4_k, q5_k: the block's minimum (w = scale * q - low)
    vnni: tuple = ()            # QDOT=vnni: the scale loads (a K-quant's (d, sc[, dmin, mn]));
                                # (): float lanes

    instruction = "quantized blocks"

    def summary(self):
        return f"{self.fmt} into {self.dest}" + (" (int8 activations)" if self.vnni else "")

    def check(self):
        if self.fmt not in BLOCK_BYTES:
            return f"{self.instruction}: unknown format {self.fmt!r}"
        return super().check()


@dataclass(frozen=True)
class QuantRows(CpuForm):
    """A group of a quantized weight's rows (the loop) each times M activation rows (an inner
    loop of the row's QuantRow, int8 activations, and the store of its sum; cpu_int8_rows.py):
    one kernel on vpdpbusd (AVX2: vpmaddubsw), activation rows as lanes (codegen/c_int8_rows.py)."""
    row: QuantRow | None = None     # the dot product of weight row `var`, activation row `m`
    m: str = ""                     # the activation rows' loop variable
    rows: int = 0                   # M
    out: BufName = ""               # the sums [.., M, N] f32
    out_at: object = None           # the store's index (weight row var, activation row m)

    instruction = "int8 rows (vpdpbusd, activation rows as lanes)"

    def summary(self):
        return f"{self.row.fmt} x {self.rows} rows into {self.out}"

    def check(self):
        if self.row is None or not self.row.vnni or self.row.fmt not in BLOCK_BYTES:
            return f"{self.instruction}: not a QuantRow of int8 activations"
        return super().check()


FORMS = (DotBf16, PairsBf16, AmxTiles, OuterFma, QuantRow, QuantRows, LaneSum)
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
