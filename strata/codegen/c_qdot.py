"""A loop over blocks of Q8_0/Q4_0 weights (a quantized matrix-vector row) as AVX-512/AVX2 code.

Why: cpu_block_loops runs a QuantLinear's row as blocks of 32 with the block's scale hoisted, but
gcc still dequantizes each lane through its scalar chain (nibble masks, selects, a bf16 rounding)
and adds it to a partial sum in memory, so the row is bound by instructions, not by the bytes it
reads (docs/quant-cpu-2026-11-26.md). Here the block loop is matched by what it computes, and a
block becomes: 32 bytes (q8_0) or 16 (q4_0) widened to int32 lanes (two zmm, or four ymm with
AVX2), converted to float, multiplied by the 32 activations, and the sum scaled by the block's
scale once: acc += d * (q[0:16] x[0:16] + q[16:32] x[16:32]), two accumulators for alternate
blocks. After the
loop the accumulators are added into the row's partial sums, which the kernel sums as written.

Matching by evaluation, not by syntax: the inner loop's weight expression (whatever Lets, Ifs and
selects lowering produced) is substituted into one expression and evaluated on random blocks and
scales; only if it equals a format's dequantization for all 32 lanes, exactly or rounded to bf16,
is the loop taken. A rounded weight (QuantLinear's `.to(bf16)`) is not rounded here: the scale is
applied to the block's sum instead, which is nearer the float64 reference, not farther; the order
of the sum differs from the scalar loop's as `omp simd`'s does. The loop is printed as written
under `#else`, for compilers targeting neither (the `cpu` target's x86-64).

QDOT=vnni (cpu_block_loops' default where the CPU has AVX512-VNNI): as llama.cpp does, the
kernel first quantizes the row's activations to int8 blocks of 32 (d = max|x| / 127, q =
round(x / d)), and a row's blocks run 16 at a time on vpdpbusd: the weights' bytes as unsigned
(nibbles 0..15, or q8_0's bytes + 128) times the activations' int8, two blocks per instruction,
each block's int32 sums scaled by its two scales in one FMA and the offset (8 or 128 times the
activations' sum) taken off per row; the next rows' bytes are prefetched. A 5632 x 2048 q4_0
row set, weights streamed from DRAM, 2 threads, Emerald Rapids: 0.73 ms as float lanes, 0.39
with VNNI (the bytes alone stream in 0.32). On AVX2 without AVX-512 (Zen 3, Haswell) the same
blocks run one at a time on vpmaddubsw + vpmaddwd (q8_0 by llama.cpp's sign trick, whose
products cannot saturate int16): the same row set on the 2-core Zen 3, interleaved, 0.68 ms as
float lanes, 0.37 ms so (then 1.13x more with q4_0's nibbles unpacked by one vpsrlvq); a
TinyLlama q4_0 decode 13.9 -> 27 tokens/s. The activations' rounding is llama.cpp's error, not
the float path's: QDOT=float keeps the float lanes. The row must read whole, aligned blocks of
the activations and contiguous bytes and f16 or bf16 scales; the float path takes any other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..expr import (Const, Expr, Op, Var, from_linear, affine_terms, cast_values, children,
                    coefficient, evaluate, free_vars, substitute)
from ..kernel_ir.ir import Assign, For, If, Let, Load, Store
from .cfamily import REL, cname, strip_parens

LANES = 32                                  # weights per block (strata/quant/formats.py)
BLOCK_BYTES = {"q8_0": ("i8", 32), "q4_0": ("u8", 16)}

QDOT_PRELUDE = r"""
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// One block of 32 quantized weights by 32 activations (float or bf16), scaled by the block's
// scale d and added to acc (codegen/c_qdot.py): bytes widened to int32 lanes and converted,
// multiplied, summed. st_q8_0_<x>, st_q4_0_<x> for x = f32, bf16; 16 lanes (AVX-512) or 8 (AVX2).
#include <immintrin.h>
static inline float st_f16_scale(uint16_t h) { return _cvtsh_ss(h); }    // F16C (AVX2 CPUs have it)
#if defined(__AVX512F__)
typedef __m512 st_qv;
#define st_qzero _mm512_setzero_ps
static inline __m512 st_xv_f32(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 st_xv_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
static inline __m512 st_qf(const signed char* q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)q)));
}
// q4_0: a nibble n is the float n - 8, looked up by vpermps (which reads an index's low 4 bits)
#define ST_Q4_0_BODY(X) \
    const __m512 values = _mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8); \
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q)); \
    __m512 s = _mm512_mul_ps(_mm512_permutexvar_ps(b, values), st_xv_##X(x)); \
    s = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), values), st_xv_##X(x + 16), s);
