// A standalone harness for the one-row Q4_0 product on int8 activations (`dp4a`):
//   nvcc -O3 -arch=sm_90 -o matvec_dp4a benches/cuda/matvec_dp4a.cu && ./matvec_dp4a
// Forms:
//   v0: the warp-per-output f32 kernel of src/backend/cuda/kernels/matmul_blocks.cuh.
//   dq<R, C>: blocks of 8 warps that first quantize the activation row into shared memory (32-value
//       blocks: int8 values q = round(x / d), d = max|x| / 127, and d * sum q), then each warp
//       takes R rows at a time, four lanes a 32-value block (lane t: quant bytes 4t..4t+3, i.e.
//       values 4t.. and 16 + 4t..), two `dp4a` a lane a block. The grid is capped at C blocks a
//       launch (their warps stride over the rows), since every block quantizes the row.
//   dqg<R>: a separate quantizing kernel writes the int8 row to global memory; the product reads
//       it through L1 (a graph node more, no prologue).
//   dqb<R> / dqx<R>: dq with every prologue load of a thread issued first (up to 16 float4); dqx
//       also has each warp ask L2 for its first R rows before the prologue. dqx2c264 is the form
//       src/backend/cuda/kernels/matmul.cu took (`mm_vector_q8`).
// Measured on an H100 (part 2, 8B step): v0 3,176 us, dq2c528 2,574, dqg1 2,100, dqb2c528 2,418,
// dqx2c264 2,322, read floor 1,466 (docs/kernels.md item 12).
//   rpg<R> / rpx<R>: the weights repacked per tensor (all scales, then all 16-byte quant blocks), a
//       lane a whole block of R rows with one 16-byte load; rpg with the separate quantizing
//       kernel, rpx with the batched prologue (the grid capped as named).
//   dpx<U> / dpg: no repacking, a lane a pair of blocks (their 36 bytes are 4-byte aligned where
//       k is a multiple of 64): nine 4-byte loads for 64 values, the first block's quant words
//       realigned with funnel shifts; dpx with the batched prologue (U: the pair loop's unrolling),
//       dpg with the separate quantizing kernel. The in-tree `mm_q8_rows_pairs_q4_0` is dpx's form
//       with two rows a warp.
// Measured on an H100 (stop 36, part 2): dqx2c264 2,322 us, rpx1c264 2,012, rpg1 1,897, dpx2c264
// 2,060, dpx4c264 2,225, dpg 1,824.
//   read floor: the weight bytes read once with 16-byte loads, nothing computed.
// The int8 forms are checked against float64 with a tolerance from the rounding: each activation
// moves by at most d / 2, so |error| <= sum over blocks of |w| . d / 2 (reported as a fraction of it).
// Part 1 times back-to-back launches of one shape; part 2 a whole 8B-shaped decode step's
// products (32 layers of qkv 6144, o 4096, gate+up 28672, down 4096x14336) captured as one CUDA
// graph, each layer's weights distinct (3.9 GB, more than L2).
#include <cuda_fp16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>
#include "harness.cuh"

__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {
    const uint16_t* h = (const uint16_t*)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}
