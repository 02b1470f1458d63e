"""The C family's tree walk over Kernel IR: what CUDA C, C, OpenCL C, HIP and Metal print alike.

Why one base: the five languages share C's expressions (precedence, literals, casts, the scalar
templates of scalar_ops.py with `{f}` for the float suffix), index types (`int`, or `long long`
where a buffer or the launch reaches 2^31 elements), and the statements Let, Assign, Store, For,
If, While and Comment. Each language is a subclass that says what differs: its thread and block
ids (`ids`), its 16-bit conversions (`to_float`, `to_storage`), C++ or C operators (`cxx`),
barriers, shared arrays, atomics, vector accesses and the kernel's frame. A statement the base
does not know goes to `special`, which a language with more statements (CUDA's tensor cores and
asynchronous copies) overrides.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..core import dtypes, scalar_ops
from ..core.errors import CompileError
from ..core.expr import Cast, Const, Expr, Op, Var, add, children, nodes
from ..kernel_ir.ir import (LANGUAGES, Assign, Atomic, BlockIdx, Comment, For, If, Kernel,
                            KernelProgram, Let, LdMatrix, Load, LoadVec, Mma, ShflIdx, ShflXor, Smem,
                            Store, StoreVec, Sync, ThreadIdx, WgmmaDesc, While, walk)

INDENT = "    "
LINE = 100          # wrap the parameter list beyond this width


def prelude(name: str) -> str:
    """The helpers in codegen/preludes/<name>: C text kept in C files, read as written."""
    return (Path(__file__).with_name("preludes") / name).read_text()


# C precedence, higher binds tighter.
ATOM, UNARY, MUL, ADD, SHIFT, REL, EQ, BAND, XOR, BOR, AND, OR, COND = 16, 15, 13, 12, 11, 10, \
    9, 8, 7, 6, 5, 4, 3
INFIX = {"add": ("+", ADD), "subtract": ("-", ADD), "multiply": ("*", MUL), "divide": ("/", MUL),
          "lt": ("<", REL), "le": ("<=", REL), "gt": (">", REL), "ge": (">=", REL),
          "eq": ("==", EQ), "ne": ("!=", EQ), "logical_and": ("&&", AND), "logical_or": ("||", OR)}
INT_INFIX = {"floordiv": ("/", MUL), "mod": ("%", MUL),     # indices are non-negative
              "bitwise_and": ("&", BAND), "bitwise_xor": ("^", XOR), "bitwise_or": ("|", BOR)}
UNSIGNED = {"u8": "unsigned char", "i8": "unsigned char", "i16": "unsigned short",
             "i32": "unsigned int", "i64": "unsigned long long"}
_INDEX_OPS = {"add", "subtract", "multiply", "floordiv", "mod", "minimum", "maximum", "negative"}
_RESERVED = {
    "auto", "bool", "break", "case", "char", "const", "continue", "default", "delete", "do",
    "double", "else", "enum", "extern", "false", "float", "for", "goto", "if", "inline", "int",
    "long", "new", "operator", "private", "public", "register", "return", "short", "signed",
    "sizeof", "static", "struct", "switch", "template", "this", "true", "typedef", "union",
    "unsigned", "void", "volatile", "while", "min", "max", "abs", "threadIdx", "blockIdx",
    "blockDim", "gridDim", "warpSize", "half", "NAN", "INFINITY",
    # OpenCL C and Metal keywords (one name per buffer on every target)
    "local", "global", "constant", "private", "kernel", "device", "thread", "threadgroup", "uint",
    "uchar", "ushort", "ulong", "barrier",
    # C++'s alternative operator names (an aten `__xor__` node is named `xor`)
    "and", "and_eq", "bitand", "bitor", "compl", "not", "not_eq", "or", "or_eq", "xor", "xor_eq",
}
# The math functions the scalar templates call, float and double (a buffer named `exp` would
# hide exp()).
_RESERVED |= {fn + suffix for op in scalar_ops.OPS.values()
              for fn in re.findall(r"(\w+)\{f\}\(", op.c_float) for suffix in ("", "f")}

# Statements every language of the family runs (the rest are CUDA's), and how errors name each.
def refuse_unprintable(k: Kernel, language: str, why: str) -> None:
    """Raise CompileError naming the first statement or expression of `k` that `language` cannot
    print (its class's `languages`, kernel_ir/ir.py), with `why` after "which"."""
    for s in walk(k.body):
        for node in (s, *(x for e in s.exprs() for x in nodes(e))):
            if language not in getattr(node, "languages", LANGUAGES):
                raise CompileError(f"kernel {k.name} uses {node.what} ({type(node).__name__}), "
                                   f"which {why}")


def cname(name: str) -> str:
    """A C identifier for an IR name (reserved words and builtins get a trailing underscore)."""
    name = re.sub(r"\W", "_", name)
    if name in _RESERVED or name.startswith("__") or name[:1].isdigit():
        return name + "_"
    return name


def float_literal(value: float, dtype: str = "f32") -> str:
    """A valid C literal: `1e-06f`, `2048.0f`, `INFINITY`, `-INFINITY`, `NAN` (f64: no suffix)."""
    v = float(value)
    if v != v:
        return "NAN"
    if v in (float("inf"), float("-inf")):
        return "INFINITY" if v > 0 else "-INFINITY"
    if dtype == "f64":
        text = repr(v)
        return text if any(c in text for c in ".e") else text + ".0"
    text = str(np.float32(v))             # shortest text that round-trips through float32
    if not any(c in text for c in ".en"):
        text += ".0"
    return text + "f"


def int_literal(value: int, dtype: str) -> str:
    v = int(value)
    if dtype == "bool":
        return "true" if v else "false"
    if -2 ** 31 <= v < 2 ** 31:
        return str(v)
    return f"{v}LL"


def strip_parens(text: str) -> str:
    """Drop one pair of parentheses around a whole expression."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for pos, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and pos < len(text) - 1:
            return text
    return text[1:-1]


def paren(text: str, prec: int, need: int) -> str:
    return f"({text})" if prec < need else text


# ---------------------------------------------------------------- analysis

def needs_64bit_indices(kernel: Kernel) -> bool:
    """Whether index arithmetic of this kernel can reach 2^31 (then it is done in long long)."""
    sizes = [p.numel for p in kernel.params] + [kernel.grid * kernel.block]
    return max(sizes) >= 2 ** 31


def data_vars(kernel: Kernel) -> set[str]:
    """Integer variables that carry data rather than index arithmetic (fixpoint over assigns)."""
    defs: dict[str, list[Expr]] = {}
    out: set[str] = set()
    for s in walk(kernel.body):
        if isinstance(s, (Let, Assign)):
            defs.setdefault(s.var, []).append(s.value)
        elif isinstance(s, (LoadVec, LdMatrix)):
            out |= set(s.vars)
        elif isinstance(s, Mma):
            out |= set(s.a + s.b)

    def is_data(e: Expr) -> bool:
        if isinstance(e, (Load, ShflXor, ShflIdx, WgmmaDesc)):
            return True
        if isinstance(e, Var):
            return e.name in out
        if isinstance(e, Cast) and not dtypes.is_int(e.arg.dtype):
            return True
        if isinstance(e, Op) and e.op not in _INDEX_OPS:
            return True
        return any(is_data(c) for c in children(e))

    changed = True
    while changed:
        changed = False
        for var, values in defs.items():
            if var not in out and any(is_data(v) for v in values):
                out.add(var)
                changed = True
    return out


def distinct_kernels(program: KernelProgram) -> list[Kernel]:
    """The program's kernels, each defined once (a kernel launched twice appears once)."""
    seen: dict[str, Kernel] = {}
    for k in program.kernels:
        if k.name in seen:
            if seen[k.name] != k:
                raise ValueError(f"two different kernels are named {k.name}")
            continue
        seen[k.name] = k
    return list(seen.values())


def numbered(text: str, k: Kernel) -> str:
    """A kernel's emitted code with its own name and its parameters' named by position, comments
    out: equal for two kernels that run the same code on different buffers, so a model's 30
    layers compile one function per kernel, not 30 (gcc's and NVRTC's time is per function)."""
    names = [cname(k.name), *(cname(p.name) for p in k.params), *(cname(n) for n, _ in k.scalars)]
    index = {n: f"@{i}" for i, n in enumerate(names)}
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("//"))
    return re.sub(r"\b(" + "|".join(map(re.escape, index)) + r")\b", lambda m: index[m[0]], code)


