// The Hopper form of the f16-activation prompt products (compiled after matmul_mma_h.cuh; taken by
// `matmul_mma_h_<w>`, `matmul3_mma_h_<w>`, `matmul_add_mma_h_<w>` and `matmul_swiglu_mma_h_<w>`
// for the GGML block formats Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K where it applies,
// `mmw_applies`): warpgroup tensor-core products (`wgmma.mma_async`, sm_90a) with both operands
// in shared memory.
//
// A block of two warpgroups takes a tile of 128 rows x 128 weight rows (outputs; a SwiGLU tile
// 64 outputs, its weight rows gate's and up's 8-row groups in turn), each warpgroup 64 rows as
// one m64n128k16 accumulator (64 floats a thread), in 64-value steps through MMW_S slots of
// shared memory, each an activation tile and a weight tile, both K-major with the 128-byte
// swizzle: a tile row is 64 f16 values (128 bytes), 8 rows a 1024-byte group, the 16-byte chunk
// c of row r stored at chunk c ^ (r % 8); slots 1024-byte aligned.
// - Activations: `cp.async` 16-byte copies straight into that layout (rows past `rows` zeros).
// - Weights: each thread loads the raw words of half a weight row's step (`mmw_load`: 5 to 20
//   words by format) into registers two steps ahead, converts them to the f16 values the other
//   forms multiply (`mmw_values`) and stores them in that layout.
// - A step: wait for its copies, `fence.proxy.async.shared::cta` (the copies and stores are
//   generic-proxy writes, the products read through the async proxy), barrier, four wgmmas (the
//   k16 slices: start address + 32 bytes each), commit; while they run, the weights and
//   activations of step s + 2 go into the slot of step s - 2, the raw weights of step s + 4 are
//   loaded; then `wgmma.wait_group 1` (step s - 1 done; a slot is written again only after a
//   barrier that follows both warpgroups' wait for it).
// - Tiles: the row tile varies fastest across the grid, so the blocks that read one weight tile
//   run together and all but the first read it from L2.
// Measured (`benches/cuda/gemm_wgmma.cu`, one H100, the Llama 3.1 8B shapes at 512 rows): 287
// TFLOP/s (q/o), 260-306 (gate/up), 291 (down), against 182-202 for the `mma.sync` form of
// matmul_mma_h.cuh on the same shapes. The sums are f32 over k16 slices in order, as there, but
// the tensor cores' order within a slice differs: the bits may differ from the other forms' by
// f32 rounding.
#define MMW_BM 128
#define MMW_BN 128
#define MMW_S 4
#define MMW_SLOT ((MMW_BM + MMW_BN) * 128)
// The slots, and room to align them to 1024 bytes.
#define MMW_SMEM (MMW_S * MMW_SLOT + 1024)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mmw_st16(uint32_t a, uint32_t v0, uint32_t v1, uint32_t v2,
                                         uint32_t v3) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v0), "r"(v1), "r"(v2),
                 "r"(v3)
                 : "memory");
}
__device__ __forceinline__ void mmw_cp16(uint32_t dst, const void* src, bool live) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(live ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void mmw_fence_proxy() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mmw_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void mmw_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void mmw_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Ties the accumulators to this point, so the compiler neither reads them before a wait nor
// moves their uses across the asynchronous products.
__device__ __forceinline__ void mmw_pin(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The descriptor of a K-major 128-byte-swizzled tile at shared address `a`: the leading offset 1
// (unused by this layout), the stride between 8-row groups 1024 bytes (64), swizzle mode 1.
__device__ __forceinline__ uint64_t mmw_desc(uint32_t a) {
    return (uint64_t)((a & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
#define MMW_R8(i)                                                                                  \
    "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]),      \
        "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define MMW_R32(i) MMW_R8((i) + 0), MMW_R8((i) + 8), MMW_R8((i) + 16), MMW_R8((i) + 24)
// d (64 x 128, f32) += A (64 x 16, descriptor da) B (16 x 128, descriptor db).
__device__ __forceinline__ void mmw_k16(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : MMW_R32(0), MMW_R32(32)
                 : "l"(da), "l"(db), "r"(1));
}
// Two f16 values (q - bias) d from the quants in bytes `sel` of `bytes` (0x4140: bytes 0 and 1;
// 0x4342: 2 and 3), each placed in the mantissa of 1024 (so 1024 + q exactly, q < 1024); with
// `m2`, (q - bias) d + m in one fused step (q4_1). `mm_raw_halves`' arithmetic, the same bits.
__device__ __forceinline__ uint32_t mmw_deq2(uint32_t bytes, uint32_t sel, float bias, __half2 d2) {
    const uint32_t bits = __byte_perm(bytes, 0x64646464u, sel);
    const __half2 v =
        __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(bias)), d2);
    return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t mmw_deq2m(uint32_t bytes, uint32_t sel, __half2 d2,
                                              __half2 m2) {
    const uint32_t bits = __byte_perm(bytes, 0x64646464u, sel);
    const __half2 v = __hfma2(
        __hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(1024.0f)), d2, m2);
    return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ __half2 mmw_half2(uint32_t bits16) {
    return __half2half2(__ushort_as_half((unsigned short)(bits16 & 0xffffu)));
}
__device__ __forceinline__ float mmw_float(uint32_t bits16) {
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xffffu)));
}

