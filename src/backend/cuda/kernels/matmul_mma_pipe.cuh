// The pipelined tensor-core form of the prompt products (compiled after matmul_mma.cuh, whose
// fragments, raw block words and f16 dequantization it shares), for the 32-value block formats
// whose rows start at 4-byte aligned addresses and Q4_K whose rows start at 16-byte aligned ones,
// with activations whose rows start at 16-byte aligned addresses.
//
// Tiles of BM = 128 or 64 rows x 128 outputs (the host picks 64 where 128-row tiles would not
// give every SM a block, and says so by the grid's height: one block row per 64 rows), eight
// warps of 16 MI = BM / 2 rows x 32 outputs each. Unlike `mm_mma` the global reads never pass through
// registers: each 32-value step's activations (f32) and raw weight blocks are copied into a ring
// of MMP_STAGES shared-memory slots by `cp.async`, up to MMP_STAGES steps ahead. A step's copy is
// turned into f16 tiles (activations rounded, weights dequantized as `mm_mma` does) one step
// before its products, in two f16 buffers, so one barrier a step orders everything: at step s
// the block waits for step s + 1's copy, frees step s's slot for step s + MMP_STAGES, multiplies
// step s and then converts step s + 1 (whose shared-memory reads so overlap the tensor cores'
// work). The products therefore see exactly what `mm_mma`'s see.
// Copy slots of a format (3, or 2 for Q6_K's larger rows) and the ring they make: MMP_RING bytes
// at most, then the two f16 buffers.
#define MMP_STAGES 3
// A slot: 128 activation rows of 32 f32 values, then 128 weight rows of the format's copy (at
// most 80 bytes: Q6_K's; 48 for Q4_K, 36 for q8_0's 34-byte block with the 2 bytes in front of
// it that make an odd block's copy word-aligned).
#define MMP_A_BYTES (MMA_BM * MMA_BK * 4)
#define MMP_RING (3 * (MMP_A_BYTES + MMA_BN * 48))
#define MMP_SMEM (MMP_RING + 2 * (MMA_BM + MMA_BN) * MMA_LD * 2)

// What a step copies of each weight row, in `units` copies of `unit` bytes (4 or 16), where copy
// `u` of step s starts in the row, and where the step's values start in what was copied.
// The 32-value formats: the step's block and, for an odd block of a format whose block is not a
// whole number of words, the 2 bytes in front of it. Q4_K (256 values in 144 bytes: d, dmin, 12
// bytes of 6-bit scales and minimums, then 128 bytes of nibbles, the low and high nibbles of each
// 32 bytes two 32-value sub-blocks): the super-block's 16-byte header and the 32 nibble bytes of
// the step's sub-block, as three 16-byte copies.
//
// Q6_K (256 values in 210 bytes: ql[128], qh[64], 16 int8 scales, d; sub-block j of a half hh
// takes ql bytes 64 hh + 32 (j % 2) .., qh bytes 128 + 32 hh .., scales 2 j and 2 j + 1 of
// the 16): 9 words of ql and 9 of qh (the 32 bytes and, for an odd super-block, the 2
// in front), the word holding the two scales and the word holding d. Rows must be a whole
// number of words (an even count of super-blocks), so no word reaches past the matrix.
template <int FMT>
struct MmpFormat {
    static constexpr bool q4k = FMT == OP_FMT_Q4_K, q6k = FMT == OP_FMT_Q6_K;
    static constexpr uint32_t bytes = FMT == OP_FMT_Q8_0   ? 34
                                      : FMT == OP_FMT_Q5_0 ? 22
                                      : FMT == OP_FMT_Q4_1 ? 20
                                      : q4k                ? 48
                                      : q6k                ? 80
                                                           : 18;
    static constexpr uint32_t unit = q4k ? 16 : 4;
    static constexpr uint32_t units = q4k   ? 3
                                      : q6k ? 20
                                      : bytes % 4 == 0 ? bytes / 4
                                                       : (bytes + 2) / 4;
    // Bytes of a row's copy in a slot, a slot, and the slots of the ring.
    static constexpr uint32_t row_bytes = units * unit;
    static constexpr uint32_t slot = MMP_A_BYTES + MMA_BN * row_bytes;
    static constexpr uint32_t stages = q6k ? 2 : MMP_STAGES;
    // Where the step's block starts in a row's copy (the 32-value formats; Q6_K: its ql and qh).
    __device__ static __forceinline__ uint32_t lead(uint32_t s) {
        if (q6k) return (s / 8) % 2 ? 2u : 0u;
        return !q4k && bytes % 4 != 0 && (s & 1u) ? 2u : 0u;
    }
    __device__ static __forceinline__ uint32_t offset(uint32_t s, uint32_t u) {
        if (q4k) return s / 8 * 144 + (u == 0 ? 0 : 16 + 32 * (s % 8 / 2) + 16 * (u - 1));
        if (q6k) {
            const uint32_t base = s / 8 * 210, j = s % 8, hh = j / 4, l = lead(s);
            if (u < 9) return base + 64 * hh + 32 * (j % 2) - l + 4 * u;
            if (u < 18) return base + 128 + 32 * hh - l + 4 * (u - 9);
            const uint32_t at = base + (u == 18 ? 192 + 2 * j : 208);
            return at - at % 4;
        }
        return s * bytes - lead(s) + 4 * u;
    }
};
static_assert(MmpFormat<OP_FMT_Q6_K>::stages * MmpFormat<OP_FMT_Q6_K>::slot <= MMP_RING,
              "the Q6_K ring must fit the shared memory the host gives");
