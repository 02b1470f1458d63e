"""A @strata.kernel function's Python source -> one Kernel IR kernel (no second IR stack).

Why straight to Kernel IR: a hand-written kernel is already SIMT (threads, shared memory,
barriers), which is what Kernel IR says; its verifier, simulator, emitters and runtime then apply
unchanged. The front end is specialised per launch (Spec): tensor dtypes and shapes, the grid
and block, and the constexpr values are compiled in; int/float/bool arguments stay runtime
scalars (Kernel.scalars).
Python's scoping is kept: a variable first set inside an `if` or a loop and read after it is
declared before it; `break`, `continue` and `return` become flags that guard what follows;
`and`/`or`/`x if c else y` evaluate their second operand only when Python would (a bounds test
guards a load, as in `if i < n and x[i] > 0`). Each statement is preceded by a Comment naming
the user's file, line and code, which the emitted sources print and the simulator cites in its
errors. Anything else is a KernelSyntaxError naming the file and line.
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import textwrap
from dataclasses import dataclass, field
from math import prod

from ..core import dtypes
from ..core.errors import KernelSyntaxError
from ..core.expr import Cast, Const, Expr, Op, Var
from ..kernel_ir.ir import (Assign, Atomic, BlockIdx, Comment, For, If, Kernel, Let, Load, Param,
                         ShflIdx, ShflXor, Smem, Store, Sync, ThreadIdx, While)
from . import lang

_BIN = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "divide",
        ast.FloorDiv: "floordiv", ast.Mod: "mod", ast.Pow: "pow"}
_CMP = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_RANK = {"bool": 0, "i32": 1, "i64": 2, "f32": 3, "f64": 4}


@dataclass
class Spec:
    """One specialisation: per parameter ("tensor", dtype, shape) | ("scalar", dtype) |
    ("const", value), and the launch shape (grid and block as 3-tuples)."""
    params: dict
    grid: tuple
    block: tuple
    names: dict = field(default_factory=dict)   # parameter -> the buffer it is (custom ops)


@dataclass
class _Tensor:
    name: str
    dtype: str                  # storage dtype
    shape: tuple
    written: bool = False                   # stored to or updated atomically

    @property
    def compute(self) -> str:
        return dtypes.compute_dtype(self.dtype)


def build(fn, spec: Spec, name: str | None = None) -> Kernel:
    """The Kernel IR of `fn` under `spec` (KernelSyntaxError on what it cannot compile)."""
    return _Builder(fn, spec).kernel(name or fn.__name__)


def _kind(dtype: str) -> str:
    return "f32" if dtype in ("f16", "bf16") else dtype


def _promote(a: str, b: str) -> str:
    a, b = _kind(a), _kind(b)
    out = a if _RANK[a] >= _RANK[b] else b
    return "i32" if out == "bool" else out


class _Builder:
    def __init__(self, fn, spec: Spec):
        self.spec, self.fn = spec, fn
        try:
            lines, first = inspect.getsourcelines(fn)
            self.file = inspect.getsourcefile(fn) or "<kernel>"
        except (OSError, TypeError) as e:
            raise KernelSyntaxError(f"the source of {fn.__name__} cannot be read ({e}); define "
                                    f"@strata.kernel functions in a file") from None
        self.lines, self.first = lines, first
        tree = ast.parse(textwrap.dedent("".join(lines)))
        self.tree = tree.body[0]
        self.names: dict = {}               # python name -> binding
        self.taken: set[str] = set()
        self.params: list[Param] = []
        self.scalars: list[tuple[str, str]] = []
        self.body: list = []
        self.smem: list[Smem] = []
        self.loops: list[dict] = []         # flags of the enclosing loops: {"brk": v, "cont": v}
        self.ret = None                     # the return flag, once a return needs one
        self.node = self.tree
        self.globals = fn.__globals__
        self.refs: dict[str, set] = {}      # python name -> ids of every Name node naming it
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Name):
                self.refs.setdefault(n.id, set()).add(id(n))

    # ------------------------------------------------------------ errors and names

    def fail(self, why: str, node=None):
        line = getattr(node or self.node, "lineno", 1) + self.first - 1
        raise KernelSyntaxError(f"{self.file}:{line}: {why}")

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def where(self, node) -> Comment:
        line = node.lineno + self.first - 1
        text = self.lines[node.lineno - 1].strip() if node.lineno <= len(self.lines) else ""
        return Comment(f"{self.file.rsplit('/', 1)[-1]}:{line}: {text}")

    # ------------------------------------------------------------ the kernel

    def kernel(self, name: str) -> Kernel:
        f = self.tree
        if not isinstance(f, ast.FunctionDef):
            self.fail("@strata.kernel decorates a function")
        a = f.args
        if a.vararg or a.kwarg or a.posonlyargs or a.kwonlyargs:
            self.fail("a kernel's parameters are plain names (no *args, **kwargs or keyword-only)")
        self.taken |= set(self.spec.names.values())
        for arg in a.args:
            self.taken.add(arg.arg)
            kind = self.spec.params[arg.arg]
            if kind[0] == "tensor":
                buf = self.spec.names.get(arg.arg, arg.arg)
                self.names[arg.arg] = _Tensor(buf, kind[1], tuple(kind[2]))
            elif kind[0] == "scalar":
                self.scalars.append((arg.arg, kind[1]))
                self.names[arg.arg] = Var(arg.arg, kind[1])
            else:
                self.names[arg.arg] = kind[1]
        self.body = []
        self.block(f.body, self.body)
        body = tuple(self.smem) + tuple(self.body)
        if self.ret is not None:
            body = (Let(self.ret, "bool", Const(False, "bool")),) + body
        for arg in a.args:
            t = self.names.get(arg.arg)
            if isinstance(t, _Tensor):
                self.params.append(Param(t.name, t.dtype, prod(t.shape), t.written))
        return Kernel(name, tuple(self.params), prod(self.spec.grid), prod(self.spec.block), body,
                      src=f"@strata.kernel {self.fn.__qualname__} ({self.file}:{self.first})",
                      scalars=tuple(self.scalars))

    # ------------------------------------------------------------ statements

    def block(self, stmts, out: list) -> None:
        """Compile `stmts` into `out`; after a statement that may break, continue or return, the
        rest runs under `if not (flags)`."""
        for i, s in enumerate(stmts):
            self.node = s
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):
                out.append(self.where(s))
            with self.into(out):
                self.stmt(s)
            flags = self.exit_flags(s)
            if flags and i + 1 < len(stmts):
                rest: list = []
                self.block(stmts[i + 1:], rest)
                cond = Op("logical_not", (self.any_of(flags),), "bool")
                out.append(If(cond, tuple(rest)))
                return

    def exit_flags(self, s) -> list[str]:
        """The flags statement `s` may set that stop what follows it in its body."""
        out = []
        for n in _walk_same_loop(s):
            if isinstance(n, ast.Return) and self.ret:
                out.append(self.ret)
            elif isinstance(n, ast.Break) and self.loops:
                out.append(self.loops[-1]["brk"])
            elif isinstance(n, ast.Continue) and self.loops:
                out.append(self.loops[-1]["cont"])
        return list(dict.fromkeys(out))

    def any_of(self, flags) -> Expr:
        e: Expr = Var(flags[0], "bool")
        for f in flags[1:]:
            e = Op("logical_or", (e, Var(f, "bool")), "bool")
        return e

    def emit(self, s) -> None:
        self.body.append(s)

    @contextlib.contextmanager
    def into(self, out: list):
        """Emit into `out` for a while (a branch, a loop body, a condition's statements)."""
        saved, self.body = self.body, out
        try:
            yield out
        finally:
            self.body = saved

    def stmt(self, s) -> None:
        if isinstance(s, ast.Assign):
            if len(s.targets) != 1:
                self.fail("chained assignment (a = b = c) is not supported; assign one at a time")
            self.assign(s.targets[0], s.value)
        elif isinstance(s, ast.AnnAssign) and s.value is not None:
            self.assign(s.target, s.value)
        elif isinstance(s, ast.AugAssign):
            op = _BIN.get(type(s.op)) or self.fail(f"the operator {type(s.op).__name__} is not "
                                                   f"supported")
            load = ast.parse(ast.unparse(s.target), mode="eval").body
            self.assign(s.target, ast.BinOp(load, s.op, s.value))
        elif isinstance(s, ast.If):
            self.nested(lambda: self.if_(s), s)
        elif isinstance(s, ast.For):
            self.nested(lambda: self.for_(s), s)
        elif isinstance(s, ast.While):
            self.nested(lambda: self.while_(s), s)
        elif isinstance(s, (ast.Break, ast.Continue)):
            if not self.loops:
                self.fail(f"{type(s).__name__.lower()} outside a loop")
            key = "brk" if isinstance(s, ast.Break) else "cont"
            self.emit(Assign(self.loops[-1][key], Const(True, "bool")))
        elif isinstance(s, ast.Return):
            if s.value is not None:
                self.fail("a kernel returns nothing: write its results into an output tensor")
            if self.ret is None:
                self.ret = self.fresh("returned")
            self.emit(Assign(self.ret, Const(True, "bool")))
        elif isinstance(s, ast.Expr):
            if isinstance(s.value, ast.Constant):
                return                                          # a docstring
            if not isinstance(s.value, ast.Call):
                self.fail("an expression statement does nothing; assign its value")
            self.call_stmt(s.value)
        elif isinstance(s, ast.Pass):
            return
        else:
            self.fail(f"`{type(s).__name__}` statements are not supported in a kernel")

    def nested(self, build, node) -> None:
        """Compile a compound statement. A variable first set inside it that is used outside
        the one body that sets it (after it, or in the other branch of an if) is declared
        before it: Python's function scope in C's block scope."""
        before = dict(self.names)
        mark = len(self.body)
        build()
        bodies = [{id(n) for s in b for n in ast.walk(s)} for b in _bodies(node)]
        hoist = {}
        for name in [n for n in self.names if n not in before]:     # in order: same C each run
            v = self.names.pop(name)
            refs = self.refs.get(name, ())
            if isinstance(v, tuple) and v[0] == "var" and not any(refs <= b for b in bodies):
                hoist[v[1]] = v[2]
                self.names[name] = v
        if hoist:
            stmts = _lets_to_assigns(self.body[mark:], set(hoist))
            self.body[mark:] = [Let(v, t, Const(0 if t != "bool" else False, t))
                                for v, t in hoist.items()] + stmts

    def if_(self, s: ast.If) -> None:
        cond = self.truth(self.expr(s.test))
        then, orelse = [], []
        self.block(s.body, then)
        self.block(s.orelse, orelse)
        self.emit(If(cond, tuple(then), tuple(orelse)))

    def loop_flags(self, s) -> dict:
        names = {type(n) for n in _walk_same_loop_body(s.body)}
        flags = {}
        for key, kind in (("brk", ast.Break), ("cont", ast.Continue)):
            if kind in names:
                flags[key] = self.fresh(key)
                self.emit(Let(flags[key], "bool", Const(False, "bool")))
        if ast.Return in {type(n) for n in ast.walk(s)} and self.ret is None:
            self.ret = self.fresh("returned")
        return flags

    def loop_body(self, s, flags: dict) -> list:
        """The statements of a loop's body: the continue flag reset, then the body."""
        self.loops.append(flags)
        body: list = []
        if "cont" in flags:
            body.append(Assign(flags["cont"], Const(False, "bool")))
        self.block(s.body, body)
        self.loops.pop()
        return body

    def stop_cond(self, flags) -> Expr | None:
        names = [f for f in (flags.get("brk"), self.ret) if f]
        return Op("logical_not", (self.any_of(names),), "bool") if names else None

    def for_(self, s: ast.For) -> None:
        it = s.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                and 1 <= len(it.args) <= 3 and not it.keywords):
            self.fail("a kernel loops with `for i in range(...)` only", it)
        if not isinstance(s.target, ast.Name) or s.orelse:
            self.fail("a for loop takes one name and no else", s)
        args = [self.int_expr(a) for a in it.args]
        start, stop = (Const(0, "i32"), args[0]) if len(args) == 1 else (args[0], args[1])
        step = 1
        if len(args) == 3:
            v = self.const_value(it.args[2])
            if not isinstance(v, int) or v <= 0:
                self.fail("a range step must be a positive constant", it.args[2])
            step = v
        dtype = _promote(start.dtype, stop.dtype)
        var = self.fresh(s.target.id)
        flags = self.loop_flags(s)
        shadowed = self.names.get(s.target.id)
        self.names[s.target.id] = ("var", var, dtype)
        body = self.loop_body(s, flags)
        if shadowed is not None:
            self.names[s.target.id] = shadowed
        else:               # (Python keeps the last value; a kernel reads it inside the loop)
            del self.names[s.target.id]
        stop_cond = self.stop_cond(flags)
        if stop_cond is None:
            self.emit(For(var, start, stop, step, tuple(body), dtype=dtype))
            return
        # a loop that may stop early: while (i < stop && !flags) { body; i += step }
        self.emit(Let(var, dtype, start))
        body.append(Assign(var, Op("add", (Var(var, dtype), Const(step, dtype)), dtype)))
        test = Op("lt", (Var(var, dtype), Cast(stop, dtype)), "bool")
        self.emit(While(Op("logical_and", (stop_cond, test), "bool"), tuple(body)))

    def while_(self, s: ast.While) -> None:
        if s.orelse:
            self.fail("while ... else is not supported", s)
        flags = self.loop_flags(s)
        go = self.fresh("go")
        with self.into([]) as cond_stmts:
            cond = self.truth(self.expr(s.test))
        stop_cond = self.stop_cond(flags)
        body = self.loop_body(s, flags)
        recompute = [*cond_stmts, Assign(go, cond)]      # cited as the `while` line (the Comment)
        if stop_cond is not None:
            recompute = [Assign(go, Const(False, "bool")), If(stop_cond, tuple(recompute))]
        self.body += cond_stmts
        self.emit(Let(go, "bool", cond))
        self.emit(While(Var(go, "bool"), tuple(body + [self.where(s)] + recompute)))

    def assign(self, target, value_node) -> None:
        if isinstance(target, ast.Tuple):
            if not isinstance(value_node, ast.Tuple) or len(value_node.elts) != len(target.elts):
                self.fail("unpacking takes a tuple of as many values: a, b = x, y")
            values = [self.expr(v) for v in value_node.elts]
            temps = []
            for v in values:                 # all values first: a, b = b, a swaps
                t = self.fresh("tmp")
                self.emit(Let(t, v.dtype, v))
                temps.append(Var(t, v.dtype))
            for t, v in zip(target.elts, temps):
                self.store_to(t, v)
            return
        if isinstance(value_node, ast.Call) and _fn_name(value_node, self.globals) == "shared":
            if not isinstance(target, ast.Name):
                self.fail("st.shared(...) is assigned to a name")
            self.shared(target.id, value_node)
            return
        self.store_to(target, self.expr(value_node))

    def store_to(self, target, value: Expr) -> None:
        if isinstance(target, ast.Name):
            b = self.names.get(target.id)
            if isinstance(b, tuple) and b[0] == "var":
                if dtypes.is_float(_kind(value.dtype)) and not dtypes.is_float(b[2]):
                    self.fail(f"{target.id} holds an integer and is assigned a float here (it "
                              f"would be truncated); start it as a float, e.g. {target.id} = 0.0")
                self.emit(Assign(b[1], self.cast(value, b[2])))
            elif target.id in self.names:
                self.fail(f"{target.id} is a kernel argument or a shared array and cannot be "
                          f"assigned; copy it into a new variable")
            else:
                if value.dtype in ("f16", "bf16"):
                    value = Cast(value, "f32")
                var = self.fresh(target.id)
                self.names[target.id] = ("var", var, _kind(value.dtype))
                self.emit(Let(var, _kind(value.dtype), value))
        elif isinstance(target, ast.Subscript):
            t, index = self.element(target)
            t.written = True
            self.emit(Store(t.name, index, self.cast(value, t.compute)))
        else:
            self.fail("assign to a name or to an element (out[i] = ...)")

    def shared(self, name: str, call: ast.Call) -> None:
        if len(call.args) != 2 or call.keywords:
            self.fail("st.shared takes a shape and a dtype: st.shared((256,), st.float32)")
        shape = self.const_value(call.args[0])
        shape = (shape,) if isinstance(shape, int) else shape
        dtype = self.const_value(call.args[1])
        if not (isinstance(shape, tuple) and shape and all(isinstance(n, int) and n > 0
                                                            for n in shape)):
            self.fail("st.shared's shape is a tuple of positive constant integers")
        if not isinstance(dtype, lang.DType):
            self.fail("st.shared's dtype is an st dtype such as st.float32")
        if name in self.names:
            self.fail(f"{name} is already defined; a shared array needs a new name")
        arr = _Tensor(self.fresh(name), dtype.strata, shape)
        self.names[name] = arr
        self.smem.append(Smem(arr.name, dtype.strata, prod(shape)))

    def call_stmt(self, c: ast.Call) -> None:
        fn = _fn_name(c, self.globals)
        if fn == "barrier":
            self.emit(Sync())
        elif fn in ("atomic_add", "atomic_max", "atomic_min"):
            if len(c.args) != 3:
                self.fail(f"st.{fn} takes a tensor, an index and a value")
            buf = self.names.get(getattr(c.args[0], "id", None))
            if not isinstance(buf, _Tensor):
                self.fail(f"st.{fn}'s first argument is a tensor or shared array")
            index = self.flat_index(buf, c.args[1].elts if isinstance(c.args[1], ast.Tuple)
                                    else [c.args[1]], c)
            if buf.dtype not in ("f32", "i32", "i64"):
                self.fail(f"st.{fn} works on float32, int32 and int64 tensors, not {buf.dtype}")
            buf.written = True
            self.emit(Atomic(fn[7:], buf.name, index, self.cast(self.expr(c.args[2]), buf.dtype)))
        else:
            self.fail(f"a call to {ast.unparse(c.func)} as a statement does nothing (only "
                      f"st.barrier() and st.atomic_* are statements)")

    # ------------------------------------------------------------ expressions

    def const_value(self, node):
        """The Python value of a constant expression (literals, constexpr names, st dtypes)."""
        try:
            code = compile(ast.Expression(node), "<const>", "eval")
            consts = {k: v for k, v in self.names.items() if not isinstance(v, (tuple, Var, _Tensor))}
            return eval(code, dict(self.globals), consts)
        except Exception:
            self.fail(f"{ast.unparse(node)} must be a constant here")

    def expr(self, n) -> Expr:
        if isinstance(n, ast.Constant):
            v = n.value
            if isinstance(v, bool):
                return Const(v, "bool")
            if isinstance(v, int):
                return Const(v, "i32" if -2 ** 31 <= v < 2 ** 31 else "i64")
            if isinstance(v, float):
                return Const(v, "f32")
            self.fail(f"the constant {v!r} is not a number")
        if isinstance(n, ast.Name):
            return self.name(n)
        if isinstance(n, ast.BinOp):
            op = _BIN.get(type(n.op))
            if op is None:
                self.fail(f"the operator {type(n.op).__name__} is not supported (bitwise "
                          f"operators are not yet)")
            return self.binary(op, self.expr(n.left), self.expr(n.right))
        if isinstance(n, ast.UnaryOp):
            v = self.expr(n.operand)
            if isinstance(n.op, ast.USub):
                return Op("negative", (v,), _kind(v.dtype) if v.dtype != "bool" else "i32")
            if isinstance(n.op, ast.Not):
                return Op("logical_not", (self.truth(v),), "bool")
            if isinstance(n.op, ast.UAdd):
                return v
            self.fail("bitwise ~ is not supported yet")
        if isinstance(n, ast.Compare):
            return self.compare(n)
        if isinstance(n, ast.BoolOp):
            return self.short_circuit(n)
        if isinstance(n, ast.IfExp):
            return self.if_exp(n)
        if isinstance(n, ast.Subscript):
            t, index = self.element(n)
            return Load(t.name, index, t.compute)
        if isinstance(n, ast.Call):
            return self.call(n)
        if isinstance(n, ast.Attribute):
            v = self.const_value(n)
            if isinstance(v, (int, float)):
                return self.expr(ast.Constant(v))
        self.fail(f"`{ast.unparse(n)}` is not supported in a kernel", n)

    def name(self, n: ast.Name) -> Expr:
        b = self.names.get(n.id)
        if isinstance(b, tuple) and b[0] == "var":
            return Var(b[1], b[2])
        if isinstance(b, Var):
            return b
        if isinstance(b, _Tensor):
            self.fail(f"{n.id} is a tensor: index it ({n.id}[i])", n)
        if n.id in self.names:
            return self.expr(ast.Constant(b))
        v = self.globals.get(n.id)
        if isinstance(v, (bool, int, float)):
            return self.expr(ast.Constant(v))
        self.fail(f"{n.id} is not defined in the kernel (a global number is allowed)", n)

    def binary(self, op: str, a: Expr, b: Expr) -> Expr:
        t = _promote(a.dtype, b.dtype)
        if op in ("divide", "pow") and not dtypes.is_float(t):
            t = "f32"
        a, b = self.cast(a, t), self.cast(b, t)
        if op == "floordiv" and dtypes.is_float(t):
            return Op("floor", (Op("divide", (a, b), t),), t)
        if op in ("floordiv", "mod") and not dtypes.is_float(t):
            return _python_int_division(op, a, b, t)
        return Op(op, (a, b), t)

    def cast(self, v: Expr, dtype: str) -> Expr:
        """v as dtype; a literal is converted exactly (2 and 1e-12 take the other side's type,
        not float32's rounding first)."""
        if v.dtype == dtype:
            return v
        if isinstance(v, Const) and dtype in _RANK:
            kind = bool if dtype == "bool" else float if dtypes.is_float(dtype) else int
            return Const(kind(v.value), dtype)
        return Cast(v, dtype)

    def select(self, cond: Expr, a: Expr, b: Expr) -> Expr:
        """cond ? a : b, both evaluated, in their promoted type."""
        t = _promote(a.dtype, b.dtype)
        return Op("where", (cond, self.cast(a, t), self.cast(b, t)), t)

    def truth(self, v: Expr) -> Expr:
        return self.cast(v, "bool")

    def int_expr(self, n) -> Expr:
        v = self.expr(n)
        if not dtypes.is_int(v.dtype):
            self.fail(f"{ast.unparse(n)} must be an integer", n)
        return v

    def compare(self, n: ast.Compare) -> Expr:
        left, out = self.expr(n.left), None
        for op, right_node in zip(n.ops, n.comparators):
            name = _CMP.get(type(op)) or self.fail(f"the comparison {type(op).__name__} is not "
                                                   f"supported")
            right = self.expr(right_node)
            t = _promote(left.dtype, right.dtype)
            e = Op(name, (self.cast(left, t), self.cast(right, t)), "bool")
            out = e if out is None else Op("logical_and", (out, e), "bool")
            left = right
        return out

    def short_circuit(self, n: ast.BoolOp) -> Expr:
        """a and b: t = a; if t: t = b (b is evaluated only when Python would)."""
        t = self.fresh("cond")
        self.emit(Let(t, "bool", self.truth(self.expr(n.values[0]))))
        for v in n.values[1:]:
            with self.into([]) as inner:
                value = self.truth(self.expr(v))
            inner.append(Assign(t, value))
            cond = Var(t, "bool")
            if isinstance(n.op, ast.Or):
                cond = Op("logical_not", (cond,), "bool")
            self.emit(If(cond, tuple(inner)))
        return Var(t, "bool")

    def if_exp(self, n: ast.IfExp) -> Expr:
        cond = self.truth(self.expr(n.test))
        sides = []
        for branch in (n.body, n.orelse):
            with self.into([]) as stmts:
                sides.append((self.expr(branch), stmts))
        if not sides[0][1] and not sides[1][1] and not any(
                isinstance(x, ast.Subscript) for b in (n.body, n.orelse) for x in ast.walk(b)):
            return self.select(cond, sides[0][0], sides[1][0])
        t = _promote(sides[0][0].dtype, sides[1][0].dtype)
        var = self.fresh("pick")
        self.emit(Let(var, t, Const(0 if t != "bool" else False, t)))
        branches = [tuple(stmts) + (Assign(var, self.cast(v, t)),) for v, stmts in sides]
        self.emit(If(cond, branches[0], branches[1]))
        return Var(var, t)

    def element(self, n: ast.Subscript) -> tuple[_Tensor, Expr]:
        if not isinstance(n.value, ast.Name) or not isinstance(self.names.get(n.value.id), _Tensor):
            self.fail(f"only tensors and shared arrays can be indexed, not {ast.unparse(n.value)}")
        t = self.names[n.value.id]
        idx = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
        if any(isinstance(i, ast.Slice) for i in idx):
            self.fail("slices are not supported in a kernel: index one element at a time", n)
        return t, self.flat_index(t, idx, n)

    def flat_index(self, t: _Tensor, idx, node) -> Expr:
        """x[i] (flat, any rank) or x[i, j, ...] (one index per dimension, row-major)."""
        exprs = [self.int_expr(i) for i in idx]
        if len(exprs) == 1:
            return exprs[0]
        if len(exprs) != len(t.shape):
            self.fail(f"{t.name} has {len(t.shape)} dimensions but {len(exprs)} indices", node)
        wide = prod(t.shape) >= 2 ** 31
        out: Expr | None = None
        for e, stride in zip(exprs, [prod(t.shape[k + 1:]) for k in range(len(t.shape))]):
            if wide:
                e = self.cast(e, "i64")
            term = e if stride == 1 else Op("multiply", (e, Const(stride, e.dtype)), e.dtype)
            out = term if out is None else self.binary("add", out, term)
        return out

    def call(self, c: ast.Call) -> Expr:
        fn = _fn_name(c, self.globals)
        args = c.args
        if c.keywords:
            self.fail(f"{ast.unparse(c.func)} takes positional arguments only", c)
        if fn in lang.INDEX_FNS:
            return self.index_fn(fn, c)
        if fn in ("int", "float") and len(args) == 1 and isinstance(args[0], ast.Constant):
            return self.expr(ast.Constant(self.const_value(c)))       # float("inf")
        if fn in lang.DTYPES or fn in ("int", "float"):
            dt = {"int": "i32", "float": "f32"}.get(fn) or lang.DTYPES[fn].strata
            return self.cast(self.expr(args[0]), dt)
        if fn in lang.UNARY:
            v = self.expr(args[0])
            t = _kind(v.dtype) if fn in ("abs", "relu") else (
                v.dtype if v.dtype == "f64" else "f32")
            if fn == "isnan":
                return Op("isnan", (self.cast(v, t),), "bool")
            return Op(lang.UNARY[fn], (self.cast(v, t),), t)
        if fn in lang.BINARY or fn in ("min", "max"):
            if len(args) != 2:
                self.fail(f"{fn} takes two values here", c)
            op = {"min": "minimum", "max": "maximum"}.get(fn, fn)
            return self.binary(op, self.expr(args[0]), self.expr(args[1]))
        if fn == "where":
            return self.select(self.truth(self.expr(args[0])), self.expr(args[1]),
                               self.expr(args[2]))
        if fn == "fma":
            vals = [self.expr(a) for a in args]
            t = "f64" if any(v.dtype == "f64" for v in vals) else "f32"
            return Op("fma", tuple(self.cast(v, t) for v in vals), t)
        if fn in ("shfl_xor", "shfl"):
            v = self.expr(args[0])
            var = self.fresh("shfl")
            if fn == "shfl_xor":
                mask = self.const_value(args[1])
                if not isinstance(mask, int) or not 0 < mask < 32:
                    self.fail("st.shfl_xor's mask is a constant from 1 to 31", c)
                self.emit(Let(var, _kind(v.dtype), ShflXor(v, mask, _kind(v.dtype))))
            else:
                self.emit(Let(var, _kind(v.dtype), ShflIdx(v, self.int_expr(args[1]), _kind(v.dtype))))
            return Var(var, _kind(v.dtype))
        if fn in ("warp_sum", "warp_max", "warp_min"):
            v = self.expr(args[0])
            t = _kind(v.dtype)
            acc = self.fresh(fn)
            self.emit(Let(acc, t, v))
            op = {"warp_sum": "add", "warp_max": "maximum", "warp_min": "minimum"}[fn]
            for m in (16, 8, 4, 2, 1):
                other = self.fresh("shfl")
                self.emit(Let(other, t, ShflXor(Var(acc, t), m, t)))
                self.emit(Assign(acc, Op(op, (Var(acc, t), Var(other, t)), t)))
            return Var(acc, t)
        if fn in ("barrier", "atomic_add", "atomic_max", "atomic_min", "shared"):
            self.fail(f"st.{fn}(...) is a statement, not a value", c)
        self.fail(f"{ast.unparse(c.func)}(...) cannot be called in a kernel", c)

    def index_fn(self, fn: str, c: ast.Call) -> Expr:
        axis = self.const_value(c.args[0]) if c.args else 0
        if axis not in (0, 1, 2):
            self.fail(f"st.{fn}'s axis is 0, 1 or 2", c)
        dims = self.spec.grid if fn in ("program_id", "num_programs") else self.spec.block
        if fn in ("num_programs", "block_dim"):
            return Const(dims[axis], "i32")
        linear = BlockIdx() if fn == "program_id" else ThreadIdx()
        inner = prod(dims[:axis])
        e: Expr = linear if inner == 1 else Op("floordiv", (linear, Const(inner, "i32")), "i32")
        if prod(dims[axis + 1:]) > 1:
            e = Op("mod", (e, Const(dims[axis], "i32")), "i32")
        return e


