// What the standalone CUDA harnesses of this folder share: the error check, a warp's sum, f16
// bits, random Q4_0 weights, the copies that keep a launch reading DRAM, and a graph's time.
// Each harness still builds alone (`nvcc -O3 -arch=sm_90 -o X benches/cuda/X.cu`): nvcc finds
// this header beside the file that includes it.
#pragma once
#include <cuda_fp16.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e = (x);                                                                \
        if (e != cudaSuccess) {                                                             \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static inline uint16_t f2h(float f) {
    const __half h = __float2half(f);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static inline float h2f(uint16_t u) {
    __half h;
    memcpy(&h, &u, 2);
    return __half2float(h);
}

// `bytes` bytes of Q4_0 blocks (18 bytes: an f16 scale uniform in [0.01, 0.05], 16 bytes of
// random quants), drawn from `rng` block by block (the scale, then the sixteen bytes).
static inline std::vector<uint8_t> random_q4_0(std::mt19937_64& rng, uint64_t bytes) {
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::uniform_int_distribution<int> nib(0, 255);
    std::vector<uint8_t> w(bytes);
    for (uint64_t b = 0; b < bytes / 18; ++b) {
        const uint16_t d = f2h(0.01f + 0.02f * (uni(rng) + 1.0f));
        memcpy(&w[b * 18], &d, 2);
        for (int j = 0; j < 16; ++j) w[b * 18 + 2 + j] = (uint8_t)nib(rng);
    }
    return w;
}

// Copies of a weight set of `bytes` bytes that together pass 400 MiB (more than L2): launches
// that rotate among them read DRAM, as a decode step meets its weights.
static inline int copies_past_l2(uint64_t bytes) {
    return (int)std::max<uint64_t>(1, (400ull << 20) / bytes + 1);
}

// Microseconds a launch of graph `gr` takes on `st` (three launches to warm up, then `reps`
// timed); the graph and its executable are destroyed.
static inline double graph_us(cudaGraph_t gr, cudaStream_t st, int reps) {
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, gr, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(gr));
    return ms * 1e3 / reps;
}

// A device array of `copies` copies of h back to back (launches that rotate among them read
// DRAM: copies_past_l2).
template <typename T>
static inline T* upload(const std::vector<T>& h, int copies = 1) {
    T* d;
    const size_t bytes = h.size() * sizeof(T);
    CK(cudaMalloc(&d, bytes * copies));
    for (int c = 0; c < copies; ++c) CK(cudaMemcpy((uint8_t*)d + bytes * c, h.data(), bytes, cudaMemcpyHostToDevice));
    return d;
}

// Runs `go()` once (one launch into dout, whose n floats are first poisoned with 0xff bytes),
// waits for it and returns the n floats it wrote.
template <typename F>
static inline std::vector<float> poisoned_run(F go, float* dout, uint32_t n) {
    CK(cudaMemset(dout, 0xff, (uint64_t)n * 4));
    go();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> got(n);
    CK(cudaMemcpy(got.data(), dout, (uint64_t)n * 4, cudaMemcpyDeviceToHost));
    return got;
}

// The head of a part-1 table: `title`, the shape's columns, a column `width` wide for each of
// the `nv` forms, and the last column's name.
static inline void table_head(const char* title, const char* const* names, int nv, int width, const char* last) {
    printf("%s\n%-11s %6s %6s", title, "shape", "n", "k");
    for (int v = 0; v < nv; ++v) printf(" %*s", width, names[v]);
    printf(" %*s\n", width - 2, last);
}

// GB/s of `bytes` read by a launch of `one(i)`, called back to back on the default stream (three
// to warm up, then `reps` timed); i counts the calls, for rotating among copies.
template <typename F>
static inline double launches_gbs(uint64_t bytes, F one, int reps) {
    for (int i = 0; i < 3; ++i) one(i);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) one(i);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return (double)bytes * reps / (ms * 1e-3) / 1e9;
}

