// TMA (cp.async.bulk.tensor), mbarrier and wgmma are inline PTX for sm_90 (wgmma: sm_90a).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "strata: these kernels use TMA and mbarrier, which need sm_90 or newer"
#endif
// A CUtensorMap (cuda.h) by value: 128 opaque bytes, encoded on the host by cuTensorMapEncodeTiled.
struct alignas(128) st_tensor_map { unsigned long long opaque[16]; };
// wgmma matrix descriptor: start address >> 4 (bits 0-13), leading / stride byte offsets >> 4
// (16-29, 32-45), swizzle mode (62-63: 0 none, 1 128B, 2 64B, 3 32B).
__device__ __forceinline__ long long st_wgmma_desc(const void* p, unsigned lbo, unsigned sbo,
                                                   unsigned mode) {
    unsigned long long a = st_smem_addr(p);
    return (long long)(((a & 0x3FFFFull) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
                       | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32)
                       | ((unsigned long long)mode << 62));
}
// mbarrier.try_wait.parity: whether the phase with this parity has completed.
__device__ __forceinline__ bool st_mbar_try_wait(unsigned bar, unsigned parity) {
    unsigned ok;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    return ok != 0;
}
__device__ __forceinline__ void st_mbar_wait(unsigned bar, unsigned parity) {
    while (!st_mbar_try_wait(bar, parity)) {
    }
}
