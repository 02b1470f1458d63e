"""Tile IR: a Loop IR kernel scheduled onto the GPU.

A `TileKernel` keeps the Loop IR statements and adds the schedule:

* `domain`: the outer free loops, flattened into rows (`mode="rows"`, one group of `group`
  threads per row, `block // group` rows per block) or into elements (`mode="elementwise"`,
  one thread per `vec` consecutive elements);
* `StridedLoop`: a loop whose iterations are dealt to the threads of a group
  (`for a = t; a < n; a += group`);
* `Combine`: the merge of per-thread partial accumulators across the group (warp shuffles,
  then shared memory);
* `Stage`: a slab of a global input copied into shared memory once, read many times.

Every choice is a knob (`knobs`), printed with the kernel and pinnable with --knob.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod

from ..expr import Expr, to_str
from ..loop.ir import Accum, AccInit, Let, Load, Loop, Store, format_stmt


@dataclass(frozen=True)
class StridedLoop:
    """Iterations var = t, t + step, ... < extent, dealt to the `step` threads of a group.

    With vec > 1 a thread takes vec consecutive iterations at once (t*vec .. t*vec + vec-1, then
    += step*vec), so that its loads become one 16-byte vector access."""
    var: str
    extent: int
    step: int
    kind: str                           # "free" | "reduce"
    body: tuple
    accs: tuple[AccInit, ...] = ()
    unroll: bool = False
    vec: int = 1                        # each thread takes `vec` consecutive iterations at a time


@dataclass(frozen=True)
class Combine:
    """Merge the group's partial accumulators; afterwards every thread holds the total."""
    accs: tuple[AccInit, ...]
    threads: int


@dataclass(frozen=True)
class Stage:
    """name[f] = buf[base + f] for f < size, filled cooperatively, then a barrier."""
    name: str
    buf: str
    base: Expr
    size: int
    dtype: str                          # storage dtype
    vec: int = 1                        # elements per thread per copy (a 16-byte vector when > 1)


@dataclass(frozen=True)
class TileKernel:
    name: str
    mode: str                           # "rows" | "elementwise"
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
    src: str = field(default="", compare=False)

    def shape_of(self, buf: str) -> tuple[int, ...]:
        return next(b.shape for b in self.buffers if b.name == buf)

    def dtype_of(self, buf: str) -> str:
        return next(b.dtype for b in self.buffers if b.name == buf)

    @property
    def rows(self) -> int:
        return prod(e for _, e in self.domain)

    @property
    def grid(self) -> int:
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

    def __str__(self) -> str:
        return "\n\n".join(format_kernel(k) for k in self.kernels)


def walk(body):
    for s in body:
        yield s
        if isinstance(s, (Loop, StridedLoop)):
            yield from walk(s.body)


def map_body(body, fn):
    """Rebuild a body bottom-up, replacing each statement s by fn(s) (a statement or a tuple)."""
    out = []
    for s in body:
        if isinstance(s, (Loop, StridedLoop)):
            s = replace(s, body=map_body(s.body, fn))
        r = fn(s)
        out.extend(r if isinstance(r, tuple) else (r,))
    return tuple(out)


# ---------------------------------------------------------------- printing

def _format(body, depth: int, out: list[str]) -> None:
    pad = "    " * depth
    for s in body:
        if isinstance(s, StridedLoop):
            tag = (", unroll" if s.unroll else "") + (f", vec={s.vec}" if s.vec > 1 else "")
            start = f"t * {s.vec}" if s.vec > 1 else "t"
            out.append(f"{pad}StridedLoop({s.var} = {start}; < {s.extent}; += {s.step * s.vec}):  "
                       f"# {s.kind}{tag}")
            _format(s.body, depth + 1, out)
        elif isinstance(s, Loop):
            out.append(f"{pad}for {s.var} in 0..{s.extent}:  # {s.kind}" + (", unroll" if s.unroll else ""))
            _format(s.body, depth + 1, out)
        elif isinstance(s, Combine):
            names = ", ".join(a.acc for a in s.accs)
            out.append(f"{pad}{names} = Combine({', '.join(f'{a.acc}:{a.op}' for a in s.accs)}, "
                       f"threads={s.threads})")
        elif isinstance(s, Stage):
            tag = f", vec={s.vec}" if s.vec > 1 else ""
            out.append(f"{pad}{s.name} = Stage({s.buf}, origin={to_str(s.base)}, slab={s.size}{tag})")
        else:
            format_stmt(s, depth, out)


def format_kernel(k: TileKernel) -> str:
    knobs = ", ".join(f"{n}={v}" for n, v in k.knobs)
    out = [f"kernel {k.name}" + (f"  # {knobs}" if knobs else "")]
    _format(k.prelude, 0, out)
    axes = ", ".join(f"{v}:{e}" for v, e in k.domain) or "()"
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


def subst_body(body, mapping: dict, bounds: dict | None = None):
    """Substitute variables (name -> Expr) in every statement of a body."""
    from ..expr import substitute

    def sub(e):
        return None if e is None else substitute(e, mapping, bounds)

    def fn(s):
        if isinstance(s, Load):
            return Load(s.var, s.buf, tuple(sub(e) for e in s.index), s.dtype, sub(s.pred))
        if isinstance(s, Let):
            return Let(s.var, sub(s.value))
        if isinstance(s, Accum):
            return Accum(s.acc, s.op, sub(s.value), sub(s.index))
        if isinstance(s, Store):
            return Store(s.buf, tuple(sub(e) for e in s.index), sub(s.value))
        if isinstance(s, Stage):
            return replace(s, base=sub(s.base))
        return s
    return map_body(body, fn)


def flat_index(index: tuple, shape: tuple) -> Expr:
    """Row-major flat offset of a multi-dimensional index into a contiguous buffer."""
    from ..expr import Const, add, mul
    out: Expr = Const(0)
    stride = 1
    for e, n in reversed(list(zip(index, shape))):
        out = add(out, mul(e, stride))
        stride *= n
    return out