static_assert(MmpFormat<OP_FMT_Q4_K>::stages * MmpFormat<OP_FMT_Q4_K>::slot <= MMP_RING,
              "the Q4_K ring must fit the shared memory the host gives");

#if __CUDA_ARCH__ >= 800
// Where one thread's copies of a tile come from and go to in a slot: activation rows t / 8 + 32 j
// (16 bytes at 4 (t % 8) of each step's 32 values), then weight copies t + 256 i of the slot's
// MMA_BN x units (row c / units, copy c % units). Sources past the matrix are the matrix's first
// address, copied as zero bytes. Rows are found once per tile; a step adds its offsets.
template <int FMT, int BM>
struct MmpCursor {
    using F = MmpFormat<FMT>;
    static constexpr uint32_t b_copies = (MMA_BN * F::units + MMA_THREADS - 1) / MMA_THREADS;
    const float* a[BM / 32];
    const uint8_t* b[b_copies];
    uint32_t a_live, b_live;

    __device__ __forceinline__ MmpCursor(const float* x, const uint8_t* w, uint32_t r0, uint32_t o0,
                                         uint32_t rows, uint32_t k, uint32_t n,
                                         uint64_t row_bytes) {
        const uint32_t t = threadIdx.x;
        a_live = 0;
        b_live = 0;
#pragma unroll
        for (int j = 0; j < BM / 32; ++j) {
            const uint32_t r = r0 + t / 8 + 32 * j;
            const bool live = r < rows;
            a[j] = live ? x + (uint64_t)r * k + 4 * (t % 8) : x;
            a_live |= (uint32_t)live << j;
        }
#pragma unroll
        for (int i = 0; i < (int)b_copies; ++i) {
            const uint32_t c = t + MMA_THREADS * i, o = c / F::units;
            const bool live = c < MMA_BN * F::units && o0 + o < n;
            b[i] = live ? w + (uint64_t)(o0 + o) * row_bytes : w;
            b_live |= (uint32_t)live << i;
        }
    }
};

// Issues the copies of step s (values 32 s ..) of the tile `cur` describes into `slot`.
template <int FMT, int BM>
__device__ __forceinline__ void mmp_issue(uint8_t* slot, const MmpCursor<FMT, BM>& cur,
                                          uint32_t s) {
    using F = MmpFormat<FMT>;
    const uint32_t t = threadIdx.x;
    float* a = (float*)slot;
#pragma unroll
    for (int j = 0; j < BM / 32; ++j) {
        const bool live = (cur.a_live >> j) & 1u;
        op_cp_async<16>(a + (t / 8 + 32 * j) * MMA_BK + 4 * (t % 8),
                     live ? cur.a[j] + s * MMA_BK : cur.a[j], live);
    }
    uint8_t* b = slot + MMP_A_BYTES;
#pragma unroll
    for (int i = 0; i < (int)MmpCursor<FMT, BM>::b_copies; ++i) {
        const uint32_t c = t + MMA_THREADS * i;
        const bool live = (cur.b_live >> i) & 1u;
        if (c < MMA_BN * F::units)
            op_cp_async<F::unit>(b + F::unit * c,
                              live ? cur.b[i] + F::offset(s, c % F::units) : cur.b[i], live);
    }
}

