"""Kernel IR -> Metal Shading Language for Apple GPUs.

Why from the OpenCL emitter: MSL is C++ with address spaces, like OpenCL C with overloading, so
expressions, 16-bit storage (ushort, converted by integer arithmetic) and statements are shared;
what differs is the frame: `kernel void` with `[[buffer(k)]]` arguments (scalars as `constant T&`),
thread and threadgroup ids as attributed arguments, `threadgroup` arrays, `threadgroup_barrier`,
SIMD-group shuffles (`simd_shuffle_xor`: Apple's SIMD groups are 32 wide) and atomics through
`atomic_*_explicit` (float max/min by compare-and-swap). MSL has no erf: the prelude has one
(Abramowitz and Stegun 7.1.26, error under 1.5e-7). Compiled by `xcrun metal` where it exists.
"""
from __future__ import annotations

from ..kernel_ir.ir import Atomic, BlockIdx, Kernel, ShflIdx, ShflXor, Smem, ThreadIdx
from .cfamily import ATOM, UNARY, cname, strip_parens, torch_math
from .opencl import CL_TYPES, OpenCLEmitter, check_kernel

PRELUDE = r"""#include <metal_stdlib>
using namespace metal;
// strata's Metal prelude: torch's NaN-propagating max/min, sign and mod; erf; 16-bit floats
// stored as ushort and converted in registers; float atomics.
""" + torch_math("inline", types=("float",), fmodf="fmod") + "\n" + r"""inline float erf(float x) {
    float t = 1.0f / (1.0f + 0.3275911f * fabs(x));
    float y = 1.0f - (((((1.061405429f * t - 1.453152027f) * t) + 1.421413741f) * t
                      - 0.284496736f) * t + 0.254829592f) * t * exp(-x * x);
    return x < 0.0f ? -y : y;
}
inline float st_bf16_to_float(ushort h) { return as_type<float>((uint)h << 16); }
inline ushort st_float_to_bf16(float f) {
    uint u = as_type<uint>(f);
    return f != f ? (ushort)0x7FC0 : (ushort)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float st_f16_to_float(ushort h) { return (float)as_type<half>(h); }
inline ushort st_float_to_f16(float f) { return as_type<ushort>((half)f); }
template <typename P> inline void st_atomic_cas(P p, float v, bool is_max) {
    uint seen = atomic_load_explicit(p, memory_order_relaxed);
    while (true) {
        float cur = as_type<float>(seen);
        if (!(is_max ? v > cur : v < cur)) return;
        if (atomic_compare_exchange_weak_explicit(p, &seen, as_type<uint>(v),
                memory_order_relaxed, memory_order_relaxed)) return;
    }
}"""
_ATOMIC_T = {"f32": "atomic_float", "i32": "atomic_int", "i64": "atomic_long"}


class MetalEmitter(OpenCLEmitter):
    """OpenCL's walk with Metal's frame, ids, SIMD-group shuffles, barriers and atomics."""
    def ex(self, e):
        if isinstance(e, ThreadIdx):
            return "(int)st_tid", UNARY
        if isinstance(e, BlockIdx):
            return f"({self.index_t})st_bid", UNARY
        if isinstance(e, ShflXor):
            return f"simd_shuffle_xor({strip_parens(self.expr(e.value))}, (ushort){e.mask})", ATOM
        if isinstance(e, ShflIdx):
            return (f"simd_shuffle({strip_parens(self.expr(e.value))}, "
                    f"(ushort)({strip_parens(self.expr(e.lane))}))"), ATOM
        return super().ex(e)

    def atomic(self, s: Atomic, depth: int) -> None:
        space = "threadgroup" if s.buf in self.smem else "device"
        t = self.bufs[s.buf]
        ptr = f"&{cname(s.buf)}[{strip_parens(self.expr(s.index))}]"
        v = strip_parens(self.expr(s.value))
        if t == "f32" and s.op != "add":
            self.emit(f"st_atomic_cas(({space} atomic_uint*){ptr}, {v}, "
                      f"{'true' if s.op == 'max' else 'false'});", depth)
            return
        fn = f"atomic_fetch_{s.op}_explicit"
        self.emit(f"{fn}(({space} {_ATOMIC_T[t]}*){ptr}, ({CL_TYPES[t]})({v}), "
                  f"memory_order_relaxed);", depth)

    def barrier(self, depth: int) -> None:
        self.emit("threadgroup_barrier(mem_flags::mem_threadgroup | mem_flags::mem_device);", depth)

    def shared_array(self, s: Smem, depth: int) -> None:
        self.emit(f"threadgroup {CL_TYPES[s.dtype]} {cname(s.name)}[{s.size}];", depth)

    def frame(self) -> tuple[str, str, list[str]]:
        k = self.k
        params = [f"device {'' if p.output else 'const '}{CL_TYPES[p.dtype]}* {cname(p.name)} "
                  f"[[buffer({i})]]" for i, p in enumerate(k.params)]
        params += [f"constant {CL_TYPES[t]}& {cname(n)} [[buffer({len(k.params) + j})]]"
                   for j, (n, t) in enumerate(k.scalars)]
        params += ["uint st_tid [[thread_position_in_threadgroup]]",
                   "uint st_bid [[threadgroup_position_in_grid]]"]
        return (f"// dispatch {k.grid} threadgroups of {k.block} threads",
                f"kernel void {cname(k.name)}", params)

def emit_kernel(kernel: Kernel) -> str:
    check_kernel(kernel, "Metal")
    return MetalEmitter(kernel).kernel().replace("long long", "long")


def emit_source(kernels: list[Kernel]) -> str:
    return "\n\n".join([f"// strata: {len(kernels)} kernel(s) for Metal (MSL 3.0): "
                        f"{', '.join(k.name for k in kernels)}", PRELUDE,
                        *(emit_kernel(k) for k in kernels)]) + "\n"