#define ST_Q8_0_BODY(X) \
    __m512 s = _mm512_fmadd_ps(st_qf(q + 16), st_xv_##X(x + 16), _mm512_mul_ps(st_qf(q), st_xv_##X(x)));
static inline void st_qlanes(float* l, __m512 a, __m512 b) {
    _mm512_storeu_ps(l, _mm512_add_ps(_mm512_loadu_ps(l), _mm512_add_ps(a, b)));
}
// A block's 32 weights q * d stored as f32 or bf16 (rounded to nearest even, as the prelude's
// st_float_to_bf16 rounds a finite float): a prefill's weight, dequantized once.
static inline void st_qstore_f32(float* o, __m512 w0, __m512 w1) {
    _mm512_storeu_ps(o, w0);
    _mm512_storeu_ps(o + 16, w1);
}
static inline __m256i st_bf16_rne(__m512 v) {
    __m512i b = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    b = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
}
static inline void st_qstore_bf16(uint16_t* o, __m512 w0, __m512 w1) {
    _mm256_storeu_si256((__m256i*)o, st_bf16_rne(w0));
    _mm256_storeu_si256((__m256i*)(o + 16), st_bf16_rne(w1));
}
#define ST_QSTORES(X, T) \
static inline void st_q8_0_to_##X(T* o, const signed char* q, float d) { \
    st_qstore_##X(o, _mm512_mul_ps(st_qf(q), _mm512_set1_ps(d)), \
                  _mm512_mul_ps(st_qf(q + 16), _mm512_set1_ps(d))); } \
static inline void st_q4_0_to_##X(T* o, const unsigned char* q, float d) { \
    const __m512 values = _mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8); \
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q)); \
    st_qstore_##X(o, _mm512_mul_ps(_mm512_permutexvar_ps(b, values), _mm512_set1_ps(d)), \
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), values), _mm512_set1_ps(d))); }
ST_QSTORES(f32, float)
ST_QSTORES(bf16, uint16_t)
#else
typedef __m256 st_qv;
#define st_qzero _mm256_setzero_ps
static inline __m256 st_xv_f32(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 st_xv_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline __m256 st_qf(const signed char* q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)q)));
}
static inline __m256 st_nib(__m256i v) { return _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(8))); }
#define ST_Q4_0_BODY(X) \
    __m128i raw = _mm_loadu_si128((const __m128i*)q); \
    __m256i b0 = _mm256_cvtepu8_epi32(raw), b1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8)); \
    __m256i m = _mm256_set1_epi32(15); \
    __m256 s = _mm256_mul_ps(st_nib(_mm256_and_si256(b0, m)), st_xv_##X(x)); \
    s = _mm256_fmadd_ps(st_nib(_mm256_and_si256(b1, m)), st_xv_##X(x + 8), s); \
    s = _mm256_fmadd_ps(st_nib(_mm256_srli_epi32(b0, 4)), st_xv_##X(x + 16), s); \
    s = _mm256_fmadd_ps(st_nib(_mm256_srli_epi32(b1, 4)), st_xv_##X(x + 24), s);
#define ST_Q8_0_BODY(X) \
    __m256 s = _mm256_mul_ps(st_qf(q), st_xv_##X(x)); \
    for (int j = 8; j < 32; j += 8) s = _mm256_fmadd_ps(st_qf(q + j), st_xv_##X(x + j), s);
static inline void st_qlanes(float* l, __m256 a, __m256 b) {
    _mm256_storeu_ps(l, _mm256_add_ps(_mm256_loadu_ps(l), _mm256_add_ps(a, b)));
}
// A block's 32 weights stored (see the AVX-512 branch): 4 x 8 lanes; bf16 by vpackusdw
static inline void st_qstore_f32(float* o, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    _mm256_storeu_ps(o, w0);
    _mm256_storeu_ps(o + 8, w1);
    _mm256_storeu_ps(o + 16, w2);
    _mm256_storeu_ps(o + 24, w3);
}
static inline __m256i st_bf16_rne(__m256 v) {           // the bf16 bits in each 32-bit lane
    __m256i b = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
}
static inline void st_qstore_bf16(uint16_t* o, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    _mm256_storeu_si256((__m256i*)o, _mm256_permute4x64_epi64(
        _mm256_packus_epi32(st_bf16_rne(w0), st_bf16_rne(w1)), 0xD8));
    _mm256_storeu_si256((__m256i*)(o + 16), _mm256_permute4x64_epi64(
        _mm256_packus_epi32(st_bf16_rne(w2), st_bf16_rne(w3)), 0xD8));
}
#define ST_QSTORES(X, T) \
static inline void st_q8_0_to_##X(T* o, const signed char* q, float d) { \
    __m256 s = _mm256_set1_ps(d); \
    st_qstore_##X(o, _mm256_mul_ps(st_qf(q), s), _mm256_mul_ps(st_qf(q + 8), s), \
                  _mm256_mul_ps(st_qf(q + 16), s), _mm256_mul_ps(st_qf(q + 24), s)); } \
static inline void st_q4_0_to_##X(T* o, const unsigned char* q, float d) { \
    __m128i raw = _mm_loadu_si128((const __m128i*)q); \
    __m256i b0 = _mm256_cvtepu8_epi32(raw), b1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8)); \
    __m256i m = _mm256_set1_epi32(15); \
    __m256 s = _mm256_set1_ps(d); \
    st_qstore_##X(o, _mm256_mul_ps(st_nib(_mm256_and_si256(b0, m)), s), \
                  _mm256_mul_ps(st_nib(_mm256_and_si256(b1, m)), s), \
                  _mm256_mul_ps(st_nib(_mm256_srli_epi32(b0, 4)), s), \
                  _mm256_mul_ps(st_nib(_mm256_srli_epi32(b1, 4)), s)); }
