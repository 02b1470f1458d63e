"""Kernel IR: a GPU kernel as hardware primitives, independent of the source language.

Values are per-thread scalars in their *compute* type (f32 for f16/bf16 data, i64/i32, bool):
a `Load` from an f16 buffer yields f32 and a `Store` of f32 into a bf16 buffer rounds to
nearest-even. Shared memory is declared with `Smem`; `Sync` is a block barrier; `ShflXor` and
`ShflIdx` exchange a value within a warp of 32 (all lanes must take part). Tensor cores and
asynchronous copies (sm_80+) are `LdMatrix`, `Mma` and `CpAsync`/`CpAsyncCommit`/`CpAsyncWait`,
with the PTX ISA's fragment layouts and group semantics; on sm_90a, `TmaLoad` (from a
tensor-map `Param`), the `Mbar*` mbarrier statements and `Wgmma` (with `WgmmaDesc` descriptors)
and its fence/commit/wait. Launches are 1-D:
`grid` blocks of `block` threads. The CUDA emitter (`codegen/cuda.py`) and the simulator
(`kernel_ir/sim.py`) are both one walk over these nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from .. import dtypes
from ..targets import DYNAMIC_SMEM_ALIGN, GPUS, STATIC_SMEM_BYTES
from ..expr import Expr, Var, children, free_vars, to_str


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

class Stmt:
    pass


@dataclass(frozen=True)
class Let(Stmt):
    """Declare `var` of `dtype` (a compute dtype) initialised to `value`."""
    var: str
    dtype: str
    value: Expr


@dataclass(frozen=True)
class Assign(Stmt):
    var: str
    value: Expr


@dataclass(frozen=True)
class Store(Stmt):
    """buf[index] = value, converting value to the buffer's storage dtype."""
    buf: str
    index: Expr
    value: Expr


@dataclass(frozen=True)
class LoadVec(Stmt):
    """Declare vars[k] = buf[index + k] for k < len(vars) as one aligned vector access.

    `index` must be a multiple of len(vars) (the simulator checks it); len(vars) * itemsize is
    at most 16 bytes."""
    vars: tuple[str, ...]
    buf: str
    index: Expr
    dtype: str                    # compute dtype of the declared vars


@dataclass(frozen=True)
class StoreVec(Stmt):
    """buf[index + k] = values[k] as one aligned vector access (index % len(values) == 0)."""
    buf: str
    index: Expr
    values: tuple[Expr, ...]


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


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()


@dataclass(frozen=True)
class While(Stmt):
    """while (cond) body; the condition may differ per thread."""
    cond: Expr
    body: tuple[Stmt, ...]


ATOMIC_OPS = ("add", "max", "min")


@dataclass(frozen=True)
class Atomic(Stmt):
    """buf[index] = op(buf[index], value) as one indivisible update (atomicAdd/Max/Min): threads
    may update one element in one launch. f32 and i32/i64 buffers, global or shared."""
    op: str
    buf: str
    index: Expr
    value: Expr


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


@dataclass(frozen=True)
class Comment(Stmt):
    text: str


# Tensor cores and asynchronous copies (sm_80+). The layouts are the PTX ISA's; the simulator's
# sim_mma.py and sim_async.py spell them out. A fragment *register* is an i32 variable holding
# the raw 32 bits of two 16-bit elements, the lower-numbered element in the low half.

@dataclass(frozen=True)
class LdMatrix(Stmt):
    """ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16: the warp loads len(vars) 8x8
    matrices of 16-bit elements from shared `buf` and declares `vars` (i32 registers).

    `row` is, in lane 8*i + r, the element index of row r of matrix i (8 contiguous elements,
    16-byte aligned); lanes from 8*len(vars) on are ignored. Register i of lane L then holds
    elements (L // 4, 2 * (L % 4) + {0, 1}) of matrix i, or with `trans` elements
    (2 * (L % 4) + {0, 1}, L // 4). All 32 lanes of the warp must execute it."""
    vars: tuple[str, ...]
    buf: str
    row: Expr
    trans: bool = False


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


