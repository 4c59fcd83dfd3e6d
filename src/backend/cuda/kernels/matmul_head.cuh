// The output head's one-row product on f32 activations through tensor cores (compiled after
// matmul_mma.cuh, whose `mma_16816` it calls, in front of matmul.cu): `mm_head_split`.
//
// Under `ncu` the f32 one-row form of the heads was bound by the SM, not by DRAM (the 8B's Q4_0
// head issued 6.5 warp instructions a weight, the 1B's Q8_0 head kept L1 96% busy with x read
// for every row; docs/kernels.md items 29 and 30). Here the row is split once per block into two
// f16 halves, x = hi + lo (hi = x rounded to f16, lo = the rest rounded to f16: about 22 bits of
// x), and each warp takes 16 weight rows at a time, staged eight blocks (256 values) at a time into
// its shared memory with 16-byte loads (the next step's loads in flight while this one is summed;
// Q6_K's 210-byte steps from the word that holds their first byte):
// read straight from global memory, two bytes a lane, each load touched eight rows' cache lines
// and L1 bound the form (docs/kernels.md items 30-32). Per 32-value block two `mma.sync` m16n8k16
// products whose B operand has hi in column 0 and lo in column 1 (the other six columns zero),
// against the block's quants as exact small integers in f16 (Q4_0's q - 8, Q8_0's q, Q4_K's q of a
// 32-value sub-block, Q6_K's q - 32 of two 16-value scale groups). The f32 sums of hi and lo are
// added and scaled by the row's block scale d in f32, block after block; a Q4_K sub-block's by d
// times its 6-bit scale, less dmin times its 6-bit min times the sub-block's sum of x (in f32,
// once per block into shared memory); a Q6_K group's by its 8-bit scale, the super-block's sum by
// d.
// So each product w x sees x to about 2^-22 relatively (an f16 half of a value under 2^-14 keeps
// fewer bits: about 6e-8 absolutely) and sums in f32, as the f32 form does, in another order.

// The f32 row behind an activation row type: XPlain's, else none (no other row takes this form).
__device__ __forceinline__ const float* mm_plain_row(XPlain x) { return x.x; }
template <typename X>
__device__ __forceinline__ const float* mm_plain_row(X) {
    return nullptr;
}

// Rows a warp takes at once: the m16n8k16 product's 16.
#define MM_HEAD_GROUP 16u
// 32-value blocks of a row a step stages (256 values: one Q4_K or Q6_K super-block), and the warps
// of a block (256 threads).
#define MM_HEAD_STEP 8u
#define MM_HEAD_WARPS 8u
// Bytes of a row's whole step: Q4_0's and Q4_K's 144, Q8_0's 272, Q6_K's 210.
#define MM_HEAD_STEP_BYTES(FMT) \
    ((FMT) == OP_FMT_Q8_0 ? 272u : (FMT) == OP_FMT_Q6_K ? 210u : 144u)
// The 16-byte words a row's step may touch: Q6_K's 210-byte steps start at any even byte of a
// word, so one word more than they fill; the other formats' steps are whole words (rows of a
// multiple of 256 values). Steps that start inside a word cost the other formats 40 registers
// (Q8_0's 128 -> 168, so one block an SM: SmolLM2's head of 612-byte rows took 18% longer than
// in the f32 form, the 1B's 30%).
#define MM_HEAD_WIN(FMT) ((FMT) == OP_FMT_Q6_K ? 14u : MM_HEAD_STEP_BYTES(FMT) / 16u)
// A row's words in a warp's stage: the window made odd, so the 16 rows' same words fall in
// different banks.
#define MM_HEAD_WORDS(FMT) (MM_HEAD_WIN(FMT) | 1u)
// Bytes of the sums of x a 32-value block (Q4_K's mins need them; 4 bytes a block).
#define MM_HEAD_XSUMS(k, FMT) ((FMT) == OP_FMT_Q4_K ? (k) / 8u : 0u)
// Dynamic shared memory that selects this form: the row's two f16 halves (4 bytes a value), 16
// bytes more, Q4_K's sums of x, and each warp's stage of 16 rows' step, a size no other one-row
// launch has (the int8 form's is MM_Q8_BYTES(k)).
#define MM_HEAD_SMEM(k, FMT)                  \
    (4u * (k) + 16u + MM_HEAD_XSUMS(k, FMT) + \
     MM_HEAD_WARPS * MM_HEAD_GROUP * 16u * MM_HEAD_WORDS(FMT))

