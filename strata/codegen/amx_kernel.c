/* A bf16 GEMM micro-kernel on Intel AMX tiles, and the same kernel on emulated tiles.

Why: issue 26 item 3 (bf16 contractions on AMX tiles). This is the study a later AMX schedule is
built from: the tile configuration, the Linux permission request, B packed in the VNNI pair
layout, tdpbf16ps with an fp32 result, and a portable C emulation of the tile ops with the same
semantics, so that the one kernel below runs (and is tested) on every machine.

  C[M,N] (fp32, row stride ldc) = A[M,K] (bf16 bits, row stride lda) x B[K,N] (bf16), where B is
  given packed: Bp[k/2][n][2] = B[k][n], B[k+1][n] (for each pair of K rows, the two values of a
  column side by side). M, N multiples of 16, K a multiple of 32.

Blocking: a 2x2 block of 16x16 fp32 C tiles (tmm0-3) per step of 32 along K, two A tiles (tmm4-5,
16 rows x 32 bf16) and two B tiles (tmm6-7, 16 pair-rows x 16 columns x 2); a 16-wide edge of M
or N uses 1x2, 2x1 or 1x1 blocks. OpenMP threads split the 32-column blocks of N; each thread
configures its own tiles (the configuration is per thread).

Selected by a macro: STRATA_AMX_EMULATE defined -> tile registers are thread-local arrays and
the tile ops are C functions (any C11 compiler, any CPU); else the AMX intrinsics, under a
target("amx-tile,amx-bf16") attribute (the same as -mamx-tile -mamx-bf16 for these functions
only, so strata's usual flags build it). The kernel text is shared.

Emulated tdpbf16ps follows the SDM's operation section: per C row, two fp32 partial sums
(even and odd element of each pair) start at zero, take one FMA per pair of the instruction's
16, then C += (even + odd); RNE; bf16 input subnormals read as zero and subnormal results are
flushed to zero; MXCSR is not used.

gcc 12 pitfalls, handled here (see docs/amx-probe-2026-11-26.md):
  - its _tile_loadconfig is `asm volatile("ldtilecfg %X0" :: "m"(*(const void **)cfg))`: the
    asm declares a read of 8 bytes, so stores to the other 56 bytes of a config filled just
    before are dead to the optimiser and may be dropped (llama.cpp's AMX crash). We put an empty
    asm that reads all 64 bytes, with a memory clobber, in front of it. Without it gcc 12.2
    keeps only palette_id and bytes 1-32 of amx_configure's config, and ldtilecfg faults
    (SIGSEGV); tests/target/test_amx_kernel.py loads it in a child process to catch that.
  - its _tile_storeconfig declares an 8-byte write, so we follow it with an asm that declares
    the whole struct modified before anyone reads it.
  - its _tile_loadd is an asm with only register operands and no memory clobber: data a
    function writes and then tile-loads itself must be fenced (not needed below: A and B are the
    caller's).
*/
#define _GNU_SOURCE                   /* syscall() under -std=c11 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct __attribute__((aligned(64))) {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];     /* bytes per row of tile i */
    uint8_t rows[16];
} strata_tilecfg;
_Static_assert(sizeof(strata_tilecfg) == 64, "ldtilecfg reads 64 bytes");

#ifdef STRATA_AMX_EMULATE
#define AMX_TARGET
static _Thread_local struct { strata_tilecfg cfg; uint8_t t[8][16][64]; } emu;

static void emu_ldtilecfg(const strata_tilecfg *c) { emu.cfg = *c; memset(emu.t, 0, sizeof emu.t); }
static void emu_sttilecfg(strata_tilecfg *c) { *c = emu.cfg; }
static void emu_release(void) { memset(&emu, 0, sizeof emu); }
static void emu_zero(int t) { memset(emu.t[t], 0, sizeof emu.t[t]); }

static void emu_load(int t, const void *base, long stride) {
    emu_zero(t);
    for (int r = 0; r < emu.cfg.rows[t]; r++)
        memcpy(emu.t[t][r], (const char *)base + r * stride, emu.cfg.colsb[t]);
}

static void emu_store(int t, void *base, long stride) {
    for (int r = 0; r < emu.cfg.rows[t]; r++)
        memcpy((char *)base + r * stride, emu.t[t][r], emu.cfg.colsb[t]);
}

