"""Tile IR: a Loop IR kernel scheduled onto a GPU's threads or a CPU's cores (one-thread blocks).

A `TileKernel` keeps the Loop IR statements and adds the schedule:

* `domain`: the outer free loops, flattened into rows (`mode="rows"`, one group of `group`
  threads per row, `block // group` rows per block) or into elements (`mode="elementwise"`,
  one thread per `vec` consecutive elements);
* `StridedLoop`: a loop whose iterations are dealt to the threads of a group
  (`for a = t; a < n; a += group`);
* `Combine`: the merge of per-thread partial accumulators across the group (warp shuffles,
  then shared memory);
* `Stage`: a slab of a global input copied into shared memory once, read many times;
* `Scratch`: a one-thread block's array of values a loop computes for a later one (a CPU row).

A contraction (`mode="matmul"`, see `MatmulTile`) is scheduled as a 2-D block tile instead:

* `Points`: the thread's THREAD_M x THREAD_N output points, binding the M and N axes;
  one after another, or all at once with their values in registers (`registers=True`);
* `Registers`: accumulators held per point across the K loops;
* `StageTile`: one K step of an operand computed (prologue included) into shared memory by the
  whole block, zero outside the matrix; `Sync`: the barrier before the tile is overwritten;
* `Guard`: statements run only where a condition holds (edges of M, N and K);
* `MicroTiles`: on a CPU (`serial` tile, one thread per block) the block's register tiles along
  M run in turn, reusing the N-side panel the block packed once (tile/passes/cpu_matmul.py).

Every choice is a knob (`knobs`), printed with the kernel and pinnable with --knob.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from math import prod

from ..core.expr import Const, Expr, Var, add, mul, rename, substitute, to_str
from ..core.knobs import KNOBS
from ..core.operands import Body, Operands
from ..loop.ir import (Accum, AccInit, CustomCall, Let, Load, Loop, Store, format_stmt,
                       format_kernel as format_loop_kernel)


@dataclass(frozen=True)
class StridedLoop(Operands):
    """Iterations var = t, t + step, ... < extent, dealt to the `step` threads of a group.

    With vec > 1 a thread takes vec consecutive iterations at once (t*vec .. t*vec + vec-1, then
    += step*vec), so that its loads become one 16-byte vector access."""
    var: str
    extent: int
    step: int
    kind: str                           # "free" | "reduce"
    body: Body
    accs: tuple[AccInit, ...] = ()
    unroll: bool = False
    vec: int = 1                        # each thread takes `vec` consecutive iterations at a time
    block_wide: bool = False            # dealt to the whole block (a prelude's reduction), t = tid


@dataclass(frozen=True)
class Combine(Operands):
    """Merge the group's partial accumulators; afterwards every thread holds the total."""
    accs: tuple[AccInit, ...]
    threads: int
    block_wide: bool = False            # the whole block's (a prelude's reduction)


@dataclass(frozen=True)
class Stage(Operands):
    """name[f] = buf[base + f] for f < size, filled cooperatively, then a barrier."""
    name: str
    buf: str
    base: Expr
    size: int
    dtype: str                          # storage dtype
    vec: int = 1                        # elements per thread per copy (a 16-byte vector when > 1)


@dataclass(frozen=True)
class Scratch(Operands):
    """An array of a one-thread block (a CPU row) that keeps values one loop computes for a
    later loop, stored and loaded with Loop IR Store/Load at a one-dimensional index."""
    name: str
    dtype: str
    size: int