@dataclass(frozen=True)
class CpAsync(Stmt):
    """cp.async.{cache}.shared.global: copy `nbytes` (4, 8 or 16) from global
    src[src_index ...] to shared dst[dst_index ...], both aligned to nbytes, same dtype.

    Only `src_bytes` bytes are read (None: all) and the rest is zero-filled, so a predicated
    copy is `src_bytes = where(ok, nbytes, 0)`. The copy belongs to the group closed by the
    thread's next CpAsyncCommit and lands when a CpAsyncWait completes that group; other threads
    see it after a Sync that follows the wait. cache "cg" (L2 only) needs nbytes == 16."""
    dst: str
    dst_index: Expr
    src: str
    src_index: Expr
    nbytes: int
    src_bytes: Expr | None = None
    cache: str = "ca"


@dataclass(frozen=True)
class CpAsyncCommit(Stmt):
    """cp.async.commit_group: close this thread's uncommitted copies into one group."""


@dataclass(frozen=True)
class CpAsyncWait(Stmt):
    """cp.async.wait_group pending: wait until at most `pending` of this thread's most recent
    groups are still in flight (uncommitted copies are not waited for)."""
    pending: int = 0


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


@dataclass(frozen=True)
class Wgmma(Stmt):
    """wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype}: per warpgroup (128 threads,
    warps 4w..4w+3) D = A @ B.T + (D if scale_d else 0), A 64x16 and B n x16, both K-major in
    shared memory through the descriptors `a` and `b` (i64 expressions), D 64 x n in f32.
    trans_a / trans_b: PTX imm-trans-a / imm-trans-b (f16/bf16 only): 1 reads that operand
    MN-major (M- or N-contiguous; sim_wgmma.py gives the layout) instead of K-major.

    `d`: n/2 declared f32 variables, read and written; thread T holds d[i] at row
    16 * (T % 128 // 32) + T % 32 // 4 + 8 * (i // 2 % 2), col 8 * (i // 4) + 2 * (T % 4) + i % 2.
    Asynchronous: d may be read only after a WgmmaWait that completes its group, and d written by
    other statements needs a WgmmaFence before the wgmma. All 128 threads must execute it."""
    d: tuple[str, ...]
    a: Expr
    b: Expr
    n: int
    dtype: str = "bf16"
    scale_d: Expr | None = None       # None: always accumulate (PTX scale-d = 1)
    trans_a: bool = False             # A is M-major (imm-trans-a = 1)
    trans_b: bool = False             # B is N-major (imm-trans-b = 1)


@dataclass(frozen=True)
class WgmmaFence(Stmt):
    """wgmma.fence.sync.aligned: order earlier register (and shared) accesses before the wgmmas
    that follow."""


@dataclass(frozen=True)
class WgmmaCommit(Stmt):
    """wgmma.commit_group.sync.aligned: close this warpgroup's uncommitted wgmmas into a group."""


@dataclass(frozen=True)
class WgmmaWait(Stmt):
    """wgmma.wait_group.sync.aligned pending: wait until at most `pending` groups are in flight."""
    pending: int = 0


@dataclass(frozen=True)
class MbarInit(Stmt):
    """mbarrier.init.shared::cta.b64 [bar[index]], count: phase 0 expecting `count` arrivals."""
    bar: str
    index: Expr
    count: int


@dataclass(frozen=True)
class MbarArrive(Stmt):
    """mbarrier.arrive(.expect_tx).shared::cta.b64: one arrival on bar[index]; with tx_bytes, the
    phase also waits for that many bytes of asynchronous copies (TmaLoad) to complete."""
    bar: str
    index: Expr
    tx_bytes: int | None = None


@dataclass(frozen=True)
class MbarTryWait(Stmt):
    """var = mbarrier.try_wait.parity.shared::cta.b64 [bar[index]], parity (declares bool var):
    true once the phase with that parity has completed; then this thread sees what it brought."""
    var: str
    bar: str
    index: Expr
    parity: Expr