// Turns the copy of step s in `slot` into the f16 tiles `as` (activations) and `bs` (weights).
template <int FMT, int BM>
__device__ __forceinline__ void mmp_convert(const uint8_t* slot, uint32_t s, __half* as,
                                            __half* bs) {
    using F = MmpFormat<FMT>;
    const uint32_t t = threadIdx.x;
    const float* a = (const float*)slot;
#pragma unroll
    for (int j = 0; j < BM / 32; ++j) {
        const uint32_t r = t / 8 + 32 * j, q = t % 8;
        const float4 v = *(const float4*)(a + r * MMA_BK + 4 * q);
        uint2 p;
        p.x = mma_pack(v.x, v.y);
        p.y = mma_pack(v.z, v.w);
        *(uint2*)&as[r * MMA_LD + 4 * q] = p;
    }
    const uint32_t o = t / 2, h = t % 2;
    const uint8_t* blk = slot + MMP_A_BYTES + o * F::row_bytes + F::lead(s);
    constexpr bool halves = FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q8_0;
    uint4 q0, q1;
    if constexpr (F::q4k) {
        // Sub-block s % 8 of the super-block: its scale and minimum, then values 16 h .. of its
        // nibbles, computed as `op_weight` computes them (the same f32 bits), rounded to f16.
        const uint32_t sub = s % 8;
        uint32_t sc, mn;
        op_q4k_scale_min(blk + 4, sub, sc, mn);
        const float d1 = op_half_bits(blk) * (float)sc;
        const float m1 = op_half_bits(blk + 2) * (float)mn;
        const uint4 raw = *(const uint4*)(blk + 16 + 16 * h);
        const uint32_t wd[4] = {raw.x, raw.y, raw.z, raw.w};
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const uint32_t q = (wd[i / 4] >> (8 * (i % 4) + 4 * (sub % 2))) & 0x0F;
            v[i] = d1 * (float)q - m1;
        }
        q0 = make_uint4(mma_pack(v[0], v[1]), mma_pack(v[2], v[3]), mma_pack(v[4], v[5]),
                        mma_pack(v[6], v[7]));
        q1 = make_uint4(mma_pack(v[8], v[9]), mma_pack(v[10], v[11]), mma_pack(v[12], v[13]),
                        mma_pack(v[14], v[15]));
    } else if constexpr (F::q6k) {
        // Sub-block j of the super-block, values 16 h ..: quarter j % 4 of its half takes the
        // low (quarters 0, 1) or high (2, 3) nibbles of its ql bytes and bits 2 (j % 4) .. of its
        // qh bytes; the value is what `op_weight` computes (the same f32 bits), rounded to f16.
        const uint32_t j = s % 8, b = s / 8;
        const uint8_t* row = slot + MMP_A_BYTES + o * F::row_bytes;
        const uint8_t* ql = row + F::lead(s) + 16 * h;
        const uint8_t* qh = row + 36 + F::lead(s) + 16 * h;
        const float sc = (float)(int8_t)row[72 + (2 * (b % 2) + 2 * (j % 2)) % 4 + h];
        const float d = op_half_bits(row + 76 + 2 * (b % 2));
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const uint32_t q = ((ql[i] >> (4 * ((j % 4) / 2))) & 0x0F) |
                               (((qh[i] >> (2 * (j % 4))) & 3) << 4);
            v[i] = d * sc * (float)((int)q - 32);
        }
        q0 = make_uint4(mma_pack(v[0], v[1]), mma_pack(v[2], v[3]), mma_pack(v[4], v[5]),
                        mma_pack(v[6], v[7]));
        q1 = make_uint4(mma_pack(v[8], v[9]), mma_pack(v[10], v[11]), mma_pack(v[12], v[13]),
                        mma_pack(v[14], v[15]));
    } else if constexpr (halves) {
        const MmRaw raw = mm_raw_load<FMT>(blk, 0, h);
        uint32_t hv[8];
        mm_raw_halves<FMT>(raw, h, hv);
        q0 = make_uint4(hv[0], hv[1], hv[2], hv[3]);
        q1 = make_uint4(hv[4], hv[5], hv[6], hv[7]);
    } else {
        const MmRaw raw = mm_raw_load<FMT>(blk, 0, h);
        float v[16];
        mm_raw_values<FMT>(raw, h, v);
        q0 = make_uint4(mma_pack(v[0], v[1]), mma_pack(v[2], v[3]), mma_pack(v[4], v[5]),
                        mma_pack(v[6], v[7]));
        q1 = make_uint4(mma_pack(v[8], v[9]), mma_pack(v[10], v[11]), mma_pack(v[12], v[13]),
                        mma_pack(v[14], v[15]));
    }
    *(uint4*)&bs[o * MMA_LD + 16 * h] = q0;
    *(uint4*)&bs[o * MMA_LD + 16 * h + 8] = q1;
}
#endif

