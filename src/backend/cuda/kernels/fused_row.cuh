// The fused decoder-block kernels' activation row (compiled in front of fused_block.cu, after
// matmul_blocks.cuh and matmul_dots.cuh): normalized per warp as it is read (`XNorm`), or once
// per block into shared memory (`XShared`), and there also quantized to int8 for the `dp4a`
// products (`fb_norm_quantize_row`).
// The activation row is RMS-normalized as it is read: each warp sums the squares of its row in
// f64 (each lane its share, then a shuffle tree), inv = 1 / sqrt(ss / k + eps) rounded to f32, and value
// i is (x[i] * inv) * norm[i], the rms_norm kernel's float order.
struct XNorm {
    const float* x;
    const float* w;
    float inv;
    __device__ __forceinline__ float at(uint64_t i) const { return (x[i] * inv) * w[i]; }
    __device__ __forceinline__ float4 at4(uint64_t i) const {
        const float4 a = *(const float4*)(x + i), b = *(const float4*)(w + i);
        return make_float4((a.x * inv) * b.x, (a.y * inv) * b.y, (a.z * inv) * b.z,
                           (a.w * inv) * b.w);
    }
    // The row from value e on.
    __device__ __forceinline__ XNorm from(uint32_t e) const { return XNorm{x + e, w + e, inv}; }
    __device__ __forceinline__ bool aligned16() const {
        return (((uint64_t)x | (uint64_t)w) & 15u) == 0;
    }
};

// float4 loads a lane of the per-warp norm issues before it sums them.
#define FB_WARP_BATCH 8u