@dataclass(frozen=True)
class MbarWait(Stmt):
    """Spin on mbarrier.try_wait.parity until the phase with `parity` of bar[index] completes."""
    bar: str
    index: Expr
    parity: Expr


@dataclass(frozen=True)
class TmaLoad(Stmt):
    """cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes: copy the
    box of tensor-map parameter `tmap` at element coordinates `coords` (innermost first, may be
    out of bounds: zero-filled) into shared dst[dst_index ...] (128-byte aligned) with the map's
    swizzle; completes box bytes of transactions on mbarrier bar[bar_index]. Issued by one thread."""
    dst: str
    dst_index: Expr
    tmap: str
    coords: tuple[Expr, ...]
    bar: str
    bar_index: Expr


@dataclass(frozen=True)
class FenceProxyAsync(Stmt):
    """fence.proxy.async.shared::cta: make this thread's ordinary shared-memory writes visible to
    the async proxy (wgmma, TMA) before a barrier."""


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

    def verify(self, target=None) -> None:
        """Check every kernel; on a CPU target (one thread per block, its "shared memory" a
        scratch array in ordinary memory) the GPU's shared-memory limits do not apply."""
        names = {b.name: b for b in self.buffers}
        for k in self.kernels:
            for p in k.params:
                b = names.get(p.name)
                if b is None or b.dtype != p.dtype or b.numel != p.numel:
                    raise KernelVerifyError(f"{k.name}: parameter {p.name} does not match a buffer")
            if k.name not in getattr(self, "twins", {}):        # a renamed copy of one checked
                verify_kernel(k, gpu=getattr(target, "kind", "gpu") == "gpu")

    def __str__(self) -> str:
        return "\n\n".join(format_kernel(k) for k in self.kernels)


class KernelVerifyError(Exception):
    pass


# Kernel IR is checked against the most any target allows (a Target says what one allows).
WARP = 32                # lanes of a shuffle and of mma.sync: the warp of every GPU target
MAX_SMEM_BYTES = STATIC_SMEM_BYTES                                    # static __shared__ per block
MAX_DYNAMIC_SMEM_BYTES = max(t.smem_optin for t in GPUS)             # static + dynamic (opt-in)


def walk(body):
    """Every statement in a body, depth first."""
    for s in body:
        yield s
        if isinstance(s, (For, While)):
            yield from walk(s.body)
        elif isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.orelse)


def _thread_dependent(e: Expr, tainted: set[str]) -> bool:
    if isinstance(e, ThreadIdx):
        return True
    if isinstance(e, Var):
        return e.name in tainted
    return any(_thread_dependent(c, tainted) for c in children(e))


