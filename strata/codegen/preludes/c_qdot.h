
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// One block of 32 quantized weights by 32 activations (float or bf16), scaled by the block's
// scale d and added to acc (codegen/c_qdot.py): bytes widened to int32 lanes and converted,
// multiplied, summed. st_q8_0_<x>, st_q4_0_<x> for x = f32, bf16; 16 lanes (AVX-512) or 8 (AVX2).
#include <immintrin.h>
static inline float st_f16_scale(uint16_t h) { return _cvtsh_ss(h); }    // F16C (AVX2 CPUs have it)
// q6_k: a block of 16 weights in 12 bytes (quant/kquants.py: 8 bytes of low nibbles, weights j
// and j + 8; 4 of high 2 bits, weights j + 4s at bits 2s of byte 8 + j) as its 16 q in 0..63,
// bytes; the weights are q - 32 (st_q6_k_16)
static inline __m128i st_q6_k_16u(const unsigned char* q) {
    int h;
    __builtin_memcpy(&h, q + 8, 4);
    __m128i lo = _mm_loadl_epi64((const __m128i*)q);
    __m128i nib = _mm_and_si128(_mm_unpacklo_epi64(lo, _mm_srli_epi16(lo, 4)), _mm_set1_epi8(15));
    __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(h), _mm_setr_epi32(0, 2, 4, 6)),
                               _mm_set1_epi8(3));
    return _mm_or_si128(nib, _mm_slli_epi16(hi, 4));
}
static inline __m128i st_q6_k_16(const unsigned char* q) {
    return _mm_sub_epi8(st_q6_k_16u(q), _mm_set1_epi8(32));
}
static inline int st_q6_k_at(const unsigned char* q, int j) {      // weight j, as an int
    return (((q[j & 7] >> (j & 8 ? 4 : 0)) & 15) | (((q[8 + (j & 3)] >> (2 * (j >> 2))) & 3) << 4)) - 32;
}
// q5_k: a block of 32 weights in 20 bytes (quant/kquants.py: Q4_0's 16 bytes of nibbles, then
// weight j's fifth bit at bit j / 4 of byte 16 + j % 4) as its 32 q in 0..31, bytes in weight
// order: the 4-byte word broadcast, byte lane j masked by 1 << j / 4, compared, 16 where set
static inline __m256i st_q5_k_32(const unsigned char* q) {
    int h;
    __builtin_memcpy(&h, q + 16, 4);
    __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)q));
    __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(15));
    const __m256i bit = _mm256_set_epi64x((long long)0x8080808040404040ull, 0x2020202010101010ll,
                                          0x0808080804040404ll, 0x0202020201010101ll);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_set1_epi32(h), bit), bit);
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)));
}
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
// q4_k: a nibble n is d * n - m, the block's sixteen weights computed once and looked up
static inline __m512 st_q4_k_values(float d, float m) {
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d), _mm512_set_ps(
        15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)), _mm512_set1_ps(m));
}
static inline __m512 st_q6f(const unsigned char* q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(st_q6_k_16(q)));
}
#define ST_Q6_K_BODY(X) __m512 s = _mm512_mul_ps(st_q6f(q), st_xv_##X(x));      // 16 weights
// q5_k: q in 0..31 is d * q - m, the block's 32 weights computed once and looked up by vpermt2ps
#define ST_Q5_K_W \
    const __m512 lo16 = st_q4_k_values(d, m), hi16 = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d), \
        _mm512_set_ps(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16)), _mm512_set1_ps(m)); \
    __m256i q32 = st_q5_k_32(q); \
    __m512 w0 = _mm512_permutex2var_ps(lo16, _mm512_cvtepu8_epi32(_mm256_castsi256_si128(q32)), hi16); \
    __m512 w1 = _mm512_permutex2var_ps(lo16, _mm512_cvtepu8_epi32(_mm256_extracti128_si256(q32, 1)), hi16);
#define ST_Q5_K_BODY(X) \
    ST_Q5_K_W \
    acc = _mm512_fmadd_ps(w0, st_xv_##X(x), acc); \
    acc = _mm512_fmadd_ps(w1, st_xv_##X(x + 16), acc);
#define ST_Q4_K_BODY(X) \
    const __m512 values = st_q4_k_values(d, m); \
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q)); \
    acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(b, values), st_xv_##X(x), acc); \
    acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), values), st_xv_##X(x + 16), acc);
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
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), values), _mm512_set1_ps(d))); } \
static inline void st_q4_k_to_##X(T* o, const unsigned char* q, float d, float m) { \
    const __m512 values = st_q4_k_values(d, m); \
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)q)); \
    st_qstore_##X(o, _mm512_permutexvar_ps(b, values), \
                  _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), values)); } \
