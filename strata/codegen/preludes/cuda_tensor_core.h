// mma.sync m16n8k16, ldmatrix and cp.async are inline PTX for sm_80 and newer.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "strata: these kernels use mma.sync, ldmatrix and cp.async, which need sm_80 or newer"
#endif
// The 32-bit .shared address of a __shared__ object, as ldmatrix and cp.async take it.
__device__ __forceinline__ unsigned st_smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