// Whether the launch asks for this form (block-uniform): Q4_0, Q8_0, Q4_K or Q6_K rows of k values
// (a multiple of 256) at a 16-byte aligned address, n rows a whole number of 16-byte words (Q6_K:
// so a word that holds a row's byte lies inside the matrix), x 8-byte aligned, MM_HEAD_WARPS warps
// a block with MM_HEAD_SMEM(k, FMT) bytes of dynamic shared memory, sm_80+.
template <int FMT>
__device__ __forceinline__ bool mm_head_split_ok(const float* x, const uint8_t* w, uint32_t k,
                                                 uint32_t n, uint64_t row_bytes) {
#if __CUDA_ARCH__ >= 800
    return (FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q8_0 || FMT == OP_FMT_Q4_K ||
            FMT == OP_FMT_Q6_K) &&
           k % 256 == 0 && blockDim.x == 32 * MM_HEAD_WARPS && blockDim.y == 1 &&
           ((uint64_t)w & 15u) == 0 &&
           (FMT == OP_FMT_Q6_K ? (n * row_bytes) % 16 == 0 : row_bytes % 16 == 0) &&
           ((uint64_t)x & 7u) == 0 && mm_dynamic_smem() == MM_HEAD_SMEM(k, FMT);
#else
    return false;
#endif
}

#if __CUDA_ARCH__ >= 800
// Two bytes (the low 16 bits of u) as the f16 pair (1024 + v0, 1024 + v1) of their low nibbles
// (LO), high nibbles (HI) or whole signed values plus 128 (BYTES): the bits 0x6400 | v are
// 1024 + v exactly.
#define MM_HEAD_LO 0
#define MM_HEAD_HI 1
#define MM_HEAD_BYTES 2
template <int PART>
__device__ __forceinline__ __half2 mm_head_pair(uint32_t u) {
    uint32_t v;
    if (PART == MM_HEAD_LO) v = (u & 0x0fu) | ((u << 8) & 0x0f0000u);
    else if (PART == MM_HEAD_HI) v = ((u >> 4) & 0x0fu) | ((u << 4) & 0x0f0000u);
    else v = ((u & 0xffu) | ((u << 8) & 0xff0000u)) ^ 0x00800080u;
    v |= 0x64006400u;
    return *reinterpret_cast<const __half2*>(&v);
}
__device__ __forceinline__ uint32_t mm_head_bits(__half2 h) {
    return *reinterpret_cast<const uint32_t*>(&h);
}