ST_QSTORES(f32, float)
ST_QSTORES(bf16, uint16_t)
#endif
#define ST_QBLOCKS(X, T) \
static inline st_qv st_q8_0_##X(st_qv acc, const signed char* q, const T* x, float d) { \
    ST_Q8_0_BODY(X) return st_qfma(s, d, acc); } \
static inline st_qv st_q4_0_##X(st_qv acc, const unsigned char* q, const T* x, float d) { \
    ST_Q4_0_BODY(X) return st_qfma(s, d, acc); }
#if defined(__AVX512F__)
static inline __m512 st_qfma(__m512 s, float d, __m512 acc) { return _mm512_fmadd_ps(s, _mm512_set1_ps(d), acc); }
#else
static inline __m256 st_qfma(__m256 s, float d, __m256 acc) { return _mm256_fmadd_ps(s, _mm256_set1_ps(d), acc); }
#endif
ST_QBLOCKS(f32, float)
ST_QBLOCKS(bf16, uint16_t)
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define ST_VNNI 512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
#define ST_VNNI 256         // the same int8 blocks on vpmaddubsw + vpmaddwd (no VNNI)
#else
#define ST_VNNI 0
#endif
#if ST_VNNI
// QDOT=vnni: activations as int8 blocks of 32, each with its scale d and c = d * sum(q)
// (max|x| by a compare, not fmaxf: gcc calls libm's fmaxf per element, 6 us a 2048-wide row)
typedef struct { int8_t* q; float* d; float* c; } st_xq8;
#define ST_XQ8(X, T, LOAD) \
static st_xq8 st_quantize_##X(const T* x, long n) { \
    st_xq8 v = {st_scratch(n + 64), st_scratch((n / 32 + 16) * sizeof(float)), \
                st_scratch((n / 32 + 16) * sizeof(float))}; \
    for (long b = 0; b < n / 32; b++) { \
        float m = 0.0f, f[32]; \
        for (int j = 0; j < 32; j++) { \
            f[j] = LOAD(x[b * 32 + j]); \
            m = fabsf(f[j]) > m ? fabsf(f[j]) : m; } \
        float d = m / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f; \
        int sum = 0; \
        for (int j = 0; j < 32; j++) { int q = (int)nearbyintf(f[j] * id); v.q[b * 32 + j] = (int8_t)q; sum += q; } \
        v.d[b] = d; v.c[b] = d * (float)sum; \
    } \
    return v; }
