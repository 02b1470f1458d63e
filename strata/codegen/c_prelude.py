"""The C prelude of the CPU target: what the scalar templates of scalar_ops.py call, in C11;
its text is preludes/c_head.h, torch_math's functions, then preludes/c_tail.h.

Why a module of its own: the templates are shared with the CUDA emitter and were written for C++
(overloads, CUDA intrinsics). C has no overloading, so `st_max`, `min`, `abs` ... are _Generic
macros over one static inline function per type; CUDA's `rsqrtf` is 1 / sqrt (both correctly
rounded, as the simulator computes it). fp16/bf16 are stored as uint16_t and converted in
registers by integer and float arithmetic only, with no branch, so that gcc and clang vectorise
the conversions (gcc 12 vectorises no `_Float16` arithmetic without AVX512-FP16):
  bf16 -> float: bits << 16 (exact);   float -> bf16: round to nearest even, NaN -> 0x7FC0
  (dtypes.to_bf16_bits and torch do the same);
  f16 -> float: exact, subnormals included;   float -> f16: round to nearest even, overflow to
  inf, NaN kept NaN (quiet), as NumPy's and F16C's conversions do; FP8 (uint8_t) as torch
  converts them (cfamily.fp8_convert).
tests/runtime/test_native.py checks them against NumPy (every f16 pattern, the rounding edges, a
million random floats); all 2^32 floats were checked once against the CPU's F16C instructions.
With -std=c11 no libc header declares rsqrt/min/max/abs, so the names are free. With
STRATA_LIBMVEC (runtime/cc.py) the float math functions are declared `omp declare simd`, so
loops that call them vectorise through glibc's libmvec.
"""
from __future__ import annotations

from .cfamily import fp8_convert, prelude, torch_math

PRELUDE = (prelude("c_head.h") + torch_math("static inline", suffixed=True) + "\n"
           + prelude("c_tail.h")
           + fp8_convert("static inline", "uint8_t", "uint32_t", "st_bits", "st_float") + "\n")
