"""Kernel IR: a GPU's or a CPU's kernel (cpu_ir.py) as its primitives, whatever the language.

Values are per-thread scalars in their *compute* type (f32 for f16/bf16 data, i64/i32, bool):
a `Load` from an f16 buffer yields f32 and a `Store` of f32 into a bf16 buffer rounds to
nearest-even. Shared memory is declared with `Smem`; `Sync` is a block barrier; `ShflXor` and
`ShflIdx` exchange a value within a warp of 32 (all lanes must take part). Tensor cores and
asynchronous copies (sm_80+) are `LdMatrix`, `Mma` and `CpAsync`/`CpAsyncCommit`/`CpAsyncWait`,
with the PTX ISA's fragment layouts and group semantics; on sm_90a, `TmaLoad` (from a
tensor-map `Param`), the `Mbar*` mbarrier statements and `Wgmma` (with `WgmmaDesc` descriptors)
and its fence/commit/wait. Launches are 1-D: `grid` blocks of `block` threads (a CPU's block
is one thread). The emitters (`codegen/`) and the simulator (`kernel_ir/sim.py`) are each one
walk over these nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from ..core import dtypes
from ..core.expr import Const, Expr, to_str
from ..core.operands import BufName, Operands
from ..core.targets import DYNAMIC_SMEM_ALIGN


LANGUAGES = ("cuda", "c", "opencl", "hip", "metal")     # what prints a node that says no other


def printed_in(*languages: str, what: str):
    """Only `languages` print this node; another's emitter refuses it, naming `what`."""
    def mark(cls):
        cls.languages, cls.what = languages, what
        return cls
    return mark


# ---------------------------------------------------------------- expressions
# Each defines children() / map_children() / to_text() so that expr.py's generic traversal,
# substitution and printing work on kernel expressions too.

@dataclass(frozen=True)
class ThreadIdx(Expr):
    dtype: str = "i32"

    def children(self):
        return ()

    def map_children(self, fn):
        return self

    def to_text(self, fmt):
        return "threadIdx.x"


@dataclass(frozen=True)
class BlockIdx(Expr):
    dtype: str = "i32"

    def children(self):
        return ()

    def map_children(self, fn):
        return self

    def to_text(self, fmt):
        return "blockIdx.x"


@dataclass(frozen=True)
class Load(Expr):
    """buf[index] from a global parameter or a shared array; dtype is the compute dtype."""
    buf: str
    index: Expr
    dtype: str

    def children(self):
        return (self.index,)

    def map_children(self, fn):
        return Load(self.buf, fn(self.index), self.dtype)

    def to_text(self, fmt):
        return f"{self.buf}[{fmt(self.index)}]"


@printed_in("cuda", "hip", "metal", what="a warp shuffle")
@dataclass(frozen=True)
class ShflXor(Expr):
    """__shfl_xor_sync(0xffffffff, value, mask): the value of lane (lane ^ mask)."""
    value: Expr
    mask: int
    dtype: str

    def children(self):
        return (self.value,)

    def map_children(self, fn):
        return ShflXor(fn(self.value), self.mask, self.dtype)

    def to_text(self, fmt):
        return f"shfl_xor({fmt(self.value)}, {self.mask})"


@printed_in("cuda", "hip", "metal", what="a warp shuffle")
@dataclass(frozen=True)
class ShflIdx(Expr):
    """__shfl_sync(0xffffffff, value, lane): the value of `lane` in this warp."""
    value: Expr
    lane: Expr
    dtype: str

    def children(self):
        return (self.value, self.lane)

    def map_children(self, fn):
        return ShflIdx(fn(self.value), fn(self.lane), self.dtype)

    def to_text(self, fmt):
        return f"shfl({fmt(self.value)}, {fmt(self.lane)})"


# ---------------------------------------------------------------- statements

class Stmt(Operands):
    """A statement: its operands (exprs(), bodies(), buffers() and their map_*) follow from its
    fields' declared types (operands.py); `to_text(fmt)` is its printed line, as for an Expr."""
    languages, what = LANGUAGES, "a statement"

    def to_text(self, fmt) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class Let(Stmt):
    """Declare `var` of `dtype` (a compute dtype) initialised to `value`."""
    var: str
    dtype: str
    value: Expr

    def to_text(self, fmt):
        return f"{self.var} = {fmt(self.value)}  : {self.dtype}"


@dataclass(frozen=True)
class Assign(Stmt):
    var: str
    value: Expr

    def to_text(self, fmt):
        return f"{self.var} <- {fmt(self.value)}"


