// The `argmax` family: index of the largest value of each f32 row, as the CPU kernel
// (src/backend/cpu/kernels/argmax.rs): ties go to the first index, NaN is skipped, and a row
// whose largest value is not finite (or that holds only NaN) gives -1. Arguments: x, out (i32 [rows]), n (row length). One block per row (grid-stride
// over rows), blockDim.x a multiple of 32 up to 1024; warp shuffles, then one warp over the
// warps' winners.

// Whether candidate (v, i) beats (bv, bi); an index of -1 is "no candidate yet".
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

// Folds candidate (v, i) into (bv, bi), skipping NaN.
__device__ __forceinline__ void am_take(float v, int i, float& bv, int& bi) {
    if (v == v && am_better(v, i, bv, bi)) {
        bv = v;
        bi = i;
    }
}

extern "C" __global__ void argmax_f32(const float* x, int32_t* out, uint32_t n, uint64_t n_x,
                                      uint64_t n_out) {
    OP_GRID_ENTRY();
    __shared__ float warp_v[32];
    __shared__ int warp_i[32];
    if (n == 0 || n_x != n_out * n || blockDim.x > 1024 || blockDim.x % 32 != 0) return;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    OP_ROW_LOOP(r, n_out) {
        const float* row = x + r * n;
        float bv = 0.0f;
        int bi = -1;
        // Each thread walks its values in increasing index order, four at a time where aligned.
        uint32_t done = 0;
        if (((uint64_t)row & 15u) == 0) {
            const uint32_t n4 = n / 4;
#pragma unroll 4
            for (uint32_t i4 = threadIdx.x; i4 < n4; i4 += blockDim.x) {
                const float4 q = ((const float4*)row)[i4];
                am_take(q.x, (int)(4 * i4), bv, bi);
                am_take(q.y, (int)(4 * i4 + 1), bv, bi);
                am_take(q.z, (int)(4 * i4 + 2), bv, bi);
                am_take(q.w, (int)(4 * i4 + 3), bv, bi);
            }
            done = n4 * 4;
        }
        for (uint32_t i = done + threadIdx.x; i < n; i += blockDim.x) am_take(row[i], (int)i, bv, bi);
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(ONEPASS_FULL_MASK, bv, o);
            const int oi = __shfl_xor_sync(ONEPASS_FULL_MASK, bi, o);
            if (am_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        __syncthreads();
        if (lane == 0) {
            warp_v[warp] = bv;
            warp_i[warp] = bi;
        }
        __syncthreads();
        if (warp == 0) {
            bv = lane < warps ? warp_v[lane] : 0.0f;
            bi = lane < warps ? warp_i[lane] : -1;
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(ONEPASS_FULL_MASK, bv, o);
                const int oi = __shfl_xor_sync(ONEPASS_FULL_MASK, bi, o);
                if (am_better(ov, oi, bv, bi)) {
                    bv = ov;
                    bi = oi;
                }
            }
            if (lane == 0) out[r] = (bi < 0 || !isfinite(bv)) ? -1 : bi;
        }
    }
}