// Float64 sums of 64 rows spread over the n rows (row i * n / 64) of Q4_0 weights w against x,
// and each one's bound for an int8 activation row: every activation moves by at most its
// 32-value block's max|x| / 254, so |error| <= sum |w| max|x| / 254.
struct Q4Refs {
    std::vector<double> ref, bound;
};
static inline Q4Refs q4_0_refs(const std::vector<uint8_t>& w, const std::vector<float>& x, uint32_t k,
                               uint32_t n) {
    const uint64_t row_bytes = (uint64_t)k / 32 * 18;
    Q4Refs r{std::vector<double>(64), std::vector<double>(64)};
    for (int i = 0; i < 64; ++i) {
        const uint64_t o = (uint64_t)i * n / 64;
        double s = 0, bnd = 0;
        for (uint32_t b = 0; b < k / 32; ++b) {
            const uint8_t* p = &w[o * row_bytes + b * 18];
            uint16_t du;
            memcpy(&du, p, 2);
            const double d = h2f(du);
            double mx = 0;
            for (int j = 0; j < 32; ++j) mx = std::max(mx, (double)fabsf(x[b * 32 + j]));
            for (int j = 0; j < 16; ++j) {
                const double lo = d * ((p[2 + j] & 15) - 8), hi = d * ((p[2 + j] >> 4) - 8);
                s += lo * x[b * 32 + j] + hi * x[b * 32 + 16 + j];
                bnd += (fabs(lo) + fabs(hi)) * mx / 254;
            }
        }
        r.ref[i] = s;
        r.bound[i] = bnd;
    }
    return r;
}

// One product's check: random Q4_0 weights of n rows of k, an activation row with one value in
// ten four times larger (both drawn from rng, then uploaded), an output of n floats on the
// device, and the float64 references of 64 rows (q4_0_refs).
struct Q4Case {
    std::vector<uint8_t> hw;
    std::vector<float> hx;
    uint8_t* dw;
    float* dx;
    float* dout;
    Q4Refs refs;
};
static inline Q4Case q4_case(std::mt19937_64& rng, uint32_t k, uint32_t n) {
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    Q4Case c;
    c.hw = random_q4_0(rng, (uint64_t)k / 32 * 18 * n);
    c.hx.resize(k);
    for (auto& v : c.hx) v = uni(rng) * (1.0f + 3.0f * (uni(rng) > 0.9f));
    c.dw = upload(c.hw);
    c.dx = upload(c.hx);
    CK(cudaMalloc(&c.dout, (uint64_t)n * 4));
    c.refs = q4_0_refs(c.hw, c.hx, k, n);
    return c;
}
static inline void free_case(Q4Case& c) {
    CK(cudaFree(c.dw));
    CK(cudaFree(c.dx));
    CK(cudaFree(c.dout));
}
// The worst |error| of the 64 reference rows of n outputs over their bounds; infinite where one
// passes its bound.
static inline double worst_over_bound(const std::vector<float>& got, const Q4Refs& r, uint32_t n) {
    double worst = 0;
    for (int i = 0; i < 64; ++i) {
        const double e = fabs(got[(uint64_t)i * n / 64] - r.ref[i]);
        worst = std::max(worst, e / r.bound[i]);
        if (!(e <= r.bound[i] * 1.001 + 1e-4)) worst = INFINITY;
    }
    return worst;
}

// The sums of R rows of Q4_0 words at wr (row_words apart) against the int8 row (q, ds), a lane
// the pairs p = lane + 32 j, the pair loop unrolled U times: the in-tree form's order.
template <int R, int U>
__device__ __forceinline__ void rows_pair_sums(const uint32_t* wr, uint32_t row_words, uint32_t pairs, int lane,
                                               const int* q, const float2* ds, float (&acc)[R]);

// One 32-value block b of the int8 row from the four values v of thread p (0..7) of its eight
// (every one of the eight lanes calls it; b < nb stores): q's words of quarters 0..3 as (values
// 4t..4t+3, values 16+4t..16+4t+3), so a lane reads its quarter with one 8-byte load, and ds[b]
// (d, d * sum q).
__device__ __forceinline__ void quantize_group(float4 v, uint32_t b, uint32_t nb, uint32_t p, int* q,
                                               float2* ds) {
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
    const float id = m > 0.f ? 127.f / m : 0.f;
    const int a0 = __float2int_rn(v.x * id), a1 = __float2int_rn(v.y * id);
    const int a2 = __float2int_rn(v.z * id), a3 = __float2int_rn(v.w * id);
    int s = a0 + a1 + a2 + a3;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    if (b < nb) {
        q[b * 8 + (p < 4 ? 2 * p : 2 * (p - 4) + 1)] =
            (a0 & 255) | ((a1 & 255) << 8) | ((a2 & 255) << 16) | ((uint32_t)a3 << 24);
        if (p == 0) ds[b] = make_float2(m / 127.f, m / 127.f * (float)s);
    }
}

