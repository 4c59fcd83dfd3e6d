// The `argmax` family: index of the largest value of each f32 row, as the CPU kernel
// (src/backend/cpu/kernels/argmax.rs): ties go to the first index, NaN is skipped, and a row
// whose largest value is not finite (or that holds only NaN) gives -1.
//
// argmax_f32: arguments x, out (i32 [rows]), n (row length). One block per row (grid-stride over
// rows), blockDim.x a multiple of 32 up to 1024; warp shuffles, then one warp over the warps'
// winners (am_row).
//
// argmax_advance_f32: the same search over one row x [n], by one block; then, with s = inputs[0]
// (the step's position), ring[s % R] = the index, and inputs ([step, tokens[B], positions[B]])
// advanced to the next greedy step: inputs[0] = s + 1, inputs[1] = the index (0 for -1),
// inputs[1 + B] = s + 1. Arguments: x, ring (i32 [R]), inputs (i32 [1 + 2B]), n. An s outside
// 0..2^31 - 1 is a kernel error (nothing is written).

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

// The best candidate of a warp's lanes (am_better's order), left in every lane.
__device__ __forceinline__ void am_warp_best(float& bv, int& bi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(ONEPASS_FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(ONEPASS_FULL_MASK, bi, o);
        if (am_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

// The index of the largest value of the row [n] at `row`, searched by the whole block (blockDim.x
// a multiple of 32 up to 1024; every thread must call it), valid in thread 0 only: -1 when the
// largest value is not finite or the row holds only NaN. Its shared slots are written only after
// a barrier, so a block may call it again for its next row.
__device__ __forceinline__ int am_row(const float* row, uint32_t n) {
    __shared__ float warp_v[32];
    __shared__ int warp_i[32];
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
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
    am_warp_best(bv, bi);
    __syncthreads();
    if (lane == 0) {
        warp_v[warp] = bv;
        warp_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < warps ? warp_v[lane] : 0.0f;
        bi = lane < warps ? warp_i[lane] : -1;
        am_warp_best(bv, bi);
    }
    return (bi < 0 || !isfinite(bv)) ? -1 : bi;
}

extern "C" __global__ void argmax_f32(const float* x, int32_t* out, uint32_t n, uint64_t n_x,
                                      uint64_t n_out) {
    OP_GRID_ENTRY();
    if (n == 0 || n_x != n_out * n || blockDim.x > 1024 || blockDim.x % 32 != 0) return;
    OP_ROW_LOOP(r, n_out) {
        const int id = am_row(x + r * n, n);
        if (threadIdx.x == 0) out[r] = id;
    }
}

extern "C" __global__ void argmax_advance_f32(const float* x, int32_t* ring, int32_t* inputs,
                                              uint32_t n, uint64_t n_x, uint64_t n_ring,
                                              uint64_t n_inputs) {
    OP_GRID_ENTRY();
    const uint32_t tag = op_tag("argmax_advance_f32");
    OP_REQUIRE(n != 0 && n_x == n && n_ring != 0 && n_inputs >= 3 && n_inputs % 2 == 1 &&
               blockDim.x <= 1024 && blockDim.x % 32 == 0);
    // One row, one block: another block would read inputs[0] while this one advances it.
    if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) return;
    const int id = am_row(x, n);
    if (threadIdx.x != 0) return;
    const int32_t s = inputs[0];
    // A position that is negative or has no i32 successor: reported as a pass of one row that
    // does not fit in 2^31 - 1 positions (fault.rs), and nothing written.
    if (s < 0 || s == 0x7fffffff) {
        op_fail(tag, OP_ERR_POS0, s, 0x7fffffffu, 1);
        return;
    }
    const int32_t next = s + 1;
    ring[(uint64_t)s % n_ring] = id;
    inputs[0] = next;
    inputs[1] = id < 0 ? 0 : id;
    inputs[1 + n_inputs / 2] = next;
}
