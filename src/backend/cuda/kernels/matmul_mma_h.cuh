// The tensor-core prompt products on f16 activations (`matmul_mma_h_<w>`, `matmul3_mma_h_<w>`;
// compiled after matmul_mma_pipe.cuh, whose copies, fragments and tile bookkeeping they share).
// What the optimizer's narrowing (`graph::passes::narrow`) makes of a product whose x an f32 norm
// wrote: the norm writes x rounded to f16, which is what the f32 forms round it to before their
// `mma`, so the products see the same operands and give the same bits.
//
// The fast form (Q4_0, Q4_1, Q5_0, rows 4-byte aligned, k a multiple of 64, x 16-byte aligned):
// 64-value steps, each step's f16 activations copied by `cp.async` straight into the padded
// layout `ldmatrix` reads (no conversion in the block) and the step's two raw weight blocks a row
// beside them, MMH_STAGES slots; the weights of step s + 1 dequantized into one of two f16
// buffers after step s's products. Measured in `benches/cuda/gemm_q4_0.cu` (`p16 k64 s3`, the
// same schedule): 182-202 TFLOP/s on the Llama 3.1 8B prompt shapes against the f32 form's
// 130-160. Other formats and alignments take the two-buffer form on f16 activations (`XHalf`).

// An f16 activation row (the `X` type of the f32 forms' fallbacks): values widened to f32.
struct XHalf {
    const __half* x;
    __device__ __forceinline__ float at(uint64_t i) const { return __half2float(x[i]); }
    __device__ __forceinline__ float4 at4(uint64_t i) const {
        const uint2 u = *(const uint2*)(x + i);
        const float2 a = __half22float2(*(const __half2*)&u.x);
        const float2 b = __half22float2(*(const __half2*)&u.y);
        return make_float4(a.x, a.y, b.x, b.y);
    }
    // `at4` reads 8 bytes: an 8-byte aligned row takes the vector loads.
    __device__ __forceinline__ bool aligned16() const { return ((uint64_t)x & 7u) == 0; }
    __device__ __forceinline__ XHalf row(uint64_t off) const { return XHalf{x + off}; }
};

#define MMH_STAGES 3
#define MMH_BK 64
#define MMH_LD (MMH_BK + 8)
// A slot: 128 activation rows of 64 f16 values (rows padded to MMH_LD), then 128 weight rows of
// the step's two blocks (at most 11 words: Q5_0's 44 bytes).
#define MMH_A_BYTES (MMA_BM * MMH_LD * 2)
#define MMH_SLOT (MMH_A_BYTES + MMA_BN * 44)
#define MMH_SMEM (MMH_STAGES * MMH_SLOT + 2 * MMA_BN * MMH_LD * 2)

template <int FMT>
struct MmhFormat {
    static constexpr bool fast = FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q5_0;
    static constexpr uint32_t bytes = FMT == OP_FMT_Q5_0 ? 22 : FMT == OP_FMT_Q4_1 ? 20 : 18;
    // Words of a row's step (two blocks), and the copies of a slot's weight rows.
    static constexpr uint32_t words = 2 * bytes / 4;
    static constexpr uint32_t copies = (MMA_BN * words + MMA_THREADS - 1) / MMA_THREADS;
};

#if __CUDA_ARCH__ >= 800
// The weight row (from output o0) of a SwiGLU tile's row b (`mmsw_tiles`): warp column wn = b / 32
// takes 16 outputs, as four 8-row groups gate, up, gate, up; `(b >> 3) & 1` is up's.
__device__ __forceinline__ uint32_t mmsw_row(uint32_t b) {
    return (b / 32) * 16 + ((b % 32) / 16) * 8 + b % 8;
}