// Quantize x[0..k) into q and ds (quantize_group): eight threads a 32-value block, four values
// each; T threads, this one `tid`. B rounds of groups are loaded before any is quantized (B = 1:
// a round trip to memory a round; the in-tree prologue takes the whole row in one batch); a
// round past the row is skipped by the whole warp (stop 64 ran B = 8 quantizing every round of
// the batch, up to eight times the row's groups); with L2 the loads skip L1 (a row other SMs
// wrote in the same launch).
template <int B = 1, bool L2 = false>
__device__ __forceinline__ void quantize_row(const float* x, uint32_t k, int* q, float2* ds,
                                             uint32_t tid, uint32_t T) {
    const uint32_t nb = k / 32, p = tid & 7, step = T / 8, sub = (tid & 31) >> 3;
    for (uint32_t base = (tid >> 5) * 4; base < nb; base += B * step) {
        float4 v[B];
#pragma unroll
        for (int j = 0; j < B; ++j) {
            const uint32_t b = base + j * step + sub;
            const float4* src = (const float4*)(x + (uint64_t)b * 32 + 4 * p);
            v[j] = b >= nb ? make_float4(0.f, 0.f, 0.f, 0.f) : L2 ? __ldcg(src) : *src;
        }
#pragma unroll
        for (int j = 0; j < B; ++j)
            if (base + j * step < nb) quantize_group(v[j], base + j * step + sub, nb, p, q, ds);  // warp-uniform
    }
}

// The device's name, multiprocessor count and L2 size, printed; its multiprocessor count returned.
static inline int print_device() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    return prop.multiProcessorCount;
}

// The activation row x[0..k) quantized into the start of the block's dynamic shared memory by
// every thread (quantize_row), then a barrier: its int8 words, then its scales.
struct SmemRow {
    const int* q;
    const float2* ds;
};
template <int B = 1>
__device__ __forceinline__ SmemRow smem_quantized_row(const float* x, uint32_t k) {
    extern __shared__ float4 row_smem[];  // not `smem`: the gemm harnesses declare their own
    int* q = (int*)row_smem;
    float2* ds = (float2*)(q + k / 4);
    quantize_row<B>(x, k, q, ds, threadIdx.x, blockDim.x);
    __syncthreads();
    return {q, ds};
}

