// The per-lane dot forms of the one-row products, compiled after matmul_blocks.cuh (whose
// activation rows, weight quarters and int8 forms they use) in front of the `matmul` and
// `fused_block` families: a block quarter against any activation row (`mm_apply_quarter`), the
// 32-value block formats read as whole words by four lanes a block in batches of quarters
// (`mm_blocks_rows`, `mm_dot_blocks`), the staged form of weight rows read through shared memory
// with 16-byte loads (`mm_dot_staged`), two rows' dots in whichever form applies
// (`mm_dot_pair`), the grid's warp index and the L2 prefetch of a weight row's start.

// Quarter `t` of block `b` dotted with the activation row `x`.
template <int FMT, typename X>
__device__ __forceinline__ float mm_apply_quarter(X x, MmQuarter w, uint32_t b, uint32_t t) {
    if constexpr (MmIsQ8<X>::value) return mm_q8_quarter<FMT>(x, w, b, t);
    const uint64_t xb = (uint64_t)b * 32;
    if (FMT == OP_FMT_Q8_0) {
        const float4 a = x.at4(xb + 8 * t), c = x.at4(xb + 8 * t + 4);
        return w.d * (mm_i8_dot(w.q0, a) + mm_i8_dot(w.q1, c));
    }
    const float4 lo = x.at4(xb + 4 * t), hi = x.at4(xb + 16 + 4 * t);
    if (FMT == OP_FMT_Q5_0) return w.d * mm_q5_dot(w.q0, w.q1, lo, hi);
    const float sx = (lo.x + lo.y) + (lo.z + lo.w) + (hi.x + hi.y) + (hi.z + hi.w);
    if (FMT == OP_FMT_Q4_1) return w.d * mm_nibble_dot(w.q0, lo, hi) + w.m * sx;
    return w.d * (mm_nibble_dot(w.q0, lo, hi) - 8.0f * sx);
}

template <int FMT, typename X>
__device__ __forceinline__ float mm_block_quarter(X x, const uint8_t* row, uint32_t b, uint32_t t) {
    return mm_apply_quarter<FMT>(x, mm_load_quarter<FMT>(row, b, t), b, t);
}

// Whether `mm_dot_blocks` applies: a 32-value block format, x rows 16-byte aligned, weights at an
// even address.
template <int FMT, typename X>
__device__ __forceinline__ bool mm_blocks_ok(X x, const uint8_t* w, uint32_t k) {
    return (FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q5_0 ||
            FMT == OP_FMT_Q8_0) &&
           x.aligned16() && k % 32 == 0 && ((uint64_t)w & 1u) == 0;
}

// Quarters a lane of `mm_dot_blocks` loads before it sums them. In a lane's last, partial batch
// its block b is clamped to the row's last rather than guarded by a branch, so that no load waits
// behind another quarter's sums (with a guard, the unrolled loop's loads went one round trip after
// another), and a quarter past the row is loaded but not added; whole batches take no clamp (its
// compares and selects cost SmolLM2's step about 2%, docs/kernels.md item 23).
#define MM_BLOCKS_BATCH 4

// One batch of `mm_dot_blocks` for R rows from block b0 (a lane's blocks b0, b0 + 8, ...): every
// row's quarters loaded, then each row's added to its acc in order; CLAMP for a batch that runs
// past the row.
template <int FMT, bool CLAMP, int R, typename X>
__device__ __forceinline__ void mm_blocks_batch(X x, const uint8_t* const (&rows)[R],
                                                uint32_t blocks, uint32_t b0, uint32_t t,
                                                float (&acc)[R]) {
    MmQuarter w[MM_BLOCKS_BATCH][R];
#pragma unroll
    for (int j = 0; j < MM_BLOCKS_BATCH; ++j) {
        const uint32_t b = !CLAMP || b0 + 8 * j < blocks ? b0 + 8 * j : blocks - 1;
#pragma unroll
        for (int r = 0; r < R; ++r) w[j][r] = mm_load_quarter<FMT>(rows[r], b, t);
    }
#pragma unroll
    for (int j = 0; j < MM_BLOCKS_BATCH; ++j) {
        const uint32_t b = !CLAMP || b0 + 8 * j < blocks ? b0 + 8 * j : blocks - 1;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = mm_apply_quarter<FMT>(x, w[j][r], b, t);
            if (!CLAMP || b0 + 8 * j < blocks) acc[r] += v;
        }
    }
}

