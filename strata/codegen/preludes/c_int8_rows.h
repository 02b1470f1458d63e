#if ST_VNNI
// What both halves below share: ST_IR weight rows a group; the activations as int8 blocks of 32
// with the rows as vector lanes, ST_XG rows a vector (m16: how many such groups, even: a micro-
// kernel takes two), each block's d and c = d * sum(q) per ST_XG rows.
#define ST_IR 8
#define ST_XG (ST_VNNI == 512 ? 16 : 8)
typedef struct { uint8_t* q; float* d; float* c; long m16, nb; } st_xr8;
static st_xr8 st_xr8_new(long M, long K) {
    st_xr8 v = {0, 0, 0, (M + 2 * ST_XG - 1) / (2 * ST_XG) * 2, K / 32};
    v.q = st_scratch(v.m16 * K * ST_XG);
    v.d = st_scratch(v.m16 * v.nb * ST_XG * sizeof(float));
    v.c = st_scratch(v.m16 * v.nb * ST_XG * sizeof(float));
    return v;
}
static void st_xr8_free(st_xr8 v) { free(v.q); free(v.d); free(v.c); }
static inline float st_s16(uint16_t h, int bf) { return bf ? st_s1_bf16(h) : st_s1_f16(h); }  // c_qdot.h's
#endif
#if ST_VNNI == 512
// QuantRows (kernel_ir/cpu_ir.py, tile/passes/cpu_int8_rows.py): a group of ST_IR weight rows of a
// block-quantized weight times M activation rows on vpdpbusd, the activation rows as its lanes
// (codegen/c_int8_rows.py; python -m strata.bench.quant_prefill measures it).
// Activations: u8 (q + 128) blocks of 32 laid out 16 rows x 4 bytes per step of 4 K, with each
// block's d and c = d * sum(q) per 16 rows; d is NaN for a block holding a NaN or an infinity,
// so that row's sums are NaN (as eager's would be, or infinite), never finite garbage. Weights: the group's rows unpacked to s8 with, per
// sub-block (32 weights; q6_k 16), sw (the scale), beta = 128 * sw * sum(s8) and mw (q4_k's
// minimum): w = sw * s8 - mw, so a sub-block adds sw * dx * dot - dx * beta - cx * mw.
#define ST_XR8(X, T, LOAD) \
static st_xr8 st_quantize_rows_##X(const T* x, long M, long K) { \
    st_xr8 v = st_xr8_new(M, K); \
    _Pragma("omp parallel for num_threads(ST_TEAM) schedule(static)") \
    for (long m = 0; m < v.m16 * 16; m++) { \
        long g = m / 16, l = m % 16; \
        for (long b = 0; b < v.nb; b++) { \
            __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps(); \
            if (m < M) { \
                float t[32]; \
                for (int j = 0; j < 32; j++) t[j] = LOAD(x[m * K + b * 32 + j]); \
                f0 = _mm512_loadu_ps(t); f1 = _mm512_loadu_ps(t + 16); } \
            float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(f0), _mm512_abs_ps(f1))); \
            __m512 nf = _mm512_sub_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f0, f1));  /* NaN: not finite */ \
            float d = mx / 127.0f + _mm512_reduce_add_ps(nf), id = d > 0.0f ? 1.0f / d : 0.0f; \
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(f0, _mm512_set1_ps(id))); \
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(f1, _mm512_set1_ps(id))); \
            int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)); \
            __m128i b0 = _mm512_cvtepi32_epi8(_mm512_add_epi32(q0, _mm512_set1_epi32(128))); \
            __m128i b1 = _mm512_cvtepi32_epi8(_mm512_add_epi32(q1, _mm512_set1_epi32(128))); \
            int32_t w[8]; \
            _mm_storeu_si128((__m128i*)w, b0); _mm_storeu_si128((__m128i*)(w + 4), b1); \
            for (int j = 0; j < 8; j++) \
                __builtin_memcpy(v.q + ((g * (K / 4) + b * 8 + j) * 16 + l) * 4, &w[j], 4); \
            v.d[(g * v.nb + b) * 16 + l] = d; \
            v.c[(g * v.nb + b) * 16 + l] = d * (float)sum; \
        } \
    } \
    return v; }
