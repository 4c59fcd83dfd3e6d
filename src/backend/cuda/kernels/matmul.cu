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
//   formats (q4_0, q4_1, q5_0, q8_0) with a 16-byte aligned x, four lanes share a block and read
//   it as whole words (`mm_dot_blocks`); every other case reads one element per lane (`mm_dot`).
//   Launched with up to MM_Q8_THREADS threads and MM_Q8_BYTES(k) of dynamic shared memory (what
//   ops::matmul gives those formats), each block first quantizes x to int8 in shared memory and
//   its warps take two outputs at a time with `dp4a` (`mm_vector_q8`; Q4_0 rows of k a multiple of
//   64 a lane per pair of blocks, `mm_q8_rows_pairs_q4_0`, the others a lane per quarter block).
//   Both are in matmul_blocks.cuh and matmul_dots.cuh, compiled in front of this file (the fused
//   block kernels use them too).
// - 2 to 15 rows: one warp per output value and group of MM_ROWS rows, each weight value read once
//   for the group.
// - 16 rows and more (prefill, given MM_TILE_SMEM bytes of dynamic shared memory): the tiled form
//   (`mm_tiled`), a block per tile of rows x outputs staged through shared memory.
// The kernels `matmul_mma_<w>` and `matmul_add_mma_<w>` add the tensor-core form for long
// prompts (`mm_mma`, matmul_mma.cuh, compiled in front of this file with the weight staging).

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


// Most threads of a block of the int8 one-row form (a multiple of 32: narrow products take
// fewer warps a block, so that they spread over the SMs).
#define MM_Q8_THREADS 512

// Outputs from which the f32 one-row product of Q4_0 and Q4_1 rows sums its quarters one at a
// time rather than in batches (`mm_dot_blocks`): an output head's warps keep enough loads in
// flight, and the batches' compares cost the 8B's Q4_0 head 190 -> 199 us on an H100, while
// SmolLM2's 576- and 1,536-wide products (a warp an output) gained, and so did the Q8_0 heads of
// the 1B (128 -> 123 us) and SmolLM2 (31 -> 29 us), whose quarters take more loads each.
#define MM_BATCH_MAX_OUTPUTS 16384u
// Rows a warp of such an f32 one-row product (an output head) takes at once (`mm_blocks_rows`):
// each lane loads its quarter of x once for all of them, where one row a warp read x's 128 bytes
// a block for 18 (Q4_0) to 34 (Q8_0) bytes of weights; each row's sum keeps its order. Q8_0 rows
// of more than MM_HEAD_Q8_MAX_K values keep a warp an output (on an H100 the 8B's Q4_0 head gained
// 44 us and SmolLM2's Q8_0 head of 576-value rows 7-10, while the 1B's Q8_0 head of 2,048-value
// rows lost 4-6; docs/kernels.md item 26). The host sizes the grid the same way
// (`head_warps` in src/ops/matmul.rs).
#define MM_HEAD_ROWS 4
#define MM_HEAD_Q8_MAX_K 1024u

// Outputs a warp of the int8 one-row form takes at a time: two, or one where the grid has a warp
// for every output (the host then launches sixteen-warp blocks for fewer outputs rather than
// eight-warp ones: each SM quantizes the row once; `ops::matmul::vector_grid`).
__device__ __forceinline__ uint32_t mm_q8_rows_per_warp(uint32_t n) {
    return n <= mm_warp_count() ? 1u : 2u;
}

// Before the grid wait (prelude.cuh): a one-row product asks L2 for the weight rows its warp
// takes first (two in the int8 form's launch, else one), which no earlier kernel writes, so they
// load while the kernel before it finishes; then the block quantizes x meanwhile.
template <int FMT>
__device__ __forceinline__ void mm_prefetch_first(const uint8_t* w, uint32_t rows, uint32_t k,
                                                  uint32_t n) {
    if (rows != 1 || k == 0 || k % op_block_elems(FMT) != 0) return;
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const bool q8 = mm_q8_format<FMT>() && k % 32 == 0 && blockDim.x % 32 == 0 &&
                    mm_dynamic_smem() >= MM_Q8_BYTES(k) &&
                    mm_dynamic_smem() != MM_HEAD_SMEM(k, FMT);
    const uint32_t per = q8 ? mm_q8_rows_per_warp(n) : 1;
    const uint64_t first = per * mm_warp_id();
    for (uint64_t r = first; r < first + per && r < n; ++r)
        mm_prefetch_row(w + r * row_bytes, row_bytes);
}

