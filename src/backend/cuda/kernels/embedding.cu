// The `embedding` family: rows of a table (any float or GGML format) gathered by i32 token id and
// dequantized to f32, as the CPU kernels (src/backend/cpu/kernels/embedding.rs). Arguments:
// table [vocab, dim], ids [rows], out f32 [rows, dim], vocab, dim. An id outside 0..vocab is a
// kernel error (its row is not written). Grid-stride over output elements.

template <int FMT>
__device__ void embedding(const uint8_t* table, const int32_t* ids, float* out, uint32_t vocab,
                          uint32_t dim, uint64_t n_table, uint64_t n_ids, uint64_t n_out,
                          uint32_t tag) {
    OP_REQUIRE(n_table == (uint64_t)vocab * dim);
    OP_REQUIRE(dim != 0 && n_out == n_ids * dim && dim % op_block_elems(FMT) == 0);
    const uint64_t row_bytes = op_row_bytes(FMT, dim);
    OP_GRID_STRIDE_LOOP(i, n_out) {
        const uint64_t r = i / dim;
        const uint32_t c = (uint32_t)(i % dim);
        const int32_t id = ids[r];
        if (id < 0 || (uint32_t)id >= vocab) {
            if (c == 0) op_fail(tag, OP_ERR_TOKEN_ID, id, vocab, r);
            continue;
        }
        out[i] = op_weight<FMT>(table + (uint64_t)id * row_bytes, c);
    }
}

#define EMBEDDING_KERNEL(NAME, FMT)                                                                 \
    extern "C" __global__ void NAME(const uint8_t* table, const int32_t* ids, float* out,            \
                                    uint32_t vocab, uint32_t dim, uint64_t n_table, uint64_t n_ids,   \
                                    uint64_t n_out) {                                                 \
        OP_GRID_ENTRY();                                                                              \
        embedding<FMT>(table, ids, out, vocab, dim, n_table, n_ids, n_out, op_tag(#NAME));            \
    }

EMBEDDING_KERNEL(embedding_f32, OP_FMT_F32)
EMBEDDING_KERNEL(embedding_f16, OP_FMT_F16)
EMBEDDING_KERNEL(embedding_bf16, OP_FMT_BF16)
EMBEDDING_KERNEL(embedding_q4_0, OP_FMT_Q4_0)
EMBEDDING_KERNEL(embedding_q4_1, OP_FMT_Q4_1)
EMBEDDING_KERNEL(embedding_q5_0, OP_FMT_Q5_0)
EMBEDDING_KERNEL(embedding_q8_0, OP_FMT_Q8_0)
EMBEDDING_KERNEL(embedding_q4_k, OP_FMT_Q4_K)
EMBEDDING_KERNEL(embedding_q6_k, OP_FMT_Q6_K)
