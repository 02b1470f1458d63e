"""Kernel IR -> OpenCL C 1.2: SIMT kernels for any OpenCL device (PoCL runs them on a CPU).

Why the C family's walk (codegen/cfamily.py): OpenCL C is C99 with address spaces, so the
expressions, the 16-bit storage (ushort, converted by the C target's integer arithmetic) and the
statements are C's; only the SIMT frame differs: blocks are work-groups (`get_group_id(0)`), threads are work-items
(`get_local_id(0)`), shared arrays are `__local` (declared at the kernel's top, as OpenCL
requires), `Sync` is `barrier(...)`, math functions are overloaded (`exp`, not `expf`), and
`long` is 64 bits. Warp shuffles are done through local memory first
(kernel_ir/thread_loops.exchange_shuffles); tensor cores and asynchronous copies are refused.
"""
from __future__ import annotations

from ..core.errors import CompileError
from ..kernel_ir.ir import Atomic, Kernel, Smem, ThreadIdx
from ..kernel_ir.thread_loops import exchange_shuffles
from .c import TO_FLOAT, TO_STORAGE
from .cfamily import UNARY, CFamilyEmitter, cname, refuse_unprintable, strip_parens, torch_math

CL_TYPES = {"f32": "float", "f64": "double", "i64": "long", "i32": "int", "i16": "short",
            "i8": "char", "u8": "uchar", "bool": "uchar", "f16": "ushort", "bf16": "ushort"}

PRELUDE = r"""// strata's OpenCL prelude: torch's NaN-propagating max/min, sign and mod; 16-bit floats
// stored as ushort and converted in registers (as the C target does); atomics on floats.
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
#pragma OPENCL EXTENSION cl_khr_int64_extended_atomics : enable
#define OVL __attribute__((overloadable))
""" + torch_math("OVL", types=("float",), fmodf="fmod") + "\n" + r"""#ifdef cl_khr_fp64
""" + torch_math("OVL", types=("double",)) + "\n" + r"""#endif
float st_bf16_to_float(ushort h) { return as_float((uint)h << 16); }
ushort st_float_to_bf16(float f) {
    uint u = as_uint(f);
    return f != f ? (ushort)0x7FC0 : (ushort)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float st_f16_to_float(ushort h) { return vload_half(0, (const __private half*)&h); }
ushort st_float_to_f16(float f) { ushort h; vstore_half_rte(f, 0, (__private half*)&h); return h; }
#define ST_ATOMIC_F32(name, space, expr) \
void name(volatile space float* p, float v) { \
    volatile space int* q = (volatile space int*)p; int seen, old = *q; \
    do { seen = old; float cur = as_float(seen); float want = (expr); \
         old = atomic_cmpxchg(q, seen, as_int(want)); } while (old != seen); \
}
ST_ATOMIC_F32(st_atomic_add_g, __global, cur + v)
ST_ATOMIC_F32(st_atomic_max_g, __global, v > cur ? v : cur)
ST_ATOMIC_F32(st_atomic_min_g, __global, v < cur ? v : cur)
ST_ATOMIC_F32(st_atomic_add_l, __local, cur + v)
ST_ATOMIC_F32(st_atomic_max_l, __local, v > cur ? v : cur)
ST_ATOMIC_F32(st_atomic_min_l, __local, v < cur ? v : cur)"""


def check_kernel(k: Kernel, target: str = "OpenCL") -> None:
    """Raise CompileError unless `target` (OpenCL or Metal) can express `k`."""
    refuse_unprintable(k, target.lower(), f"{target} cannot run: tensor cores, asynchronous "
                                          f"copies and TMA are CUDA-only")
    for p in k.params:
        if p.tensor_map is not None:
            raise CompileError(f"kernel {k.name} takes a TMA tensor map ({p.name}): CUDA-only")


class OpenCLEmitter(CFamilyEmitter):
    """The family's walk with work-groups, `__local` arrays, barriers and OpenCL's atomics."""
    float_suffix = ""
    to_float = TO_FLOAT                 # 16-bit storage as ushort, converted as the C target does
    to_storage = TO_STORAGE

    def ids(self, e):
        if isinstance(e, ThreadIdx):
            return "(int)get_local_id(0)", UNARY
        return f"({self.index_t})get_group_id(0)", UNARY

    def atomic(self, s: Atomic, depth: int) -> None:
        ptr = f"&{cname(s.buf)}[{strip_parens(self.expr(s.index))}]"
        v = strip_parens(self.expr(s.value))
        t = self.bufs[s.buf]
        if t == "f32":
            space = "l" if s.buf in self.smem else "g"
            self.emit(f"st_atomic_{s.op}_{space}({ptr}, {v});", depth)
        else:
            fn = {"add": "atomic_add", "max": "atomic_max", "min": "atomic_min"}[s.op]
            fn = fn.replace("atomic_", "atom_") if t == "i64" else fn
            self.emit(f"{fn}({ptr}, ({CL_TYPES[t]})({v}));", depth)

    def barrier(self, depth: int) -> None:
        self.emit("barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);", depth)

    def shared_array(self, s: Smem, depth: int) -> None:
        self.emit(f"__local {CL_TYPES[s.dtype]} {cname(s.name)}[{s.size}];", depth)

    def frame(self) -> tuple[str, str, list[str]]:
        """(the line before the signature, the return type and name, the parameters)."""
        k = self.k
        params = [f"__global {'' if p.output else 'const '}{CL_TYPES[p.dtype]}* restrict "
                  f"{cname(p.name)}" for p in k.params]
        params += [f"const {CL_TYPES[t]} {cname(n)}" for n, t in k.scalars]
        return (f"__kernel __attribute__((reqd_work_group_size({k.block}, 1, 1)))",
                f"void {cname(k.name)}", params)

    def kernel(self) -> str:
        k = self.k
        for line in (k.src or "").splitlines():
            self.lines.append(f"// {line}")
        head, name, params = self.frame()
        self.lines.append(head)
        self.wrap_signature(name, params)
        self.hoisted = set(self.smem)
        for s in self.smem.values():
            self.stmt(s, 1)
        self.body(k.body, 1)
        self.lines.append("}")
        return "\n".join(self.lines)

    def ctype(self, var: str, dtype: str) -> str:
        return super().ctype(var, dtype).replace("long long", "long")


def emit_kernel(kernel: Kernel) -> str:
    """OpenCL C for one kernel (after emit_program's prelude)."""
    kernel = exchange_shuffles(kernel)
    check_kernel(kernel)
    text = OpenCLEmitter(kernel).kernel()
    return text.replace("unsigned long long", "ulong").replace("long long", "long")


def emit_source(kernels: list[Kernel]) -> str:
    names = ", ".join(k.name for k in kernels)
    return "\n\n".join([f"// strata: {len(kernels)} kernel(s) for OpenCL C 1.2: {names}",
                        PRELUDE, *(emit_kernel(k) for k in kernels)]) + "\n"

