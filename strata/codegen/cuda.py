"""Kernel IR -> CUDA C: one walk over the tree, printing code a person would write by hand.

`emit_program` gives one translation unit (fp16/bf16 headers, the `st_*` helpers that the C
templates of scalar_ops.py call, then every kernel); `emit_kernel` prints one kernel.

Types: values are in their compute type (float for f32/f16/bf16, double, bool, integers).
Integer variables that only hold index arithmetic (built from threadIdx/blockIdx, loop variables
and constants) are `int`; a kernel where some buffer, or grid * block, reaches 2^31 elements uses
`long long` for them instead and widens blockIdx.x before it is multiplied. Integer variables
holding data (loaded from a buffer, shuffled, converted from floats) keep their declared type.
Global f16/bf16 data is converted at the access (`__half2float`, `__float2bfloat16_rn`), vector
accesses are one aligned 4/8/16-byte load or store (float4, or uint4 unpacked as __half2 pairs).
Tensor-core and async-copy statements (Mma, LdMatrix, CpAsync*) are inline PTX, one asm
statement each; fragment registers are `int`. A program using them gets TENSOR_CORE_PRELUDE,
which refuses (#error) to compile for an architecture below sm_80. Hopper statements (TmaLoad,
Mbar*, Wgmma*, FenceProxyAsync) are inline PTX too, with HOPPER_PRELUDE (the CUtensorMap
parameter type, descriptor construction, the mbarrier wait loop; sm_90+) and, for wgmma, a
guard that needs sm_90a; shared arrays they touch are 1024-byte aligned for the swizzles.
"""
from __future__ import annotations

import re

import numpy as np

from .. import dtypes, scalar_ops
from ..errors import CompileError
from ..targets import Target, get_target
from ..expr import Cast, Const, Expr, Op, Var, children, nodes
from ..kernel_ir.ir import (DYNAMIC_SMEM_ALIGN, HOPPER_STMTS, SWIZZLES, Assign, Atomic, BlockIdx, Comment,
                         CpAsync, CpAsyncCommit, CpAsyncWait, FenceProxyAsync, For, If, Kernel,
                         KernelProgram, LdMatrix, Let, Load, LoadVec, MbarArrive, MbarInit,
                         MbarTryWait, MbarWait, Mma, ShflIdx, ShflXor, Smem, Store, StoreVec,
                         Sync, ThreadIdx, TmaLoad, Wgmma, WgmmaCommit, WgmmaDesc, WgmmaFence,
                         WgmmaWait, While, walk)

INDENT = "    "
LINE = 100          # wrap the parameter list beyond this width

PRELUDE = r"""// NVRTC has no <math.h>: the float specials as bit patterns (device code only).
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

// torch semantics: NaN propagates through maximum/minimum and sign; mod takes the divisor's sign.
__device__ __forceinline__ float st_max(float a, float b) { return a != a ? a : (b != b ? b : fmaxf(a, b)); }
__device__ __forceinline__ float st_min(float a, float b) { return a != a ? a : (b != b ? b : fminf(a, b)); }
__device__ __forceinline__ float st_sign(float x) { return x != x ? x : (float)((x > 0.0f) - (x < 0.0f)); }
__device__ __forceinline__ float st_fmod(float a, float b) {
    float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
__device__ __forceinline__ double st_max(double a, double b) { return a != a ? a : (b != b ? b : fmax(a, b)); }
__device__ __forceinline__ double st_min(double a, double b) { return a != a ? a : (b != b ? b : fmin(a, b)); }
__device__ __forceinline__ double st_sign(double x) { return x != x ? x : (double)((x > 0.0) - (x < 0.0)); }
__device__ __forceinline__ double st_fmod(double a, double b) {
    double r = fmod(a, b);
    return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
"""
# atomicMax/Min on floats: a compare-and-swap loop on the bits (NaN never replaces a value).
ATOMIC_PRELUDE = r"""__device__ __forceinline__ void st_atomic_max(float* p, float v) {
    int* q = (int*)p; int old = *q, seen;
    do { seen = old; if (!(v > __int_as_float(seen))) return;
         old = atomicCAS(q, seen, __float_as_int(v)); } while (old != seen);
}
__device__ __forceinline__ void st_atomic_min(float* p, float v) {
    int* q = (int*)p; int old = *q, seen;
    do { seen = old; if (!(v < __int_as_float(seen))) return;
         old = atomicCAS(q, seen, __float_as_int(v)); } while (old != seen);
}"""

