// The `matmul` family: y[r, o] = sum_i x[r, i] * W[o, i], f32 activations, weights in f32, f16,
// bf16 or GGML block formats (dequantized on the fly), and the expert-routed form. Same arguments
// as the CPU kernels (src/backend/cpu/kernels/matmul.rs):
//   matmul_<w>:    x, w, out, rows, k, n
//   matmul_id_<w>: x, w [experts, n, k], ids i32 [rows, slots], out [rows, slots, n], rows, k, n,
//                  slots, experts (an id outside 0..experts is a kernel error)
//   matmul_affine_<s>: x, w u32 [n, k * bits / 32], scales and biases of dtype <s> [n, k / group],
//                  out, rows, k, n, bits, group (MLX affine: W[o, i] = scale * q + bias)
// One warp per output value (grid-stride over warps), sums in f32. For the 32-value block formats
// (q4_0, q4_1, q8_0) with a 16-byte aligned x, four lanes share a block and read it as whole words
// (`mm_dot_blocks`); every other case reads one element per lane at a time (`mm_dot`).

template <int FMT>
__device__ __forceinline__ float mm_dot(const float* x, const uint8_t* wrow, uint32_t k, int lane) {
    float acc = 0.0f;
    for (uint32_t i = lane; i < k; i += 32) acc += x[i] * op_weight<FMT>(wrow, i);
    return op_warp_sum(acc);
}

