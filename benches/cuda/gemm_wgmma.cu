// A standalone harness for the prompt product of Q4_0 weights on Hopper's warpgroup tensor-core
// instructions (issue 20): `wgmma.mma_async` with both operands in shared memory.
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o gemm_wgmma benches/cuda/gemm_wgmma.cu
//   ./gemm_wgmma [warm]
// (weights rotated among copies larger than three times L2 unless `warm`; sm_90a, not sm_90: the
// wgmma instructions exist only on the arch-specific target; CUDA 13's nvcc needs the explicit
// -gencode, as `-arch=sm_90a` gave its PTX the sm_90 target.)
//
// The product: y[m][n] = sum_k x[m][k] w[n][k]; x f16 [M, K] row-major, w Q4_0 rows of K/32 blocks
// of 18 bytes (f16 scale d, then 16 bytes: element j the low nibble of byte j, element j + 16 its
// high nibble; value d (q - 8)), y f32 [M, N] row-major. Needs K % 64 == 0 and N % BN == 0 (all
// Llama-3.1-8B shapes are); any M (rows past M read as zeros and are not stored).
//
// Forms, wg BMxBN sS: blocks of BM/64 warpgroups (128 threads each), each warpgroup one
// m64nBNk16 accumulator tile in registers (BN/2 floats a thread), 64-value steps, S slots of
// shared memory of (A tile, B tile), both K-major with the 128-byte swizzle:
//   - a tile row is 64 f16 = 128 bytes, rows of 8 make a 1024-byte group, the 16-byte chunk c of
//     row r is stored at chunk c ^ (r % 8) of that row; tiles start on 1024-byte boundaries.
//   - A (activations): `cp.async` 16-byte copies straight into that layout.
//   - B (weights): each thread loads raw Q4_0 blocks (5 words: a pair of blocks, 36 bytes, is
//     word-aligned) into registers two steps ahead, dequantizes them ((1024 + q) - 1032 exact in
//     f16, times d rounded once, `__hmul2`) and stores 16-byte chunks into that layout.
//   - a step: wait for the step's copies, `fence.proxy.async.shared::cta` (the stores and copies
//     are generic-proxy writes; wgmma reads through the async proxy), barrier, `wgmma.fence`,
//     four m64nBNk16 wgmmas (start address + 32 bytes per k16 slice), commit; then, while they
//     run, dequantize and store step s + S - 2 into the slot step s - 2 used, issue its activation
//     copies, load the raw weights of step s + S; `wgmma.wait_group 1` (step s - 1 done; a slot
//     is rewritten only after a barrier that follows every warpgroup's wait for it).
//   - one block per output tile, blocks of the same weight columns adjacent in launch order
//     (the row tile varies fastest), so the weight tile comes from HBM once and from L2 after.
//   - epilogue: float2 stores straight from the accumulator fragments.
// Template <BN, WG (warpgroups = BM/64), S, MINB (launch bound: blocks an SM)>:
//   wg 128x128 s3 <128,2,3,2>  wg 128x128 s4 <128,2,4,1>  wg 128x256 s3 <256,2,3,1>
//   wg 128x256 s4 <256,2,4,1>  wg 64x128 s4 <128,1,4,2>   wg 64x256 s4 <256,1,4,1>
//   wg 64x64 s4 <64,1,4,3> (more blocks for the narrow k/v shape: 128 at M = 512)
//
// Layout facts and where they were checked (PTX ISA, section 9.7.15 "Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate", as stored from docs.nvidia.com/cuda/parallel-thread-execution):
//   - 9.7.15.5.1.2.2 Matrix Descriptor Format: bits 13-0 (addr & 0x3FFFF) >> 4, bits 29-16 leading
//     byte offset >> 4, bits 45-32 stride byte offset >> 4, bits 51-49 base offset (0 when the
//     128B pattern starts on a 1024-byte boundary), bits 63-62 swizzle (1 = 128-byte).
//   - 9.7.15.5.1.2.1: K-major leading byte offset "not used [for swizzled layouts], assumed to be
//     1"; K-major stride byte offset "the offset from the first 8 rows to the next 8 rows"
//     (1024 here, encoded 64); 128B K-major canonical layout Swizzle<3,4,3> o ((8,m),(T,2k)):
//     ((8T,SBO),(1,T)), i.e. byte-address bits 4-6 (16-byte chunk) XOR bits 7-9 (row % 8).
//   - 9.7.15.4 Async Proxy: "wgmma.mma_async operations are performed in the async proxy ...
//     fence.proxy.async should be used to synchronize memory between generic proxy and the async
//     proxy"; completion of a wgmma carries an implicit generic-async fence (so slots may be
//     rewritten by ordinary stores after wait_group).
//   - the wgmma syntax (d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-a,
//     imm-trans-b; A "row-major", B "column-major", i.e. both K-major with trans 0).
//   - Accumulator fragment (Figure 149 is an image): taken from public code that runs it (a
//     wgmma m64n8k16 test of Microsoft's MMA-Sim; DeepGEMM-style epilogues that scale
//     accum[4i..4i+3] by column 8i + 2 (lane % 4)): warp v of the warpgroup holds rows 16 v +
//     lane / 4 (d[4j], d[4j+1]) and + 8 (d[4j+2], d[4j+3]), columns 8 j + 2 (lane % 4) + {0, 1}.
//   - Not in the text, taken from practice (CUTLASS, DeepGEMM): a k16 slice of a 128B-swizzled
//     K-major tile is addressed by advancing the descriptor's start address by 32 bytes with the
//     base offset left 0 (the XOR uses the address bits, the pattern stays anchored at 1024).
//
// Check: every output of 64 rows spread over M (all residues mod 16) plus the first and last row,
// all N, against float64 sums of the f16 x and f16-rounded dequantized w; bound |err| <=
// K 2^-23 sum_k |x w| + 1e-6 (f32 accumulation: K additions of relative error 2^-24, doubled for
// slack). Outputs are poisoned (NaN bytes) before each form, a NaN fails; one row past the output
// is poisoned too and must stay so (no stores past M). Correctness also at M = 1, 17, 100, 513.
#ifdef __CUDACC_RTC__
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <random>
#include <string>
#include <vector>
#endif
#include <cuda_fp16.h>