// The A fragment of k-step s (0 or 1) of block `b` for rows ra (the lane's row g of the stage)
// and rb (g + 8), lane t = lane % 4: positions 2t, 2t + 1 and 2t + 8, 2t + 9 of the step are values
//   Q4_0: 8s + 2t, +1 (low nibbles of quant bytes 8s + 2t, +1) and 16 + 8s + 2t, +1 (their high
//         nibbles), each q - 8;
//   Q8_0: 16s + 2t, +1 and 16s + 8 + 2t, +1;
//   Q4_K: the same values of sub-block b of the step's super-block (the low nibbles of its quant
//         bytes 32 (b / 2) + ... for even b, the high ones for odd b).
// `mm_head_x_at` gives the same values' places in x.
template <int FMT>
__device__ __forceinline__ void mm_head_a(uint32_t (&a)[4], const uint8_t* ra, const uint8_t* rb,
                                          uint32_t b, uint32_t s, uint32_t t) {
    if (FMT == OP_FMT_Q4_0) {
        const uint32_t off = 18 * b + 2 + 8 * s + 2 * t;
        const uint32_t ua = *(const uint16_t*)(ra + off), ub = *(const uint16_t*)(rb + off);
        const __half2 eight = __floats2half2_rn(1032.0f, 1032.0f);
        a[0] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_LO>(ua), eight));
        a[1] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_LO>(ub), eight));
        a[2] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_HI>(ua), eight));
        a[3] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_HI>(ub), eight));
    } else if (FMT == OP_FMT_Q4_K) {
        const uint32_t off = 16 + 32 * (b / 2) + 16 * s + 2 * t;
        const __half2 base = __floats2half2_rn(1024.0f, 1024.0f);
        const uint32_t u0 = *(const uint16_t*)(ra + off), u1 = *(const uint16_t*)(rb + off);
        const uint32_t u2 = *(const uint16_t*)(ra + off + 8), u3 = *(const uint16_t*)(rb + off + 8);
        if (b % 2 == 0) {
            a[0] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_LO>(u0), base));
            a[1] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_LO>(u1), base));
            a[2] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_LO>(u2), base));
            a[3] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_LO>(u3), base));
        } else {
            a[0] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_HI>(u0), base));
            a[1] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_HI>(u1), base));
            a[2] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_HI>(u2), base));
            a[3] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_HI>(u3), base));
        }
    } else {
        const uint32_t off = 34 * b + 2 + 16 * s + 2 * t;
        const __half2 bias = __floats2half2_rn(1152.0f, 1152.0f);
        const uint32_t u0 = *(const uint16_t*)(ra + off), u1 = *(const uint16_t*)(rb + off);
        const uint32_t u2 = *(const uint16_t*)(ra + off + 8), u3 = *(const uint16_t*)(rb + off + 8);
        a[0] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_BYTES>(u0), bias));
        a[1] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_BYTES>(u1), bias));
        a[2] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_BYTES>(u2), bias));
        a[3] = mm_head_bits(__hsub2(mm_head_pair<MM_HEAD_BYTES>(u3), bias));
    }
}

// The value of x that position 2t (j = 0) or 2t + 8 (j = 1) of k-step s of a block holds (see
// `mm_head_a`), relative to the block's first value; the next position holds the next value.
template <int FMT>
__device__ __forceinline__ uint32_t mm_head_x_at(uint32_t s, uint32_t j, uint32_t t) {
    return FMT == OP_FMT_Q4_0 ? 16 * j + 8 * s + 2 * t : 16 * s + 8 * j + 2 * t;
}

// The block scale of a row's block b (an f16 at the block's start; Q4_K: the super-block's d).
template <int FMT>
__device__ __forceinline__ float mm_head_d(const uint8_t* row, uint32_t b) {
    const uint32_t bytes = FMT == OP_FMT_Q4_0 ? 18 : FMT == OP_FMT_Q8_0 ? 34 : 0;
    return __half2float(*(const __half*)(row + bytes * b));
}