static float emu_bf16(const uint8_t *p) {            /* bf16 -> fp32, subnormal inputs as zero */
    uint16_t h;
    memcpy(&h, p, 2);
    if ((h & 0x7f80) == 0) h &= 0x8000;
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float emu_ftz(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

static void emu_dpbf16ps(int c, int a, int b) {
    int n_out = emu.cfg.colsb[c] / 4, pairs = emu.cfg.colsb[a] / 4;
    for (int m = 0; m < emu.cfg.rows[c]; m++) {
        float even[16] = {0}, odd[16] = {0}, acc;
        for (int k = 0; k < pairs; k++)
            for (int n = 0; n < n_out; n++) {
                even[n] = emu_ftz(fmaf(emu_bf16(&emu.t[a][m][4 * k]),
                                       emu_bf16(&emu.t[b][k][4 * n]), even[n]));
                odd[n] = emu_ftz(fmaf(emu_bf16(&emu.t[a][m][4 * k + 2]),
                                      emu_bf16(&emu.t[b][k][4 * n + 2]), odd[n]));
            }
        for (int n = 0; n < n_out; n++) {
            memcpy(&acc, &emu.t[c][m][4 * n], 4);
            acc = emu_ftz(acc + emu_ftz(even[n] + odd[n]));
            memcpy(&emu.t[c][m][4 * n], &acc, 4);
        }
    }
}

#define TILE_LOADCONFIG(cfg) emu_ldtilecfg(cfg)
#define TILE_STORECONFIG(cfg) emu_sttilecfg(cfg)
#define TILE_ZERO(t) emu_zero(t)
#define TILE_LOAD(t, base, stride) emu_load(t, base, stride)
#define TILE_STORE(t, base, stride) emu_store(t, base, stride)
#define TILE_DP(c, a, b) emu_dpbf16ps(c, a, b)
#define TILE_RELEASE() emu_release()
int strata_amx_emulated(void) { return 1; }
int strata_amx_request_permission(void) { return 0; }

#else
#include <errno.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static inline __attribute__((always_inline)) AMX_TARGET void
amx_ldtilecfg(const strata_tilecfg *c) {
    __asm__ volatile("" : : "m"(*c) : "memory");      /* all 64 bytes are stored by now */
    _tile_loadconfig(c);
}

static inline __attribute__((always_inline)) AMX_TARGET void amx_sttilecfg(strata_tilecfg *c) {
    _tile_storeconfig(c);
    __asm__ volatile("" : "+m"(*c) : : "memory");     /* all 64 bytes were written */
}

#define TILE_LOADCONFIG(cfg) amx_ldtilecfg(cfg)
#define TILE_STORECONFIG(cfg) amx_sttilecfg(cfg)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define TILE_RELEASE() _tile_release()
int strata_amx_emulated(void) { return 0; }

/* Linux >= 5.16 gives a process AMX tile data only on request (the signal frame grows by 8 KiB);
   without it the first tile instruction faults. 0 when granted, else -errno. Call it once before
   threads use tiles (the permission is process-wide; `state` is not atomic). */
int strata_amx_request_permission(void) {
    static int state;                                  /* 0 unknown, 1 granted, <0 -errno */
    if (state) return state > 0 ? 0 : state;
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0 ||
        syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) != 0)
        state = -errno;
    else
        state = (bits >> XFEATURE_XTILEDATA) & 1 ? 1 : -EPERM;
    return state > 0 ? 0 : state;
}
#endif

/* Every tile 16 rows x 64 bytes (palette 1): fp32 C tiles 16x16, A tiles 16x32 bf16, B tiles
   16 pair-rows x 16 columns x 2 bf16. Filled field by field, as a schedule with edge tiles will. */
static inline __attribute__((always_inline)) void amx_fill(strata_tilecfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg->rows[t] = 16;
        cfg->colsb[t] = 64;
    }
}

/* Load this thread's tile configuration. Not inlined, and its config is a local that nothing
   reads after ldtilecfg: the shape in which gcc 12 drops the stores (llama.cpp's crash), kept so
   that the round trip below tests the very function every kernel here calls. */
static __attribute__((noinline)) AMX_TARGET void amx_configure(void) {
    strata_tilecfg cfg;
    amx_fill(&cfg);
    TILE_LOADCONFIG(&cfg);
}

/* One block of mb x nb (1 or 2) C tiles at C; A at its first row, Bp at its first column pair,
   ldbp = 2 * N (elements per pair-row of Bp). mb, nb are constants after inlining. */
static inline __attribute__((always_inline)) AMX_TARGET void
amx_block(int mb, int nb, int K, const uint16_t *A, long lda, const uint16_t *Bp, long ldbp,
          float *C, long ldc) {
    TILE_ZERO(0);
    if (nb > 1) TILE_ZERO(1);
    if (mb > 1) TILE_ZERO(2);
    if (mb > 1 && nb > 1) TILE_ZERO(3);
    for (int k = 0; k < K; k += 32) {
        const uint16_t *b = Bp + (long)(k / 2) * ldbp;
        TILE_LOAD(4, A + k, lda * 2);
        if (mb > 1) TILE_LOAD(5, A + 16 * lda + k, lda * 2);
        TILE_LOAD(6, b, ldbp * 2);
        if (nb > 1) TILE_LOAD(7, b + 32, ldbp * 2);
        TILE_DP(0, 4, 6);
        if (nb > 1) TILE_DP(1, 4, 7);
        if (mb > 1) TILE_DP(2, 5, 6);
        if (mb > 1 && nb > 1) TILE_DP(3, 5, 7);
    }
    TILE_STORE(0, C, ldc * 4);
    if (nb > 1) TILE_STORE(1, C + 16, ldc * 4);
    if (mb > 1) TILE_STORE(2, C + 16 * ldc, ldc * 4);
    if (mb > 1 && nb > 1) TILE_STORE(3, C + 16 * ldc + 16, ldc * 4);
}

