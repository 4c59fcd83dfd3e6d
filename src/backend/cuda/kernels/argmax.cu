// The `argmax` family: index of the largest value of each f32 row, as the CPU kernel
// (src/backend/cpu/kernels/argmax.rs): ties go to the first index, NaN is skipped, a row of only
// NaN gives 0. Arguments: x, out (i32 [rows]), n (row length). One block per row (grid-stride
// over rows), blockDim.x a power of two up to 1024.

// Whether candidate (v, i) beats (bv, bi); an index of -1 is "no candidate yet".
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void argmax_f32(const float* x, int32_t* out, uint32_t n, uint64_t n_x,
                                      uint64_t n_out) {
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    if (n == 0 || n_x != n_out * n || blockDim.x > 1024) return;
    OP_ROW_LOOP(r, n_out) {
        const float* row = x + r * n;
        float bv = 0.0f;
        int bi = -1;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            float v = row[i];
            if (v != v) continue;
            if (am_better(v, (int)i, bv, bi)) { bv = v; bi = (int)i; }
        }
        __syncthreads();
        best_v[threadIdx.x] = bv;
        best_i[threadIdx.x] = bi;
        __syncthreads();
        for (uint32_t s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                float ov = best_v[threadIdx.x + s];
                int oi = best_i[threadIdx.x + s];
                if (am_better(ov, oi, best_v[threadIdx.x], best_i[threadIdx.x])) {
                    best_v[threadIdx.x] = ov;
                    best_i[threadIdx.x] = oi;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) out[r] = best_i[0] < 0 ? 0 : best_i[0];
    }
}
