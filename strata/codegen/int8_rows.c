// int8 rows: a prefill's quantized linear, out[m][n] = sum_k x[m][k] * w(n, k) for M > 1, on
// AVX512-VNNI int8 dot products with the activation ROWS as the vector lanes (issue 56, scope 2:
// prefill on int8 x int8 products). Not yet chosen by the compiler: strata/bench/int8_probe.py
// measures it against strata's bf16 path (a dequantizing kernel, then a bf16 GEMM), and the
// next step states it as a Kernel IR form (kernel_ir/cpu_ir.py) printed by codegen/c_qdot.py.
//
// Why rows as lanes: vpdpbusd multiplies 4 unsigned by 4 signed bytes per 32-bit lane, and only
// its signed operand may be a broadcast (m32bcst). Activations are quantized once per call (to
// q + 128, unsigned, blocks of 32 with d and c = d * sum(q) as QDOT=vnni's rows do), laid out 16
// rows x 4 bytes per step of 4 K; weights stay as stored (q4_0, q4_k: 16 bytes of nibbles a
// block) and are unpacked per group of NR rows to signed bytes, whose dwords are broadcast. A
// block's int32 sums are then one cvt and three FMAs per 8 vpdpbusd: sum = sw * dx * dot -
// dx * beta - cx * mw, beta = 128 * sw * (the block's weight sum) taking the +128 back off, mw
// q4_k's minimum (sw = d * sc). No packing at load, no extra memory.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>

#define NR 8
#define KCHUNK 512          // K a step of a pair of row groups: 2 x 16 x 512 activation bytes
typedef struct { uint8_t* q; float* d; float* c; int m16, nb; } xq_t;  // [m16][K/4][16][4], [m16][nb][16]

static xq_t quantize_rows(const float* x, int M, int K) {
    xq_t v; v.m16 = (M + 31) / 32 * 2; v.nb = K / 32;     // micro4 takes groups in pairs
    v.q = aligned_alloc(64, (size_t)v.m16 * K * 16);
    v.d = aligned_alloc(64, (size_t)v.m16 * v.nb * 16 * 4);
    v.c = aligned_alloc(64, (size_t)v.m16 * v.nb * 16 * 4);
    #pragma omp parallel for
    for (int m = 0; m < v.m16 * 16; m++) {
        int g = m / 16, l = m % 16;
        for (int b = 0; b < v.nb; b++) {
            float f[32], mx = 0.f;
            for (int j = 0; j < 32; j++) { f[j] = m < M ? x[(size_t)m * K + b * 32 + j] : 0.f; mx = fabsf(f[j]) > mx ? fabsf(f[j]) : mx; }
            float d = mx / 127.f, id = d > 0 ? 1.f / d : 0.f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                int q = (int)nearbyintf(f[j] * id); sum += q;
                v.q[((size_t)g * (K / 4) + b * 8 + j / 4) * 64 + l * 4 + j % 4] = (uint8_t)(q + 128);
            }
            v.d[((size_t)g * v.nb + b) * 16 + l] = d;
            v.c[((size_t)g * v.nb + b) * 16 + l] = d * (float)sum;
        }
    }
    return v;
}

// A group of NR weight rows unpacked: w8[r][k] s8, sw/beta/mw[b][r] floats:
// w(n, k) = sw * w8 - mw; beta = 128 * sw * sum(w8 of the block)
typedef struct { int8_t* w8; float *sw, *beta, *mw; } wg_t;

static void unpack_q4_0(wg_t* g, const uint8_t* qs, const uint16_t* d, int n0, int K) {
    int nb = K / 32;
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < nb; b++) {
            const uint8_t* q = qs + ((size_t)(n0 + r) * nb + b) * 16;
            int8_t* o = g->w8 + (size_t)r * K + b * 32;
            __m128i raw = _mm_loadu_si128((const __m128i*)q), m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
            __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m), e), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m), e);
            _mm_storeu_si128((__m128i*)o, lo); _mm_storeu_si128((__m128i*)(o + 16), hi);
            __m128i s = _mm_add_epi64(_mm_sad_epu8(_mm_add_epi8(lo, e), _mm_setzero_si128()),
                                      _mm_sad_epu8(_mm_add_epi8(hi, e), _mm_setzero_si128()));
            int wsum = (int)(_mm_extract_epi64(s, 0) + _mm_extract_epi64(s, 1)) - 8 * 32;   // of n - 8
            float sw = _cvtsh_ss(d[(size_t)(n0 + r) * nb + b]);
            g->sw[b * NR + r] = sw; g->beta[b * NR + r] = 128.f * sw * (float)wsum; g->mw[b * NR + r] = 0.f;
        }
}

// q4_k as strata keeps it: the q4_0 nibbles, d and dmin per 8 blocks (f16), sc and mn a byte each
static void unpack_q4_k(wg_t* g, const uint8_t* qs, const uint16_t* d, const uint8_t* sc,
                        const uint16_t* dmin, const uint8_t* mn, int n0, int K) {
    int nb = K / 32;
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < nb; b++) {
            size_t n = n0 + r;
            const uint8_t* q = qs + (n * nb + b) * 16;
            int8_t* o = g->w8 + (size_t)r * K + b * 32;
            __m128i raw = _mm_loadu_si128((const __m128i*)q), m = _mm_set1_epi8(15);
            __m128i lo = _mm_and_si128(raw, m), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
            _mm_storeu_si128((__m128i*)o, lo); _mm_storeu_si128((__m128i*)(o + 16), hi);
            __m128i s = _mm_add_epi64(_mm_sad_epu8(lo, _mm_setzero_si128()), _mm_sad_epu8(hi, _mm_setzero_si128()));
            int wsum = _mm_extract_epi64(s, 0) + _mm_extract_epi64(s, 1);
            float sw = _cvtsh_ss(d[n * (nb / 8) + b / 8]) * (float)sc[n * nb + b];
            g->sw[b * NR + r] = sw; g->beta[b * NR + r] = 128.f * sw * (float)wsum;
            g->mw[b * NR + r] = _cvtsh_ss(dmin[n * (nb / 8) + b / 8]) * (float)mn[n * nb + b];
        }
}