// The one-row form on int8 activations (see the top of this file and matmul_blocks.cuh): false
// (nothing done) where the format, the launch or the alignment does not allow it. Each warp's
// first two weight rows were asked of L2 before the grid wait (`mm_prefetch_first`).
// (Reading the rows through `mm_dot_staged`'s 16-byte stage measured no faster here: 8B 276.9 ->
// 274.5 tok/s, 1B 868.8 -> 820.3 on an H100.)
template <int FMT, bool ACC, typename X>
__device__ __forceinline__ bool mm_vector_q8(X x, const uint8_t* w, float* out, uint32_t k,
                                             uint32_t n, uint64_t row_bytes) {
    if (!mm_q8_format<FMT>() || mm_dynamic_smem() == MM_HEAD_SMEM(k, FMT) ||
        blockDim.x > MM_Q8_THREADS || blockDim.x % 32 != 0 ||
        blockDim.y != 1 || k % 32 != 0 || (uint64_t)n * k < MM_Q8_MIN_WEIGHTS || !x.aligned16() ||
        !mm_q8_rows_ok<FMT>(w, row_bytes) || mm_dynamic_smem() < MM_Q8_BYTES(k))
        return false;
    extern __shared__ __align__(16) float mm_smem[];
    int* q = (int*)mm_smem;
    float2* ds = (float2*)((uint8_t*)mm_smem + k);
    const int lane = threadIdx.x & 31;
    const uint32_t per = mm_q8_rows_per_warp(n);
    const uint64_t first = per * mm_warp_id(), step = per * mm_warp_count();
    const bool pairs = FMT == OP_FMT_Q4_0 && mm_q8_pairs_ok(w, k);
    mm_quantize_row<mm_q8_swizzled<FMT>()>(x, k, q, ds);
    __syncthreads();
    const XQ8 xq{nullptr, q, ds, 0};
    for (uint64_t o = first; o < n; o += step) {
        // One output a warp, or an odd last output: the warp's second row is its first (summed
        // twice from the same loads, the second result unused).
        const uint64_t o1 = per == 2 && o + 1 < n ? o + 1 : o;
        float a, b;
        if (pairs)  // a lane a pair of blocks (`mm_q8_rows_pairs_q4_0`)
            mm_q8_rows_pairs_q4_0(xq, w + o * row_bytes, w + o1 * row_bytes, k, lane, a, b);
        else
            mm_q8_dot2<FMT>(xq, w + o * row_bytes, w + o1 * row_bytes, k, lane, a, b);
        if (lane == 0) {
            out[o] = ACC ? out[o] + a : a;
            if (o1 != o) out[o1] = ACC ? out[o1] + b : b;
        }
    }
    return true;
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
        // An output head launched for the tensor-core form (`matmul_head.cuh`; never a residual
        // add, whose kernels keep their registers).
        const float* xf = ACC ? nullptr : mm_plain_row(x);
        if (xf != nullptr && n >= MM_BATCH_MAX_OUTPUTS &&
            mm_head_split_ok<FMT>(xf, w, k, n, row_bytes) &&
            mm_head_split<FMT, ACC>(xf, w, out, k, n, row_bytes))
            return;
        if (mm_vector_q8<FMT, ACC>(x, w, out, k, n, row_bytes)) return;
        if (blocks && n >= MM_BATCH_MAX_OUTPUTS && (FMT != OP_FMT_Q8_0 || k <= MM_HEAD_Q8_MAX_K)) {
            constexpr uint32_t R = MM_HEAD_ROWS;
            for (uint64_t o0 = mm_warp_id() * R; o0 < n; o0 += mm_warp_count() * R) {
                const uint8_t* rs[R];
#pragma unroll
                for (uint32_t r = 0; r < R; ++r) rs[r] = w + (o0 + r < n ? o0 + r : n - 1) * row_bytes;
                float v[R];
                mm_blocks_rows<FMT, R>(x, rs, k, lane, v);
                if (lane == 0) {
#pragma unroll
                    for (uint32_t r = 0; r < R; ++r)
                        if (o0 + r < n) out[o0 + r] = ACC ? out[o0 + r] + v[r] : v[r];
                }
            }
            return;
        }
        const bool batched =
            n < MM_BATCH_MAX_OUTPUTS || (FMT != OP_FMT_Q4_0 && FMT != OP_FMT_Q4_1);
        for (uint64_t o = mm_warp_id(); o < n; o += mm_warp_count()) {
            const uint8_t* wr = w + o * row_bytes;
            const float v =
                blocks ? mm_dot_blocks<FMT>(x, wr, k, lane, batched) : mm_dot<FMT>(x, wr, k, lane);
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

// The tensor-core kernels (`matmul_mma_<w>`, `matmul_add_mma_<w>`): launched with MMA_THREADS
// threads and MMA_SMEM bytes of dynamic shared memory they take the f16 `mma.sync` form; on an
// architecture without it (or launched otherwise) they compute what `matmul` does.
template <int FMT, bool ACC, typename X>
__device__ void matmul_mma(X x, const uint8_t* w, float* out, uint32_t rows, uint32_t k, uint32_t n,
                           uint64_t n_x, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_out == (uint64_t)rows * n);
    if (blockDim.x == MMA_THREADS && blockDim.y == 1 && blockDim.z == 1 &&
        mm_dynamic_smem() >= MMA_SMEM &&
        (mm_mma_pipe<FMT, ACC>(x.x, w, out, rows, k, n, op_row_bytes(FMT, k)) ||
         mm_mma<FMT, ACC>(x, w, out, rows, k, n, op_row_bytes(FMT, k))))
        return;
    matmul<FMT, ACC>(x, w, out, rows, k, n, n_x, n_out, tag);
}

// Three products of one x (`matmul3_mma_<w>`, the fusion of `ops/matmul_triple.rs`): the
// pipelined form over the three's output tiles side by side; where it does not apply, the three
// `matmul_mma` one after the other over the same grid (each strides over its own tiles).
template <int FMT>
__device__ void matmul3_mma(const float* x, const Mm3& m, uint32_t rows, uint32_t k, uint64_t n_x,
                            uint64_t n_out0, uint64_t n_out1, uint64_t n_out2, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_out0 == (uint64_t)rows * m.n0 && n_out1 == (uint64_t)rows * m.n1 &&
               n_out2 == (uint64_t)rows * m.n2);
    if (blockDim.x == MMA_THREADS && blockDim.y == 1 && blockDim.z == 1 &&
        mm_mma_pipe3<FMT>(x, m, rows, k, op_row_bytes(FMT, k)))
        return;
#pragma unroll 1
    for (int p = 0; p < 3; ++p)
        matmul_mma<FMT, false>(XPlain{x}, m.w(p), m.out(p), rows, k, m.n(p), n_x,
                               (uint64_t)rows * m.n(p), tag);
}

