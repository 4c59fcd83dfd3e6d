// The staging of weight tiles shared by the two tiled forms of the products (compiled in front of
// matmul.cu): the CUDA-core tiled form (`mm_tiled`, f32 tiles) and the tensor-core form
// (`mm_mma`, f16 tiles summed in f32 by `mma.sync`).

// Values 16h .. 16h + 15 of the 32 from k0 of a weight row (zeros past k, or for a row past the
// matrix when `!live`), each as `op_weight` gives it. The 32-value block formats read the block
// (one per step) as words when the rows start at even addresses.
template <int FMT>
__device__ __forceinline__ void mm_stage_weights(const uint8_t* row, uint32_t k0, uint32_t h,
                                                 bool live, uint32_t k, bool words,
                                                 float (&v)[16]) {
    constexpr bool block32 =
        FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q5_0 || FMT == OP_FMT_Q8_0;
    if (block32 && live && words) {
        const uint32_t b = k0 / 32;
        if (FMT == OP_FMT_Q5_0) {
            const uint8_t* p = row + (uint64_t)b * 22;
            const float d = mm_half_at(p);
            // The fifth bits of values 16h.. from bit 0.
            const uint32_t qh = mm_u32_at(p + 2) >> (16 * h);
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                const uint32_t q = mm_u32_at(p + 6 + 4 * wd);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const uint32_t nib = (q >> (8 * e + 4 * h)) & 15u;
                    const uint32_t bit = (qh >> (4 * wd + e)) & 1u;
                    v[4 * wd + e] = d * (float)((int)(nib | (bit << 4)) - 16);
                }
            }
            return;
        }
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

// The raw words of values 16h .. 16h + 15 of block b of a 32-value block format (the block's
// scale, q4_1's minimum, q5_0's fifth bits and the quant bytes the half needs), loaded with 16-bit
// reads (rows start at even addresses), so that the loads of the next tile are in flight while
// the current one is multiplied; `mm_raw_values` turns them into values as `mm_stage_weights` does.
struct MmRaw {
    uint32_t q[4];
    uint32_t qh;
    float d, m;
    // The scale and q4_1's minimum as f16 bits (what the f16 dequantization multiplies by).
    uint16_t dh, mh;
};

template <int FMT>
__device__ __forceinline__ MmRaw mm_raw_load(const uint8_t* row, uint32_t b, uint32_t h) {
    MmRaw r;
    r.qh = 0u;
    r.m = 0.0f;
    r.mh = 0;
    if (FMT == OP_FMT_Q8_0) {
        const uint8_t* p = row + (uint64_t)b * 34;
        r.dh = *(const uint16_t*)p;
        r.d = __half2float(__ushort_as_half(r.dh));
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) r.q[wd] = mm_u32_at(p + 2 + 16 * h + 4 * wd);
    } else if (FMT == OP_FMT_Q5_0) {
        const uint8_t* p = row + (uint64_t)b * 22;
        r.dh = *(const uint16_t*)p;
        r.d = __half2float(__ushort_as_half(r.dh));
        r.qh = mm_u32_at(p + 2) >> (16 * h);
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) r.q[wd] = mm_u32_at(p + 6 + 4 * wd);
    } else {
        const bool q41 = FMT == OP_FMT_Q4_1;
        const uint8_t* p = row + (uint64_t)b * (q41 ? 20 : 18);
        r.dh = *(const uint16_t*)p;
        r.d = __half2float(__ushort_as_half(r.dh));
        if (q41) {
            r.mh = *(const uint16_t*)(p + 2);
            r.m = __half2float(__ushort_as_half(r.mh));
        }
        const uint8_t* qs = p + (q41 ? 4 : 2);
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) r.q[wd] = mm_u32_at(qs + 4 * wd);
    }
    return r;
}