def verify_kernel(k: Kernel, gpu: bool = True) -> None:
    """Check scoping, buffer references, barriers in uniform control flow and resource limits
    (shared-memory sizes only for a GPU)."""
    if not 1 <= k.block <= 1024 or k.grid < 1 or k.grid >= 2 ** 31:
        raise KernelVerifyError(f"{k.name}: launch grid={k.grid} block={k.block} out of range")
    if gpu and k.static_smem_bytes > MAX_SMEM_BYTES:
        raise KernelVerifyError(f"{k.name}: {k.static_smem_bytes} bytes of shared memory > "
                                f"{MAX_SMEM_BYTES}")
    if gpu and k.static_smem_bytes + k.dynamic_smem_bytes > MAX_DYNAMIC_SMEM_BYTES:
        raise KernelVerifyError(f"{k.name}: {k.static_smem_bytes} + {k.dynamic_smem_bytes} bytes "
                                f"of static + dynamic shared memory > {MAX_DYNAMIC_SMEM_BYTES}")
    globals_ = {p.name: p for p in k.params}
    smem = {s.name for s in walk(k.body) if isinstance(s, Smem)}
    scalars = {name for name, _ in k.scalars}

    def check_expr(e: Expr, scope: set[str], where: str):
        missing = free_vars(e) - scope
        if missing:
            raise KernelVerifyError(f"{k.name}: {where} uses undefined {sorted(missing)}")
        for sub in _all_loads(e):
            if sub.buf not in globals_ and sub.buf not in smem:
                raise KernelVerifyError(f"{k.name}: load from unknown buffer {sub.buf}")

    def check(body, scope: set[str], tainted: set[str], divergent: bool):
        scope = set(scope)
        for s in body:
            if isinstance(s, Let):
                check_expr(s.value, scope, f"let {s.var}")
                scope.add(s.var)
                if _thread_dependent(s.value, tainted) or divergent:
                    tainted.add(s.var)
            elif isinstance(s, Assign):
                if s.var not in scope:
                    raise KernelVerifyError(f"{k.name}: assignment to undeclared {s.var}")
                check_expr(s.value, scope, f"assign {s.var}")
                if _thread_dependent(s.value, tainted) or divergent:
                    tainted.add(s.var)
            elif isinstance(s, (Store, StoreVec)):
                vals = (s.value,) if isinstance(s, Store) else s.values
                for e in (s.index, *vals):
                    check_expr(e, scope, f"store to {s.buf}")
                if s.buf in globals_ and not globals_[s.buf].output:
                    raise KernelVerifyError(f"{k.name}: store to read-only parameter {s.buf}")
                if s.buf not in globals_ and s.buf not in smem:
                    raise KernelVerifyError(f"{k.name}: store to unknown buffer {s.buf}")
            elif isinstance(s, LoadVec):
                check_expr(s.index, scope, f"vector load from {s.buf}")
                if len(s.vars) * dtypes.ITEMSIZE[_buf_dtype(s.buf, globals_, k)] > 16:
                    raise KernelVerifyError(f"{k.name}: vector load wider than 16 bytes")
                scope |= set(s.vars)
                tainted |= set(s.vars)
            elif isinstance(s, For):
                check_expr(s.start, scope, f"loop {s.var}")
                check_expr(s.stop, scope, f"loop {s.var}")
                varying = _thread_dependent(s.start, tainted) or _thread_dependent(s.stop, tainted)
                inner_t = tainted | ({s.var} if varying else set())
                check(s.body, scope | {s.var}, inner_t, divergent or varying)
                tainted |= inner_t - {s.var}
            elif isinstance(s, If):
                check_expr(s.cond, scope, "if")
                div = divergent or _thread_dependent(s.cond, tainted)
                check(s.then, scope, tainted, div)
                check(s.orelse, scope, tainted, div)
            elif isinstance(s, While):
                check_expr(s.cond, scope, "while")
                inner_t = set(tainted)
                check(s.body, scope, inner_t, divergent)   # twice: a variable the body makes
                check(s.body, scope, inner_t, divergent or _thread_dependent(s.cond, inner_t))
                tainted |= inner_t                         # thread-dependent taints the condition
            elif isinstance(s, Atomic):
                for e in (s.index, s.value):
                    check_expr(e, scope, f"atomic {s.op} on {s.buf}")
                if s.op not in ATOMIC_OPS:
                    raise KernelVerifyError(f"{k.name}: atomic {s.op} (not {'/'.join(ATOMIC_OPS)})")
                if s.buf in globals_ and not globals_[s.buf].output:
                    raise KernelVerifyError(f"{k.name}: atomic on read-only parameter {s.buf}")
                if s.buf not in globals_ and s.buf not in smem:
                    raise KernelVerifyError(f"{k.name}: atomic on unknown buffer {s.buf}")
                if _buf_dtype(s.buf, globals_, k) not in ("f32", "i32", "i64"):
                    raise KernelVerifyError(f"{k.name}: atomics take f32, i32 or i64 buffers, not "
                                            f"{_buf_dtype(s.buf, globals_, k)} ({s.buf})")
            elif isinstance(s, Sync):
                if divergent:
                    raise KernelVerifyError(f"{k.name}: __syncthreads() under thread-dependent control flow")
            elif isinstance(s, LdMatrix):
                check_expr(s.row, scope, f"ldmatrix from {s.buf}")
                scope |= set(s.vars)
                tainted |= set(s.vars)
            elif isinstance(s, Mma):
                missing = set(s.a + s.b + s.c + s.d) - scope
                if missing:
                    raise KernelVerifyError(f"{k.name}: mma uses undefined {sorted(missing)}")
                tainted |= set(s.d)
            elif isinstance(s, CpAsync):
                for e in (s.dst_index, s.src_index, s.src_bytes):
                    if e is not None:
                        check_expr(e, scope, f"cp.async {s.src} -> {s.dst}")
            elif isinstance(s, HOPPER_STMTS):
                _check_hopper_scope(k, s, scope, tainted, check_expr)
            elif isinstance(s, (Smem, Comment, CpAsyncCommit, CpAsyncWait)):
                pass
            else:
                raise KernelVerifyError(f"{k.name}: unknown statement {s!r}")

    check(k.body, scalars, set(), False)
    _check_warp_ops(k)
    _check_hopper_ops(k)