@dataclass(frozen=True)
class Store(Stmt):
    """buf[index] = value, converting value to the buffer's storage dtype."""
    buf: BufName
    index: Expr
    value: Expr

    def to_text(self, fmt):
        return f"{self.buf}[{fmt(self.index)}] = {fmt(self.value)}"


@dataclass(frozen=True)
class LoadVec(Stmt):
    """Declare vars[k] = buf[index + k] for k < len(vars) as one aligned vector access.

    `index` must be a multiple of len(vars) (the simulator checks it); len(vars) * itemsize is
    at most 16 bytes."""
    vars: tuple[str, ...]
    buf: BufName
    index: Expr
    dtype: str                    # compute dtype of the declared vars

    def to_text(self, fmt):
        return f"{', '.join(self.vars)} = load.v{len(self.vars)} {self.buf}[{fmt(self.index)}]"


@dataclass(frozen=True)
class StoreVec(Stmt):
    """buf[index + k] = values[k] as one aligned vector access (index % len(values) == 0)."""
    buf: BufName
    index: Expr
    values: tuple[Expr, ...]

    def to_text(self, fmt):
        return (f"{self.buf}[{fmt(self.index)}] = store.v{len(self.values)} "
                f"({', '.join(fmt(v) for v in self.values)})")


@dataclass(frozen=True)
class For(Stmt):
    """for (var = start; var < stop; var += step) body; start/stop may differ per thread."""
    var: str
    start: Expr
    stop: Expr
    step: int
    body: tuple[Stmt, ...]
    unroll: bool = False
    dtype: str = "i32"

    @property
    def trip_count(self) -> int | None:
        """Iterations when start and stop are constants (None otherwise)."""
        if isinstance(self.start, Const) and isinstance(self.stop, Const) and self.step > 0:
            return max(0, -(-(int(self.stop.value) - int(self.start.value)) // self.step))
        return None

    def to_text(self, fmt):
        return (f"for {self.var} = {fmt(self.start)}; < {fmt(self.stop)}; += {self.step}:"
                + ("  # unroll" if self.unroll else ""))


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()

    def to_text(self, fmt):
        return f"if {fmt(self.cond)}:"


@dataclass(frozen=True)
class While(Stmt):
    """while (cond) body; the condition may differ per thread."""
    cond: Expr
    body: tuple[Stmt, ...]

    def to_text(self, fmt):
        return f"while {fmt(self.cond)}:"


ATOMIC_OPS = ("add", "max", "min")


@dataclass(frozen=True)
class Atomic(Stmt):
    """buf[index] = op(buf[index], value) as one indivisible update (atomicAdd/Max/Min): threads
    may update one element in one launch. f32 and i32/i64 buffers, global or shared."""
    op: str
    buf: BufName
    index: Expr
    value: Expr

    def to_text(self, fmt):
        return f"atomic.{self.op} {self.buf}[{fmt(self.index)}], {fmt(self.value)}"


@dataclass(frozen=True)
class Sync(Stmt):
    """__syncthreads(): every thread of the block must reach it (no divergence)."""


@dataclass(frozen=True)
class Smem(Stmt):
    """A shared-memory array of `size` elements of storage dtype `dtype`, one per block.
    dynamic: carved from the kernel's dynamic shared memory (`extern __shared__`, each array
    1024-byte aligned, Kernel.dynamic_smem_bytes passed at launch), which may exceed the 48 KB
    of static shared memory up to MAX_DYNAMIC_SMEM_BYTES."""
    name: str
    dtype: str
    size: int
    dynamic: bool = False

    def to_text(self, fmt):
        return f"Smem {self.name}[{self.size}] {self.dtype}" + (" dynamic" if self.dynamic else "")


@dataclass(frozen=True)
class Comment(Stmt):
    text: str

    def to_text(self, fmt):
        return f"# {self.text}"


# Tensor cores and asynchronous copies (sm_80+). The layouts are the PTX ISA's; the simulator's
# sim_mma.py and sim_async.py spell them out. A fragment *register* is an i32 variable holding
# the raw 32 bits of two 16-bit elements, the lower-numbered element in the low half.

@printed_in("cuda", what="ldmatrix")
@dataclass(frozen=True)
class LdMatrix(Stmt):
    """ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16: the warp loads len(vars) 8x8
    matrices of 16-bit elements from shared `buf` and declares `vars` (i32 registers).

    `row` is, in lane 8*i + r, the element index of row r of matrix i (8 contiguous elements,
    16-byte aligned); lanes from 8*len(vars) on are ignored. Register i of lane L then holds
    elements (L // 4, 2 * (L % 4) + {0, 1}) of matrix i, or with `trans` elements
    (2 * (L % 4) + {0, 1}, L // 4). All 32 lanes of the warp must execute it."""
    vars: tuple[str, ...]
    buf: BufName
    row: Expr
    trans: bool = False

    def to_text(self, fmt):
        return (f"{', '.join(self.vars)} = ldmatrix.x{len(self.vars)}{'.trans' if self.trans else ''} "
                f"{self.buf}[{fmt(self.row)}]  : i32")


@printed_in("cuda", what="a register of two 16-bit values (an mma operand)")
@dataclass(frozen=True)
class PackHalf2(Stmt):
    """Declare `var`, an i32 register holding `lo` and `hi` rounded to `dtype` (f16 or bf16),
    lo in its low half: an mma A operand made in registers from f32 values (FlashAttention's P
    from the scores' accumulator fragments) instead of through shared memory and ldmatrix."""
    var: str
    lo: Expr
    hi: Expr
    dtype: str

    def to_text(self, fmt):
        return f"{self.var} = pack.{self.dtype}x2({fmt(self.lo)}, {fmt(self.hi)})  : i32"


@printed_in("cuda", what="a tensor-core mma")
@dataclass(frozen=True)
class Mma(Stmt):
    """mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32: per warp D = A @ B + C with
    A 16x16, B 16x8 in `dtype` (f16 or bf16) and C, D 16x8 in f32.

    `a`: 4 i32 registers, `b`: 2 i32 registers, `c`: 4 f32 variables, `d`: 4 declared f32
    variables that are assigned (d == c accumulates in place). All 32 lanes must execute it."""
    d: tuple[str, ...]
    a: tuple[str, ...]
    b: tuple[str, ...]
    c: tuple[str, ...]
    dtype: str

    def to_text(self, fmt):
        return (f"{', '.join(self.d)} <- mma.m16n8k16.{self.dtype} a=({', '.join(self.a)}) "
                f"b=({', '.join(self.b)}) c=({', '.join(self.c)})")


@printed_in("cuda", what="an asynchronous copy (cp.async)")
@dataclass(frozen=True)
class CpAsync(Stmt):
    """cp.async.{cache}.shared.global: copy `nbytes` (4, 8 or 16) from global
    src[src_index ...] to shared dst[dst_index ...], both aligned to nbytes, same dtype.

    Only `src_bytes` bytes are read (None: all) and the rest is zero-filled, so a predicated
    copy is `src_bytes = where(ok, nbytes, 0)`. The copy belongs to the group closed by the
    thread's next CpAsyncCommit and lands when a CpAsyncWait completes that group; other threads
    see it after a Sync that follows the wait. cache "cg" (L2 only) needs nbytes == 16."""
    dst: BufName
    dst_index: Expr
    src: BufName
    src_index: Expr
    nbytes: int
    src_bytes: Expr | None = None
    cache: str = "ca"

    def to_text(self, fmt):
        return (f"{self.dst}[{fmt(self.dst_index)}] <- cp.async.{self.cache}.{self.nbytes} "
                f"{self.src}[{fmt(self.src_index)}]"
                + ("" if self.src_bytes is None else f", src_bytes={fmt(self.src_bytes)}"))


@printed_in("cuda", what="cp.async.commit_group")
@dataclass(frozen=True)
class CpAsyncCommit(Stmt):
    """cp.async.commit_group: close this thread's uncommitted copies into one group."""

    def to_text(self, fmt):
        return "cp.async.commit_group"


@printed_in("cuda", what="cp.async.wait_group")
@dataclass(frozen=True)
class CpAsyncWait(Stmt):
    """cp.async.wait_group pending: wait until at most `pending` of this thread's most recent
    groups are still in flight (uncommitted copies are not waited for)."""
    pending: int = 0

    def to_text(self, fmt):
        return f"cp.async.wait_group {self.pending}"


@printed_in("cuda", what="an L2 prefetch (cp.async.bulk.prefetch, sm_90+)")
@dataclass(frozen=True)
class PrefetchL2(Stmt):
    """cp.async.bulk.prefetch.L2.global: thread 0 of the block asks L2 for `nbytes` (a multiple of
    16) of global buf from element `index` (16-byte aligned); a hint, no value changes. The ones
    heading a kernel's body run before it waits for the kernel before it (programmatic dependent
    launch), so they may read only what no kernel of the program writes (prefetch_weights.py)."""
    buf: BufName
    index: Expr
    nbytes: int

    def to_text(self, fmt):
        return f"prefetch.L2 {self.buf}[{fmt(self.index)}], {self.nbytes} bytes"


# Hopper (sm_90a): TMA, mbarrier and wgmma. The simulator's sim_tma.py and sim_wgmma.py spell out
# the semantics. An mbarrier is one element of a shared array of dtype i64 that only Mbar* and
# TmaLoad statements touch; `parity` is the phase parity (0 or 1) that try_wait.parity takes.

SWIZZLES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}     # descriptor layout-type codes
SWIZZLE_BYTES = {"none": 0, "32B": 32, "64B": 64, "128B": 128}


@dataclass(frozen=True)
class TensorMap:
    """What a CUtensorMap (cuTensorMapEncodeTiled, tiled mode) describes over its global buffer.

    dims: elements per dimension, innermost (contiguous) first, as the CUDA API takes them;
    strides: bytes between consecutive indices of dims[1:] (multiples of 16); box: the tile one
    TMA copies, innermost first (each <= 256); swizzle: how the box is laid out in shared memory
    ("none", "32B", "64B", "128B": 16-byte chunks XORed with the row within 8). Elements outside
    dims read as zero."""
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: str = "none"

    @property
    def box_elems(self) -> int:
        return prod(self.box)


@printed_in("cuda", what="a wgmma descriptor")
@dataclass(frozen=True)
class WgmmaDesc(Expr):
    """The 64-bit wgmma matrix descriptor of shared `buf` at element `index`: start address >> 4
    (bits 0-13), leading byte offset >> 4 (16-29), stride byte offset >> 4 (32-45), swizzle mode
    (62-63: 0 none, 1 128B, 2 64B, 3 32B). An i64 value: adding j moves the start by 16 * j bytes."""
    buf: str
    index: Expr
    lbo: int
    sbo: int
    swizzle: str = "128B"
    dtype: str = "i64"

    def children(self):
        return (self.index,)

    def map_children(self, fn):
        return WgmmaDesc(self.buf, fn(self.index), self.lbo, self.sbo, self.swizzle)

    def to_text(self, fmt):
        return f"desc({self.buf}[{fmt(self.index)}], lbo={self.lbo}, sbo={self.sbo}, {self.swizzle})"


@printed_in("cuda", what="a wgmma")
@dataclass(frozen=True)
class Wgmma(Stmt):
    """wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{dtype}.{dtype}: per warpgroup (128 threads,
    warps 4w..4w+3) D = A @ B.T + (D if scale_d else 0), A 64 x k and B n x k (k = 32 bytes of
    K: 16 for f16/bf16, 32 for FP8 e4m3/e5m2), both K-major in shared memory through the
    descriptors `a` and `b` (i64 expressions), D 64 x n in f32.
    trans_a / trans_b: PTX imm-trans-a / imm-trans-b (f16/bf16 only): 1 reads that operand
    MN-major (M- or N-contiguous; sim_wgmma.py gives the layout) instead of K-major.

    `d`: n/2 declared f32 variables, read and written; thread T holds d[i] at row
    16 * (T % 128 // 32) + T % 32 // 4 + 8 * (i // 2 % 2), col 8 * (i // 4) + 2 * (T % 4) + i % 2.
    `a_regs` (16-bit types): A from four i32 registers a thread instead of a descriptor (`a`
    None): warp w of the warpgroup holds rows 16w .. 16w + 15 as mma.m16n8k16's A fragment.
    Asynchronous: d may be read only after a WgmmaWait that completes its group, d and a_regs
    written by other statements need a WgmmaFence before the wgmma, and a_regs may not be written
    before its group completes. All 128 threads must execute it."""
    d: tuple[str, ...]
    a: Expr | None
    b: Expr
    n: int
    dtype: str = "bf16"
    scale_d: Expr | None = None       # None: always accumulate (PTX scale-d = 1)
    trans_a: bool = False             # A is M-major (imm-trans-a = 1)
    trans_b: bool = False             # B is N-major (imm-trans-b = 1)
    a_regs: tuple[str, ...] = ()      # A's fragment registers (then `a` is None)

    @property
    def k(self) -> int:
        return 32 // dtypes.ITEMSIZE[self.dtype]

    def to_text(self, fmt):
        d = ", ".join(self.d) if len(self.d) <= 4 else f"{self.d[0]}..{self.d[-1]}"
        scale = "" if self.scale_d is None else f" scale_d={fmt(self.scale_d)}"
        trans = "".join(f" trans_{x}" for x in "ab" if getattr(self, f"trans_{x}"))
        a = f"regs({', '.join(self.a_regs)})" if self.a_regs else fmt(self.a)
        return f"{d} <- wgmma.m64n{self.n}k{self.k}.{self.dtype} a={a} b={fmt(self.b)}{scale}{trans}"


@printed_in("cuda", what="wgmma.fence")
@dataclass(frozen=True)
class WgmmaFence(Stmt):
    """wgmma.fence.sync.aligned: order earlier register (and shared) accesses before the wgmmas
    that follow."""

    def to_text(self, fmt):
        return "wgmma.fence"


@printed_in("cuda", what="wgmma.commit_group")
@dataclass(frozen=True)
class WgmmaCommit(Stmt):
    """wgmma.commit_group.sync.aligned: close this warpgroup's uncommitted wgmmas into a group."""

    def to_text(self, fmt):
        return "wgmma.commit_group"


@printed_in("cuda", what="wgmma.wait_group")
@dataclass(frozen=True)
class WgmmaWait(Stmt):
    """wgmma.wait_group.sync.aligned pending: wait until at most `pending` groups are in flight."""
    pending: int = 0

    def to_text(self, fmt):
        return f"wgmma.wait_group {self.pending}"


@printed_in("cuda", what="an mbarrier")
@dataclass(frozen=True)
class MbarInit(Stmt):
    """mbarrier.init.shared::cta.b64 [bar[index]], count: phase 0 expecting `count` arrivals."""
    bar: BufName
    index: Expr
    count: int

    def to_text(self, fmt):
        return f"mbarrier.init {self.bar}[{fmt(self.index)}], count={self.count}"


@printed_in("cuda", what="an mbarrier")
@dataclass(frozen=True)
class MbarArrive(Stmt):
    """mbarrier.arrive(.expect_tx).shared::cta.b64: one arrival on bar[index]; with tx_bytes, the
    phase also waits for that many bytes of asynchronous copies (TmaLoad) to complete."""
    bar: BufName
    index: Expr
    tx_bytes: int | None = None

    def to_text(self, fmt):
        return (f"mbarrier.arrive{'' if self.tx_bytes is None else f'.expect_tx {self.tx_bytes}'} "
                f"{self.bar}[{fmt(self.index)}]")


@printed_in("cuda", what="an mbarrier")
@dataclass(frozen=True)
class MbarTryWait(Stmt):
    """var = mbarrier.try_wait.parity.shared::cta.b64 [bar[index]], parity (declares bool var):
    true once the phase with that parity has completed; then this thread sees what it brought."""
    var: str
    bar: BufName
    index: Expr
    parity: Expr

    def to_text(self, fmt):
        return f"{self.var} = mbarrier.try_wait.parity {self.bar}[{fmt(self.index)}], {fmt(self.parity)}  : bool"


@printed_in("cuda", what="an mbarrier")
@dataclass(frozen=True)
class MbarWait(Stmt):
    """Spin on mbarrier.try_wait.parity until the phase with `parity` of bar[index] completes."""
    bar: BufName
    index: Expr
    parity: Expr

    def to_text(self, fmt):
        return f"mbarrier.wait.parity {self.bar}[{fmt(self.index)}], {fmt(self.parity)}"


@printed_in("cuda", what="a TMA load")
@dataclass(frozen=True)
class TmaLoad(Stmt):
    """cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes: copy the
    box of tensor-map parameter `tmap` at element coordinates `coords` (innermost first, may be
    out of bounds: zero-filled) into shared dst[dst_index ...] (128-byte aligned) with the map's
    swizzle; completes box bytes of transactions on mbarrier bar[bar_index]. Issued by one thread."""
    dst: BufName
    dst_index: Expr
    tmap: BufName
    coords: tuple[Expr, ...]
    bar: BufName
    bar_index: Expr

    def to_text(self, fmt):
        return (f"{self.dst}[{fmt(self.dst_index)}] <- tma.load {self.tmap}[{', '.join(fmt(c) for c in self.coords)}]"
                f" mbar={self.bar}[{fmt(self.bar_index)}]")


@printed_in("cuda", what="fence.proxy.async")
@dataclass(frozen=True)
class FenceProxyAsync(Stmt):
    """fence.proxy.async.shared::cta: make this thread's ordinary shared-memory writes visible to
    the async proxy (wgmma, TMA) before a barrier."""

    def to_text(self, fmt):
        return "fence.proxy.async"


HOPPER_STMTS = (Wgmma, WgmmaFence, WgmmaCommit, WgmmaWait, MbarInit, MbarArrive, MbarTryWait,
                MbarWait, TmaLoad, FenceProxyAsync)


# ---------------------------------------------------------------- kernels and programs

@dataclass(frozen=True)
class Param:
    name: str
    dtype: str        # storage dtype of the global buffer
    numel: int
    output: bool = False
    tensor_map: TensorMap | None = None   # passed as a CUtensorMap of the buffer (TmaLoad only)


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    grid: int
    block: int
    body: tuple[Stmt, ...]
    src: str = field(default="", compare=False)   # provenance: what it computes, user lines
    threads: int = 0            # CPU: threads running the blocks (0: the emitter decides by work)
    scalars: tuple[tuple[str, str], ...] = ()   # (name, dtype) of arguments passed by value,
                                                # read as Var(name, dtype) (@strata.kernel)
    knobs: tuple = ()           # the tile kernel's knobs (an emitter reads QDOT)

    def __str__(self) -> str:
        return format_kernel(self)

    @property
    def smem_bytes(self) -> int:
        return sum(s.size * dtypes.ITEMSIZE[s.dtype] for s in walk(self.body) if isinstance(s, Smem))

    @property
    def static_smem_bytes(self) -> int:
        return sum(s.size * dtypes.ITEMSIZE[s.dtype] for s in walk(self.body)
                   if isinstance(s, Smem) and not s.dynamic)

    @property
    def dynamic_smem_bytes(self) -> int:
        """sharedMemBytes of a launch: the dynamic arrays, each rounded up to DYNAMIC_SMEM_ALIGN,
        plus DYNAMIC_SMEM_ALIGN of slack to align the base (0 without dynamic arrays)."""
        sizes = [s.size * dtypes.ITEMSIZE[s.dtype] for s in walk(self.body)
                 if isinstance(s, Smem) and s.dynamic]
        if not sizes:
            return 0
        return DYNAMIC_SMEM_ALIGN + sum(-(-n // DYNAMIC_SMEM_ALIGN) * DYNAMIC_SMEM_ALIGN for n in sizes)


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str         # "input" | "weight" | "output" | "temp"

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass
class KernelProgram:
    buffers: list[Buffer]
    kernels: list[Kernel]         # launched in this order; Param names are Buffer names
    outputs: list[str]            # buffer names, in the program's output order
    twins: dict = field(default_factory=dict)   # kernel -> the kernel it is a renamed copy of
    once: tuple = ()              # kernels whose inputs are all weights (PACK=once: a packed
                                  # weight), which a runtime may run once when it loads the program

    def buffer(self, name: str) -> Buffer:
        return {b.name: b for b in self.buffers}[name]

    def __str__(self) -> str:
        return "\n\n".join(format_kernel(k) for k in self.kernels)


WARP = 32                # lanes of a shuffle and of mma.sync: the warp of every GPU target


def walk(body):
    """Every statement in a body, depth first."""
    for s in body:
        yield s
        for inner in s.bodies():
            yield from walk(inner)


# ---------------------------------------------------------------- printing

def format_expr(e: Expr) -> str:
    return to_str(e)


def _format_body(body, depth: int, out: list[str]) -> None:
    """Each statement's line, its bodies indented below it (a second one after `else:`)."""
    pad = "    " * depth
    for s in body:
        out.append(pad + s.to_text(format_expr))
        for i, inner in enumerate(s.bodies()):
            if i and inner:
                out.append(f"{pad}else:")
            _format_body(inner, depth + 1, out)


def _format_param(p: Param) -> str:
    if p.tensor_map is None:
        return f"{'out ' if p.output else ''}{p.name}: {p.dtype}[{p.numel}]"
    tm = p.tensor_map
    return (f"{p.name}: tensormap {p.dtype} dims={list(tm.dims)} strides={list(tm.strides)} "
            f"box={list(tm.box)} swizzle={tm.swizzle}")


def format_kernel(k: Kernel) -> str:
    params = ", ".join([_format_param(p) for p in k.params] + [f"{n}: {t}" for n, t in k.scalars])
    out = [f"kernel {k.name}({params})  grid={k.grid} block={k.block}"]
    _format_body(k.body, 1, out)
    return "\n".join(out)