// Four bytes at a 2-byte aligned address (block quants start at even offsets).
__device__ __forceinline__ uint32_t mm_u32_at(const uint8_t* p) {
    const uint16_t* h = (const uint16_t*)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

// sum of lo[i] * (low nibble of byte i) + hi[i] * (high nibble of byte i) over the 4 bytes of q.
__device__ __forceinline__ float mm_nibble_dot(uint32_t q, float4 lo, float4 hi) {
    float s = lo.x * (float)(q & 15u);
    s += lo.y * (float)((q >> 8) & 15u);
    s += lo.z * (float)((q >> 16) & 15u);
    s += lo.w * (float)((q >> 24) & 15u);
    s += hi.x * (float)((q >> 4) & 15u);
    s += hi.y * (float)((q >> 12) & 15u);
    s += hi.z * (float)((q >> 20) & 15u);
    s += hi.w * (float)(q >> 28);
    return s;
}

// sum of a[i] * (signed byte i of q).
__device__ __forceinline__ float mm_i8_dot(uint32_t q, float4 a) {
    return a.x * (float)(int8_t)(q & 0xffu) + a.y * (float)(int8_t)((q >> 8) & 0xffu) +
           a.z * (float)(int8_t)((q >> 16) & 0xffu) + a.w * (float)(int8_t)(q >> 24);
}

// Quarter `t` (0..4) of block `b` of a weight row dotted with x: 4-bit formats take quant bytes
// [4t, 4t + 4) (values 4t..4t+3 and 16+4t..16+4t+3), q8_0 takes bytes [8t, 8t + 8).
template <int FMT>
__device__ __forceinline__ float mm_block_quarter(const float* x, const uint8_t* row, uint32_t b,
                                                  uint32_t t) {
    const float* xb = x + b * 32;
    if (FMT == OP_FMT_Q8_0) {
        const uint8_t* p = row + (uint64_t)b * 34;
        const float4 a = *(const float4*)(xb + 8 * t), c = *(const float4*)(xb + 8 * t + 4);
        const float s = mm_i8_dot(mm_u32_at(p + 2 + 8 * t), a) + mm_i8_dot(mm_u32_at(p + 6 + 8 * t), c);
        return op_half_bits(p) * s;
    }
    const float4 lo = *(const float4*)(xb + 4 * t), hi = *(const float4*)(xb + 16 + 4 * t);
    const float sx = (lo.x + lo.y) + (lo.z + lo.w) + (hi.x + hi.y) + (hi.z + hi.w);
    if (FMT == OP_FMT_Q4_1) {
        const uint8_t* p = row + (uint64_t)b * 20;
        return op_half_bits(p) * mm_nibble_dot(mm_u32_at(p + 4 + 4 * t), lo, hi) +
               op_half_bits(p + 2) * sx;
    }
    const uint8_t* p = row + (uint64_t)b * 18;  // q4_0: value = d * (q - 8)
    return op_half_bits(p) * (mm_nibble_dot(mm_u32_at(p + 2 + 4 * t), lo, hi) - 8.0f * sx);
}

// Whether `mm_dot_blocks` applies: a 32-value block format, x rows 16-byte aligned, weights at an
// even address.
template <int FMT>
__device__ __forceinline__ bool mm_blocks_ok(const float* x, const uint8_t* w, uint32_t k) {
    return (FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q8_0) &&
           ((uint64_t)x & 15u) == 0 && k % 32 == 0 && ((uint64_t)w & 1u) == 0;
}

template <int FMT>
__device__ __forceinline__ float mm_dot_blocks(const float* x, const uint8_t* wrow, uint32_t k,
                                               int lane) {
    const uint32_t blocks = k / 32, t = lane & 3;
    float acc = 0.0f;
#pragma unroll 2
    for (uint32_t b = lane >> 2; b < blocks; b += 8) acc += mm_block_quarter<FMT>(x, wrow, b, t);
    return op_warp_sum(acc);
}

__device__ __forceinline__ uint64_t mm_warp_id() {
    return (blockIdx.y * (uint64_t)gridDim.x + blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
}
__device__ __forceinline__ uint64_t mm_warp_count() {
    return (uint64_t)gridDim.x * gridDim.y * (blockDim.x / 32);
}

template <int FMT>
__device__ void matmul(const float* x, const uint8_t* w, float* out, uint32_t rows, uint32_t k,
                       uint32_t n, uint64_t n_x, uint64_t n_w, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_out == (uint64_t)rows * n);
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    const bool blocks = mm_blocks_ok<FMT>(x, w, k);
    for (uint64_t t = mm_warp_id(); t < (uint64_t)rows * n; t += mm_warp_count()) {
        const uint64_t r = t / n, o = t % n;
        const float* xr = x + r * k;
        const uint8_t* wr = w + o * row_bytes;
        const float v = blocks ? mm_dot_blocks<FMT>(xr, wr, k, lane) : mm_dot<FMT>(xr, wr, k, lane);
        if (lane == 0) out[t] = v;
    }
}

template <int FMT>
__device__ void matmul_id(const float* x, const uint8_t* w, const int32_t* ids, float* out,
                          uint32_t rows, uint32_t k, uint32_t n, uint32_t slots, uint32_t experts,
                          uint64_t n_x, uint64_t n_ids, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_ids == (uint64_t)rows * slots && n_out == (uint64_t)rows * slots * n);
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    const bool blocks = mm_blocks_ok<FMT>(x, w, k);
    for (uint64_t t = mm_warp_id(); t < n_out; t += mm_warp_count()) {
        const uint64_t pair = t / n, o = t % n, r = pair / slots;
        const int32_t e = ids[pair];
        if (e < 0 || (uint32_t)e >= experts) {
            if (o == 0 && lane == 0) op_fail(tag, OP_ERR_EXPERT_ID, e, experts, pair);
            continue;
        }
        const uint8_t* wrow = w + ((uint64_t)e * n + o) * row_bytes;
        const float* xr = x + r * k;
        const float v = blocks ? mm_dot_blocks<FMT>(xr, wrow, k, lane) : mm_dot<FMT>(xr, wrow, k, lane);
        if (lane == 0) out[t] = v;
    }
}