def _check_hopper_scope(k: Kernel, s, scope: set[str], tainted: set[str], check_expr) -> None:
    """Scoping of the sm_90 statements (their shapes are checked by _check_hopper_ops)."""
    where = type(s).__name__
    for e in (getattr(s, f, None) for f in ("a", "b", "scale_d", "index", "parity", "dst_index",
                                             "bar_index")):
        if isinstance(e, Expr):
            check_expr(e, scope, where)
    for e in getattr(s, "coords", ()):
        check_expr(e, scope, where)
    if isinstance(s, Wgmma):
        missing = set(s.d) - scope
        if missing:
            raise KernelVerifyError(f"{k.name}: wgmma uses undefined {sorted(missing)}")
        tainted |= set(s.d)
    elif isinstance(s, MbarTryWait):
        scope.add(s.var)
        tainted.add(s.var)


def _check_hopper_ops(k: Kernel) -> None:
    """The shapes and operands wgmma, TMA and mbarrier accept, and that tensor maps and
    mbarrier arrays are touched by nothing else (nothing to check, and no walk over a large
    unrolled CPU kernel's every expression, where it has neither)."""
    if not any(p.tensor_map for p in k.params) and \
            not any(isinstance(s, HOPPER_STMTS) for s in walk(k.body)):
        return
    smem = {s.name: s for s in walk(k.body) if isinstance(s, Smem)}
    params = {p.name: p for p in k.params}
    declared = {s.var: s.dtype for s in walk(k.body) if isinstance(s, (Let, For))}
    bars = {s.bar for s in walk(k.body) if isinstance(s, (MbarInit, MbarArrive, MbarTryWait,
                                                          MbarWait, TmaLoad))}
    tmaps = {n for n, p in params.items() if p.tensor_map is not None}

    def fail(what: str):
        raise KernelVerifyError(f"{k.name}: {what}")
    for b in sorted(bars):
        if b not in smem or smem[b].dtype != "i64":
            fail(f"mbarrier {b} must be a shared array of i64")
    for name in sorted(tmaps):
        tm, p = params[name].tensor_map, params[name]
        if not 1 <= len(tm.dims) <= 5 or len(tm.box) != len(tm.dims) or \
                len(tm.strides) != len(tm.dims) - 1:
            fail(f"tensor map {name}: dims, box and strides do not agree in rank")
        if prod(tm.dims) > p.numel or any(b < 1 or b > 256 for b in tm.box):
            fail(f"tensor map {name}: dims exceed the buffer or a box side is not in 1..256")
        if tm.swizzle not in SWIZZLES:
            fail(f"tensor map {name}: unknown swizzle {tm.swizzle!r}")
    for s in walk(k.body):
        touched = set()
        if isinstance(s, (Store, StoreVec, LoadVec, LdMatrix)):
            touched.add(s.buf)
        elif isinstance(s, CpAsync):
            touched |= {s.src, s.dst}
        for e in _stmt_exprs(s):
            touched |= {x.buf for x in _all_loads(e)}
        bad = touched & (bars | tmaps)
        if bad:
            fail(f"{min(bad)} is an mbarrier or tensor map: only TMA and mbarrier "
                 f"statements may use it")
        for e in _stmt_exprs(s):
            for dsc in _all_descs(e):
                if dsc.buf not in smem or dtypes.ITEMSIZE[smem[dsc.buf].dtype] != 2:
                    fail(f"wgmma descriptor of {dsc.buf}, which is not a shared array of 16-bit "
                         f"elements")
                if dsc.swizzle not in SWIZZLES:
                    fail(f"wgmma descriptor with unknown swizzle {dsc.swizzle!r}")
        if isinstance(s, Wgmma):
            if s.dtype not in ("f16", "bf16"):
                fail(f"wgmma takes f16 or bf16 inputs, not {s.dtype}")
            if s.n % 8 or not 8 <= s.n <= 256:
                fail(f"wgmma m64nNk16 needs N a multiple of 8 in 8..256, not {s.n}")
            if len(s.d) != s.n // 2:
                fail(f"wgmma m64n{s.n}k16 takes {s.n // 2} f32 accumulators, not {len(s.d)}")
            for v in s.d:
                if declared.get(v) != "f32":
                    fail(f"wgmma accumulator {v} is not f32")
            if k.block % 128:
                fail(f"wgmma needs whole warpgroups, not a block of {k.block} threads")
        elif isinstance(s, TmaLoad):
            p = params.get(s.tmap)
            if p is None or p.tensor_map is None:
                fail(f"TMA load from {s.tmap}, which is not a tensor-map parameter")
            if s.dst not in smem or smem[s.dst].dtype != p.dtype:
                fail(f"TMA load {s.tmap} -> {s.dst}: needs a shared array of {p.dtype}")
            if len(s.coords) != len(p.tensor_map.dims):
                fail(f"TMA load from {s.tmap} takes {len(p.tensor_map.dims)} coordinates")
        elif isinstance(s, MbarInit) and s.count < 1:
            fail(f"mbarrier.init with count {s.count}")
        elif isinstance(s, MbarArrive) and s.tx_bytes is not None and not 0 <= s.tx_bytes < 2 ** 20:
            fail(f"mbarrier expect_tx of {s.tx_bytes} bytes")
        elif isinstance(s, WgmmaWait) and not 0 <= s.pending <= 7:
            fail(f"wgmma.wait_group {s.pending}")