#define ST_ID(v) (v)
ST_XQ8(f32, float, ST_ID)
ST_XQ8(bf16, uint16_t, st_bf16_to_float)
static void st_xq8_free(st_xq8 v) { free(v.q); free(v.d); free(v.c); }
static inline __m256i st_w1_q4_0(const unsigned char* q) {     // (see st_w2_q4_0): the 16
    __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)q));  // bytes in
    return _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_set_epi64x(4, 4, 0, 0)),  // both halves
                            _mm256_set1_epi8(15));       // (AVX2 rows 1.13x the two-half insert)
}
static inline float st_s1_f16(uint16_t d) { return _cvtsh_ss(d); }
static inline float st_s1_bf16(uint16_t d) { return st_bf16_to_float(d); }
#endif
#if ST_VNNI == 512
// Two blocks' weights as 64 unsigned bytes (q4_0: the 16 low nibbles, then the 16 high, per
// block; q8_0: the bytes + 128), one block's as 32, and the offset that adds
static inline __m512i st_w2_q4_0(const unsigned char* q) {
    const __m256i m = _mm256_set1_epi8(15);
    __m256i raw = _mm256_loadu_si256((const __m256i*)q);
    __m256i lo = _mm256_and_si256(raw, m), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(lo, hi, 0x20)),
                              _mm256_permute2x128_si256(lo, hi, 0x31), 1);
}
static inline __m512i st_w2_q8_0(const signed char* q) {
    return _mm512_xor_si512(_mm512_loadu_si512(q), _mm512_set1_epi8((char)0x80));
}
static inline __m256i st_w1_q8_0(const signed char* q) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)q), _mm256_set1_epi8((char)0x80));
}
// Blocks 0..nb of a row (bytes q, f16 scales d) by activation blocks xb..xb+nb: 16 lanes whose
// sum is the row's part. 16 blocks a step: their scales converted at once, d_w * d_x picked per
// pair of blocks by vpermps, two accumulators; the rest one block at a time.
static inline __m512 st_s16_f16(const uint16_t* d) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)d)); }
static inline __m512 st_s16_bf16(const uint16_t* d) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)d)), 16));
}
#define ST_QVNNI(F, T, NBYTES, OFFSET, S) \
static inline __m512 st_##F##_vnni_##S(const T* q, const uint16_t* d, const st_xq8* x, long xb, long nb) { \
    for (long l = 0; l < nb * (NBYTES); l += 64) __builtin_prefetch((const char*)q + 4096 + l, 0, 3); \
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), off = _mm512_setzero_ps(); \
    const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); \
    long b = 0; \
    for (; b + 16 <= nb; b += 16) { \
        __m512 dw = st_s16_##S(d + b); \
        off = _mm512_fmadd_ps(dw, _mm512_loadu_ps(x->c + xb + b), off); \
        __m512 s16 = _mm512_mul_ps(dw, _mm512_loadu_ps(x->d + xb + b)); \
        for (int p = 0; p < 16; p += 4) { \
            __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), st_w2_##F(q + (b + p) * (NBYTES)), \
                                             _mm512_loadu_si512(x->q + (xb + b + p) * 32)); \
            __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), st_w2_##F(q + (b + p + 2) * (NBYTES)), \
                                             _mm512_loadu_si512(x->q + (xb + b + p + 2) * 32)); \
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), \
                                   _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(p)), s16), acc0); \
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), \
                                   _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(p + 2)), s16), acc1); \
        } \
    } \
    __m256 tail = _mm256_setzero_ps(); \
    float rest = 0.0f; \
    for (long r = nb & 15; r > 0; r--, b++) { \
        float dw = st_s1_##S(d[b]); \
        __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), st_w1_##F(q + b * (NBYTES)), \
                                        _mm256_loadu_si256((const __m256i*)(x->q + (xb + b) * 32))); \
        tail = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * x->d[xb + b]), tail); \
        rest += dw * x->c[xb + b]; \
    } \
    tail = _mm256_sub_ps(tail, _mm256_setr_ps((OFFSET) * rest, 0, 0, 0, 0, 0, 0, 0)); \
    return _mm512_add_ps(_mm512_fnmadd_ps(off, _mm512_set1_ps(OFFSET), _mm512_add_ps(acc0, acc1)), \
                         _mm512_insertf32x8(_mm512_setzero_ps(), tail, 0)); }
