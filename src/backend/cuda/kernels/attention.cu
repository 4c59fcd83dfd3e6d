// The `attention` family: causal scaled dot-product attention of f32 query rows against one
// layer's KV cache [n_kv_head, max_ctx, head_dim] (f32 or f16), grouped-query heads, optional
// softcap (0 = off), optional sliding window (0 = off: the query at position i sees keys
// i + 1 - window ..= i), pos0 read from the step buffer at run time. Same arguments as the CPU
// kernels (src/backend/cpu/kernels/attention.rs):
//   attention_<t>:                q, k, v, step, out, n_head, n_kv_head, head_dim, scale, softcap,
//                                 window
//   attention_decode_partial_<t>: q, k, v, step, partials, n_head, n_kv_head, head_dim, scale,
//                                 softcap, window, chunk_len, max_chunks
//   attention_decode_combine:     partials, step, out, n_head, head_dim, chunk_len, max_chunks,
//                                 window
//   attention_decode_<t>:         q, k, v, step, partials, out, then the partial's scalars: both
//                                 passes in one launch (CUDA only; attention_decode.cu, which
//                                 falls back to `attention_partial` for other head sizes)
// Partial records are [max, sum, acc[head_dim]] laid out [max_chunks, n_head, head_dim + 2]; the
// one-launch form keeps n_head u32 counters after them. With a window, only the chunks holding a
// key of it (`attn_live_chunks`) are computed and combined; the others' records are untouched.
// One block per (row or chunk, head), keys in tiles of ATTN_MAX_TILE with an online softmax.
// Limits: head_dim <= 256, blockDim.x <= 256 and a multiple of 32.

#define ATTN_MAX_HD 256
#define ATTN_MAX_TILE 256
#define ATTN_ACC 8  // head_dim <= ATTN_ACC * blockDim.x

// `attn_first_key` (the first key a query sees) is in attention_mma.cuh, compiled in front.

// The chunks of a decode step at position pos0 that hold a key the query sees: first..chunks.
__device__ __forceinline__ void attn_live_chunks(uint64_t pos0, uint32_t window, uint32_t chunk_len,
                                                 uint64_t& first, uint64_t& chunks) {
    first = attn_first_key(pos0, window) / chunk_len;
    chunks = (pos0 + chunk_len) / chunk_len;
}

// Sums a score over the eight lanes that share a key (every lane of the warp calls it) and stores
// the scaled, optionally soft-capped score of key j of the tile.
__device__ __forceinline__ void attn_store_score(float d, uint32_t sub, uint32_t j, uint32_t n,
                                                 float scale, float softcap, float* ps) {
    d += __shfl_xor_sync(ONEPASS_FULL_MASK, d, 1);
    d += __shfl_xor_sync(ONEPASS_FULL_MASK, d, 2);
    d += __shfl_xor_sync(ONEPASS_FULL_MASK, d, 4);
    if (sub == 0 && j < n) {
        float s = d * scale;
        if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
        ps[j] = s;
    }
}

// The online-softmax step of one tile: turns the n scores in `ps` into exponentials against the
// new running maximum, updates (m, l), and returns the factor that rescales earlier V sums.
// Every thread of the block calls it (it begins and ends with a barrier).
__device__ __forceinline__ float attn_tile_softmax(float* ps, uint32_t n, float& m, float& l) {
    const uint32_t lane = threadIdx.x & 31;
    __syncthreads();
    float tile_max = -__int_as_float(0x7f800000);
    for (uint32_t j = lane; j < n; j += 32) tile_max = fmaxf(tile_max, ps[j]);
    tile_max = op_warp_max(tile_max);
    const float new_max = fmaxf(m, tile_max);
    const float c = expf(m - new_max);
    __syncthreads();
    for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) ps[j] = expf(ps[j] - new_max);
    __syncthreads();
    float tile_sum = 0.0f;
    for (uint32_t j = lane; j < n; j += 32) tile_sum += ps[j];
    l = l * c + op_warp_sum(tile_sum);
    m = new_max;
    return c;
}

// Sums the key groups' V sums, stored side by side in `vsum`, into vsum[0..hd): thread dd reads
// and writes only indices dd + g * hd. Every thread of the block calls it.
__device__ __forceinline__ void attn_sum_groups(float* vsum, uint32_t hd, uint32_t groups) {
    __syncthreads();
    for (uint32_t dd = threadIdx.x; dd < hd; dd += blockDim.x) {
        float t = vsum[dd];
        for (uint32_t g = 1; g < groups; g++) t += vsum[g * hd + dd];
        vsum[dd] = t;
    }
    __syncthreads();
}