// What a thread loads of its weight row for one 64-value step: half bh (values 32 bh ..) of the
// step, as raw words, two steps before it stores them as f16.
// - Q4_0, Q5_0, Q8_0 (blocks of B = 18, 22, 34 bytes, a step two of them, 2B bytes): the words
//   from the step's byte (B - 2) bh, so that the block's quants start 2 + 2 bh bytes in (a
//   funnel shift of 16 + 16 bh bits aligns them); its scale is the low (bh 0) or high half of
//   word 0.
// - Q4_1 (20-byte blocks): block bh's five words, aligned.
// - Q4_K (144-byte super-blocks of 8 sub-blocks of 32, a step two of them: rows 16-byte aligned):
//   the 16-byte header (d, dmin, the 12 bytes of 6-bit scales and minimums), then the 32 bytes of
//   nibbles the step's two sub-blocks share (low nibbles sub-block 2 (s % 4), high the next).
// - Q6_K (210-byte super-blocks, 2-byte aligned when odd): nine words from the word holding the
//   32 ql bytes of the thread's sub-block, nine from the one holding its 32 qh bytes, the word
//   holding its two int8 scales and the word holding d.
template <int FMT>
struct MmwFormat {
    static constexpr bool ok = FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q5_0 ||
                               FMT == OP_FMT_Q8_0 || FMT == OP_FMT_Q4_K || FMT == OP_FMT_Q6_K;
    static constexpr int words = FMT == OP_FMT_Q5_0   ? 6
                                 : FMT == OP_FMT_Q8_0 ? 9
                                 : FMT == OP_FMT_Q4_K ? 12
                                 : FMT == OP_FMT_Q6_K ? 20
                                                      : 5;
    // The block of the 32-value formats whose quants start 2 bytes in (Q4_0, Q5_0, Q8_0).
    static constexpr uint32_t block = FMT == OP_FMT_Q5_0 ? 22 : FMT == OP_FMT_Q8_0 ? 34 : 18;
    // The alignment a row's start must have.
    static constexpr uint32_t align = FMT == OP_FMT_Q4_K ? 16 : 4;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int FMT>
__device__ __forceinline__ void mmw_load(const uint8_t* row, uint32_t s, uint32_t bh,
                                         uint32_t (&r)[MmwFormat<FMT>::words]) {
    using F = MmwFormat<FMT>;
    if constexpr (FMT == OP_FMT_Q4_K) {
        const uint8_t* sb = row + (uint64_t)(s / 4) * 144;
        const uint4 h = __ldg((const uint4*)sb);
        const uint4 a = __ldg((const uint4*)(sb + 16 + 32 * (s % 4)));
        const uint4 b = __ldg((const uint4*)(sb + 32 + 32 * (s % 4)));
        const uint32_t all[12] = {h.x, h.y, h.z, h.w, a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 12; ++i) r[i] = all[i];
    } else if constexpr (FMT == OP_FMT_Q6_K) {
        const uint32_t sup = s / 4, q = s % 4, j = 2 * q + bh, lead = 2 * (sup % 2);
        const uint8_t* sb = row + (uint64_t)sup * 210 - lead;
        const uint32_t* ql = (const uint32_t*)(sb + 64 * (q / 2) + 32 * bh);
        const uint32_t* qh = (const uint32_t*)(sb + 128 + 32 * (q / 2));
#pragma unroll
        for (int i = 0; i < 9; ++i) {
            r[i] = __ldg(ql + i);
            r[9 + i] = __ldg(qh + i);
        }
        r[18] = __ldg((const uint32_t*)(sb + ((lead + 192 + 2 * j) & ~3u)));
        r[19] = __ldg((const uint32_t*)(sb + 208));
    } else {
        const uint8_t* p = FMT == OP_FMT_Q4_1 ? row + (uint64_t)s * 40 + 20 * bh
                                              : row + (uint64_t)s * 2 * F::block + (F::block - 2) * bh;
#pragma unroll
        for (int i = 0; i < F::words; ++i) r[i] = __ldg((const uint32_t*)p + i);
    }
}

// Values 8 c .. 8 c + 7 of the thread's 32 (see `mmw_load`) as four f16 pairs: the f16 values
// the `mma.sync` forms multiply (`mmp_convert`, `mmh_convert`): the f16 arithmetic of
// `mm_raw_halves` for Q4_0, Q4_1 and Q8_0, the f32 values of `op_weight` rounded to nearest for
// Q5_0, Q4_K and Q6_K.
template <int FMT>
__device__ __forceinline__ void mmw_values(const uint32_t (&r)[MmwFormat<FMT>::words], uint32_t s,
                                           uint32_t bh, int c, uint32_t (&v)[4]) {
    // The word i of the block's quants (the 32-value formats with quants 2 + 2 bh bytes in).
    auto quant = [&](int i) { return __funnelshift_rc(r[i], r[i + 1], 16 + 16 * bh); };
    if constexpr (FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1) {
        const bool q41 = FMT == OP_FMT_Q4_1;
        // The low (c < 2) or high nibbles of bytes 8 (c % 2) .. 8 (c % 2) + 7.
        const uint32_t w0 = q41 ? r[1 + 2 * (c % 2)] : quant(2 * (c % 2));
        const uint32_t w1 = q41 ? r[2 + 2 * (c % 2)] : quant(2 * (c % 2) + 1);
        const uint32_t lo = (w0 >> (4 * (c / 2))) & 0x0f0f0f0fu;
        const uint32_t hi = (w1 >> (4 * (c / 2))) & 0x0f0f0f0fu;
        if constexpr (q41) {
            const __half2 d2 = mmw_half2(r[0]), m2 = mmw_half2(r[0] >> 16);
            v[0] = mmw_deq2m(lo, 0x4140u, d2, m2);
            v[1] = mmw_deq2m(lo, 0x4342u, d2, m2);
            v[2] = mmw_deq2m(hi, 0x4140u, d2, m2);
            v[3] = mmw_deq2m(hi, 0x4342u, d2, m2);
        } else {
            const __half2 d2 = mmw_half2(r[0] >> (16 * bh));
            v[0] = mmw_deq2(lo, 0x4140u, 1032.0f, d2);
            v[1] = mmw_deq2(lo, 0x4342u, 1032.0f, d2);
            v[2] = mmw_deq2(hi, 0x4140u, 1032.0f, d2);
            v[3] = mmw_deq2(hi, 0x4342u, 1032.0f, d2);
        }
    } else if constexpr (FMT == OP_FMT_Q8_0) {
        // Signed bytes 8 c .. 8 c + 7 made unsigned (+128).
        const __half2 d2 = mmw_half2(r[0] >> (16 * bh));
        const uint32_t w0 = quant(2 * c) ^ 0x80808080u, w1 = quant(2 * c + 1) ^ 0x80808080u;
        v[0] = mmw_deq2(w0, 0x4140u, 1152.0f, d2);
        v[1] = mmw_deq2(w0, 0x4342u, 1152.0f, d2);
        v[2] = mmw_deq2(w1, 0x4140u, 1152.0f, d2);
        v[3] = mmw_deq2(w1, 0x4342u, 1152.0f, d2);
    } else if constexpr (FMT == OP_FMT_Q5_0) {
        // quant(0): the 32 fifth bits; quant(1 ..): the nibbles.
        const float d = mmw_float(r[0] >> (16 * bh));
        const uint32_t qh = quant(0);
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const uint32_t i = 8 * c + e, b = i % 16;
            const uint32_t nib = (quant(1 + b / 4) >> (8 * (b % 4) + 4 * (i / 16))) & 15u;
            const uint32_t bit = (qh >> i) & 1u;
            f[e] = d * (float)((int)(nib | (bit << 4)) - 16);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = mma_pack(f[2 * e], f[2 * e + 1]);
    } else if constexpr (FMT == OP_FMT_Q4_K) {
        // Sub-block 2 (s % 4) + bh: its 6-bit scale and minimum (`op_q4k_scale_min` on bytes
        // 4 .. 15 of the header, words 1 .. 3), nibble bh of bytes 8 c .. 8 c + 7.
        const uint32_t sub = 2 * (s % 4) + bh, i = sub % 4;
        auto byte = [](uint32_t w, uint32_t b) { return (w >> (8 * b)) & 0xffu; };
        uint32_t sc, mn;
        if (sub < 4) {
            sc = byte(r[1], i) & 63;
            mn = byte(r[2], i) & 63;
        } else {
            sc = (byte(r[3], i) & 0x0F) | ((byte(r[1], i) >> 6) << 4);
            mn = (byte(r[3], i) >> 4) | ((byte(r[2], i) >> 6) << 4);
        }
        const float d1 = mmw_float(r[0]) * (float)sc;
        const float m1 = mmw_float(r[0] >> 16) * (float)mn;
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const uint32_t q = (r[4 + 2 * c + e / 4] >> (8 * (e % 4) + 4 * bh)) & 0x0F;
            f[e] = d1 * (float)q - m1;
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = mma_pack(f[2 * e], f[2 * e + 1]);
    } else if constexpr (FMT == OP_FMT_Q6_K) {
        // Sub-block j = 2 (s % 4) + bh; quarter j % 4 of its half takes the low (quarters 0,
        // 1) or high nibbles of its ql bytes and bits 2 (j % 4) .. of its qh bytes; scale 2 j
        // for values 0 .. 15, 2 j + 1 after.
        const uint32_t sup = s / 4, j = 2 * (s % 4) + bh, quarter = j % 4;
        const uint32_t shift = 16 * (sup % 2), lead = 2 * (sup % 2);
        const uint32_t b0 = (lead + 2 * j) % 4;
        const float sc = (float)(int8_t)((r[18] >> (8 * (b0 + (c >= 2 ? 1 : 0)))) & 0xffu);
        const float d = mmw_float(r[19] >> (8 * lead));
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int wi = 2 * c + e / 4;
            const uint32_t ql = __funnelshift_rc(r[wi], r[wi + 1], shift);
            const uint32_t qh = __funnelshift_rc(r[9 + wi], r[10 + wi], shift);
            const uint32_t q = ((ql >> (8 * (e % 4) + 4 * (quarter / 2))) & 0x0F) |
                               (((qh >> (8 * (e % 4) + 2 * quarter)) & 3) << 4);
            f[e] = d * sc * (float)((int)q - 32);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = mma_pack(f[2 * e], f[2 * e + 1]);
    }
}
#endif

// One tile: rows m0.., weight rows of outputs o0.. (SW: 64 outputs of gate `w` and up `w2`,
// written to `hout` as their SwiGLU in f16; else out = (or, ACC, +=) the products). `base`: the
// 1024-aligned shared address of the slots.
template <int FMT, bool ACC, bool SW>
__device__ __forceinline__ void mmw_tile(const __half* x, const uint8_t* w, const uint8_t* w2,
                                         float* out, __half* hout, uint32_t rows, uint32_t k,
                                         uint32_t n, uint64_t row_bytes, uint32_t m0, uint32_t o0,
                                         uint32_t base) {
    constexpr int D = MMW_S - 2;
    const int t = threadIdx.x, wg = t / 128, warp = (t / 32) % 4, lane = t % 32;
    const uint32_t steps = k / 64;
    // Activations: chunk t % 8 of rows t / 8 and t / 8 + 32 j.
    const uint32_t aq = t % 8, ar = t / 8;
    const uint32_t a_dst = ar * 128 + ((aq ^ (ar % 8)) << 4);
    auto issue_a = [&](uint32_t slot, uint32_t s) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t r = m0 + ar + 32 * j;
            const bool live = r < rows;
            const __half* src = live ? x + (uint64_t)r * k + s * 64 + aq * 8 : x;
            mmw_cp16(slot + a_dst + j * 32 * 128, src, live);
        }
    };
    // Weights: tile row bn = t / 2 (a SwiGLU tile's rows alternate gate and up by groups of 8),
    // half bh = t % 2 of the step's 64 values (`mmw_load`).
    constexpr int W = MmwFormat<FMT>::words;
    const uint32_t bh = t % 2, bn = t / 2;
    const uint8_t* w_row =
        SW ? (((bn >> 3) & 1) ? w2 : w) + (uint64_t)(o0 + 8 * (bn >> 4) + (bn & 7)) * row_bytes
           : w + (uint64_t)(o0 + bn) * row_bytes;
    auto load_raw = [&](uint32_t (&r)[W], uint32_t s) { mmw_load<FMT>(w_row, s, bh, r); };
    auto store_b = [&](uint32_t slot, const uint32_t (&r)[W], uint32_t s) {
        const uint32_t row = slot + MMW_BM * 128 + bn * 128;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            uint32_t v[4];
            mmw_values<FMT>(r, s, bh, c, v);
            mmw_st16(row + (((4 * bh + c) ^ (bn % 8)) << 4), v[0], v[1], v[2], v[3]);
        }
    };
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    uint32_t raw[2][W];
    // Steps 0 .. D - 1 into their slots; the raw weights of steps D and D + 1 in registers.
