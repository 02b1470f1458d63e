// Two floats rounded to a 16-bit pair, the first in the low half (PackHalf2: an mma operand made
// in registers, as ldmatrix would have loaded it from shared memory).
__device__ __forceinline__ int st_pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<int*>(&v);
}
__device__ __forceinline__ int st_pack_f16x2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<int*>(&v);
}
