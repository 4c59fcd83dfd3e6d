// The `norm` family: RMS normalization per row, with or without a weight, optionally fused with a
// following multiply by `m` (one row broadcast over the rows, or one value per element of x), or
// added into an accumulator. Same argument order and semantics as the CPU kernels
// (src/backend/cpu/kernels/norm.rs): the sum of squares is accumulated in f64, the products are
// f32 in the order ((x * inv) * w) * m (the row code is in norm_row.cuh). One block per row
// (grid-stride over rows), blockDim.x a multiple of 32.

// The rows of x, one block per row (grid-stride); the row code is rms_norm_row (norm_row.cuh).
// With ACC the fused kernel gives the bits of `rms_norm` then `add` (with the same block size).
template <typename T, bool ACC, typename O = T>
__device__ void rms_norm_rows(const T* x, const T* w, const T* m, O* out, float eps, uint32_t dim,
                              uint64_t n_x, uint64_t n_m, uint64_t n_out) {
    __shared__ double scratch[32];
    if (dim == 0) return;
    const uint64_t n = n_x < n_out ? n_x : n_out;
    const uint64_t rows = n / dim;
    const bool m_full = m != nullptr && n_m == n_x;
    if (m != nullptr && !m_full && n_m < dim) return;
    OP_ROW_LOOP(r, rows) {
        const T* mr = m == nullptr ? nullptr : (m_full ? m + r * dim : m);
        rms_norm_row<T, ACC, O>(x + r * dim, w, mr, out + r * dim, eps, dim, scratch);
    }
}

#define RMS_NORM_KERNEL(NAME, T)                                                                    \
    extern "C" __global__ void NAME(const T* x, const T* w, T* out, float eps, uint32_t dim,        \
                                    uint64_t n_x, uint64_t n_w, uint64_t n_out) {                   \
        OP_GRID_ENTRY();                                                                            \
        if (n_w < dim) return;                                                                      \
        rms_norm_rows<T, false>(x, w, nullptr, out, eps, dim, n_x, 0, n_out);                       \
    }
#define RMS_NORM_NO_SCALE_KERNEL(NAME, T)                                                           \
    extern "C" __global__ void NAME(const T* x, T* out, float eps, uint32_t dim, uint64_t n_x,      \
                                    uint64_t n_out) {                                               \
        OP_GRID_ENTRY();                                                                            \
        rms_norm_rows<T, false>(x, nullptr, nullptr, out, eps, dim, n_x, 0, n_out);                 \
    }
#define RMS_NORM_MUL_KERNEL(NAME, T)                                                                \
    extern "C" __global__ void NAME(const T* x, const T* w, const T* m, T* out, float eps,          \
                                    uint32_t dim, uint64_t n_x, uint64_t n_w, uint64_t n_m,         \
                                    uint64_t n_out) {                                               \
        OP_GRID_ENTRY();                                                                            \
        if (n_w < dim) return;                                                                      \
        rms_norm_rows<T, false>(x, w, m, out, eps, dim, n_x, n_m, n_out);                           \
    }
#define RMS_NORM_NO_SCALE_MUL_KERNEL(NAME, T)                                                       \
    extern "C" __global__ void NAME(const T* x, const T* m, T* out, float eps, uint32_t dim,        \
                                    uint64_t n_x, uint64_t n_m, uint64_t n_out) {                   \
        OP_GRID_ENTRY();                                                                            \
        rms_norm_rows<T, false>(x, nullptr, m, out, eps, dim, n_x, n_m, n_out);                     \
    }
// The fusion of `rms_norm` with the in-place add of its output into `acc` (src/ops/norm.rs).
#define RMS_NORM_ADD_KERNEL(NAME, T)                                                                \
    extern "C" __global__ void NAME(const T* x, const T* w, T* acc, float eps, uint32_t dim,        \
                                    uint64_t n_x, uint64_t n_w, uint64_t n_acc) {                   \
        OP_GRID_ENTRY();                                                                            \
        if (n_w < dim) return;                                                                      \
        rms_norm_rows<T, true>(x, w, nullptr, acc, eps, dim, n_x, 0, n_acc);                        \
    }

RMS_NORM_KERNEL(rms_norm_f32, float)
RMS_NORM_KERNEL(rms_norm_f16, __half)
RMS_NORM_KERNEL(rms_norm_bf16, __nv_bfloat16)
RMS_NORM_NO_SCALE_KERNEL(rms_norm_no_scale_f32, float)
RMS_NORM_NO_SCALE_KERNEL(rms_norm_no_scale_f16, __half)
RMS_NORM_NO_SCALE_KERNEL(rms_norm_no_scale_bf16, __nv_bfloat16)
RMS_NORM_MUL_KERNEL(rms_norm_mul_f32, float)
RMS_NORM_MUL_KERNEL(rms_norm_mul_f16, __half)
RMS_NORM_MUL_KERNEL(rms_norm_mul_bf16, __nv_bfloat16)
RMS_NORM_NO_SCALE_MUL_KERNEL(rms_norm_no_scale_mul_f32, float)
RMS_NORM_NO_SCALE_MUL_KERNEL(rms_norm_no_scale_mul_f16, __half)
RMS_NORM_NO_SCALE_MUL_KERNEL(rms_norm_no_scale_mul_bf16, __nv_bfloat16)
RMS_NORM_ADD_KERNEL(rms_norm_add_f32, float)
RMS_NORM_ADD_KERNEL(rms_norm_add_f16, __half)
RMS_NORM_ADD_KERNEL(rms_norm_add_bf16, __nv_bfloat16)

// The f32 norm's values rounded to f16 (the narrowing of `graph::passes::narrow`: the tensor-core
// products that read them round to f16 anyway); launched with the f32 norm's block size, so the
// f32 values are that kernel's.
extern "C" __global__ void rms_norm_f32_to_f16(const float* x, const float* w, __half* out,
                                               float eps, uint32_t dim, uint64_t n_x,
                                               uint64_t n_w, uint64_t n_out) {
    OP_GRID_ENTRY();
    if (n_w < dim) return;
    rms_norm_rows<float, false, __half>(x, w, nullptr, out, eps, dim, n_x, 0, n_out);
}
