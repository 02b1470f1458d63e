#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A kernel's per-thread scratch (a CPU block's "shared memory": a packed GEMM panel).
static void* st_scratch(size_t bytes) {
    void* p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "strata: no memory for a kernel's %zu-byte scratch array\n", bytes);
        abort();
    }
    return p;
}
#ifdef STRATA_LIBMVEC
// glibc's vector math (libmvec): loops calling these vectorise (at most 4 ulp from libm).
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float exp2f(float);
#pragma omp declare simd notinbranch
float expm1f(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float log1pf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
float powf(float, float);
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>      // explicit vectors: codegen/c_outer.py, c_dot.py, c_pairs.py, c_amx.py
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif
#if defined(__AVX512BF16__)
// 32 bf16 values as one vdpbf16ps operand (codegen/c_dot.py); the masked one reads zeros past
// the end of a row.
#define st_bf16x32(p) ((__m512bh)_mm512_loadu_si512(p))
#define st_bf16x32_masked(mask, p) ((__m512bh)_mm512_maskz_loadu_epi16(mask, p))
static inline __m512bh st_bf16x2(const uint16_t* p) {     // a pair in every lane (c_pairs.py)
    int32_t v;
    memcpy(&v, p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}
#endif

// torch semantics: NaN propagates through maximum/minimum and sign; mod takes the divisor's sign.
// max/min are one compare and a select (they vectorise); a tie (-0.0, 0.0) gives b, as NumPy does.
