"""Loop IR: one loop nest per future kernel, with every fused intermediate gone.

A kernel is a tree of `Loop`s (kind "free" or "reduce") over SSA statements:

    in2 = load x[0, a0, a1]          Load  (optionally predicated: no access where pred is false)
    v1 = multiply(in2, in2)          Let   (one scalar op of earlier values / constants)
    acc0 <- add(acc0, v1)            Accum (the accumulator is declared by its reduce Loop)
    out[0, a0, a2] = v6              Store

The leading chain of free loops is the kernel's parallel domain ("outer" loops); what sits
inside it runs once per point of that domain: reduce loops, scalar epilogues, inner free loops
that write the output. Buffers are named after Tensor IR nodes.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from math import prod

from ..core.expr import Expr, free_vars, rename, to_str
from ..core.operands import Operands
from ..core.scalar_ops import REDUCE_COMBINE


class Stmt(Operands):
    """A statement; its operands follow from its fields' types (operands.py)."""


@dataclass(frozen=True)
class Load(Stmt):
    var: str
    buf: str
    index: tuple[Expr, ...]
    dtype: str                       # compute dtype of the value
    pred: Expr | None = None         # read only where true; the value is 0 elsewhere


@dataclass(frozen=True)
class Let(Stmt):
    var: str
    value: Expr                      # one op (or cast) over Vars and Consts

    @property
    def dtype(self) -> str:
        return self.value.dtype


@dataclass(frozen=True)
class Accum(Stmt):
    """acc <- combine(acc, value); for argmax/argmin also tracks the index in `acc`_i."""
    acc: str
    op: str                          # sum | prod | max | min | argmax | argmin
    value: Expr
    index: Expr | None = None        # position along the reduction (argmax/argmin only)
    operands: str | None = None      # a 16-bit contraction (sum of a product of f16/bf16 tensors):
                                     # the dtype eager holds each multiplicand in, so a schedule
                                     # may round them to it (tensor cores) and still match eager


@dataclass(frozen=True)
class Store(Stmt):
    buf: str
    index: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True)
class CustomCall(Stmt):
    """A hand-written kernel (st.custom_op) run whole: it reads `args` (buffers or Python
    scalars) and writes `out`; `kernel` builds its Kernel IR (strata/dsl, duck-typed)."""
    op: str
    args: tuple
    out: str
    dtype: str                     # of out
    kernel: object = field(default=None, compare=False)


@dataclass(frozen=True)
class AccInit:
    acc: str
    op: str
    dtype: str                       # compute dtype of the accumulated value


@dataclass(frozen=True)
class Loop(Stmt):
    var: str
    extent: int
    kind: str                        # "free" | "reduce"
    body: tuple[Stmt, ...]
    accs: tuple[AccInit, ...] = ()   # accumulators a reduce loop produces
    unroll: bool = False             # set by the tile pass mark_unroll


@dataclass(frozen=True)
class BufferInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str                        # input | weight | output | temp


@dataclass(frozen=True)
class LoopKernel:
    name: str
    body: tuple[Stmt, ...]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    src: str = field(default="", compare=False)
    knobs: tuple = field(default=(), compare=False)     # decisions made in planning (STORE)
    stores: tuple[str, ...] = field(default=(), compare=False)  # STORE's choices, 1 first
    # the signature its knobs are looked up by, when a decision changed the kernel (the
    # default plan's kernel's): the tuner pins and the database keeps that one
    tuning_key: str = field(default="", compare=False)


@dataclass
class LoopProgram:
    buffers: list[BufferInfo]
    kernels: list[LoopKernel]
    outputs: list[str]
    weights: dict = field(default_factory=dict)

    def buffer(self, name: str) -> BufferInfo:
        return {b.name: b for b in self.buffers}[name]

    def __str__(self) -> str:
        return "\n\n".join(format_kernel(k) for k in self.kernels)

    def verify(self) -> None:
        names = {b.name for b in self.buffers}
        written: set[str] = {b.name for b in self.buffers       # an empty buffer needs no writer
                             if b.kind in ("input", "weight") or prod(b.shape) == 0}
        for k in self.kernels:
            for r in k.reads:
                if r not in written:
                    raise LoopVerifyError(f"{k.name} reads {r} before any kernel writes it")
            for w in k.writes:
                if w not in names:
                    raise LoopVerifyError(f"{k.name} writes unknown buffer {w}")
            written |= set(k.writes)
            _verify_scopes(k)
        missing = set(self.outputs) - written
        if missing:
            raise LoopVerifyError(f"outputs never written: {sorted(missing)}")


class LoopVerifyError(Exception):
    pass


def walk(body):
    for s in body:
        yield s
        for inner in s.bodies():
            yield from walk(inner)


def _verify_scopes(k: LoopKernel) -> None:

    def check(body, scope: set[str], accs: set[str]):
        scope = set(scope)
        for s in body:
            used: set[str] = set()
            if isinstance(s, Load):
                for e in s.index + ((s.pred,) if s.pred is not None else ()):
                    used |= free_vars(e)
            elif isinstance(s, Let):
                used = free_vars(s.value)
            elif isinstance(s, Accum):
                used = free_vars(s.value) | (free_vars(s.index) if s.index is not None else set())
                if s.acc not in accs:
                    raise LoopVerifyError(f"{k.name}: {s.acc} accumulated outside its reduce loop")
            elif isinstance(s, Store):
                used = free_vars(s.value).union(*[free_vars(e) for e in s.index])
            if used - scope:
                raise LoopVerifyError(f"{k.name}: {sorted(used - scope)} used out of scope")
            if isinstance(s, (Load, Let)):
                scope.add(s.var)
            elif isinstance(s, Loop):
                inner_accs = {a.acc for a in s.accs}
                check(s.body, scope | {s.var}, inner_accs)
                scope |= inner_accs | {f"{a.acc}_i" for a in s.accs if a.op in ("argmax", "argmin")}

    check(k.body, set(), set())