ST_XR8(f32, float, ST_ID)
ST_XR8(bf16, uint16_t, st_bf16_to_float)
// the group's weights: w8[r][k], and per sub-block s the floats sw, beta, mw at [r][s] (ns a row)
typedef struct { int8_t* w8; float *sw, *beta, *mw; long ns; } st_wr8;
static inline int st_sum_s8(__m128i v) {                    // the 16 signed bytes' sum
    __m128i s = _mm_sad_epu8(_mm_xor_si128(v, _mm_set1_epi8((char)0x80)), _mm_setzero_si128());
    return (int)(_mm_extract_epi64(s, 0) + _mm_extract_epi64(s, 1)) - 16 * 128;
}
static inline void st_wr8_put(st_wr8* g, long s, int r, float sw, int wsum, float mw) {
    long i = r * g->ns + s;
    g->sw[i] = sw; g->beta[i] = 128.0f * sw * (float)wsum; g->mw[i] = mw;
}
// q4_0 / q4_k nibbles (Q4_0's order: low nibbles weights 0..15, high 16..31); q4_k's d and dmin
// one per 8 blocks. Strides between the group's rows, in elements of each part.
static void st_unpack_q4(st_wr8* g, long K, int bf, int kq, const unsigned char* qs, long qs_r, const uint16_t* d,
        long d_r, const unsigned char* sc, long sc_r, const uint16_t* dmin, long dmin_r,
        const unsigned char* mn, long mn_r) {
    long nb = K / 32;
    g->ns = nb;
    const __m512i m = _mm512_set1_epi8(15), off = _mm512_set1_epi8(kq ? 0 : 8);
    const __m512i lohi0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), lohi1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (int r = 0; r < ST_IR; r++) {        // 4 blocks a step: nibbles to bytes, each block's sum
        long b = 0;
        int wsum[4];
        for (; b + 4 <= nb; b += 4) {
            __m512i raw = _mm512_loadu_si512(qs + r * qs_r + b * 16);
            __m512i lo = _mm512_and_si512(raw, m), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m);
            __m512i su = _mm512_add_epi64(_mm512_sad_epu8(lo, _mm512_setzero_si512()), _mm512_sad_epu8(hi, _mm512_setzero_si512()));
            su = _mm512_add_epi64(su, _mm512_shuffle_epi32(su, (_MM_PERM_ENUM)0x4E));
            int64_t t[8];
            _mm512_storeu_si512(t, su);
            lo = _mm512_sub_epi8(lo, off); hi = _mm512_sub_epi8(hi, off);
            _mm512_storeu_si512(g->w8 + r * K + b * 32, _mm512_permutex2var_epi64(lo, lohi0, hi));
            _mm512_storeu_si512(g->w8 + r * K + b * 32 + 64, _mm512_permutex2var_epi64(lo, lohi1, hi));
            for (int j = 0; j < 4; j++) wsum[j] = (int)t[2 * j] - (kq ? 0 : 256);
            for (int j = 0; j < 4; j++) {
                float sw = kq ? st_s16(d[r * d_r + (b + j) / 8], bf) * (float)sc[r * sc_r + b + j] : st_s16(d[r * d_r + b + j], bf);
                float mw = kq ? st_s16(dmin[r * dmin_r + (b + j) / 8], bf) * (float)mn[r * mn_r + b + j] : 0.0f;
                st_wr8_put(g, b + j, r, sw, wsum[j], mw);
            }
        }
        for (; b < nb; b++) {
            __m128i raw = _mm_loadu_si128((const __m128i*)(qs + r * qs_r + b * 16)), m = _mm_set1_epi8(15);
            __m128i lo = _mm_and_si128(raw, m), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
            if (!kq) { lo = _mm_sub_epi8(lo, _mm_set1_epi8(8)); hi = _mm_sub_epi8(hi, _mm_set1_epi8(8)); }
            _mm_storeu_si128((__m128i*)(g->w8 + r * K + b * 32), lo);
            _mm_storeu_si128((__m128i*)(g->w8 + r * K + b * 32 + 16), hi);
            float sw = kq ? st_s16(d[r * d_r + b / 8], bf) * (float)sc[r * sc_r + b] : st_s16(d[r * d_r + b], bf);
            float mw = kq ? st_s16(dmin[r * dmin_r + b / 8], bf) * (float)mn[r * mn_r + b] : 0.0f;
            st_wr8_put(g, b, r, sw, st_sum_s8(lo) + st_sum_s8(hi), mw);
        }
    }
}
static void st_unpack_q8_0(st_wr8* g, long K, int bf, const signed char* qs, long qs_r, const uint16_t* d, long d_r) {
    g->ns = K / 32;
    for (int r = 0; r < ST_IR; r++)
        for (long b = 0; b < K / 32; b++) {
            __m128i lo = _mm_loadu_si128((const __m128i*)(qs + r * qs_r + b * 32));
            __m128i hi = _mm_loadu_si128((const __m128i*)(qs + r * qs_r + b * 32 + 16));
            _mm_storeu_si128((__m128i*)(g->w8 + r * K + b * 32), lo);
            _mm_storeu_si128((__m128i*)(g->w8 + r * K + b * 32 + 16), hi);
            st_wr8_put(g, b, r, st_s16(d[r * d_r + b], bf), st_sum_s8(lo) + st_sum_s8(hi), 0.0f);
        }
}
// q5_k: q4_k's scales and minimums, a block's 32 q (0..31) from its 20 bytes (c_qdot.h's
// st_q5_k_32), two blocks a step (K is whole super-blocks), their sums from one vpsadbw
static void st_unpack_q5_k(st_wr8* g, long K, int bf, const unsigned char* qs, long qs_r, const uint16_t* d,
        long d_r, const unsigned char* sc, long sc_r, const uint16_t* dmin, long dmin_r,
        const unsigned char* mn, long mn_r) {
    long nb = K / 32;
    g->ns = nb;
    for (int r = 0; r < ST_IR; r++)
        for (long b = 0; b < nb; b += 2) {
            __m512i w = st_w2_q5_k(qs + r * qs_r + b * 20);
            _mm512_storeu_si512(g->w8 + r * K + b * 32, w);
            int64_t t[8];
            _mm512_storeu_si512(t, _mm512_sad_epu8(w, _mm512_setzero_si512()));
            for (int j = 0; j < 2; j++)
                st_wr8_put(g, b + j, r, st_s16(d[r * d_r + (b + j) / 8], bf) * (float)sc[r * sc_r + b + j],
                           (int)(t[4 * j] + t[4 * j + 1] + t[4 * j + 2] + t[4 * j + 3]),
                           st_s16(dmin[r * dmin_r + (b + j) / 8], bf) * (float)mn[r * mn_r + b + j]);
        }
}
// q6_k: sub-blocks of 16 in 12 bytes (q - 32), a scale d * sc each, d per 16: four sub-blocks a
// step (c_qdot.h's st_q6_k_64u: 48 bytes to 64 q), each one's sum from vpsadbw on the q
static void st_unpack_q6_k(st_wr8* g, long K, int bf, const unsigned char* qs, long qs_r, const uint16_t* d,
                           long d_r, const signed char* sc, long sc_r) {
    long ns = K / 16;
    g->ns = ns;
    for (int r = 0; r < ST_IR; r++) {
        long s = 0;
        for (; s + 4 <= ns; s += 4) {
            __m512i q = st_q6_k_64u(qs + r * qs_r + s * 12);
            __m512i su = _mm512_sad_epu8(q, _mm512_setzero_si512());     // 2 qwords a sub-block
            su = _mm512_add_epi64(su, _mm512_shuffle_epi32(su, (_MM_PERM_ENUM)0x4E));
            int64_t t[8];
            _mm512_storeu_si512(t, su);
            _mm512_storeu_si512(g->w8 + r * K + s * 16, _mm512_sub_epi8(q, _mm512_set1_epi8(32)));
            for (int j = 0; j < 4; j++)
                st_wr8_put(g, s + j, r, st_s16(d[r * d_r + (s + j) / 16], bf) * (float)sc[r * sc_r + s + j],
                           (int)t[2 * j] - 32 * 16, 0.0f);
        }
        for (; s < ns; s++) {
            __m128i w = st_q6_k_16(qs + r * qs_r + s * 12);
            _mm_storeu_si128((__m128i*)(g->w8 + r * K + s * 16), w);
            st_wr8_put(g, s, r, st_s16(d[r * d_r + s / 16], bf) * (float)sc[r * sc_r + s], st_sum_s8(w), 0.0f);
        }
    }
}
// 32 activation rows (row groups gi, gi + 1) by the group's 8 weight rows, sub-blocks b0..b1 of
// SUB weights, added to out[r][32 lanes]: 16 int32 sums in registers, two activation loads and 8
// broadcasts per 16 vpdpbusd; per sub-block a sum's float part is (cvt * sw - beta) * dx, two
// FMAs (Zen 5: 1.04x-1.05x the 4-row kernel with mul + FMA + FNMA)
#define ST_R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ST_DP8(r) { __m512i wv = _mm512_set1_epi32(w[(r) * kq + q]); \
    s##r = _mm512_dpbusd_epi32(s##r, u, wv); t##r = _mm512_dpbusd_epi32(t##r, v, wv); }