TENSOR_CORE_PRELUDE = r"""// mma.sync m16n8k16, ldmatrix and cp.async are inline PTX for sm_80 and newer.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "strata: these kernels use mma.sync, ldmatrix and cp.async, which need sm_80 or newer"
#endif
// The 32-bit .shared address of a __shared__ object, as ldmatrix and cp.async take it.
__device__ __forceinline__ unsigned st_smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
"""
WARP_OPS = (Mma, LdMatrix, CpAsync, CpAsyncCommit, CpAsyncWait)

HOPPER_PRELUDE = r"""// TMA (cp.async.bulk.tensor), mbarrier and wgmma are inline PTX for sm_90 (wgmma: sm_90a).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "strata: these kernels use TMA and mbarrier, which need sm_90 or newer"
#endif
// A CUtensorMap (cuda.h) by value: 128 opaque bytes, encoded on the host by cuTensorMapEncodeTiled.
struct alignas(128) st_tensor_map { unsigned long long opaque[16]; };
// wgmma matrix descriptor: start address >> 4 (bits 0-13), leading / stride byte offsets >> 4
// (16-29, 32-45), swizzle mode (62-63: 0 none, 1 128B, 2 64B, 3 32B).
__device__ __forceinline__ long long st_wgmma_desc(const void* p, unsigned lbo, unsigned sbo,
                                                   unsigned mode) {
    unsigned long long a = st_smem_addr(p);
    return (long long)(((a & 0x3FFFFull) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
                       | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32)
                       | ((unsigned long long)mode << 62));
}
// mbarrier.try_wait.parity: whether the phase with this parity has completed.
__device__ __forceinline__ bool st_mbar_try_wait(unsigned bar, unsigned parity) {
    unsigned ok;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    return ok != 0;
}
__device__ __forceinline__ void st_mbar_wait(unsigned bar, unsigned parity) {
    while (!st_mbar_try_wait(bar, parity)) {
    }
}
"""
WGMMA_GUARD = r"""#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "strata: these kernels use wgmma, which needs sm_90a (--gpu-architecture=sm_90a)"
#endif"""

# C precedence, higher binds tighter.
ATOM, UNARY, MUL, ADD, SHIFT, REL, EQ, BAND, XOR, BOR, AND, OR, COND = 16, 15, 13, 12, 11, 10, \
    9, 8, 7, 6, 5, 4, 3
_INFIX = {"add": ("+", ADD), "subtract": ("-", ADD), "multiply": ("*", MUL), "divide": ("/", MUL),
          "lt": ("<", REL), "le": ("<=", REL), "gt": (">", REL), "ge": (">=", REL),
          "eq": ("==", EQ), "ne": ("!=", EQ), "logical_and": ("&&", AND), "logical_or": ("||", OR)}
_INT_INFIX = {"floordiv": ("/", MUL), "mod": ("%", MUL),     # indices are non-negative
              "bitwise_and": ("&", BAND), "bitwise_xor": ("^", XOR), "bitwise_or": ("|", BOR)}
