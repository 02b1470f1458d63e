"""Kernel IR: a GPU kernel as hardware primitives, independent of the source language.

Values are per-thread scalars in their *compute* type (f32 for f16/bf16 data, i64/i32, bool):
a `Load` from an f16 buffer yields f32 and a `Store` of f32 into a bf16 buffer rounds to
nearest-even. Shared memory is declared with `Smem`; `Sync` is a block barrier; `ShflXor` and
`ShflIdx` exchange a value within a warp of 32 (all lanes must take part). Launches are 1-D:
`grid` blocks of `block` threads. The CUDA emitter (`target/cuda.py`) and the simulator
(`kernel/sim.py`) are both one walk over these nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from .. import dtypes
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
class Sync(Stmt):
    """__syncthreads(): every thread of the block must reach it (no divergence)."""


@dataclass(frozen=True)
class Smem(Stmt):
    """A shared-memory array of `size` elements of storage dtype `dtype`, one per block."""
    name: str
    dtype: str
    size: int


@dataclass(frozen=True)
class Comment(Stmt):
    text: str


# ---------------------------------------------------------------- kernels and programs

@dataclass(frozen=True)
class Param:
    name: str
    dtype: str        # storage dtype of the global buffer
    numel: int
    output: bool = False


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    grid: int
    block: int
    body: tuple[Stmt, ...]
    src: str = field(default="", compare=False)   # provenance: what it computes, user lines

    def __str__(self) -> str:
        return format_kernel(self)

    @property
    def smem_bytes(self) -> int:
        return sum(s.size * dtypes.ITEMSIZE[s.dtype] for s in walk(self.body) if isinstance(s, Smem))


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

    def buffer(self, name: str) -> Buffer:
        return {b.name: b for b in self.buffers}[name]

    def verify(self) -> None:
        names = {b.name: b for b in self.buffers}
        for k in self.kernels:
            for p in k.params:
                b = names.get(p.name)
                if b is None or b.dtype != p.dtype or b.numel != p.numel:
                    raise KernelVerifyError(f"{k.name}: parameter {p.name} does not match a buffer")
            verify_kernel(k)

    def __str__(self) -> str:
        return "\n\n".join(format_kernel(k) for k in self.kernels)


class KernelVerifyError(Exception):
    pass


MAX_SMEM_BYTES = 48 * 1024


def walk(body):
    """Every statement in a body, depth first."""
    for s in body:
        yield s
        if isinstance(s, For):
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


def verify_kernel(k: Kernel) -> None:
    """Check scoping, buffer references, barriers in uniform control flow and resource limits."""
    if not 1 <= k.block <= 1024 or k.grid < 1 or k.grid >= 2 ** 31:
        raise KernelVerifyError(f"{k.name}: launch grid={k.grid} block={k.block} out of range")
    if k.smem_bytes > MAX_SMEM_BYTES:
        raise KernelVerifyError(f"{k.name}: {k.smem_bytes} bytes of shared memory > {MAX_SMEM_BYTES}")
    globals_ = {p.name: p for p in k.params}
    smem = {s.name for s in walk(k.body) if isinstance(s, Smem)}

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
            elif isinstance(s, Sync):
                if divergent:
                    raise KernelVerifyError(f"{k.name}: __syncthreads() under thread-dependent control flow")
            elif isinstance(s, (Smem, Comment)):
                pass
            else:
                raise KernelVerifyError(f"{k.name}: unknown statement {s!r}")

    check(k.body, set(), set(), False)


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
        elif isinstance(s, Sync):
            out.append(f"{pad}Sync")
        elif isinstance(s, Smem):
            out.append(f"{pad}Smem {s.name}[{s.size}] {s.dtype}")
        elif isinstance(s, Comment):
            out.append(f"{pad}# {s.text}")
        else:
            out.append(f"{pad}{s!r}")


def format_kernel(k: Kernel) -> str:
    params = ", ".join(f"{'out ' if p.output else ''}{p.name}: {p.dtype}[{p.numel}]" for p in k.params)
    out = [f"kernel {k.name}({params})  grid={k.grid} block={k.block}"]
    _format_body(k.body, 1, out)
    return "\n".join(out)
