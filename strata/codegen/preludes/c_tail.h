// CUDA's rsqrt, correctly rounded twice (as the simulator computes it).
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// Integers (the operands' usual arithmetic conversions pick the type).
static inline int st_maxi(int a, int b) { return a > b ? a : b; }
static inline int st_mini(int a, int b) { return a < b ? a : b; }
static inline int st_absi(int a) { return a < 0 ? -a : a; }
static inline long st_maxl(long a, long b) { return a > b ? a : b; }
static inline long st_minl(long a, long b) { return a < b ? a : b; }
static inline long st_absl(long a) { return a < 0 ? -a : a; }
static inline long long st_maxll(long long a, long long b) { return a > b ? a : b; }
static inline long long st_minll(long long a, long long b) { return a < b ? a : b; }
static inline long long st_absll(long long a) { return a < 0 ? -a : a; }
// C has no overloading: the names the templates call dispatch on the operands' type.
#define st_max(a, b) _Generic((a) + (b), float: st_maxf, default: st_maxd)(a, b)
#define st_min(a, b) _Generic((a) + (b), float: st_minf, default: st_mind)(a, b)
#define st_sign(x) _Generic((x), float: st_signf, default: st_signd)(x)
#define st_fmod(a, b) _Generic((a) + (b), float: st_fmodf, default: st_fmodd)(a, b)
#define max(a, b) _Generic((a) + (b), long: st_maxl, long long: st_maxll, default: st_maxi)(a, b)
#define min(a, b) _Generic((a) + (b), long: st_minl, long long: st_minll, default: st_mini)(a, b)
#define abs(x) _Generic((x) + 0, long: st_absl, long long: st_absll, default: st_absi)(x)