ST_QVNNI(q4_0, unsigned char, 16, 8.0f, f16)
ST_QVNNI(q8_0, signed char, 32, 128.0f, f16)
ST_QVNNI(q4_0, unsigned char, 16, 8.0f, bf16)
ST_QVNNI(q8_0, signed char, 32, 128.0f, bf16)
#elif ST_VNNI == 256
// AVX2: a block's 32 products summed by vpmaddubsw (unsigned by signed bytes, pairs to int16)
// and vpmaddwd (pairs to int32): q4_0's nibbles 0..15 as they are (offset 8); q8_0 by
// llama.cpp's sign trick, |w| times x with w's sign (offset 0: w + 128 would saturate int16)
static inline __m256i st_i8dot_q4_0(const unsigned char* q, const int8_t* x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(st_w1_q4_0(q), _mm256_loadu_si256((const __m256i*)x)),
                             _mm256_set1_epi16(1));
}
static inline __m256i st_i8dot_q8_0(const signed char* q, const int8_t* x) {
    __m256i w = _mm256_loadu_si256((const __m256i*)q), v = _mm256_loadu_si256((const __m256i*)x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(v, w)),
                             _mm256_set1_epi16(1));
}
static inline __m256 st_s8_f16(const uint16_t* d) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)d)); }
static inline __m256 st_s8_bf16(const uint16_t* d) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)d)), 16));
}
// Blocks 0..nb of a row by activation blocks xb..: 8 lanes whose sum is the row's part; 8 blocks
// a step, their scales converted at once and d_w * d_x picked per block by vpermps.
#define ST_QI8(F, T, NBYTES, OFFSET, S) \
static inline __m256 st_##F##_vnni_##S(const T* q, const uint16_t* d, const st_xq8* x, long xb, long nb) { \
    for (long l = 0; l < nb * (NBYTES); l += 64) __builtin_prefetch((const char*)q + 4096 + l, 0, 3); \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), off = _mm256_setzero_ps(); \
    long b = 0; \
    for (; b + 8 <= nb; b += 8) { \
        __m256 dw = st_s8_##S(d + b); \
        off = _mm256_fmadd_ps(dw, _mm256_loadu_ps(x->c + xb + b), off); \
        __m256 s8 = _mm256_mul_ps(dw, _mm256_loadu_ps(x->d + xb + b)); \
        for (int p = 0; p < 8; p += 2) { \
            __m256i d0 = st_i8dot_##F(q + (b + p) * (NBYTES), x->q + (xb + b + p) * 32); \
            __m256i d1 = st_i8dot_##F(q + (b + p + 1) * (NBYTES), x->q + (xb + b + p + 1) * 32); \
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_permutevar8x32_ps(s8, _mm256_set1_epi32(p)), acc0); \
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_permutevar8x32_ps(s8, _mm256_set1_epi32(p + 1)), acc1); \
        } \
    } \
    float rest = 0.0f; \
    for (; b < nb; b++) { \
        float dw = st_s1_##S(d[b]); \
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(st_i8dot_##F(q + b * (NBYTES), x->q + (xb + b) * 32)), \
                               _mm256_set1_ps(dw * x->d[xb + b]), acc0); \
        rest += dw * x->c[xb + b]; \
    } \
    return _mm256_sub_ps(_mm256_fnmadd_ps(off, _mm256_set1_ps(OFFSET), _mm256_add_ps(acc0, acc1)), \
                         _mm256_setr_ps((OFFSET) * rest, 0, 0, 0, 0, 0, 0, 0)); }
ST_QI8(q4_0, unsigned char, 16, 8.0f, f16)
ST_QI8(q8_0, signed char, 32, 0.0f, f16)
ST_QI8(q4_0, unsigned char, 16, 8.0f, bf16)
ST_QI8(q8_0, signed char, 32, 0.0f, bf16)
#endif"""


@dataclass(frozen=True)
class QuantBlocks:
    fmt: str                    # q8_0 | q4_0
    scale: Expr                 # the block's scale, free of the lane variable
    qs: str                     # the quantized bytes
    qs_at: Expr                 # the block's first byte
    x: str | None               # the activations (f32 or bf16); None: the weights are stored
    x_at: Expr | None           # the activation of lane 0
    dest: str                   # the row's partial sums, or the dequantized weights (f32, bf16)
    dest_at: Expr               # its element of lane 0