static inline void st_q5_k_to_##X(T* o, const unsigned char* q, float d, float m) { \
    ST_Q5_K_W st_qstore_##X(o, w0, w1); }
static inline void st_q6_k_to_f32(float* o, const unsigned char* q, float d) {
    _mm512_storeu_ps(o, _mm512_mul_ps(st_q6f(q), _mm512_set1_ps(d)));
}
static inline void st_q6_k_to_bf16(uint16_t* o, const unsigned char* q, float d) {
    _mm256_storeu_si256((__m256i*)o, st_bf16_rne(_mm512_mul_ps(st_q6f(q), _mm512_set1_ps(d))));
}
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
// q4_k: a nibble n is d * n - m (n in 0..15)
static inline __m256 st_q4_k_w(__m256i n, float d, float m) {
    return _mm256_fmsub_ps(_mm256_cvtepi32_ps(n), _mm256_set1_ps(d), _mm256_set1_ps(m));
}
#define ST_Q4_K_NIBBLES \
    __m128i raw = _mm_loadu_si128((const __m128i*)q); \
    __m256i b0 = _mm256_cvtepu8_epi32(raw), b1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8)); \
    __m256i lo = _mm256_set1_epi32(15); \
    __m256 w0 = st_q4_k_w(_mm256_and_si256(b0, lo), d, m), w1 = st_q4_k_w(_mm256_and_si256(b1, lo), d, m); \
    __m256 w2 = st_q4_k_w(_mm256_srli_epi32(b0, 4), d, m), w3 = st_q4_k_w(_mm256_srli_epi32(b1, 4), d, m);
static inline __m256 st_q6f(__m128i w) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w)); }
#define ST_Q6_K_BODY(X) \
    __m128i w = st_q6_k_16(q); \
    __m256 s = _mm256_fmadd_ps(st_q6f(_mm_srli_si128(w, 8)), st_xv_##X(x + 8), \
                               _mm256_mul_ps(st_q6f(w), st_xv_##X(x)));
#define ST_Q5_K_W \
    __m256i q32 = st_q5_k_32(q); \
    __m128i ql = _mm256_castsi256_si128(q32), qh = _mm256_extracti128_si256(q32, 1); \
    __m256 w0 = st_q4_k_w(_mm256_cvtepu8_epi32(ql), d, m), w1 = st_q4_k_w(_mm256_cvtepu8_epi32(_mm_srli_si128(ql, 8)), d, m); \
    __m256 w2 = st_q4_k_w(_mm256_cvtepu8_epi32(qh), d, m), w3 = st_q4_k_w(_mm256_cvtepu8_epi32(_mm_srli_si128(qh, 8)), d, m);
#define ST_QK_FMA4(X) \
    acc = _mm256_fmadd_ps(w0, st_xv_##X(x), acc); \
    acc = _mm256_fmadd_ps(w1, st_xv_##X(x + 8), acc); \
    acc = _mm256_fmadd_ps(w2, st_xv_##X(x + 16), acc); \
    acc = _mm256_fmadd_ps(w3, st_xv_##X(x + 24), acc);
#define ST_Q5_K_BODY(X) ST_Q5_K_W ST_QK_FMA4(X)
#define ST_Q4_K_BODY(X) ST_Q4_K_NIBBLES ST_QK_FMA4(X)
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
                  _mm256_mul_ps(st_nib(_mm256_srli_epi32(b1, 4)), s)); } \
static inline void st_q4_k_to_##X(T* o, const unsigned char* q, float d, float m) { \
    ST_Q4_K_NIBBLES st_qstore_##X(o, w0, w1, w2, w3); } \
static inline void st_q5_k_to_##X(T* o, const unsigned char* q, float d, float m) { \
    ST_Q5_K_W st_qstore_##X(o, w0, w1, w2, w3); }
static inline void st_q6_k_to_f32(float* o, const unsigned char* q, float d) {
    __m128i w = st_q6_k_16(q);
    _mm256_storeu_ps(o, _mm256_mul_ps(st_q6f(w), _mm256_set1_ps(d)));
    _mm256_storeu_ps(o + 8, _mm256_mul_ps(st_q6f(_mm_srli_si128(w, 8)), _mm256_set1_ps(d)));
}
static inline void st_q6_k_to_bf16(uint16_t* o, const unsigned char* q, float d) {
    __m128i w = st_q6_k_16(q);              // all 16 (a 128-bit store kept 8: the rest unset)
    _mm256_storeu_si256((__m256i*)o, _mm256_permute4x64_epi64(_mm256_packus_epi32(
        st_bf16_rne(_mm256_mul_ps(st_q6f(w), _mm256_set1_ps(d))),
        st_bf16_rne(_mm256_mul_ps(st_q6f(_mm_srli_si128(w, 8)), _mm256_set1_ps(d)))), 0xD8));
}
ST_QSTORES(f32, float)
ST_QSTORES(bf16, uint16_t)
#endif
#define ST_QBLOCKS(X, T) \
static inline st_qv st_q8_0_##X(st_qv acc, const signed char* q, const T* x, float d) { \
    ST_Q8_0_BODY(X) return st_qfma(s, d, acc); } \
static inline st_qv st_q4_0_##X(st_qv acc, const unsigned char* q, const T* x, float d) { \
    ST_Q4_0_BODY(X) return st_qfma(s, d, acc); } \
static inline st_qv st_q4_k_##X(st_qv acc, const unsigned char* q, const T* x, float d, float m) { \
    ST_Q4_K_BODY(X) return acc; } \
static inline st_qv st_q5_k_##X(st_qv acc, const unsigned char* q, const T* x, float d, float m) { \
    ST_Q5_K_BODY(X) return acc; } \