@dataclass(frozen=True)
class MatmulTile:
    """The block tile of a contraction: a block of threads_m x threads_n threads computes a
    tile_m x tile_n tile of the output, starting at (m0, n0) = (tile_m * bm, tile_n * bn) for the
    block's position (bm, bn); thread (tm, tn) owns the thread_m x thread_n points
    m = m0 + tm + threads_m * i, n = n0 + tn + threads_n * j. The other domain axes (batch) are
    fixed per block. `m` is None when the M-side operand is a vector (a decode shape, M = 1).

    serial: a CPU's tile: the block is one thread that runs its tile_m / thread_m register tiles
    along M in turn (`MicroTiles`), tile_n == thread_n; point (i, j) is (m0 + i, n0 + j), with
    m0 the register tile's first row, so that the points of a row are contiguous (one SIMD
    vector of N per FMA). order: which block loop is outermost, "mn" (M tiles outer, N fastest)
    or "nm" (the ORDER knob; a CPU's blocks run in that order, each thread a run of them)."""
    m: str | None
    n: str
    tile_m: int
    tile_n: int
    thread_m: int
    thread_n: int
    serial: bool = False
    order: str = "mn"

    @property
    def threads_m(self) -> int:
        return 1 if self.serial else self.tile_m // self.thread_m

    @property
    def threads_n(self) -> int:
        return 1 if self.serial else self.tile_n // self.thread_n

    def coord(self, axis: str, point: Expr) -> Expr:
        """The M (or N) coordinate of the thread's point number `point` along that axis."""
        if self.serial:
            return add(Var("m0" if axis == self.m else "n0"), point)
        if axis == self.m:
            return add(add(Var("m0"), Var("tm")), mul(point, self.threads_m))
        return add(add(Var("n0"), Var("tn")), mul(point, self.threads_n))


@dataclass(frozen=True)
class Points(Operands):
    """Run `body` for each of the thread's THREAD_M x THREAD_N points (MatmulTile), with the M
    and N axes bound to the point's coordinates. With `registers` the points run all at once:
    a value that depends on M only is computed once per row of points, on N only once per
    column, and every name is one register per point."""
    body: Body
    registers: bool = False


@dataclass(frozen=True)
class Registers(Operands):
    """Accumulators declared once per point and kept in registers across the K loops."""
    accs: tuple[AccInit, ...]


@dataclass(frozen=True)
class Guard(Operands):
    """Run `body` only where `cond` holds."""
    cond: Expr
    body: Body


@dataclass(frozen=True)
class StageTile(Operands):
    """name[k][x] = value for k < k_extent, x < x_extent (row stride `stride`), computed by `body`
    with `k_var` = k and the axis `x_var` = origin + x, cooperatively by the whole block, 0 where
    `bounds` fails; then a barrier. `fast` is the coordinate that moves fastest across threads
    during the fill ("k" or "x": the one that is contiguous in global memory). `pairs` (a CPU's
    FORM=pairs panel): k counts pairs of K, and name[k][2x + h] holds K row 2k + h (vdpbf16ps
    takes two consecutive K of one column as one 32-bit lane)."""
    name: str
    value: str                          # the SSA value stored
    dtype: str                          # storage dtype
    k_var: str
    k_extent: int
    x_var: str | None                   # the M or N axis; None for a vector operand
    x_extent: int
    origin: str                         # "m0" | "n0"
    body: Body
    bounds: Expr | None
    fast: str
    stride: int
    pairs: bool = False


@dataclass(frozen=True)
class Sync(Operands):
    """A block barrier: every thread is done with the staged tiles before they are refilled."""


@dataclass(frozen=True)
class MicroTiles(Operands):
    """Run `body` for each register tile of the block along M in turn (a serial MatmulTile):
    `tiles` of them, m0 rebound to each one's first row. Statements before it (the packed
    N-side panel) run once per block. `tail`, when M is no multiple of the register tile, is
    the body guarded at the edge of M, run instead by the tile that overhangs it (so full
    tiles test nothing)."""
    tiles: int
    body: Body
    tail: Body = ()
    k_chunk: int = 0        # > 0: the K loops run k_chunk at a time over all the block's tiles,
                            # their sums kept in a block scratch (a dot-form tile's N-side rows
                            # stay in L1 across its tiles), the epilogues after the last chunk