// Q6_K's unit u (0..7) of a super-block for rows ra and rb (the lane's rows g and g + 8 of the
// stage), lane t = lane % 4: the 16 quant bytes ql[32 (u / 2) + 16 (u % 2) ..] hold in their low
// nibbles the low bits of values v0 + i (v0 = 128 (u / 4) + 32 (u / 2 % 2) + 16 (u % 2)) and in
// their high nibbles those of v0 + 64 + i, whose two high bits are bits 2 (u / 2 % 2) and that + 4
// of qh[32 (u / 4) + 16 (u % 2) + i]. So one unit is two m16n8k16 products (a0: the values v0 + i,
// a1: v0 + 64 + i), each of one 16-value scale; positions 2t, 2t + 1 and 2t + 8, 2t + 9 of each
// are i = 2t, 2t + 1 and 2t + 8, 2t + 9, as exact f16 integers q - 32.
__device__ __forceinline__ void mm_head_q6k_a(uint32_t (&a0)[4], uint32_t (&a1)[4],
                                              const uint8_t* ra, const uint8_t* rb, uint32_t u,
                                              uint32_t t) {
    const uint32_t ql = 32 * (u / 2) + 16 * (u % 2) + 2 * t;
    const uint32_t qh = 128 + 32 * (u / 4) + 16 * (u % 2) + 2 * t;
    const uint32_t sh = 2 * (u / 2 % 2);
    const uint8_t* rows[2] = {ra, rb};
    const __half2 bias = __floats2half2_rn(1056.0f, 1056.0f);
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) {
        // a[j]: row j % 2, positions 2t (j < 2) or 2t + 8. Each pair's two bytes spread to the
        // low bytes of the two halves (__byte_perm), then the nibbles and the two high bits of
        // each value meet above 0x6400 (1024 + q).
        const uint8_t* r = rows[j % 2];
        const uint32_t l = __byte_perm(*(const uint16_t*)(r + ql + 8 * (j / 2)), 0u, 0x7170u);
        const uint32_t h = __byte_perm(*(const uint16_t*)(r + qh + 8 * (j / 2)), 0u, 0x7170u);
        const uint32_t v0 = (l & 0x000f000fu) | ((h << (4 - sh)) & 0x00300030u) | 0x64006400u;
        const uint32_t v1 = ((l >> 4) & 0x000f000fu) | ((h >> sh) & 0x00300030u) | 0x64006400u;
        a0[j] = mm_head_bits(__hsub2(*reinterpret_cast<const __half2*>(&v0), bias));
        a1[j] = mm_head_bits(__hsub2(*reinterpret_cast<const __half2*>(&v1), bias));
    }
}
#endif

