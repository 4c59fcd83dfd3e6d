// The vector (one activation row) forms of the matrix products, shared by the `matmul` and
// `fused_block` families (compiled in front of each family's source, then matmul_dots.cuh): the
// activation row as a type (`XPlain`; the fused kernels add normalized forms), one element per
// lane (`mm_dot`; Q4_K rows a super-block per half-warp, `mm_dot_q4k_rows`, Q6_K a super-block
// per warp, `mm_dot_q6k`), the weight words of a 32-value block's quarter (`mm_load_quarter`),
// and the int8 activation row the one-row products read (`XQ8`) with its Q4_0, Q4_K and Q6_K
// forms. The block formats' dots by quarters, the staged form and `mm_dot_pair` are in
// matmul_dots.cuh.

// The activation row a matmul reads (a type parameter, so that a fused producer can compute its
// values as they are read).
struct XPlain {
    const float* x;
    __device__ __forceinline__ float at(uint64_t i) const { return x[i]; }
    __device__ __forceinline__ float4 at4(uint64_t i) const { return *(const float4*)(x + i); }
    __device__ __forceinline__ bool aligned16() const { return ((uint64_t)x & 15u) == 0; }
    __device__ __forceinline__ XPlain row(uint64_t off) const { return XPlain{x + off}; }
};
// sum of a[i] * (nibble at bit `shift` of byte i of w).
__device__ __forceinline__ float mm_nibbles(uint32_t w, float4 a, int shift) {
    return a.x * (float)((w >> shift) & 15u) + a.y * (float)((w >> (8 + shift)) & 15u) +
           a.z * (float)((w >> (16 + shift)) & 15u) + a.w * (float)((w >> (24 + shift)) & 15u);
}

// `mm_dot` for R Q4_K rows (super-blocks of 256 values in 144 bytes: d, dmin, 12 bytes of 6-bit
// scales and minimums, 128 bytes of nibbles) at 8-byte aligned addresses against x, 16-byte
// aligned, read once for the R rows: the 16 lanes of a half-warp take one super-block, lane t reading 8 quant bytes (one
// 8-byte load) of pair t / 4, which hold values 8 (t % 4).. of sub-block 2 (t / 4) (low nibbles)
// and of the next sub-block (high nibbles). Each sub-block's part is d s sum(q x) - dmin m sum(x).
template <int R, typename X>
__device__ __forceinline__ void mm_dot_q4k_rows(X x, const uint8_t* const (&rows)[R], uint32_t k,
                                                int lane, float (&out)[R]) {
    const uint32_t sbs = k / 256, t = lane & 15, pair = t >> 2, part = t & 3;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll 2
    for (uint32_t sb = lane >> 4; sb < sbs; sb += 2) {
        const uint64_t xb = (uint64_t)sb * 256 + 64 * pair + 8 * part;
        const float4 a0 = x.at4(xb), a1 = x.at4(xb + 4), b0 = x.at4(xb + 32), b1 = x.at4(xb + 36);
        const float sx_lo = (a0.x + a0.y) + (a0.z + a0.w) + (a1.x + a1.y) + (a1.z + a1.w);
        const float sx_hi = (b0.x + b0.y) + (b0.z + b0.w) + (b1.x + b1.y) + (b1.z + b1.w);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t* p = rows[r] + (uint64_t)sb * 144;
            const uint2 q = *(const uint2*)(p + 16 + 32 * pair + 8 * part);
            uint32_t s0, m0, s1, m1;
            op_q4k_scale_min(p + 4, 2 * pair, s0, m0);
            op_q4k_scale_min(p + 4, 2 * pair + 1, s1, m1);
            const float lo = mm_nibbles(q.x, a0, 0) + mm_nibbles(q.y, a1, 0);
            const float hi = mm_nibbles(q.x, b0, 4) + mm_nibbles(q.y, b1, 4);
            acc[r] += op_half_bits(p) * ((float)s0 * lo + (float)s1 * hi) -
                      op_half_bits(p + 2) * ((float)m0 * sx_lo + (float)m1 * sx_hi);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = op_warp_sum(acc[r]);
}

// Whether `mm_dot_q4k_rows` takes these rows: x 16-byte aligned, rows at 8-byte aligned addresses.
template <typename X>
__device__ __forceinline__ bool mm_q4k_ok(X x, const uint8_t* a, const uint8_t* b) {
    return x.aligned16() && (((uint64_t)a | (uint64_t)b) & 7u) == 0;
}

// `mm_dot` for Q6_K (super-blocks of 256 values in 210 bytes: ql[128] low nibbles, qh[64] two
// high bits each, 16 int8 scales, d) with the row at an even address and x 16-byte aligned: a
// warp takes one super-block, lane t (half h = t / 16, l = 2 (t % 16)) the two bytes at l of each
// of ql[64h..], ql[64h + 32..] and qh[32h..], which hold values l, l + 1 of the half's four
// 32-value quarters (scale 8h + l / 16 + 2 quarter). Each value is d sc (q - 32).
template <typename X>
__device__ __forceinline__ float mm_dot_q6k(X x, const uint8_t* wrow, uint32_t k, int lane) {
    const uint32_t h = lane >> 4, l = 2 * (lane & 15);
    float acc = 0.0f;
#pragma unroll 2
    for (uint32_t sb = 0; sb < k / 256; ++sb) {
        const uint8_t* p = wrow + (uint64_t)sb * 210;
        const uint32_t a = *(const uint16_t*)(p + 64 * h + l);
        const uint32_t b = *(const uint16_t*)(p + 64 * h + 32 + l);
        const uint32_t hb = *(const uint16_t*)(p + 128 + 32 * h + l);
        const int8_t* sc = (const int8_t*)(p + 192 + 8 * h + l / 16);
        const uint64_t xb = (uint64_t)sb * 256 + 128 * h + l;
        float part = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            // Quarter g: low nibbles of a (0), of b (1), high nibbles of a (2), of b (3).
            const uint32_t lo4 = ((g & 1) ? b : a) >> (g >= 2 ? 4 : 0);
            const uint32_t q0 = (lo4 & 15u) | (((hb >> (2 * g)) & 3u) << 4);
            const uint32_t q1 = ((lo4 >> 8) & 15u) | (((hb >> (8 + 2 * g)) & 3u) << 4);
            const float2 xv = make_float2(x.at(xb + 32 * g), x.at(xb + 32 * g + 1));
            part += (float)sc[2 * g] * (xv.x * (float)((int)q0 - 32) + xv.y * (float)((int)q1 - 32));
        }
        acc += op_half_bits(p + 208) * part;
    }
    return op_warp_sum(acc);
}