static inline st_qv st_q6_k_##X(st_qv acc, const unsigned char* q, const T* x, float d) { \
    ST_Q6_K_BODY(X) return st_qfma(s, d, acc); }
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
// A row's step prefetches its bytes ST_QAHEAD on, a line per 64 consumed (into the next rows at
// a row's end). Far enough ahead to cover a DRAM miss at the rate a step consumes: on Zen 5
// (2026-11-30, two programs differing only here, interleaved) 8192 bytes made the decode step
// 1.14x-1.21x faster than 1024 for Q4_K_M, 1.27x for Q4_0, 1.04x for Q8_0, and 1.02x-1.06x faster
// than 4096. Not a burst of the next rows at a row's start: on the Zen 4 that (4096 bytes on)
// made the Q4_K_M step 7 to 9% slower (its Q6_K rows are 5632 bytes: 88 prefetches at once)
#define ST_QAHEAD 8192
#define ST_QFETCH(P, N) \
    for (int st_l = 0; st_l < (N); st_l += 64) __builtin_prefetch((const char*)(P) + ST_QAHEAD + st_l, 0, 3)
// QDOT=vnni: activations as int8 blocks of 32, each with its scale d and c = d * sum(q). max|x| is
// the max of the bits with the sign cleared: a NaN or an infinity has the largest, so d is NaN for
// a block holding one (its row's sum NaN, not finite garbage), and the unsigned max vectorizes
// (0.44 us a 2048-wide row on Zen 5; 1.3 us for a float compare, 6 us for libm's fmaxf)
typedef struct { int8_t* q; float* d; float* c; int8_t* q4; } st_xq8;
// q4: the same bytes in Q4_0's nibble order: each aligned group of ST_Q4G blocks (4 on AVX-512,
// 2 on AVX2) as its ST_Q4G x 16 activations of the low nibbles (a block's weights 0..15), then
// its ST_Q4G x 16 of the high (16..31), so that one load of the group's nibbles (64 or 32 bytes)
// needs no shuffle (ST_VNNI16_Q4, ST_I8x8_Q4)
#define ST_Q4G (ST_VNNI == 512 ? 4 : 2)
static int8_t* st_q4_order(const int8_t* q, long n) {
    int8_t* o = st_scratch(n + 64);
    for (long g = 0; g + ST_Q4G * 32 <= n; g += ST_Q4G * 32)
        for (int k = 0; k < ST_Q4G; k++) {
            __builtin_memcpy(o + g + k * 16, q + g + k * 32, 16);
            __builtin_memcpy(o + g + ST_Q4G * 16 + k * 16, q + g + k * 32 + 16, 16);
        }
    return o;
}
#define ST_XQ8(X, T, LOAD) \
static st_xq8 st_quantize_##X(const T* x, long n) { \
    st_xq8 v = {st_scratch(n + 64), st_scratch((n / 32 + 16) * sizeof(float)), \
                st_scratch((n / 32 + 16) * sizeof(float))}; \
    for (long b = 0; b < n / 32; b++) { \
        float m, f[32]; \
        uint32_t mb = 0; \
        for (int j = 0; j < 32; j++) { \
            f[j] = LOAD(x[b * 32 + j]); \
            uint32_t a; __builtin_memcpy(&a, &f[j], 4); \
            a &= 0x7fffffffu; mb = a > mb ? a : mb; } \
        __builtin_memcpy(&m, &mb, 4); \
        float d = mb >= 0x7f800000u ? __builtin_nanf("") : m / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f; \
        int sum = 0; \
        for (int j = 0; j < 32; j++) { int q = (int)nearbyintf(f[j] * id); v.q[b * 32 + j] = (int8_t)q; sum += q; } \
        v.d[b] = d; v.c[b] = d * (float)sum; \
    } \
    v.q4 = st_q4_order(v.q, n); \
    return v; }