def match_quant_blocks(loop: For, bufs: dict) -> QuantBlocks | None:
    """`loop` (over blocks) as Lets of outer values, then a loop of 32 lanes adding
    x[lane] * w(lane) to partial sums, or storing w(lane) (a prefill's weight dequantized once,
    cpu_prologue), w a q8_0 or q4_0 dequantization (see the module docstring); else None."""
    *lets, inner = loop.body or (None,)
    if loop.step != 1 or not isinstance(inner, For) or not _lanes_0_to_32(inner) \
            or not all(isinstance(s, Let) for s in lets):
        return None
    outer = _inlined(lets, {})
    if outer is None:
        return None
    zero = {inner.var: Const(0, "i64")}
    found = _lane_sum(inner, outer)
    if found is None:
        store = _lane_store(inner, outer, bufs)
        fmt = store and _format_of(store[2], inner.var, bufs)
        return fmt and QuantBlocks(fmt[0], *fmt[1:], None, None, store[0],
                                   substitute(store[1], zero))
    lanes, lanes_at, product = found
    for x, w in ((product.args[0], product.args[1]), (product.args[1], product.args[0])):
        if isinstance(x, Load) and bufs.get(x.buf) in ("f32", "bf16") and x.dtype == "f32" \
                and coefficient(x.index, inner.var) == 1:
            fmt = _format_of(w, inner.var, bufs)
            if fmt is not None:
                scale, qs, qs_at = fmt[1:]
                return QuantBlocks(fmt[0], scale, qs, qs_at, x.buf, substitute(x.index, zero),
                                   lanes, substitute(lanes_at, zero))
    return None


def _lanes_0_to_32(inner: For) -> bool:
    trips = [getattr(e, "value", None) for e in (inner.start, inner.stop)]
    return inner.step == 1 and trips == [0, LANES]


def _inlined(body, env: dict) -> dict | None:
    """var -> its value with earlier Lets substituted (Loads kept as leaves), for a body of Lets
    and of Ifs that assign one loaded value (a masked load); None for anything else."""
    env = dict(env)
    for s in body:
        if isinstance(s, Let):
            env[s.var] = substitute(s.value, env)
        elif isinstance(s, If) and not s.orelse and len(s.then) == 1 \
                and isinstance(s.then[0], Assign) and s.then[0].var in env:
            a = s.then[0]
            prev = env[a.var]
            env[a.var] = Op("where", (substitute(s.cond, env), substitute(a.value, env), prev),
                            prev.dtype)
        else:
            return None
    return env


def _lane_sum(inner: For, outer: dict):
    """(partial sums buffer, its index, the product added) of a lane loop whose last two
    statements read lanes[i] and store lanes[i] + product; None otherwise."""
    if len(inner.body) < 3:
        return None
    *body, read, store = inner.body
    if not (isinstance(read, Let) and isinstance(read.value, Load) and isinstance(store, Store)
            and store.buf == read.value.buf and store.index == read.value.index
            and isinstance(store.value, Op) and store.value.op == "add"
            and store.value.args[0] == Var(read.var, read.dtype)
            and coefficient(store.index, inner.var) == 1):
        return None
    env = _inlined(body, outer)
    if env is None:
        return None
    product = substitute(store.value.args[1], env)
    if not (isinstance(product, Op) and product.op == "multiply" and product.dtype == "f32"):
        return None
    return store.buf, store.index, product


def _lane_store(inner: For, outer: dict, bufs: dict):
    """(buffer, its index, the value) of a lane loop of Lets and masked loads ending in one store
    to consecutive f32 or bf16 elements; None otherwise."""
    if not inner.body:
        return None
    *body, store = inner.body
    env = _inlined(body, outer)
    if env is None or not isinstance(store, Store) or bufs.get(store.buf) not in ("f32", "bf16") \
            or coefficient(store.index, inner.var) != 1:
        return None
    return store.buf, store.index, substitute(store.value, env)


def _leaves(e: Expr, stop):
    """The nodes of e for which stop(node) holds, not looking inside them."""
    if stop(e):
        return [e]
    return [x for c in children(e) for x in _leaves(c, stop)]