// The products of `matmul_mma_h_<w>` and `matmul_add_mma_h_<w>` (ACC: added into the output;
// `products` 1, the Mm3's first) and `matmul3_mma_h_<w>` on f16 activations (matmul_mma_h.cuh): the fast form, else each product in the two-buffer form
// (or, launched otherwise, the CUDA-core forms) on `XHalf`.
template <int FMT, bool ACC, int products>
__device__ void matmul_mma_h(const __half* x, const Mm3& m, uint32_t rows,
                             uint32_t k, uint64_t n_x, const uint64_t (&n_out)[3], uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k);
    for (int p = 0; p < products; ++p) OP_REQUIRE(n_out[p] == (uint64_t)rows * m.n(p));
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const bool block = blockDim.x == MMA_THREADS && blockDim.y == 1 && blockDim.z == 1;
    if (block && mm_wgmma<FMT, ACC, products>(x, m, rows, k, row_bytes)) return;
    if (block && mm_mma_h<FMT, ACC, products>(x, m, rows, k, row_bytes)) return;
#pragma unroll 1
    for (int p = 0; p < products; ++p) {
        if (block && mm_dynamic_smem() >= MMA_SMEM &&
            mm_mma<FMT, ACC>(XHalf{x}, m.w(p), m.out(p), rows, k, m.n(p), row_bytes))
            continue;
        matmul<FMT, ACC>(XHalf{x}, m.w(p), m.out(p), rows, k, m.n(p), n_x, n_out[p], tag);
    }
}