def _python_int_division(op: str, a: Expr, b: Expr, t: str) -> Expr:
    """Python's // and % on integers (rounding down, the remainder taking the divisor's sign) on
    every target: Kernel IR's floordiv is C's truncating / in the emitters, so it is only ever
    applied to non-negative operands here."""
    def op2(name, x, y, dtype=t):
        return Op(name, (x, y), dtype)

    def positive_divisor(x, y):         # floor(x / y) for y > 0
        if _non_negative(x):
            return op2("floordiv", x, y)
        down = Op("negative", (op2("floordiv", op2("subtract", op2("subtract", y, Const(1, t)), x),
                                   y),), t)
        return Op("where", (op2("ge", x, Const(0, t), "bool"), op2("floordiv", x, y), down), t)
    if isinstance(b, Const) and b.value > 0:
        q = positive_divisor(a, b)
    else:
        neg = lambda x: Op("negative", (x,), t)   # noqa: E731
        q = Op("where", (op2("lt", b, Const(0, t), "bool"), positive_divisor(neg(a), neg(b)),
                         positive_divisor(a, b)), t)
    return q if op == "floordiv" else op2("subtract", a, op2("multiply", b, q))


def _non_negative(e: Expr) -> bool:
    if isinstance(e, Const):
        return e.value >= 0
    if isinstance(e, (ThreadIdx, BlockIdx)):
        return True
    return isinstance(e, Op) and e.op in ("add", "multiply", "floordiv", "mod") and all(
        _non_negative(x) for x in e.args)