def _format_of(w: Expr, lane: str, bufs: dict):
    """(fmt, scale, qs buffer, block start) if w dequantizes one block of a q8_0/q4_0 buffer for
    every lane, found by evaluating it (see the module docstring); else None. The scale is w's one
    leaf besides the lane, constants and the bytes: a load of the scales or a variable."""
    leaves = set(_leaves(w, lambda x: isinstance(x, (Load, Var, Const))))
    qs = {x.buf for x in leaves if isinstance(x, Load) and bufs.get(x.buf) in ("i8", "u8")}
    scales = [x for x in leaves if not isinstance(x, Const) and x != Var(lane, x.dtype)
              and getattr(x, "buf", None) not in qs]
    if len(qs) != 1 or len(scales) != 1 or lane in free_vars(scales[0]):
        return None
    qs = qs.pop()
    indices = [x.index for x in leaves if getattr(x, "buf", None) == qs]
    terms = [affine_terms(i) for i in indices]
    starts = {frozenset((a, c) for a, c in t[0].items() if lane not in free_vars(a))
              for t in terms if t is not None}
    if None in terms or len(starts) != 1 or any(coefficient(i, lane) not in (0, 1) for i in indices):
        return None                         # every byte read from one block start
    consts, start = {t[1] for t in terms}, dict(starts.pop())
    for fmt, (dtype, nbytes) in BLOCK_BYTES.items():
        for c in sorted(consts | {c + nbytes for c in consts}):     # where the block starts
            if bufs[qs] == dtype and _dequantizes(w, fmt, nbytes, qs, scales[0], lane, c):
                return fmt, scales[0], qs, from_linear(start, c)
    return None


def _dequantizes(w: Expr, fmt: str, nbytes: int, qs: str, scale: Expr, lane: str, base: int) -> bool:
    """w(lane) == fmt's weight `lane` of a random block, for 0 <= lane < 32, exactly or rounded to
    bf16, at three random scales (bytes read outside the block are noise, so they fail)."""
    rng = np.random.default_rng(0)
    dtype = np.int8 if fmt == "q8_0" else np.uint8
    for _ in range(3):
        pad = rng.integers(0, 256, 3 * nbytes).astype(np.uint8).view(dtype)
        block = pad[nbytes:2 * nbytes]
        d = np.float32(rng.normal() * 0.01)
        if fmt == "q8_0":
            want = block.astype(np.float32) * d
        else:
            q = np.concatenate([block & 15, block >> 4]).astype(np.float32) - 8
            want = q * d

        def extra(e, go):
            if isinstance(e, Load) and e.buf == qs:
                at = np.asarray(go(e.index), dtype=np.int64) - base + nbytes
                return pad[np.clip(at, 0, 3 * nbytes - 1)]
            if e == scale:
                return d
            raise KeyError(e)
        env = _Env(lane, scale, d)
        try:
            got = np.broadcast_to(evaluate(w, env, extra), (LANES,)).astype(np.float32)
        except Exception:  # noqa: BLE001 - an expression this evaluation cannot take is no match
            return False
        if not (np.array_equal(got, want) or np.array_equal(got, cast_values(want, "bf16"))):
            return False
    return True


class _Env(dict):
    """The lane variable as 0..31, the scale (a Var) as d, and every other outer variable 0: the
    block is evaluated relative to its start."""

    def __init__(self, lane: str, scale: Expr, d):
        super().__init__({lane: np.arange(LANES, dtype=np.int64)})
        if isinstance(scale, Var):
            self[scale.name] = d

    def __missing__(self, key):
        return np.int64(0)


def vnni_rows(loop: For, qb: QuantBlocks, bufs: dict) -> bool:
    """Whether QDOT=vnni can run the row: activations read in whole blocks of 32 at a multiple
    of 32, the block's bytes contiguous block after block, its scale an f16 or bf16 load, one
    a block."""
    if qb.x is None or not isinstance(qb.scale, Load) or bufs.get(qb.scale.buf) not in ("f16", "bf16"):
        return False
    terms = affine_terms(qb.x_at)
    return terms is not None and coefficient(qb.x_at, loop.var) == LANES and terms[1] % LANES == 0 \
        and all(c % LANES == 0 for c in terms[0].values()) \
        and coefficient(qb.qs_at, loop.var) == BLOCK_BYTES[qb.fmt][1] \
        and coefficient(qb.scale.index, loop.var) == 1