@dataclass(frozen=True)
class MmaTile:
    """The block tile of a tensor-core contraction (mode "mma"): a block of WARPS_M x WARPS_N
    warps computes a tile_m x tile_n tile of the output at (m0, n0); each warp a
    (tile_m / warps_m) x (tile_n / warps_n) piece of m16n8k16 tiles, its accumulators in
    registers in the PTX C-fragment layout. K advances tile_k at a time through shared memory.
    `m` is None for a vector M-side operand (one row). `swizzle` is how the shared tiles are
    laid out: "none", "pad" (rows padded by 16 bytes) or "xor" (16-byte chunks XOR-permuted)."""
    m: str | None
    n: str
    tile_m: int
    tile_n: int
    tile_k: int
    warps_m: int
    warps_n: int
    dtype: str                          # f16 | bf16: the operands in shared memory
    swizzle: str = "none"

    @property
    def warp_m(self) -> int:
        return self.tile_m // self.warps_m

    @property
    def warp_n(self) -> int:
        return self.tile_n // self.warps_n


@dataclass(frozen=True)
class MmaOperand:
    """One operand of a tensor-core K loop: `value` (computed by the Loop IR statements `body`,
    prologue included, with the K axis and `x_var`, its M or N axis, bound) staged per K step as
    a shared tile, rows along X with K contiguous (`kmajor`) or rows along K. `fill` says how:
    "ld.st" (plain loads, the prologue, st.shared) or "cp.async" (16-byte asynchronous copies,
    zero-filled outside the matrix)."""
    side: str                           # "A" (M side) | "B" (N side)
    value: str
    x_var: str | None
    x_extent: int                       # the M or N extent (1 for a vector operand)
    body: tuple
    kmajor: bool
    fill: str = "ld.st"


@dataclass(frozen=True)
class MmaLoop(Operands):
    """acc = sum over k_var < extent of a * b on tensor cores, tile_k at a time, with `stages`
    shared buffers in flight (a software pipeline when stages > 1)."""
    acc: AccInit
    k_var: str
    extent: int
    a: MmaOperand
    b: MmaOperand
    stages: int = 1


class Mode(str, Enum):
    """How a kernel's domain maps onto the GPU (a str, so it prints and compares as its value)."""
    ROWS = "rows"                       # one group of threads per row
    ELEMENTWISE = "elementwise"         # one thread per `vec` elements
    MATMUL = "matmul"                   # a CUDA-core contraction tile (MatmulTile)
    MMA = "mma"                         # mma.sync tensor cores (MmaTile)
    WGMMA = "wgmma"                     # Hopper wgmma + TMA (MmaTile)
    ATTENTION = "attention"             # a fused flash attention (tile/attention.py)
    CUSTOM = "custom"                   # a hand-written kernel (st.custom_op), run as written


CONTRACTION_MODES = (Mode.MATMUL, Mode.MMA, Mode.WGMMA)


class TileVerifyError(Exception):
    pass

    def bodies(self) -> tuple:
        return (self.a.body, self.b.body)

    def map_bodies(self, fn) -> "MmaLoop":
        return replace(self, a=replace(self.a, body=fn(self.a.body)),
                       b=replace(self.b, body=fn(self.b.body)))