template <int FMT, typename X>
__device__ __forceinline__ float mm_dot(X x, const uint8_t* wrow, uint32_t k, int lane) {
    if (FMT == OP_FMT_Q4_K && mm_q4k_ok(x, wrow, wrow)) {
        const uint8_t* const rows[1] = {wrow};
        float v[1];
        mm_dot_q4k_rows<1>(x, rows, k, lane, v);
        return v[0];
    }
    if (FMT == OP_FMT_Q6_K && ((uint64_t)wrow & 1u) == 0) return mm_dot_q6k(x, wrow, k, lane);
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

// mm_nibble_dot for q5_0: sum of lo[i] * (q_i - 16) + hi[i] * (q_(16+i) - 16), where q_i is the
// low nibble of byte i of q with bit i of h above it and q_(16+i) the high nibble with bit 16 + i.
__device__ __forceinline__ float mm_q5_dot(uint32_t q, uint32_t h, float4 lo, float4 hi) {
    float s = lo.x * (float)((int)((q & 15u) | ((h << 4) & 16u)) - 16);
    s += lo.y * (float)((int)(((q >> 8) & 15u) | ((h << 3) & 16u)) - 16);
    s += lo.z * (float)((int)(((q >> 16) & 15u) | ((h << 2) & 16u)) - 16);
    s += lo.w * (float)((int)(((q >> 24) & 15u) | ((h << 1) & 16u)) - 16);
    s += hi.x * (float)((int)(((q >> 4) & 15u) | ((h >> 12) & 16u)) - 16);
    s += hi.y * (float)((int)(((q >> 12) & 15u) | ((h >> 13) & 16u)) - 16);
    s += hi.z * (float)((int)(((q >> 20) & 15u) | ((h >> 14) & 16u)) - 16);
    s += hi.w * (float)((int)((q >> 28) | ((h >> 15) & 16u)) - 16);
    return s;
}

// sum of a[i] * (signed byte i of q).
__device__ __forceinline__ float mm_i8_dot(uint32_t q, float4 a) {
    return a.x * (float)(int8_t)(q & 0xffu) + a.y * (float)(int8_t)((q >> 8) & 0xffu) +
           a.z * (float)(int8_t)((q >> 16) & 0xffu) + a.w * (float)(int8_t)(q >> 24);
}

// The weight words of quarter `t` (0..4) of block `b` of a row: 4-bit formats take quant bytes
// [4t, 4t + 4) (values 4t..4t+3 and 16+4t..16+4t+3) and the scale (and q4_1's minimum), q5_0 the
// same quant bytes, the scale and its fifth bits shifted so that the quarter's are bits 0..3 and
// 16..19, q8_0 takes bytes [8t, 8t + 8) and the scale. Loaded once, applied to one activation row
// or several.
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
    } else if (FMT == OP_FMT_Q5_0) {  // value = d * (q - 16)
        const uint8_t* p = row + (uint64_t)b * 22;
        w.d = mm_half_at(p);
        w.m = 0.0f;
        w.q0 = mm_u32_at(p + 6 + 4 * t);
        w.q1 = mm_u32_at(p + 2) >> (4 * t);
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


// ---- Int8 activations: the one-row products of the 32-value block formats (q4_0, q4_1, q5_0,
// q8_0) read the activation row quantized once per block of threads into shared memory. Per
// 32-value block b: m = max |x_i|, d = m / 127, q_i = rint(x_i * (127 / m)) (all 0 where m = 0),
// stored as eight words (word 2t: values 4t..4t+3, word 2t + 1: values 16 + 4t..16 + 4t + 3, the
// two words a lane's quarter reads as one 8-byte load) and ds[b] = (d, d * sum q). The products
// sum q_w * q_x exactly with `dp4a` and scale once per quarter, so against f32 activations each
// product w_i x_i moves by at most |w_i| d / 2. A block holding a NaN or an infinity gets m = inf,
// so its d * sum q is NaN and the output is NaN. `docs/kernels.md` item 12 has the measurements.
// For Q4_0 weights (`mm_q8_swizzled`) the int8 words are stored by pairs of blocks (64 bytes,
// four 16-byte chunks: block 2p's words 0-3 and 4-7, block 2p + 1's), chunk c of pair p at slot
// c ^ ((p / 2) % 4) of the pair's 64 bytes (`mm_q8_chunk`): the lanes of the pair form, a pair
// each, then find chunk c of eight consecutive pairs in eight distinct slots of 128 bytes, where
// the plain order put four lanes of each eight on the same banks (under `ncu` 71% of the 8B
// `norm_gate_up`'s shared-memory wavefronts were such conflicts; docs/kernels.md item 29). The
// other formats' readers keep the plain order: the quarter forms did not conflict, and Q4_K's
// pair form, which does, measured 0.5% slower swizzled in the plain product (16 more registers)
// and no faster in the fused kernels.
__device__ __forceinline__ uint32_t mm_q8_chunk(uint32_t p, uint32_t c, uint32_t phase) {
    return 16 * p + 4 * (c ^ (((p >> 1) + phase) & 3u));
}
// Word i (0..7) of block b.
__device__ __forceinline__ uint32_t mm_q8_word(uint32_t b, uint32_t i, uint32_t phase) {
    return mm_q8_chunk(b >> 1, 2 * (b & 1) + (i >> 2), phase) + (i & 3);
}
struct XQ8 {
    const float* s;  // the f32 row, where the kernel keeps it (formats without the int8 path)
    const int* q;
    const float2* ds;
    uint32_t phase;  // (pairs before q) / 2 % 4: a row taken `from` a value keeps its slots
    // Chunk c of pair p, and word i of block b, in the swizzled order (SW) or the plain one.
    template <bool SW>
    __device__ __forceinline__ const int4* chunk(uint32_t p, uint32_t c) const {
        return (const int4*)(q + (SW ? mm_q8_chunk(p, c, phase) : 16 * p + 4 * c));
    }
    template <bool SW>
    __device__ __forceinline__ const int* word(uint32_t b, uint32_t i) const {
        return q + (SW ? mm_q8_word(b, i, phase) : 8 * b + i);
    }
    __device__ __forceinline__ float at(uint64_t i) const { return s[i]; }
    __device__ __forceinline__ float4 at4(uint64_t i) const { return *(const float4*)(s + i); }
    __device__ __forceinline__ bool aligned16() const { return true; }
    // The row from value e on (e a multiple of 128, so every part stays 16-byte aligned).
    __device__ __forceinline__ XQ8 from(uint32_t e) const {
        return XQ8{s + e, q + e / 4, ds + e / 32, (phase + e / 128) & 3u};
    }
};
template <typename X>
struct MmIsQ8 {
    static constexpr bool value = false;
};
template <>
struct MmIsQ8<XQ8> {
    static constexpr bool value = true;
};

// Whether a format's one-row products take int8 activations (Q4_K's through `mm_q8_q4k_rows`,
// with its rows at 8-byte aligned addresses, Q6_K's through `mm_q8_q6k_rows`, 4-byte aligned:
// `mm_q8_rows_ok`).
template <int FMT>
__device__ __forceinline__ constexpr bool mm_q8_format() {
    return FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q5_0 || FMT == OP_FMT_Q8_0 ||
           FMT == OP_FMT_Q4_K || FMT == OP_FMT_Q6_K;
}
// Whether the int8 row read against FMT weights is stored swizzled (see XQ8).
template <int FMT>
__device__ __forceinline__ constexpr bool mm_q8_swizzled() {
    return FMT == OP_FMT_Q4_0;
}
// Whether weight rows from `w` (row_bytes apart) suit the int8 products of FMT: even addresses
// for the block formats, 8-byte aligned ones for Q4_K (its quants are read 8 bytes at a time),
// 4-byte aligned ones for Q6_K (word loads; rows of an even count of 210-byte super-blocks).
template <int FMT>
__device__ __forceinline__ bool mm_q8_rows_ok(const uint8_t* w, uint64_t row_bytes) {
    const uint64_t align = FMT == OP_FMT_Q4_K ? 8 : FMT == OP_FMT_Q6_K ? 4 : 2;
    return ((uint64_t)w % align) == 0 && row_bytes % align == 0;
}
// Weights from which the plain one-row matmul reads the int8 row (`ops::matmul::Q8_MIN_WEIGHTS`;
// the fused block kernels take it for every product of a row they quantize).
#define MM_Q8_MIN_WEIGHTS (1ull << 22)
// Bytes of shared memory the quantized row of k values (k a multiple of 32) takes: k int8 values
// and k / 32 (d, d * sum q) pairs.
#define MM_Q8_BYTES(k) ((k) + (k) / 4)
// float4 loads a thread issues before it quantizes them.
#define MM_Q8_BATCH 8

// Block b's values 4p..4p+3 (p = lane % 8, eight lanes a block) quantized; `live` is false for a
// group past the row's end (it still takes part in the shuffles).
// SW: the swizzled order (`mm_q8_swizzled`).
template <bool SW>
__device__ __forceinline__ void mm_quantize_group(float4 v, bool live, uint32_t b, uint32_t p,
                                                  int* q, float2* ds) {
    auto mag = [](float f) { return f != f ? __int_as_float(0x7f800000) : fabsf(f); };
    float m = fmaxf(fmaxf(mag(v.x), mag(v.y)), fmaxf(mag(v.z), mag(v.w)));
    m = fmaxf(m, __shfl_xor_sync(ONEPASS_FULL_MASK, m, 1));
    m = fmaxf(m, __shfl_xor_sync(ONEPASS_FULL_MASK, m, 2));
    m = fmaxf(m, __shfl_xor_sync(ONEPASS_FULL_MASK, m, 4));
    const float id = m > 0.0f ? 127.0f / m : 0.0f;
    const int a0 = __float2int_rn(v.x * id), a1 = __float2int_rn(v.y * id);
    const int a2 = __float2int_rn(v.z * id), a3 = __float2int_rn(v.w * id);
    int sum = a0 + a1 + a2 + a3;
    sum += __shfl_xor_sync(ONEPASS_FULL_MASK, sum, 1);
    sum += __shfl_xor_sync(ONEPASS_FULL_MASK, sum, 2);
    sum += __shfl_xor_sync(ONEPASS_FULL_MASK, sum, 4);
    if (!live) return;
    const uint32_t i = p < 4 ? 2 * p : 2 * (p - 4) + 1;
    q[SW ? mm_q8_word(b, i, 0) : 8 * b + i] =
        (int)((uint32_t)(a0 & 255) | ((uint32_t)(a1 & 255) << 8) | ((uint32_t)(a2 & 255) << 16) |
              ((uint32_t)a3 << 24));
    if (p == 0) {
        const float d = m / 127.0f;
        ds[b] = make_float2(d, d * (float)sum);
    }
}

// Quantizes the row `src` (k values, k a multiple of 32, 16-byte aligned) into q and ds. Every
// thread of the block calls it (blockDim.x a multiple of 32); the caller synchronizes after it.
// Each thread issues MM_Q8_BATCH loads before it uses them.
template <bool SW, typename X>
__device__ __forceinline__ void mm_quantize_row(X src, uint32_t k, int* q, float2* ds) {
    const uint32_t nb = k / 32, p = threadIdx.x & 7, warps = blockDim.x / 32;
    const uint32_t group = (threadIdx.x & 31) >> 3;
    for (uint32_t base = 4 * (threadIdx.x / 32); base < nb; base += 4 * warps * MM_Q8_BATCH) {
        float4 v[MM_Q8_BATCH];
#pragma unroll
        for (int j = 0; j < MM_Q8_BATCH; ++j) {
            const uint32_t b = base + 4 * warps * j + group;
            v[j] = b < nb ? src.at4((uint64_t)b * 32 + 4 * p) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < MM_Q8_BATCH; ++j) {
            if (base + 4 * warps * j >= nb) break;  // warp-uniform
            const uint32_t b = base + 4 * warps * j + group;
            mm_quantize_group<SW>(v[j], b < nb, b, p, q, ds);
        }
    }
}

// The 5th bits of four q5_0 values (bits 0..3 of h) moved to bit 4 of each byte.
__device__ __forceinline__ uint32_t mm_q5_high(uint32_t h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

// Quarter t of block b (the words `mm_load_quarter` read) against the int8 row: its share of the
// block's sum. The offsets of the 4-bit formats (-8, -16) and q4_1's minimum multiply the whole
// block's sum of q_x, a quarter of which each of the block's four lanes adds.
template <int FMT>
__device__ __forceinline__ float mm_q8_quarter(XQ8 x, MmQuarter w, uint32_t b, uint32_t t) {
    const float2 dx = x.ds[b];
    if (FMT == OP_FMT_Q8_0) {
        // Values 8t..8t+7: the groups of four 2t and 2t + 1 (group j is word 2j below 4, else
        // word 2 (j - 4) + 1).
        const uint32_t j0 = 2 * t, j1 = 2 * t + 1;
        const int a = *x.word<false>(b, j0 < 4 ? 2 * j0 : 2 * (j0 - 4) + 1);
        const int c = *x.word<false>(b, j1 < 4 ? 2 * j1 : 2 * (j1 - 4) + 1);
        return w.d * (dx.x * (float)__dp4a((int)w.q0, a, __dp4a((int)w.q1, c, 0)));
    }
    const int2 xv = *(const int2*)x.word<mm_q8_swizzled<FMT>()>(b, 2 * t);
    uint32_t lo = w.q0 & 0x0f0f0f0fu, hi = (w.q0 >> 4) & 0x0f0f0f0fu;
    if (FMT == OP_FMT_Q5_0) {
        lo |= mm_q5_high(w.q1);
        hi |= mm_q5_high(w.q1 >> 16);
    }
    const float s = (float)__dp4a((int)lo, xv.x, __dp4a((int)hi, xv.y, 0));
    if (FMT == OP_FMT_Q4_1) return w.d * (dx.x * s) + w.m * (0.25f * dx.y);
    if (FMT == OP_FMT_Q5_0) return w.d * (dx.x * s - 4.0f * dx.y);
    return w.d * (dx.x * s - 2.0f * dx.y);
}

// `mm_dot_q4k_rows` against the int8 row: the same lanes and bytes (lane t of a half-warp: the 8
// quant bytes of values 8 (t % 4).. of sub-blocks 2 (t / 4) and 2 (t / 4) + 1), each sub-block's
// part d s d_x sum(q q_x) - dmin m (d_x sum q_x) / 4 (a quarter of the block's sum of q_x, as each
// of its four lanes adds one): the CPU's product on the int8-rounded row, up to f32 rounding.
//
// Rows at 16-byte aligned addresses take `mm_q8_q4k_pairs` instead.
template <int R>
__device__ __forceinline__ void mm_q8_q4k_pairs(XQ8 x, const uint8_t* const (&rows)[R], uint32_t k,
                                                int lane, float (&out)[R]);
template <int R>
__device__ __forceinline__ void mm_q8_q4k_rows(XQ8 x, const uint8_t* const (&rows)[R], uint32_t k,
                                               int lane, float (&out)[R]) {
    bool pairs = true;
#pragma unroll
    for (int r = 0; r < R; ++r) pairs = pairs && ((uint64_t)rows[r] & 15u) == 0;
    if (pairs) {
        mm_q8_q4k_pairs<R>(x, rows, k, lane, out);
        return;
    }
    const uint32_t sbs = k / 256, t = lane & 15, pair = t >> 2, part = t & 3;
    // The int8 words of values 8 part .. 8 part + 3 and 8 part + 4 .. 8 part + 7 of a block.
    const uint32_t w0 = part < 2 ? 4 * part : 4 * (part - 2) + 1, w1 = w0 + 2;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll 2
    for (uint32_t sb = lane >> 4; sb < sbs; sb += 2) {
        const uint32_t b = sb * 8 + 2 * pair;
        const int lo0 = *x.word<false>(b, w0), lo1 = *x.word<false>(b, w1);
        const int hi0 = *x.word<false>(b + 1, w0), hi1 = *x.word<false>(b + 1, w1);
        const float2 dlo = x.ds[b], dhi = x.ds[b + 1];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t* p = rows[r] + (uint64_t)sb * 144;
            const uint2 q = *(const uint2*)(p + 16 + 32 * pair + 8 * part);
            uint32_t s0, m0, s1, m1;
            op_q4k_scale_min(p + 4, 2 * pair, s0, m0);
            op_q4k_scale_min(p + 4, 2 * pair + 1, s1, m1);
            const int lo = __dp4a((int)(q.x & 0x0f0f0f0fu), lo0,
                                  __dp4a((int)(q.y & 0x0f0f0f0fu), lo1, 0));
            const int hi = __dp4a((int)((q.x >> 4) & 0x0f0f0f0fu), hi0,
                                  __dp4a((int)((q.y >> 4) & 0x0f0f0f0fu), hi1, 0));
            acc[r] += op_half_bits(p) * ((float)s0 * (dlo.x * (float)lo) +
                                         (float)s1 * (dhi.x * (float)hi)) -
                      op_half_bits(p + 2) * ((float)m0 * (0.25f * dlo.y) +
                                             (float)m1 * (0.25f * dhi.y));
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = op_warp_sum(acc[r]);
}

// Q4_K against the int8 row, a lane per pair of sub-blocks (pair j of super-block sb, values 64 j
// .. of it: sub-block 2 j in the low nibbles of its 32 quant bytes, 2 j + 1 in the high ones), for
// rows at 16-byte aligned addresses: three 16-byte loads a lane (the super-block's header, the
// pair's 32 quant bytes) where `mm_q8_q4k_rows` issues an 8-byte load and a dozen byte loads of
// scales for a quarter of it; 16 `dp4a` against the pair's two int8 blocks, each sub-block's part
// d s d_x sum(q q_x) - dmin m d_x sum q_x. `docs/kernels.md` item 21.
template <int R>
__device__ __forceinline__ void mm_q8_q4k_pairs(XQ8 x, const uint8_t* const (&rows)[R], uint32_t k,
                                                int lane, float (&out)[R]) {
    const uint32_t pairs = k / 64, m4 = 0x0f0f0f0fu;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll 2
    for (uint32_t p = lane; p < pairs; p += 32) {
        const uint32_t sb = p / 4, j = p % 4, b = 2 * p;
        // The int8 words of block b (values 4 g .. of group g: word 2 g below 4, else
        // 2 (g - 4) + 1) and of block b + 1, and their (d_x, d_x sum q_x).
        const int4 a0 = *x.chunk<false>(p, 0), a1 = *x.chunk<false>(p, 1);
        const int4 c0 = *x.chunk<false>(p, 2), c1 = *x.chunk<false>(p, 3);
        const float4 dd = *(const float4*)(x.ds + b);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t* sp = rows[r] + (uint64_t)sb * 144;
            const uint4 h = *(const uint4*)sp;
            const uint4 q0 = *(const uint4*)(sp + 16 + 32 * j);
            const uint4 q1 = *(const uint4*)(sp + 32 + 32 * j);
            // `op_q4k_scale_min` for sub-blocks 2 j and 2 j + 1 on the header's bytes 4 .. 15,
            // bytes 2 (j % 2) and 2 (j % 2) + 1 of each of its three words, without a branch: a
            // warp's lanes take every j, and a divergent branch on the header held back the next
            // row's loads until this row's header had arrived.
            const uint32_t sh = 16 * (j & 1);
            const uint32_t ws = (h.y >> sh) & 0xffffu, wm = (h.z >> sh) & 0xffffu;
            const uint32_t wl = (h.w >> sh) & 0xffffu;
            const uint32_t s01 =
                j < 2 ? ws & 0x3f3fu : (wl & 0x0f0fu) | ((ws >> 2) & 0x3030u);
            const uint32_t m01 =
                j < 2 ? wm & 0x3f3fu : ((wl >> 4) & 0x0f0fu) | ((wm >> 2) & 0x3030u);
            const uint32_t s0 = s01 & 0xffu, s1 = s01 >> 8, m0 = m01 & 0xffu, m1 = m01 >> 8;
            int lo = __dp4a((int)(q0.x & m4), a0.x, __dp4a((int)(q0.y & m4), a0.z, 0));
            lo = __dp4a((int)(q0.z & m4), a1.x, __dp4a((int)(q0.w & m4), a1.z, lo));
            lo = __dp4a((int)(q1.x & m4), a0.y, __dp4a((int)(q1.y & m4), a0.w, lo));
            lo = __dp4a((int)(q1.z & m4), a1.y, __dp4a((int)(q1.w & m4), a1.w, lo));
            int hi = __dp4a((int)((q0.x >> 4) & m4), c0.x, __dp4a((int)((q0.y >> 4) & m4), c0.z, 0));
            hi = __dp4a((int)((q0.z >> 4) & m4), c1.x, __dp4a((int)((q0.w >> 4) & m4), c1.z, hi));
            hi = __dp4a((int)((q1.x >> 4) & m4), c0.y, __dp4a((int)((q1.y >> 4) & m4), c0.w, hi));
            hi = __dp4a((int)((q1.z >> 4) & m4), c1.y, __dp4a((int)((q1.w >> 4) & m4), c1.w, hi));
            const float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffffu)));
            const float dmin = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
            acc[r] += d * ((float)s0 * (dd.x * (float)lo) + (float)s1 * (dd.z * (float)hi)) -
                      dmin * ((float)m0 * dd.y + (float)m1 * dd.w);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = op_warp_sum(acc[r]);
}

// Q6_K against the int8 row, rows at 4-byte aligned addresses (super-block sb then starts 2 (sb %
// 2) bytes past a word): a lane per 64 values, positions l0 .. l0 + 15 (l0 0 or 16) of the four
// 32-value quarters of half h of a super-block. It loads five words for each of its 16 ql bytes
// of quarters 0 and 2, of quarters 1 and 3 and its 16 qh bytes (funnel shifts realign them),
// three words holding its four scales and the word holding d; each byte's q - 32 is a signed
// byte, so each quarter is four `dp4a` against its int8 block (values 4 g .. of group g: word 2 g
// below 4, else 2 (g - 4) + 1), d d_x sc sum((q - 32) q_x): the CPU's product on the
// int8-rounded row, up to f32 rounding. `docs/kernels.md` item 21.
template <int R>
__device__ __forceinline__ void mm_q8_q6k_rows(XQ8 x, const uint8_t* const (&rows)[R], uint32_t k,
                                               int lane, float (&out)[R]) {
    const uint32_t units = k / 64;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll 1
    for (uint32_t u = lane; u < units; u += 32) {
        const uint32_t sb = u / 4, h = (u / 2) % 2, l0 = 16 * (u % 2), lead = 2 * (sb % 2);
        // The int8 words of the four quarters' blocks at positions l0 ..: words 0, 2, 4, 6 (l0
        // 0) or 1, 3, 5, 7 (l0 16) of block sb * 8 + 4 h + quarter.
        int xs[4][4];
        float dx[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const uint32_t b = sb * 8 + 4 * h + g;
            const int4 a = *x.chunk<false>(b >> 1, 2 * (b & 1));
            const int4 c = *x.chunk<false>(b >> 1, 2 * (b & 1) + 1);
            xs[g][0] = l0 ? a.y : a.x;
            xs[g][1] = l0 ? a.w : a.z;
            xs[g][2] = l0 ? c.y : c.x;
            xs[g][3] = l0 ? c.w : c.z;
            dx[g] = x.ds[b].x;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            // The word-aligned start of the super-block.
            const uint32_t* base = (const uint32_t*)(rows[r] + (uint64_t)sb * 210 - lead);
            uint32_t qa[5], qb[5], qh[5], sw[3];
#pragma unroll
            for (int i = 0; i < 5; ++i) {
                qa[i] = __ldg(base + (64 * h + l0) / 4 + i);
                qb[i] = __ldg(base + (64 * h + 32 + l0) / 4 + i);
                qh[i] = __ldg(base + (128 + 32 * h + l0) / 4 + i);
            }
#pragma unroll
            for (int i = 0; i < 3; ++i) sw[i] = __ldg(base + (192 + 8 * h) / 4 + i);
            const uint32_t dw = __ldg(base + 208 / 4);
            const float d = __half2float(__ushort_as_half((unsigned short)(dw >> (8 * lead))));
            float part = 0.0f;
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                // Scale 8 h + 2 g + l0 / 16 of the 16: byte lead + l0 / 16 + 2 g of `sw`.
                const uint32_t at = lead + l0 / 16 + 2 * g;
                const uint32_t word = at < 4 ? sw[0] : at < 8 ? sw[1] : sw[2];
                const float sc = (float)(int8_t)((word >> (8 * (at % 4))) & 0xffu);
                int sum = 0;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint32_t lw = __funnelshift_r((g & 1) ? qb[i] : qa[i],
                                                        (g & 1) ? qb[i + 1] : qa[i + 1], 8 * lead);
                    const uint32_t hw = __funnelshift_r(qh[i], qh[i + 1], 8 * lead);
                    const uint32_t q = ((lw >> (4 * (g >> 1))) & 0x0f0f0f0fu) |
                                       (((hw >> (2 * g)) & 0x03030303u) << 4);
                    sum = __dp4a((int)__vsub4(q, 0x20202020u), xs[g][i], sum);
                }
                part += sc * (dx[g] * (float)sum);
            }
            acc[r] += d * part;
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = op_warp_sum(acc[r]);
}

// Two rows' dots against the int8 row, four lanes a block as `mm_dot_blocks` (the same quarters
// in the same order per lane), the activation words read once for both rows; Q4_K rows by
// `mm_q8_q4k_rows`.
template <int FMT>
__device__ __forceinline__ void mm_q8_dot2(XQ8 x, const uint8_t* ra, const uint8_t* rb, uint32_t k,
                                           int lane, float& va, float& vb) {
    if constexpr (FMT == OP_FMT_Q4_K || FMT == OP_FMT_Q6_K) {
        const uint8_t* const rows[2] = {ra, rb};
        float v[2];
        if constexpr (FMT == OP_FMT_Q4_K)
            mm_q8_q4k_rows<2>(x, rows, k, lane, v);
        else
            mm_q8_q6k_rows<2>(x, rows, k, lane, v);
        va = v[0];
        vb = v[1];
        return;
    }
    const uint32_t blocks = k / 32, t = lane & 3;
    float a = 0.0f, b = 0.0f;
#pragma unroll 4
    for (uint32_t bl = lane >> 2; bl < blocks; bl += 8) {
        const MmQuarter wa = mm_load_quarter<FMT>(ra, bl, t), wb = mm_load_quarter<FMT>(rb, bl, t);
        a += mm_q8_quarter<FMT>(x, wa, bl, t);
        b += mm_q8_quarter<FMT>(x, wb, bl, t);
    }
    va = op_warp_sum(a);
    vb = op_warp_sum(b);
}

// Q4_0 against the int8 row, a lane per pair of blocks (2p, 2p + 1): their 36 bytes start 4-byte
// aligned where k is a multiple of 64 and the rows' base is 4-byte aligned (`mm_q8_pairs_ok`), so
// a lane issues nine 4-byte loads for 64 values where a quarter-block lane issues three 2-byte
// ones for 8; the first block's quant words are realigned with funnel shifts. Each block's part
// is d (d_x sum(q q_x) - 8 d_x sum q_x), the quarters' sum in one step. `docs/kernels.md` item 16.
__device__ __forceinline__ bool mm_q8_pairs_ok(const uint8_t* w, uint32_t k) {
    return k % 64 == 0 && ((uint64_t)w & 3) == 0;
}
__device__ __forceinline__ float mm_q8_pair_q4_0(XQ8 x, const uint32_t* wp, uint32_t p) {
    uint32_t w[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) w[i] = wp[i];
    const uint32_t m4 = 0x0f0f0f0fu;
    const int4 a0 = *x.chunk<true>(p, 0), a1 = *x.chunk<true>(p, 1);
    const int4 b0 = *x.chunk<true>(p, 2), b1 = *x.chunk<true>(p, 3);
    const float4 dd = *(const float4*)(x.ds + 2 * p);
    const uint32_t u0 = __funnelshift_r(w[0], w[1], 16), u1 = __funnelshift_r(w[1], w[2], 16);
    const uint32_t u2 = __funnelshift_r(w[2], w[3], 16), u3 = __funnelshift_r(w[3], w[4], 16);
    int s0 = __dp4a((int)(u0 & m4), a0.x, __dp4a((int)((u0 >> 4) & m4), a0.y, 0));
    s0 = __dp4a((int)(u1 & m4), a0.z, __dp4a((int)((u1 >> 4) & m4), a0.w, s0));
    s0 = __dp4a((int)(u2 & m4), a1.x, __dp4a((int)((u2 >> 4) & m4), a1.y, s0));
    s0 = __dp4a((int)(u3 & m4), a1.z, __dp4a((int)((u3 >> 4) & m4), a1.w, s0));
    int s1 = __dp4a((int)(w[5] & m4), b0.x, __dp4a((int)((w[5] >> 4) & m4), b0.y, 0));
    s1 = __dp4a((int)(w[6] & m4), b0.z, __dp4a((int)((w[6] >> 4) & m4), b0.w, s1));
    s1 = __dp4a((int)(w[7] & m4), b1.x, __dp4a((int)((w[7] >> 4) & m4), b1.y, s1));
    s1 = __dp4a((int)(w[8] & m4), b1.z, __dp4a((int)((w[8] >> 4) & m4), b1.w, s1));
    const float d0 = __half2float(__ushort_as_half((unsigned short)(w[0] & 0xffffu)));
    const float d1 = __half2float(__ushort_as_half((unsigned short)(w[4] >> 16)));
    return d0 * (dd.x * (float)s0 - 8.0f * dd.y) + d1 * (dd.z * (float)s1 - 8.0f * dd.w);
}
// Two Q4_0 rows (k a multiple of 64, 4-byte aligned) against the int8 row, lane p taking pairs
// p, p + 32, ... of both.
__device__ __forceinline__ void mm_q8_rows_pairs_q4_0(XQ8 x, const uint8_t* ra, const uint8_t* rb,
                                                      uint32_t k, int lane, float& va, float& vb) {
    const uint32_t* wa = (const uint32_t*)ra;
    const uint32_t* wb = (const uint32_t*)rb;
    const uint32_t pairs = k / 64;
    float a = 0.0f, b = 0.0f;
#pragma unroll 2
    for (uint32_t p = lane; p < pairs; p += 32) {
        a += mm_q8_pair_q4_0(x, wa + p * 9, p);
        b += mm_q8_pair_q4_0(x, wb + p * 9, p);
    }
    va = op_warp_sum(a);
    vb = op_warp_sum(b);
}