def torch_math(qualifier: str, types=("float", "double"), suffixed: bool = False,
               fmodf: str = "fmodf") -> str:
    """st_max, st_min, st_sign and st_fmod with torch's semantics for each of `types`, written
    once for every language: NaN propagates through max/min and sign (one compare and a select,
    so loops vectorise them; a tie (-0.0, 0.0) gives b, as NumPy does) and mod takes the divisor's
    sign. suffixed: C's names (st_maxf, st_maxd) for a language without overloading."""
    out = []
    for t in types:
        f, z = ("f", "0.0f") if t == "float" else ("d", "0.0")
        name = (lambda n: f"st_{n}{f}") if suffixed else (lambda n: f"st_{n}")
        fmod = fmodf if t == "float" else "fmod"
        out += [f"{qualifier} {t} {name('max')}({t} a, {t} b) {{ return (a > b || a != a) ? a : b; }}",
                f"{qualifier} {t} {name('min')}({t} a, {t} b) {{ return (a < b || a != a) ? a : b; }}",
                f"{qualifier} {t} {name('sign')}({t} x) {{ return x != x ? x : ({t})((x > {z}) - "
                f"(x < {z})); }}",
                f"{qualifier} {t} {name('fmod')}({t} a, {t} b) {{",
                f"    {t} r = {fmod}(a, b);",
                f"    return (r != {z} && ((r < {z}) != (b < {z}))) ? r + b : r;", "}"]
    return "\n".join(out)


