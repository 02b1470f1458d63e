"""The LoopBuilder: a Tensor IR node's value at an index as Loop IR statements, inlining the
producers not materialized (lower.py's kernels, attention.py's operands and scatter.py build on it).
Each value is one SSA statement in the outermost scope where its operands exist (loop-invariant
code motion), reused if already computed there (CSE). A reduction opens its own reduce loop just
inside the loops it depends on, so `x` is summed once per row of RMSNorm, not once per output
element.
"""
from __future__ import annotations

from math import prod

from ..core import dtypes
from ..core.expr import Cast, Const, Expr, Op, Var, call, free_vars, simplify, substitute
from ..tensor.ir import Elementwise, Full, Gather, IndexMap, Input, Iota, Reduce, TensorProgram, IDX
from .ir import Accum, AccInit, Let, Load, Loop


class Scope:
    def __init__(self, parent: "Scope | None", var: str | None, extent: int, kind: str):
        self.parent, self.var, self.extent, self.kind = parent, var, extent, kind
        self.depth = 0 if parent is None else parent.depth + 1
        self.stmts: list = []
        self.memo: dict = {}
        self.accs: list[AccInit] = []


class LoopBuilder:
    def __init__(self, prog: TensorProgram, materialized: set[str], inline: set[str]):
        self.prog, self.nodes = prog, prog.by_name
        self.materialized, self.inline = materialized, inline
        self.counts: dict[str, int] = {}
        self.home: dict[str, Scope] = {}
        self.bounds: dict[str, int] = {}
        self.root = Scope(None, None, 1, "root")
        self.stack = [self.root]
        self.reads: list[str] = []

    # -------------------------------------------------------------- scopes and emission
    def fresh(self, prefix: str) -> str:
        """A new SSA or loop name, never a buffer's (the inputs of a *args function are in0...)."""
        n = self.counts.get(prefix, 0)
        while f"{prefix}{n}" in self.nodes or f"{prefix}{n}_i" in self.nodes:
            n += 1
        self.counts[prefix] = n + 1
        return f"{prefix}{n}"

    def open_loop(self, extent: int, kind: str, home_of_var: Scope | None = None) -> str:
        var = self.fresh("a")
        scope = Scope(self.stack[-1], var, extent, kind)
        self.stack.append(scope)
        self.home[var] = home_of_var or scope
        self.bounds[var] = extent
        return var

    def close_loop(self) -> None:
        scope = self.stack.pop()
        self.stack[-1].stmts.append(Loop(scope.var, scope.extent, scope.kind, tuple(scope.stmts),
                                         tuple(scope.accs)))

    def scope_for(self, exprs) -> Scope:
        """The deepest scope on the current stack that defines every variable used."""
        used = set().union(*(free_vars(e) for e in exprs if e is not None)) if exprs else set()
        best = self.root
        for v in used:
            s = self.home[v]
            if s.depth > best.depth:
                best = s
        return best

    def lookup(self, key):
        for s in reversed(self.stack):
            if key in s.memo:
                return s.memo[key]
        return None

    def emit(self, key, make, exprs) -> Var:
        hit = self.lookup(key)
        if hit is not None:
            return hit
        scope = self.scope_for(exprs)
        stmt = make()
        scope.stmts.append(stmt)
        v = Var(stmt.var, stmt.dtype)
        self.home[stmt.var] = scope
        scope.memo[key] = v
        return v

    def let(self, value: Expr, prefix: str = "v") -> Expr:
        if isinstance(value, (Const, Var)):
            return value
        return self.emit(("let", value), lambda: Let(self.fresh(prefix), value), [value])

    def load(self, buf: str, index: tuple[Expr, ...], dtype: str, pred: Expr | None) -> Var:
        if buf not in self.reads:
            self.reads.append(buf)
        return self.emit(("load", buf, index, pred),
                         lambda: Load(self.fresh("in"), buf, index, dtype, pred), [*index, pred])

    # -------------------------------------------------------------- values
    def value(self, name: str, index: tuple[Expr, ...], pred: Expr | None = None) -> Expr:
        key = ("node", name, index, pred)
        hit = self.lookup(key)
        if hit is not None:
            return hit
        n = self.nodes[name]
        cdt = dtypes.compute_dtype(n.type.dtype)
        if isinstance(n, Input) or (name in self.materialized and name not in self.inline):
            out = self.load(name, index, cdt, pred)
        elif isinstance(n, Full):
            out = Const(n.value, cdt)
        elif isinstance(n, Iota):
            out = self.let(_convert(index[n.axis], cdt))
        elif isinstance(n, Elementwise):
            out = self.elementwise(n, index, pred)
        elif isinstance(n, IndexMap):
            sub = self.through(n.index, index)
            valid = None if n.valid is None else self.through((n.valid,), index)[0]
            if isinstance(valid, Const):
                if not valid.value:
                    out = Const(n.fill, cdt)
                    self.stack[-1].memo[key] = out
                    return out
                valid = None
            inner = self.value(n.arg, sub, _and(pred, valid))
            out = inner if valid is None else self.let(call("where", self.let(valid), inner, Const(n.fill, cdt)))
        elif isinstance(n, Gather):
            idx = self.value(n.indices, index, pred)
            sub = self.through(n.index, index, {IDX.name: _convert(idx, "i64")})
            out = self.value(n.data, sub, pred)
        elif isinstance(n, Reduce):
            out = self.reduce(n, index, pred)
        else:
            raise TypeError(f"unknown Tensor IR node {n!r}")
        self.scope_for([out]).memo[key] = out
        return out

    def through(self, exprs, index, extra=None) -> tuple[Expr, ...]:
        mapping = {f"i{d}": e for d, e in enumerate(index)}
        if extra:
            mapping.update(extra)
        return tuple(substitute(e, mapping, self.bounds) for e in exprs)

    def elementwise(self, n: Elementwise, index, pred) -> Expr:
        cdt = dtypes.compute_dtype(n.type.dtype)
        if n.op == "where":
            vals = self.where_operands(n, index, pred)
        else:
            vals = [self.value(a, index, pred) if isinstance(a, str) else a for a in n.args]
        if n.op == "cast":
            (v,) = vals
            v = v if isinstance(v, Expr) else Const(v, cdt)
            want = n.type.dtype if n.type.dtype in dtypes.NARROW else cdt   # f16: round, hold as f32
            return self.let(Cast(v, want)) if v.dtype != want or want != cdt else v
        if n.op in _LOGICAL:
            operand_dts = ["bool"] * len(vals)
        elif n.op in _COMPARE:
            common = _common([v.dtype for v in vals if isinstance(v, Expr)] or [cdt],
                             [v for v in vals if not isinstance(v, Expr)])
            operand_dts = [common] * len(vals)
        elif n.op == "where":
            operand_dts = ["bool", cdt, cdt]
        else:
            operand_dts = [cdt] * len(vals)
        args = []
        for v, dt in zip(vals, operand_dts):
            if not isinstance(v, Expr):
                v = Const(v, dt)
            elif dtypes.compute_dtype(v.dtype) != dt:
                v = self.let(Cast(v, dt))
            args.append(v)
        out_dt = "bool" if n.op in _LOGICAL or n.op in _COMPARE else cdt
        return self.let(Op(n.op, tuple(args), out_dt))

    def where_operands(self, n: Elementwise, index, pred) -> list:
        """where(c, x, k), k a constant and x a gather: x is read only where c holds, so a masked
        lookup reads nothing it drops (a mixture-of-experts tile left empty reads no weights)."""
        c = self.value(n.args[0], index, pred) if isinstance(n.args[0], str) else n.args[0]
        vals = [c]
        for pos in (1, 2):
            a, other = n.args[pos], n.args[3 - pos]
            if isinstance(a, str) and isinstance(self.nodes[a], Gather) and isinstance(c, Var) \
                    and (not isinstance(other, str) or isinstance(self.nodes[other], Full)) \
                    and self.lookup(("node", a, index, pred)) is None:
                took = c if pos == 1 else self.let(call("logical_not", c))
                vals.append(self.value(a, index, _and(pred, took)))
            else:
                vals.append(self.value(a, index, pred) if isinstance(a, str) else a)
        return vals

    def reduce(self, n: Reduce, index, pred) -> Expr:
        src = self.nodes[n.arg]
        cdt = dtypes.compute_dtype(n.type.dtype)
        target = self.scope_for(list(index) + [pred])
        saved = self.stack
        self.stack = _chain(target)
        extent = prod(src.type.shape[d] for d in n.axes)
        r = self.open_loop(extent, "reduce")
        sub, stride = [], extent
        for d, s in enumerate(src.type.shape):
            if d in n.axes:
                stride //= s
                sub.append(simplify(Op("mod", (Op("floordiv", (Var(r), Const(stride)), "i64"), Const(s)), "i64"),
                                    self.bounds))
            else:
                sub.append(index[d])
        val = self.value(n.arg, tuple(sub), pred)
        acc = self.fresh("acc")
        arg = n.op in ("argmax", "argmin")
        acc_dt = dtypes.compute_dtype(src.type.dtype) if arg else cdt
        if val.dtype != acc_dt:
            val = self.let(Cast(val, acc_dt))
        scope = self.stack[-1]
        half = n.op == "sum" and isinstance(src, Elementwise) and src.op == "multiply" \
            and src.type.dtype in ("f16", "bf16")
        scope.stmts.append(Accum(acc, n.op, val, Var(r) if arg else None,
                                 src.type.dtype if half else None))
        scope.accs.append(AccInit(acc, n.op, acc_dt))
        self.close_loop()
        self.stack = saved
        self.home[acc] = target
        if arg:
            self.home[acc + "_i"] = target
            return Var(acc + "_i", "i64")
        return Var(acc, acc_dt)


_LOGICAL = ("logical_and", "logical_or", "logical_xor", "logical_not")
_COMPARE = ("eq", "ne", "lt", "le", "gt", "ge", "isnan")


def _common(tensor_dts: list[str], scalars: list) -> str:
    """The type two operands of a comparison are compared in (PyTorch-style promotion)."""
    dts = [dtypes.compute_dtype(d) for d in tensor_dts]
    if any(dtypes.is_float(d) for d in dts) or any(isinstance(s, float) for s in scalars):
        return "f32" if all(d != "f64" for d in dts) else "f64"
    if all(d == "bool" for d in dts) and all(isinstance(s, bool) for s in scalars):
        return "bool"
    return "i64"


def _convert(e: Expr, dtype: str) -> Expr:
    return e if e.dtype == dtype else Cast(e, dtype)


def _and(a: Expr | None, b: Expr | None) -> Expr | None:
    if a is None:
        return b
    if b is None:
        return a
    return call("logical_and", a, b)


def _chain(scope: Scope) -> list[Scope]:
    out = []
    while scope is not None:
        out.append(scope)
        scope = scope.parent
    return out[::-1]