// The batches of R rows' dots: whole batches unclamped, a lane's last partial one clamped.
template <int FMT, int R, typename X>
__device__ __forceinline__ void mm_blocks_rows(X x, const uint8_t* const (&rows)[R], uint32_t k,
                                               int lane, float (&acc)[R]) {
    const uint32_t blocks = k / 32, t = lane & 3;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (uint32_t b0 = lane >> 2; b0 < blocks; b0 += 8 * MM_BLOCKS_BATCH) {
        if (b0 + 8 * (MM_BLOCKS_BATCH - 1) < blocks)
            mm_blocks_batch<FMT, false, R>(x, rows, blocks, b0, t, acc);
        else
            mm_blocks_batch<FMT, true, R>(x, rows, blocks, b0, t, acc);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = op_warp_sum(acc[r]);
}

// `batched` false: the quarters one at a time (the loop unrolled four times), for a product with
// warps enough to keep the loads in flight (`MM_BATCH_MAX_OUTPUTS` in matmul.cu); the same sums
// either way.
template <int FMT, typename X>
__device__ __forceinline__ float mm_dot_blocks(X x, const uint8_t* wrow, uint32_t k, int lane,
                                               bool batched = true) {
    if (!batched) {
        const uint32_t blocks = k / 32, t = lane & 3;
        float acc = 0.0f;
#pragma unroll 4
        for (uint32_t b = lane >> 2; b < blocks; b += 8) acc += mm_block_quarter<FMT>(x, wrow, b, t);
        return op_warp_sum(acc);
    }
    const uint8_t* const rows[1] = {wrow};
    float v[1];
    mm_blocks_rows<FMT, 1>(x, rows, k, lane, v);
    return v[0];
}

// ---- The staged vector form: R weight rows of a 32-value block format against one activation
// row, each step copying 8 * MM_STAGE_GROUPS (32) blocks of every row into the warp's shared
// memory with 16-byte loads (the next step's loads in flight while this one is summed). Each lane sums the same quarters in
// the same order as `mm_dot_blocks`, so the results are that function's bits; what changes is how
// many bytes a warp has in flight (benches/cuda/matvec_q4_0.cu measured the forms). Needs rows at
// 16-byte aligned addresses whose length is a whole number of 16-byte words, and blocks of
// MM_STAGE_WARPS warps (the shared memory is sized for them).
#define MM_STAGE_WARPS 8
#define MM_STAGE_GROUPS 4
#define MM_STAGE_MAX_WORDS (2 * MM_STAGE_GROUPS * 8 * 34 / 16)
// Shorter rows keep the direct form (a SmolLM2-sized step measured no gain from staging).
#define MM_STAGE_MIN_ROW_BYTES 1024

template <int FMT>
__device__ __forceinline__ constexpr uint32_t mm_block_bytes() {
    return FMT == OP_FMT_Q8_0 ? 34u : (FMT == OP_FMT_Q5_0 ? 22u : (FMT == OP_FMT_Q4_1 ? 20u : 18u));
}

// Whether `mm_dot_staged` takes these rows (warp-uniform).
template <int FMT, int R>
__device__ __forceinline__ bool mm_stage_ok(const uint8_t* const (&rows)[R], uint64_t row_bytes) {
    bool ok = blockDim.x == 32 * MM_STAGE_WARPS && blockDim.y == 1 && row_bytes % 16 == 0 &&
              row_bytes >= MM_STAGE_MIN_ROW_BYTES;
#pragma unroll
    for (int r = 0; r < R; ++r) ok = ok && ((uint64_t)rows[r] & 15u) == 0;
    return ok;
}

// `stage` is MM_STAGE_WARPS * MM_STAGE_MAX_WORDS words of the block's shared memory.
template <int FMT, int R, typename X>
__device__ __forceinline__ void mm_dot_staged(X x, const uint8_t* const (&rows)[R], uint32_t k,
                                              int lane, uint4* stage, float (&acc)[R]) {
    constexpr uint32_t BB = mm_block_bytes<FMT>();
    constexpr int SPAN = MM_STAGE_GROUPS * 8 * BB / 16;  // 16-byte words of one row a step
    constexpr int WORDS = R * SPAN;
    constexpr int PER_LANE = (WORDS + 31) / 32;
    static_assert(WORDS <= MM_STAGE_MAX_WORDS, "stage too small");
    uint4* st = stage + ((threadIdx.x >> 5) % MM_STAGE_WARPS) * MM_STAGE_MAX_WORDS;
    const uint32_t blocks = k / 32, per_step = 8 * MM_STAGE_GROUPS;
    const uint32_t steps = (blocks + per_step - 1) / per_step, t = lane & 3;
    const uint64_t row_words = (uint64_t)blocks * BB / 16;
    uint4 next[PER_LANE];
    auto load = [&](uint32_t s) {
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int i = lane + 32 * j;
            const uint64_t word = (uint64_t)s * SPAN + i % SPAN;
            if (i < WORDS && word < row_words)
                next[j] = __ldg((const uint4*)rows[i / SPAN] + word);
        }
    };
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    load(0);
    for (uint32_t s = 0; s < steps; ++s) {
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            if (lane + 32 * j < WORDS) st[lane + 32 * j] = next[j];
        }
        __syncwarp();
        if (s + 1 < steps) load(s + 1);
        const uint8_t* staged = (const uint8_t*)st;
#pragma unroll
        for (int u = 0; u < MM_STAGE_GROUPS; ++u) {
            const uint32_t bl = 8 * u + (lane >> 2), b = s * per_step + bl;
            if (b < blocks) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const MmQuarter w = mm_load_quarter<FMT>(staged + r * SPAN * 16, bl, t);
                    acc[r] += mm_apply_quarter<FMT>(x, w, b, t);
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = op_warp_sum(acc[r]);
}

// Two rows' dots: Q4_0 rows against the int8 row a lane per pair of blocks where they allow it
// (`mm_q8_rows_pairs_q4_0`), else staged where a stage is given and the rows allow it, else
// `mm_dot_blocks` or `mm_dot` per row (the same bits either way for the block formats).
template <int FMT, typename X>
__device__ __forceinline__ void mm_dot_pair(X x, const uint8_t* a, const uint8_t* b, uint32_t k,
                                            uint64_t row_bytes, int lane, bool blocks,
                                            uint4* stage, float& va, float& vb) {
    if constexpr (MmIsQ8<X>::value && FMT == OP_FMT_Q4_0) {
        if (mm_q8_pairs_ok(a, k) && mm_q8_pairs_ok(b, k)) {
            mm_q8_rows_pairs_q4_0(x, a, b, k, lane, va, vb);
            return;
        }
    }
    const uint8_t* const rows[2] = {a, b};
    if (blocks && stage != nullptr && mm_stage_ok<FMT, 2>(rows, row_bytes)) {
        float acc[2];
        mm_dot_staged<FMT, 2>(x, rows, k, lane, stage, acc);
        va = acc[0];
        vb = acc[1];
    } else if (blocks) {
        // Both rows' quarters of a batch loaded before either is summed.
        float v[2];
        mm_blocks_rows<FMT, 2>(x, rows, k, lane, v);
        va = v[0];
        vb = v[1];
    } else if (MmIsQ8<X>::value && FMT == OP_FMT_Q6_K &&
               (((uint64_t)a | (uint64_t)b | row_bytes) & 3u) == 0) {
        if constexpr (MmIsQ8<X>::value) {
            float v[2];
            mm_q8_q6k_rows<2>(x, rows, k, lane, v);
            va = v[0];
            vb = v[1];
        }
    } else if (FMT == OP_FMT_Q4_K && mm_q4k_ok(x, a, b)) {
        float v[2];
        if constexpr (MmIsQ8<X>::value)
            mm_q8_q4k_rows<2>(x, rows, k, lane, v);
        else
            mm_dot_q4k_rows<2>(x, rows, k, lane, v);
        va = v[0];
        vb = v[1];
    } else {
        va = mm_dot<FMT>(x, a, k, lane);
        vb = mm_dot<FMT>(x, b, k, lane);
    }
}

__device__ __forceinline__ uint64_t mm_warp_id() {
    return (blockIdx.y * (uint64_t)gridDim.x + blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
}
__device__ __forceinline__ uint64_t mm_warp_count() {
    return (uint64_t)gridDim.x * gridDim.y * (blockDim.x / 32);
}

// The first MM_PREFETCH_BYTES of a weight row asked of L2 (a hint: nothing is read into
// registers). Only the start: asking for whole rows before the grid wait pulled most of an 8B
// product into L2 while the kernel before it streamed its own weights, which evicted them again
// (8B 334.7 tok/s with whole rows, 335.2 with 2 KiB, on an H200; docs/kernels.md item 17).
#define MM_PREFETCH_BYTES 2048u
__device__ __forceinline__ void mm_prefetch_row(const uint8_t* row, uint64_t bytes) {
    if (bytes > MM_PREFETCH_BYTES) bytes = MM_PREFETCH_BYTES;
    for (uint64_t off = 128 * (uint64_t)(threadIdx.x & 31); off < bytes; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
}

// Bytes of dynamic shared memory the launch gave this block.
__device__ __forceinline__ uint32_t mm_dynamic_smem() {
    uint32_t bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}