// Folds keys [begin, end) of one KV head slab into the online softmax state (m, l) and the
// V sum, for the query vector in `qs`, in tiles of up to ATTN_MAX_TILE keys. Scores: eight lanes
// share a key (four keys per warp at a time, a key row read as coalesced 32-byte pieces), the
// tile's exponentials go to `ps`. V: a thread owns dimension d0 (+ j * span) for one group of
// keys (key index = group mod groups), so every thread loads V while the tile is short.
// At the end, `vsum[0..hd)` (shared, at least ATTN_MAX_TILE floats) holds the V sum. Every
// thread of the block calls it.
template <typename T>
__device__ void attn_fold(const float* qs, const T* k, const T* v, uint32_t hd, uint64_t begin,
                          uint64_t end, float scale, float softcap, float* ps, float* vsum,
                          float& m, float& l) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const uint32_t sub = lane & 7, slot = lane >> 3;
    const uint32_t span = hd < blockDim.x ? hd : blockDim.x, groups = blockDim.x / span;
    const uint32_t d0 = threadIdx.x % span, kg = threadIdx.x / span;
    float acc[ATTN_ACC];
    for (int j = 0; j < ATTN_ACC; j++) acc[j] = 0.0f;
    for (uint64_t tile = begin; tile < end; tile += ATTN_MAX_TILE) {
        const uint32_t n = (uint32_t)(end - tile < ATTN_MAX_TILE ? end - tile : ATTN_MAX_TILE);
        for (uint32_t j0 = warp * 4; j0 < n; j0 += warps * 4) {
            const uint32_t j = j0 + slot;
            float d = 0.0f;
            if (j < n) {
                const T* kr = k + (tile + j) * hd;
                for (uint32_t i = sub; i < hd; i += 8) d += qs[i] * op_load(kr, i);
            }
            attn_store_score(d, sub, j, n, scale, softcap, ps);
        }
        const float c = attn_tile_softmax(ps, n, m, l);
        if (kg < groups) {
            for (uint32_t j = 0; j < ATTN_ACC; j++) {
                const uint32_t dd = d0 + j * span;
                if (dd >= hd) break;
                const T* vt = v + tile * hd + dd;
                float a = acc[j] * c;
                for (uint32_t tt = kg; tt < n; tt += groups) a += ps[tt] * op_load(vt, (long)tt * hd);
                acc[j] = a;
            }
        }
        __syncthreads();
    }
    // Each key group's sums side by side (groups * hd <= max(blockDim, hd) <= ATTN_MAX_TILE).
    if (kg < groups) {
        for (uint32_t j = 0; j < ATTN_ACC; j++) {
            const uint32_t dd = d0 + j * span;
            if (dd >= hd) break;
            vsum[kg * hd + dd] = acc[j];
        }
    }
    attn_sum_groups(vsum, hd, groups);
}

