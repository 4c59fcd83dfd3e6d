// The `matmul` family: y[r, o] = sum_i x[r, i] * W[o, i], f32 activations, weights in f32, f16,
// bf16 or GGML block formats (dequantized on the fly), and the expert-routed form. Same arguments
// as the CPU kernels (src/backend/cpu/kernels/matmul.rs); `matmul_affine` (MLX) is not here yet:
//   matmul_<w>:    x, w, out, rows, k, n
//   matmul_id_<w>: x, w [experts, n, k], ids i32 [rows, slots], out [rows, slots, n], rows, k, n,
//                  slots, experts
// One warp per output value (grid-stride over warps); lanes split k, sums in f32. Correct first:
// the fast kernels come with the performance issue.

template <int FMT>
__device__ __forceinline__ float mm_dot(const float* x, const uint8_t* wrow, uint32_t k, int lane) {
    float acc = 0.0f;
    for (uint32_t i = lane; i < k; i += 32) acc += x[i] * op_weight<FMT>(wrow, i);
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
                       uint32_t n, uint64_t n_x, uint64_t n_w, uint64_t n_out) {
    if (k % op_block_elems(FMT) != 0 || n_x != (uint64_t)rows * k || n_out != (uint64_t)rows * n)
        return;
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    for (uint64_t t = mm_warp_id(); t < (uint64_t)rows * n; t += mm_warp_count()) {
        const uint64_t r = t / n, o = t % n;
        float v = mm_dot<FMT>(x + r * k, w + o * row_bytes, k, lane);
        if (lane == 0) out[t] = v;
    }
}

template <int FMT>
__device__ void matmul_id(const float* x, const uint8_t* w, const int32_t* ids, float* out,
                          uint32_t rows, uint32_t k, uint32_t n, uint32_t slots, uint32_t experts,
                          uint64_t n_x, uint64_t n_ids, uint64_t n_out) {
    if (k % op_block_elems(FMT) != 0 || n_x != (uint64_t)rows * k ||
        n_ids != (uint64_t)rows * slots || n_out != (uint64_t)rows * slots * n)
        return;
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    for (uint64_t t = mm_warp_id(); t < n_out; t += mm_warp_count()) {
        const uint64_t pair = t / n, o = t % n, r = pair / slots;
        const int32_t e = ids[pair];
        if (e < 0 || (uint32_t)e >= experts) continue;
        const uint8_t* wrow = w + ((uint64_t)e * n + o) * row_bytes;
        float v = mm_dot<FMT>(x + r * k, wrow, k, lane);
        if (lane == 0) out[t] = v;
    }
}

#define MATMUL_KERNEL(NAME, FMT)                                                                    \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, float* out, uint32_t rows,      \
                                    uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_w,               \
                                    uint64_t n_out) {                                                 \
        matmul<FMT>(x, w, out, rows, k, n, n_x, n_w, n_out);                                          \
    }
#define MATMUL_ID_KERNEL(NAME, FMT)                                                                 \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, const int32_t* ids, float* out, \
                                    uint32_t rows, uint32_t k, uint32_t n, uint32_t slots,            \
                                    uint32_t experts, uint64_t n_x, uint64_t n_w, uint64_t n_ids,     \
                                    uint64_t n_out) {                                                 \
        matmul_id<FMT>(x, w, ids, out, rows, k, n, slots, experts, n_x, n_ids, n_out);                \
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