// bf16 and f16 are stored as uint16_t; values are float in registers.
static inline uint32_t st_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float st_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
// The exp op on floats (codegen/c.py), branch-free so that loops vectorise it inline: libmvec's
// expf falls back to scalar libm for a whole vector when one lane leaves its fast range (a
// causal mask's exp(-inf) made the masked softmax 6x slower); sigmoid, whose inputs are
// activations, keeps libmvec's expf (faster where no lane leaves that range).
// exp(x) = 2^n p(r): n = round(x / ln 2) by adding 1.5 * 2^23 (its bits then hold n: no
// rounding or conversion instruction), clamped as an integer to -150 (subnormal results) .. 128
// (overflow to inf) where the two factors of 2^n stay exact; r = x - n ln 2 in two parts (Cody
// and Waite), p Cephes' degree-6 polynomial in fused multiply-adds; below -104 it is 0 without
// the slow subnormal arithmetic, and a NaN runs through. One float compare in all: float clamps
// became masked compare chains in gcc's vectorised loops (21 -> 16 cycles per 16 lanes, mca).
// Within 1.5 ulp (tests/runtime/test_native.py).
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define st_fma(a, b, c) fmaf(a, b, c)
#else
#define st_fma(a, b, c) ((a) * (b) + (c))       // fmaf without the instruction is a slow call
#endif
static inline float st_expf(float x) {
    float t = x * 1.44269504088896341f + 12582912.0f;      // two roundings (-ffp-contract=off)
    int32_t k = (int32_t)(st_bits(t) - 0x4B400000u);
    k = k < -150 ? -150 : k > 128 ? 128 : k;                // vpmaxsd, vpminsd
    float n = (float)k;
    float r = st_fma(n, 2.12194440e-4f, st_fma(n, -0.693359375f, x));
    float p = st_fma(st_fma(st_fma(st_fma(st_fma(1.9875691500e-4f, r, 1.3981999507e-3f), r,
                                           8.3334519073e-3f), r, 4.1665795894e-2f), r,
                             1.6666665459e-1f), r, 5.0000001201e-1f);
    int32_t k1 = k >> 1;
    float y = st_fma(p, r * r, r + 1.0f) * st_float((uint32_t)(k1 + 127) << 23)
              * st_float((uint32_t)(k - k1 + 127) << 23);
    return x < -104.0f ? 0.0f : y;
}
// The exp_shifted op (a softmax's exp(x - max), x <= 0): st_expf without the clamps and the
// second factor, since 2^n with n >= -126 is one normal float; below -87.33 (2^-126) it is 0
// rather than subnormal, a NaN runs through. 3% of causal attention at 2048 tokens (Zen 3).
static inline float st_expf_shifted(float x) {
    float t = x * 1.44269504088896341f + 12582912.0f;
    int32_t k = (int32_t)(st_bits(t) - 0x4B400000u);
    float n = (float)k;
    float r = st_fma(n, 2.12194440e-4f, st_fma(n, -0.693359375f, x));
    float p = st_fma(st_fma(st_fma(st_fma(st_fma(1.9875691500e-4f, r, 1.3981999507e-3f), r,
                                           8.3334519073e-3f), r, 4.1665795894e-2f), r,
                             1.6666665459e-1f), r, 5.0000001201e-1f);
    float y = st_fma(p, r * r, r + 1.0f) * st_float((uint32_t)(k + 127) << 23);
    return x < -87.33f ? 0.0f : y;
}
// The lanes of a sum over a short row (c.py's laned_sum), added as a tree: 4 or 5 dependent
// adds where gcc's `reduction(+:acc)` adds its lanes one after another.
static inline float st_lane_sum16(float* p) {
    for (int i = 0; i < 8; i++)
        p[i] += p[i + 8];
    for (int i = 0; i < 4; i++)
        p[i] += p[i + 4];
    return (p[0] + p[2]) + (p[1] + p[3]);
}
static inline float st_lane_sum32(float* p) {
    for (int i = 0; i < 16; i++)
        p[i] += p[i + 16];
    return st_lane_sum16(p);
}
static inline float st_bf16_to_float(uint16_t h) { return st_float((uint32_t)h << 16); }
static inline uint16_t st_float_to_bf16(float f) {
    uint32_t u = st_bits(f);
    return f != f ? (uint16_t)0x7FC0 : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float st_f16_to_float(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7FFFu) << 13;               // exponent and mantissa, in place
    uint32_t e = em & 0x0F800000u;
    float normal = st_float(em + ((uint32_t)(127 - 15) << 23));
    float sub = st_float(em + ((uint32_t)(127 - 15 + 1) << 23)) - st_float(113u << 23);
    float special = st_float(em + ((uint32_t)(255 - 31) << 23));  // inf, NaN
    float mag = e == 0 ? sub : (e == 0x0F800000u ? special : normal);
    return st_float(st_bits(mag) | ((uint32_t)(h & 0x8000u) << 16));
}
static inline uint16_t st_float_to_f16(float f) {
    uint32_t u = st_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    // subnormal or zero: adding 0.5 aligns the 10 mantissa bits at the bottom (the FPU rounds)
    uint32_t sub = st_bits(st_float(a) + 0.5f) - st_bits(0.5f);
    uint32_t normal = (a + ((uint32_t)(15 - 127) << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    uint32_t special = a > 0x7F800000u ? (0x7E00u | ((a >> 13) & 0x3FFu)) : 0x7C00u;
    uint32_t h = a >= 0x47800000u ? special : (a < 0x38800000u ? sub : normal);
    return (uint16_t)(h | sign);
}

// Atomic read-modify-write (@strata.kernel's st.atomic_*): compare-and-swap loops, any type.
#define ST_ATOMIC(name, T, expr) \
static inline void name(T* p, T v) { \
    T old, new_; \
    __atomic_load(p, &old, __ATOMIC_RELAXED); \
    do { new_ = (expr); } while (!__atomic_compare_exchange(p, &old, &new_, 0, \
                                 __ATOMIC_RELAXED, __ATOMIC_RELAXED)); \
}
ST_ATOMIC(st_atomic_add_float, float, old + v)
ST_ATOMIC(st_atomic_max_float, float, v > old ? v : old)
ST_ATOMIC(st_atomic_min_float, float, v < old ? v : old)
ST_ATOMIC(st_atomic_add_int32, int32_t, old + v)
ST_ATOMIC(st_atomic_max_int32, int32_t, v > old ? v : old)
ST_ATOMIC(st_atomic_min_int32, int32_t, v < old ? v : old)
ST_ATOMIC(st_atomic_add_int64, int64_t, old + v)
ST_ATOMIC(st_atomic_max_int64, int64_t, v > old ? v : old)
ST_ATOMIC(st_atomic_min_int64, int64_t, v < old ? v : old)

// The team a parallel kernel runs on: what the runtime set before the call (runtime/threads.py:
// the cores other processes leave free), else OpenMP's default (OMP_NUM_THREADS, every core).
// A clause, not omp_set_num_threads: torch's wheel shares this libgomp and its thread count.
static int strata_team = 0;
void strata_set_team(int n) { strata_team = n; }
#define ST_TEAM (strata_team > 0 ? strata_team : omp_get_max_threads())
int strata_num_threads(void) {
#ifdef _OPENMP
    return ST_TEAM;
#else
    return 1;
#endif
}