def _fn_name(c: ast.Call, globals_) -> str:
    """`st.exp(...)` / `strata.exp(...)` / `exp(...)` imported from strata -> "exp"."""
    f = c.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        mod = globals_.get(f.value.id)
        if getattr(mod, "__name__", "") in ("strata", "strata.dsl.lang"):
            return f.attr
        return f"{f.value.id}.{f.attr}"
    if isinstance(f, ast.Name):
        v = globals_.get(f.id)
        if getattr(v, "__module__", "") == "strata.dsl.lang" or isinstance(v, lang.DType):
            return getattr(v, "__name__", None) or v.name
        return f.id
    return ast.unparse(f)


def _bodies(s) -> list:
    return [s.body, s.orelse] if isinstance(s, ast.If) else [s.body]


def _walk_same_loop(s):
    """Nodes of s, not descending into nested loops (their break/continue are their own),
    except that return reaches through every loop."""
    yield s
    if isinstance(s, (ast.For, ast.While)):
        yield from (n for n in ast.walk(s) if isinstance(n, ast.Return))
        return
    for child in ast.iter_child_nodes(s):
        yield from _walk_same_loop(child)


def _walk_same_loop_body(body):
    for s in body:
        yield from _walk_same_loop(s)


def _lets_to_assigns(stmts, names: set[str]) -> list:
    return [Assign(s.var, s.value) if isinstance(s, Let) and s.var in names else
            s.map_bodies(lambda b: tuple(_lets_to_assigns(b, names))) for s in stmts]