#define ST_FL8(r) { __m512 S = _mm512_set1_ps(sw[(r) * ns]), B = _mm512_set1_ps(be[(r) * ns]); \
    __m512 A = _mm512_load_ps(out + (r) * 32), C = _mm512_load_ps(out + (r) * 32 + 16); \
    A = _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(s##r), S, B), dx, A); \
    C = _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(t##r), S, B), dy, C); \
    if (mins) { __m512 Mn = _mm512_set1_ps(mw[(r) * ns]); \
        A = _mm512_fnmadd_ps(_mm512_load_ps(cp), Mn, A); \
        C = _mm512_fnmadd_ps(_mm512_load_ps(cp + nb * 16), Mn, C); } \
    _mm512_store_ps(out + (r) * 32, A); _mm512_store_ps(out + (r) * 32 + 16, C); }
#define ST_IR_MICRO(NAME, SUB) \
static inline void NAME(const st_xr8* x, long gi, const st_wr8* g, long K, long b0, long b1, int mins, \
                        float* out) { \
    const long nb = K / 32, kq = K / 4, ns = g->ns; \
    const int32_t* w = (const int32_t*)g->w8; \
    const uint8_t *xa = x->q + gi * kq * 64, *xb = xa + kq * 64; \
    for (long s = b0; s < b1; s++) { \
        __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0; \
        __m512i t0 = s0, t1 = s0, t2 = s0, t3 = s0, t4 = s0, t5 = s0, t6 = s0, t7 = s0; \
        _Pragma("GCC unroll 8") \
        for (int j = 0; j < (SUB) / 4; j++) { \
            long q = s * ((SUB) / 4) + j; \
            __m512i u = _mm512_load_si512(xa + q * 64), v = _mm512_load_si512(xb + q * 64); \
            ST_R8(ST_DP8) \
        } \
        long xb32 = s * (SUB) / 32; \
        const float* dp = x->d + (gi * nb + xb32) * 16, *cp = x->c + (gi * nb + xb32) * 16; \
        __m512 dx = _mm512_load_ps(dp), dy = _mm512_load_ps(dp + nb * 16); \
        const float *sw = g->sw + s, *be = g->beta + s, *mw = g->mw + s; \
        ST_R8(ST_FL8) \
    } }
ST_IR_MICRO(st_ir_micro32, 32)
ST_IR_MICRO(st_ir_micro16, 16)
// The group's ST_IR rows by all M activation rows: out[m * ldo + r] (unpacked weights in g)
static void st_int8_rows_run(const st_xr8* x, st_wr8* g, long M, long K, int sub, int mins, float* out, long ldo) {
    float tile[ST_IR * 32] __attribute__((aligned(64)));
    long ns = K / sub;
    for (long gi = 0; gi < x->m16; gi += 2) {
        memset(tile, 0, sizeof tile);
        if (sub == 32) st_ir_micro32(x, gi, g, K, 0, ns, mins, tile);
        else st_ir_micro16(x, gi, g, K, 0, ns, mins, tile);
        for (long l = 0; l < 32 && gi * 16 + l < M; l++)
            for (int r = 0; r < ST_IR; r++)
                out[(gi * 16 + l) * ldo + r] = tile[r * 32 + l];
    }
}
static st_wr8 st_wr8_new(long K) {
    st_wr8 g = {st_scratch(ST_IR * K + 64), st_scratch(K / 16 * ST_IR * sizeof(float)),
                st_scratch(K / 16 * ST_IR * sizeof(float)), st_scratch(K / 16 * ST_IR * sizeof(float)), 0};
    return g;
}
static void st_wr8_free(st_wr8 g) { free(g.w8); free(g.sw); free(g.beta); free(g.mw); }
#endif
#if ST_VNNI == 256
// The same QuantRows on AVX2 without VNNI (Zen 3, Haswell): vpmaddubsw + vpmaddwd, 8 activation
// rows a ymm. Activations: s8 blocks of 32 laid out 8 rows x 4 bytes per step of 4 K, each block's
// d and c = d * sum(q) per 8 rows (d NaN for a block holding a NaN or an infinity). Weights: Q4_0
// and Q4_K nibbles unsigned (0..15; Q5_K's q 0..31), what their offset (8 * sw) or minimum takes off a block being
// beta * c; Q8_0 and Q6_K (q - 32) signed, multiplied as |x| by w with x's sign (vpsignb; |x| once
// a step for the 4 rows: Q8_0 1.13x over |w| per row), beta 0.
// vpmaddubsw's pairs stay in 16 bits: 2 x 15 x 127, 2 x 127 x 127 at most.
#define ST_XR8(X, T, LOAD) \
static st_xr8 st_quantize_rows_##X(const T* x, long M, long K) { \
    st_xr8 v = st_xr8_new(M, K); \
    _Pragma("omp parallel for num_threads(ST_TEAM) schedule(static)") \
    for (long m = 0; m < v.m16 * 8; m++) { \
        long g = m / 8, l = m % 8; \
        for (long b = 0; b < v.nb; b++) { \
            float f[32], mx; \
            uint32_t mb = 0; \
            for (int j = 0; j < 32; j++) { \
                f[j] = m < M ? LOAD(x[m * K + b * 32 + j]) : 0.0f; \
                uint32_t a; __builtin_memcpy(&a, &f[j], 4); \
                a &= 0x7fffffffu; mb = a > mb ? a : mb; } \
            __builtin_memcpy(&mx, &mb, 4); \
            float d = mb >= 0x7f800000u ? __builtin_nanf("") : mx / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f; \
            int8_t q[32]; \
            int sum = 0; \
            for (int j = 0; j < 32; j++) { \
                float y = f[j] * id; \
                int t = y == y ? (int)nearbyintf(y) : 0; \
                q[j] = (int8_t)t; sum += t; } \
            for (int j = 0; j < 8; j++) \
                __builtin_memcpy(v.q + ((g * (K / 4) + b * 8 + j) * 8 + l) * 4, q + 4 * j, 4); \
            v.d[(g * v.nb + b) * 8 + l] = d; \
            v.c[(g * v.nb + b) * 8 + l] = d * (float)sum; \
        } \
    } \
    return v; }
