// The `kv_cache` family: new K or V rows (f32 [rows, n_kv_head * head_dim]) written into a cache
// [n_kv_head, max_ctx, head_dim] at pos0 = step[0], as the CPU kernels
// (src/backend/cpu/kernels/kv_cache.rs). A pos0 outside 0..=max_ctx - rows is a kernel error
// (nothing is written). Arguments: new, step, cache, n_kv_head, head_dim. Grid-stride over the
// new elements.

template <typename C>
__device__ void kv_write(const float* src, const int32_t* step, C* cache, uint32_t n_kv_head,
                         uint32_t head_dim, uint64_t n_new, uint64_t n_step, uint64_t n_cache,
                         uint32_t tag) {
    const uint64_t row_len = (uint64_t)n_kv_head * head_dim;
    OP_REQUIRE(row_len != 0 && n_step != 0 && n_new % row_len == 0 && n_cache % row_len == 0);
    const uint64_t rows = n_new / row_len, max_ctx = n_cache / row_len;
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + rows > max_ctx) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, rows);
        return;
    }
    OP_GRID_STRIDE_LOOP(i, n_new) {
        const uint64_t r = i / row_len, rem = i % row_len;
        const uint64_t h = rem / head_dim, d = rem % head_dim;
        op_store(cache, (long)((h * max_ctx + (uint64_t)pos0 + r) * head_dim + d), src[i]);
    }
}

#define KV_WRITE_KERNEL(NAME, C)                                                                    \
    extern "C" __global__ void NAME(const float* src, const int32_t* step, C* cache,                 \
                                    uint32_t n_kv_head, uint32_t head_dim, uint64_t n_new,            \
                                    uint64_t n_step, uint64_t n_cache) {                              \
        OP_GRID_ENTRY();                                                                              \
        kv_write<C>(src, step, cache, n_kv_head, head_dim, n_new, n_step, n_cache, op_tag(#NAME));    \
    }

KV_WRITE_KERNEL(kv_write_f32_f32, float)
KV_WRITE_KERNEL(kv_write_f32_f16, __half)
KV_WRITE_KERNEL(kv_write_f32_bf16, __nv_bfloat16)