def emit_quant_blocks(em, loop: For, qb: QuantBlocks, depth: int, as_written, vnni=False) -> None:
    """Print `loop` as vector code where the compiler targets AVX-512F or AVX2 with FMA, else
    `as_written()`."""
    o, t = cname(loop.var), em.ctype(loop.var, loop.dtype)
    stop = em.expr(loop.stop, REL + 1)
    fn = f"st_{qb.fmt}_{'bf16' if em.bufs[qb.x or qb.dest] == 'bf16' else 'f32'}"
    ctype = "signed char" if qb.fmt == "q8_0" else "unsigned char"

    def at(e: Expr, step: int) -> str:
        if step:
            e = substitute(e, {loop.var: Op("add", (Var(loop.var, loop.dtype), Const(step, loop.dtype)),
                                            loop.dtype)})
        return strip_parens(em.expr(e))

    def scale(step: int) -> str:
        s = qb.scale
        if isinstance(s, Load) and em.bufs.get(s.buf) == "f16":
            return f"st_f16_scale({cname(s.buf)}[{at(s.index, step)}])"
        return at(s, step)

    def q(step: int) -> str:
        return f"(const {ctype}*)&{cname(qb.qs)}[{at(qb.qs_at, step)}]"
    if qb.x is None:                        # a weight dequantized and stored
        em.emit(f"#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    // {qb.fmt} "
                f"blocks stored as vector code (codegen/c_qdot.py)", 0)
        em.emit(f"for ({t} {o} = {strip_parens(em.expr(loop.start))}; {o} < {stop}; {o}++) {{", depth)
        em.emit(f"{fn.replace('_f32', '_to_f32').replace('_bf16', '_to_bf16')}"
                f"(&{cname(qb.dest)}[{at(qb.dest_at, 0)}], {q(0)}, {scale(0)});", depth + 1)
        em.emit("}", depth)
        em.emit("#else", 0)
        as_written()
        return em.emit("#endif", 0)

    def block(acc: str, step: int, d: int) -> None:
        em.emit(f"{acc} = {fn}({acc}, {q(step)}, &{cname(qb.x)}[{at(qb.x_at, step)}], "
                f"{scale(step)});", d)
    if vnni:
        em.emit(f"#if ST_VNNI    // {qb.fmt} blocks by int8 dot products, activations in int8 "
                f"(codegen/c_qdot.py)", 0)
        em.emit(f"{{ {t} {o} = {strip_parens(em.expr(loop.start))};", depth)
        em.emit(f"st_qlanes(&{cname(qb.dest)}[{strip_parens(em.expr(qb.dest_at))}], "
                f"st_{qb.fmt}_vnni_{em.bufs[qb.scale.buf]}({q(0)}, &{cname(qb.scale.buf)}[{at(qb.scale.index, 0)}], "
                f"&st_xq_{cname(qb.x)}, ({at(qb.x_at, 0)}) / {LANES}, {stop} - {o}), st_qzero()); }}",
                depth)
        em.emit(f"#elif defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    "
                f"// {qb.fmt} blocks as vector code", 0)
    else:
        em.emit(f"#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))    "
                f"// {qb.fmt} blocks as vector code (codegen/c_qdot.py)", 0)
    em.emit("{", depth)
    em.emit("st_qv st_qacc0 = st_qzero(), st_qacc1 = st_qzero();", depth + 1)
    em.emit(f"{t} {o} = {strip_parens(em.expr(loop.start))};", depth + 1)
    em.emit(f"for (; {o} + 2 <= {stop}; {o} += 2) {{", depth + 1)
    block("st_qacc0", 0, depth + 2)
    block("st_qacc1", 1, depth + 2)
    em.emit("}", depth + 1)
    em.emit(f"if ({o} < {stop}) {{", depth + 1)
    block("st_qacc0", 0, depth + 2)
    em.emit("}", depth + 1)
    em.emit(f"st_qlanes(&{cname(qb.dest)}[{strip_parens(em.expr(qb.dest_at))}], st_qacc0, st_qacc1);",
            depth + 1)
    em.emit("}", depth)
    em.emit("#else", 0)
    as_written()
    em.emit("#endif", 0)