#define ST_ID(v) (v)
ST_XQ8(f32, float, ST_ID)
ST_XQ8(bf16, uint16_t, st_bf16_to_float)
static void st_xq8_free(st_xq8 v) { free(v.q); free(v.d); free(v.c); free(v.q4); }
static inline __m256i st_w1_q4_0(const unsigned char* q) {     // (see st_w2_q4_0): the 16
    __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)q));  // bytes in
    return _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_set_epi64x(4, 4, 0, 0)),  // both halves
                            _mm256_set1_epi8(15));       // (AVX2 rows 1.13x the two-half insert)
}
static inline float st_s1_f16(uint16_t d) { return _cvtsh_ss(d); }
static inline float st_s1_bf16(uint16_t d) { return st_bf16_to_float(d); }
// q6_k's blocks past its last whole super-block, one at a time, summed into `rest`
#define ST_Q6K_TAIL(S) \
    float rest = 0.0f; \
    for (; b < nb; b++) { \
        int dot = 0; \
        for (int j = 0; j < 16; j++) dot += st_q6_k_at(q + b * 12, j) * xq[b * 16 + j]; \
        rest += st_s1_##S(d[b / 16]) * (float)sc[b] * x->d[xb + b / 2] * (float)dot; \
    }
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
// 16 blocks (b .. b + 15) by their activations: pairs of blocks a vpdpbusd, each pair's int32
// sums scaled by the pair's two entries of s16 (d_w * d_x), into acc0 and acc1
#define ST_VNNI16(W2, NBYTES) \
    for (int p = 0; p < 16; p += 4) { \
        __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W2(q + (b + p) * (NBYTES)), \
                                     _mm512_loadu_si512(x->q + (xb + b + p) * 32)); \
        __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W2(q + (b + p + 2) * (NBYTES)), \
                                     _mm512_loadu_si512(x->q + (xb + b + p + 2) * 32)); \
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), \
                               _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(p)), s16), acc0); \
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), \
                               _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(p + 2)), s16), acc1); \
    }
// 16 blocks of nibbles (b .. b + 15) by their activations in nibble order (st_xq8.q4): 4 blocks'
// 64 bytes a load, its low and its high nibbles a vpdpbusd each, 4 int32 lanes a block, scaled
// by s16 (d_w * d_x). Against ST_VNNI16's two-block shuffle, 11 instructions per 4 blocks
// instead of 26: Zen 4 runs a 512-bit instruction a cycle a pipe pair, and the Q4 rows waited
// on them (47% of the bandwidth limit, as llama.cpp's). The groups of 4 start at a multiple of 4
// blocks of the activations; a row that does not (xb) takes ST_VNNI16.
#define ST_VNNI16_Q4 \
    for (int p = 0; p < 16; p += 8) { \
        __m512i r0 = _mm512_loadu_si512(q + (b + p) * 16), r1 = _mm512_loadu_si512(q + (b + p + 4) * 16); \
        const int8_t *x0 = x->q4 + (xb + b + p) * 32, *x1 = x0 + 128; \
        __m512i d0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), \
            _mm512_and_si512(r0, lo4), _mm512_loadu_si512(x0)), \
            _mm512_and_si512(_mm512_srli_epi16(r0, 4), lo4), _mm512_loadu_si512(x0 + 64)); \
        __m512i d1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), \
            _mm512_and_si512(r1, lo4), _mm512_loadu_si512(x1)), \
            _mm512_and_si512(_mm512_srli_epi16(r1, 4), lo4), _mm512_loadu_si512(x1 + 64)); \
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), \
                               _mm512_permutexvar_ps(_mm512_add_epi32(quad, _mm512_set1_epi32(p)), s16), acc0); \
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), \
                               _mm512_permutexvar_ps(_mm512_add_epi32(quad, _mm512_set1_epi32(p + 4)), s16), acc1); \
    }
