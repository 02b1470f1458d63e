
// AMX tiles (codegen/c_amx.py): where the compiler targets AMX, st_tile_* are the instructions,
// unless the kernel's st_amx (from st_amx_mode) says to emulate them: Linux refused the tile
// data, or STRATA_AMX_EMULATE=1. The emulation follows the SDM's tdpbf16ps (two fp32 partial
// sums per pair of K, RNE, bf16 subnormal inputs as zero, subnormal results flushed), bit-exact
// with the instructions on the probe's CPU (strata/codegen/amx_kernel.c's tests). Every tile is
// 16 rows x 64 bytes: fp32 C 16x16, bf16 A 16x32, B 16 pairs x 16 columns.
#include <float.h>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define ST_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
extern long syscall(long, ...);
#else
#define ST_AMX 0
#endif
#define st_fence() __asm__ volatile("" ::: "memory")
#define st_prefetch_l2(p) __builtin_prefetch((p), 0, 2)
static _Thread_local uint8_t st_emu[8][16][64];
static void st_emu_load(int t, const void* p, long stride) {
    for (int r = 0; r < 16; r++) memcpy(st_emu[t][r], (const char*)p + r * stride, 64);
}
static void st_emu_store(int t, void* p, long stride) {
    for (int r = 0; r < 16; r++) memcpy((char*)p + r * stride, st_emu[t][r], 64);
}
static inline float st_emu_bf16(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return st_bf16_to_float((h & 0x7f80) == 0 ? h & 0x8000 : h);
}
static inline float st_emu_ftz(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }
static void st_emu_dp(int c, int a, int b) {
    for (int m = 0; m < 16; m++) {
        float even[16] = {0}, odd[16] = {0}, acc;
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 16; n++) {
                even[n] = st_emu_ftz(fmaf(st_emu_bf16(&st_emu[a][m][4 * k]),
                                          st_emu_bf16(&st_emu[b][k][4 * n]), even[n]));
                odd[n] = st_emu_ftz(fmaf(st_emu_bf16(&st_emu[a][m][4 * k + 2]),
                                         st_emu_bf16(&st_emu[b][k][4 * n + 2]), odd[n]));
            }
        for (int n = 0; n < 16; n++) {
            memcpy(&acc, &st_emu[c][m][4 * n], 4);
            acc = st_emu_ftz(acc + st_emu_ftz(even[n] + odd[n]));
            memcpy(&st_emu[c][m][4 * n], &acc, 4);
        }
    }
}
// 1: emulate. Linux >= 5.16 gives a process tile data only on request (arch_prctl): asked once,
// on the first call, before the kernel's threads start; refused, the tiles are emulated.
static int st_amx_mode(void) {
    const char* e = getenv("STRATA_AMX_EMULATE");
#if ST_AMX
    static int granted;         // 0: not asked, 1: granted, -1: refused
    if (!granted) {
        unsigned long bits = 0;
        granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0 && syscall(SYS_arch_prctl, 0x1022, &bits) == 0
                  && (bits >> 18 & 1) ? 1 : -1;
        if (granted < 0) fprintf(stderr, "strata: Linux refused AMX tile data; emulating the tiles\n");
    }
    return granted < 0 || (e && *e && strcmp(e, "0"));
#else
    (void)e;
    return 1;
#endif
}
#if ST_AMX
typedef struct __attribute__((aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} st_tilecfg;
// This thread's configuration: 8 tiles of 16 rows x 64 bytes. gcc 12's _tile_loadconfig asm
// declares an 8-byte read, so the stores filling the rest may be dropped (amx_kernel.c): the
// empty asm before it reads all 64 bytes.
static void st_amx_start(int emu) {
    if (emu) return;
    st_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    __asm__ volatile("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}
static void st_amx_end(int emu) { if (!emu) _tile_release(); }
#define st_tile_zero(e, t) do { if (e) memset(st_emu[t], 0, 1024); else _tile_zero(t); } while (0)
#define st_tile_load(e, t, p, s) do { if (e) st_emu_load(t, p, s); else _tile_loadd(t, p, s); } while (0)
#define st_tile_store(e, t, p, s) do { if (e) st_emu_store(t, p, s); else _tile_stored(t, p, s); } while (0)
#define st_tile_dp(e, c, a, b) do { if (e) st_emu_dp(c, a, b); else _tile_dpbf16ps(c, a, b); } while (0)
#else
static void st_amx_start(int emu) { (void)emu; }
static void st_amx_end(int emu) { (void)emu; }
#define st_tile_zero(e, t) ((void)(e), memset(st_emu[t], 0, 1024))
#define st_tile_load(e, t, p, s) ((void)(e), st_emu_load(t, p, s))
#define st_tile_store(e, t, p, s) ((void)(e), st_emu_store(t, p, s))
#define st_tile_dp(e, c, a, b) ((void)(e), st_emu_dp(c, a, b))
#endif
