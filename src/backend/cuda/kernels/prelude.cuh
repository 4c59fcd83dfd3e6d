// Shared helpers for every onepass CUDA kernel family (compiled in front of each family's source).
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// NVRTC has no C library headers: the fixed-width integers we use.
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;

#define ONEPASS_FULL_MASK 0xffffffffu

// Sum over a warp; every lane gets the result.
__device__ __forceinline__ float op_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ONEPASS_FULL_MASK, v, o);
    return v;
}

// Maximum over a warp; every lane gets the result.
__device__ __forceinline__ float op_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ONEPASS_FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call begins and ends with a barrier.
__device__ __forceinline__ float op_block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = op_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : 0.0f;
    return op_warp_sum(t);
}

// Maximum over the block, as `op_block_sum`.
__device__ __forceinline__ float op_block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = op_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : -__int_as_float(0x7f800000);
    return op_warp_max(t);
}

// Loads and stores of every float type as f32.
__device__ __forceinline__ float op_load(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float op_load(const __half* p, long i) { return __half2float(p[i]); }
__device__ __forceinline__ float op_load(const __nv_bfloat16* p, long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void op_store(float* p, long i, float v) { p[i] = v; }
__device__ __forceinline__ void op_store(__half* p, long i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void op_store(__nv_bfloat16* p, long i, float v) { p[i] = __float2bfloat16_rn(v); }

// An f16 stored as raw bits (GGML block scales are unaligned little-endian halves).
__device__ __forceinline__ float op_half_bits(const uint8_t* p) {
    unsigned short bits = (unsigned short)p[0] | ((unsigned short)p[1] << 8);
    return __half2float(__ushort_as_half(bits));
}