#define ST_Q4_STEP16 if (xb & 3) { ST_VNNI16(st_w2_q4_0, 16) } else { ST_VNNI16_Q4 }
#define ST_Q8_STEP16 ST_VNNI16(st_w2_q8_0, 32)
#define ST_QVNNI(F, T, NBYTES, OFFSET, S, STEP) \
static inline __m512 st_##F##_vnni_##S(const T* q, const uint16_t* d, const st_xq8* x, long xb, long nb) { \
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), off = _mm512_setzero_ps(); \
    const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); \
    const __m512i quad = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0); \
    const __m512i lo4 = _mm512_set1_epi8(15); (void)quad, (void)lo4; \
    long b = 0; \
    for (; b + 16 <= nb; b += 16) { \
        ST_QFETCH(q + b * (NBYTES), 16 * (NBYTES)); \
        __m512 dw = st_s16_##S(d + b); \
        off = _mm512_fmadd_ps(dw, _mm512_loadu_ps(x->c + xb + b), off); \
        __m512 s16 = _mm512_mul_ps(dw, _mm512_loadu_ps(x->d + xb + b)); \
        STEP \
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
ST_QVNNI(q4_0, unsigned char, 16, 8.0f, f16, ST_Q4_STEP16)
ST_QVNNI(q8_0, signed char, 32, 128.0f, f16, ST_Q8_STEP16)
ST_QVNNI(q4_0, unsigned char, 16, 8.0f, bf16, ST_Q4_STEP16)
ST_QVNNI(q8_0, signed char, 32, 128.0f, bf16, ST_Q8_STEP16)
// q4_k (Q4_0's nibbles, a scale d * sc and a minimum dmin * mn a block, d and dmin one per 8
// blocks): two super-blocks a step, their 16 scales and minimums made at once; the minimums
// times the activations' block sums are the offset taken off. q5_k the same, its 32 q from 20
// bytes a block (st_q5_k_32), two blocks a vpdpbusd
static inline __m512 st_two_s1(float a, float b) {
    return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}
static inline __m512 st_u8x16(const unsigned char* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline __m512i st_w2_q5_k(const unsigned char* q) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(st_q5_k_32(q)), st_q5_k_32(q + 20), 1);
}
#define ST_Q5_STEP16 ST_VNNI16(st_w2_q5_k, 20)
#define ST_QK_VNNI(F, NBYTES, STEP, W1, S) \
static inline __m512 st_##F##_vnni_##S(const unsigned char* q, const uint16_t* d, const unsigned char* sc, \
        const uint16_t* dmin, const unsigned char* mn, const st_xq8* x, long xb, long nb) { \
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), off = _mm512_setzero_ps(); \
    const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); \
    const __m512i quad = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0); \
    const __m512i lo4 = _mm512_set1_epi8(15); (void)quad, (void)lo4; \
    long b = 0; \
    for (; b + 16 <= nb; b += 16) { \
        ST_QFETCH(q + b * (NBYTES), 16 * (NBYTES)); \
        __m512 dw = _mm512_mul_ps(st_two_s1(st_s1_##S(d[b / 8]), st_s1_##S(d[b / 8 + 1])), st_u8x16(sc + b)); \
        __m512 mw = _mm512_mul_ps(st_two_s1(st_s1_##S(dmin[b / 8]), st_s1_##S(dmin[b / 8 + 1])), st_u8x16(mn + b)); \
        off = _mm512_fmadd_ps(mw, _mm512_loadu_ps(x->c + xb + b), off); \
        __m512 s16 = _mm512_mul_ps(dw, _mm512_loadu_ps(x->d + xb + b)); \
        STEP \
    } \
    __m256 tail = _mm256_setzero_ps(); \
    float rest = 0.0f; \
    for (; b < nb; b++) { \
        float dw = st_s1_##S(d[b / 8]) * (float)sc[b]; \
        __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), W1(q + b * (NBYTES)), \
                                        _mm256_loadu_si256((const __m256i*)(x->q + (xb + b) * 32))); \
        tail = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * x->d[xb + b]), tail); \
        rest += st_s1_##S(dmin[b / 8]) * (float)mn[b] * x->c[xb + b]; \
    } \
    tail = _mm256_sub_ps(tail, _mm256_setr_ps(rest, 0, 0, 0, 0, 0, 0, 0)); \
    return _mm512_add_ps(_mm512_sub_ps(_mm512_add_ps(acc0, acc1), off), \
                         _mm512_insertf32x8(_mm512_setzero_ps(), tail, 0)); }