__device__ __forceinline__ float half_at(const uint8_t* p) {
    return __half2float(__ushort_as_half(*(const uint16_t*)p));
}
__device__ __forceinline__ float nibble_dot(uint32_t q, float4 lo, float4 hi) {
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
__device__ __forceinline__ float quarter(const uint8_t* p, const float* xb, uint32_t t) {
    const float d = half_at(p);
    const uint32_t q = u32_at(p + 2 + 4 * t);
    const float4 lo = *(const float4*)(xb + 4 * t), hi = *(const float4*)(xb + 16 + 4 * t);
    const float sx = (lo.x + lo.y) + (lo.z + lo.w) + (hi.x + hi.y) + (hi.z + hi.w);
    return d * (nibble_dot(q, lo, hi) - 8.0f * sx);
}

__global__ void v0(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const uint64_t row_bytes = (uint64_t)k / 32 * 18;
    const int lane = threadIdx.x & 31;
    const uint64_t warps = (uint64_t)gridDim.x * (blockDim.x / 32);
    for (uint64_t o = (uint64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; o < n; o += warps) {
        const uint8_t* wr = w + o * row_bytes;
        const uint32_t blocks = k / 32, t = lane & 3;
        float acc = 0.0f;
#pragma unroll 4
        for (uint32_t b = lane >> 2; b < blocks; b += 8) acc += quarter(wr + (uint64_t)b * 18, x + (uint64_t)b * 32, t);
        acc = warp_sum(acc);
        if (lane == 0) out[o] = acc;
    }
}

template <int R>
__device__ __forceinline__ void dq_rows(const int* q, const float2* ds, const uint8_t* w, float* out,
                                        uint32_t k, uint64_t o0, uint32_t n, int lane) {
    const uint64_t row_bytes = (uint64_t)k / 32 * 18;
    const uint32_t nb = k / 32, t = lane & 3;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll 4
    for (uint32_t b = lane >> 2; b < nb; b += 8) {
        const int2 xv = *(const int2*)(q + b * 8 + 2 * t);
        const float2 dx = ds[b];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t* p = w + (o0 + r) * row_bytes + (uint64_t)b * 18;
            const uint32_t qw = u32_at(p + 2 + 4 * t);
            const int s = __dp4a((int)(qw & 0x0f0f0f0fu), xv.x, __dp4a((int)((qw >> 4) & 0x0f0f0f0fu), xv.y, 0));
            acc[r] += half_at(p) * (dx.x * (float)s - 2.f * dx.y);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = warp_sum(acc[r]);
        if (lane == 0 && o0 + r < n) out[o0 + r] = acc[r];
    }
}

template <int R>
__global__ void __launch_bounds__(256) dq(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const SmemRow xr = smem_quantized_row(x, k);
    const int* q = xr.q;
    const float2* ds = xr.ds;
    const int lane = threadIdx.x & 31;
    const uint64_t step = (uint64_t)gridDim.x * 8 * R;
    for (uint64_t o0 = ((uint64_t)blockIdx.x * 8 + threadIdx.x / 32) * R; o0 + R <= n; o0 += step)
        dq_rows<R>(q, ds, w, out, k, o0, n, lane);
}

// quantize_row with every load of a thread issued first (up to 16 float4 a thread: k <= 16384 at
// 256 threads), so the prologue waits for one round trip instead of one per 1024 values.
#define QMAX 16
__device__ __forceinline__ void quantize_row_batched(const float* x, uint32_t k, int* q, float2* ds,
                                                     uint32_t tid, uint32_t T) {
    const uint32_t nb = k / 32, p = tid & 7, first = (tid >> 5) * 4 + ((tid & 31) >> 3);
    float4 v[QMAX];
#pragma unroll
    for (int i = 0; i < QMAX; ++i) {
        const uint32_t b = first + i * (T / 8);
        v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (b < nb) v[i] = *(const float4*)(x + (uint64_t)b * 32 + 4 * p);
    }
#pragma unroll
    for (int i = 0; i < QMAX; ++i) {
        if ((tid >> 5) * 4 + i * (T / 8) >= nb) break;
        quantize_group(v[i], first + i * (T / 8), nb, p, q, ds);
    }
}

// dq with the batched prologue; PF: the warp first asks L2 for its first R rows (one 128-byte
// line a lane), so their bytes are on the way while the block quantizes.
template <int R, bool PF>
__global__ void __launch_bounds__(256) dqx(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    extern __shared__ float4 smem[];
    int* q = (int*)smem;
    float2* ds = (float2*)(q + k / 4);
    const int lane = threadIdx.x & 31;
    const uint64_t first = ((uint64_t)blockIdx.x * 8 + threadIdx.x / 32) * R;
    if (PF && first + R <= n) {
        const uint64_t row_bytes = (uint64_t)k / 32 * 18;
#pragma unroll
        for (int r = 0; r < R; ++r)
            for (uint64_t off = (uint64_t)lane * 128; off < row_bytes; off += 32 * 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(w + (first + r) * row_bytes + off));
    }
    quantize_row_batched(x, k, q, ds, threadIdx.x, blockDim.x);
    __syncthreads();
    const uint64_t step = (uint64_t)gridDim.x * 8 * R;
    for (uint64_t o0 = first; o0 + R <= n; o0 += step) dq_rows<R>(q, ds, w, out, k, o0, n, lane);
}

__global__ void quantize_global(const float* x, uint32_t k, int* q, float2* ds) {
    quantize_row(x, k, q, ds, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

template <int R>
__global__ void __launch_bounds__(256) dqg(const int* q, const float2* ds, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const int lane = threadIdx.x & 31;
    const uint64_t o0 = ((uint64_t)blockIdx.x * 8 + threadIdx.x / 32) * R;
    if (o0 + R <= n) dq_rows<R>(q, ds, w, out, k, o0, n, lane);
}

// Repacked Q4_0 (struct of arrays): the tensor's n * nb f16 scales first, then its n * nb 16-byte
// quant blocks, so a lane reads a whole block's quants with one 16-byte load. Lane b takes block b
// of R rows; the activation block's eight int8 words are two 16-byte loads.
template <int R>
__device__ __forceinline__ void rp_rows(const int* q, const float2* ds, const uint8_t* w, float* out,
                                        uint32_t k, uint64_t o0, uint32_t n, int lane) {
    const uint32_t nb = k / 32;
    const __half* sc = (const __half*)w;
    const uint4* qs = (const uint4*)(w + (uint64_t)n * nb * 2);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll 4
    for (uint32_t b = lane; b < nb; b += 32) {
        const int4 xa = *(const int4*)(q + b * 8), xb = *(const int4*)(q + b * 8 + 4);
        const float2 dx = ds[b];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint4 qw = qs[(o0 + r) * nb + b];
            const float d = __half2float(sc[(o0 + r) * nb + b]);
            const uint32_t M = 0x0f0f0f0fu;
            int s = __dp4a((int)(qw.x & M), xa.x, __dp4a((int)((qw.x >> 4) & M), xa.y, 0));
            s = __dp4a((int)(qw.y & M), xa.z, __dp4a((int)((qw.y >> 4) & M), xa.w, s));
            s = __dp4a((int)(qw.z & M), xb.x, __dp4a((int)((qw.z >> 4) & M), xb.y, s));
            s = __dp4a((int)(qw.w & M), xb.z, __dp4a((int)((qw.w >> 4) & M), xb.w, s));
            acc[r] += d * (dx.x * (float)s - 8.f * dx.y);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = warp_sum(acc[r]);
        if (lane == 0 && o0 + r < n) out[o0 + r] = acc[r];
    }
}

template <int R>
__global__ void __launch_bounds__(256) rpg(const int* q, const float2* ds, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const int lane = threadIdx.x & 31;
    const uint64_t o0 = ((uint64_t)blockIdx.x * 8 + threadIdx.x / 32) * R;
    if (o0 + R <= n) rp_rows<R>(q, ds, w, out, k, o0, n, lane);
}

template <int R>
__global__ void __launch_bounds__(256) rpx(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    extern __shared__ float4 smem[];
    int* q = (int*)smem;
    float2* ds = (float2*)(q + k / 4);
    quantize_row_batched(x, k, q, ds, threadIdx.x, blockDim.x);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const uint64_t step = (uint64_t)gridDim.x * 8 * R;
    for (uint64_t o0 = ((uint64_t)blockIdx.x * 8 + threadIdx.x / 32) * R; o0 + R <= n; o0 += step)
        rp_rows<R>(q, ds, w, out, k, o0, n, lane);
}

template <int U>
__global__ void __launch_bounds__(256) dpx(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    extern __shared__ float4 smem[];
    int* q = (int*)smem;
    float2* ds = (float2*)(q + k / 4);
    quantize_row_batched(x, k, q, ds, threadIdx.x, blockDim.x);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const uint32_t pairs = k / 64, row_words = k / 64 * 9;
    const uint64_t step = (uint64_t)gridDim.x * 8;
    for (uint64_t o = (uint64_t)blockIdx.x * 8 + threadIdx.x / 32; o < n; o += step) {
        const uint32_t* wr = (const uint32_t*)w + o * row_words;
        float acc = 0.f;
#pragma unroll U
        for (uint32_t p = lane; p < pairs; p += 32) acc += pair_dot(wr + p * 9, q, ds, p);
        acc = warp_sum(acc);
        if (lane == 0) out[o] = acc;
    }
}

// The same with the int8 row in global memory (a separate quantizing kernel, as dqg).
__global__ void __launch_bounds__(256) dpg(const int* q, const float2* ds, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const int lane = threadIdx.x & 31;
    const uint32_t pairs = k / 64, row_words = k / 64 * 9;
    const uint64_t o = (uint64_t)blockIdx.x * 8 + threadIdx.x / 32;
    if (o >= n) return;
    const uint32_t* wr = (const uint32_t*)w + o * row_words;
    float acc = 0.f;
#pragma unroll 4
    for (uint32_t p = lane; p < pairs; p += 32) acc += pair_dot(wr + p * 9, q, ds, p);
    acc = warp_sum(acc);
    if (lane == 0) out[o] = acc;
}

__global__ void read_all(const uint4* w, uint64_t words, float* out, uint32_t n) {
    uint32_t acc = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (uint64_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(w + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[threadIdx.x % n] = 1.0f;
}

__global__ void fill(uint8_t* w, uint64_t bytes, uint64_t seed) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes / 18; i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + seed) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        uint8_t* p = w + i * 18;
        const __half s = __float2half(0.01f + (float)(h & 1023) * 1e-5f);
        *(__half*)p = s;
        for (int j = 0; j < 16; ++j) p[2 + j] = (uint8_t)(h >> (8 + (j % 7) * 8));
    }
}

struct Shape { uint32_t n, k; const char* name; };

struct Bufs { int* q; float2* ds; };
const int NV = 20;
const char* NAMES[NV] = {"v0", "dq1c1056", "dq2c528", "dqg1", "dqb1c1056", "dqb2c528", "dqx1c1056", "dqx2c528", "dqx1c528", "dqx2c264", "read floor",
                         "rpg1", "rpg2", "rpx1c1056", "rpx2c528", "rpx1c264",
                         "dpx4c264", "dpx4c528", "dpx2c264", "dpg"};
static bool int8_form(int v) { return (v >= 1 && v <= 9) || v >= 11; }
static bool repacked(int v) { return v >= 11 && v <= 15; }

static void launch(int v, const float* x, const uint8_t* wc, float* o, uint32_t k, uint32_t n, Bufs g,
                   cudaStream_t st = 0) {
    const uint32_t smem = k + k / 32 * 8;
    auto grid = [&](uint32_t r, uint32_t cap) { return std::min<uint32_t>((n / r + 7) / 8, cap); };
    switch (v) {
    case 0: v0<<<(n + 3) / 4, 128, 0, st>>>(x, wc, o, k, n); break;
    case 1: dq<1><<<grid(1, 1056), 256, smem, st>>>(x, wc, o, k, n); break;
    case 2: dq<2><<<grid(2, 528), 256, smem, st>>>(x, wc, o, k, n); break;
    case 3: {
        const uint32_t th = k / 32 * 8;
        quantize_global<<<(th + 255) / 256, 256, 0, st>>>(x, k, g.q, g.ds);
        dqg<1><<<(n + 7) / 8, 256, 0, st>>>(g.q, g.ds, wc, o, k, n);
        break;
    }
    case 4: dqx<1, false><<<grid(1, 1056), 256, smem, st>>>(x, wc, o, k, n); break;
    case 5: dqx<2, false><<<grid(2, 528), 256, smem, st>>>(x, wc, o, k, n); break;
    case 6: dqx<1, true><<<grid(1, 1056), 256, smem, st>>>(x, wc, o, k, n); break;
    case 7: dqx<2, true><<<grid(2, 528), 256, smem, st>>>(x, wc, o, k, n); break;
    case 8: dqx<1, true><<<grid(1, 528), 256, smem, st>>>(x, wc, o, k, n); break;
    case 9: dqx<2, true><<<grid(2, 264), 256, smem, st>>>(x, wc, o, k, n); break;
    case 11: case 12: {
        const uint32_t th = k / 32 * 8;
        quantize_global<<<(th + 255) / 256, 256, 0, st>>>(x, k, g.q, g.ds);
        if (v == 11) rpg<1><<<(n + 7) / 8, 256, 0, st>>>(g.q, g.ds, wc, o, k, n);
        else rpg<2><<<(n / 2 + 7) / 8, 256, 0, st>>>(g.q, g.ds, wc, o, k, n);
        break;
    }
    case 13: rpx<1><<<grid(1, 1056), 256, smem, st>>>(x, wc, o, k, n); break;
    case 14: rpx<2><<<grid(2, 528), 256, smem, st>>>(x, wc, o, k, n); break;
    case 15: rpx<1><<<grid(1, 264), 256, smem, st>>>(x, wc, o, k, n); break;
    case 16: dpx<4><<<std::min<uint32_t>((n + 7) / 8, 264), 256, smem, st>>>(x, wc, o, k, n); break;
    case 17: dpx<4><<<std::min<uint32_t>((n + 7) / 8, 528), 256, smem, st>>>(x, wc, o, k, n); break;
    case 18: dpx<2><<<std::min<uint32_t>((n + 7) / 8, 264), 256, smem, st>>>(x, wc, o, k, n); break;
    case 19: {
        const uint32_t th = k / 32 * 8;
        quantize_global<<<(th + 255) / 256, 256, 0, st>>>(x, k, g.q, g.ds);
        dpg<<<(n + 7) / 8, 256, 0, st>>>(g.q, g.ds, wc, o, k, n);
        break;
    }
    case 10: read_all<<<132 * 8, 256, 0, st>>>((const uint4*)wc, (uint64_t)k / 32 * 18 * n / 16, o, n); break;
    }
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const Shape shapes[] = {{4096, 4096, "8B q/o"}, {6144, 4096, "8B qkv"}, {28672, 4096, "8B gate+up"},
                            {4096, 14336, "8B down"}, {128256, 4096, "8B head"}, {2048, 2048, "1B q/o"},
                            {16384, 2048, "1B gate+up"}, {2048, 8192, "1B down"}, {576, 1536, "smol down"}};
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    Bufs g;
    CK(cudaMalloc(&g.q, 14336));
    CK(cudaMalloc(&g.ds, 14336 / 32 * 8));
    table_head("part 1: GB/s of back-to-back launches (err: worst |error| / rounding bound, int8 forms)", NAMES, NV, 9, "err");
    for (const Shape& sh : shapes) {
        const uint64_t row_bytes = (uint64_t)sh.k / 32 * 18, bytes = row_bytes * sh.n;
        const int copies = copies_past_l2(bytes);
        const std::vector<uint8_t> hw = random_q4_0(rng, bytes);
        std::vector<float> hx(sh.k);
        for (auto& v : hx) v = uni(rng) * (1.0f + 3.0f * (uni(rng) > 0.9f));
        std::vector<uint8_t> hr(bytes);
        const uint64_t nbt = bytes / 18;
        for (uint64_t b = 0; b < nbt; ++b) {
            memcpy(&hr[b * 2], &hw[b * 18], 2);
            memcpy(&hr[nbt * 2 + b * 16], &hw[b * 18 + 2], 16);
        }
        uint8_t* dw = upload(hw, copies);
        uint8_t* dwr = upload(hr, copies);
        float* dx = upload(hx);
        float* dout;
        CK(cudaMalloc(&dout, (uint64_t)sh.n * 4));
        const Q4Refs refs = q4_0_refs(hw, hx, sh.k, sh.n);
        const std::vector<double>& ref = refs.ref;
        const std::vector<double>& bound = refs.bound;
        double gbs[NV]; double worst = 0;
        std::vector<float> got(sh.n);
        for (int v = 0; v < NV; ++v) {
            CK(cudaMemset(dout, 0xff, (uint64_t)sh.n * 4));
            uint8_t* dw_v = repacked(v) ? dwr : dw;
            launch(v, dx, dw_v, dout, sh.k, sh.n, g);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got.data(), dout, sh.n * 4, cudaMemcpyDeviceToHost));
            if (v != 10) {
                for (int i = 0; i < 64; ++i) {
                    const double e = fabs(got[(uint64_t)i * sh.n / 64] - ref[i]);
                    if (int8_form(v)) {
                        if (!(e <= bound[i] * 1.001 + 1e-4)) printf("  %s %s row %d: error %.3e over bound %.3e\n", sh.name, NAMES[v], i, e, bound[i]);
                        worst = std::max(worst, e / bound[i]);
                    } else if (!(e <= 1e-4 * (1 + fabs(ref[i])))) printf("  %s %s row %d: error %.3e\n", sh.name, NAMES[v], i, e);
                }
            }
            gbs[v] = launches_gbs(bytes, [&](int i) { launch(v, dx, dw_v + bytes * (i % copies), dout, sh.k, sh.n, g); }, 200);
        }
        printf("%-11s %6u %6u", sh.name, sh.n, sh.k);
        for (int v = 0; v < NV; ++v) printf(" %9.0f", gbs[v]);
        printf(" %8.3f\n", worst);
        CK(cudaFree(dw)); CK(cudaFree(dwr)); CK(cudaFree(dx)); CK(cudaFree(dout));
    }

    // Part 2: the products of a whole 8B decode step as one graph.
    const Shape layer[] = {{6144, 4096, "qkv"}, {4096, 4096, "o"}, {28672, 4096, "gate+up"}, {4096, 14336, "down"}};
    const int L = 32;
    uint64_t per_layer = 0;
    for (const Shape& s : layer) per_layer += (uint64_t)s.k / 32 * 18 * s.n;
    uint8_t* big;
    CK(cudaMalloc(&big, per_layer * L));
    fill<<<4096, 256>>>(big, per_layer * L, 1);
    float *gx, *gy;
    CK(cudaMalloc(&gx, 14336 * 4));
    CK(cudaMalloc(&gy, 28672 * 4));
    CK(cudaMemset(gx, 0, 14336 * 4));
    CK(cudaDeviceSynchronize());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("part 2: a step's products (%.2f GB) as one graph, 32 layers\n%-11s %10s %8s %10s\n", per_layer * L / 1e9, "form", "step us", "GB/s", "us/layer");
    for (int rep = 0; rep < 2; ++rep)
    for (int v = 0; v < NV; ++v) {
        cudaGraph_t gr;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        uint64_t off = 0;
        for (int l = 0; l < L; ++l)
            for (const Shape& s : layer) {
                const uint8_t* w = big + off;
                off += (uint64_t)s.k / 32 * 18 * s.n;
                launch(v, gx, w, gy, s.k, s.n, g, st);
            }
        CK(cudaStreamEndCapture(st, &gr));
        const double us = graph_us(gr, st, 20);
        printf("%-11s %10.1f %8.0f %10.2f\n", NAMES[v], us, per_layer * L / (us * 1e-6) / 1e9, us / L);
    }
    return 0;
}