// Four consecutive cache values as f32 (16-byte aligned f32, 8-byte aligned f16).
__device__ __forceinline__ float4 attn_load4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ float4 attn_load4(const __half* p) {
    const uint2 u = *(const uint2*)p;
    const float2 a = __half22float2(*(const __half2*)&u.x);
    const float2 b = __half22float2(*(const __half2*)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

// Whether `attn_fold_vec` applies: heads a multiple of 32 values, a key row's four-value pieces
// spread over at most the block, and caches aligned for four-value loads.
template <typename T>
__device__ __forceinline__ bool attn_vec_ok(const T* k, const T* v, uint32_t hd) {
    return hd % 32 == 0 && hd / 4 <= blockDim.x &&
           (((uint64_t)k | (uint64_t)v) & (4 * sizeof(T) - 1)) == 0;
}

// `attn_fold` with four-value loads: a scoring lane reads pieces 4 * sub + 32 j of the key row,
// and a V thread owns four dimensions for one of blockDim / (hd / 4) key groups, so each thread
// has only a few independent loads per tile. `vsum` holds 4 * blockDim floats.
template <typename T>
__device__ void attn_fold_vec(const float* qs, const T* k, const T* v, uint32_t hd,
                              uint64_t begin, uint64_t end, float scale, float softcap, float* ps,
                              float* vsum, float& m, float& l) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const uint32_t sub = lane & 7, slot = lane >> 3;
    const uint32_t span = hd / 4, groups = blockDim.x / span;
    const uint32_t d4 = threadIdx.x % span, kg = threadIdx.x / span;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (uint64_t tile = begin; tile < end; tile += ATTN_MAX_TILE) {
        const uint32_t n = (uint32_t)(end - tile < ATTN_MAX_TILE ? end - tile : ATTN_MAX_TILE);
        for (uint32_t j0 = warp * 4; j0 < n; j0 += warps * 4) {
            const uint32_t j = j0 + slot;
            float d = 0.0f;
            if (j < n) {
                const T* kr = k + (tile + j) * hd;
#pragma unroll 4
                for (uint32_t i = 4 * sub; i < hd; i += 32) {
                    const float4 kk = attn_load4(kr + i);
                    d += qs[i] * kk.x + qs[i + 1] * kk.y + qs[i + 2] * kk.z + qs[i + 3] * kk.w;
                }
            }
            attn_store_score(d, sub, j, n, scale, softcap, ps);
        }
        const float c = attn_tile_softmax(ps, n, m, l);
        if (kg < groups) {
            float4 a = make_float4(acc.x * c, acc.y * c, acc.z * c, acc.w * c);
            const T* vt = v + tile * hd + 4 * d4;
#pragma unroll 4
            for (uint32_t tt = kg; tt < n; tt += groups) {
                const float4 vv = attn_load4(vt + (uint64_t)tt * hd);
                const float p = ps[tt];
                a.x += p * vv.x;
                a.y += p * vv.y;
                a.z += p * vv.z;
                a.w += p * vv.w;
            }
            acc = a;
        }
        __syncthreads();
    }
    if (kg < groups) {
        float* dst = vsum + kg * hd + 4 * d4;
        dst[0] = acc.x;
        dst[1] = acc.y;
        dst[2] = acc.z;
        dst[3] = acc.w;
    }
    attn_sum_groups(vsum, hd, groups);
}

// With MMA (the `attention_mma_<t>` kernels), a launch of the tensor-core form's shape takes it;
// the plain kernels do not compile it in (it would raise their register count). O: the output's
// type (f32, or f16 for the narrowed `attention_mma_<t>_to_f16`: the f32 values rounded).
template <typename T, bool MMA, typename O>
__device__ void attention_prefill(const float* q, const T* k, const T* v, const int32_t* step,
                                  O* out, uint32_t n_head, uint32_t n_kv_head, uint32_t hd,
                                  float scale, float softcap, uint32_t window, uint64_t n_q,
                                  uint64_t n_k, uint64_t n_v, uint64_t n_step, uint64_t n_out,
                                  uint32_t tag) {
    __shared__ float qs[ATTN_MAX_HD];
    __shared__ float ps[ATTN_MAX_TILE];
    __shared__ float vsum[4 * ATTN_MAX_TILE];
    OP_REQUIRE(n_head != 0 && n_kv_head != 0 && hd != 0 && hd <= ATTN_MAX_HD &&
               n_head % n_kv_head == 0 && blockDim.x <= ATTN_MAX_TILE && hd <= ATTN_ACC * blockDim.x &&
               n_step != 0 && n_k == n_v && n_q == n_out && n_q % ((uint64_t)n_head * hd) == 0 &&
               n_k % ((uint64_t)n_kv_head * hd) == 0);
    const uint64_t rows = n_q / ((uint64_t)n_head * hd);
    const uint64_t max_ctx = n_k / ((uint64_t)n_kv_head * hd);
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + rows > max_ctx) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, rows);
        return;
    }
    const uint32_t group = n_head / n_kv_head;
    if (MMA && attn_mma_ok(hd)) {
        if (hd == 64)
            attention_mma<T, 64, O>(q, k, v, out, rows, max_ctx, pos0, n_head, n_kv_head, scale,
                                 softcap, window);
        else
            attention_mma<T, 128, O>(q, k, v, out, rows, max_ctx, pos0, n_head, n_kv_head, scale,
                                  softcap, window);
        return;
    }
    OP_ROW_LOOP(item, rows * n_head) {
        const uint64_t r = item / n_head;
        const uint32_t h = (uint32_t)(item % n_head), kv = h / group;
        const float* qh = q + item * hd;
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qh[i];
        __syncthreads();
        float m = -__int_as_float(0x7f800000), l = 0.0f;
        const T* ks = k + (uint64_t)kv * max_ctx * hd;
        const T* vs = v + (uint64_t)kv * max_ctx * hd;
        const uint64_t pos = (uint64_t)pos0 + r, lo = attn_first_key(pos, window);
        if (attn_vec_ok(ks, vs, hd))
            attn_fold_vec<T>(qs, ks, vs, hd, lo, pos + 1, scale, softcap, ps, vsum, m, l);
        else
            attn_fold<T>(qs, ks, vs, hd, lo, pos + 1, scale, softcap, ps, vsum, m, l);
        const float inv = 1.0f / l;
        for (uint32_t dd = threadIdx.x; dd < hd; dd += blockDim.x)
            op_store(out, (long)(item * hd + dd), vsum[dd] * inv);
    }
}

