// The `matmul` family: y[r, o] = sum_i x[r, i] * W[o, i], f32 activations, weights in f32, f16,
// bf16 or GGML block formats (dequantized on the fly), and the expert-routed form. Same arguments
// as the CPU kernels (src/backend/cpu/kernels/matmul.rs):
//   matmul_<w>:    x, w, out, rows, k, n
//   matmul_id_<w>: x, w [experts, n, k], ids i32 [rows, slots], out [rows, slots, n], rows, k, n,
//                  slots, experts (an id outside 0..experts is a kernel error)
//   matmul_affine_<s>: x, w u32 [n, k * bits / 32], scales and biases of dtype <s> [n, k / group],
//                  out, rows, k, n, bits, group (MLX affine: W[o, i] = scale * q + bias)
// Sums in f32, in three forms chosen by the row count (the host sizes the grid to match):
// - one row (decode): one warp per output value (grid-stride over warps). For the 32-value block
//   formats (q4_0, q4_1, q8_0) with a 16-byte aligned x, four lanes share a block and read it as
//   whole words (`mm_dot_blocks`); every other case reads one element per lane (`mm_dot`).
// - 2 to 15 rows: one warp per output value and group of MM_ROWS rows, each weight value read once
//   for the group.
// - 16 rows and more (prefill, given MM_TILE_SMEM bytes of dynamic shared memory): the tiled form
//   (`mm_tiled`), a block per tile of rows x outputs staged through shared memory.

// The activation row a matmul reads (a type parameter, so that a fused producer can compute its
// values as they are read).
struct XPlain {
    const float* x;
    __device__ __forceinline__ float at(uint64_t i) const { return x[i]; }
    __device__ __forceinline__ float4 at4(uint64_t i) const { return *(const float4*)(x + i); }
    __device__ __forceinline__ bool aligned16() const { return ((uint64_t)x & 15u) == 0; }
    __device__ __forceinline__ XPlain row(uint64_t off) const { return XPlain{x + off}; }
};
template <int FMT, typename X>
__device__ __forceinline__ float mm_dot(X x, const uint8_t* wrow, uint32_t k, int lane) {
    float acc = 0.0f;
    for (uint32_t i = lane; i < k; i += 32) acc += x.at(i) * op_weight<FMT>(wrow, i);
    return op_warp_sum(acc);
}