def _all_descs(e: Expr):
    if isinstance(e, WgmmaDesc):
        yield e
    for c in children(e):
        yield from _all_descs(c)


def _stmt_exprs(s):
    """The expressions directly in statement s (not in nested bodies)."""
    for f in ("value", "index", "start", "stop", "cond", "row", "dst_index", "src_index",
              "src_bytes", "a", "b", "scale_d", "parity", "bar_index"):
        e = getattr(s, f, None)
        if isinstance(e, Expr):
            yield e
    for f in ("values", "coords"):
        yield from (getattr(s, f, None) or ())


def _check_warp_ops(k: Kernel) -> None:
    """The shapes and types mma, ldmatrix and cp.async accept."""
    smem = {s.name: s.dtype for s in walk(k.body) if isinstance(s, Smem)}
    params = {p.name: p.dtype for p in k.params}
    declared: dict[str, str] = {}
    for s in walk(k.body):
        if isinstance(s, (Let, For)):
            declared[s.var] = s.dtype
        elif isinstance(s, LoadVec):
            declared.update(dict.fromkeys(s.vars, s.dtype))
        elif isinstance(s, LdMatrix):
            declared.update(dict.fromkeys(s.vars, "i32"))

    def fail(what: str):
        raise KernelVerifyError(f"{k.name}: {what}")
    for s in walk(k.body):
        if isinstance(s, LdMatrix):
            if len(s.vars) not in (1, 2, 4):
                fail(f"ldmatrix loads 1, 2 or 4 matrices, not {len(s.vars)}")
            if s.buf not in smem or dtypes.ITEMSIZE[smem[s.buf]] != 2:
                fail(f"ldmatrix reads a shared array of 16-bit elements, not {s.buf}")
        elif isinstance(s, Mma):
            if s.dtype not in ("f16", "bf16"):
                fail(f"mma m16n8k16 takes f16 or bf16 inputs, not {s.dtype}")
            if (len(s.a), len(s.b), len(s.c), len(s.d)) != (4, 2, 4, 4):
                fail("mma m16n8k16 takes 4 A registers, 2 B registers, 4 C and 4 D floats")
            for v in s.a + s.b:
                if declared.get(v) != "i32":
                    fail(f"mma operand {v} is not an i32 fragment register")
            for v in s.c + s.d:
                if declared.get(v) != "f32":
                    fail(f"mma accumulator {v} is not f32")
        elif isinstance(s, CpAsync):
            if s.dst not in smem or s.src not in params:
                fail(f"cp.async copies a global parameter to a shared array, not {s.src} -> {s.dst}")
            if smem[s.dst] != params[s.src]:
                fail(f"cp.async {s.src} -> {s.dst} changes the dtype")
            if s.nbytes not in (4, 8, 16) or s.nbytes % dtypes.ITEMSIZE[smem[s.dst]]:
                fail(f"cp.async copies 4, 8 or 16 bytes of whole elements, not {s.nbytes}")
            if s.cache not in ("ca", "cg") or (s.cache == "cg" and s.nbytes != 16):
                fail(f"cp.async.{s.cache} of {s.nbytes} bytes (cg copies 16 bytes only)")
        elif isinstance(s, CpAsyncWait) and s.pending < 0:
            fail(f"cp.async.wait_group {s.pending}")