#pragma unroll
    for (int p = 0; p < D; ++p) {
        if (p < steps) issue_a(base + p * MMW_SLOT, p);
        op_cp_commit();
    }
#pragma unroll
    for (int p = 0; p < D; ++p)
        if (p < steps) load_raw(raw[p % 2], p);
#pragma unroll
    for (int p = 0; p < D; ++p)
        if (p < steps) store_b(base + p * MMW_SLOT, raw[p % 2], p);
    if (D < steps) load_raw(raw[0], D);
    if (D + 1 < steps) load_raw(raw[1], D + 1);
    // Step s; `r` holds the raw weights of step s + D and takes those of step s + D + 2.
    auto step = [&](uint32_t s, uint32_t (&r)[W]) {
        op_cp_wait<D - 1>();
        mmw_fence_proxy();
        __syncthreads();
        const uint32_t slot = base + (s % MMW_S) * MMW_SLOT;
        const uint64_t da = mmw_desc(slot + wg * 64 * 128), db = mmw_desc(slot + MMW_BM * 128);
        mmw_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) mmw_k16(acc, da + 2 * kk, db + 2 * kk);
        mmw_commit();
        mmw_pin(acc);
        if (s + D < steps) {
            const uint32_t fill = base + ((s + D) % MMW_S) * MMW_SLOT;
            store_b(fill, r, s + D);
            issue_a(fill, s + D);
        }
        op_cp_commit();
        if (s + D + 2 < steps) load_raw(r, s + D + 2);
        mmw_wait<1>();
        mmw_pin(acc);
    };
    for (uint32_t s = 0; s < steps; s += 2) {
        step(s, raw[0]);
        if (s + 1 < steps) step(s + 1, raw[1]);
    }
    mmw_wait<0>();
    mmw_pin(acc);
    // Thread (warp, lane) holds rows 16 warp + lane / 4 (+ 8) of its warpgroup's 64, columns
    // 8 j + 2 (lane % 4) (+ 1) of chunk j.
    const uint32_t r0 = m0 + wg * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        if constexpr (SW) {
            // Chunk j even: gate's outputs o0 + 4 j + 2 (lane % 4) (+ 1); chunk j + 1: up's.
            if (j % 2 != 0) continue;
            const uint32_t col = o0 + 4 * j + 2 * (lane % 4);
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const uint32_t r = r0 + 8 * hf;
                if (r >= rows) continue;
                const __half v0 =
                    __float2half_rn(act_silu(acc[4 * j + 2 * hf]) * acc[4 * j + 4 + 2 * hf]);
                const __half v1 = __float2half_rn(act_silu(acc[4 * j + 2 * hf + 1]) *
                                                  acc[4 * j + 4 + 2 * hf + 1]);
                *(__half2*)(hout + (uint64_t)r * n + col) = __halves2half2(v0, v1);
            }
        } else {
            const uint32_t col = o0 + 8 * j + 2 * (lane % 4);
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const uint32_t r = r0 + 8 * hf;
                if (r >= rows) continue;
                float2* y = (float2*)(out + (uint64_t)r * n + col);
                float2 v = make_float2(acc[4 * j + 2 * hf], acc[4 * j + 2 * hf + 1]);
                if (ACC) {
                    const float2 a = *y;
                    v = make_float2(a.x + v.x, a.y + v.y);
                }
                *y = v;
            }
        }
    }
}
#endif