__device__ __forceinline__ XNorm fb_norm_row(const float* xr, const float* w, uint32_t k, float eps,
                                             int lane) {
    double ss = 0.0;
    if (((uint64_t)xr & 15u) == 0 && k % 4 == 0) {
        // Four values a load, FB_WARP_BATCH loads a lane in flight before their squares are
        // added (a row of up to 1,024 values in one round).
        for (uint32_t i0 = 4 * lane; i0 < k; i0 += 128 * FB_WARP_BATCH) {
            float4 b[FB_WARP_BATCH];
#pragma unroll
            for (uint32_t j = 0; j < FB_WARP_BATCH; ++j) {
                const uint32_t i = i0 + 128 * j;
                b[j] = i < k ? *(const float4*)(xr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (uint32_t j = 0; j < FB_WARP_BATCH; ++j) {
                const float4 v = b[j];
                if (i0 + 128 * j < k)
                    ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z +
                          (double)v.w * v.w;
            }
        }
    } else {
#pragma unroll 8
        for (uint32_t i = lane; i < k; i += 32) {
            const double v = (double)xr[i];
            ss += v * v;
        }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(ONEPASS_FULL_MASK, ss, o);
    return XNorm{xr, w, (float)(1.0 / sqrt(ss / (double)k + (double)eps))};
}

// The normalized row in shared memory, written once per block: what a one-row pass reads when
// the host gives the kernel k floats of dynamic shared memory (and after them the weight stage of
// `mm_dot_staged` and 32 doubles of scratch: without that memory the kernel uses none, as
// before). Every thread of the block sums its squares and the block adds them as the rms_norm
// kernel does (norm_row.cuh: the same order at the same block size, ROW_THREADS = 256), so `inv`
// and every value are that kernel's; the block reads x and the norm weight once instead of once
// per warp, and the grid is capped so that a block normalizes once for many outputs.
struct XShared {
    const float* s;
    __device__ __forceinline__ float at(uint64_t i) const { return s[i]; }
    __device__ __forceinline__ float4 at4(uint64_t i) const { return *(const float4*)(s + i); }
    __device__ __forceinline__ bool aligned16() const { return true; }
    // The row from value e on (e a multiple of 4).
    __device__ __forceinline__ XShared from(uint32_t e) const { return XShared{s + e}; }
};

// Row r of the activations as the fused kernels read it: normalized per warp.
struct FbPerWarp {
    const float* x;
    const float* nw;
    uint32_t k;
    float eps;
    int lane;
    // No shared memory: no staging.
    __device__ __forceinline__ uint4* stage() const { return nullptr; }
    __device__ __forceinline__ XNorm operator()(uint64_t r) const {
        return fb_norm_row(x + r * k, nw, k, eps, lane);
    }
};
// The one row, normalized once per block into shared memory.
struct FbShared {
    const float* s;
    uint32_t k;
    __device__ __forceinline__ XShared operator()(uint64_t) const { return XShared{s}; }
    // The weight stage follows the row in the dynamic shared memory.
    __device__ __forceinline__ uint4* stage() const { return (uint4*)(s + k); }
};

// Shared memory of the `_shared` kernels after the row: the weight stage and 32 doubles.
#define FB_SHARED_TAIL (16u * MM_STAGE_WARPS * MM_STAGE_MAX_WORDS + 32u * 8u)

// The one row, normalized once per block and then quantized to int8 after the tail (the 32-value
// block formats, where the launch gives MM_Q8_BYTES(k) more: see matmul_blocks.cuh).
struct FbSharedQ8 {
    XQ8 x;
    uint32_t k;
    __device__ __forceinline__ XQ8 operator()(uint64_t) const { return x; }
    __device__ __forceinline__ uint4* stage() const { return (uint4*)(x.s + k); }
};

// Whether the one-row pass also quantizes its normalized row (block-uniform): given the memory,
// a row that `fb_norm_quantize_row` takes in one batch of MM_Q8_BATCH groups a thread (8,192
// values at eight warps; the host's 48 KiB of shared memory hold at most about 6,000).
template <int FMT>
__device__ __forceinline__ bool fb_q8_ok(uint32_t k) {
    return mm_q8_format<FMT>() && k % 32 == 0 && k <= 128u * (blockDim.x / 32) * MM_Q8_BATCH &&
           mm_dynamic_smem() >= 4u * k + FB_SHARED_TAIL + MM_Q8_BYTES(k);
}

// Whether a pass of `rows` rows takes the shared row (block-uniform): one row, the row and its
// tail of dynamic shared memory, x and the weight 16-byte aligned with k a multiple of 4.
__device__ __forceinline__ bool fb_shared_ok(uint64_t rows, const float* x, const float* nw,
                                             uint32_t k) {
    return rows == 1 && blockDim.y == 1 && k % 4 == 0 &&
           mm_dynamic_smem() >= 4u * k + FB_SHARED_TAIL &&
           (((uint64_t)x | (uint64_t)nw) & 15u) == 0;
}

// Threads that sum the row's squares: the rms_norm kernel's block (ROW_THREADS in
// src/ops/norm.rs), whatever this block's size (eight warps, or sixteen where the row is
// quantized: src/ops/fused_block.rs, `WIDE_THREADS`).
#define FB_NORM_THREADS 256u

// Writes the normalized row into the block's dynamic shared memory and returns it.
__device__ __forceinline__ const float* fb_shared_row(const float* x, const float* nw, uint32_t k,
                                                      float eps) {
    extern __shared__ __align__(16) float fb_smem[];
    // The scratch after the row and the stage (no static shared memory: a kernel launched
    // without dynamic shared memory uses none).
    double* scratch = (double*)(fb_smem + k + 4 * MM_STAGE_WARPS * MM_STAGE_MAX_WORDS);
    // The first FB_NORM_THREADS threads sum (the rms_norm kernel's order); the others add 0.0,
    // which leaves every partial sum exact.
    double ss = 0.0;
    if (threadIdx.x < FB_NORM_THREADS) {
        for (uint32_t i = threadIdx.x; i < k; i += FB_NORM_THREADS) {
            const double v = (double)x[i];
            ss += v * v;
        }
    }
    ss = op_block_sum_f64(ss, scratch);
    const XNorm xn = XNorm{x, nw, (float)(1.0 / sqrt(ss / (double)k + (double)eps))};
    for (uint32_t i = 4 * threadIdx.x; i < k; i += 4 * blockDim.x) {
        *(float4*)(fb_smem + i) = xn.at4(i);
    }
    __syncthreads();
    return fb_smem;
}

// The one row normalized into shared memory and quantized to int8 after the tail
// (mm_quantize_row's groups) in one pass: each thread loads the values of x and of the norm
// weight of its quantization groups at once and sums their squares; after the block's sum it
// normalizes them from registers ((x * inv) * w, XNorm's order), stores them in the shared row and
// quantizes them. One round trip to L2 and three barriers, where summing the row, normalizing it
// into shared memory and quantizing it from there took about three and four (docs/kernels.md
// item 27). Needs fb_shared_ok and fb_q8_ok; the order of the int8 words is FMT's
// (`mm_q8_swizzled`).
template <int FMT>
__device__ __forceinline__ FbSharedQ8 fb_norm_quantize_row(const float* x, const float* nw,
                                                           uint32_t k, float eps) {
    extern __shared__ __align__(16) float fb_smem[];
    double* scratch = (double*)(fb_smem + k + 4 * MM_STAGE_WARPS * MM_STAGE_MAX_WORDS);
    uint8_t* base = (uint8_t*)(fb_smem + k) + FB_SHARED_TAIL;
    int* q = (int*)base;
    float2* ds = (float2*)(base + k);
    const uint32_t nb = k / 32, p = threadIdx.x & 7, stride = 4 * (blockDim.x / 32);
    const uint32_t warp_first = 4 * (threadIdx.x / 32);
    const uint32_t first = warp_first + ((threadIdx.x & 31) >> 3);
    float4 xv[MM_Q8_BATCH], wv[MM_Q8_BATCH];
#pragma unroll
    for (uint32_t j = 0; j < MM_Q8_BATCH; ++j) {
        const uint32_t b = first + stride * j;
        const bool live = b < nb;
        xv[j] = live ? *(const float4*)(x + 32 * b + 4 * p) : make_float4(0.f, 0.f, 0.f, 0.f);
        wv[j] = live ? *(const float4*)(nw + 32 * b + 4 * p) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    // Every thread sums the squares of its groups' values in f64: another order than the rms_norm
    // kernel's (fb_shared_row's), so inv may differ from that kernel's where the f64 sums round
    // to different f32 values.
    double ss = 0.0;
#pragma unroll
    for (uint32_t j = 0; j < MM_Q8_BATCH; ++j) {
        const float4 v = xv[j];
        ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
    ss = op_block_sum_f64(ss, scratch);
    const float inv = (float)(1.0 / sqrt(ss / (double)k + (double)eps));
#pragma unroll
    for (uint32_t j = 0; j < MM_Q8_BATCH; ++j) {
        if (warp_first + stride * j >= nb) break;  // warp-uniform
        const uint32_t b = first + stride * j;
        const float4 a = xv[j], c = wv[j];
        const float4 v = make_float4((a.x * inv) * c.x, (a.y * inv) * c.y, (a.z * inv) * c.z,
                                     (a.w * inv) * c.w);
        if (b < nb) *(float4*)(fb_smem + 32 * b + 4 * p) = v;
        mm_quantize_group<mm_q8_swizzled<FMT>()>(v, b < nb, b, p, q, ds);
    }
    __syncthreads();
    return FbSharedQ8{XQ8{fb_smem, q, ds, 0}, k};
}
