// The `argmax` family: index of the largest value of each f32 row, as the CPU kernel
// (src/backend/cpu/kernels/argmax.rs): ties go to the first index, NaN is skipped, and a row
// whose largest value is not finite (or that holds only NaN) gives -1. Arguments: x, out (i32 [rows]), n (row length). One block per row (grid-stride
// over rows), blockDim.x a multiple of 32 up to 1024; warp shuffles, then one warp over the
// warps' winners.

// Four-value loads a thread has in flight at once.
#define AM_BATCH 8

// Whether candidate (v, i) beats (bv, bi); an index of -1 is "no candidate yet".
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

// Folds value v at index i into a thread's (bv, bi), which starts at (-inf, -1) and sees its
// indices in increasing order: a strict `>` keeps the first of equal values and skips NaN (and
// -inf, which cannot be a row's finite maximum). Three instructions a value; the per-candidate
// comparison of `am_better` (about twenty) measured 20 us for a 128,256-value row on an H100.
__device__ __forceinline__ void am_take(float v, int i, float& bv, int& bi) {
    const bool take = v > bv;
    bv = take ? v : bv;
    bi = take ? i : bi;
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
        float bv = -__int_as_float(0x7f800000);
        int bi = -1;
        // Each thread walks its values in increasing index order, four at a time where aligned,
        // AM_BATCH loads in flight before it compares (a decode step's row is read by one SM).
        uint32_t done = 0;
        if (((uint64_t)row & 15u) == 0) {
            const uint32_t n4 = n / 4;
            for (uint32_t base = 0; base < n4; base += AM_BATCH * blockDim.x) {
                float4 q[AM_BATCH];
#pragma unroll
                for (int j = 0; j < AM_BATCH; ++j) {
                    const uint32_t i4 = base + j * blockDim.x + threadIdx.x;
                    q[j] = i4 < n4 ? __ldcs((const float4*)row + i4)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int j = 0; j < AM_BATCH; ++j) {
                    const uint32_t i4 = base + j * blockDim.x + threadIdx.x;
                    if (i4 < n4) {
                        am_take(q[j].x, (int)(4 * i4), bv, bi);
                        am_take(q[j].y, (int)(4 * i4 + 1), bv, bi);
                        am_take(q[j].z, (int)(4 * i4 + 2), bv, bi);
                        am_take(q[j].w, (int)(4 * i4 + 3), bv, bi);
                    }
                }
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
