// The slotted decode attention of a batched decode step (compiled after attention.cu, in its
// family), as the CPU kernels (src/backend/cpu/kernels/attention_slots.rs): row r attends over
// the first positions[r] + 1 keys of slot slots[r] of caches [slots, n_kv_head, slot_ctx,
// head_dim] (the window's part of them with a window). Arguments: q, k, v, slots, positions,
// partials, out, n_head, n_kv_head, head_dim, slot_ctx, scale, softcap, window, chunk_len,
// max_chunks.
// Each row does what the one-launch `attention_decode_<t>` does for one row over its slot, with
// its own region of the scratch (the one-row layout: records, then n_head counters): one block
// per (live chunk, head) item of the row (blocks along x loop over the items, along y over the
// rows), the same fold of a chunk's keys, and the block that takes the last ticket of a head
// merges the head (with one block per head, that block merges its own records, no tickets). A
// row's bits therefore never depend on the other rows.

template <typename T>
__device__ void attention_slots(const float* q, const T* k, const T* v, const int32_t* slots,
                                const int32_t* positions, float* partials, float* out,
                                uint32_t n_head, uint32_t n_kv_head, uint32_t hd,
                                uint32_t slot_ctx, float scale, float softcap, uint32_t window,
                                uint32_t chunk_len, uint32_t max_chunks, uint64_t n_q,
                                uint64_t n_k, uint64_t n_v, uint64_t n_slots, uint64_t n_positions,
                                uint64_t n_partials, uint64_t n_out, uint32_t tag) {
    __shared__ float qs[ATTN_MAX_HD];
    __shared__ float ps[ATTN_MAX_TILE];
    __shared__ float vsum[4 * ATTN_MAX_TILE];
    __shared__ uint32_t last;
    const uint64_t records = (uint64_t)max_chunks * n_head * (hd + 2);
    const uint64_t region = records + n_head;
    const uint64_t width = (uint64_t)n_head * hd;
    const uint64_t slot_len = (uint64_t)n_kv_head * slot_ctx * hd;
    OP_REQUIRE(n_head != 0 && n_kv_head != 0 && hd != 0 && hd <= ATTN_MAX_HD &&
               n_head % n_kv_head == 0 && blockDim.x <= ATTN_MAX_TILE && hd <= ATTN_ACC * blockDim.x &&
               slot_ctx != 0 && chunk_len != 0 && n_k == n_v && n_k % slot_len == 0 &&
               n_q == n_slots * width && n_positions == n_slots && n_out == n_q &&
               n_partials == n_slots * region);
    const uint64_t cache_slots = n_k / slot_len;
    const uint32_t group = n_head / n_kv_head;
    for (uint64_t row = blockIdx.y; row < n_slots; row += gridDim.y) {
        const int64_t s = slots[row], pos0 = positions[row];
        if (s < 0 || (uint64_t)s >= cache_slots) {
            if (blockIdx.x == 0 && threadIdx.x == 0) op_fail(tag, OP_ERR_SLOT_ROW, s, cache_slots, row);
            continue;
        }
        if (pos0 < 0 || (uint64_t)pos0 >= slot_ctx) {
            if (blockIdx.x == 0 && threadIdx.x == 0) op_fail(tag, OP_ERR_SLOT_ROW, pos0, slot_ctx, row);
            continue;
        }
        const uint64_t kv_len = (uint64_t)pos0 + 1, lo = attn_first_key((uint64_t)pos0, window);
        uint64_t first, chunks;
        attn_live_chunks((uint64_t)pos0, window, chunk_len, first, chunks);
        if (chunks > max_chunks) {
            if (blockIdx.x == 0 && threadIdx.x == 0)
                op_fail(tag, OP_ERR_CHUNKS, (int64_t)kv_len, max_chunks, chunk_len);
            continue;
        }
        const uint64_t live = chunks - first;
        const float* q_row = q + row * width;
        float* part = partials + row * region;
        float* out_row = out + row * width;
        const T* k_slot = k + (uint64_t)s * slot_len;
        const T* v_slot = v + (uint64_t)s * slot_len;
        // With one block per head (gridDim.x == n_head), a block folds every chunk of its head
        // and merges them itself, without tickets: the same records and the same merge.
        const bool owner = gridDim.x == n_head;
        for (uint64_t item = blockIdx.x; item < live * n_head; item += gridDim.x) {
            const uint64_t chunk = first + item / n_head;
            const uint32_t h = (uint32_t)(item % n_head), kv = h / group;
            attn_chunk_record<T>(q_row, k_slot, v_slot, slot_ctx, h, kv, hd, chunk, chunk_len, lo,
                                 kv_len, n_head, scale, softcap, qs, ps, vsum, part);
            if (owner) continue;
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) {
                uint32_t* counter = (uint32_t*)(part + records) + h;
                const uint32_t ticket = atomicAdd(counter, 1u);
                last = ticket + 1 == live;
                if (ticket >= live) op_fail(tag, OP_ERR_SCRATCH, ticket, live, h);
                if (last) *counter = 0;
            }
            __syncthreads();
            if (last) {
                __threadfence();
                attn_combine_head(part + first * n_head * (hd + 2), live, n_head, h, hd, out_row);
            }
        }
        if (owner && blockIdx.x < n_head) {
            __threadfence_block();
            __syncthreads();
            attn_combine_head(part + first * n_head * (hd + 2), live, n_head, blockIdx.x, hd, out_row);
            __syncthreads();
        }
    }
}

#define ATTENTION_SLOTS_KERNEL(NAME, T)                                                             \
    extern "C" __global__ void NAME(const float* q, const T* k, const T* v, const int32_t* slots,     \
                                    const int32_t* positions, float* partials, float* out,            \
                                    uint32_t n_head, uint32_t n_kv_head, uint32_t hd,                 \
                                    uint32_t slot_ctx, float scale, float softcap, uint32_t window,   \
                                    uint32_t chunk_len, uint32_t max_chunks, uint64_t n_q,            \
                                    uint64_t n_k, uint64_t n_v, uint64_t n_slots,                     \
                                    uint64_t n_positions, uint64_t n_partials, uint64_t n_out) {      \
        OP_GRID_ENTRY();                                                                              \
        attention_slots<T>(q, k, v, slots, positions, partials, out, n_head, n_kv_head, hd,           \
                           slot_ctx, scale, softcap, window, chunk_len, max_chunks, n_q, n_k, n_v,    \
                           n_slots, n_positions, n_partials, n_out, op_tag(#NAME));                   \
    }

ATTENTION_SLOTS_KERNEL(attention_slots_f32, float)
ATTENTION_SLOTS_KERNEL(attention_slots_f16, __half)