// `matmul_swiglu_mma_h_<w>`: silu(x . wg) * (x . wu) in f16: the Hopper form (matmul_wgmma.cuh),
// else matmul_mma_h.cuh's `mmsw_tiles`. Only those: the optimizer fuses where one applies (Q4_0,
// Q4_1, Q5_0 weights, and on sm_90a Q8_0, Q4_K and Q6_K, k a multiple of 64, x 16-byte and the
// weights aligned, `ops::matmul_swiglu`) and launches a block of MMA_THREADS with its shared
// memory; any other launch fails its check.
template <int FMT>
__device__ void matmul_swiglu_mma_h(const __half* x, const uint8_t* wg, const uint8_t* wu,
                                    __half* out, uint32_t rows, uint32_t k, uint32_t n,
                                    uint64_t n_x, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_out == (uint64_t)rows * n);
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const Mm3 pair{wg, wu, wu, nullptr, nullptr, nullptr, n, n, n};
    if (mm_wgmma<FMT, false, 1, true>(x, pair, rows, k, row_bytes, out)) return;
    OP_REQUIRE(blockDim.x == MMA_THREADS && blockDim.y == 1 && blockDim.z == 1 &&
               mmh_applies<FMT>(x, wg, k, row_bytes) && mmh_applies<FMT>(x, wu, k, row_bytes));
#if __CUDA_ARCH__ >= 800
    if constexpr (MmhFormat<FMT>::fast) {
        if (mmp_short_tiles(rows))
            mmsw_tiles<FMT, 64>(x, wg, wu, out, rows, k, n, row_bytes);
        else
            mmsw_tiles<FMT, 128>(x, wg, wu, out, rows, k, n, row_bytes);
    }