def _buf_dtype(name, globals_, k: Kernel) -> str:
    if name in globals_:
        return globals_[name].dtype
    for s in walk(k.body):
        if isinstance(s, Smem) and s.name == name:
            return s.dtype
    raise KernelVerifyError(f"{k.name}: unknown buffer {name}")


def _all_loads(e: Expr):
    if isinstance(e, Load):
        yield e
    for c in children(e):
        yield from _all_loads(c)


# ---------------------------------------------------------------- printing

def format_expr(e: Expr) -> str:
    return to_str(e)


def _format_body(body, depth: int, out: list[str]) -> None:
    pad = "    " * depth
    for s in body:
        if isinstance(s, Let):
            out.append(f"{pad}{s.var} = {format_expr(s.value)}  : {s.dtype}")
        elif isinstance(s, Assign):
            out.append(f"{pad}{s.var} <- {format_expr(s.value)}")
        elif isinstance(s, Store):
            out.append(f"{pad}{s.buf}[{format_expr(s.index)}] = {format_expr(s.value)}")
        elif isinstance(s, LoadVec):
            out.append(f"{pad}{', '.join(s.vars)} = load.v{len(s.vars)} {s.buf}[{format_expr(s.index)}]")
        elif isinstance(s, StoreVec):
            out.append(f"{pad}{s.buf}[{format_expr(s.index)}] = store.v{len(s.values)} "
                       f"({', '.join(format_expr(v) for v in s.values)})")
        elif isinstance(s, For):
            tag = "  # unroll" if s.unroll else ""
            out.append(f"{pad}for {s.var} = {format_expr(s.start)}; < {format_expr(s.stop)}; += {s.step}:{tag}")
            _format_body(s.body, depth + 1, out)
        elif isinstance(s, If):
            out.append(f"{pad}if {format_expr(s.cond)}:")
            _format_body(s.then, depth + 1, out)
            if s.orelse:
                out.append(f"{pad}else:")
                _format_body(s.orelse, depth + 1, out)
        elif isinstance(s, While):
            out.append(f"{pad}while {format_expr(s.cond)}:")
            _format_body(s.body, depth + 1, out)
        elif isinstance(s, Atomic):
            out.append(f"{pad}atomic.{s.op} {s.buf}[{format_expr(s.index)}], {format_expr(s.value)}")
        elif isinstance(s, Sync):
            out.append(f"{pad}Sync")
        elif isinstance(s, Smem):
            out.append(f"{pad}Smem {s.name}[{s.size}] {s.dtype}" + (" dynamic" if s.dynamic else ""))
        elif isinstance(s, Comment):
            out.append(f"{pad}# {s.text}")
        elif isinstance(s, LdMatrix):
            trans = ".trans" if s.trans else ""
            out.append(f"{pad}{', '.join(s.vars)} = ldmatrix.x{len(s.vars)}{trans} "
                       f"{s.buf}[{format_expr(s.row)}]  : i32")
        elif isinstance(s, Mma):
            out.append(f"{pad}{', '.join(s.d)} <- mma.m16n8k16.{s.dtype} a=({', '.join(s.a)}) "
                       f"b=({', '.join(s.b)}) c=({', '.join(s.c)})")
        elif isinstance(s, CpAsync):
            part = "" if s.src_bytes is None else f", src_bytes={format_expr(s.src_bytes)}"
            out.append(f"{pad}{s.dst}[{format_expr(s.dst_index)}] <- cp.async.{s.cache}.{s.nbytes} "
                       f"{s.src}[{format_expr(s.src_index)}]{part}")
        elif isinstance(s, CpAsyncCommit):
            out.append(f"{pad}cp.async.commit_group")
        elif isinstance(s, CpAsyncWait):
            out.append(f"{pad}cp.async.wait_group {s.pending}")
        elif isinstance(s, HOPPER_STMTS):
            out.append(pad + _format_hopper(s))
        else:
            out.append(f"{pad}{s!r}")