template <int FMT>
__device__ __forceinline__ void mm_raw_values(const MmRaw& r, uint32_t h, float (&v)[16]) {
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (FMT == OP_FMT_Q8_0) {
                v[4 * wd + e] = (float)(int8_t)((r.q[wd] >> (8 * e)) & 0xffu) * r.d;
            } else if (FMT == OP_FMT_Q5_0) {
                const uint32_t nib = (r.q[wd] >> (8 * e + 4 * h)) & 15u;
                const uint32_t bit = (r.qh >> (4 * wd + e)) & 1u;
                v[4 * wd + e] = r.d * (float)((int)(nib | (bit << 4)) - 16);
            } else {
                const int nib = (int)((r.q[wd] >> (8 * e + 4 * h)) & 15u);
                v[4 * wd + e] = FMT == OP_FMT_Q4_1 ? r.d * (float)nib + r.m : r.d * (float)(nib - 8);
            }
        }
    }
}

// Values 16h .. 16h + 15 of a raw q4_0, q4_1 or q8_0 block as eight f16 pairs, computed in f16
// from exact integers: a quant u placed in the mantissa of 1024 (bits 0x6400 | u) is 1024 + u
// exactly, so subtracting 1024 + offset gives the signed quant exactly, and one f16 multiply by
// the scale (or fused multiply-add with q4_1's minimum) rounds the exact value once. For q4_0 and
// q8_0 that is the f16 rounding of the f32 dequantization (whose product is exact in f32).
__device__ __forceinline__ __half2 mm_u32_as_half2(uint32_t v) {
    return *reinterpret_cast<const __half2*>(&v);
}

template <int FMT>
__device__ __forceinline__ void mm_raw_halves(const MmRaw& r, uint32_t h, uint32_t (&out)[8]) {
    const __half2 d2 = __half2half2(__ushort_as_half(r.dh));
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
#pragma unroll
        for (int pr = 0; pr < 2; ++pr) {
            uint32_t bits;
            __half2 bias;
            if (FMT == OP_FMT_Q8_0) {
                // Signed bytes made unsigned (+128), bytes 2 pr and 2 pr + 1 into the two halves.
                bits = __byte_perm(r.q[wd] ^ 0x80808080u, 0x64646464u, pr ? 0x4342u : 0x4140u);
                bias = __float2half2_rn(1152.0f);
            } else {
                const uint32_t nibs = (r.q[wd] >> (4 * h)) & 0x0f0f0f0fu;
                bits = __byte_perm(nibs, 0x64646464u, pr ? 0x4342u : 0x4140u);
                bias = __float2half2_rn(FMT == OP_FMT_Q4_1 ? 1024.0f : 1032.0f);
            }
            const __half2 q = __hsub2(mm_u32_as_half2(bits), bias);
            __half2 v;
            if (FMT == OP_FMT_Q4_1) {
                v = __hfma2(q, d2, __half2half2(__ushort_as_half(r.mh)));
            } else {
                v = __hmul2(q, d2);
            }
            out[2 * wd + pr] = *reinterpret_cast<const uint32_t*>(&v);
        }
    }
}

// The tensor-core form, for prompts (MMA_MIN_ROWS rows and more; sm_80 and newer): a block of
// MMA_THREADS threads computes a tile of MMA_BM rows x MMA_BN outputs, stepping through k
// MMA_BK values at a time. Each step's activations (rounded to f16) and dequantized weights
// (rounded to f16) are staged in shared memory, k-contiguous, in two buffers: the next step's
// global loads are issued before the current step's products and stored after them. Eight warps
// (2 along rows x 4 along outputs) each take 64 x 32 of the tile as 4 x 4 `mma.sync` m16n8k16
// products per 16 values of k, fed by `ldmatrix`; sums are f32. Each product x . w therefore sees
// x and w rounded to f16 once (relative error at most 2^-11 each) and nothing else.
#define MMA_BM 128
#define MMA_BN 128
#define MMA_BK 32
#define MMA_THREADS 256
#define MMA_MIN_ROWS 64
// Halves of a staged row: MMA_BK values and 8 of padding, so the eight rows one `ldmatrix`
// phase reads fall in distinct banks (80-byte rows).
#define MMA_LD (MMA_BK + 8)
#define MMA_SMEM (2 * (MMA_BM + MMA_BN) * MMA_LD * 2)