// Merges the records of `chunks` chunks of head h, starting at `partials` (the records of the
// first live chunk), into out[h * hd ..]. Every thread of the block calls it (blockDim.x a
// multiple of 32): each warp finds the maximum and the weighted sum with its lanes over the
// chunks, then each thread sums its dimensions over the chunks, the loads of several chunks in
// flight. Loads go through L2 (`__ldcg`): in the one-launch kernel, other
// blocks wrote the records.
__device__ void attn_combine_head(const float* partials, uint64_t chunks, uint32_t n_head,
                                  uint32_t h, uint32_t hd, float* out) {
    const uint32_t rec = hd + 2, lane = threadIdx.x & 31;
    const float* first = partials + (uint64_t)h * rec;
    const uint64_t stride = (uint64_t)n_head * rec;
    float mx = -__int_as_float(0x7f800000);
    for (uint64_t c = lane; c < chunks; c += 32) mx = fmaxf(mx, __ldcg(first + c * stride));
    mx = op_warp_max(mx);
    float total = 0.0f;
    for (uint64_t c = lane; c < chunks; c += 32) {
        const float* r = first + c * stride;
        total += expf(__ldcg(r) - mx) * __ldcg(r + 1);
    }
    const float inv = 1.0f / op_warp_sum(total);
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll 8
        for (uint64_t c = 0; c < chunks; c++) {
            const float* r = first + c * stride;
            o += expf(__ldcg(r) - mx) * __ldcg(r + 2 + d);
        }
        out[(uint64_t)h * hd + d] = o * inv;
    }
}

// The partial record of chunk `chunk` and head h of one query row `q_row` ([n_head * hd]) over a
// cache `k`, `v` of `ctx` positions a KV head: keys [max(chunk start, lo), min(chunk end, kv_len))
// folded into (max, sum, V sum) at `partials` + (chunk * n_head + h) * (hd + 2). Shared by the
// one-row decode attention and the slotted one of a batched step, so both compute the same bits.
// Every thread of the block calls it (`qs`, `ps`, `vsum` are the block's shared buffers).
template <typename T>
__device__ __forceinline__ void attn_chunk_record(const float* q_row, const T* k, const T* v,
                                                  uint64_t ctx, uint32_t h, uint32_t kv, uint32_t hd,
                                                  uint64_t chunk, uint32_t chunk_len, uint64_t lo,
                                                  uint64_t kv_len, uint32_t n_head, float scale,
                                                  float softcap, float* qs, float* ps, float* vsum,
                                                  float* partials) {
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q_row[(uint64_t)h * hd + i];
    __syncthreads();
    float m = -__int_as_float(0x7f800000), l = 0.0f;
    const uint64_t begin = chunk * chunk_len > lo ? chunk * chunk_len : lo;
    const uint64_t end = (chunk + 1) * chunk_len < kv_len ? (chunk + 1) * chunk_len : kv_len;
    const T* ks = k + (uint64_t)kv * ctx * hd;
    const T* vs = v + (uint64_t)kv * ctx * hd;
    if (attn_vec_ok(ks, vs, hd))
        attn_fold_vec<T>(qs, ks, vs, hd, begin, end, scale, softcap, ps, vsum, m, l);
    else
        attn_fold<T>(qs, ks, vs, hd, begin, end, scale, softcap, ps, vsum, m, l);
    float* rec = partials + (chunk * n_head + h) * (hd + 2);
    if (threadIdx.x == 0) {
        rec[0] = m;
        rec[1] = l;
    }
    for (uint32_t dd = threadIdx.x; dd < hd; dd += blockDim.x) rec[2 + dd] = vsum[dd];
}