// ---- device helpers ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, zero-filled when !live (src must still be a valid address).
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool live) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(live ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void st_shared16(uint32_t a, uint32_t v0, uint32_t v1, uint32_t v2, uint32_t v3) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v0), "r"(v1), "r"(v2), "r"(v3)
                 : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Ties the accumulators to a point of the program, so the compiler neither reads them before a
// wait nor moves them across the asynchronous region.
template <int C>
__device__ __forceinline__ void pin(float (&d)[C]) {
#pragma unroll
    for (int i = 0; i < C; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of a K-major, 128B-swizzled tile at shared address `a` (1024-aligned tile, or that
// plus 32 bytes per k16 slice): LBO 1 (unused), SBO 1024 bytes >> 4 = 64, swizzle mode 1.
__device__ __forceinline__ uint64_t desc(uint32_t a) {
    return (uint64_t)((a & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

#define WG_REGS_Q0                                                                               \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS_Q1                                                                               \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REGS_LO WG_REGS_Q0 ", " WG_REGS_Q1
#define WG_REGS_HI                                                                               \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "           \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "           \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_D8(i)                                                                                 \
    "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]),    \
        "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define WG_D32(i) WG_D8((i) + 0), WG_D8((i) + 8), WG_D8((i) + 16), WG_D8((i) + 24)
#define WG_D64(i) WG_D32(i), WG_D32((i) + 32)

// D (64 x BN, f32) += A (64 x 16, descriptor da) * B (16 x BN, K-major, descriptor db).
template <int BN>
__device__ __forceinline__ void wgmma_k16(float (&d)[BN / 2], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void wgmma_k16<64>(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" WG_REGS_Q0 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : WG_D32(0)
        : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<128>(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" WG_REGS_LO "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_D64(0)
        : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_k16<256>(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" WG_REGS_LO ", " WG_REGS_HI
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : WG_D64(0), WG_D64(64)
        : "l"(da), "l"(db), "r"(1));
}

// Two f16 (q - 8) d from the nibbles in bytes sel of `nibs` (0x4140: bytes 0, 1; 0x4342: 2, 3):
// each nibble placed in the mantissa of 1024 (exact), 1032 subtracted (exact), times d (one
// rounding).
__device__ __forceinline__ uint32_t deq2(uint32_t nibs, uint32_t sel, __half2 d2) {
    const uint32_t bits = __byte_perm(nibs, 0x64646464u, sel);
    const __half2 v = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(1032.0f)), d2);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- the kernel ----
template <int BN, int WG, int S>
struct Geo {
    static constexpr int BM = 64 * WG, T = 128 * WG, D = S - 2;
    static constexpr uint32_t A_BYTES = BM * 128, SLOT = (BM + BN) * 128;
    static constexpr int U = BN * 2 / T;   // Q4_0 blocks a thread per step (a row's step is 2)
    static constexpr int AC = BM * 8 / T;  // 16-byte activation chunks a thread per step (4)
    static constexpr uint32_t SMEM = S * SLOT + 1024;  // + room to align the slots to 1024
    static_assert(S >= 3 && S <= 4, "slots: step s, step s - 1, one filled; the prologue holds D <= 2 raw steps");
    static_assert(U >= 1 && BN * 2 % T == 0 && AC >= 1 && BM * 8 % T == 0, "thread split");
};

template <int BN, int WG, int S, int MINB>
__global__ void __launch_bounds__(WG * 128, MINB)
    wg_gemm(const __half* __restrict__ x, const uint8_t* __restrict__ w, float* __restrict__ y, uint32_t M,
            uint32_t K, uint32_t N) {
    using G = Geo<BN, WG, S>;
    constexpr int T = G::T, D = G::D, U = G::U, AC = G::AC;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const int t = threadIdx.x, wg = t / 128, warp = (t / 32) % 4, lane = t % 32;
    const uint32_t m_tiles = (M + G::BM - 1) / G::BM;
    const uint32_t m0 = (blockIdx.x % m_tiles) * G::BM, n0 = (blockIdx.x / m_tiles) * BN;
    const uint32_t steps = K / 64;
    const uint64_t row_bytes = (uint64_t)(K / 32) * 18;

    // Activations: chunk t % 8 of rows t / 8 + (T / 8) j; row % 8 is (t / 8) % 8 for every j.
    const uint32_t aq = t % 8, ar = t / 8;
    const uint32_t a_dst = ar * 128 + ((aq ^ (ar % 8)) << 4);
    auto issue_a = [&](uint32_t slot, uint32_t s) {
#pragma unroll
        for (int j = 0; j < AC; ++j) {
            const uint32_t r = m0 + ar + (T / 8) * j;
            const bool live = r < M;
            const __half* src = live ? x + (uint64_t)r * K + s * 64 + aq * 8 : x;
            cp16(slot + a_dst + j * (T / 8) * 128, src, live);
        }
    };
    // Weights: block h = t % 2 of the step's pair of rows t / 2 + (T / 2) j; its 5 words start
    // 16 h bytes into the pair (h = 0: d, qs0..15 in bytes 0..17; h = 1: d in bytes 2..3, qs in
    // words 1..4).
    const uint32_t bh = t % 2, bn = t / 2;
    const uint8_t* w_row = w + (uint64_t)(n0 + bn) * row_bytes + 16 * bh;
    auto load_raw = [&](uint32_t (&r)[U][5], uint32_t s) {
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const uint32_t* p = (const uint32_t*)(w_row + (uint64_t)j * (T / 2) * row_bytes + s * 36);
#pragma unroll
            for (int i = 0; i < 5; ++i) r[j][i] = __ldg(p + i);
        }
    };
    auto store_b = [&](uint32_t slot, const uint32_t (&r)[U][5]) {
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const uint32_t n = bn + (T / 2) * j;  // n % 8 == bn % 8
            const __half2 d2 = __half2half2(__ushort_as_half((unsigned short)(r[j][0] >> (16 * bh))));
            uint32_t qw[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) qw[i] = __funnelshift_rc(r[j][i], r[j][i + 1], 16 + 16 * bh);
            const uint32_t row = slot + G::A_BYTES + n * 128;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                // chunk c: elements 8c..8c+7 of the block = low (c < 2) / high nibbles of qs
                // bytes 8 (c % 2) .. 8 (c % 2) + 7.
                const uint32_t lo = (qw[2 * (c % 2)] >> (4 * (c / 2))) & 0x0f0f0f0fu;
                const uint32_t hi = (qw[2 * (c % 2) + 1] >> (4 * (c / 2))) & 0x0f0f0f0fu;
                st_shared16(row + (((4 * bh + c) ^ (bn % 8)) << 4), deq2(lo, 0x4140u, d2), deq2(lo, 0x4342u, d2),
                            deq2(hi, 0x4140u, d2), deq2(hi, 0x4342u, d2));
            }
        }
    };

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    uint32_t raw[2][U][5];

    // Prologue: steps 0 .. D-1 into slots 0 .. D-1; raw weights of steps D, D + 1 in registers.
#pragma unroll
    for (int p = 0; p < D; ++p) {
        if (p < steps) issue_a(base + p * G::SLOT, p);
        cp_commit();
    }
#pragma unroll
    for (int p = 0; p < D; ++p)
        if (p < steps) load_raw(raw[p % 2], p);
#pragma unroll
    for (int p = 0; p < D; ++p)
        if (p < steps) store_b(base + p * G::SLOT, raw[p % 2]);
    if (D < steps) load_raw(raw[0], D);
    if (D + 1 < steps) load_raw(raw[1], D + 1);

    // Step s; `r` holds the raw weights of step s + D and takes those of step s + D + 2.
    auto step = [&](uint32_t s, uint32_t (&r)[U][5]) {
        cp_wait<D - 1>();  // this thread's copies of step s landed (D + s groups committed)
        fence_proxy_async();
        __syncthreads();  // step s in every thread's view; every warpgroup past its wait for s - 2
        const uint32_t slot = base + (s % S) * G::SLOT;
        const uint64_t da = desc(slot + wg * 64 * 128), db = desc(slot + G::A_BYTES);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_k16<BN>(acc, da + 2 * kk, db + 2 * kk);  // +32 bytes
        wg_commit();
        pin(acc);
        if (s + D < steps) {
            const uint32_t fill = base + ((s + D) % S) * G::SLOT;  // the slot of step s - 2
            store_b(fill, r);
            issue_a(fill, s + D);
        }
        cp_commit();
        if (s + D + 2 < steps) load_raw(r, s + D + 2);
        wg_wait<1>();
        pin(acc);
    };
    for (uint32_t s = 0; s < steps; s += 2) {
        step(s, raw[0]);
        if (s + 1 < steps) step(s + 1, raw[1]);
    }
    wg_wait<0>();
    pin(acc);

    const uint32_t r0 = m0 + wg * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const uint32_t col = n0 + 8 * j + 2 * (lane % 4);
        if (r0 < M) *(float2*)(y + (uint64_t)r0 * N + col) = make_float2(acc[4 * j], acc[4 * j + 1]);
        if (r0 + 8 < M) *(float2*)(y + (uint64_t)(r0 + 8) * N + col) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
}

#ifdef __CUDACC_RTC__
// NVRTC check of the device code alone: the forms the host below launches.
template __global__ void wg_gemm<128, 2, 3, 2>(const __half*, const uint8_t*, float*, uint32_t, uint32_t, uint32_t);
template __global__ void wg_gemm<128, 2, 4, 1>(const __half*, const uint8_t*, float*, uint32_t, uint32_t, uint32_t);
template __global__ void wg_gemm<256, 2, 3, 1>(const __half*, const uint8_t*, float*, uint32_t, uint32_t, uint32_t);
template __global__ void wg_gemm<256, 2, 4, 1>(const __half*, const uint8_t*, float*, uint32_t, uint32_t, uint32_t);
template __global__ void wg_gemm<128, 1, 4, 2>(const __half*, const uint8_t*, float*, uint32_t, uint32_t, uint32_t);
template __global__ void wg_gemm<256, 1, 4, 1>(const __half*, const uint8_t*, float*, uint32_t, uint32_t, uint32_t);
template __global__ void wg_gemm<64, 1, 4, 3>(const __half*, const uint8_t*, float*, uint32_t, uint32_t, uint32_t);
#else
// ---- host ----
#include "harness.cuh"

typedef void (*LaunchFn)(const __half*, const uint8_t*, float*, uint32_t, uint32_t, uint32_t);
struct Form {
    const char* name;
    int bm, bn;
    LaunchFn launch;
};

template <int BN, int WG, int S, int MINB>
static void launch_wg(const __half* x, const uint8_t* w, float* y, uint32_t M, uint32_t K, uint32_t N) {
    using G = Geo<BN, WG, S>;
    const uint32_t blocks = (M + G::BM - 1) / G::BM * (N / BN);
    wg_gemm<BN, WG, S, MINB><<<blocks, G::T, G::SMEM>>>(x, w, y, M, K, N);
}
template <int BN, int WG, int S, int MINB>
static Form make_form(const char* name) {
    using G = Geo<BN, WG, S>;
    CK(cudaFuncSetAttribute(wg_gemm<BN, WG, S, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, G::SMEM));
    return Form{name, G::BM, BN, launch_wg<BN, WG, S, MINB>};
}

// A problem's host data and the float64 reference of its sampled rows.
struct Problem {
    uint32_t M, N, K;
    std::vector<uint16_t> x;    // f16 bits, [M, K]
    std::vector<uint32_t> rows; // sampled rows
    std::vector<double> want, bound;  // [rows, N]
};

static std::vector<uint8_t> make_weights(std::mt19937& rng, uint32_t N, uint32_t K) {
    std::uniform_real_distribution<float> ud(0.002f, 0.02f);
    std::vector<uint8_t> w((uint64_t)N * (K / 32) * 18);
    for (uint64_t b = 0; b < w.size() / 18; ++b) {
        const uint16_t d = f2h(ud(rng));
        memcpy(&w[b * 18], &d, 2);
        for (int i = 2; i < 18; ++i) w[b * 18 + i] = (uint8_t)(rng() & 255);
    }
    return w;
}

static Problem make_problem(std::mt19937& rng, uint32_t M, const std::vector<uint8_t>& w, uint32_t N, uint32_t K) {
    Problem p;
    p.M = M, p.N = N, p.K = K;
    std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
    p.x.resize((uint64_t)M * K);
    for (auto& v : p.x) v = f2h(ux(rng));
    // 64 rows spread over M with every residue mod 16, the first and the last; all when M <= 66.
    if (M <= 66) {
        for (uint32_t r = 0; r < M; ++r) p.rows.push_back(r);
    } else {
        p.rows.push_back(0);
        for (uint32_t i = 0; i < 64; ++i) p.rows.push_back((uint32_t)((uint64_t)i * (M - 16) / 64 + i % 16));
        p.rows.push_back(M - 1);
    }
    const size_t R = p.rows.size();
    std::vector<float> xs(R * K), wf(K);
    for (size_t i = 0; i < R; ++i)
        for (uint32_t k = 0; k < K; ++k) xs[i * K + k] = h2f(p.x[(uint64_t)p.rows[i] * K + k]);
    p.want.resize(R * N), p.bound.resize(R * N);
    const uint64_t row_bytes = (uint64_t)(K / 32) * 18;
    for (uint32_t n = 0; n < N; ++n) {
        for (uint32_t k = 0; k < K; ++k) {
            const uint8_t* blk = &w[n * row_bytes + k / 32 * 18];
            const uint32_t j = k % 32;
            const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
            wf[k] = h2f(f2h(h2f(blk[0] | (blk[1] << 8)) * (float)(q - 8)));  // d (q - 8), rounded once
        }
        for (size_t i = 0; i < R; ++i) {
            const float* xr = &xs[i * K];
            double s[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0};
            for (uint32_t k = 0; k < K; k += 4)
                for (int u = 0; u < 4; ++u) {
                    const double pr = (double)(xr[k + u] * wf[k + u]);  // exact: 11 x 11 bits
                    s[u] += pr, a[u] += std::fabs(pr);
                }
            p.want[i * N + n] = (s[0] + s[1]) + (s[2] + s[3]);
            p.bound[i * N + n] = K * std::ldexp(1.0, -23) * ((a[0] + a[1]) + (a[2] + a[3])) + 1e-6;
        }
    }
    return p;
}

// Worst |err| / bound over the sampled rows (infinite on a NaN or a store past M).
static double check(const Problem& p, const float* dy) {
    std::vector<float> o(p.N);
    double worst = 0;
    for (size_t i = 0; i < p.rows.size(); ++i) {
        CK(cudaMemcpy(o.data(), dy + (uint64_t)p.rows[i] * p.N, p.N * 4, cudaMemcpyDeviceToHost));
        for (uint32_t n = 0; n < p.N; ++n) {
            const double e = std::fabs((double)o[n] - p.want[i * p.N + n]) / p.bound[i * p.N + n];
            worst = std::isnan(e) ? INFINITY : std::fmax(worst, e);
            if (std::isinf(worst)) return worst;
        }
    }
    std::vector<uint32_t> guard(p.N);
    CK(cudaMemcpy(guard.data(), dy + (uint64_t)p.M * p.N, p.N * 4, cudaMemcpyDeviceToHost));
    for (uint32_t v : guard)
        if (v != 0xffffffffu) return INFINITY;
    return worst;
}

int main(int argc, char** argv) {
    const bool warm = argc > 1 && std::string(argv[1]) == "warm";
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, sm_%d%d, %d SMs, L2 %d MB\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
           prop.l2CacheSize >> 20);
    if (prop.major != 9 || prop.minor != 0) {
        printf("wgmma needs sm_90 (Hopper)\n");
        return 1;
    }
    const Form forms[] = {make_form<128, 2, 3, 2>("wg 128x128 s3"), make_form<128, 2, 4, 1>("wg 128x128 s4"),
                          make_form<256, 2, 3, 1>("wg 128x256 s3"), make_form<256, 2, 4, 1>("wg 128x256 s4"),
                          make_form<128, 1, 4, 2>("wg 64x128 s4"),  make_form<256, 1, 4, 1>("wg 64x256 s4"),
                          make_form<64, 1, 4, 3>("wg 64x64 s4")};
    const int n_forms = sizeof(forms) / sizeof(forms[0]);
    struct Shape {
        uint32_t M, N, K;
        const char* name;
    };
    const Shape shapes[] = {{512, 4096, 4096, "q/o 4096x4096"},
                            {512, 1024, 4096, "k/v 1024x4096"},
                            {512, 14336, 4096, "gate/up 14336x4096"},
                            {512, 4096, 14336, "down 4096x14336"},
                            {4096, 4096, 4096, "q/o M=4096"}};
    const int n_shapes = sizeof(shapes) / sizeof(shapes[0]);
    std::vector<double> table((size_t)n_shapes * n_forms, -1.0);
    std::vector<int> table_ok((size_t)n_shapes * n_forms, 0);
    std::mt19937 rng(7);
    bool all_ok = true;
    printf("weights %s; us a product, TFLOP/s (2 M N K), worst |err| / bound\n",
           warm ? "warm in L2 (one copy)" : "rotated among copies larger than 3x L2");

    // Correctness at odd M on the k/v shape (one launch a form, no timing).
    {
        const uint32_t N = 1024, K = 4096;
        const std::vector<uint8_t> w = make_weights(rng, N, K);
        uint8_t* dw;
        CK(cudaMalloc(&dw, w.size()));
        CK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice));
        for (uint32_t M : {1u, 17u, 100u, 513u}) {
            const Problem p = make_problem(rng, M, w, N, K);
            __half* dx;
            float* dy;
            CK(cudaMalloc(&dx, p.x.size() * 2));
            CK(cudaMalloc(&dy, (uint64_t)(M + 1) * N * 4));
            CK(cudaMemcpy(dx, p.x.data(), p.x.size() * 2, cudaMemcpyHostToDevice));
            printf("check M=%-4u k/v 1024x4096:", M);
            for (int f = 0; f < n_forms; ++f) {
                printf(" | %s", forms[f].name);
                fflush(stdout);  // a fault or a hang then names its form
                CK(cudaMemset(dy, 0xff, (uint64_t)(M + 1) * N * 4));
                forms[f].launch(dx, dw, dy, M, K, N);
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                const double e = check(p, dy);
                all_ok &= e <= 1.0;
                printf(" %.3f %s", e, e <= 1.0 ? "PASS" : "FAIL");
            }
            printf("\n");
            CK(cudaFree(dx));
            CK(cudaFree(dy));
        }
        CK(cudaFree(dw));
    }

    for (int si = 0; si < n_shapes; ++si) {
        const Shape& sh = shapes[si];
        const std::vector<uint8_t> w = make_weights(rng, sh.N, sh.K);
        const Problem p = make_problem(rng, sh.M, w, sh.N, sh.K);
        const uint64_t wb = w.size();
        const uint64_t copies = warm ? 1 : (3ull * prop.l2CacheSize + wb - 1) / wb + 1;
        __half* dx;
        float* dy;
        uint8_t* dws;
        CK(cudaMalloc(&dx, p.x.size() * 2));
        CK(cudaMalloc(&dy, (uint64_t)(sh.M + 1) * sh.N * 4));
        CK(cudaMalloc(&dws, wb * copies));
        CK(cudaMemcpy(dx, p.x.data(), p.x.size() * 2, cudaMemcpyHostToDevice));
        for (uint64_t c = 0; c < copies; ++c) CK(cudaMemcpy(dws + c * wb, w.data(), wb, cudaMemcpyHostToDevice));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        const int reps = 20;
        const double flop = 2.0 * sh.M * sh.N * sh.K;
        uint64_t launches = 0;
        printf("%s, M=%u (%llu weight copies of %.1f MB)\n", sh.name, sh.M, (unsigned long long)copies, wb / 1e6);
        for (int f = 0; f < n_forms; ++f) {
            if (sh.N % forms[f].bn != 0 || sh.K % 64 != 0) {
                printf("  %-14s n/a\n", forms[f].name);
                continue;
            }
            printf("  %-14s", forms[f].name);
            fflush(stdout);
            CK(cudaMemset(dy, 0xff, (uint64_t)(sh.M + 1) * sh.N * 4));
            float ms = 0;
            for (int pass = 0; pass < 2; ++pass) {  // the first pass warms up
                CK(cudaEventRecord(e0));
                for (int i = 0; i < reps; ++i)
                    forms[f].launch(dx, dws + (launches++ % copies) * wb, dy, sh.M, sh.K, sh.N);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
            }
            CK(cudaGetLastError());
            const double e = check(p, dy);
            const double us = ms * 1e3 / reps, tf = flop / us * 1e-6;
            all_ok &= e <= 1.0;
            table[(size_t)si * n_forms + f] = tf;
            table_ok[(size_t)si * n_forms + f] = e <= 1.0;
            printf(" %9.1f us %7.1f TFLOP/s  err %.3f  %s  (%u blocks of %d x %d)\n", us, tf, e,
                   e <= 1.0 ? "PASS" : "FAIL", (sh.M + forms[f].bm - 1) / forms[f].bm * (sh.N / forms[f].bn),
                   forms[f].bm, forms[f].bn);
        }
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        CK(cudaFree(dx));
        CK(cudaFree(dy));
        CK(cudaFree(dws));
    }

    printf("\nTFLOP/s (! = failed its check)%s\n%-20s", all_ok ? "" : "  -- SOME CHECKS FAILED", "shape");
    for (int f = 0; f < n_forms; ++f) printf(" %14s", forms[f].name);
    printf("\n");
    for (int si = 0; si < n_shapes; ++si) {
        char label[64];
        snprintf(label, sizeof label, "%s M=%u", shapes[si].name, shapes[si].M);
        printf("%-20.20s", label);
        for (int f = 0; f < n_forms; ++f) {
            const double v = table[(size_t)si * n_forms + f];
            if (v < 0) printf(" %13s ", "n/a");
            else printf(" %13.1f%c", v, table_ok[(size_t)si * n_forms + f] ? ' ' : '!');
        }
        printf("\n");
    }
    return all_ok ? 0 : 2;
}
#endif