ST_QK_VNNI(q4_k, 16, ST_Q4_STEP16, st_w1_q4_0, f16)
ST_QK_VNNI(q4_k, 16, ST_Q4_STEP16, st_w1_q4_0, bf16)
ST_QK_VNNI(q5_k, 20, ST_Q5_STEP16, st_q5_k_32, f16)
ST_QK_VNNI(q5_k, 20, ST_Q5_STEP16, st_q5_k_32, bf16)
// q6_k (blocks of 16 weights q - 32, q in 0..63 in 12 bytes, a scale d * sc a block, d one per
// 16 blocks): 4 blocks (48 bytes) unpacked to 64 bytes q, a vpdpbusd of q by the activations
// less 32 times the activations' sums (a second vpdpbusd), each int32 lane scaled by its
// block's d * sc * d_x; a super-block a step
static inline __m512i st_q6_k_64u(const unsigned char* q) {
    __m512i v = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11),
                                         _mm512_maskz_loadu_epi8(0xFFFFFFFFFFFFull, q));   // a block a lane
    __m512i nib = _mm512_and_si512(_mm512_unpacklo_epi64(v, _mm512_srli_epi16(v, 4)), _mm512_set1_epi8(15));
    __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0xAA),
        _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6)), _mm512_set1_epi8(3));
    return _mm512_or_si512(nib, _mm512_slli_epi16(hi, 4));
}
#define ST_Q6K_VNNI(S) \
static inline __m512 st_q6_k_vnni_##S(const unsigned char* q, const uint16_t* d, const signed char* sc, \
        const st_xq8* x, long xb, long nb) { \
    const __m512i bias = _mm512_set1_epi8(32); \
    const __m512i four = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0); \
    const __m512i half = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0); \
    const int8_t* xq = x->q + xb * 32; \
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(); \
    long b = 0; \
    for (; b + 16 <= nb; b += 16) { \
        ST_QFETCH(q + b * 12, 192); \
        __m512 sw = _mm512_mul_ps(_mm512_set1_ps(st_s1_##S(d[b / 16])), \
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(sc + b))))); \
        __m512 s16 = _mm512_mul_ps(sw, _mm512_permutexvar_ps(half, \
            _mm512_castps256_ps512(_mm256_loadu_ps(x->d + xb + b / 2)))); \
        for (int p = 0; p < 16; p += 8) { \
            __m512i x0 = _mm512_loadu_si512(xq + (b + p) * 16), x1 = _mm512_loadu_si512(xq + (b + p + 4) * 16); \
            __m512i i0 = _mm512_sub_epi32( \
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), st_q6_k_64u(q + (b + p) * 12), x0), \
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, x0)); \
            __m512i i1 = _mm512_sub_epi32( \
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), st_q6_k_64u(q + (b + p + 4) * 12), x1), \
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, x1)); \
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), \
                _mm512_permutexvar_ps(_mm512_add_epi32(four, _mm512_set1_epi32(p)), s16), acc0); \
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), \
                _mm512_permutexvar_ps(_mm512_add_epi32(four, _mm512_set1_epi32(p + 4)), s16), acc1); \
        } \
    } \
    ST_Q6K_TAIL(S) \
    return _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_setr_ps(rest, 0, 0, 0, 0, 0, 0, 0, \
                                                                   0, 0, 0, 0, 0, 0, 0, 0)); }
ST_Q6K_VNNI(f16)
ST_Q6K_VNNI(bf16)
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
// 8 blocks (b .. b + 7) by their activations, one a vpmaddubsw, scaled by s8 (d_w * d_x)
#define ST_I8x8(DOT, NBYTES) \
    for (int p = 0; p < 8; p += 2) { \
        __m256i d0 = DOT(q + (b + p) * (NBYTES), x->q + (xb + b + p) * 32); \
        __m256i d1 = DOT(q + (b + p + 1) * (NBYTES), x->q + (xb + b + p + 1) * 32); \
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_permutevar8x32_ps(s8, _mm256_set1_epi32(p)), acc0); \
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_permutevar8x32_ps(s8, _mm256_set1_epi32(p + 1)), acc1); \
    }
// The same 8 blocks of nibbles (q4_0, q4_k) by their activations in nibble order (st_xq8.q4):
// two blocks' 32 bytes a load, the low nibbles (both blocks' weights 0..15) and the high ones a
// vpmaddubsw each, their int16 pairs added (2 x 2 x 15 x 127 at most), 4 int32 lanes a block:
// 13 instructions per 2 blocks instead of 18 (the rows were bound by instructions, at 27 GB/s in
// cache on the 2-core Zen 3). The pairs start at an even block of the activations; a row that
// does not (xb) takes ST_I8x8.
#define ST_I8x8_Q4 \
    for (int p = 0; p < 8; p += 4) { \
        const int8_t* xo = x->q4 + (xb + b + p) * 32; \
        __m256i r0 = _mm256_loadu_si256((const __m256i*)(q + (b + p) * 16)); \
        __m256i r1 = _mm256_loadu_si256((const __m256i*)(q + (b + p + 2) * 16)); \
        __m256i d0 = _mm256_madd_epi16(_mm256_add_epi16( \
            _mm256_maddubs_epi16(_mm256_and_si256(r0, lo4), _mm256_loadu_si256((const __m256i*)xo)), \
            _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r0, 4), lo4), \
                                 _mm256_loadu_si256((const __m256i*)(xo + 32)))), one); \
        __m256i d1 = _mm256_madd_epi16(_mm256_add_epi16( \
            _mm256_maddubs_epi16(_mm256_and_si256(r1, lo4), _mm256_loadu_si256((const __m256i*)(xo + 64))), \
            _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(r1, 4), lo4), \
                                 _mm256_loadu_si256((const __m256i*)(xo + 96)))), one); \
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), \
                               _mm256_permutevar8x32_ps(s8, _mm256_add_epi32(pair, _mm256_set1_epi32(p))), acc0); \
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), \
                               _mm256_permutevar8x32_ps(s8, _mm256_add_epi32(pair, _mm256_set1_epi32(p + 2))), acc1); \
    }