// Four bytes at a 2-byte aligned address (block quants start at even offsets).
__device__ __forceinline__ uint32_t mm_u32_at(const uint8_t* p) {
    const uint16_t* h = (const uint16_t*)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

// An f16 block scale at a 2-byte aligned address, as f32 (one 16-bit load).
__device__ __forceinline__ float mm_half_at(const uint8_t* p) {
    return __half2float(__ushort_as_half(*(const uint16_t*)p));
}

// sum of lo[i] * (low nibble of byte i) + hi[i] * (high nibble of byte i) over the 4 bytes of q.
__device__ __forceinline__ float mm_nibble_dot(uint32_t q, float4 lo, float4 hi) {
    float s = lo.x * (float)(q & 15u);
    s += lo.y * (float)((q >> 8) & 15u);
    s += lo.z * (float)((q >> 16) & 15u);
    s += lo.w * (float)((q >> 24) & 15u);
    s += hi.x * (float)((q >> 4) & 15u);
    s += hi.y * (float)((q >> 12) & 15u);
    s += hi.z * (float)((q >> 20) & 15u);
    s += hi.w * (float)(q >> 28);
    return s;
}

// sum of a[i] * (signed byte i of q).
__device__ __forceinline__ float mm_i8_dot(uint32_t q, float4 a) {
    return a.x * (float)(int8_t)(q & 0xffu) + a.y * (float)(int8_t)((q >> 8) & 0xffu) +
           a.z * (float)(int8_t)((q >> 16) & 0xffu) + a.w * (float)(int8_t)(q >> 24);
}

// The weight words of quarter `t` (0..4) of block `b` of a row: 4-bit formats take quant bytes
// [4t, 4t + 4) (values 4t..4t+3 and 16+4t..16+4t+3) and the scale (and q4_1's minimum), q8_0 takes
// bytes [8t, 8t + 8) and the scale. Loaded once, applied to one activation row or several.
struct MmQuarter {
    uint32_t q0, q1;
    float d, m;
};

template <int FMT>
__device__ __forceinline__ MmQuarter mm_load_quarter(const uint8_t* row, uint32_t b, uint32_t t) {
    MmQuarter w;
    if (FMT == OP_FMT_Q8_0) {
        const uint8_t* p = row + (uint64_t)b * 34;
        w.d = mm_half_at(p);
        w.q0 = mm_u32_at(p + 2 + 8 * t);
        w.q1 = mm_u32_at(p + 6 + 8 * t);
        w.m = 0.0f;
    } else if (FMT == OP_FMT_Q4_1) {
        const uint8_t* p = row + (uint64_t)b * 20;
        w.d = mm_half_at(p);
        w.m = mm_half_at(p + 2);
        w.q0 = mm_u32_at(p + 4 + 4 * t);
        w.q1 = 0;
    } else {  // q4_0: value = d * (q - 8)
        const uint8_t* p = row + (uint64_t)b * 18;
        w.d = mm_half_at(p);
        w.m = 0.0f;
        w.q0 = mm_u32_at(p + 2 + 4 * t);
        w.q1 = 0;
    }
    return w;
}

// Quarter `t` of block `b` dotted with the activation row `x`.
template <int FMT, typename X>
__device__ __forceinline__ float mm_apply_quarter(X x, MmQuarter w, uint32_t b, uint32_t t) {
    const uint64_t xb = (uint64_t)b * 32;
    if (FMT == OP_FMT_Q8_0) {
        const float4 a = x.at4(xb + 8 * t), c = x.at4(xb + 8 * t + 4);
        return w.d * (mm_i8_dot(w.q0, a) + mm_i8_dot(w.q1, c));
    }
    const float4 lo = x.at4(xb + 4 * t), hi = x.at4(xb + 16 + 4 * t);
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
    return (FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q8_0) && x.aligned16() &&
           k % 32 == 0 && ((uint64_t)w & 1u) == 0;
}

template <int FMT, typename X>
__device__ __forceinline__ float mm_dot_blocks(X x, const uint8_t* wrow, uint32_t k, int lane) {
    const uint32_t blocks = k / 32, t = lane & 3;
    float acc = 0.0f;
    // Unrolled so that a row of up to 32 blocks is one round of loads in flight.
#pragma unroll 4
    for (uint32_t b = lane >> 2; b < blocks; b += 8) acc += mm_block_quarter<FMT>(x, wrow, b, t);
    return op_warp_sum(acc);
}

// ---- The staged vector form: R weight rows of a 32-value block format against one activation
// row, each step copying 16 blocks of every row into the warp's shared memory with 16-byte loads
// (the next step's loads in flight while this one is summed). Each lane sums the same quarters in
// the same order as `mm_dot_blocks`, so the results are that function's bits; what changes is how
// many bytes a warp has in flight (benches/cuda/matvec_q4_0.cu measured the forms). Needs rows at
// 16-byte aligned addresses whose length is a whole number of 16-byte words, and blocks of
// MM_STAGE_WARPS warps (the shared memory is sized for them).
#define MM_STAGE_WARPS 4
#define MM_STAGE_GROUPS 2
#define MM_STAGE_MAX_WORDS (2 * MM_STAGE_GROUPS * 8 * 34 / 16)
// Shorter rows keep the direct form (a SmolLM2-sized step measured no gain from staging).
#define MM_STAGE_MIN_ROW_BYTES 1024

template <int FMT>
__device__ __forceinline__ constexpr uint32_t mm_block_bytes() {
    return FMT == OP_FMT_Q8_0 ? 34u : (FMT == OP_FMT_Q4_1 ? 20u : 18u);
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

// Two rows' dots: staged where a stage is given and the rows allow it, else `mm_dot_blocks` or
// `mm_dot` per row (the same bits either way for the block formats).
template <int FMT, typename X>
__device__ __forceinline__ void mm_dot_pair(X x, const uint8_t* a, const uint8_t* b, uint32_t k,
                                            uint64_t row_bytes, int lane, bool blocks,
                                            uint4* stage, float& va, float& vb) {
    const uint8_t* const rows[2] = {a, b};
    if (blocks && stage != nullptr && mm_stage_ok<FMT, 2>(rows, row_bytes)) {
        float acc[2];
        mm_dot_staged<FMT, 2>(x, rows, k, lane, stage, acc);
        va = acc[0];
        vb = acc[1];
    } else if (blocks) {
        va = mm_dot_blocks<FMT>(x, a, k, lane);
        vb = mm_dot_blocks<FMT>(x, b, k, lane);
    } else {
        va = mm_dot<FMT>(x, a, k, lane);
        vb = mm_dot<FMT>(x, b, k, lane);
    }
}

// Rows of activations one warp takes together in the matrix (prefill) form: each weight value is
// read once and used for up to MM_ROWS rows, each row summed in the vector form's order. The
// host sizes its grids with the same number (`ops::matmul::MM_ROWS`).
#define MM_ROWS 8

// `acc[r] = xs[r] . wrow` for the first `nr` rows (warp-uniform), one element per lane at a time.
template <int FMT, typename X>
__device__ __forceinline__ void mm_dot_rows(const X (&xs)[MM_ROWS], int nr, const uint8_t* wrow,
                                            uint32_t k, int lane, float (&acc)[MM_ROWS]) {
#pragma unroll
    for (int r = 0; r < MM_ROWS; ++r) acc[r] = 0.0f;
    for (uint32_t i = lane; i < k; i += 32) {
        const float wv = op_weight<FMT>(wrow, i);
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r)
            if (r < nr) acc[r] += xs[r].at(i) * wv;
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; ++r)
        if (r < nr) acc[r] = op_warp_sum(acc[r]);
}

// `mm_dot_rows` for the 32-value block formats, four lanes a block as in `mm_dot_blocks`.
template <int FMT, typename X>
__device__ __forceinline__ void mm_dot_blocks_rows(const X (&xs)[MM_ROWS], int nr,
                                                   const uint8_t* wrow, uint32_t k, int lane,
                                                   float (&acc)[MM_ROWS]) {
    const uint32_t blocks = k / 32, t = lane & 3;
#pragma unroll
    for (int r = 0; r < MM_ROWS; ++r) acc[r] = 0.0f;
    for (uint32_t b = lane >> 2; b < blocks; b += 8) {
        const MmQuarter w = mm_load_quarter<FMT>(wrow, b, t);
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r)
            if (r < nr) acc[r] += mm_apply_quarter<FMT>(xs[r], w, b, t);
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; ++r)
        if (r < nr) acc[r] = op_warp_sum(acc[r]);
}