// Whether the Hopper form takes a product of `FMT` weights `w` (n outputs of `row_bytes` bytes;
// `sw`: a SwiGLU pair's, tiles of 64) on f16 activations `x`: a GGML block format (`MmwFormat`),
// compiled for sm_90a, k whole 64-value steps, n whole tiles, x 16-byte aligned and the rows
// aligned as the format's loads need, a block of 256 threads with MMW_SMEM bytes.
template <int FMT>
__device__ __forceinline__ bool mmw_applies(const __half* x, const uint8_t* w, uint32_t k,
                                            uint32_t n, uint64_t row_bytes, bool sw) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using F = MmwFormat<FMT>;
    return F::ok && blockDim.x == 256 && blockDim.y == 1 && k % 64 == 0 &&
           n % (sw ? MMW_BN / 2 : MMW_BN) == 0 && ((uint64_t)x & 15u) == 0 &&
           ((uint64_t)w % F::align) == 0 && row_bytes % F::align == 0 &&
           mm_dynamic_smem() >= MMW_SMEM;
#else
    return false;
#endif
}

// The Hopper form over P products' tiles (1, or 3 side by side; ACC: added into the outputs), or
// a SwiGLU pair's (SW: gate m.w(0), up m.w(1), f16 output `hout`); `false` where it does not
// apply (the caller takes another form).
template <int FMT, bool ACC, int P, bool SW = false>
__device__ bool mm_wgmma(const __half* x, const Mm3& m, uint32_t rows, uint32_t k,
                         uint64_t row_bytes, __half* hout = nullptr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int np = SW ? 2 : P;
    for (int p = 0; p < np; ++p)
        if (!mmw_applies<FMT>(x, m.w(p), k, m.n(p), row_bytes, SW)) return false;
    extern __shared__ __align__(16) float mm_smem[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(mm_smem) + 1023u) & ~1023u;
    const uint32_t tn = SW ? MMW_BN / 2 : MMW_BN;
    const uint64_t t0 = m.n0 / tn;
    const uint64_t t1 = P == 1 ? 0 : m.n1 / tn;
    const uint64_t tiles_n = P == 1 ? t0 : t0 + t1 + m.n2 / tn;
    const uint64_t tiles_m = ((uint64_t)rows + MMW_BM - 1) / MMW_BM;
    for (uint64_t tile = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; tile < tiles_m * tiles_n;
         tile += (uint64_t)gridDim.x * gridDim.y) {
        const uint32_t m0 = (uint32_t)(tile % tiles_m) * MMW_BM;
        const uint64_t c = tile / tiles_m;
        const int p = P == 1 ? 0 : c < t0 ? 0 : c < t0 + t1 ? 1 : 2;
        const uint32_t o0 = (uint32_t)(c - (p == 0 ? 0 : p == 1 ? t0 : t0 + t1)) * tn;
        // The slots are free: every warpgroup waited for its products of the last tile.
        __syncthreads();
        mmw_tile<FMT, ACC, SW>(x, m.w(p), m.w(1), m.out(p), hout, rows, k, m.n(p), row_bytes, m0, o0,
                          base);
    }
    return true;
#else
    return false;
#endif
}