def canonical_names(k: LoopKernel, reserved: set[str] = frozenset()) -> LoopKernel:
    """Rename loop variables and SSA values in order of appearance (a0, a1, in0, v0, acc0...),
    so that two equal kernels print identically whatever order they were built in."""
    names: dict[str, str] = {}
    counts: dict[str, int] = {}

    def define(old: str) -> None:
        prefix = re.match(r"[a-z]+", old).group(0)
        n = counts.get(prefix, 0)
        while f"{prefix}{n}" in reserved or f"{prefix}{n}_i" in reserved:   # buffer names
            n += 1
        counts[prefix] = n + 1
        names[old] = f"{prefix}{n}"
        names[old + "_i"] = f"{prefix}{n}_i"

    def visit(body):
        for s in body:
            if isinstance(s, Loop):
                define(s.var)
                for a in s.accs:
                    define(a.acc)
                visit(s.body)
            elif isinstance(s, (Load, Let)):
                define(s.var)

    visit(k.body)

    def re_body(body):
        out = []
        for s in body:
            if isinstance(s, Load):
                out.append(Load(names[s.var], s.buf, tuple(rename(e, names) for e in s.index), s.dtype,
                                None if s.pred is None else rename(s.pred, names)))
            elif isinstance(s, Let):
                out.append(Let(names[s.var], rename(s.value, names)))
            elif isinstance(s, Accum):
                out.append(replace(s, acc=names[s.acc], value=rename(s.value, names),
                                   index=None if s.index is None else rename(s.index, names)))
            elif isinstance(s, Store):
                out.append(Store(s.buf, tuple(rename(e, names) for e in s.index), rename(s.value, names)))
            elif isinstance(s, Loop):
                out.append(Loop(names[s.var], s.extent, s.kind, re_body(s.body),
                                tuple(AccInit(names[a.acc], a.op, a.dtype) for a in s.accs)))
        return tuple(out)

    return LoopKernel(k.name, re_body(k.body), k.reads, k.writes, k.src)


# ---------------------------------------------------------------- printing

def _value(e: Expr) -> str:
    return to_str(e)


def format_stmt(s: Stmt, depth: int, out: list[str]) -> None:
    pad = "    " * depth
    if isinstance(s, Load):
        line = f"{pad}{s.var} = load {s.buf}[{', '.join(to_str(e) for e in s.index)}]"
        if s.pred is not None:
            line += f" if {to_str(s.pred)}"
        out.append(line)
    elif isinstance(s, Let):
        out.append(f"{pad}{s.var} = {_value(s.value)}")
    elif isinstance(s, Accum):
        if s.op in ("argmax", "argmin"):
            out.append(f"{pad}{s.acc} <- {s.op}({s.acc}, {_value(s.value)}) at {to_str(s.index)}")
        else:
            held = f"  # {s.operands} operands" if s.operands else ""
            out.append(f"{pad}{s.acc} <- {REDUCE_COMBINE[s.op]}({s.acc}, {_value(s.value)}){held}")
    elif isinstance(s, Store):
        out.append(f"{pad}{s.buf}[{', '.join(to_str(e) for e in s.index)}] = {_value(s.value)}")
    elif isinstance(s, Loop):
        out.append(f"{pad}for {s.var} in 0..{s.extent}:  # {s.kind}")
        for b in s.body:
            format_stmt(b, depth + 1, out)
    elif isinstance(s, CustomCall):
        args = ", ".join(a if isinstance(a, str) else repr(a) for a in s.args)
        out.append(f"{pad}{s.out} = custom {s.op}({args})")
    else:                       # a statement of its own module prints itself (loop/attention.py)
        s.format(depth, out)


def format_kernel(k: LoopKernel) -> str:
    knobs = "".join(f" {n}={v}" for n, v in k.knobs) + (" (of " + ", ".join(
        f"{i}: {x}" for i, x in enumerate(k.stores, 1)) + ")" if k.stores else "")
    out = [f"=== {k.name} -> {', '.join(k.writes)} ==={knobs}"]
    for s in k.body:
        format_stmt(s, 0, out)
    return "\n".join(out)


def signature(k: LoopKernel, buffers: dict) -> str:
    """A kernel's identity across programs and processes (the tuning database's key): its
    canonical Loop IR with buffers renamed in order of use, and their shapes and dtypes (or the
    default plan's kernel's, when a STORE decision changed it)."""
    if k.tuning_key:
        return k.tuning_key
    names = {n: f"buf{i}" for i, n in enumerate(dict.fromkeys(k.reads + k.writes))}

    def go(body):
        return tuple(replace(s, body=go(s.body)) if isinstance(s, Loop) else
                     replace(s, buf=names[s.buf]) if isinstance(s, (Load, Store)) else s
                     for s in body)
    k = replace(k, name="k", body=go(k.body), reads=(), writes=(), knobs=(), stores=())
    text = format_kernel(canonical_names(k, set(names.values())))
    shapes = [(new, tuple(buffers[old].shape), buffers[old].dtype) for old, new in names.items()]
    return hashlib.sha256(f"{text}\n{shapes}".encode()).hexdigest()[:24]