def _format_hopper(s) -> str:
    f = format_expr
    if isinstance(s, Wgmma):
        d = ", ".join(s.d) if len(s.d) <= 4 else f"{s.d[0]}..{s.d[-1]}"
        scale = "" if s.scale_d is None else f" scale_d={f(s.scale_d)}"
        trans = "".join(f" trans_{x}" for x in "ab" if getattr(s, f"trans_{x}"))
        return f"{d} <- wgmma.m64n{s.n}k16.{s.dtype} a={f(s.a)} b={f(s.b)}{scale}{trans}"
    if isinstance(s, WgmmaFence):
        return "wgmma.fence"
    if isinstance(s, WgmmaCommit):
        return "wgmma.commit_group"
    if isinstance(s, WgmmaWait):
        return f"wgmma.wait_group {s.pending}"
    if isinstance(s, MbarInit):
        return f"mbarrier.init {s.bar}[{f(s.index)}], count={s.count}"
    if isinstance(s, MbarArrive):
        tx = "" if s.tx_bytes is None else f".expect_tx {s.tx_bytes}"
        return f"mbarrier.arrive{tx} {s.bar}[{f(s.index)}]"
    if isinstance(s, MbarTryWait):
        return f"{s.var} = mbarrier.try_wait.parity {s.bar}[{f(s.index)}], {f(s.parity)}  : bool"
    if isinstance(s, MbarWait):
        return f"mbarrier.wait.parity {s.bar}[{f(s.index)}], {f(s.parity)}"
    if isinstance(s, TmaLoad):
        return (f"{s.dst}[{f(s.dst_index)}] <- tma.load {s.tmap}[{', '.join(f(c) for c in s.coords)}]"
                f" mbar={s.bar}[{f(s.bar_index)}]")
    return "fence.proxy.async"


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