template <int FMT, typename X>
__device__ __forceinline__ void mm_dots(const X (&xs)[MM_ROWS], int nr, const uint8_t* wrow,
                                        uint32_t k, int lane, bool blocks, float (&acc)[MM_ROWS]) {
    if (blocks) {
        mm_dot_blocks_rows<FMT>(xs, nr, wrow, k, lane, acc);
    } else {
        mm_dot_rows<FMT>(xs, nr, wrow, k, lane, acc);
    }
}

__device__ __forceinline__ uint64_t mm_warp_id() {
    return (blockIdx.y * (uint64_t)gridDim.x + blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
}
__device__ __forceinline__ uint64_t mm_warp_count() {
    return (uint64_t)gridDim.x * gridDim.y * (blockDim.x / 32);
}

// The tiled matrix form, for many rows (prefill): a block of 128 threads computes a tile of
// MM_TILE_M rows x MM_TILE_N outputs, stepping through k MM_TILE_K values at a time; each step
// stages the activation tile and the dequantized weight tile in shared memory (k-major, so a
// thread reads four rows or four outputs as one 16-byte load), and thread (tr, tc) sums rows
// 4tr..4tr+3 times outputs 4tc..4tc+3. Every activation and weight value is read from device
// memory once per tile instead of once per output.
#define MM_TILE_M 32
#define MM_TILE_N 64
#define MM_TILE_K 32
#define MM_TILE_MIN_ROWS 16
#define MM_TILE_SMEM (4 * MM_TILE_K * (MM_TILE_M + MM_TILE_N))

__device__ __forceinline__ uint32_t mm_dynamic_smem() {
    uint32_t bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

// Values 16h .. 16h + 15 of the 32 from k0 of a weight row (zeros past k, or for a row past the
// matrix when `!live`), each as `op_weight` gives it. The 32-value block formats read the block
// (one per step) as words when the rows start at even addresses.
template <int FMT>
__device__ __forceinline__ void mm_stage_weights(const uint8_t* row, uint32_t k0, uint32_t h,
                                                 bool live, uint32_t k, bool words,
                                                 float (&v)[16]) {
    constexpr bool block32 = FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q8_0;
    if (block32 && live && words) {
        const uint32_t b = k0 / 32;
        if (FMT == OP_FMT_Q8_0) {
            const uint8_t* p = row + (uint64_t)b * 34;
            const float d = mm_half_at(p);
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                const uint32_t q = mm_u32_at(p + 2 + 16 * h + 4 * wd);
#pragma unroll
                for (int e = 0; e < 4; ++e) v[4 * wd + e] = (float)(int8_t)((q >> (8 * e)) & 0xffu) * d;
            }
            return;
        }
        const bool q41 = FMT == OP_FMT_Q4_1;
        const uint8_t* p = row + (uint64_t)b * (q41 ? 20 : 18);
        const float d = mm_half_at(p), m = q41 ? mm_half_at(p + 2) : 0.0f;
        const uint8_t* qs = p + (q41 ? 4 : 2);
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) {
            const uint32_t q = mm_u32_at(qs + 4 * wd);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int nib = (int)((q >> (8 * e + 4 * h)) & 15u);
                v[4 * wd + e] = q41 ? d * (float)nib + m : d * (float)(nib - 8);
            }
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) {
        const uint32_t gk = k0 + 16 * h + e;
        v[e] = live && gk < k ? op_weight<FMT>(row, gk) : 0.0f;
    }
}

template <int FMT, bool ACC, typename X>
__device__ void mm_tiled(X x, const uint8_t* w, float* out, uint32_t rows, uint32_t k, uint32_t n,
                         uint64_t row_bytes) {
    // Dynamic shared memory (the host asks for MM_TILE_SMEM bytes), so that the vector form of
    // the same kernel runs without a shared-memory carve-out.
    extern __shared__ __align__(16) float mm_smem[];
    float(*xs)[MM_TILE_M] = (float(*)[MM_TILE_M])mm_smem;
    float(*ws)[MM_TILE_N] = (float(*)[MM_TILE_N])(mm_smem + MM_TILE_K * MM_TILE_M);
    const int tid = threadIdx.x, tr = tid / 16, tc = tid % 16;
    const bool x_vec = x.aligned16() && k % 4 == 0;
    const bool w_words = ((uint64_t)w & 1u) == 0 && row_bytes % 2 == 0;
    const uint64_t tiles_m = ((uint64_t)rows + MM_TILE_M - 1) / MM_TILE_M;
    const uint64_t tiles_n = ((uint64_t)n + MM_TILE_N - 1) / MM_TILE_N;
    const uint64_t tiles = tiles_m * tiles_n;
    for (uint64_t tile = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; tile < tiles;
         tile += (uint64_t)gridDim.x * gridDim.y) {
        // Consecutive blocks take consecutive output tiles of one row tile (the rows stay hot).
        const uint64_t r0 = tile / tiles_n * MM_TILE_M, o0 = tile % tiles_n * MM_TILE_N;
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
        for (uint32_t k0 = 0; k0 < k; k0 += MM_TILE_K) {
            // Activations: thread tid stages row tid / 4, values 8 (tid % 4) .. + 8 of the step.
            {
                const uint32_t r = tid / 4, c = (tid % 4) * 8;
                const uint64_t gr = r0 + r;
                float v[8];
                if (x_vec && gr < rows && k0 + c + 8 <= k) {
                    const float4 a = x.at4(gr * k + k0 + c), b = x.at4(gr * k + k0 + c + 4);
                    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
                    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
                } else {
#pragma unroll
                    for (int m = 0; m < 8; ++m) {
                        const uint32_t gk = k0 + c + m;
                        v[m] = gr < rows && gk < k ? x.at(gr * k + gk) : 0.0f;
                    }
                }
#pragma unroll
                for (int m = 0; m < 8; ++m) xs[c + m][r] = v[m];
            }
            // Weights: thread tid stages output tid / 2, values 16 (tid % 2) .. + 16.
            {
                const uint32_t o = tid / 2, h = tid % 2;
                const uint64_t go = o0 + o;
                float v[16];
                mm_stage_weights<FMT>(w + go * row_bytes, k0, h, go < n, k, w_words, v);
#pragma unroll
                for (int m = 0; m < 16; ++m) ws[16 * h + m][o] = v[m];
            }
            __syncthreads();
#pragma unroll 8
            for (int kk = 0; kk < MM_TILE_K; ++kk) {
                const float4 a = *(const float4*)&xs[kk][4 * tr];
                const float4 b = *(const float4*)&ws[kk][4 * tc];
                const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint64_t gr = r0 + 4 * tr + i;
            if (gr >= rows) continue;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint64_t go = o0 + 4 * tc + j;
                if (go < n) {
                    float* y = out + gr * n + go;
                    *y = ACC ? *y + acc[i][j] : acc[i][j];
                }
            }
        }
    }
}