// out[o] = x . W[o] (with ACC, out[o] += it) for the one row x, where `mm_head_split_ok`. Every
// thread of the block splits part of x into shared memory first; a value that f16 cannot hold
// (|x| of 65,504 or more, or not finite) makes the block return false, and the caller's f32 form
// computes its rows. Warp w takes rows 16 w .., then strides by the grid's warps, each group of 16
// rows staged a step (MM_HEAD_STEP blocks of each) at a time; rows past n read the last row and
// write nothing.
template <int FMT, bool ACC>
__device__ __forceinline__ bool mm_head_split(const float* x, const uint8_t* w, float* out,
                                              uint32_t k, uint32_t n, uint64_t row_bytes) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) float mm_smem[];
    __half2* hi = (__half2*)mm_smem;
    __half2* lo = hi + k / 2;
    bool ok = true;
    for (uint32_t i = threadIdx.x; i < k / 2; i += blockDim.x) {
        const float2 v = *(const float2*)(x + 2 * i);
        ok = ok && fabsf(v.x) < 65504.0f && fabsf(v.y) < 65504.0f;
        const __half2 h = __floats2half2_rn(v.x, v.y);
        const float2 hf = __half22float2(h);
        hi[i] = h;
        lo[i] = __floats2half2_rn(v.x - hf.x, v.y - hf.y);
    }
    // Q4_K: the sum of each 32-value block of x, in order.
    float* xsum = (float*)((uint8_t*)mm_smem + 4 * k + 16);
    if (FMT == OP_FMT_Q4_K) {
        for (uint32_t b = threadIdx.x; b < k / 32; b += blockDim.x) {
            float sum = 0.0f;
#pragma unroll
            for (uint32_t i = 0; i < 16; ++i) {
                const float2 v = *(const float2*)(x + 32 * b + 2 * i);
                sum += v.x;
                sum += v.y;
            }
            xsum[b] = sum;
        }
    }
    if (__syncthreads_or(!ok)) return false;
    const uint32_t lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // Column g of the B operand: hi for g = 0, lo for g = 1, zeros for the others.
    const __half2* col = g == 0 ? hi : lo;
    const bool live = g < 2;
    constexpr uint32_t SB = MM_HEAD_STEP_BYTES(FMT), WIN = MM_HEAD_WIN(FMT);
    constexpr uint32_t W = MM_HEAD_WORDS(FMT), SLOTS = MM_HEAD_GROUP * WIN;
    constexpr uint32_t PER = (SLOTS + 31) / 32;
    // This warp's stage: 16 rows of W words, row i's step starting (i's shift) bytes into them.
    uint4* stage = (uint4*)((uint8_t*)mm_smem + 4 * k + 16 + MM_HEAD_XSUMS(k, FMT)) +
                   (threadIdx.x >> 5) * MM_HEAD_GROUP * W;
    const uint8_t* stage_a = (const uint8_t*)(stage + g * W);
    const uint8_t* stage_b = (const uint8_t*)(stage + (g + 8) * W);
    const uint32_t steps = k / (32 * MM_HEAD_STEP);
    const uint64_t groups = ((uint64_t)n + MM_HEAD_GROUP - 1) / MM_HEAD_GROUP;
    for (uint64_t grp = mm_warp_id(); grp < groups; grp += mm_warp_count()) {
        const uint64_t r0 = grp * MM_HEAD_GROUP + g, r1 = r0 + 8;
        // Where rows g and g + 8 start in their first word (w is 16-byte aligned; Q6_K only).
        const uint32_t at0 = (uint32_t)((r0 < n ? r0 : n - 1) * row_bytes) & 15u;
        const uint32_t at1 = (uint32_t)((r1 < n ? r1 : n - 1) * row_bytes) & 15u;
        // Slot i of the group's step: row i / WIN (the last row for rows past n), word i % WIN
        // of the 16-byte words from the one holding the step's first byte; a word past the
        // step's last byte is not read.
        uint4 next[PER];
        auto load = [&](uint32_t st) {
#pragma unroll
            for (uint32_t j = 0; j < PER; ++j) {
                const uint32_t i = lane + 32 * j;
                if (i < SLOTS) {
                    const uint64_t r = grp * MM_HEAD_GROUP + i / WIN;
                    const uint8_t* row = w + (r < n ? r : n - 1) * row_bytes;
                    if (FMT != OP_FMT_Q6_K) {
                        // Whole words (a condition here, always true, cost 40 registers).
                        next[j] = __ldg((const uint4*)row + (uint64_t)st * W + i % W);
                    } else {
                        const uint64_t at = (uint64_t)row + st * SB;
                        next[j] = make_uint4(0u, 0u, 0u, 0u);
                        if (16 * (i % WIN) < ((uint32_t)at & 15u) + SB)
                            next[j] = __ldg((const uint4*)(at & ~(uint64_t)15) + i % WIN);
                    }
                }
            }
        };
        load(0);
        float acc0 = 0.0f, acc1 = 0.0f;
        for (uint32_t st = 0; st < steps; ++st) {
            __syncwarp();  // the last step's reads of the stage are done
#pragma unroll
            for (uint32_t j = 0; j < PER; ++j) {
                const uint32_t i = lane + 32 * j;
                if (i < SLOTS) stage[(i / WIN) * W + i % WIN] = next[j];
            }
            __syncwarp();
            if (st + 1 < steps) load(st + 1);
            // Rows g and g + 8 of the step, from their shifts into their first words.
            const uint8_t* ra = stage_a + (FMT == OP_FMT_Q6_K ? (at0 + st * SB) & 15u : 0u);
            const uint8_t* rb = stage_b + (FMT == OP_FMT_Q6_K ? (at1 + st * SB) & 15u : 0u);
            const uint32_t x0 = 32 * st * MM_HEAD_STEP;
            if (FMT == OP_FMT_Q6_K) {
                const float da = __half2float(*(const __half*)(ra + 208));
                const float db = __half2float(*(const __half*)(rb + 208));
                float sa0 = 0.0f, sb0 = 0.0f;
#pragma unroll
                for (uint32_t u = 0; u < 8; ++u) {
                    uint32_t a0[4], a1[4];
                    mm_head_q6k_a(a0, a1, ra, rb, u, t);
                    const uint32_t v0 = 128 * (u / 4) + 32 * (u / 2 % 2) + 16 * (u % 2);
                    uint32_t b00 = 0, b01 = 0, b10 = 0, b11 = 0;
                    if (live) {
                        b00 = mm_head_bits(col[(x0 + v0 + 2 * t) / 2]);
                        b01 = mm_head_bits(col[(x0 + v0 + 2 * t + 8) / 2]);
                        b10 = mm_head_bits(col[(x0 + v0 + 64 + 2 * t) / 2]);
                        b11 = mm_head_bits(col[(x0 + v0 + 72 + 2 * t) / 2]);
                    }
                    float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_16816(c0, a0, b00, b01);
                    mma_16816(c1, a1, b10, b11);
                    const int8_t* sca = (const int8_t*)(ra + 192 + v0 / 16);
                    const int8_t* scb = (const int8_t*)(rb + 192 + v0 / 16);
                    sa0 += (float)sca[0] * (c0[0] + c0[1]) + (float)sca[4] * (c1[0] + c1[1]);
                    sb0 += (float)scb[0] * (c0[2] + c0[3]) + (float)scb[4] * (c1[2] + c1[3]);
                }
                acc0 += da * sa0;
                acc1 += db * sb0;
                continue;
            }
            // Q4_K: the step's super-block scales of rows g and g + 8.
            float dka = 0.0f, dkb = 0.0f, mka = 0.0f, mkb = 0.0f;
            if (FMT == OP_FMT_Q4_K) {
                dka = __half2float(*(const __half*)ra);
                dkb = __half2float(*(const __half*)rb);
                mka = __half2float(*(const __half*)(ra + 2));
                mkb = __half2float(*(const __half*)(rb + 2));
            }
            auto block = [&](uint32_t bb) {
                uint32_t a0[4], a1[4];
                mm_head_a<FMT>(a0, ra, rb, bb, 0, t);
                mm_head_a<FMT>(a1, ra, rb, bb, 1, t);
                const uint32_t xb = x0 + 32 * bb;
                uint32_t b00 = 0, b01 = 0, b10 = 0, b11 = 0;
                if (live) {
                    b00 = mm_head_bits(col[(xb + mm_head_x_at<FMT>(0, 0, t)) / 2]);
                    b01 = mm_head_bits(col[(xb + mm_head_x_at<FMT>(0, 1, t)) / 2]);
                    b10 = mm_head_bits(col[(xb + mm_head_x_at<FMT>(1, 0, t)) / 2]);
                    b11 = mm_head_bits(col[(xb + mm_head_x_at<FMT>(1, 1, t)) / 2]);
                }
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_16816(c, a0, b00, b01);
                mma_16816(c, a1, b10, b11);
                // Lanes with t = 0 hold columns 0 (hi) and 1 (lo) of rows g and g + 8.
                if (FMT == OP_FMT_Q4_K) {
                    uint32_t sa, ma, sb, mb;
                    op_q4k_scale_min(ra + 4, bb, sa, ma);
                    op_q4k_scale_min(rb + 4, bb, sb, mb);
                    const float xs = xsum[xb / 32];
                    acc0 += dka * (float)sa * (c[0] + c[1]) - mka * (float)ma * xs;
                    acc1 += dkb * (float)sb * (c[2] + c[3]) - mkb * (float)mb * xs;
                } else {
                    acc0 += mm_head_d<FMT>(ra, bb) * (c[0] + c[1]);
                    acc1 += mm_head_d<FMT>(rb, bb) * (c[2] + c[3]);
                }
            };
#pragma unroll(FMT == OP_FMT_Q4_K ? 8 : 4)
            for (uint32_t bb = 0; bb < MM_HEAD_STEP; ++bb) block(bb);
        }
        if (t == 0) {
            if (r0 < n) out[r0] = ACC ? out[r0] + acc0 : acc0;
            if (r1 < n) out[r1] = ACC ? out[r1] + acc1 : acc1;
        }
    }
    return true;
#else
    return false;
#endif
}