ST_XR8(f32, float, ST_ID)
ST_XR8(bf16, uint16_t, st_bf16_to_float)
// the group's weights w8[r][k] (unsigned, or signed where sgn), per sub-block sw and beta at [r][s]
typedef struct { uint8_t* w8; float *sw, *beta; long ns; int sgn, wide; } st_wr8;   // wide: q 0..31
static void st_unpack_q4(st_wr8* g, long K, int bf, int kq, const unsigned char* qs, long qs_r, const uint16_t* d,
        long d_r, const unsigned char* sc, long sc_r, const uint16_t* dmin, long dmin_r,
        const unsigned char* mn, long mn_r) {
    long nb = K / 32;
    g->ns = nb, g->sgn = 0, g->wide = 0;
    const __m128i m = _mm_set1_epi8(15);
    for (int r = 0; r < ST_IR; r++)
        for (long b = 0; b < nb; b++) {
            __m128i raw = _mm_loadu_si128((const __m128i*)(qs + r * qs_r + b * 16));
            _mm_storeu_si128((__m128i*)(g->w8 + r * K + b * 32), _mm_and_si128(raw, m));
            _mm_storeu_si128((__m128i*)(g->w8 + r * K + b * 32 + 16), _mm_and_si128(_mm_srli_epi16(raw, 4), m));
            float sw = kq ? st_s16(d[r * d_r + b / 8], bf) * (float)sc[r * sc_r + b] : st_s16(d[r * d_r + b], bf);
            g->sw[r * nb + b] = sw;
            g->beta[r * nb + b] = kq ? st_s16(dmin[r * dmin_r + b / 8], bf) * (float)mn[r * mn_r + b] : 8.0f * sw;
        }
}
static void st_unpack_q5_k(st_wr8* g, long K, int bf, const unsigned char* qs, long qs_r, const uint16_t* d,
        long d_r, const unsigned char* sc, long sc_r, const uint16_t* dmin, long dmin_r,
        const unsigned char* mn, long mn_r) {     // q 0..31 unsigned (c_qdot.h's st_q5_k_32)
    long nb = K / 32;
    g->ns = nb, g->sgn = 0, g->wide = 1;
    for (int r = 0; r < ST_IR; r++)
        for (long b = 0; b < nb; b++) {
            _mm256_storeu_si256((__m256i*)(g->w8 + r * K + b * 32), st_q5_k_32(qs + r * qs_r + b * 20));
            g->sw[r * nb + b] = st_s16(d[r * d_r + b / 8], bf) * (float)sc[r * sc_r + b];
            g->beta[r * nb + b] = st_s16(dmin[r * dmin_r + b / 8], bf) * (float)mn[r * mn_r + b];
        }
}
static void st_unpack_q8_0(st_wr8* g, long K, int bf, const signed char* qs, long qs_r, const uint16_t* d, long d_r) {
    g->ns = K / 32, g->sgn = 1, g->wide = 0;
    for (int r = 0; r < ST_IR; r++)
        for (long b = 0; b < K / 32; b++) {
            __builtin_memcpy(g->w8 + r * K + b * 32, qs + r * qs_r + b * 32, 32);
            g->sw[r * g->ns + b] = st_s16(d[r * d_r + b], bf);
            g->beta[r * g->ns + b] = 0.0f;
        }
}
static void st_unpack_q6_k(st_wr8* g, long K, int bf, const unsigned char* qs, long qs_r, const uint16_t* d,
                           long d_r, const signed char* sc, long sc_r) {
    g->ns = K / 16, g->sgn = 1, g->wide = 0;
    for (int r = 0; r < ST_IR; r++)
        for (long s = 0; s < K / 16; s++) {
            _mm_storeu_si128((__m128i*)(g->w8 + r * K + s * 16), st_q6_k_16(qs + r * qs_r + s * 12));
            g->sw[r * g->ns + s] = st_s16(d[r * d_r + s / 16], bf) * (float)sc[r * sc_r + s];
            g->beta[r * g->ns + s] = 0.0f;
        }
}
// 16 activation rows (row groups gi, gi + 1) by 4 weight rows (r0..r0 + 3), sub-blocks b0..b1 of
// SUB weights, added to out[r][16 lanes]. vpmaddubsw's int16 pairs are summed RUN steps of 4 K
// in int16 before one vpmaddwd widens them: Q4's nibbles 8 steps (8 x 2 x 15 x 127 = 30480),
// Q6_K's |q - 32| <= 32 and Q5_K's q <= 31 their 4 (4 x 2 x 32 x 127 = 32512), Q8_0's bytes 1; the
// steps unrolled whole. An empty asm after each sum keeps gcc from reassociating the unrolled sums
// into a tree of temporaries, which spilled the 16 ymm registers (112 spills in Q8_0's kernel),
// and signed formats (beta 0) skip beta's FMA. 128 x 2048 x 5632, one process, interleaved, Zen 3
// (2026-12-03), bit-identical: Q4_0 / Q4_K 1.24x, Q5_K 1.25x, Q6_K 1.16x, Q8_0 1.11x
#define ST_A2_R4(X) X(0) X(1) X(2) X(3)
#define ST_A2_DP(r) { __m256i wv = _mm256_set1_epi32(w##r[q]); \
    if (sgn) { \
        h##r = _mm256_add_epi16(h##r, _mm256_maddubs_epi16(ua, _mm256_sign_epi8(wv, u))); \
        g##r = _mm256_add_epi16(g##r, _mm256_maddubs_epi16(va, _mm256_sign_epi8(wv, v))); \
    } else { \
        h##r = _mm256_add_epi16(h##r, _mm256_maddubs_epi16(wv, u)); \
        g##r = _mm256_add_epi16(g##r, _mm256_maddubs_epi16(wv, v)); } \
    __asm__("" : "+x"(h##r), "+x"(g##r)); }
#define ST_A2_WIDEN(r) s##r = _mm256_add_epi32(s##r, _mm256_madd_epi16(h##r, one)); \
    t##r = _mm256_add_epi32(t##r, _mm256_madd_epi16(g##r, one)); __asm__("" : "+x"(s##r), "+x"(t##r));
#define ST_A2_FL(r) { __m256 S = _mm256_set1_ps(sw[(r) * ns]); float* o = out + (r0 + (r)) * 16; \
    __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s##r), S), dx, _mm256_load_ps(o)); \
    __m256 b = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(t##r), S), dy, _mm256_load_ps(o + 8)); \
    if (!sgn) { __m256 B = _mm256_set1_ps(be[(r) * ns]); \
        a = _mm256_fnmadd_ps(B, cx, a), b = _mm256_fnmadd_ps(B, cy, b); } \
    _mm256_store_ps(o, a), _mm256_store_ps(o + 8, b); }
#define ST_A2_MICRO(NAME, SUB, SGN, RUN) \
static inline void NAME(const st_xr8* x, long gi, const st_wr8* g, int r0, long K, long b0, long b1, \
                        float* out) { \
    const long nb = K / 32, kq = K / 4, ns = g->ns; \
    const int32_t *w0 = (const int32_t*)g->w8 + (r0 + 0) * kq, *w1 = (const int32_t*)g->w8 + (r0 + 1) * kq; \
    const int32_t *w2 = (const int32_t*)g->w8 + (r0 + 2) * kq, *w3 = (const int32_t*)g->w8 + (r0 + 3) * kq; \
    const uint8_t *xa = x->q + gi * kq * 32, *xb = xa + kq * 32; \
    const __m256i one = _mm256_set1_epi16(1); \
    const int sgn = (SGN); \
    for (long s = b0; s < b1; s++) { \
        __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0; \
        _Pragma("GCC unroll 8") \
        for (int j0 = 0; j0 < (SUB) / 4; j0 += (RUN)) { \
            __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0, g0 = h0, g1 = h0, g2 = h0, g3 = h0; \
            _Pragma("GCC unroll 8") \
            for (int j = j0; j < j0 + (RUN); j++) { \
                long q = s * ((SUB) / 4) + j; \
                __m256i u = _mm256_loadu_si256((const __m256i*)(xa + q * 32)); \
                __m256i v = _mm256_loadu_si256((const __m256i*)(xb + q * 32)); \
                __m256i ua = sgn ? _mm256_abs_epi8(u) : u, va = sgn ? _mm256_abs_epi8(v) : v; (void)ua, (void)va; \
                ST_A2_R4(ST_A2_DP) \
            } \
            ST_A2_R4(ST_A2_WIDEN) \
        } \
        long xb32 = s * (SUB) / 32; \
        const float *dp = x->d + (gi * nb + xb32) * 8, *cp = x->c + (gi * nb + xb32) * 8; \
        __m256 dx = _mm256_loadu_ps(dp), dy = _mm256_loadu_ps(dp + nb * 8); \
        __m256 cx = _mm256_loadu_ps(cp), cy = _mm256_loadu_ps(cp + nb * 8); \
        const float *sw = g->sw + r0 * ns + s, *be = g->beta + r0 * ns + s; \
        ST_A2_R4(ST_A2_FL) \
    } }
ST_A2_MICRO(st_ir2_u32, 32, 0, 8)
ST_A2_MICRO(st_ir2_u32_wide, 32, 0, 4)
ST_A2_MICRO(st_ir2_s32, 32, 1, 1)
ST_A2_MICRO(st_ir2_s16, 16, 1, 4)
// Unsigned weights (Q4_0, Q4_K, Q5_K): 32 activation rows (groups gi..gi + 3) by 2 weight rows,
// 18 vector instructions a step of 4 K where 16 x 4 takes 20 (2 broadcasts, not 4, for 8
// vpmaddubsw): 1.10x-1.17x on a Q4_K group, bit-identical (Zen 3, 2026-12-03). Signed weights
// stay 16 x 4: their |x| for 4 vectors would not fit the 16 registers.
#define ST_A4_DP(r) { __m256i wv = _mm256_set1_epi32(w##r[q]); \
    h##r[0] = _mm256_add_epi16(h##r[0], _mm256_maddubs_epi16(wv, u0)); \
    h##r[1] = _mm256_add_epi16(h##r[1], _mm256_maddubs_epi16(wv, u1)); \
    h##r[2] = _mm256_add_epi16(h##r[2], _mm256_maddubs_epi16(wv, u2)); \
    h##r[3] = _mm256_add_epi16(h##r[3], _mm256_maddubs_epi16(wv, u3)); \
    __asm__("" : "+x"(h##r[0]), "+x"(h##r[1]), "+x"(h##r[2]), "+x"(h##r[3])); }
#define ST_A4_MICRO(NAME, RUN) \
static inline void NAME(const st_xr8* x, long gi, const st_wr8* g, int r0, long K, long b0, long b1, \
                        float* out) { \
    const long nb = K / 32, kq = K / 4, ns = g->ns; \
    const int32_t *w0 = (const int32_t*)g->w8 + r0 * kq, *w1 = w0 + kq; \
    const uint8_t* xa = x->q + gi * kq * 32; \
    const __m256i one = _mm256_set1_epi16(1); \
    for (long s = b0; s < b1; s++) { \
        __m256i s0[4], s1[4]; \
        for (int c = 0; c < 4; c++) s0[c] = s1[c] = _mm256_setzero_si256(); \
        _Pragma("GCC unroll 8") \
        for (int j0 = 0; j0 < 8; j0 += (RUN)) { \
            __m256i h0[4], h1[4]; \
            for (int c = 0; c < 4; c++) h0[c] = h1[c] = _mm256_setzero_si256(); \
            _Pragma("GCC unroll 8") \
            for (int j = j0; j < j0 + (RUN); j++) { \
                long q = s * 8 + j; \
                __m256i u0 = _mm256_loadu_si256((const __m256i*)(xa + q * 32)); \
                __m256i u1 = _mm256_loadu_si256((const __m256i*)(xa + (kq + q) * 32)); \
                __m256i u2 = _mm256_loadu_si256((const __m256i*)(xa + (2 * kq + q) * 32)); \
                __m256i u3 = _mm256_loadu_si256((const __m256i*)(xa + (3 * kq + q) * 32)); \
                ST_A4_DP(0) ST_A4_DP(1) \
            } \
            for (int c = 0; c < 4; c++) { \
                s0[c] = _mm256_add_epi32(s0[c], _mm256_madd_epi16(h0[c], one)); \
                s1[c] = _mm256_add_epi32(s1[c], _mm256_madd_epi16(h1[c], one)); } \
        } \
        const float *dp = x->d + (gi * nb + s) * 8, *cp = x->c + (gi * nb + s) * 8; \
        for (int r = 0; r < 2; r++) { \
            __m256 S = _mm256_set1_ps(g->sw[(r0 + r) * ns + s]), B = _mm256_set1_ps(g->beta[(r0 + r) * ns + s]); \
            float* o = out + (r0 + r) * 32; \
            for (int c = 0; c < 4; c++) { \
                __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(r ? s1[c] : s0[c]), S), \
                                           _mm256_loadu_ps(dp + c * nb * 8), _mm256_load_ps(o + 8 * c)); \
                _mm256_store_ps(o + 8 * c, _mm256_fnmadd_ps(B, _mm256_loadu_ps(cp + c * nb * 8), a)); } \
        } \
    } }
ST_A4_MICRO(st_ir4_u32, 8)
ST_A4_MICRO(st_ir4_u32_wide, 4)
// The group's ST_IR rows by all M activation rows: out[m * ldo + r] (unpacked weights in g).
// K a step: 512 for 16 rows, 256 for 32, so that their activations (8 KB) stay in L1.
static void st_int8_rows_run(const st_xr8* x, st_wr8* g, long M, long K, int sub, int mins, float* out, long ldo) {
    float tile[ST_IR * 32] __attribute__((aligned(32)));
    long ns = K / sub;
    (void)mins;                                    // (q4_k's minimums are in beta here)
    for (long gi = 0; gi < x->m16; ) {
        int wide = sub == 32 && !g->sgn && gi + 4 <= x->m16, rows = wide ? 32 : 16;
        long chunk = (wide ? 256 : 512) / sub;
        memset(tile, 0, sizeof tile);
        for (long b0 = 0; b0 < ns; b0 += chunk) {
            long b1 = b0 + chunk < ns ? b0 + chunk : ns;
            if (wide)
                for (int r0 = 0; r0 < ST_IR; r0 += 2) {
                    if (g->wide) st_ir4_u32_wide(x, gi, g, r0, K, b0, b1, tile);
                    else st_ir4_u32(x, gi, g, r0, K, b0, b1, tile);
                }
            else
                for (int r0 = 0; r0 < ST_IR; r0 += 4) {
                    if (sub == 16) st_ir2_s16(x, gi, g, r0, K, b0, b1, tile);
                    else if (g->sgn) st_ir2_s32(x, gi, g, r0, K, b0, b1, tile);
                    else if (g->wide) st_ir2_u32_wide(x, gi, g, r0, K, b0, b1, tile);
                    else st_ir2_u32(x, gi, g, r0, K, b0, b1, tile);
                }
        }
        for (long l = 0; l < rows && gi * 8 + l < M; l++)
            for (int r = 0; r < ST_IR; r++)
                out[(gi * 8 + l) * ldo + r] = tile[r * rows + l];
        gi += rows / 8;
    }
}
static st_wr8 st_wr8_new(long K) {
    st_wr8 g = {st_scratch(ST_IR * K + 64), st_scratch(K / 16 * ST_IR * sizeof(float)),
                st_scratch(K / 16 * ST_IR * sizeof(float)), 0, 0, 0};
    return g;
}
static void st_wr8_free(st_wr8 g) { free(g.w8); free(g.sw); free(g.beta); }
#endif
