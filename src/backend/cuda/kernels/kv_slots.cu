// The slotted KV writes of a batched decode step (compiled after kv_cache.cu, in its family), as
// the CPU kernels (src/backend/cpu/kernels/kv_slots.rs): row r of new (f32 [rows, n_kv_head *
// head_dim]) goes to slot slots[r] at position positions[r] of a cache [slots, n_kv_head,
// slot_ctx, head_dim]. Arguments: new, slots, positions, cache, n_kv_head, head_dim, slot_ctx.
// A slot or position outside the cache is a kernel error; every thread checks the rows it
// writes, and a row that fails is not written (the other rows may be). Grid-stride over the new
// elements.

template <typename C>
__device__ void kv_write_slots(const float* src, const int32_t* slots, const int32_t* positions,
                               C* cache, uint32_t n_kv_head, uint32_t head_dim, uint32_t slot_ctx,
                               uint64_t n_new, uint64_t n_slots, uint64_t n_positions,
                               uint64_t n_cache, uint32_t tag) {
    const uint64_t row_len = (uint64_t)n_kv_head * head_dim;
    const uint64_t slot_len = row_len * slot_ctx;
    OP_REQUIRE(row_len != 0 && slot_len != 0 && n_new % row_len == 0 &&
               n_slots == n_new / row_len && n_positions == n_slots && n_cache % slot_len == 0);
    const uint64_t cache_slots = n_cache / slot_len;
    OP_GRID_STRIDE_LOOP(i, n_new) {
        const uint64_t r = i / row_len, rem = i % row_len;
        const uint64_t h = rem / head_dim, d = rem % head_dim;
        const int64_t s = slots[r], p = positions[r];
        if (s < 0 || (uint64_t)s >= cache_slots) {
            if (rem == 0) op_fail(tag, OP_ERR_SLOT_ROW, s, cache_slots, r);
            continue;
        }
        if (p < 0 || (uint64_t)p >= slot_ctx) {
            if (rem == 0) op_fail(tag, OP_ERR_SLOT_ROW, p, slot_ctx, r);
            continue;
        }
        op_store(cache, (long)((uint64_t)s * slot_len + (h * slot_ctx + (uint64_t)p) * head_dim + d),
                 src[i]);
    }
}

#define KV_WRITE_SLOTS_KERNEL(NAME, C)                                                              \
    extern "C" __global__ void NAME(const float* src, const int32_t* slots,                          \
                                    const int32_t* positions, C* cache, uint32_t n_kv_head,           \
                                    uint32_t head_dim, uint32_t slot_ctx, uint64_t n_new,             \
                                    uint64_t n_slots, uint64_t n_positions, uint64_t n_cache) {       \
        OP_GRID_ENTRY();                                                                              \
        kv_write_slots<C>(src, slots, positions, cache, n_kv_head, head_dim, slot_ctx, n_new,         \
                          n_slots, n_positions, n_cache, op_tag(#NAME));                              \
    }

KV_WRITE_SLOTS_KERNEL(kv_write_slots_f32, float)
KV_WRITE_SLOTS_KERNEL(kv_write_slots_f16, __half)