#endif
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
        mm_prefetch_first<FMT>(w, rows, k, n);                                                        \
        OP_GRID_ENTRY();                                                                              \
        matmul<FMT, false>(XPlain{x}, w, out, rows, k, n, n_x, n_out, op_tag(#NAME));              \
    }
// The fusion of a matmul with the in-place add of its output into `acc` (src/ops/matmul_fused.rs).
#define MATMUL_ADD_KERNEL(NAME, FMT)                                                                \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, float* acc, uint32_t rows,      \
                                    uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_w,               \
                                    uint64_t n_acc) {                                                 \
        mm_prefetch_first<FMT>(w, rows, k, n);                                                        \
        OP_GRID_ENTRY();                                                                              \
        matmul<FMT, true>(XPlain{x}, w, acc, rows, k, n, n_x, n_acc, op_tag(#NAME));               \
    }
// Two blocks an SM (at most 128 registers a thread): one block's loads overlap the other's
// products.
#define MATMUL_MMA_KERNEL(NAME, FMT, ACC)                                                           \
    extern "C" __global__ __launch_bounds__(MMA_THREADS, 2) void NAME(                              \
        const float* x, const uint8_t* w, float* out, uint32_t rows, uint32_t k, uint32_t n,          \
        uint64_t n_x, uint64_t n_w, uint64_t n_out) {                                                 \
        OP_GRID_ENTRY();                                                                              \
        matmul_mma<FMT, ACC>(XPlain{x}, w, out, rows, k, n, n_x, n_out, op_tag(#NAME));            \
    }
#define MATMUL3_MMA_KERNEL(NAME, FMT)                                                              \
    extern "C" __global__ __launch_bounds__(MMA_THREADS, 2) void NAME(                              \
        const float* x, const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, float* out0,         \
        float* out1, float* out2, uint32_t rows, uint32_t k, uint32_t n0, uint32_t n1, uint32_t n2,   \
        uint64_t n_x, uint64_t n_w0, uint64_t n_w1, uint64_t n_w2, uint64_t n_out0, uint64_t n_out1,  \
        uint64_t n_out2) {                                                                            \
        OP_GRID_ENTRY();                                                                              \
        const Mm3 m{w0, w1, w2, out0, out1, out2, n0, n1, n2};                                        \
        matmul3_mma<FMT>(x, m, rows, k, n_x, n_out0, n_out1, n_out2, op_tag(#NAME));                  \
    }
#define MATMUL_MMA_H_KERNEL(NAME, FMT)                                                             \
    extern "C" __global__ __launch_bounds__(MMA_THREADS, 2) void NAME(                              \
        const __half* x, const uint8_t* w, float* out, uint32_t rows, uint32_t k, uint32_t n,         \
        uint64_t n_x, uint64_t n_w, uint64_t n_out) {                                                 \
        OP_GRID_ENTRY();                                                                              \
        const Mm3 m{w, w, w, out, out, out, n, n, n};                                                 \
        const uint64_t outs[3] = {n_out, n_out, n_out};                                               \
        matmul_mma_h<FMT, false, 1>(x, m, rows, k, n_x, outs, op_tag(#NAME));                                \
    }
#define MATMUL3_MMA_H_KERNEL(NAME, FMT)                                                            \
    extern "C" __global__ __launch_bounds__(MMA_THREADS, 2) void NAME(                              \
        const __half* x, const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, float* out0,       \
        float* out1, float* out2, uint32_t rows, uint32_t k, uint32_t n0, uint32_t n1, uint32_t n2,   \
        uint64_t n_x, uint64_t n_w0, uint64_t n_w1, uint64_t n_w2, uint64_t n_out0, uint64_t n_out1,  \
        uint64_t n_out2) {                                                                            \
        OP_GRID_ENTRY();                                                                              \
        const Mm3 m{w0, w1, w2, out0, out1, out2, n0, n1, n2};                                        \
        const uint64_t outs[3] = {n_out0, n_out1, n_out2};                                            \
        matmul_mma_h<FMT, false, 3>(x, m, rows, k, n_x, outs, op_tag(#NAME));                                \
    }
#define MATMUL_ADD_MMA_H_KERNEL(NAME, FMT)                                                         \
    extern "C" __global__ __launch_bounds__(MMA_THREADS, 2) void NAME(                              \
        const __half* x, const uint8_t* w, float* acc, uint32_t rows, uint32_t k, uint32_t n,         \
        uint64_t n_x, uint64_t n_w, uint64_t n_acc) {                                                 \
        OP_GRID_ENTRY();                                                                              \
        const Mm3 m{w, w, w, acc, acc, acc, n, n, n};                                                 \
        const uint64_t outs[3] = {n_acc, n_acc, n_acc};                                               \
        matmul_mma_h<FMT, true, 1>(x, m, rows, k, n_x, outs, op_tag(#NAME));                          \
    }
#define MATMUL_SWIGLU_MMA_H_KERNEL(NAME, FMT)                                                      \
    extern "C" __global__ __launch_bounds__(MMA_THREADS, 2) void NAME(                              \
        const __half* x, const uint8_t* wg, const uint8_t* wu, __half* out, uint32_t rows,           \
        uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_wg, uint64_t n_wu, uint64_t n_out) {         \
        OP_GRID_ENTRY();                                                                              \
        matmul_swiglu_mma_h<FMT>(x, wg, wu, out, rows, k, n, n_x, n_out, op_tag(#NAME));            \
    }
#define MATMUL_ID_KERNEL(NAME, FMT)                                                                 \
    extern "C" __global__ void NAME(const float* x, const uint8_t* w, const int32_t* ids, float* out, \
                                    uint32_t rows, uint32_t k, uint32_t n, uint32_t slots,            \
                                    uint32_t experts, uint64_t n_x, uint64_t n_w, uint64_t n_ids,     \
                                    uint64_t n_out) {                                                 \
        OP_GRID_ENTRY();                                                                              \
        matmul_id<FMT>(x, w, ids, out, rows, k, n, slots, experts, n_x, n_ids, n_out,                 \
                       op_tag(#NAME));                                                                \
    }

MATMUL_KERNEL(matmul_f32, OP_FMT_F32)
MATMUL_KERNEL(matmul_f16, OP_FMT_F16)
MATMUL_KERNEL(matmul_bf16, OP_FMT_BF16)
MATMUL_KERNEL(matmul_q4_0, OP_FMT_Q4_0)
MATMUL_KERNEL(matmul_q4_1, OP_FMT_Q4_1)
MATMUL_KERNEL(matmul_q5_0, OP_FMT_Q5_0)
MATMUL_KERNEL(matmul_q8_0, OP_FMT_Q8_0)
MATMUL_KERNEL(matmul_q4_k, OP_FMT_Q4_K)
MATMUL_KERNEL(matmul_q6_k, OP_FMT_Q6_K)
MATMUL_ADD_KERNEL(matmul_add_f32, OP_FMT_F32)
MATMUL_ADD_KERNEL(matmul_add_f16, OP_FMT_F16)
MATMUL_ADD_KERNEL(matmul_add_bf16, OP_FMT_BF16)
MATMUL_ADD_KERNEL(matmul_add_q4_0, OP_FMT_Q4_0)
MATMUL_ADD_KERNEL(matmul_add_q4_1, OP_FMT_Q4_1)
MATMUL_ADD_KERNEL(matmul_add_q5_0, OP_FMT_Q5_0)
MATMUL_ADD_KERNEL(matmul_add_q8_0, OP_FMT_Q8_0)
MATMUL_ADD_KERNEL(matmul_add_q4_k, OP_FMT_Q4_K)
MATMUL_ADD_KERNEL(matmul_add_q6_k, OP_FMT_Q6_K)
MATMUL_MMA_KERNEL(matmul_mma_f32, OP_FMT_F32, false)
MATMUL_MMA_KERNEL(matmul_mma_f16, OP_FMT_F16, false)
MATMUL_MMA_KERNEL(matmul_mma_bf16, OP_FMT_BF16, false)
MATMUL_MMA_KERNEL(matmul_mma_q4_0, OP_FMT_Q4_0, false)
MATMUL_MMA_KERNEL(matmul_mma_q4_1, OP_FMT_Q4_1, false)
MATMUL_MMA_KERNEL(matmul_mma_q5_0, OP_FMT_Q5_0, false)
MATMUL_MMA_KERNEL(matmul_mma_q8_0, OP_FMT_Q8_0, false)
MATMUL_MMA_KERNEL(matmul_mma_q4_k, OP_FMT_Q4_K, false)
MATMUL_MMA_KERNEL(matmul_mma_q6_k, OP_FMT_Q6_K, false)
MATMUL_MMA_KERNEL(matmul_add_mma_f32, OP_FMT_F32, true)
MATMUL_MMA_KERNEL(matmul_add_mma_f16, OP_FMT_F16, true)
MATMUL_MMA_KERNEL(matmul_add_mma_bf16, OP_FMT_BF16, true)
MATMUL_MMA_KERNEL(matmul_add_mma_q4_0, OP_FMT_Q4_0, true)
MATMUL_MMA_KERNEL(matmul_add_mma_q4_1, OP_FMT_Q4_1, true)
MATMUL_MMA_KERNEL(matmul_add_mma_q5_0, OP_FMT_Q5_0, true)
MATMUL_MMA_KERNEL(matmul_add_mma_q8_0, OP_FMT_Q8_0, true)
MATMUL_MMA_KERNEL(matmul_add_mma_q4_k, OP_FMT_Q4_K, true)
MATMUL_MMA_KERNEL(matmul_add_mma_q6_k, OP_FMT_Q6_K, true)
MATMUL3_MMA_KERNEL(matmul3_mma_f32, OP_FMT_F32)
MATMUL3_MMA_KERNEL(matmul3_mma_f16, OP_FMT_F16)
MATMUL3_MMA_KERNEL(matmul3_mma_bf16, OP_FMT_BF16)
MATMUL3_MMA_KERNEL(matmul3_mma_q4_0, OP_FMT_Q4_0)
MATMUL3_MMA_KERNEL(matmul3_mma_q4_1, OP_FMT_Q4_1)
MATMUL3_MMA_KERNEL(matmul3_mma_q5_0, OP_FMT_Q5_0)
MATMUL3_MMA_KERNEL(matmul3_mma_q8_0, OP_FMT_Q8_0)
MATMUL3_MMA_KERNEL(matmul3_mma_q4_k, OP_FMT_Q4_K)
MATMUL3_MMA_KERNEL(matmul3_mma_q6_k, OP_FMT_Q6_K)
MATMUL_MMA_H_KERNEL(matmul_mma_h_f32, OP_FMT_F32)
MATMUL_MMA_H_KERNEL(matmul_mma_h_f16, OP_FMT_F16)
MATMUL_MMA_H_KERNEL(matmul_mma_h_bf16, OP_FMT_BF16)
MATMUL_MMA_H_KERNEL(matmul_mma_h_q4_0, OP_FMT_Q4_0)
MATMUL_MMA_H_KERNEL(matmul_mma_h_q4_1, OP_FMT_Q4_1)
MATMUL_MMA_H_KERNEL(matmul_mma_h_q5_0, OP_FMT_Q5_0)
MATMUL_MMA_H_KERNEL(matmul_mma_h_q8_0, OP_FMT_Q8_0)
MATMUL_MMA_H_KERNEL(matmul_mma_h_q4_k, OP_FMT_Q4_K)
MATMUL_MMA_H_KERNEL(matmul_mma_h_q6_k, OP_FMT_Q6_K)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_f32, OP_FMT_F32)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_f16, OP_FMT_F16)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_bf16, OP_FMT_BF16)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_q4_0, OP_FMT_Q4_0)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_q4_1, OP_FMT_Q4_1)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_q5_0, OP_FMT_Q5_0)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_q8_0, OP_FMT_Q8_0)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_q4_k, OP_FMT_Q4_K)
MATMUL3_MMA_H_KERNEL(matmul3_mma_h_q6_k, OP_FMT_Q6_K)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_f32, OP_FMT_F32)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_f16, OP_FMT_F16)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_bf16, OP_FMT_BF16)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_q4_0, OP_FMT_Q4_0)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_q4_1, OP_FMT_Q4_1)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_q5_0, OP_FMT_Q5_0)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_q8_0, OP_FMT_Q8_0)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_q4_k, OP_FMT_Q4_K)
MATMUL_ADD_MMA_H_KERNEL(matmul_add_mma_h_q6_k, OP_FMT_Q6_K)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_f32, OP_FMT_F32)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_f16, OP_FMT_F16)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_bf16, OP_FMT_BF16)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_q4_0, OP_FMT_Q4_0)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_q4_1, OP_FMT_Q4_1)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_q5_0, OP_FMT_Q5_0)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_q8_0, OP_FMT_Q8_0)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_q4_k, OP_FMT_Q4_K)
MATMUL_SWIGLU_MMA_H_KERNEL(matmul_swiglu_mma_h_q6_k, OP_FMT_Q6_K)
MATMUL_ID_KERNEL(matmul_id_f32, OP_FMT_F32)
MATMUL_ID_KERNEL(matmul_id_f16, OP_FMT_F16)
MATMUL_ID_KERNEL(matmul_id_bf16, OP_FMT_BF16)
MATMUL_ID_KERNEL(matmul_id_q4_0, OP_FMT_Q4_0)
MATMUL_ID_KERNEL(matmul_id_q4_1, OP_FMT_Q4_1)
MATMUL_ID_KERNEL(matmul_id_q5_0, OP_FMT_Q5_0)
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
        OP_GRID_ENTRY();                                                                              \
        matmul_affine<S>(x, w, scales, biases, out, rows, k, n, bits, group, n_x, n_w, n_scales,      \
                         n_biases, n_out, op_tag(#NAME));                                             \
    }

MATMUL_AFFINE_KERNEL(matmul_affine_f32, float)
MATMUL_AFFINE_KERNEL(matmul_affine_f16, __half)