// Copies step s (values 64 s ..) of the tile at rows r0, outputs o0 into `slot`. SW: a SwiGLU
// tile, its rows from `w` (gate) and `w2` (up) as `mmsw_row` says.
template <int FMT, int BM, bool SW = false>
__device__ __forceinline__ void mmh_issue(uint8_t* slot, const __half* x, const uint8_t* w,
                                          uint32_t r0, uint32_t o0, uint32_t rows, uint32_t k,
                                          uint32_t n, uint64_t row_bytes, uint32_t s,
                                          const uint8_t* w2 = nullptr) {
    using F = MmhFormat<FMT>;
    const uint32_t t = threadIdx.x;
    __half* a = (__half*)slot;
    // BM rows of 8 16-byte chunks: BM / 32 chunks a thread.
#pragma unroll
    for (int j = 0; j < BM / 32; ++j) {
        const uint32_t c = t + MMA_THREADS * j, r = c / 8, q = c % 8;
        const bool live = r0 + r < rows;
        op_cp_async<16>(a + r * MMH_LD + 8 * q,
                     live ? x + (uint64_t)(r0 + r) * k + (uint64_t)s * MMH_BK + 8 * q : x, live);
    }
    uint8_t* b = slot + MMH_A_BYTES;
    // Not unrolled: unrolled, the compiler keeps every copy's address across the main loop and
    // the 128-row tiles spill to local memory (measured: 440 MB of local loads a gate product).
#pragma unroll 1
    for (int i = 0; i < (int)F::copies; ++i) {
        const uint32_t c = t + MMA_THREADS * i, o = c / F::words, u = c % F::words;
        const uint32_t row = o0 + (SW ? mmsw_row(o) : o);
        const uint8_t* src = SW && ((o >> 3) & 1) ? w2 : w;
        const bool live = c < MMA_BN * F::words && row < n;
        if (c < MMA_BN * F::words)
            op_cp_async<4>(b + 4 * c,
                        live ? src + (uint64_t)row * row_bytes + (uint64_t)s * 2 * F::bytes + 4 * u
                             : w,
                        live);
    }
}

// Dequantizes step s's weights in `slot` into the f16 buffer `bs`: thread t takes row t / 2,
// block t % 2 of the step, both halves, as `mmp_convert` does a block.
template <int FMT>
__device__ __forceinline__ void mmh_convert(const uint8_t* slot, __half* bs) {
    using F = MmhFormat<FMT>;
    const uint32_t t = threadIdx.x, o = t / 2, blk = t % 2;
    const uint8_t* row = slot + MMH_A_BYTES + o * F::words * 4;
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
        const MmRaw raw = mm_raw_load<FMT>(row, blk, h);
        uint4 q0, q1;
        if constexpr (FMT == OP_FMT_Q5_0) {
            float v[16];
            mm_raw_values<FMT>(raw, h, v);
            q0 = make_uint4(mma_pack(v[0], v[1]), mma_pack(v[2], v[3]), mma_pack(v[4], v[5]),
                            mma_pack(v[6], v[7]));
            q1 = make_uint4(mma_pack(v[8], v[9]), mma_pack(v[10], v[11]), mma_pack(v[12], v[13]),
                            mma_pack(v[14], v[15]));
        } else {
            uint32_t hv[8];
            mm_raw_halves<FMT>(raw, h, hv);
            q0 = make_uint4(hv[0], hv[1], hv[2], hv[3]);
            q1 = make_uint4(hv[4], hv[5], hv[6], hv[7]);
        }
        __half* dst = bs + o * MMH_LD + 32 * blk + 16 * h;
        *(uint4*)dst = q0;
        *(uint4*)(dst + 8) = q1;
    }
}
#endif