#define MATMUL_KERNEL(NAME, FMT)                                                                    \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, float* out, uint32_t rows,      \
                                    uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_w,               \
                                    uint64_t n_out) {                                                 \
        matmul<FMT>(x, w, out, rows, k, n, n_x, n_w, n_out, op_tag(#NAME));                        \
    }
#define MATMUL_ID_KERNEL(NAME, FMT)                                                                 \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, const int32_t* ids, float* out, \
                                    uint32_t rows, uint32_t k, uint32_t n, uint32_t slots,            \
                                    uint32_t experts, uint64_t n_x, uint64_t n_w, uint64_t n_ids,     \
                                    uint64_t n_out) {                                                 \
        matmul_id<FMT>(x, w, ids, out, rows, k, n, slots, experts, n_x, n_ids, n_out,                 \
                       op_tag(#NAME));                                                                \
    }

MATMUL_KERNEL(matmul_f32, OP_FMT_F32)
MATMUL_KERNEL(matmul_f16, OP_FMT_F16)
MATMUL_KERNEL(matmul_bf16, OP_FMT_BF16)
MATMUL_KERNEL(matmul_q4_0, OP_FMT_Q4_0)
MATMUL_KERNEL(matmul_q4_1, OP_FMT_Q4_1)
MATMUL_KERNEL(matmul_q8_0, OP_FMT_Q8_0)
MATMUL_KERNEL(matmul_q4_k, OP_FMT_Q4_K)
MATMUL_KERNEL(matmul_q6_k, OP_FMT_Q6_K)
MATMUL_ID_KERNEL(matmul_id_f32, OP_FMT_F32)
MATMUL_ID_KERNEL(matmul_id_f16, OP_FMT_F16)
MATMUL_ID_KERNEL(matmul_id_bf16, OP_FMT_BF16)
MATMUL_ID_KERNEL(matmul_id_q4_0, OP_FMT_Q4_0)
MATMUL_ID_KERNEL(matmul_id_q4_1, OP_FMT_Q4_1)
MATMUL_ID_KERNEL(matmul_id_q8_0, OP_FMT_Q8_0)
MATMUL_ID_KERNEL(matmul_id_q4_k, OP_FMT_Q4_K)
MATMUL_ID_KERNEL(matmul_id_q6_k, OP_FMT_Q6_K)

// MLX affine weights: value i of row o is scale[g] * q + bias[g] with g = i / group and q the
// i-th `bits`-bit field of the row's u32 words, lowest bits first (the CPU's operation order).
template <typename S>
__device__ void matmul_affine(const float* x, const uint32_t* w, const S* scales, const S* biases,
                              float* out, uint32_t rows, uint32_t k, uint32_t n, uint32_t bits,
                              uint32_t group, uint64_t n_x, uint64_t n_w, uint64_t n_scales,
                              uint64_t n_biases, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE((bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128));
    OP_REQUIRE(k != 0 && k % group == 0 && n_x == (uint64_t)rows * k &&
               n_out == (uint64_t)rows * n);
    const uint32_t per_word = 32 / bits, words = k / per_word, groups = k / group;
    OP_REQUIRE(n_w == (uint64_t)n * words && n_scales == (uint64_t)n * groups &&
               n_biases == n_scales);
    const uint32_t mask = (1u << bits) - 1u;
    const int lane = threadIdx.x & 31;
    for (uint64_t t = mm_warp_id(); t < (uint64_t)rows * n; t += mm_warp_count()) {
        const uint64_t r = t / n, o = t % n;
        const float* xr = x + r * k;
        const uint32_t* wr = w + o * words;
        const S* sr = scales + o * groups;
        const S* br = biases + o * groups;
        float acc = 0.0f;
        for (uint32_t i = lane; i < k; i += 32) {
            const uint32_t q = (wr[i / per_word] >> (bits * (i % per_word))) & mask;
            const float v = op_load(sr, i / group) * (float)q + op_load(br, i / group);
            acc += xr[i] * v;
        }
        acc = op_warp_sum(acc);
        if (lane == 0) out[t] = acc;
    }
}

#define MATMUL_AFFINE_KERNEL(NAME, S)                                                               \
    extern "C" __global__ void NAME(const float* x, const uint32_t* w, const S* scales,              \
                                    const S* biases, float* out, uint32_t rows, uint32_t k,           \
                                    uint32_t n, uint32_t bits, uint32_t group, uint64_t n_x,          \
                                    uint64_t n_w, uint64_t n_scales, uint64_t n_biases,               \
                                    uint64_t n_out) {                                                 \
        matmul_affine<S>(x, w, scales, biases, out, rows, k, n, bits, group, n_x, n_w, n_scales,      \
                         n_biases, n_out, op_tag(#NAME));                                             \
    }

MATMUL_AFFINE_KERNEL(matmul_affine_f32, float)
MATMUL_AFFINE_KERNEL(matmul_affine_f16, __half)
