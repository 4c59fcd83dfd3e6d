// One row of the `norm` family's RMS normalization, shared by the norm kernels (norm.cu) and the
// per-head norm fused with RoPE (rope.cu), so both compute a row with the same code: each thread
// sums the squares of values threadIdx.x, threadIdx.x + blockDim.x, ... in f64, the block adds
// the partial sums (op_block_sum_f64), and the products are f32 in the order ((x * inv) * w) * m.

// Values a thread loads before it stores them (`rms_norm_row`'s second pass).
#define NORM_BATCH 8

// `v` rounded to T and widened back: what a store to a T buffer and a load from it give.
template <typename T>
__device__ __forceinline__ float norm_round(float v) {
    T t[1];
    op_store(t, 0, v);
    return op_load(t, 0);
}

// Normalizes the `dim` values of `xr` into `o` (w and mr may be null). ACC: `o` is an
// accumulator; each normalized value, rounded to T as `rms_norm` stores it, is added to it as the
// in-place add kernel does (elementwise.cu: `a + b` in f32, stored as T). Every thread of the
// block must call it (it synchronizes); `scratch` holds 32 doubles of shared memory.
template <typename T, bool ACC, typename O = T>
__device__ __forceinline__ void rms_norm_row(const T* xr, const T* w, const T* mr, O* o, float eps,
                                             uint32_t dim, double* scratch) {
    double ss = 0.0;
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) {
        double v = (double)op_load(xr, i);
        ss += v * v;
    }
    ss = op_block_sum_f64(ss, scratch);
    const float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
    // NORM_BATCH values a thread at a time, every load before the stores: a store through `o`
    // (which the compiler cannot tell apart from the inputs) would make each load wait for the
    // store before it. The same values in the same operations as one at a time.
    for (uint32_t i0 = threadIdx.x; i0 < dim; i0 += NORM_BATCH * blockDim.x) {
        float xv[NORM_BATCH], wv[NORM_BATCH], mv[NORM_BATCH], ov[NORM_BATCH];
#pragma unroll
        for (uint32_t j = 0; j < NORM_BATCH; ++j) {
            const uint32_t i = i0 + j * blockDim.x;
            if (i >= dim) continue;
            xv[j] = op_load(xr, i);
            if (w != nullptr) wv[j] = op_load(w, i);
            if (mr != nullptr) mv[j] = op_load(mr, i);
            if (ACC) ov[j] = op_load(o, i);
        }
#pragma unroll
        for (uint32_t j = 0; j < NORM_BATCH; ++j) {
            const uint32_t i = i0 + j * blockDim.x;
            if (i >= dim) continue;
            float y = xv[j] * inv;
            if (w != nullptr) y = y * wv[j];
            if (mr != nullptr) y = y * mv[j];
            if (ACC) y = ov[j] + norm_round<T>(y);
            op_store(o, i, y);
        }
    }
}