#if __CUDA_ARCH__ >= 800
// A SwiGLU tile's values into the f16 `out` (rows x n): the accumulators of 8-output groups j = 0
// and 2 are gate's, j = 1 and 3 up's of the same outputs (`mmsw_row`); each value is the f32
// SwiGLU of the elementwise kernel (`OpSwiglu`), rounded to f16.
template <int MI>
__device__ __forceinline__ void mmsw_write(const float (&acc)[MI][4][4], __half* out, uint64_t r0,
                                           uint64_t o0, uint32_t rows, uint32_t n, int wm, int wn,
                                           int lane) {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int jp = 0; jp < 2; ++jp) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const uint64_t gr = r0 + wm * 16 * MI + i * 16 + lane / 4 + 8 * hf;
                const uint64_t go = o0 + wn * 16 + jp * 8 + 2 * (lane % 4);
                if (gr >= rows || go >= n) continue;
                __half* y = out + gr * n + go;
                const __half v0 = __float2half_rn(
                    act_silu(acc[i][2 * jp][2 * hf]) * acc[i][2 * jp + 1][2 * hf]);
                const __half v1 = __float2half_rn(
                    act_silu(acc[i][2 * jp][2 * hf + 1]) * acc[i][2 * jp + 1][2 * hf + 1]);
                if (go + 1 < n && ((uint64_t)y & 3u) == 0) {
                    *(__half2*)y = __halves2half2(v0, v1);
                } else {
                    y[0] = v0;
                    if (go + 1 < n) y[1] = v1;
                }
            }
        }
    }
}
#endif

// One tile of BM rows from row r0 and output o0, on f16 activations (see the top of the file).
// SW: a SwiGLU tile of gate `w` and up `w2` (`mmsw_tiles`), written to `hout`, not `out`.
template <int FMT, bool ACC, int BM, bool SW = false>
__device__ __forceinline__ void mmh_tile(const __half* x, const uint8_t* w, float* out,
                                         uint32_t rows, uint32_t k, uint32_t n,
                                         uint64_t row_bytes, uint64_t r0, uint64_t o0,
                                         const uint8_t* w2 = nullptr, __half* hout = nullptr) {
#if __CUDA_ARCH__ >= 800
    constexpr int MI = BM / 32;
    extern __shared__ __align__(16) float mm_smem[];
    uint8_t* ring = (uint8_t*)mm_smem;
    __half* bf = (__half*)(ring + MMH_STAGES * MMH_SLOT);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / 4, wn = warp % 4;
    const uint32_t steps = k / MMH_BK;
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    // Steps 0 .. MMH_STAGES - 2 in flight, then step 0's weights converted.
#pragma unroll
    for (uint32_t s = 0; s + 1 < MMH_STAGES; ++s) {
        if (s < steps)
            mmh_issue<FMT, BM, SW>(ring + s * MMH_SLOT, x, w, (uint32_t)r0, (uint32_t)o0, rows, k,
                                   n, row_bytes, s, w2);
        op_cp_commit();
    }
    op_cp_wait<MMH_STAGES - 2>();
    __syncthreads();
    mmh_convert<FMT>(ring, bf);
    for (uint32_t s = 0; s < steps; ++s) {
        // Step s + 1 has landed; every warp is done with step s - 1's products, so its slot
        // (activations read by `ldmatrix`) and step s + 1's f16 buffer are free.
        op_cp_wait<MMH_STAGES - 3>();
        __syncthreads();
        if (s + MMH_STAGES - 1 < steps)
            mmh_issue<FMT, BM, SW>(ring + ((s + MMH_STAGES - 1) % MMH_STAGES) * MMH_SLOT, x, w,
                                   (uint32_t)r0, (uint32_t)o0, rows, k, n, row_bytes,
                                   s + MMH_STAGES - 1, w2);
        op_cp_commit();
        const __half* as = (const __half*)(ring + (s % MMH_STAGES) * MMH_SLOT);
        const __half* bs = bf + (s % 2) * MMA_BN * MMH_LD;
        mma_step<MI, MMH_BK, MMH_LD>(acc, as, bs, wm, wn, lane);
        if (s + 1 < steps)
            mmh_convert<FMT>(ring + ((s + 1) % MMH_STAGES) * MMH_SLOT,
                             bf + ((s + 1) % 2) * MMA_BN * MMH_LD);
    }
    // No copy left in flight (the last groups are empty) before the next tile reuses the slots.
    op_cp_wait<0>();
    __syncthreads();
    if constexpr (SW)
        mmsw_write<MI>(acc, hout, r0, o0, rows, n, wm, wn, lane);
    else
        mma_write<ACC, MI>(acc, out, r0, o0, rows, n, wm, wn, lane);
#endif
}