#define ST_I8_STEP_Q4(DOT, NBYTES) if (xb & 1) { ST_I8x8(DOT, NBYTES) } else { ST_I8x8_Q4 }
#define ST_I8_CONSTS \
    const __m256i pair = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), lo4 = _mm256_set1_epi8(15); \
    const __m256i one = _mm256_set1_epi16(1); (void)pair, (void)lo4, (void)one;
#define ST_QI8(F, T, NBYTES, OFFSET, S, STEP) \
static inline __m256 st_##F##_vnni_##S(const T* q, const uint16_t* d, const st_xq8* x, long xb, long nb) { \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), off = _mm256_setzero_ps(); \
    ST_I8_CONSTS \
    long b = 0; \
    for (; b + 8 <= nb; b += 8) { \
        ST_QFETCH(q + b * (NBYTES), 8 * (NBYTES)); \
        __m256 dw = st_s8_##S(d + b); \
        off = _mm256_fmadd_ps(dw, _mm256_loadu_ps(x->c + xb + b), off); \
        __m256 s8 = _mm256_mul_ps(dw, _mm256_loadu_ps(x->d + xb + b)); \
        STEP(st_i8dot_##F, NBYTES) \
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
ST_QI8(q4_0, unsigned char, 16, 8.0f, f16, ST_I8_STEP_Q4)
ST_QI8(q8_0, signed char, 32, 0.0f, f16, ST_I8x8)
ST_QI8(q4_0, unsigned char, 16, 8.0f, bf16, ST_I8_STEP_Q4)
ST_QI8(q8_0, signed char, 32, 0.0f, bf16, ST_I8x8)
// q4_k and q5_k (see the AVX-512 branch): a super-block of 8 blocks a step
static inline __m256i st_i8dot_q5_k(const unsigned char* q, const int8_t* x) {     // q 0..31
    return _mm256_madd_epi16(_mm256_maddubs_epi16(st_q5_k_32(q), _mm256_loadu_si256((const __m256i*)x)),
                             _mm256_set1_epi16(1));
}
static inline __m256 st_u8x8(const unsigned char* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
#define ST_QK_I8(F, NBYTES, DOT, S, STEP) \
static inline __m256 st_##F##_vnni_##S(const unsigned char* q, const uint16_t* d, const unsigned char* sc, \
        const uint16_t* dmin, const unsigned char* mn, const st_xq8* x, long xb, long nb) { \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), off = _mm256_setzero_ps(); \
    ST_I8_CONSTS \
    long b = 0; \
    for (; b + 8 <= nb; b += 8) { \
        ST_QFETCH(q + b * (NBYTES), 8 * (NBYTES)); \
        __m256 dw = _mm256_mul_ps(_mm256_set1_ps(st_s1_##S(d[b / 8])), st_u8x8(sc + b)); \
        __m256 mw = _mm256_mul_ps(_mm256_set1_ps(st_s1_##S(dmin[b / 8])), st_u8x8(mn + b)); \
        off = _mm256_fmadd_ps(mw, _mm256_loadu_ps(x->c + xb + b), off); \
        __m256 s8 = _mm256_mul_ps(dw, _mm256_loadu_ps(x->d + xb + b)); \
        STEP(DOT, NBYTES) \
    } \
    float rest = 0.0f; \
    for (; b < nb; b++) { \
        float dw = st_s1_##S(d[b / 8]) * (float)sc[b]; \
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(q + b * (NBYTES), x->q + (xb + b) * 32)), \
                               _mm256_set1_ps(dw * x->d[xb + b]), acc0); \
        rest += st_s1_##S(dmin[b / 8]) * (float)mn[b] * x->c[xb + b]; \
    } \
    return _mm256_sub_ps(_mm256_sub_ps(_mm256_add_ps(acc0, acc1), off), \
                         _mm256_setr_ps(rest, 0, 0, 0, 0, 0, 0, 0)); }
ST_QK_I8(q4_k, 16, st_i8dot_q4_0, f16, ST_I8_STEP_Q4)
ST_QK_I8(q4_k, 16, st_i8dot_q4_0, bf16, ST_I8_STEP_Q4)
ST_QK_I8(q5_k, 20, st_i8dot_q5_k, f16, ST_I8x8)
ST_QK_I8(q5_k, 20, st_i8dot_q5_k, bf16, ST_I8x8)
// q6_k (see the AVX-512 branch): two blocks of 16 (one activation block) a step, their 32 q
// (0..63) unpacked at once from bytes 0..15 and 8..23 in the two halves: the nibble runs shuffled
// to qwords [a, a | b, b] and shifted by 0 / 4, the high-bit words to dwords [ha x 4 | hb x 4]
// shifted by 0, 2, 4, 6. q by x less 32 x in int16 pairs, times the blocks' scales (sc as int16,
// a block's in its half) by vpmaddwd; one float FMA a step. A 32000-row lm_head, 2 threads,
// Zen 3: 4.4 ms -> 2.45 (one block at a time, 16 bytes unpacked from 12 twice, the scales
// converted to float per step; then 2.9 with lane-crossing permutes in place of the shuffles)
static inline __m256i st_q6_k_32u(const unsigned char* q) {       // blocks q and q + 12
    __m256i r = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)q)),
                                        _mm_loadu_si128((const __m128i*)(q + 8)), 1);
    __m256i lo = _mm256_shuffle_epi8(r, _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7,
                                                         4, 5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(lo, _mm256_setr_epi64x(0, 4, 0, 4)), _mm256_set1_epi8(15));
    __m256i h = _mm256_shuffle_epi8(r, _mm256_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11,
                                                        12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15));
    __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)),
                                  _mm256_set1_epi8(3));
    return _mm256_or_si256(nib, _mm256_slli_epi16(hi, 4));
}
static inline __m256i st_i8dot_q6_k(const unsigned char* q, const int8_t* x, __m256i sc) {
    __m256i v = _mm256_loadu_si256((const __m256i*)x);        // pairs <= 2 x 63 x 127: int16
    return _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(st_q6_k_32u(q), v),
                                              _mm256_maddubs_epi16(_mm256_set1_epi8(32), v)), sc);
}
// a super-block's 16 scales as int16, both halves holding scales 8h..8h + 7; `pick` + 4p takes
// blocks 2p, 2p + 1 of the 8 into the low and the high half
#define ST_Q6K_PAIR(C, P, ACC) \
    ACC = _mm256_fmadd_ps(_mm256_cvtepi32_ps(st_i8dot_q6_k(q + (b + 2 * (C)) * 12, xq + (b + 2 * (C)) * 16, \
              _mm256_shuffle_epi8(half, _mm256_add_epi8(pick, _mm256_set1_epi8(4 * (P)))))), \
              _mm256_permutevar8x32_ps(s8, _mm256_set1_epi32(C)), ACC);