// One tile of BM rows (see MMP_STAGES above) from row r0 and output o0.
template <int FMT, bool ACC, int BM>
__device__ __forceinline__ void mmp_tile(const float* x, const uint8_t* w, float* out,
                                         uint32_t rows, uint32_t k, uint32_t n, uint64_t row_bytes, uint64_t r0, uint64_t o0) {
#if __CUDA_ARCH__ >= 800
    using F = MmpFormat<FMT>;
    constexpr int MI = BM / 32;
    extern __shared__ __align__(16) float mm_smem[];
    uint8_t* ring = (uint8_t*)mm_smem;
    __half* f16 = (__half*)(ring + MMP_RING);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / 4, wn = warp % 4;
    const uint32_t steps = k / MMA_BK;
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    const MmpCursor<FMT, BM> cur(x, w, (uint32_t)r0, (uint32_t)o0, rows, k, n, row_bytes);
    // Steps 0 .. F::stages - 1 in flight (one group each, empty past the last step), then
    // step 0 converted into the first f16 buffer.
#pragma unroll
    for (uint32_t s = 0; s < F::stages; ++s) {
        if (s < steps) mmp_issue<FMT, BM>(ring + s * F::slot, cur, s);
        op_cp_commit();
    }
    op_cp_wait<F::stages - 1>();
    __syncthreads();
    mmp_convert<FMT, BM>(ring, 0, f16, f16 + BM * MMA_LD);
    for (uint32_t s = 0; s < steps; ++s) {
        // Step s + 1's copy has landed (this thread's part, then everyone's at the barrier);
        // every warp is done with step s - 1's products and step s's slot.
        op_cp_wait<F::stages - 2>();
        __syncthreads();
        if (s + F::stages < steps)
            mmp_issue<FMT, BM>(ring + (s % F::stages) * F::slot, cur, s + F::stages);
        op_cp_commit();
        const __half* as = f16 + (s % 2) * (BM + MMA_BN) * MMA_LD;
        const __half* bs = as + BM * MMA_LD;
        mma_step<MI, MMA_BK, MMA_LD>(acc, as, bs, wm, wn, lane);
        if (s + 1 < steps) {
            __half* nas = f16 + ((s + 1) % 2) * (BM + MMA_BN) * MMA_LD;
            mmp_convert<FMT, BM>(ring + ((s + 1) % F::stages) * F::slot, s + 1, nas,
                                 nas + BM * MMA_LD);
        }
    }
    // Nothing of this tile's copies is left in flight (the last groups are empty) before the
    // next tile reuses the slots; the barrier keeps its first copies off slots still read.
    op_cp_wait<0>();
    __syncthreads();
    mma_write<ACC, MI>(acc, out, r0, o0, rows, n, wm, wn, lane);
#endif
}

// The tiles of BM rows this block takes: consecutive blocks take consecutive output tiles of one
// row tile (the rows stay hot in L2).
template <int FMT, bool ACC, int BM>
__device__ void mmp_tiles(const float* x, const uint8_t* w, float* out, uint32_t rows, uint32_t k,
                          uint32_t n, uint64_t row_bytes) {
    const uint64_t tiles_m = ((uint64_t)rows + BM - 1) / BM;
    const uint64_t tiles_n = ((uint64_t)n + MMA_BN - 1) / MMA_BN;
    for (uint64_t tile = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; tile < tiles_m * tiles_n;
         tile += (uint64_t)gridDim.x * gridDim.y)
        mmp_tile<FMT, ACC, BM>(x, w, out, rows, k, n, row_bytes, tile / tiles_n * BM,
                               tile % tiles_n * MMA_BN);
}

// Three products of one x (`matmul3_mma_<w>`): weights, outputs and widths of each, picked with
// selects rather than an indexed array (which would live in local memory).
struct Mm3 {
    const uint8_t *w0, *w1, *w2;
    float *out0, *out1, *out2;
    uint32_t n0, n1, n2;
    __device__ __forceinline__ const uint8_t* w(int p) const { return p == 0 ? w0 : p == 1 ? w1 : w2; }
    __device__ __forceinline__ float* out(int p) const { return p == 0 ? out0 : p == 1 ? out1 : out2; }
    __device__ __forceinline__ uint32_t n(int p) const { return p == 0 ? n0 : p == 1 ? n1 : n2; }
};