// Whether the fast form takes weights `w` with f16 activations `x`.
template <int FMT>
__device__ __forceinline__ bool mmh_applies(const __half* x, const uint8_t* w, uint32_t k,
                                            uint64_t row_bytes) {
    if constexpr (!MmhFormat<FMT>::fast) return false;
    return k % MMH_BK == 0 && ((uint64_t)x & 15u) == 0 && ((uint64_t)w & 3u) == 0 &&
           row_bytes % 4 == 0 && mm_dynamic_smem() >= MMH_SMEM;
}

// The tiles of P products (1, or 3 side by side) this block takes. The product of a tile is
// chosen by comparisons, not an array indexed at run time (which would live in local memory).
template <int FMT, bool ACC, int P, int BM>
__device__ __forceinline__ void mmh_tiles(const __half* x, const Mm3& m, uint32_t rows, uint32_t k,
                                          uint64_t row_bytes) {
    const uint64_t t0 = ((uint64_t)m.n0 + MMA_BN - 1) / MMA_BN;
    const uint64_t t1 = P == 1 ? 0 : ((uint64_t)m.n1 + MMA_BN - 1) / MMA_BN;
    const uint64_t tiles_n = P == 1 ? t0 : t0 + t1 + ((uint64_t)m.n2 + MMA_BN - 1) / MMA_BN;
    const uint64_t tiles_m = ((uint64_t)rows + BM - 1) / BM;
    for (uint64_t tile = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; tile < tiles_m * tiles_n;
         tile += (uint64_t)gridDim.x * gridDim.y) {
        const uint64_t r0 = tile / tiles_n * BM, c = tile % tiles_n;
        const int p = P == 1 ? 0 : c < t0 ? 0 : c < t0 + t1 ? 1 : 2;
        const uint64_t o0 = (c - (p == 0 ? 0 : p == 1 ? t0 : t0 + t1)) * MMA_BN;
        mmh_tile<FMT, ACC, BM>(x, m.w(p), m.out(p), rows, k, m.n(p), row_bytes, r0, o0);
    }
}

// The fast form over P products' tiles (ACC: added into the outputs); `false` where it does not apply (the caller takes the
// two-buffer form on `XHalf`).
template <int FMT, bool ACC, int P>
__device__ bool mm_mma_h(const __half* x, const Mm3& m, uint32_t rows, uint32_t k,
                         uint64_t row_bytes) {
#if __CUDA_ARCH__ >= 800
    for (int p = 0; p < P; ++p)
        if (!mmh_applies<FMT>(x, m.w(p), k, row_bytes)) return false;
    if (mmp_short_tiles(rows))
        mmh_tiles<FMT, ACC, P, 64>(x, m, rows, k, row_bytes);
    else
        mmh_tiles<FMT, ACC, P, 128>(x, m, rows, k, row_bytes);
    return true;
#else
    return false;
#endif
}

// The gate and up products of one f16 x and their SwiGLU (`matmul_swiglu_mma_h_<w>`, the fusion
// of `ops/matmul_swiglu.rs`): tiles of BM rows x 64 outputs whose 128 weight rows are 64 of gate's
// and the same 64 of up's, so each thread holds both sums of its outputs. Every sum is the one
// `matmul_mma_h` computes (the same steps in the same order), so the f16 values are the bits of
// the two products and `swiglu_f32_to_f16`.
template <int FMT, int BM>
__device__ __forceinline__ void mmsw_tiles(const __half* x, const uint8_t* wg, const uint8_t* wu,
                                           __half* out, uint32_t rows, uint32_t k, uint32_t n,
                                           uint64_t row_bytes) {
    const uint64_t tiles_n = ((uint64_t)n + MMA_BN / 2 - 1) / (MMA_BN / 2);
    const uint64_t tiles_m = ((uint64_t)rows + BM - 1) / BM;
    for (uint64_t tile = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; tile < tiles_m * tiles_n;
         tile += (uint64_t)gridDim.x * gridDim.y)
        mmh_tile<FMT, false, BM, true>(x, wg, nullptr, rows, k, n, row_bytes,
                                       tile / tiles_n * BM, tile % tiles_n * (MMA_BN / 2), wu,
                                       out);
}