__device__ __forceinline__ uint32_t mma_pack(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
}

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void mma_ldmatrix4(uint32_t (&r)[4], const __half* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The products of one step of BK values: warp (wm, wn)'s MI fragments of 16 rows of `as` (rows
// wm * 16 MI ..) by its 32 outputs of `bs` (rows wn * 32 ..), both f16 with rows of LD values,
// added into acc. Every tensor-core product form calls it.
template <int MI, int BK, int LD>
__device__ __forceinline__ void mma_step(float (&acc)[MI][4][4], const __half* as,
                                         const __half* bs, int wm, int wn, int lane) {
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        uint32_t a[MI][4], b[2][4];
#pragma unroll
        for (int i = 0; i < MI; ++i)
            mma_ldmatrix4(a[i], as + (wm * 16 * MI + i * 16 + (lane & 15)) * LD + kk + (lane >> 4) * 8);
#pragma unroll
        for (int p = 0; p < 2; ++p)
            mma_ldmatrix4(b[p], bs + (wn * 32 + p * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk +
                                    ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                mma_16816(acc[i][j], a[i], b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]);
    }
}

// One step's global reads, held in registers between issue and store: four float4 of activations
// (rows t / 8 + 32 j, values 4 (t % 8) ..) and, for the 32-value block formats, the raw words of
// output t / 2's half t % 2.
struct MmaLoads {
    float4 a[4];
    MmRaw w;
};

template <int FMT, typename X>
__device__ __forceinline__ void mma_issue(MmaLoads& L, X x, const uint8_t* w, uint64_t r0,
                                          uint64_t o0, uint32_t k0, uint32_t rows, uint32_t k,
                                          uint32_t n, uint64_t row_bytes, bool x_vec, bool raw) {
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint64_t gr = r0 + t / 8 + 32 * j;
        const uint32_t gk = k0 + 4 * (t % 8);
        if (x_vec && gr < rows && gk + 4 <= k) {
            L.a[j] = x.at4(gr * k + gk);
        } else {
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = gr < rows && gk + e < k ? x.at(gr * k + gk + e) : 0.0f;
            L.a[j] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
    const uint64_t go = o0 + t / 2;
    if (raw && go < n) L.w = mm_raw_load<FMT>(w + go * row_bytes, k0 / 32, t % 2);
}

template <int FMT, typename X>
__device__ __forceinline__ void mma_store(const MmaLoads& L, __half* as, __half* bs,
                                          const uint8_t* w, uint64_t o0, uint32_t k0, uint32_t k,
                                          uint32_t n, uint64_t row_bytes, bool words, bool raw) {
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint2 p;
        p.x = mma_pack(L.a[j].x, L.a[j].y);
        p.y = mma_pack(L.a[j].z, L.a[j].w);
        *(uint2*)&as[(t / 8 + 32 * j) * MMA_LD + 4 * (t % 8)] = p;
    }
    const uint32_t o = t / 2, h = t % 2;
    const uint64_t go = o0 + o;
    constexpr bool halves = FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q8_0;
    if (halves && raw && go < n) {
        uint32_t hv[8];
        mm_raw_halves<FMT>(L.w, h, hv);
        *(uint4*)&bs[o * MMA_LD + 16 * h] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
        *(uint4*)&bs[o * MMA_LD + 16 * h + 8] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
        return;
    }
    float v[16];
    if (raw && go < n) {
        mm_raw_values<FMT>(L.w, h, v);
    } else {
        mm_stage_weights<FMT>(w + go * row_bytes, k0, h, go < n, k, words, v);
    }
    uint4 q0, q1;
    q0.x = mma_pack(v[0], v[1]), q0.y = mma_pack(v[2], v[3]);
    q0.z = mma_pack(v[4], v[5]), q0.w = mma_pack(v[6], v[7]);
    q1.x = mma_pack(v[8], v[9]), q1.y = mma_pack(v[10], v[11]);
    q1.z = mma_pack(v[12], v[13]), q1.w = mma_pack(v[14], v[15]);
    *(uint4*)&bs[o * MMA_LD + 16 * h] = q0;
    *(uint4*)&bs[o * MMA_LD + 16 * h + 8] = q1;
}

// Writes (or with ACC adds) a warp's 16 MI x 32 accumulators of the tile at rows r0, outputs
// o0 (the warp's rows start at 16 MI wm). Accumulator e of tile (i, j): row lane / 4 (+ 8 for
// e >= 2), outputs 2 (lane % 4) + e % 2; the two outputs of a row go as one 8-byte access where
// they are both in the matrix and aligned.
template <bool ACC, int MI>
__device__ __forceinline__ void mma_write(const float (&acc)[MI][4][4], float* out, uint64_t r0,
                                          uint64_t o0, uint32_t rows, uint32_t n, int wm, int wn,
                                          int lane) {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const uint64_t gr = r0 + wm * 16 * MI + i * 16 + lane / 4 + 8 * hf;
                const uint64_t go = o0 + wn * 32 + j * 8 + 2 * (lane % 4);
                if (gr >= rows || go >= n) continue;
                float* y = out + gr * n + go;
                const float v0 = acc[i][j][2 * hf], v1 = acc[i][j][2 * hf + 1];
                if (go + 1 < n && ((uint64_t)y & 7u) == 0) {
                    float2 p = make_float2(v0, v1);
                    if (ACC) {
                        const float2 o = *(const float2*)y;
                        p.x += o.x;
                        p.y += o.y;
                    }
                    *(float2*)y = p;
                } else {
                    y[0] = ACC ? y[0] + v0 : v0;
                    if (go + 1 < n) y[1] = ACC ? y[1] + v1 : v1;
                }
            }
        }
    }
}
#endif