// The ticket of a block that has written its record (every thread calls it): after the block's
// barrier, thread 0 takes a ticket from `counter` (zero between launches) with one acquire-release
// atomic at GPU scope, which publishes the records the barrier ordered before it and, in the last
// block, makes the others' visible to the threads the next barrier orders after it; true, for
// every thread of the block, in the block that takes the last of `expected` tickets, which resets
// the counter. A ticket at or past `expected` (a scratch that was not zeroed, or shared with
// something else) is a kernel error naming `what`. (Below sm_70, without scoped atomics, every
// thread fences before the barrier and the last block after it: on an H100 that form made the
// decode step up to 2.7% longer, docs/kernels.md item 27.)
__device__ __forceinline__ bool attn_last_ticket(uint32_t* counter, uint64_t expected, uint64_t what,
                                                 uint32_t tag) {
    __shared__ uint32_t last;
#if __CUDA_ARCH__ < 700
    __threadfence();
#endif
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t ticket;
#if __CUDA_ARCH__ >= 700
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                     : "=r"(ticket)
                     : "l"(counter)
                     : "memory");
#else
        ticket = atomicAdd(counter, 1u);
#endif
        last = ticket + 1 == expected;
        if (ticket >= expected) op_fail(tag, OP_ERR_SCRATCH, ticket, expected, what);
        if (last) *counter = 0;
    }
    __syncthreads();
    const bool mine = last != 0;
    // Every thread has read `last` before a later call's thread 0 writes it again.
    __syncthreads();
#if __CUDA_ARCH__ < 700
    if (mine) __threadfence();
#endif
    return mine;
}

// The partial pass; with `out`, also the combine, in one launch: after writing its record, a
// block takes a ticket from its head's counter (u32 words after the records, zero between
// launches); the block that takes the last ticket resets the counter and merges the head's
// records into `out`. A counter found at or past the live chunk count is a kernel error (a
// scratch that was not zeroed, or shared with something else). Work items are the (live chunk,
// head) pairs: with a window, the chunks before the one holding the window's first key are
// skipped (their records neither written nor read), and that chunk is masked (its keys start at
// the first key), so a step costs O(window) whatever pos0; the grid needs only
// ceil(window / chunk_len) + 1 chunks' blocks.
template <typename T>
__device__ void attention_partial(const float* q, const T* k, const T* v, const int32_t* step,
                                  float* partials, float* out, uint32_t n_head, uint32_t n_kv_head,
                                  uint32_t hd, float scale, float softcap, uint32_t window,
                                  uint32_t chunk_len, uint32_t max_chunks, uint64_t n_q,
                                  uint64_t n_k, uint64_t n_v, uint64_t n_step, uint64_t n_partials,
                                  uint64_t n_out, uint32_t tag) {
    __shared__ float qs[ATTN_MAX_HD];
    __shared__ float ps[ATTN_MAX_TILE];
    __shared__ float vsum[4 * ATTN_MAX_TILE];
    const uint64_t records = (uint64_t)max_chunks * n_head * (hd + 2);
    OP_REQUIRE(n_head != 0 && n_kv_head != 0 && hd != 0 && hd <= ATTN_MAX_HD &&
               n_head % n_kv_head == 0 && blockDim.x <= ATTN_MAX_TILE && hd <= ATTN_ACC * blockDim.x &&
               n_step != 0 && n_k == n_v && n_q == (uint64_t)n_head * hd &&
               n_k % ((uint64_t)n_kv_head * hd) == 0 && chunk_len != 0 &&
               n_partials == records + (out != nullptr ? n_head : 0) &&
               (out == nullptr || n_out == n_q));
    const uint64_t max_ctx = n_k / ((uint64_t)n_kv_head * hd);
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + 1 > max_ctx) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, 1);
        return;
    }
    const uint64_t kv_len = (uint64_t)pos0 + 1, lo = attn_first_key((uint64_t)pos0, window);
    uint64_t first, chunks;
    attn_live_chunks((uint64_t)pos0, window, chunk_len, first, chunks);
    if (chunks > max_chunks) {
        op_fail(tag, OP_ERR_CHUNKS, (int64_t)kv_len, max_chunks, chunk_len);
        return;
    }
    const uint64_t live = chunks - first;
    const uint32_t group = n_head / n_kv_head;
    OP_ROW_LOOP(item, live * n_head) {
        const uint64_t chunk = first + item / n_head;
        const uint32_t h = (uint32_t)(item % n_head), kv = h / group;
        attn_chunk_record<T>(q, k, v, max_ctx, h, kv, hd, chunk, chunk_len, lo, kv_len, n_head, scale,
                             softcap, qs, ps, vsum, partials);
        if (out == nullptr) continue;
        if (attn_last_ticket((uint32_t*)(partials + records) + h, live, h, tag)) {
            attn_combine_head(partials + first * n_head * (hd + 2), live, n_head, h, hd, out);
        }
    }
}