@dataclass(frozen=True)
class TileKernel:
    name: str
    mode: Mode                          # a Mode, or its value (converted)
    domain: tuple[tuple[str, int], ...] # outer loop vars and extents, outermost first
    prelude: tuple                      # statements before the parallel domain
    body: tuple                         # statements run per row / per element
    block: int = 1
    group: int = 1                      # threads per row (rows mode)
    vec: int = 1                        # elements per thread (elementwise mode)
    knobs: tuple[tuple[str, object], ...] = ()
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    buffers: tuple = ()                 # BufferInfo of every buffer the kernel touches
    matmul: MatmulTile | None = None    # the block tile (mode "matmul")
    attention: object = None            # the schedule of a fused attention (tile/attention.py)
    src: str = field(default="", compare=False)

    def __post_init__(self):
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            raise TileVerifyError(f"{self.name}: unknown mode {self.mode!r}") from None

    def shape_of(self, buf: str) -> tuple[int, ...]:
        return next(b.shape for b in self.buffers if b.name == buf)

    def dtype_of(self, buf: str) -> str:
        return next(b.dtype for b in self.buffers if b.name == buf)

    @property
    def rows(self) -> int:
        return prod(e for _, e in self.domain)

    @property
    def batch(self) -> tuple[tuple[str, int], ...]:
        """Domain axes fixed per block of a contraction (all but M and N)."""
        mt = self.matmul
        return tuple((v, e) for v, e in self.domain if v not in (mt.m, mt.n))

    def extent(self, var: str | None) -> int:
        return dict(self.domain).get(var, 1)

    @property
    def grid(self) -> int:
        if self.mode == "attention":
            return self.attention.grid
        if self.mode in ("matmul", "mma", "wgmma"):
            mt = self.matmul
            return prod(e for _, e in self.batch) * -(-self.extent(mt.m) // mt.tile_m) \
                * -(-self.extent(mt.n) // mt.tile_n)
        if self.mode == "rows":
            per_block = max(1, self.block // self.group)
            return -(-self.rows // per_block)
        return -(-self.rows // (self.block * self.vec))

    def with_knob(self, name: str, value) -> "TileKernel":
        knobs = dict(self.knobs)
        knobs[name] = value
        return replace(self, knobs=tuple(sorted(knobs.items())))

    def __str__(self) -> str:
        return format_kernel(self)


@dataclass
class TileProgram:
    kernels: list[TileKernel]
    loop_program: object                # the LoopProgram (buffers, outputs, weights)
    origin: dict = field(default_factory=dict)      # kernel name -> the loop kernel it came from

    def __str__(self) -> str:       # kernels no pass has scheduled yet print as Loop IR
        return "\n\n".join(format_kernel(k) if isinstance(k, TileKernel) else format_loop_kernel(k)
                           for k in self.kernels)


NESTED = (Loop, StridedLoop, Points, Guard, StageTile, MicroTiles)     # statements holding a body


def walk(body):
    """Every statement, nested ones included (an MmaLoop's operand bodies too)."""
    for s in body:
        yield s
        for inner in s.bodies():
            yield from walk(inner)


def map_body(body, fn):
    """Rebuild a body bottom-up, replacing each statement s by fn(s) (a statement or a tuple)."""
    out = []
    for s in body:
        r = fn(s.map_bodies(lambda inner: map_body(inner, fn)))
        out.extend(r if isinstance(r, tuple) else (r,))
    return tuple(out)


# ---------------------------------------------------------------- verification

STATEMENTS = NESTED + (Combine, Stage, Scratch, Registers, Sync, MmaLoop, Load, Let, Accum, Store, CustomCall)


def verify_kernel(k: TileKernel, target) -> None:
    """What every pass must leave true of a kernel (run after each one): known statements only,
    loads and stores of buffers the kernel declares or stages, registered knobs, and a schedule
    the target can launch (block size, group, tile shapes)."""

    def fail(why: str):
        raise TileVerifyError(f"{k.name} ({k.mode.value}): {why}")
    names = {b.name for b in k.buffers}
    if not set(k.reads + k.writes) <= names:
        fail(f"reads/writes {sorted(set(k.reads + k.writes) - names)} are not among its buffers")
    staged = set()
    for s in walk(k.prelude + k.body):
        if not isinstance(s, STATEMENTS):
            fail(f"unknown statement {type(s).__name__}")
        if isinstance(s, (Stage, StageTile, Scratch)):
            staged.add(s.name)
        if isinstance(s, Scratch) and k.block != 1:
            fail(f"scratch array {s.name} in a block of {k.block} threads (it is one thread's)")
        if isinstance(s, (Load, Store)) and s.buf not in names | staged:
            fail(f"{type(s).__name__.lower()} of {s.buf}, which is neither a buffer nor staged")
        if isinstance(s, StridedLoop) and k.mode is Mode.ROWS and s.step != k.group \
                and not s.block_wide:
            fail(f"strided loop {s.var} steps by {s.step}, its group has {k.group} threads")
    knobs = [n for n, _ in k.knobs]
    if knobs != sorted(set(knobs)) or not set(knobs) <= set(KNOBS):
        fail(f"knobs {knobs} are not unique, sorted and registered")
    if k.block > 1:
        if k.block > 1024:
            fail(f"block of {k.block} threads (at most 1024)")
        if k.mode in (Mode.ROWS, Mode.ELEMENTWISE) and k.block % target.warp_size:
            fail(f"block of {k.block} threads is not a multiple of the warp ({target.warp_size})")
        if k.mode is Mode.ROWS and k.block % k.group:
            fail(f"group of {k.group} threads does not divide the block of {k.block}")
    if k.mode in CONTRACTION_MODES:
        mt = k.matmul
        if mt is None:
            fail("a contraction without its block tile")
        if isinstance(mt, MatmulTile) and (mt.tile_m % mt.thread_m or mt.tile_n % mt.thread_n):
            fail(f"{mt.thread_m}x{mt.thread_n} points per thread do not divide the "
                 f"{mt.tile_m}x{mt.tile_n} tile")
        if isinstance(mt, MatmulTile) and mt.serial and (k.block != 1 or mt.tile_n != mt.thread_n):
            fail("a serial tile runs one thread per block, its register tile as wide as the block's")
        if isinstance(mt, MmaTile) and (mt.tile_m % (16 * mt.warps_m) or mt.tile_n % (8 * mt.warps_n)):
            fail(f"{mt.warps_m}x{mt.warps_n} warps do not tile {mt.tile_m}x{mt.tile_n} in m16n8 pieces")
    if k.mode is Mode.ATTENTION and k.attention is None:
        fail("an attention kernel without its schedule")


def verify_kernels(kernels, target) -> None:
    """verify_kernel on each Tile IR kernel (those a pass has not reached yet are Loop IR)."""
    for k in kernels:
        if isinstance(k, TileKernel):
            verify_kernel(k, target)


# ---------------------------------------------------------------- printing

def _format(body, depth: int, out: list[str], mt: MatmulTile | None = None) -> None:
    pad = "    " * depth
    for s in body:
        if isinstance(s, StridedLoop):
            tag = (", unroll" if s.unroll else "") + (f", vec={s.vec}" if s.vec > 1 else "")
            t = "tid" if s.block_wide else "t"
            start = f"{t} * {s.vec}" if s.vec > 1 else t
            out.append(f"{pad}StridedLoop({s.var} = {start}; < {s.extent}; += {s.step * s.vec}):  "
                       f"# {s.kind}{tag}")
            _format(s.body, depth + 1, out, mt)
        elif isinstance(s, Loop):
            out.append(f"{pad}for {s.var} in 0..{s.extent}:  # {s.kind}" + (", unroll" if s.unroll else ""))
            _format(s.body, depth + 1, out, mt)
        elif isinstance(s, Combine):
            extra = f"threads={s.threads}" + (", block" if s.block_wide else "")
            out.append(f"{pad}{_accs(s.accs, 'Combine', extra)}")
        elif isinstance(s, Stage):
            tag = f", vec={s.vec}" if s.vec > 1 else ""
            out.append(f"{pad}{s.name} = Stage({s.buf}, origin={to_str(s.base)}, slab={s.size}{tag})")
        elif isinstance(s, Scratch):
            out.append(f"{pad}{s.name} = Scratch({s.dtype}[{s.size}])")
        elif isinstance(s, Points):
            out.append(f"{pad}Points({_bindings(mt)}{', registers' if s.registers else ''}):")
            _format(s.body, depth + 1, out, mt)
        elif isinstance(s, Registers):
            out.append(f"{pad}{_accs(s.accs, 'Registers', f'{mt.thread_m}x{mt.thread_n}')}")
        elif isinstance(s, Guard):
            out.append(f"{pad}if {to_str(s.cond)}:")
            _format(s.body, depth + 1, out, mt)
        elif isinstance(s, StageTile):
            x = f"{s.x_var} - {s.origin}" if s.x_var else "0"
            tag = f", 0 unless {to_str(s.bounds)}" if s.bounds is not None else ""
            out.append(f"{pad}{s.name} = StageTile({s.value}[{s.k_var}:{s.k_extent}, {x}:{s.x_extent}], "
                       f"stride={s.stride}, {s.fast} fastest{tag}{', K pairs' if s.pairs else ''}):")
            _format(s.body, depth + 1, out, mt)
        elif isinstance(s, Sync):
            out.append(f"{pad}Sync")
        elif isinstance(s, MicroTiles):
            chunk = f", K {s.k_chunk} at a time" if s.k_chunk else ""
            out.append(f"{pad}for m0 in block_m0 + {mt.thread_m} * 0..{s.tiles}:  # register tiles, in turn{chunk}")
            _format(s.body, depth + 1, out, mt)
            if s.tail:
                out.append(f"{pad}    tail (the tile past the edge of M):")
                _format(s.tail, depth + 2, out, mt)
        else:
            format_stmt(s, depth, out)


def _bindings(mt: MatmulTile) -> str:
    if mt.serial:
        binds = ", ".join(f"{a} = {o} + {p}" for a, o, p in ((mt.m, "m0", "i"), (mt.n, "n0", "j")) if a)
        return f"{binds}; {mt.thread_m}x{mt.thread_n}"
    axes = [(mt.m, "m0 + tm", mt.threads_m, "i"), (mt.n, "n0 + tn", mt.threads_n, "j")]
    binds = ", ".join(f"{a} = {base} + {step} * {p}" for a, base, step, p in axes if a)
    return f"{binds}; {mt.thread_m}x{mt.thread_n}"


def _accs(accs, node: str, extra: str) -> str:
    """ "acc0, acc1 = Node(acc0:sum, acc1:max, extra)": how Combine and Registers print."""
    names = ", ".join(a.acc for a in accs)
    return f"{names} = {node}({', '.join(f'{a.acc}:{a.op}' for a in accs)}, {extra})"


def format_kernel(k: TileKernel) -> str:
    knobs = ", ".join(f"{n}={v}" for n, v in k.knobs)
    out = [f"kernel {k.name}" + (f"  # {knobs}" if knobs else "")]
    _format(k.prelude, 0, out)
    if k.mode == "attention":       # its schedule, tile/attention.py's, prints itself
        k.attention.format(k, out)
        return "\n".join(out)
    if k.mode in ("mma", "wgmma"):
        _format_mma(k, out)
        return "\n".join(out)
    if k.mode == "matmul":
        mt = k.matmul
        tags = {mt.m: "=M", mt.n: "=N"}
        axes = ", ".join(f"{v}:{e}{tags.get(v, '')}" for v, e in k.domain)
        out.append(f"Tile(matmul=({axes}) = {mt.tile_m}x{mt.tile_n}/BLOCK, "
                   f"t:{mt.threads_m}x{mt.threads_n}=THREAD, grid={k.grid}, block={k.block}):")
        _format(k.body, 1, out, mt)
        return "\n".join(out)
    axes = ", ".join(f"{v}:{e}" for v, e in k.domain) or "()"
    if k.mode == "custom":
        out.append("Tile(custom: grid and block as its @strata.kernel launches it):")
        _format(k.body, 1, out)
        return "\n".join(out)
    if k.mode == "rows":
        if k.group == k.block:
            sched = f"rows=({axes})=BLOCK, t:{k.group}=THREAD"
        else:
            sched = f"rows=({axes}) = {k.block // k.group}/BLOCK, t:{k.group}=THREAD"
    else:
        sched = f"elements=({axes}) = {k.block}x{k.vec}/BLOCK"
    out.append(f"Tile({sched}, grid={k.grid}, block={k.block}):")
    _format(k.body, 1, out)
    return "\n".join(out)


def _format_mma(k: TileKernel, out: list[str]) -> None:
    mt = k.matmul
    tags = {mt.m: "=M", mt.n: "=N"}
    axes = ", ".join(f"{v}:{e}{tags.get(v, '')}" for v, e in k.domain)
    if k.mode == "wgmma":       # warps_m = tile_m / 16: 4 warps per warpgroup of 64 rows
        out.append(f"Tile(wgmma=({axes}) = {mt.tile_m}x{mt.tile_n}/BLOCK, warpgroups:"
                   f"{mt.tile_m // 64} of 64x{mt.tile_n} = m64n{mt.tile_n}k16.{mt.dtype}, "
                   f"grid={k.grid}, block={k.block}):")
    else:
        out.append(f"Tile(mma=({axes}) = {mt.tile_m}x{mt.tile_n}/BLOCK, warps:{mt.warps_m}x{mt.warps_n} "
                   f"of {mt.warp_m}x{mt.warp_n} = {mt.warp_m // 16}x{mt.warp_n // 8} m16n8k16.{mt.dtype}, "
                   f"grid={k.grid}, block={k.block}):")
    for s in k.body:
        if not isinstance(s, MmaLoop):
            _format((s,), 1, out)
            continue
        out.append(f"    {s.acc.acc} = MmaLoop({s.acc.acc}:{s.acc.op}, {s.k_var} in 0..{s.extent} by "
                   f"{mt.tile_k}, stages={s.stages}, smem={mt.swizzle}):")
        for op in (s.a, s.b):
            x = f"{op.x_var} - {'m0' if op.side == 'A' else 'n0'}" if op.x_var else "0"
            rows, cols = ((x, s.k_var), "K") if op.kmajor else ((s.k_var, x), "X")
            out.append(f"        {op.side} = {op.value}[{rows[0]}, {rows[1]}]  # {cols} contiguous, "
                       f"fill={op.fill}")
            _format(op.body, 3, out)


def subst_body(body, mapping: dict, bounds: dict | None = None):
    """Substitute variables (name -> Expr) in every statement of a body."""
    return map_body(body, lambda s: s.map_exprs(lambda e: substitute(e, mapping, bounds)))


def rename_stmt(s, names: dict):
    """A Loop IR statement with variables (read or defined) renamed, dtypes kept."""
    def r(e):
        return None if e is None else rename(e, names)
    if isinstance(s, Load):
        return Load(names.get(s.var, s.var), s.buf, tuple(map(r, s.index)), s.dtype, r(s.pred))
    if isinstance(s, Let):
        return Let(names.get(s.var, s.var), r(s.value))
    if isinstance(s, Accum):
        return replace(s, acc=names.get(s.acc, s.acc), value=r(s.value), index=r(s.index))
    if isinstance(s, Store):
        return Store(s.buf, tuple(map(r, s.index)), r(s.value))
    raise TypeError(f"cannot rename in {s!r}")


def flat_index(index: tuple, shape: tuple) -> Expr:
    """Row-major flat offset of a multi-dimensional index into a contiguous buffer."""
    out: Expr = Const(0)
    stride = 1
    for e, n in reversed(list(zip(index, shape))):
        out = add(out, mul(e, stride))
        stride *= n
    return out