// The tensor-core tiled product (see MMA_BM above); `false` where the architecture has no
// `mma.sync` for f16 (before sm_80), and the caller takes another form.
template <int FMT, bool ACC, typename X>
__device__ bool mm_mma(X x, const uint8_t* w, float* out, uint32_t rows, uint32_t k, uint32_t n,
                       uint64_t row_bytes) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) float mm_smem[];
    __half* smem = (__half*)mm_smem;
    constexpr bool block32 =
        FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q5_0 || FMT == OP_FMT_Q8_0;
    const bool x_vec = x.aligned16() && k % 4 == 0;
    const bool words = ((uint64_t)w & 1u) == 0 && row_bytes % 2 == 0;
    // Raw block words in flight need whole blocks per step: k a multiple of 32, even addresses.
    const bool raw = block32 && words && k % 32 == 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / 4, wn = warp % 4;
    const uint64_t tiles_m = ((uint64_t)rows + MMA_BM - 1) / MMA_BM;
    const uint64_t tiles_n = ((uint64_t)n + MMA_BN - 1) / MMA_BN;
    const uint32_t steps = (k + MMA_BK - 1) / MMA_BK;
    for (uint64_t tile = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; tile < tiles_m * tiles_n;
         tile += (uint64_t)gridDim.x * gridDim.y) {
        // Consecutive blocks take consecutive output tiles of one row tile (the rows stay hot).
        const uint64_t r0 = tile / tiles_n * MMA_BM, o0 = tile % tiles_n * MMA_BN;
        float acc[4][4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
        MmaLoads L;
        mma_issue<FMT>(L, x, w, r0, o0, 0, rows, k, n, row_bytes, x_vec, raw);
        mma_store<FMT, X>(L, smem, smem + MMA_BM * MMA_LD, w, o0, 0, k, n, row_bytes, words, raw);
        __syncthreads();
        for (uint32_t s = 0; s < steps; ++s) {
            __half* as = smem + (s % 2) * (MMA_BM + MMA_BN) * MMA_LD;
            __half* bs = as + MMA_BM * MMA_LD;
            const bool more = s + 1 < steps;
            if (more)
                mma_issue<FMT>(L, x, w, r0, o0, (s + 1) * MMA_BK, rows, k, n, row_bytes, x_vec, raw);
            mma_step<4, MMA_BK, MMA_LD>(acc, as, bs, wm, wn, lane);
            if (more) {
                __half* nas = smem + ((s + 1) % 2) * (MMA_BM + MMA_BN) * MMA_LD;
                mma_store<FMT, X>(L, nas, nas + MMA_BM * MMA_LD, w, o0, (s + 1) * MMA_BK, k, n,
                                  row_bytes, words, raw);
            }
            __syncthreads();
        }
        mma_write<ACC, 4>(acc, out, r0, o0, rows, n, wm, wn, lane);
    }
    return true;
#else
    return false;
#endif
}