# FP8 formats: mantissa bits, exponent bias, the bits of the first float32 past the largest finite
# value's rounding range (464 for e4m3fn, 65536 for e5m2), what such a value becomes (torch
# saturates e4m3fn to 448, which has no infinity; e5m2 overflows to infinity).
FP8 = {"f8e4m3": (3, 7, 0x43E80000, 0x7E), "f8e5m2": (2, 15, 0x47800000, 0x7C)}


def fp8_convert(q: str, u8: str, u32: str, bits: str, flt: str, hardware=None) -> str:
    """st_float_to_f8e4m3 / st_f8e4m3_to_float (and e5m2) in any C-family language: q is the
    function qualifier, bits/flt reinterpret float <-> u32. Rounded as torch rounds float32:
    to nearest even; a subnormal by adding the float whose ULP is the format's smallest step (the
    FPU rounds), a normal by re-biasing and rounding the dropped bits; past the largest finite
    value (infinity too) as FP8 says; NaN stays NaN. Decoding is exact: the 7 bits below the sign
    shifted into a float's exponent and mantissa, scaled by 2^(127 - bias) (a subnormal comes in
    as a float subnormal: no flush to zero is compiled), infinity and NaN set apart; or
    `hardware(ptx type)`'s lines first (CUDA's one-instruction conversion where the GPU has it)."""
    out = []
    for name, (m, bias, big, past) in FP8.items():
        shift, emax = 23 - m, (1 << (7 - m)) - 1
        tiny = (151 - bias - m) << 23                       # ULP = 2^(1 - bias - m)
        rebias = ((bias - 127) << 23) & 0xFFFFFFFF
        special = ("a == 0x7Fu ? 0x7FC00000u" if name == "f8e4m3"         # NaN; e5m2: inf, NaN
                   else f"a >= {emax << m:#x}u ? (0x7F800000u | (a & {(1 << m) - 1}u) << {shift})")
        out += [f"{q} {u8} st_float_to_{name}(float f) {{",
                f"    {u32} u = {bits}(f), a = u & 0x7FFFFFFFu;",
                f"    {u32} sub = {bits}({flt}(a) + {flt}({tiny:#x}u)) - {tiny:#x}u;",
                f"    {u32} normal = (a + {rebias:#x}u + {(1 << (shift - 1)) - 1:#x}u + ((a >> {shift}) & 1u))"
                f" >> {shift};",
                f"    {u32} r = a >= {big:#x}u ? (a > 0x7F800000u ? 0x7Fu : {past:#x}u) : "
                f"(a < {(128 - bias) << 23:#x}u ? sub : normal);",
                f"    return ({u8})(r | ((u >> 24) & 0x80u));", "}",
                f"{q} float st_{name}_to_float({u8} b) {{",
                *(hardware(name[2:]) + ("#else",) if hardware else ()),
                f"    {u32} a = b & 0x7Fu;",
                f"    {u32} mag = {special} : {bits}({flt}(a << {shift}) * {flt}({(254 - bias) << 23:#x}u));",
                f"    return {flt}(mag | ({u32})(b & 0x80u) << 24);",
                *(("#endif",) if hardware else ()), "}"]
    return "\n".join(out)