/* C = A x B as above with `threads` OpenMP threads (<= 0: one). cfg_out (64 bytes, may be NULL)
   receives the tile configuration one thread read back with sttilecfg while the kernel ran.
   0 on success, 1 for a shape the tile path does not take, else the permission error (<0). */
AMX_TARGET int strata_amx_gemm_bf16(int M, int N, int K, const uint16_t *A, int lda,
                                    const uint16_t *Bp, float *C, int ldc, int threads,
                                    uint8_t *cfg_out) {
    if (M <= 0 || N <= 0 || K <= 0 || M % 16 || N % 16 || K % 32 || lda < K || ldc < N) return 1;
    int perm = strata_amx_request_permission();
    if (perm) return perm;
    long ldbp = 2L * N;
    int nblocks = (N + 31) / 32;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        amx_configure();
#pragma omp single nowait
        if (cfg_out) {
            strata_tilecfg back;
            TILE_STORECONFIG(&back);
            memcpy(cfg_out, &back, sizeof back);
        }
#pragma omp for schedule(static)
        for (int jb = 0; jb < nblocks; jb++) {
            int j0 = 32 * jb, nb = N - j0 >= 32 ? 2 : 1;
            const uint16_t *b = Bp + 2L * j0;
            for (int i0 = 0; i0 < M; i0 += 32) {
                const uint16_t *a = A + (long)i0 * lda;
                float *c = C + (long)i0 * ldc + j0;
                if (M - i0 >= 32) {
                    if (nb == 2) amx_block(2, 2, K, a, lda, b, ldbp, c, ldc);
                    else amx_block(2, 1, K, a, lda, b, ldbp, c, ldc);
                } else {
                    if (nb == 2) amx_block(1, 2, K, a, lda, b, ldbp, c, ldc);
                    else amx_block(1, 1, K, a, lda, b, ldbp, c, ldc);
                }
            }
        }
        TILE_RELEASE();
    }
    return 0;
}

/* The configuration amx_configure means to load (`written`) and what sttilecfg reads back
   after it ran (`read`). */
AMX_TARGET int strata_amx_config_roundtrip(uint8_t *written, uint8_t *read) {
    int perm = strata_amx_request_permission();
    if (perm) return perm;
    strata_tilecfg cfg, back;
    amx_fill(&cfg);
    amx_configure();
    TILE_STORECONFIG(&back);
    TILE_RELEASE();
    memcpy(written, &cfg, sizeof cfg);
    memcpy(read, &back, sizeof back);
    return 0;
}

/* Peak: `iters` rounds of tdpbf16ps on tiles already loaded (no memory traffic in the loop),
   into 4 accumulators (this kernel's 2x2 block) or 6 (one A and one B tile). src: 1 KiB of bf16.
   Returns the fp32 sum of the accumulators (so the work is observable), or NAN for a bad nacc. */
AMX_TARGET float strata_amx_peak(long iters, int nacc, const uint16_t *src) {
    if (strata_amx_request_permission() || (nacc != 4 && nacc != 6)) return NAN;
    float out[16 * 16], sum = 0;
    amx_configure();
    TILE_ZERO(0); TILE_ZERO(1); TILE_ZERO(2); TILE_ZERO(3); TILE_ZERO(4); TILE_ZERO(5);
    if (nacc == 4) {
        TILE_LOAD(4, src, 64); TILE_LOAD(5, src, 64); TILE_LOAD(6, src, 64); TILE_LOAD(7, src, 64);
        for (long i = 0; i < iters; i++) {
            TILE_DP(0, 4, 6); TILE_DP(1, 4, 7); TILE_DP(2, 5, 6); TILE_DP(3, 5, 7);
        }
    } else {
        TILE_LOAD(6, src, 64); TILE_LOAD(7, src, 64);
        for (long i = 0; i < iters; i++) {
            TILE_DP(0, 6, 7); TILE_DP(1, 6, 7); TILE_DP(2, 6, 7);
            TILE_DP(3, 6, 7); TILE_DP(4, 6, 7); TILE_DP(5, 6, 7);
        }
    }
    TILE_STORE(0, out, 64);
    TILE_RELEASE();
    for (int i = 0; i < 16 * 16; i++) sum += out[i];
    return sum;
}