// The tiles of the three products this block takes: their output tiles side by side, so one
// launch fills the GPU where each alone would leave SMs idle (a prompt's k and v products).
template <int FMT, int BM>
__device__ void mmp_tiles3(const float* x, const Mm3& m, uint32_t rows, uint32_t k,
                           uint64_t row_bytes) {
    const uint64_t t0 = ((uint64_t)m.n0 + MMA_BN - 1) / MMA_BN;
    const uint64_t t1 = ((uint64_t)m.n1 + MMA_BN - 1) / MMA_BN;
    const uint64_t tiles_n = t0 + t1 + ((uint64_t)m.n2 + MMA_BN - 1) / MMA_BN;
    const uint64_t tiles_m = ((uint64_t)rows + BM - 1) / BM;
    for (uint64_t tile = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; tile < tiles_m * tiles_n;
         tile += (uint64_t)gridDim.x * gridDim.y) {
        const uint64_t r0 = tile / tiles_n * BM, c = tile % tiles_n;
        const int p = c < t0 ? 0 : c < t0 + t1 ? 1 : 2;
        const uint64_t o0 = (c - (p == 0 ? 0 : p == 1 ? t0 : t0 + t1)) * MMA_BN;
        mmp_tile<FMT, false, BM>(x, m.w(p), m.out(p), rows, k, m.n(p), row_bytes, r0, o0);
    }
}

// Whether the pipelined form takes weights `w` of format FMT with activations `x`: a format it
// stages, k whole steps, x 16-byte aligned, w and its rows aligned to the format's copy unit, and
// the launch given the form's shared memory.
template <int FMT>
__device__ __forceinline__ bool mmp_applies(const float* x, const uint8_t* w, uint32_t k,
                                            uint64_t row_bytes) {
    constexpr bool block32 =
        FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q5_0 || FMT == OP_FMT_Q8_0;
    if constexpr (!(block32 || FMT == OP_FMT_Q4_K || FMT == OP_FMT_Q6_K)) return false;
    constexpr uint32_t unit = MmpFormat<FMT>::unit;
    return k % MMA_BK == 0 && ((uint64_t)x & 15u) == 0 && ((uint64_t)w & (unit - 1)) == 0 &&
           row_bytes % unit == 0 && mm_dynamic_smem() >= MMP_SMEM;
}

// Tiles of 64 rows where the grid has one block row per 64 rows and that is more than one per
// 128 (the host's choice, `ops::matmul::mma_grid`).
__device__ __forceinline__ bool mmp_short_tiles(uint32_t rows) {
    const uint32_t rows64 = (rows + 63) / 64, rows128 = (rows + 127) / 128;
    return gridDim.y == rows64 && rows64 != rows128;
}

// The pipelined form; `false` where it does not apply (`mmp_applies`, or before sm_80) and the
// caller takes `mm_mma`.
template <int FMT, bool ACC>
__device__ bool mm_mma_pipe(const float* x, const uint8_t* w, float* out, uint32_t rows,
                            uint32_t k, uint32_t n, uint64_t row_bytes) {
#if __CUDA_ARCH__ >= 800
    if (!mmp_applies<FMT>(x, w, k, row_bytes)) return false;
    if (mmp_short_tiles(rows))
        mmp_tiles<FMT, ACC, 64>(x, w, out, rows, k, n, row_bytes);
    else
        mmp_tiles<FMT, ACC, 128>(x, w, out, rows, k, n, row_bytes);
    return true;
#else
    return false;
#endif
}

// `mm_mma_pipe` for the three products of `matmul3_mma_<w>` (one weight format, one k).
template <int FMT>
__device__ bool mm_mma_pipe3(const float* x, const Mm3& m, uint32_t rows, uint32_t k,
                             uint64_t row_bytes) {
#if __CUDA_ARCH__ >= 800
    if (!mmp_applies<FMT>(x, m.w0, k, row_bytes) || !mmp_applies<FMT>(x, m.w1, k, row_bytes) ||
        !mmp_applies<FMT>(x, m.w2, k, row_bytes))
        return false;
    if (mmp_short_tiles(rows))
        mmp_tiles3<FMT, 64>(x, m, rows, k, row_bytes);
    else
        mmp_tiles3<FMT, 128>(x, m, rows, k, row_bytes);
    return true;
#else
    return false;
#endif
}
