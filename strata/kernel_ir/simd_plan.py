"""Which loops of a one-thread-per-block kernel may run as SIMD (`#pragma omp simd`), with what reductions.

Why: without -ffast-math gcc and clang keep a float reduction (`acc += x[i]`) in source order, so
they do not vectorise it; `#pragma omp simd reduction(+:acc)` is the programmer's permission to
reassociate it (partial sums per vector lane, added at the end). That changes the rounding of a
sum by about one ulp per lane, which the 1e-5 tolerances absorb. Other loops are vectorised by the
compiler when it can prove them independent; the pragma only saves it the runtime alias checks and
lets it if-convert stores, so it is given only where this module proves the iterations independent.

A loop gets the pragma when all of this holds (anything else: no pragma, the loop runs as written):
  - it is innermost (no For inside);
  - every variable it assigns is declared inside it, or is an *accumulator*: declared outside, only
    updated as `acc = op(acc, value)` (op add, multiply, maximum, minimum; `value` free of acc) and
    read nowhere else in the loop. Maximum/minimum reduce with OpenMP's `max`/`min` (vmaxps, a
    tree at the end); a float one ORs a flag of NaNs seen and is NaN after the loop if it is set.
  - each stored buffer is written at indices `c * var + k + (invariant)` with one c != 0 and one
    invariant part (Lets of the loop body substituted), the offsets k spanning less than
    |c| * step: distinct iterations write distinct elements; and it is loaded, if at all, only
    at the one index it is stored at (`cache[i] = cache[i] + x[i]`).
An argmax (a value and an index updated together through `where`) assigns outer variables that are
not accumulators in this sense, so its loop runs in order, as the simulator runs it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import dtypes
from ..core.expr import Const, Expr, Op, Var, affine_terms, free_vars, nodes, substitute
from .ir import Assign, Comment, For, If, Let, Load, LoadVec, Store, StoreVec

_CLAUSE = {"add": "+", "multiply": "*", "maximum": "max", "minimum": "min"}


@dataclass(frozen=True)
class LoopPlan:
    simd: bool
    reductions: tuple[tuple[str, str], ...] = ()     # (clause operator, IR variable), sorted
    nan_flags: tuple[str, ...] = ()                   # float max/min accumulators (NaN flagged)

    def pragma(self, cname) -> str | None:
        """`#pragma omp simd [reduction(op:a, b) ...]`, or None for no pragma."""
        if not self.simd:
            return None
        by_op: dict[str, list[str]] = {}
        for op, var in self.reductions + tuple(("|", f"{v}_nan") for v in self.nan_flags):
            by_op.setdefault(op, []).append(cname(var))
        clauses = "".join(f" reduction({op}:{', '.join(vs)})" for op, vs in by_op.items())
        return f"#pragma omp simd{clauses}"


NO_SIMD = LoopPlan(False)


def plan_loop(loop: For, types: dict[str, str]) -> LoopPlan:
    """The pragma `loop` may take (see the module docstring); `types`: IR dtype of each variable
    declared in the kernel."""
    inner: set[str] = {loop.var}            # declared inside the loop
    assigned: dict[str, list[Expr]] = {}    # outer variables assigned, with their new values
    lets: dict[str, Expr] = {}
    redeclared: set[str] = set()
    stores: list[tuple[str, Expr]] = []
    exprs: list[Expr] = [loop.start, loop.stop]

    def scan(body) -> bool:
        for s in body:
            if isinstance(s, For):
                return False
            if isinstance(s, Let):
                if s.var in inner:
                    redeclared.add(s.var)
                inner.add(s.var)
                lets[s.var] = s.value
                exprs.append(s.value)
            elif isinstance(s, LoadVec):
                inner.update(s.vars)
                redeclared.update(s.vars)          # not substitutable into an index
                exprs.append(Load(s.buf, s.index, s.dtype))
            elif isinstance(s, Assign):
                if s.var in inner:
                    redeclared.add(s.var)
                else:
                    assigned.setdefault(s.var, []).append(s.value)
                exprs.append(s.value)
            elif isinstance(s, Store):
                stores.append((s.buf, s.index))
                exprs.extend((s.index, s.value))
            elif isinstance(s, StoreVec):
                stores.extend((s.buf, Op("add", (s.index, Const(k, "i64")), "i64"))
                              for k in range(len(s.values)))
                exprs.append(s.index)
                exprs.extend(s.values)
            elif isinstance(s, If):
                exprs.append(s.cond)
                if not (scan(s.then) and scan(s.orelse)):
                    return False
            elif not isinstance(s, Comment):
                return False
        return True

    if loop.step <= 0 or not scan(loop.body) or loop.var in assigned:
        return NO_SIMD
    reductions = []
    for var, values in sorted(assigned.items()):
        op = _accumulator_op(var, values, types.get(var, ""))
        if op is None:
            return NO_SIMD
        reductions.append((op, var))
    flagged = tuple(v for op, v in reductions if op in ("max", "min") and dtypes.is_float(types[v]))
    accs = set(assigned)
    uses = [e for e in exprs if free_vars(e) & accs]
    # each accumulator appears only in its own update, once, as an operand of the combine
    for var, values in assigned.items():
        for v in values:
            uses.remove(v)
    if uses:
        return NO_SIMD
    if not _independent_stores(loop, stores, exprs, lets, inner - redeclared, inner):
        return NO_SIMD
    return LoopPlan(True, tuple(reductions), flagged)


def _accumulator_op(var: str, values: list[Expr], dtype: str) -> str | None:
    """The reduction clause operator when every value is `op(var, x)` with one op and x free of
    var, else None."""
    ops = set()
    for v in values:
        if not (isinstance(v, Op) and v.op in _CLAUSE and len(v.args) == 2):
            return None
        a, b = v.args
        if not (isinstance(a, Var) and a.name == var) and isinstance(b, Var) and b.name == var:
            a, b = b, a                   # every combine op here is commutative
        if not (isinstance(a, Var) and a.name == var) or var in free_vars(b):
            return None
        ops.add(v.op)
    if len(ops) != 1 or dtype not in dtypes.ALL or dtype == "bool":
        return None
    return _CLAUSE[ops.pop()]


def _independent_stores(loop: For, stores, exprs, lets, substitutable, inner) -> bool:
    """Per stored buffer, indices c * var + k + one invariant part with offsets k spanning less
    than |c| * step; a stored buffer may be loaded only at the one index it is stored at."""
    loads: dict[str, set[Expr]] = {}
    for e in exprs:
        for ld in _loads(e):
            loads.setdefault(ld.buf, set()).add(_inline(ld.index, lets, substitutable))
    by_buf: dict[str, list[Expr]] = {}
    for buf, index in stores:
        by_buf.setdefault(buf, []).append(_inline(index, lets, substitutable))
    for buf, indices in by_buf.items():
        if buf in loads and (len(set(indices)) != 1 or loads[buf] != set(indices)):
            return False
        shapes = set()
        offsets = []
        for e in indices:
            if free_vars(e) & (inner - {loop.var}) or any(True for _ in _loads(e)):
                return False
            lin = affine_terms(e)
            if lin is None:
                return False
            terms, k = lin
            coeff = sum(c for a, c in terms.items() if _is_var(a, loop.var))
            rest = {a: c for a, c in terms.items() if not _is_var(a, loop.var)}
            if any(loop.var in free_vars(a) for a in rest):
                return False
            shapes.add((coeff, frozenset((str(a), c) for a, c in rest.items())))
            offsets.append(k)
        if len(shapes) != 1:
            return False
        coeff = next(iter(shapes))[0]
        if coeff == 0 or max(offsets) - min(offsets) >= abs(coeff) * loop.step:
            return False
    return True


def _inline(e: Expr, lets: dict[str, Expr], substitutable: set[str]) -> Expr:
    """e with the loop body's Lets substituted (to a fixpoint: Lets refer to earlier Lets)."""
    for _ in range(len(lets) + 1):
        names = free_vars(e) & substitutable & set(lets)
        if not names:
            return e
        e = substitute(e, {n: lets[n] for n in names})
    return e


def _is_var(atom, name: str) -> bool:
    return isinstance(atom, Var) and atom.name == name


def _loads(e: Expr):
    return (x for x in nodes(e) if isinstance(x, Load))