#define ST_Q6K_I8(S) \
static inline __m256 st_q6_k_vnni_##S(const unsigned char* q, const uint16_t* d, const signed char* sc, \
        const st_xq8* x, long xb, long nb) { \
    const int8_t* xq = x->q + xb * 32; \
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, \
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3); \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(); \
    long b = 0; \
    for (; b + 16 <= nb; b += 16) { \
        ST_QFETCH(q + b * 12, 192); \
        __m256 s8 = _mm256_mul_ps(_mm256_set1_ps(st_s1_##S(d[b / 16])), _mm256_loadu_ps(x->d + xb + b / 2)); \
        __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(sc + b))); \
        __m256i half = _mm256_permute2x128_si256(s16, s16, 0x00); \
        ST_Q6K_PAIR(0, 0, acc0) ST_Q6K_PAIR(1, 1, acc1) ST_Q6K_PAIR(2, 2, acc0) ST_Q6K_PAIR(3, 3, acc1) \
        half = _mm256_permute2x128_si256(s16, s16, 0x11); \
        ST_Q6K_PAIR(4, 0, acc0) ST_Q6K_PAIR(5, 1, acc1) ST_Q6K_PAIR(6, 2, acc0) ST_Q6K_PAIR(7, 3, acc1) \
    } \
    ST_Q6K_TAIL(S) \
    return _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_setr_ps(rest, 0, 0, 0, 0, 0, 0, 0)); }
ST_Q6K_I8(f16)
ST_Q6K_I8(bf16)
#endif