// Q4_0 against the int8 row a lane per pair of blocks (`mm_q8_rows_pairs_q4_0` in
// src/backend/cuda/kernels/matmul_blocks.cuh): pair p (blocks 2p, 2p + 1) of a row, whose 36 bytes
// start 4-byte aligned where k is a multiple of 64, from its nine words (the first block's quant
// words realigned with funnel shifts), sixteen `dp4a` against the row quantized by quantize_row.
__device__ __forceinline__ float pair_dot_w(const uint32_t (&w)[9], const int* q, const float2* ds, uint32_t p) {
    const uint32_t M = 0x0f0f0f0fu;
    const int4* xq = (const int4*)(q + p * 16);
    const int4 a0 = xq[0], a1 = xq[1], b0 = xq[2], b1 = xq[3];
    const float4 dd = *(const float4*)(ds + 2 * p);
    const uint32_t u0 = __funnelshift_r(w[0], w[1], 16), u1 = __funnelshift_r(w[1], w[2], 16);
    const uint32_t u2 = __funnelshift_r(w[2], w[3], 16), u3 = __funnelshift_r(w[3], w[4], 16);
    int s0 = __dp4a((int)(u0 & M), a0.x, __dp4a((int)((u0 >> 4) & M), a0.y, 0));
    s0 = __dp4a((int)(u1 & M), a0.z, __dp4a((int)((u1 >> 4) & M), a0.w, s0));
    s0 = __dp4a((int)(u2 & M), a1.x, __dp4a((int)((u2 >> 4) & M), a1.y, s0));
    s0 = __dp4a((int)(u3 & M), a1.z, __dp4a((int)((u3 >> 4) & M), a1.w, s0));
    int s1 = __dp4a((int)(w[5] & M), b0.x, __dp4a((int)((w[5] >> 4) & M), b0.y, 0));
    s1 = __dp4a((int)(w[6] & M), b0.z, __dp4a((int)((w[6] >> 4) & M), b0.w, s1));
    s1 = __dp4a((int)(w[7] & M), b1.x, __dp4a((int)((w[7] >> 4) & M), b1.y, s1));
    s1 = __dp4a((int)(w[8] & M), b1.z, __dp4a((int)((w[8] >> 4) & M), b1.w, s1));
    const float d0 = __half2float(__ushort_as_half((unsigned short)(w[0] & 0xffffu)));
    const float d1 = __half2float(__ushort_as_half((unsigned short)(w[4] >> 16)));
    return d0 * (dd.x * (float)s0 - 8.f * dd.y) + d1 * (dd.z * (float)s1 - 8.f * dd.w);
}
// The same with the words at wp (global or shared memory).
__device__ __forceinline__ float pair_dot(const uint32_t* wp, const int* q, const float2* ds, uint32_t p) {
    uint32_t w[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) w[i] = wp[i];
    return pair_dot_w(w, q, ds, p);
}

template <int R, int U>
__device__ __forceinline__ void rows_pair_sums(const uint32_t* wr, uint32_t row_words, uint32_t pairs, int lane,
                                               const int* q, const float2* ds, float (&acc)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll U
    for (uint32_t p = lane; p < pairs; p += 32)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += pair_dot(wr + r * row_words + p * 9, q, ds, p);
}

// A whole 8B decode step's products for the part-2 tables: 32 layers of qkv, o, gate+up and down
// (two rows a warp each), every layer's weights distinct (random bytes: timing only), an input
// row of zeros and an output, and a stream to capture them on.
struct StepProducts {
    struct Product {
        uint32_t n, k;
    };
    static constexpr int L = 32;
    static constexpr Product layer[4] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    uint8_t* w;
    float *x, *y;
    uint64_t per_layer;
    cudaStream_t st;
};
static inline StepProducts step_products(std::mt19937_64& rng) {
    StepProducts sp{};
    for (const auto& p : StepProducts::layer) sp.per_layer += (uint64_t)p.k / 32 * 18 * p.n;
    CK(cudaMalloc(&sp.w, sp.per_layer * StepProducts::L));
    const std::vector<uint8_t> h = random_q4_0(rng, sp.per_layer);
    for (int l = 0; l < StepProducts::L; ++l)
        CK(cudaMemcpy(sp.w + sp.per_layer * l, h.data(), sp.per_layer, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&sp.x, 14336 * 4));
    CK(cudaMalloc(&sp.y, 28672 * 4));
    CK(cudaMemset(sp.x, 0, 14336 * 4));
    CK(cudaStreamCreateWithFlags(&sp.st, cudaStreamNonBlocking));
    return sp;
}
// Microseconds of the step's products captured as one graph, each launched in order by
// `launch(x, w, y, k, n, stream)` (graph_us, `reps` timed launches).
template <typename F>
static inline double step_graph_us(const StepProducts& sp, F launch, int reps) {
    cudaGraph_t gr;
    CK(cudaStreamBeginCapture(sp.st, cudaStreamCaptureModeGlobal));
    uint64_t off = 0;
    for (int l = 0; l < StepProducts::L; ++l)
        for (const auto& p : StepProducts::layer) {
            launch(sp.x, sp.w + off, sp.y, p.k, p.n, sp.st);
            off += (uint64_t)p.k / 32 * 18 * p.n;
        }
    CK(cudaStreamEndCapture(sp.st, &gr));
    return graph_us(gr, sp.st, reps);
}
static inline void free_step_products(StepProducts& sp) {
    CK(cudaFree(sp.w));
    CK(cudaFree(sp.x));
    CK(cudaFree(sp.y));
    CK(cudaStreamDestroy(sp.st));
}
