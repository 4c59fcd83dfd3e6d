// The row-invariant products of a batched decode step (compiled after matmul.cu, in its family;
// src/ops/matmul_rows.rs says why): out[r, o] = x[r] . W[o] in the warp form for every row count,
// one warp per output value and group of MM_ROWS rows. Each row's sum runs in its lanes' order
// whatever the group holds (the other rows only share the weight loads), so a row gets the same
// bits in a batch of 1, 8 or 32; never the one-row vector form or the tiled form, whose orders
// differ. Arguments as matmul_<w>: x, w, out, rows, k, n.

template <int FMT>
__device__ void matmul_rows(const float* xp, const uint8_t* w, float* out, uint32_t rows,
                            uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_out == (uint64_t)rows * n);
    const XPlain x{xp};
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    const bool blocks = mm_blocks_ok<FMT>(x, w, k);
    const uint64_t groups = ((uint64_t)rows + MM_ROWS - 1) / MM_ROWS;
    for (uint64_t t = mm_warp_id(); t < groups * n; t += mm_warp_count()) {
        const uint64_t r0 = t / n * MM_ROWS, o = t % n;
        const int nr = (int)min((uint64_t)MM_ROWS, (uint64_t)rows - r0);
        XPlain xs[MM_ROWS];
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r) xs[r] = x.row((r0 + (r < nr ? r : 0)) * k);
        float acc[MM_ROWS];
        mm_dots<FMT>(xs, nr, w + o * row_bytes, k, lane, blocks, acc);
        if (lane != 0) continue;
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r)
            if (r < nr) out[(r0 + r) * n + o] = acc[r];
    }
}

#define MATMUL_ROWS_KERNEL(NAME, FMT)                                                               \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, float* out, uint32_t rows,      \
                                    uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_w,               \
                                    uint64_t n_out) {                                                 \
        matmul_rows<FMT>(x, w, out, rows, k, n, n_x, n_out, op_tag(#NAME));                          \
    }

MATMUL_ROWS_KERNEL(matmul_rows_f32, OP_FMT_F32)
MATMUL_ROWS_KERNEL(matmul_rows_f16, OP_FMT_F16)
MATMUL_ROWS_KERNEL(matmul_rows_bf16, OP_FMT_BF16)
MATMUL_ROWS_KERNEL(matmul_rows_q4_0, OP_FMT_Q4_0)
MATMUL_ROWS_KERNEL(matmul_rows_q4_1, OP_FMT_Q4_1)
MATMUL_ROWS_KERNEL(matmul_rows_q5_0, OP_FMT_Q5_0)
MATMUL_ROWS_KERNEL(matmul_rows_q8_0, OP_FMT_Q8_0)
MATMUL_ROWS_KERNEL(matmul_rows_q4_k, OP_FMT_Q4_K)
MATMUL_ROWS_KERNEL(matmul_rows_q6_k, OP_FMT_Q6_K)