#define ATTENTION_KERNEL(NAME, T, MMA, O)                                                           \
    extern "C" __global__ void NAME(const float* q, const T* k, const T* v, const int32_t* step,      \
                                    O* out, uint32_t n_head, uint32_t n_kv_head, uint32_t hd,         \
                                    float scale, float softcap, uint32_t window, uint64_t n_q,        \
                                    uint64_t n_k, uint64_t n_v, uint64_t n_step, uint64_t n_out) {    \
        OP_GRID_ENTRY();                                                                              \
        attention_prefill<T, MMA, O>(q, k, v, step, out, n_head, n_kv_head, hd, scale, softcap,      \
                                     window, n_q, n_k, n_v, n_step, n_out, op_tag(#NAME));            \
    }
#define ATTENTION_PARTIAL_KERNEL(NAME, T)                                                           \
    extern "C" __global__ void NAME(const float* q, const T* k, const T* v, const int32_t* step,      \
                                    float* partials, uint32_t n_head, uint32_t n_kv_head,             \
                                    uint32_t hd, float scale, float softcap, uint32_t window,         \
                                    uint32_t chunk_len, uint32_t max_chunks, uint64_t n_q,            \
                                    uint64_t n_k, uint64_t n_v, uint64_t n_step,                      \
                                    uint64_t n_partials) {                                            \
        OP_GRID_ENTRY();                                                                              \
        attention_partial<T>(q, k, v, step, partials, nullptr, n_head, n_kv_head, hd, scale,          \
                             softcap, window, chunk_len, max_chunks, n_q, n_k, n_v, n_step,           \
                             n_partials, 0, op_tag(#NAME));                                           \
    }
ATTENTION_KERNEL(attention_f32, float, false, float)
ATTENTION_KERNEL(attention_f16, __half, false, float)
ATTENTION_KERNEL(attention_mma_f32, float, true, float)
ATTENTION_KERNEL(attention_mma_f16, __half, true, float)
ATTENTION_KERNEL(attention_mma_f32_to_f16, float, true, __half)
ATTENTION_KERNEL(attention_mma_f16_to_f16, __half, true, __half)
ATTENTION_PARTIAL_KERNEL(attention_decode_partial_f32, float)
ATTENTION_PARTIAL_KERNEL(attention_decode_partial_f16, __half)

extern "C" __global__ void attention_decode_combine(const float* partials, const int32_t* step,
                                                    float* out, uint32_t n_head, uint32_t hd,
                                                    uint32_t chunk_len, uint32_t max_chunks,
                                                    uint32_t window, uint64_t n_partials,
                                                    uint64_t n_step, uint64_t n_out) {
    OP_GRID_ENTRY();
    const uint32_t tag = op_tag("attention_decode_combine");
    OP_REQUIRE(n_head != 0 && hd != 0 && chunk_len != 0 && n_step != 0 &&
               n_out == (uint64_t)n_head * hd &&
               n_partials == (uint64_t)max_chunks * n_head * (hd + 2));
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + 1 > (uint64_t)max_chunks * chunk_len) {
        op_fail(tag, OP_ERR_CHUNKS, pos0 + 1, max_chunks, chunk_len);
        return;
    }
    uint64_t first, chunks;
    attn_live_chunks((uint64_t)pos0, window, chunk_len, first, chunks);
    const float* live = partials + first * n_head * (hd + 2);
    OP_ROW_LOOP(h, n_head) attn_combine_head(live, chunks - first, n_head, (uint32_t)h, hd, out);
}