// out[r, o] = x[r] . W[o], or with ACC out[r, o] += x[r] . W[o] (the fused residual add: the
// add kernel's `a + b` with a = out, b = the product).
template <int FMT, bool ACC, typename X>
__device__ void matmul(X x, const uint8_t* w, float* out, uint32_t rows, uint32_t k, uint32_t n,
                       uint64_t n_x, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_out == (uint64_t)rows * n);
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    if (rows >= MM_TILE_MIN_ROWS && blockDim.x == 128 && blockDim.y == 1 && blockDim.z == 1 &&
        mm_dynamic_smem() >= MM_TILE_SMEM) {
        mm_tiled<FMT, ACC>(x, w, out, rows, k, n, row_bytes);
        return;
    }
    const int lane = threadIdx.x & 31;
    const bool blocks = mm_blocks_ok<FMT>(x, w, k);
    if (rows == 1) {
        for (uint64_t o = mm_warp_id(); o < n; o += mm_warp_count()) {
            const uint8_t* wr = w + o * row_bytes;
            const float v = blocks ? mm_dot_blocks<FMT>(x, wr, k, lane) : mm_dot<FMT>(x, wr, k, lane);
            if (lane == 0) out[o] = ACC ? out[o] + v : v;
        }
        return;
    }
    // The matrix form: warp t takes output o = t % n of rows group * MM_ROWS.. (group = t / n).
    const uint64_t groups = ((uint64_t)rows + MM_ROWS - 1) / MM_ROWS;
    for (uint64_t t = mm_warp_id(); t < groups * n; t += mm_warp_count()) {
        const uint64_t r0 = t / n * MM_ROWS, o = t % n;
        const int nr = (int)min((uint64_t)MM_ROWS, (uint64_t)rows - r0);
        X xs[MM_ROWS];
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r) xs[r] = x.row((r0 + (r < nr ? r : 0)) * k);
        float acc[MM_ROWS];
        mm_dots<FMT>(xs, nr, w + o * row_bytes, k, lane, blocks, acc);
        if (lane != 0) continue;
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r) {
            if (r < nr) {
                float* y = out + (r0 + r) * n + o;
                *y = ACC ? *y + acc[r] : acc[r];
            }
        }
    }
}

template <int FMT>
__device__ void matmul_id(const float* x, const uint8_t* w, const int32_t* ids, float* out,
                          uint32_t rows, uint32_t k, uint32_t n, uint32_t slots, uint32_t experts,
                          uint64_t n_x, uint64_t n_ids, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_ids == (uint64_t)rows * slots && n_out == (uint64_t)rows * slots * n);
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    const bool blocks = mm_blocks_ok<FMT>(XPlain{x}, w, k);
    for (uint64_t t = mm_warp_id(); t < n_out; t += mm_warp_count()) {
        const uint64_t pair = t / n, o = t % n, r = pair / slots;
        const int32_t e = ids[pair];
        if (e < 0 || (uint32_t)e >= experts) {
            if (o == 0 && lane == 0) op_fail(tag, OP_ERR_EXPERT_ID, e, experts, pair);
            continue;
        }
        const uint8_t* wrow = w + ((uint64_t)e * n + o) * row_bytes;
        const XPlain xr = XPlain{x + r * k};
        const float v = blocks ? mm_dot_blocks<FMT>(xr, wrow, k, lane) : mm_dot<FMT>(xr, wrow, k, lane);
        if (lane == 0) out[t] = v;
    }
}