# ---------------------------------------------------------------- the walk

class CFamilyEmitter:
    """One kernel's walk; a language subclass sets the class attributes and overrides the hooks."""
    float_suffix = "f"          # expf, rsqrtf: C's float math names (OpenCL and Metal overload: exp)
    cxx = False                 # C++ operators: int max/min overloads, the template's bool(x)
    to_float: dict = {}         # 16-bit storage -> float, by dtype
    to_storage: dict = {}       # float -> 16-bit storage, rounded to nearest even

    # statement class -> the method that prints it; a language's emitter adds the statements only
    # it has (CUDA's tensor cores, C's CPU forms). tests/codegen: every class a language prints
    # has one in that language's emitter.
    PRINTERS = {Let: "let", Assign: "assign", Store: "store", LoadVec: "load_vec",
                StoreVec: "store_vec", For: "loop", If: "branch", While: "repeat", Atomic: "atomic",
                Sync: "sync", Smem: "shared_array", Comment: "comment"}

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.wide = needs_64bit_indices(kernel)
        self.index_t = "long long" if self.wide else "int"
        self.data = data_vars(kernel)
        self.bufs = {p.name: p.dtype for p in kernel.params}
        self.smem = {s.name: s for s in walk(kernel.body) if isinstance(s, Smem)}
        self.bufs.update({n: s.dtype for n, s in self.smem.items()})
        self.lines: list[str] = []
        self.signed = False        # print thread/block ids as signed inside a subtraction
        self.hoisted: set[str] = set()   # shared arrays declared at the top of the kernel

    # ------------------------------------------------------------ types

    def ctype(self, var: str, dtype: str) -> str:
        if dtypes.is_float(dtype):
            return "double" if dtype == "f64" else "float"
        if dtype == "bool":
            return "bool"
        if var in self.data:
            return dtypes.C_STORAGE[dtype]
        return self.index_t

    # ------------------------------------------------------------ expressions

    def expr(self, e: Expr, need: int = 0) -> str:
        text, prec = self.ex(e)
        return paren(text, prec, need)

    def ids(self, e: ThreadIdx | BlockIdx) -> tuple[str, int]:
        raise NotImplementedError

    def ex(self, e: Expr) -> tuple[str, int]:
        if isinstance(e, Const):
            if dtypes.is_float(e.dtype):
                text = float_literal(e.value, e.dtype)
            else:
                text = int_literal(e.value, e.dtype)
            return text, (UNARY if text.startswith("-") else ATOM)
        if isinstance(e, Var):
            return cname(e.name), ATOM
        if isinstance(e, (ThreadIdx, BlockIdx)):
            return self.ids(e)
        if isinstance(e, Load):
            text = f"{cname(e.buf)}[{self.expr(e.index)}]"
            conv = self.to_float.get(self.bufs.get(e.buf, ""))
            return (f"{conv}({text})" if conv else text), ATOM
        if isinstance(e, Cast):
            return self.cast(e)
        if isinstance(e, Op):
            return self.op(e)
        raise TypeError(f"{self.k.name}: cannot emit expression {e!r}")

    def cast(self, e: Cast) -> tuple[str, int]:
        src, dst = e.arg.dtype, e.dtype
        if dst == "bool":
            zero = float_literal(0.0, src) if dtypes.is_float(src) else "0"
            return f"{self.expr(e.arg, EQ + 1)} != {zero}", EQ
        if dst in dtypes.NARROW:       # a value rounded to 16 or 8 bits, kept in float
            inner = f"{self.to_storage[dst]}({self.rounded_arg(e.arg)})"
            return f"{self.to_float[dst]}({inner})", ATOM
        target = "float" if dst == "f32" else dtypes.C_STORAGE[dst]
        if dtypes.is_int(dst) and dtypes.is_int(src) and dst == src:
            return self.ex(e.arg)
        if dst == "f32" and dtypes.compute_dtype(src) == "f32":
            return self.ex(e.arg)
        return f"({target}){self.expr(e.arg, UNARY)}", UNARY

    def rounded_arg(self, e: Expr) -> str:
        """The argument of a rounding to 16 bits, as the conversion function takes it."""
        return strip_parens(self.expr(e))

    def op(self, e: Op) -> tuple[str, int]:
        a = e.args
        is_int = dtypes.is_int(a[0].dtype) or a[0].dtype == "bool"
        if not self.cxx and e.op == "logical_xor":      # the template's bool(x) is C++
            return (f"(bool){self.expr(a[0], UNARY)} != (bool){self.expr(a[1], UNARY)}", EQ)
        if not self.cxx and e.op in ("maximum", "minimum") and is_int:
            return self.template(e)                     # the prelude's max/min: no decltype
        saved = self.signed
        if e.op in ("subtract", "negative") and is_int:
            self.signed = True
        try:
            if e.op in INFIX or (is_int and e.op in INT_INFIX):
                sym, p = INFIX.get(e.op) or INT_INFIX[e.op]
                return f"{self.expr(a[0], p)} {sym} {self.expr(a[1], p + 1)}", p
            if e.op == "negative":
                return f"-{self.expr(a[0], UNARY)}", UNARY
            if e.op == "logical_not":
                return f"!{self.expr(a[0], UNARY)}", UNARY
            if e.op == "bitwise_not":      # C computes narrow types in int: ~u8 is negative
                return f"({dtypes.C_STORAGE[e.dtype]})~{self.expr(a[0], UNARY)}", UNARY
            if e.op in ("left_shift", "right_shift"):
                return self.shift(e)
            if e.op == "where":
                return (f"{self.expr(a[0], OR)} ? {self.expr(a[1], OR)} : {self.expr(a[2], COND)}",
                        COND)
            if is_int and e.op in ("maximum", "minimum") and sum(isinstance(x, Const) for x in a) == 1:
                # max(long long, int) is ambiguous in C++: give the literal the other side's type
                var, lit = (a[0], a[1]) if isinstance(a[1], Const) else (a[1], a[0])
                v = self.expr(var)
                fn = "max" if e.op == "maximum" else "min"
                return f"{fn}({v}, (decltype({v})){self.expr(lit, UNARY)})", ATOM
            return self.template(e)
        finally:
            self.signed = saved

    def shift(self, e: Op) -> tuple[str, int]:
        """x << n and x >> n as scalar_ops defines them for any n: C leaves a count outside
        [0, width) undefined (a constant one is decided here, any other guarded) and a signed <<
        that overflows too, so << runs unsigned and is cast back to the storage type."""
        t, u, width = dtypes.C_STORAGE[e.dtype], UNSIGNED[e.dtype], 8 * dtypes.ITEMSIZE[e.dtype]
        x, n = e.args
        top = width if e.op == "left_shift" or e.dtype == "u8" else width - 1   # torch's limit

        def shifted(count: str) -> tuple[str, int]:
            if e.op == "left_shift":
                return f"({t})(({u}){self.expr(x, UNARY)} << {count})", UNARY
            return f"{self.expr(x, SHIFT)} >> {count}", SHIFT
        if isinstance(n, Const):
            k = int(n.value)
            if 0 <= k < top:
                return shifted(str(k))
            return shifted(str(width - 1)) if top < width else ("0", ATOM)
        count = self.expr(n, UNARY)
        in_range = f"({u}){count} < {top}"
        if top < width:                 # a signed >>: every bad count shifts in the sign
            return shifted(f"({in_range} ? {count} : {width - 1})")
        return f"{in_range} ? {paren(*shifted(count), OR)} : 0", COND

    def template(self, e: Op) -> tuple[str, int]:
        op = scalar_ops.get(e.op)
        value_arg = e.args[1] if e.op == "where" else e.args[0]
        floating = any(dtypes.is_float(x.dtype) for x in e.args) or dtypes.is_float(value_arg.dtype)
        t = op.c_float if floating or op.c_int is None else op.c_int
        t = t.replace("{f}", "" if "f64" in (x.dtype for x in e.args) else self.float_suffix)
        full = [self.expr(x) for x in e.args]
        atom = [self.expr(x, ATOM) for x in e.args]

        def arg(m: re.Match) -> str:      # bare where the template already delimits it: f({0}, ...)
            k = int(m.group(1))
            before, after = t[:m.start()].rstrip(), t[m.end():].lstrip()
            return full[k] if before[-1:] in ("(", ",") and after[:1] in (")", ",") else atom[k]
        return re.sub(r"\{(\d)\}", arg, t), ATOM

    # ------------------------------------------------------------ statements

    def emit(self, line: str, depth: int) -> None:
        self.lines.append(INDENT * depth + line)

    def body(self, stmts, depth: int) -> None:
        for s in stmts:
            if not (isinstance(s, Smem) and s.name in self.hoisted):
                self.stmt(s, depth)

    def stmt(self, s, depth: int) -> None:
        """`s` printed by the method PRINTERS names for its class (or the nearest base class)."""
        for cls in type(s).__mro__:
            if cls in self.PRINTERS:
                return getattr(self, self.PRINTERS[cls])(s, depth)
        raise TypeError(f"{self.k.name}: {type(self).__name__} has no printer for {type(s).__name__}")

    def let(self, s: Let, depth: int) -> None:
        self.emit(f"{self.ctype(s.var, s.dtype)} {cname(s.var)} = {strip_parens(self.expr(s.value))};", depth)

    def assign(self, s: Assign, depth: int) -> None:
        v = s.value
        if (isinstance(v, Op) and v.op in ("add", "subtract", "multiply")
                and isinstance(v.args[0], Var) and v.args[0].name == s.var):
            sym = INFIX[v.op][0]
            self.emit(f"{cname(s.var)} {sym}= {strip_parens(self.expr(v.args[1]))};", depth)
        else:
            self.emit(f"{cname(s.var)} = {strip_parens(self.expr(v))};", depth)

    def store(self, s: Store, depth: int) -> None:
        self.emit(f"{cname(s.buf)}[{self.expr(s.index)}] = {self.stored(s.buf, s.value)};", depth)

    def loop(self, s: For, depth: int) -> None:
        if s.unroll:
            self.emit("#pragma unroll", depth)
        v = cname(s.var)
        t = self.ctype(s.var, s.dtype)
        inc = f"{v}++" if s.step == 1 else f"{v} += {s.step}"
        self.emit(f"for ({t} {v} = {strip_parens(self.expr(s.start))}; {v} < "
                  f"{self.expr(s.stop, REL + 1)}; {inc}) {{", depth)
        self.body(s.body, depth + 1)
        self.emit("}", depth)

    def branch(self, s: If, depth: int) -> None:
        self.emit(f"if ({strip_parens(self.expr(s.cond))}) {{", depth)
        self.body(s.then, depth + 1)
        orelse = s.orelse
        while len(orelse) == 1 and isinstance(orelse[0], If):
            self.emit(f"}} else if ({strip_parens(self.expr(orelse[0].cond))}) {{", depth)
            self.body(orelse[0].then, depth + 1)
            orelse = orelse[0].orelse
        if orelse:
            self.emit("} else {", depth)
            self.body(orelse, depth + 1)
        self.emit("}", depth)

    def repeat(self, s: While, depth: int) -> None:
        self.emit(f"while ({strip_parens(self.expr(s.cond))}) {{", depth)
        self.body(s.body, depth + 1)
        self.emit("}", depth)

    def comment(self, s: Comment, depth: int) -> None:
        for line in s.text.splitlines() or [""]:
            self.emit(f"// {line}", depth)

    def sync(self, s: Sync, depth: int) -> None:
        self.barrier(depth)

    def barrier(self, depth: int) -> None:
        raise NotImplementedError

    def shared_array(self, s: Smem, depth: int) -> None:
        raise NotImplementedError

    def atomic(self, s: Atomic, depth: int) -> None:
        raise NotImplementedError

    def stored(self, buf: str, value: Expr) -> str:
        conv = self.to_storage.get(self.bufs.get(buf, ""))
        return f"{conv}({strip_parens(self.expr(value))})" if conv else strip_parens(self.expr(value))

    def load_vec(self, s: LoadVec, depth: int) -> None:
        """Element by element (the compiler vectorises); CUDA overrides with one wide access."""
        t = self.ctype(s.vars[0], s.dtype)
        for k, v in enumerate(s.vars):
            load = Load(s.buf, add(s.index, k) if k else s.index, s.dtype)
            self.emit(f"{t} {cname(v)} = {strip_parens(self.expr(load))};", depth)

    def store_vec(self, s: StoreVec, depth: int) -> None:
        for k, v in enumerate(s.values):
            self.stmt(Store(s.buf, add(s.index, k) if k else s.index, v), depth)

    def wrap_signature(self, name: str, params: list[str]) -> None:
        pad = " " * (len(name) + 1)
        line = f"{name}("
        for i, p in enumerate(params):
            piece = p + (", " if i < len(params) - 1 else ") {")
            if len(line) + len(piece.rstrip()) > LINE and line.strip() not in (f"{name}(",):
                self.lines.append(line.rstrip())
                line = pad
            line += piece
        self.lines.append(line)
