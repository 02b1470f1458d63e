"""A kernel -> the same kernel with every global and shared access bounds-checked at run time.

Why: the simulator checks every access, but native code (C, OpenCL, CUDA) reads past the end of
a buffer silently or crashes far from the cause. `k[grid, block](..., checked=True)` runs this
pass: each load's index is tested and clamped to 0 when out of range (so nothing stray is read),
each store and atomic runs only in range, and the first fault seen is written to one extra
output `st_fault` (i64[2]: a flag, then index * SITES + site; a thread keeps the first it sees), which the launcher turns into the
simulator's sentence naming the user's line. Loads are checked before the statement holding them
(a `while` condition also at the end of each pass of its body): the DSL front end never puts a
load under a conditional expression, so each check runs exactly when the load does. A `while`
also ends once a fault is seen, as a clamped load could keep it going for ever.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.expr import Cast, Const, Expr, Op, map_expr
from .ir import (Assign, Atomic, Comment, For, If, Kernel, Let, Load, Param, Smem, Store, While,
                 walk)

FAULT = "st_fault"
SITES = 1 << 16                      # at most this many checked accesses in one kernel


@dataclass(frozen=True)
class Site:
    what: str                        # "load" | "store" | "atomic"
    buf: str
    size: int
    where: str                       # the user's file:line: code (the preceding Comment)

    def sentence(self, index: int) -> str:
        at = f" at {self.where}" if self.where else ""
        return f"out-of-bounds {self.what} of {self.buf}[{index}] (size {self.size}){at}."


def add_bounds_checks(k: Kernel) -> tuple[Kernel, list[Site]]:
    """(k with checked accesses and the `st_fault` output last, the access sites by number)."""
    sizes = {p.name: p.numel for p in k.params}
    sizes.update({s.name: s.size for s in walk(k.body) if isinstance(s, Smem)})
    sites: list[Site] = []
    where = [""]

    def in_bounds(index: Expr, buf: str) -> Expr:
        t = index.dtype
        return Op("logical_and", (Op("ge", (index, Const(0, t)), "bool"),
                                  Op("lt", (index, Const(sizes[buf], t)), "bool")), "bool")

    no_fault = Op("eq", (Load(FAULT, Const(0, "i32"), "i64"), Const(0, "i64")), "bool")

    def fault(what: str, buf: str, index: Expr) -> tuple:
        if len(sites) == SITES:
            raise ValueError(f"{k.name}: more than {SITES} accesses to check")
        sites.append(Site(what, buf, sizes[buf], where[0]))
        code = Op("add", (Op("multiply", (Cast(index, "i64"), Const(SITES, "i64")), "i64"),
                          Const(len(sites) - 1, "i64")), "i64")
        return (If(no_fault, (Store(FAULT, Const(0, "i32"), Const(1, "i64")),
                           Store(FAULT, Const(1, "i32"), code))),)

    def loads(e: Expr, checks: list) -> Expr:
        """e with each load's index clamped; the checks (inner loads first) appended."""
        def visit(x):
            if isinstance(x, Load) and x.buf in sizes:
                index = loads(x.index, checks)
                ok = in_bounds(index, x.buf)
                checks.append(If(Op("logical_not", (ok,), "bool"), fault("load", x.buf, index)))
                return replace(x, index=Op("where", (ok, index, Const(0, index.dtype)),
                                           index.dtype))
            return None
        return map_expr(e, visit)

    def body(stmts) -> tuple:
        out: list = []
        for s in stmts:
            checks: list = []
            if isinstance(s, Comment):
                where[0] = s.text
                out.append(s)
            elif isinstance(s, (Let, Assign)):
                s = replace(s, value=loads(s.value, checks))
                out += checks + [s]
            elif isinstance(s, (Store, Atomic)) and s.buf in sizes:
                s = replace(s, index=loads(s.index, checks), value=loads(s.value, checks))
                ok = in_bounds(s.index, s.buf)
                what = "store" if isinstance(s, Store) else "atomic"
                out += checks + [If(ok, (s,), fault(what, s.buf, s.index))]
            elif isinstance(s, For):
                s = replace(s, start=loads(s.start, checks), stop=loads(s.stop, checks))
                out += checks + [replace(s, body=body(s.body))]
            elif isinstance(s, If):
                s = replace(s, cond=loads(s.cond, checks))
                out += checks + [replace(s, then=body(s.then), orelse=body(s.orelse))]
            elif isinstance(s, While):             # a clamped load may never end it: a fault does
                cond = Op("logical_and", (loads(s.cond, checks), no_fault), "bool")
                out += checks + [replace(s, cond=cond, body=body(s.body) + tuple(checks))]
            else:
                out.append(s)
        return tuple(out)

    if FAULT in sizes:
        raise ValueError(f"{k.name}: a buffer is already named {FAULT}")
    checked = body(k.body)
    return (replace(k, params=k.params + (Param(FAULT, "i64", 2, output=True),), body=checked),
            sites)


def fault_sentence(kernel_name: str, fault, sites: list[Site]) -> str | None:
    """The sentence for a launch's `st_fault` values (flag, code), or None when none faulted."""
    flag, code = int(fault[0]), int(fault[1])
    if not flag:
        return None
    index, site = divmod(code, SITES)
    return f"{kernel_name}: {sites[site].sentence(index)}"