#define MATMUL_KERNEL(NAME, FMT)                                                                    \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, float* out, uint32_t rows,      \
                                    uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_w,               \
                                    uint64_t n_out) {                                                 \
        matmul<FMT, false>(XPlain{x}, w, out, rows, k, n, n_x, n_out, op_tag(#NAME));              \
    }
// The fusion of a matmul with the in-place add of its output into `acc` (src/ops/matmul_fused.rs).
#define MATMUL_ADD_KERNEL(NAME, FMT)                                                                \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, float* acc, uint32_t rows,      \
                                    uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_w,               \
                                    uint64_t n_acc) {                                                 \
        matmul<FMT, true>(XPlain{x}, w, acc, rows, k, n, n_x, n_acc, op_tag(#NAME));               \
    }
#define MATMUL_ID_KERNEL(NAME, FMT)                                                                 \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, const int32_t* ids, float* out, \
                                    uint32_t rows, uint32_t k, uint32_t n, uint32_t slots,            \
                                    uint32_t experts, uint64_t n_x, uint64_t n_w, uint64_t n_ids,     \
                                    uint64_t n_out) {                                                 \
        matmul_id<FMT>(x, w, ids, out, rows, k, n, slots, experts, n_x, n_ids, n_out,                 \
                       op_tag(#NAME));                                                                \
    }

MATMUL_KERNEL(matmul_f32, OP_FMT_F32)
MATMUL_KERNEL(matmul_f16, OP_FMT_F16)
MATMUL_KERNEL(matmul_bf16, OP_FMT_BF16)
MATMUL_KERNEL(matmul_q4_0, OP_FMT_Q4_0)
MATMUL_KERNEL(matmul_q4_1, OP_FMT_Q4_1)
MATMUL_KERNEL(matmul_q8_0, OP_FMT_Q8_0)
MATMUL_KERNEL(matmul_q4_k, OP_FMT_Q4_K)
MATMUL_KERNEL(matmul_q6_k, OP_FMT_Q6_K)
MATMUL_ADD_KERNEL(matmul_add_f32, OP_FMT_F32)
MATMUL_ADD_KERNEL(matmul_add_f16, OP_FMT_F16)
MATMUL_ADD_KERNEL(matmul_add_bf16, OP_FMT_BF16)
MATMUL_ADD_KERNEL(matmul_add_q4_0, OP_FMT_Q4_0)
MATMUL_ADD_KERNEL(matmul_add_q4_1, OP_FMT_Q4_1)
MATMUL_ADD_KERNEL(matmul_add_q8_0, OP_FMT_Q8_0)
MATMUL_ADD_KERNEL(matmul_add_q4_k, OP_FMT_Q4_K)
MATMUL_ADD_KERNEL(matmul_add_q6_k, OP_FMT_Q6_K)
MATMUL_ID_KERNEL(matmul_id_f32, OP_FMT_F32)
MATMUL_ID_KERNEL(matmul_id_f16, OP_FMT_F16)
MATMUL_ID_KERNEL(matmul_id_bf16, OP_FMT_BF16)
MATMUL_ID_KERNEL(matmul_id_q4_0, OP_FMT_Q4_0)
MATMUL_ID_KERNEL(matmul_id_q4_1, OP_FMT_Q4_1)
MATMUL_ID_KERNEL(matmul_id_q8_0, OP_FMT_Q8_0)
MATMUL_ID_KERNEL(matmul_id_q4_k, OP_FMT_Q4_K)
MATMUL_ID_KERNEL(matmul_id_q6_k, OP_FMT_Q6_K)

// MLX affine weights: value i of row o is scale[g] * q + bias[g] with g = i / group and q the
// i-th `bits`-bit field of the row's u32 words, lowest bits first (the CPU's operation order).
template <typename S>
__device__ void matmul_affine(const float* x, const uint32_t* w, const S* scales, const S* biases,
                              float* out, uint32_t rows, uint32_t k, uint32_t n, uint32_t bits,
                              uint32_t group, uint64_t n_x, uint64_t n_w, uint64_t n_scales,
                              uint64_t n_biases, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE((bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128));
    OP_REQUIRE(k != 0 && k % group == 0 && n_x == (uint64_t)rows * k &&
               n_out == (uint64_t)rows * n);
    const uint32_t per_word = 32 / bits, words = k / per_word, groups = k / group;
    OP_REQUIRE(n_w == (uint64_t)n * words && n_scales == (uint64_t)n * groups &&
               n_biases == n_scales);
    const uint32_t mask = (1u << bits) - 1u;
    const int lane = threadIdx.x & 31;
    for (uint64_t t = mm_warp_id(); t < (uint64_t)rows * n; t += mm_warp_count()) {
        const uint64_t r = t / n, o = t % n;
        const float* xr = x + r * k;
        const uint32_t* wr = w + o * words;
        const S* sr = scales + o * groups;
        const S* br = biases + o * groups;
        float acc = 0.0f;
        for (uint32_t i = lane; i < k; i += 32) {
            const uint32_t q = (wr[i / per_word] >> (bits * (i % per_word))) & mask;
            const float v = op_load(sr, i / group) * (float)q + op_load(br, i / group);
            acc += xr[i] * v;
        }
        acc = op_warp_sum(acc);
        if (lane == 0) out[t] = acc;
    }
}

#define MATMUL_AFFINE_KERNEL(NAME, S)                                                               \
    extern "C" __global__ void NAME(const float* x, const uint32_t* w, const S* scales,              \
                                    const S* biases, float* out, uint32_t rows, uint32_t k,           \
                                    uint32_t n, uint32_t bits, uint32_t group, uint64_t n_x,          \
                                    uint64_t n_w, uint64_t n_scales, uint64_t n_biases,               \
                                    uint64_t n_out) {                                                 \
        matmul_affine<S>(x, w, scales, biases, out, rows, k, n, bits, group, n_x, n_w, n_scales,      \
                         n_biases, n_out, op_tag(#NAME));                                             \
    }

MATMUL_AFFINE_KERNEL(matmul_affine_f32, float)
MATMUL_AFFINE_KERNEL(matmul_affine_f16, __half)

// ---- Fused decoder-block products (src/ops/fused_block.rs; the optimizer makes them on a GPU for
// decode steps only: each block (one-row passes with shared memory) or warp normalizes the row,
// which a prefill pass would pay per output) ----
// The activation row is RMS-normalized as it is read: each warp sums the squares of its row in
// f64 (each lane its share, then a shuffle tree), inv = 1 / sqrt(ss / k + eps) rounded to f32, and value
// i is (x[i] * inv) * norm[i], the rms_norm kernel's float order.
struct XNorm {
    const float* x;
    const float* w;
    float inv;
    __device__ __forceinline__ float at(uint64_t i) const { return (x[i] * inv) * w[i]; }
    __device__ __forceinline__ float4 at4(uint64_t i) const {
        const float4 a = *(const float4*)(x + i), b = *(const float4*)(w + i);
        return make_float4((a.x * inv) * b.x, (a.y * inv) * b.y, (a.z * inv) * b.z,
                           (a.w * inv) * b.w);
    }
    __device__ __forceinline__ bool aligned16() const {
        return (((uint64_t)x | (uint64_t)w) & 15u) == 0;
    }
};

__device__ __forceinline__ XNorm fb_norm_row(const float* xr, const float* w, uint32_t k, float eps,
                                             int lane) {
    double ss = 0.0;
    if (((uint64_t)xr & 15u) == 0 && k % 4 == 0) {
        // Four values a load, several loads in flight.
#pragma unroll 4
        for (uint32_t i = 4 * lane; i < k; i += 128) {
            const float4 v = *(const float4*)(xr + i);
            ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
    } else {
#pragma unroll 8
        for (uint32_t i = lane; i < k; i += 32) {
            const double v = (double)xr[i];
            ss += v * v;
        }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(ONEPASS_FULL_MASK, ss, o);
    return XNorm{xr, w, (float)(1.0 / sqrt(ss / (double)k + (double)eps))};
}

// The normalized row in shared memory, written once per block: what a one-row pass reads when
// the host gives the kernel k floats of dynamic shared memory (and after them the weight stage of
// `mm_dot_staged`: without that memory the kernel uses none, as before). Warp 0 computes `inv` as
// `fb_norm_row` does and every value as `XNorm::at` does, so the sums see the same values; the
// block reads x and the norm weight once instead of once per warp.
struct XShared {
    const float* s;
    __device__ __forceinline__ float at(uint64_t i) const { return s[i]; }
    __device__ __forceinline__ float4 at4(uint64_t i) const { return *(const float4*)(s + i); }
    __device__ __forceinline__ bool aligned16() const { return true; }
};

// Row r of the activations as the fused kernels read it: normalized per warp.
struct FbPerWarp {
    const float* x;
    const float* nw;
    uint32_t k;
    float eps;
    int lane;
    // No shared memory: no staging.
    __device__ __forceinline__ uint4* stage() const { return nullptr; }
    __device__ __forceinline__ XNorm operator()(uint64_t r) const {
        return fb_norm_row(x + r * k, nw, k, eps, lane);
    }
};
// The one row, normalized once per block into shared memory.
struct FbShared {
    const float* s;
    uint32_t k;
    __device__ __forceinline__ XShared operator()(uint64_t) const { return XShared{s}; }
    // The weight stage follows the row in the dynamic shared memory.
    __device__ __forceinline__ uint4* stage() const { return (uint4*)(s + k); }
};

// Whether a pass of `rows` rows takes the shared row (block-uniform): one row, k floats of
// dynamic shared memory, x and the weight 16-byte aligned with k a multiple of 4.
__device__ __forceinline__ bool fb_shared_ok(uint64_t rows, const float* x, const float* nw,
                                             uint32_t k) {
    return rows == 1 && blockDim.y == 1 && k % 4 == 0 &&
           mm_dynamic_smem() >= 4u * k + 16u * MM_STAGE_WARPS * MM_STAGE_MAX_WORDS + 16u &&
           (((uint64_t)x | (uint64_t)nw) & 15u) == 0;
}

// Writes the normalized row into the block's dynamic shared memory and returns it.
__device__ __forceinline__ const float* fb_shared_row(const float* x, const float* nw, uint32_t k,
                                                      float eps) {
    extern __shared__ __align__(16) float fb_smem[];
    // inv after the row and the stage (no static shared memory: a kernel launched without
    // dynamic shared memory uses none).
    float* inv = fb_smem + k + 4 * MM_STAGE_WARPS * MM_STAGE_MAX_WORDS;
    if (threadIdx.x < 32) {
        const XNorm xn = fb_norm_row(x, nw, k, eps, threadIdx.x & 31);
        if (threadIdx.x == 0) *inv = xn.inv;
    }
    __syncthreads();
    const XNorm xn = XNorm{x, nw, *inv};
    for (uint32_t i = 4 * threadIdx.x; i < k; i += 4 * blockDim.x) {
        *(float4*)(fb_smem + i) = xn.at4(i);
    }
    __syncthreads();
    return fb_smem;
}


// q = rope(norm(x) Wq), k_cache[pos] = rope(norm(x) Wk), v_cache[pos] = norm(x) Wv for each row,
// one warp per output pair (the two values one rotation mixes; mode 0 pairs (2i, 2i + 1), mode 1
// (i, i + head_dim / 2)), the whole head rotating, angles as the rope kernel computes them (f64
// pow and sincos, the rotation in f32). Row r is position positions[r] and is written to cache
// row step[0] + r (a position outside the cache is a kernel error, nothing written).
template <int FMT, typename RowX>
__device__ void norm_qkv_rope_rows(RowX row_x, const uint8_t* wq,
                              const uint8_t* wk, const uint8_t* wv, const int32_t* positions,
                              const int32_t* step, float* q, float* kc, float* vc, uint32_t k,
                              uint32_t n_head, uint32_t n_kv, uint32_t hd, float base,
                              uint32_t mode, uint64_t n_pos, uint64_t n_kc, uint32_t tag) {
    const uint64_t rows = n_pos, max_ctx = n_kc / ((uint64_t)n_kv * hd);
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + rows > max_ctx) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, rows);
        return;
    }
    const uint32_t half = hd / 2;
    const uint64_t q_pairs = (uint64_t)n_head * half, kv_pairs = (uint64_t)n_kv * half;
    const uint64_t pairs = q_pairs + 2 * kv_pairs;
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    const bool even = (((uint64_t)wq | (uint64_t)wk | (uint64_t)wv) & 1u) == 0;
    for (uint64_t t = mm_warp_id(); t < rows * pairs; t += mm_warp_count()) {
        const uint64_t r = t / pairs;
        uint64_t p = t % pairs;
        int which = 0;
        const uint8_t* w = wq;
        if (p >= q_pairs + kv_pairs) {
            which = 2;
            w = wv;
            p -= q_pairs + kv_pairs;
        } else if (p >= q_pairs) {
            which = 1;
            w = wk;
            p -= q_pairs;
        }
        const uint32_t h = (uint32_t)(p / half), i = (uint32_t)(p % half);
        const uint32_t d0 = mode == 1 ? i : 2 * i, d1 = mode == 1 ? i + half : 2 * i + 1;
        const auto xn = row_x(r);
        const bool blocks = even && mm_blocks_ok<FMT>(xn, wq, k);
        float a, b;
        mm_dot_pair<FMT>(xn, w + ((uint64_t)h * hd + d0) * row_bytes,
                         w + ((uint64_t)h * hd + d1) * row_bytes, k, row_bytes, lane, blocks,
                         row_x.stage(), a, b);
        if (lane != 0) continue;
        if (which < 2) {
            const double inv_freq = pow((double)base, -2.0 * (double)i / (double)hd);
            double s, c;
            sincos((double)positions[r] * inv_freq, &s, &c);
            const float cf = (float)c, sf = (float)s;
            const float ra = a * cf - b * sf, rb = a * sf + b * cf;
            a = ra;
            b = rb;
        }
        if (which == 0) {
            float* qr = q + (r * n_head + h) * hd;
            qr[d0] = a;
            qr[d1] = b;
        } else {
            float* cr = (which == 1 ? kc : vc) + ((uint64_t)h * max_ctx + (uint64_t)pos0 + r) * hd;
            cr[d0] = a;
            cr[d1] = b;
        }
    }
}

// SHARED: the `_shared` kernels (the row in shared memory where the launch gives it; the plain
// kernels never take that path, so their code is what it was before it existed).
template <int FMT, bool SHARED>
__device__ void norm_qkv_rope(const float* x, const float* nw, const uint8_t* wq,
                              const uint8_t* wk, const uint8_t* wv, const int32_t* positions,
                              const int32_t* step, float* q, float* kc, float* vc, float eps,
                              uint32_t k, uint32_t n_head, uint32_t n_kv, uint32_t hd, float base,
                              uint32_t mode, uint64_t n_x, uint64_t n_nw, uint64_t n_pos,
                              uint64_t n_step, uint64_t n_q, uint64_t n_kc, uint64_t n_vc,
                              uint32_t tag) {
    OP_REQUIRE(k != 0 && k % op_block_elems(FMT) == 0 && hd != 0 && hd % 2 == 0 && n_nw == k &&
               n_step != 0 && mode <= 1 && n_x == n_pos * k && n_q == n_pos * n_head * hd &&
               n_kc == n_vc && n_kv != 0 && n_kc % ((uint64_t)n_kv * hd) == 0);
    if (SHARED && fb_shared_ok(n_pos, x, nw, k)) {
        const FbShared row{fb_shared_row(x, nw, k, eps), k};
        norm_qkv_rope_rows<FMT>(row, wq, wk, wv, positions, step, q, kc, vc, k, n_head, n_kv, hd,
                                base, mode, n_pos, n_kc, tag);
    } else {
        const FbPerWarp row{x, nw, k, eps, (int)(threadIdx.x & 31)};
        norm_qkv_rope_rows<FMT>(row, wq, wk, wv, positions, step, q, kc, vc, k, n_head, n_kv, hd,
                                base, mode, n_pos, n_kc, tag);
    }
}

// hidden = silu(norm(x) Wg) * (norm(x) Wu), one warp per output value; silu as the elementwise
// kernel writes it.
template <int FMT, typename RowX>
__device__ void norm_gate_up_rows(RowX row_x, const uint8_t* wg, const uint8_t* wu, float* hidden,
                                  uint32_t k, uint32_t n, uint64_t n_hidden) {
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    const bool even = (((uint64_t)wg | (uint64_t)wu) & 1u) == 0;
    for (uint64_t t = mm_warp_id(); t < n_hidden; t += mm_warp_count()) {
        const uint64_t r = t / n, o = t % n;
        const auto xn = row_x(r);
        const bool blocks = even && mm_blocks_ok<FMT>(xn, wg, k);
        float g, u;
        mm_dot_pair<FMT>(xn, wg + o * row_bytes, wu + o * row_bytes, k, row_bytes, lane, blocks,
                         row_x.stage(), g, u);
        if (lane == 0) hidden[t] = g / (1.0f + expf(-g)) * u;
    }
}

template <int FMT, bool SHARED>
__device__ void norm_gate_up(const float* x, const float* nw, const uint8_t* wg, const uint8_t* wu,
                             float* hidden, float eps, uint32_t k, uint32_t n, uint64_t n_x,
                             uint64_t n_nw, uint64_t n_hidden, uint32_t tag) {
    OP_REQUIRE(k != 0 && k % op_block_elems(FMT) == 0 && n_nw == k && n_x % k == 0 &&
               n_hidden == n_x / k * n);
    if (SHARED && fb_shared_ok(n_x / k, x, nw, k)) {
        const FbShared row{fb_shared_row(x, nw, k, eps), k};
        norm_gate_up_rows<FMT>(row, wg, wu, hidden, k, n, n_hidden);
    } else {
        const FbPerWarp row{x, nw, k, eps, (int)(threadIdx.x & 31)};
        norm_gate_up_rows<FMT>(row, wg, wu, hidden, k, n, n_hidden);
    }
}

#define NORM_QKV_ROPE_KERNEL(NAME, FMT, SH)                                                          \
    extern "C" __global__ void NAME(                                                                \
        const float* x, const float* nw, const uint8_t* wq, const uint8_t* wk, const uint8_t* wv,    \
        const int32_t* positions, const int32_t* step, float* q, float* kc, float* vc, float eps,    \
        uint32_t k, uint32_t n_head, uint32_t n_kv, uint32_t hd, float base, uint32_t mode,          \
        uint64_t n_x, uint64_t n_nw, uint64_t n_wq, uint64_t n_wk, uint64_t n_wv, uint64_t n_pos,    \
        uint64_t n_step, uint64_t n_q, uint64_t n_kc, uint64_t n_vc) {                               \
        norm_qkv_rope<FMT, SH>(x, nw, wq, wk, wv, positions, step, q, kc, vc, eps, k, n_head, n_kv, hd, \
                           base, mode, n_x, n_nw, n_pos, n_step, n_q, n_kc, n_vc, op_tag(#NAME));   \
    }
#define NORM_GATE_UP_KERNEL(NAME, FMT, SH)                                                           \
    extern "C" __global__ void NAME(const float* x, const float* nw, const uint8_t* wg,              \
                                    const uint8_t* wu, float* hidden, float eps, uint32_t k,          \
                                    uint32_t n, uint64_t n_x, uint64_t n_nw, uint64_t n_wg,           \
                                    uint64_t n_wu, uint64_t n_hidden) {                               \
        norm_gate_up<FMT, SH>(x, nw, wg, wu, hidden, eps, k, n, n_x, n_nw, n_hidden, op_tag(#NAME));    \
    }

NORM_QKV_ROPE_KERNEL(norm_qkv_rope_f32, OP_FMT_F32, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_f16, OP_FMT_F16, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_bf16, OP_FMT_BF16, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q4_0, OP_FMT_Q4_0, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q4_1, OP_FMT_Q4_1, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q8_0, OP_FMT_Q8_0, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q4_k, OP_FMT_Q4_K, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q6_k, OP_FMT_Q6_K, false)
NORM_GATE_UP_KERNEL(norm_gate_up_f32, OP_FMT_F32, false)
NORM_GATE_UP_KERNEL(norm_gate_up_f16, OP_FMT_F16, false)
NORM_GATE_UP_KERNEL(norm_gate_up_bf16, OP_FMT_BF16, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q4_0, OP_FMT_Q4_0, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q4_1, OP_FMT_Q4_1, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q8_0, OP_FMT_Q8_0, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q4_k, OP_FMT_Q4_K, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q6_k, OP_FMT_Q6_K, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_f32, OP_FMT_F32, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_f16, OP_FMT_F16, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_bf16, OP_FMT_BF16, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q4_0, OP_FMT_Q4_0, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q4_1, OP_FMT_Q4_1, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q8_0, OP_FMT_Q8_0, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q4_k, OP_FMT_Q4_K, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q6_k, OP_FMT_Q6_K, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_f32, OP_FMT_F32, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_f16, OP_FMT_F16, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_bf16, OP_FMT_BF16, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q4_0, OP_FMT_Q4_0, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q4_1, OP_FMT_Q4_1, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q8_0, OP_FMT_Q8_0, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q4_k, OP_FMT_Q4_K, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q6_k, OP_FMT_Q6_K, true)