// 32 activation rows (groups gi, gi + 1) by 4 weight rows over all K: out[r][32 lanes]
#define R4(X) X(0) X(1) X(2) X(3)
static inline void micro4(const xq_t* x, int gi, const wg_t* g, int r0, int K, int b0, int b1,
                          int mins, float* out) {
    int nb = K / 32, kq = K / 4;
    #define DECL(r) __m512 a##r = _mm512_loadu_ps(out + (r0 + r) * 32), c##r = _mm512_loadu_ps(out + (r0 + r) * 32 + 16); \
        const int32_t* w##r = (const int32_t*)g->w8 + (size_t)(r0 + r) * kq;
    R4(DECL)
    const uint8_t* xa = x->q + (size_t)gi * kq * 64, *xb = xa + (size_t)kq * 64;
    for (int b = b0; b < b1; b++) {
        #define ZERO(r) __m512i s##r = _mm512_setzero_si512(), t##r = _mm512_setzero_si512();
        R4(ZERO)
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i u = _mm512_load_si512(xa + (size_t)(b * 8 + j) * 64);
            __m512i v = _mm512_load_si512(xb + (size_t)(b * 8 + j) * 64);
            #define DOT(r) { __m512i w = _mm512_set1_epi32(w##r[b * 8 + j]); \
                s##r = _mm512_dpbusd_epi32(s##r, u, w); t##r = _mm512_dpbusd_epi32(t##r, v, w); }
            R4(DOT)
        }
        const float* dp = x->d + ((size_t)gi * nb + b) * 16, *cp = x->c + ((size_t)gi * nb + b) * 16;
        __m512 dx = _mm512_load_ps(dp), dy = _mm512_load_ps(dp + nb * 16);
        const float *sw = g->sw + b * NR + r0, *be = g->beta + b * NR + r0, *mw = g->mw + b * NR + r0;
        #define FL(r) { __m512 S = _mm512_set1_ps(sw[r]), B = _mm512_set1_ps(be[r]); \
            a##r = _mm512_fnmadd_ps(dx, B, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s##r), _mm512_mul_ps(dx, S), a##r)); \
            c##r = _mm512_fnmadd_ps(dy, B, _mm512_fmadd_ps(_mm512_cvtepi32_ps(t##r), _mm512_mul_ps(dy, S), c##r)); \
            if (mins) { __m512 Mn = _mm512_set1_ps(mw[r]); \
                a##r = _mm512_fnmadd_ps(_mm512_load_ps(cp), Mn, a##r); \
                c##r = _mm512_fnmadd_ps(_mm512_load_ps(cp + nb * 16), Mn, c##r); } }
        R4(FL)
    }
    #define ST(r) _mm512_storeu_ps(out + (r0 + r) * 32, a##r); _mm512_storeu_ps(out + (r0 + r) * 32 + 16, c##r);
    R4(ST)
}

// out[m][n], M x N, f32; fmt 0: q4_0, 1: q4_k. Returns 0, or -1 where N is not a multiple of NR
// or K not one of 32 (q4_k: 256)
int st_int8_rows(int fmt, const float* x, int M, int N, int K, const uint8_t* qs, const uint16_t* d,
                  const uint8_t* sc, const uint16_t* dmin, const uint8_t* mn, float* outp) {
    if (N % NR || K % (fmt ? 256 : 32) || M < 1)
        return -1;
    xq_t xq = quantize_rows(x, M, K);
    #pragma omp parallel
    {
        wg_t g; int nb = K / 32;
        g.w8 = aligned_alloc(64, (size_t)NR * K); g.sw = malloc(nb * NR * 4); g.beta = malloc(nb * NR * 4); g.mw = malloc(nb * NR * 4);
        float tile[NR * 32];
        #pragma omp for schedule(static)
        for (int n0 = 0; n0 < N; n0 += NR) {
            if (fmt == 0) unpack_q4_0(&g, qs, d, n0, K); else unpack_q4_k(&g, qs, d, sc, dmin, mn, n0, K);
            for (int gi = 0; gi < xq.m16; gi += 2) {
                memset(tile, 0, sizeof tile);
                for (int b0 = 0; b0 < nb; b0 += KCHUNK / 32) {    // the pair's rows of a chunk stay in L1
                    int b1 = b0 + KCHUNK / 32 < nb ? b0 + KCHUNK / 32 : nb;
                    micro4(&xq, gi, &g, 0, K, b0, b1, fmt == 1, tile);
                    micro4(&xq, gi, &g, 4, K, b0, b1, fmt == 1, tile);
                }
                for (int r = 0; r < NR; r++)
                    for (int l = 0; l < 32 && gi * 16 + l < M; l++)
                        outp[(size_t)(gi * 16 + l) * N + n0 + r] = tile[r * 32 + l];
            }
        }
        free(g.w8); free(g.sw); free(g.beta); free(g.mw);
    }
    free(xq.q); free(xq.d); free(xq.c);
    return 0;
}