_UNSIGNED = {"u8": "unsigned char", "i8": "unsigned char", "i16": "unsigned short",
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
_CARRIER = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
_F32_VEC = {2: "float2", 4: "float4"}
_MAKE_VEC = {("f32", 2): "make_float2", ("f32", 4): "make_float4", ("i32", 2): "make_int2",
             ("i32", 4): "make_int4", ("i64", 2): "make_longlong2"}
_INT_VEC = {("i32", 2): "int2", ("i32", 4): "int4", ("i64", 2): "longlong2"}
_HALF2 = {"f16": "__half2", "bf16": "__nv_bfloat162"}
_TO_STORAGE = {"f16": "__float2half_rn", "bf16": "__float2bfloat16_rn"}
_TO_FLOAT = {"f16": "__half2float", "bf16": "__bfloat162float"}
_PACK2 = {"f16": "__floats2half2_rn", "bf16": "__floats2bfloat162_rn"}


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


def _strip(text: str) -> str:
    """Drop one pair of parentheses around a whole expression."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for pos, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and pos < len(text) - 1:
            return text
    return text[1:-1]


def _paren(text: str, prec: int, need: int) -> str:
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


# ---------------------------------------------------------------- the emitter

class _Emitter:
    float_suffix = "f"          # expf, rsqrtf: C's float math names (OpenCL overloads: exp)

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.wide = needs_64bit_indices(kernel)
        self.index_t = "long long" if self.wide else "int"
        self.data = data_vars(kernel)
        self.bufs = {p.name: p.dtype for p in kernel.params}
        self.smem = {s.name: s for s in walk(kernel.body) if isinstance(s, Smem)}
        self.bufs.update({n: s.dtype for n, s in self.smem.items()})
        self.vector_bufs = {s.buf for s in walk(kernel.body)      # accessed 16 bytes at a time
                            if isinstance(s, (LoadVec, StoreVec, LdMatrix))}
        self.vector_bufs |= {s.dst for s in walk(kernel.body) if isinstance(s, CpAsync)}
        self.swizzled = _async_proxy_bufs(kernel)     # TMA / wgmma operands: 1024-byte aligned
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
        return _paren(text, prec, need)

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
            name = "threadIdx.x" if isinstance(e, ThreadIdx) else "blockIdx.x"
            if self.wide and isinstance(e, BlockIdx):
                return f"(long long){name}", UNARY
            if self.signed:
                return f"(int){name}", UNARY
            return name, ATOM
        if isinstance(e, Load):
            text = f"{cname(e.buf)}[{self.expr(e.index)}]"
            conv = _TO_FLOAT.get(self.bufs.get(e.buf, ""))
            return (f"{conv}({text})" if conv else text), ATOM
        if isinstance(e, ShflXor):
            return self.shfl("__shfl_xor_sync", e.value, str(e.mask), e.dtype), ATOM
        if isinstance(e, ShflIdx):
            return self.shfl("__shfl_sync", e.value, self.expr(e.lane), e.dtype), ATOM
        if isinstance(e, Cast):
            return self.cast(e)
        if isinstance(e, Op):
            return self.op(e)
        if isinstance(e, WgmmaDesc):
            return (f"st_wgmma_desc(&{cname(e.buf)}[{_strip(self.expr(e.index))}], {e.lbo}, {e.sbo}, "
                    f"{SWIZZLES[e.swizzle]})"), ATOM
        raise TypeError(f"{self.k.name}: cannot emit expression {e!r}")

    def shfl(self, fn: str, value: Expr, arg: str, dtype: str) -> str:
        if dtype == "bool":
            return f"(bool){fn}(0xffffffffu, (int){self.expr(value, UNARY)}, {arg})"
        return f"{fn}(0xffffffffu, {self.expr(value)}, {arg})"

    def cast(self, e: Cast) -> tuple[str, int]:
        src, dst = e.arg.dtype, e.dtype
        if dst == "bool":
            zero = float_literal(0.0, src) if dtypes.is_float(src) else "0"
            return f"{self.expr(e.arg, EQ + 1)} != {zero}", EQ
        if dst in ("f16", "bf16"):     # a value rounded to half precision, kept in float
            inner = f"{_TO_STORAGE[dst]}({self.expr(e.arg)})"
            return f"{_TO_FLOAT[dst]}({inner})", ATOM
        target = "float" if dst == "f32" else dtypes.C_STORAGE[dst]
        if dtypes.is_int(dst) and dtypes.is_int(src) and dst == src:
            return self.ex(e.arg)
        if dst == "f32" and dtypes.compute_dtype(src) == "f32":
            return self.ex(e.arg)
        return f"({target}){self.expr(e.arg, UNARY)}", UNARY

    def op(self, e: Op) -> tuple[str, int]:
        a = e.args
        is_int = dtypes.is_int(a[0].dtype) or a[0].dtype == "bool"
        saved = self.signed
        if e.op in ("subtract", "negative") and is_int:
            self.signed = True
        try:
            if e.op in _INFIX or (is_int and e.op in _INT_INFIX):
                sym, p = _INFIX.get(e.op) or _INT_INFIX[e.op]
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
        t, u, width = dtypes.C_STORAGE[e.dtype], _UNSIGNED[e.dtype], 8 * dtypes.ITEMSIZE[e.dtype]
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
        return f"{in_range} ? {_paren(*shifted(count), OR)} : 0", COND

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
        if isinstance(s, Let):
            self.emit(f"{self.ctype(s.var, s.dtype)} {cname(s.var)} = {_strip(self.expr(s.value))};", depth)
        elif isinstance(s, Assign):
            v = s.value
            if (isinstance(v, Op) and v.op in ("add", "subtract", "multiply")
                    and isinstance(v.args[0], Var) and v.args[0].name == s.var):
                sym = _INFIX[v.op][0]
                self.emit(f"{cname(s.var)} {sym}= {_strip(self.expr(v.args[1]))};", depth)
            else:
                self.emit(f"{cname(s.var)} = {_strip(self.expr(v))};", depth)
        elif isinstance(s, Store):
            self.emit(f"{cname(s.buf)}[{self.expr(s.index)}] = {self.stored(s.buf, s.value)};", depth)
        elif isinstance(s, LoadVec):
            self.load_vec(s, depth)
        elif isinstance(s, StoreVec):
            self.store_vec(s, depth)
        elif isinstance(s, For):
            if s.unroll:
                self.emit("#pragma unroll", depth)
            v = cname(s.var)
            t = self.ctype(s.var, s.dtype)
            inc = f"{v}++" if s.step == 1 else f"{v} += {s.step}"
            self.emit(f"for ({t} {v} = {_strip(self.expr(s.start))}; {v} < "
                      f"{self.expr(s.stop, REL + 1)}; {inc}) {{", depth)
            self.body(s.body, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, If):
            self.emit(f"if ({_strip(self.expr(s.cond))}) {{", depth)
            self.body(s.then, depth + 1)
            orelse = s.orelse
            while len(orelse) == 1 and isinstance(orelse[0], If):
                self.emit(f"}} else if ({_strip(self.expr(orelse[0].cond))}) {{", depth)
                self.body(orelse[0].then, depth + 1)
                orelse = orelse[0].orelse
            if orelse:
                self.emit("} else {", depth)
                self.body(orelse, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, While):
            self.emit(f"while ({_strip(self.expr(s.cond))}) {{", depth)
            self.body(s.body, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, Atomic):
            self.atomic(s, depth)
        elif isinstance(s, Sync):
            self.emit("__syncthreads();", depth)
        elif isinstance(s, Smem) and s.dynamic:     # a slice of the aligned dynamic arrays
            ct = dtypes.C_STORAGE[s.dtype]
            self.emit(f"{ct}* {cname(s.name)} = reinterpret_cast<{ct}*>(st_dyn_smem + "
                      f"{self.dyn_offsets[s.name]});", depth)
        elif isinstance(s, Smem):
            align = "__align__(16) " if s.name in self.vector_bufs else ""
            align = "__align__(1024) " if s.name in self.swizzled else align
            self.emit(f"__shared__ {align}{dtypes.C_STORAGE[s.dtype]} {cname(s.name)}[{s.size}];", depth)
        elif isinstance(s, Comment):
            for line in s.text.splitlines() or [""]:
                self.emit(f"// {line}", depth)
        elif isinstance(s, LdMatrix):
            names = [cname(v) for v in s.vars]
            self.emit(f"int {', '.join(names)};", depth)
            regs = ", ".join(f"%{k}" for k in range(len(names)))
            self.asm(f"ldmatrix.sync.aligned.m8n8.x{len(names)}{'.trans' if s.trans else ''}"
                     f".shared.b16 {{{regs}}}, [%{len(names)}];",
                     [f'"=r"({n})' for n in names], [f'"r"({self.smem_addr(s.buf, s.row)})'], depth)
        elif isinstance(s, Mma):
            self.mma(s, depth)
        elif isinstance(s, CpAsync):
            src = f"&{cname(s.src)}[{self.expr(s.src_index)}]"
            ins = [f'"r"({self.smem_addr(s.dst, s.dst_index)})', f'"l"({src})']
            size = f"{s.nbytes}"
            if s.src_bytes is not None:
                ins.append(f'"r"((unsigned){self.expr(s.src_bytes, UNARY)})')
                size += ", %2"
            self.asm(f"cp.async.{s.cache}.shared.global [%0], [%1], {size};", [], ins, depth)
        elif isinstance(s, CpAsyncCommit):
            self.asm("cp.async.commit_group;", [], [], depth)
        elif isinstance(s, CpAsyncWait):
            self.asm(f"cp.async.wait_group {s.pending};", [], [], depth)
        elif isinstance(s, HOPPER_STMTS):
            self.hopper(s, depth)
        else:
            raise TypeError(f"{self.k.name}: cannot emit statement {s!r}")

    def atomic(self, s: Atomic, depth: int) -> None:
        t = self.bufs[s.buf]
        ptr, v = f"&{cname(s.buf)}[{_strip(self.expr(s.index))}]", _strip(self.expr(s.value))
        if t == "f32" and s.op != "add":
            self.emit(f"st_atomic_{s.op}({ptr}, {v});", depth)
        elif t == "i64" and s.op == "add":
            self.emit(f"atomicAdd((unsigned long long*){ptr}, (unsigned long long)({v}));", depth)
        else:
            fn = {"add": "atomicAdd", "max": "atomicMax", "min": "atomicMin"}[s.op]
            self.emit(f"{fn}({ptr}, ({dtypes.C_STORAGE[t]})({v}));", depth)

    def smem_addr(self, buf: str, index: Expr) -> str:
        return f"st_smem_addr(&{cname(buf)}[{_strip(self.expr(index))}])"

    def asm(self, text: str, outs: list[str], ins: list[str], depth: int, memory: bool = True) -> None:
        """One `asm volatile` statement. Those that touch memory also clobber it, so that the
        compiler keeps plain shared-memory accesses on their side of it."""
        if not outs and not ins:
            self.emit(f'asm volatile("{text}" ::: "memory");', depth)
            return
        pad = " " * len("asm volatile(")
        width = LINE - len(INDENT * depth + pad) - 2
        lines = [f'asm volatile("{text}"']
        if len(lines[0]) > width + len(pad) and " {" in text:     # mnemonic, then operands
            head, _, rest = text.partition(" {")
            lines = [f'asm volatile("{head} "', f'{pad}"{{{rest}"']
        for ops in (outs, ins):          # filled greedily, continuation lines under the first
            lines.append(f"{pad}:")
            for k, op in enumerate(ops):
                piece = op + ("," if k < len(ops) - 1 else "")
                if len(lines[-1]) > len(pad) + 1 and len(lines[-1]) + 1 + len(piece) > width + len(pad):
                    lines.append(f"{pad} ")
                lines[-1] += " " + piece
        if memory:
            lines.append(f'{pad}: "memory"')
        lines[-1] += ");"
        for line in lines:
            self.emit(line, depth)

    def mma(self, s: Mma, depth: int) -> None:
        """D = A @ B + C; with d == c the accumulators are read-write operands ("+f")."""
        d, a, b, c = ([cname(v) for v in vs] for vs in (s.d, s.a, s.b, s.c))
        t = s.dtype
        if d == c:
            outs, c_ops = [f'"+f"({v})' for v in d], _operands(0, 4)
            ins = [f'"r"({v})' for v in a + b]
        else:
            outs, c_ops = [f'"=f"({v})' for v in d], _operands(10, 4)
            ins = [f'"r"({v})' for v in a + b] + [f'"f"({v})' for v in c]
        self.asm(f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{_operands(0, 4)}}}, "
                 f"{{{_operands(4, 4)}}}, {{{_operands(8, 2)}}}, {{{c_ops}}};", outs, ins, depth,
                 memory=False)

    def hopper(self, s, depth: int) -> None:
        """TMA, mbarrier and wgmma: one asm statement each (waits call st_mbar_wait)."""
        if isinstance(s, Wgmma):
            self.wgmma(s, depth)
        elif isinstance(s, WgmmaFence):
            self.asm("wgmma.fence.sync.aligned;", [], [], depth)
        elif isinstance(s, WgmmaCommit):
            self.asm("wgmma.commit_group.sync.aligned;", [], [], depth)
        elif isinstance(s, WgmmaWait):
            self.asm(f"wgmma.wait_group.sync.aligned {s.pending};", [], [], depth)
        elif isinstance(s, FenceProxyAsync):
            self.asm("fence.proxy.async.shared::cta;", [], [], depth)
        elif isinstance(s, MbarInit):
            self.asm("mbarrier.init.shared::cta.b64 [%0], %1;", [],
                     [f'"r"({self.smem_addr(s.bar, s.index)})', f'"r"({s.count})'], depth)
        elif isinstance(s, MbarArrive):
            bar = f'"r"({self.smem_addr(s.bar, s.index)})'
            if s.tx_bytes is None:
                self.asm("mbarrier.arrive.shared::cta.b64 _, [%0];", [], [bar], depth)
            else:
                self.asm("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;", [],
                         [bar, f'"r"({s.tx_bytes})'], depth)
        elif isinstance(s, MbarTryWait):
            self.emit(f"bool {cname(s.var)} = st_mbar_try_wait({self.smem_addr(s.bar, s.index)}, "
                      f"(unsigned){self.expr(s.parity, UNARY)});", depth)
        elif isinstance(s, MbarWait):
            self.emit(f"st_mbar_wait({self.smem_addr(s.bar, s.index)}, "
                      f"(unsigned){self.expr(s.parity, UNARY)});", depth)
        elif isinstance(s, TmaLoad):
            r = len(s.coords)
            coords = ", ".join(f"%{2 + j}" for j in range(r))
            self.asm(f"cp.async.bulk.tensor.{r}d.shared::cluster.global.mbarrier::complete_tx::bytes "
                     f"[%0], [%1, {{{coords}}}], [%{2 + r}];", [],
                     [f'"r"({self.smem_addr(s.dst, s.dst_index)})',
                      f'"l"(reinterpret_cast<unsigned long long>(&{cname(s.tmap)}))',
                      *(f'"r"((int){self.expr(c, UNARY)})' for c in s.coords),
                      f'"r"({self.smem_addr(s.bar, s.bar_index)})'], depth)

    def wgmma(self, s: Wgmma, depth: int) -> None:
        """D = A @ B.T + D per warpgroup; scale-d is a predicate set from an int; imm-scale-a/b
        are 1, imm-trans-a/b are trans_a/trans_b (1: that operand MN-major). The empty asm
        after it ties the accumulators to the asynchronous instruction (the compiler must not
        move or copy them before wgmma.wait_group)."""
        d = [cname(v) for v in s.d]
        nd = len(d)
        scale = "1" if s.scale_d is None else self.expr(s.scale_d, UNARY)
        self.asm(f"{{ .reg .pred p; setp.ne.b32 p, %{nd + 2}, 0; "
                 f"wgmma.mma_async.sync.aligned.m64n{s.n}k16.f32.{s.dtype}.{s.dtype} "
                 f"{{{_operands(0, nd)}}}, %{nd}, %{nd + 1}, p, 1, 1, {int(s.trans_a)}, "
                 f"{int(s.trans_b)}; }}",
                 [f'"+f"({v})' for v in d],
                 [f'"l"({_strip(self.expr(s.a))})', f'"l"({_strip(self.expr(s.b))})',
                  f'"r"((int){scale})'], depth)
        self.asm("", [f'"+f"({v})' for v in d], [], depth)

    def stored(self, buf: str, value: Expr) -> str:
        conv = _TO_STORAGE.get(self.bufs.get(buf, ""))
        return f"{conv}({self.expr(value)})" if conv else _strip(self.expr(value))

    def load_vec(self, s: LoadVec, depth: int) -> None:
        sd, w = self.bufs[s.buf], len(s.vars)
        names = [cname(v) for v in s.vars]
        t = self.ctype(s.vars[0], s.dtype)
        at = f"&{cname(s.buf)}[{self.expr(s.index)}]"
        if w == 1:
            self.emit(f"{t} {names[0]} = {self.ex(Load(s.buf, s.index, s.dtype))[0]};", depth)
            return
        raw = f"{names[0]}_v{w}"
        if sd == "f32" and w in _F32_VEC:
            vt = _F32_VEC[w]
            self.emit(f"const {vt} {raw} = *reinterpret_cast<const {vt}*>({at});", depth)
            for n, f in zip(names, "xyzw"):
                self.emit(f"{t} {n} = {raw}.{f};", depth)
            return
        if (sd, w) in _INT_VEC:
            vt = _INT_VEC[sd, w]
            self.emit(f"const {vt} {raw} = *reinterpret_cast<const {vt}*>({at});", depth)
            for n, f in zip(names, "xyzw"):
                self.emit(f"{t} {n} = {raw}.{f};", depth)
            return
        nbytes = w * dtypes.ITEMSIZE[sd]
        carrier = _CARRIER.get(nbytes)
        if carrier is None:
            raise TypeError(f"{self.k.name}: no {nbytes}-byte vector access for {s.buf}")
        self.emit(f"const {carrier} {raw} = *reinterpret_cast<const {carrier}*>({at});", depth)
        if sd in _HALF2 and w % 2 == 0:
            h2 = _HALF2[sd]
            self.emit(f"const {h2}* {raw}_h2 = reinterpret_cast<const {h2}*>(&{raw});", depth)
            for k, n in enumerate(names):
                self.emit(f"{t} {n} = {'__high2float' if k % 2 else '__low2float'}({raw}_h2[{k // 2}]);",
                          depth)
            return
        et = dtypes.C_STORAGE[sd]
        self.emit(f"const {et}* {raw}_e = reinterpret_cast<const {et}*>(&{raw});", depth)
        conv = _TO_FLOAT.get(sd)
        for k, n in enumerate(names):
            self.emit(f"{t} {n} = {f'{conv}({raw}_e[{k}])' if conv else f'{raw}_e[{k}]'};", depth)

    def store_vec(self, s: StoreVec, depth: int) -> None:
        sd, w = self.bufs[s.buf], len(s.values)
        vals = [_strip(self.expr(v)) for v in s.values]
        at = f"&{cname(s.buf)}[{self.expr(s.index)}]"
        if w == 1:
            self.emit(f"{cname(s.buf)}[{self.expr(s.index)}] = {self.stored(s.buf, s.values[0])};", depth)
            return
        if (sd, w) in _MAKE_VEC:
            vt = _F32_VEC.get(w) if sd == "f32" else _INT_VEC[sd, w]
            self.emit(f"*reinterpret_cast<{vt}*>({at}) = {_MAKE_VEC[sd, w]}({', '.join(vals)});", depth)
            return
        nbytes = w * dtypes.ITEMSIZE[sd]
        carrier = _CARRIER.get(nbytes)
        if carrier is None:
            raise TypeError(f"{self.k.name}: no {nbytes}-byte vector access for {s.buf}")
        if sd in _HALF2 and w == 2:
            self.emit(f"*reinterpret_cast<{_HALF2[sd]}*>({at}) = {_PACK2[sd]}({vals[0]}, {vals[1]});",
                      depth)
            return
        raw = f"{cname(s.buf)}_v{w}"
        self.emit("{", depth)
        self.emit(f"{carrier} {raw};", depth + 1)
        if sd in _HALF2 and w % 2 == 0:
            h2 = _HALF2[sd]
            self.emit(f"{h2}* {raw}_h2 = reinterpret_cast<{h2}*>(&{raw});", depth + 1)
            for k in range(0, w, 2):
                self.emit(f"{raw}_h2[{k // 2}] = {_PACK2[sd]}({vals[k]}, {vals[k + 1]});", depth + 1)
        else:
            et = dtypes.C_STORAGE[sd]
            conv = _TO_STORAGE.get(sd)
            self.emit(f"{et}* {raw}_e = reinterpret_cast<{et}*>(&{raw});", depth + 1)
            for k, v in enumerate(vals):
                self.emit(f"{raw}_e[{k}] = {f'{conv}({v})' if conv else v};", depth + 1)
        self.emit(f"*reinterpret_cast<{carrier}*>({at}) = {raw};", depth + 1)
        self.emit("}", depth)

    # ------------------------------------------------------------ the kernel

    def hoisted_smem(self) -> set[str]:
        """Shared arrays declared in a nested block, or used before their declaration: they are
        declared at the top of the kernel so that C scoping matches Kernel IR's."""
        hoist = {s.name for s in walk(self.k.body) if isinstance(s, Smem)}
        seen: set[str] = set()
        for s in self.k.body:
            if isinstance(s, Smem):
                if s.name in hoist and s.name not in seen:
                    hoist.discard(s.name)
                seen.add(s.name)
                continue
            for name in _buffers_used(s):
                seen.add(name)
        return hoist

    def dynamic_smem(self) -> None:
        """The dynamic shared arrays (Smem.dynamic): one extern array whose base is rounded up to
        DYNAMIC_SMEM_ALIGN at run time (the launch passes that much slack, see
        Kernel.dynamic_smem_bytes), each array at an aligned offset in declaration order."""
        at, self.dyn_offsets = 0, {}
        for s in walk(self.k.body):
            if isinstance(s, Smem) and s.dynamic and s.name not in self.dyn_offsets:
                self.dyn_offsets[s.name] = at
                at += -(-s.size * dtypes.ITEMSIZE[s.dtype] // DYNAMIC_SMEM_ALIGN) * DYNAMIC_SMEM_ALIGN
        if self.dyn_offsets:
            a = DYNAMIC_SMEM_ALIGN
            self.emit(f"extern __shared__ __align__({a}) unsigned char st_dyn_smem_raw[];", 1)
            self.emit(f"unsigned char* st_dyn_smem = st_dyn_smem_raw + (({a}u - "
                      f"((unsigned)__cvta_generic_to_shared(st_dyn_smem_raw) & {a - 1}u)) & {a - 1}u);", 1)

    def kernel(self) -> str:
        k = self.k
        params = [f"{'' if p.output else 'const '}{dtypes.C_STORAGE[p.dtype]}* __restrict__ {cname(p.name)}"
                  if p.tensor_map is None else
                  f"const __grid_constant__ st_tensor_map {cname(p.name)}" for p in k.params]
        params += [f"{dtypes.C_STORAGE[t]} {cname(n)}" for n, t in k.scalars]
        for line in (k.src or "").splitlines():
            self.lines.append(f"// {line}")
        if self.wide:
            self.lines.append("// indices reach 2^31: index arithmetic in long long")
        head = f'extern "C" __global__ void __launch_bounds__({k.block})'
        sig = f"{cname(k.name)}({', '.join(params)}) {{"
        if len(head) + 1 + len(sig) <= LINE:
            self.lines.append(f"{head} {sig}")
        else:
            self.lines.append(head)
            self._wrap_signature(cname(k.name), params)
        self.hoisted = self.hoisted_smem()
        self.dynamic_smem()
        for name in sorted(self.hoisted):
            self.stmt(self.smem[name], 1)
        self.body(k.body, 1)
        self.lines.append("}")
        return "\n".join(self.lines)

    def _wrap_signature(self, name: str, params: list[str]) -> None:
        pad = " " * (len(name) + 1)
        line = f"{name}("
        for i, p in enumerate(params):
            piece = p + (", " if i < len(params) - 1 else ") {")
            if len(line) + len(piece.rstrip()) > LINE and line.strip() not in (f"{name}(",):
                self.lines.append(line.rstrip())
                line = pad
            line += piece
        self.lines.append(line)


def _async_proxy_bufs(kernel: Kernel) -> set[str]:
    """Shared arrays TMA writes or wgmma descriptors point into (the swizzle acts on address bits,
    so they start on a 1024-byte boundary, as the simulator assumes)."""
    return ({s.dst for s in walk(kernel.body) if isinstance(s, TmaLoad)}
            | {x.buf for s in walk(kernel.body) for e in s.exprs() for x in nodes(e)
               if isinstance(x, WgmmaDesc)})


def _operands(first: int, n: int) -> str:
    """'%first, ..., %(first + n - 1)': asm operand numbers."""
    return ", ".join(f"%{first + k}" for k in range(n))


def _buffers_used(s) -> set[str]:
    """Every array `s` and its bodies name: themselves, in a load or in a wgmma descriptor."""
    return {name for st in walk([s]) for name in st.buffers()} | {
        x.buf for st in walk([s]) for e in st.exprs() for x in nodes(e)
        if isinstance(x, (Load, WgmmaDesc))}


# ---------------------------------------------------------------- public entry points

def emit_kernel(kernel: Kernel) -> str:
    """CUDA C for one kernel (needs the includes and prelude of `emit_program` to compile)."""
    return _Emitter(kernel).kernel()


def emit_program(program: KernelProgram, arch: Target | str = "sm_90") -> str:
    """One translation unit: headers, the st_* helpers, then every kernel in launch order."""
    target = get_target(arch)
    names = ", ".join(k.name for k in program.kernels)
    parts = [f"// strata: {len(program.kernels)} kernel(s) for {target}: {names}",
             "#include <cuda_fp16.h>\n#include <cuda_bf16.h>",
             PRELUDE.rstrip()]
    if any(isinstance(s, Atomic) for k in program.kernels for s in walk(k.body)):
        parts.append(ATOMIC_PRELUDE)
    users = [k.name for k in program.kernels
             if any(isinstance(s, WARP_OPS + HOPPER_STMTS) for s in walk(k.body))]
    hopper = [k.name for k in program.kernels if any(isinstance(s, HOPPER_STMTS) for s in walk(k.body))]
    wgmma = [k.name for k in program.kernels if any(isinstance(s, Wgmma) for s in walk(k.body))]
    if not target.is_gpu:
        raise CompileError(f"CUDA is for GPU targets, not {target}")
    if hopper and not target.has("tma"):
        raise CompileError(f"kernel {hopper[0]} uses TMA, mbarrier or wgmma, which need sm_90 or "
                           f"newer, not {target}")
    if wgmma and not target.has("wgmma"):
        raise CompileError(f"kernel {wgmma[0]} uses wgmma, which needs sm_90a, not {target}")
    if users:
        if not target.has("mma.sync"):
            raise CompileError(f"kernel {users[0]} uses mma.sync, ldmatrix or cp.async, which need "
                               f"sm_80 or newer, not {target}")
        parts.append(TENSOR_CORE_PRELUDE.rstrip())
    if hopper:
        parts.append(HOPPER_PRELUDE.rstrip())
    if wgmma:
        parts.append(WGMMA_GUARD)
    parts += [emit_kernel(k) for k in distinct_kernels(program)]
    return "\n\n".join(parts) + "\n"


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
