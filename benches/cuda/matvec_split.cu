// A standalone harness for the block-split decode product on Q4_0 weights (one activation row):
//   nvcc -O3 -arch=sm_90 -o matvec_split benches/cuda/matvec_split.cu && ./matvec_split
// Forms:
//   v0: the warp-per-output kernel of src/backend/cuda/kernels/matmul_blocks.cuh (four lanes a
//       block, 16-bit weight loads, the activations read per quarter as two float4).
//   split<R, U>: a block per R outputs; its threads split k, thread j owning the 8-value units
//       (quarter t of block b: values 4t..4t+3 and 16+4t..16+4t+3) j, j + T, .. (U of them). It
//       issues every weight load of its R rows first, then reads its activations into registers
//       once, so each thread has R * U units (R * U * 6 bytes) in flight and the activations cost
//       no shared-memory or L1 traffic per row. Nibbles become floats by the exponent trick
//       (0x4B000000 | n is 2^23 + n). The R partial sums are added across the block in a fixed
//       order (warp trees, then warp 0 over the warps).
//   read floor: the weight bytes read once with 16-byte loads, nothing computed.
// Part 1 times back-to-back launches of one shape; part 2 a whole 8B-shaped decode step's
// products (32 layers of qkv 6144, o 4096, gate+up 28672, down 4096x14336) captured as one CUDA
// graph, each layer's weights distinct (3.9 GB, more than L2), which is how they run in onepass.
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

// v0 with all the weight words of U rounds (U * 8 blocks of a row) loaded before any is used:
// U * 6 bytes a lane in flight instead of whatever the compiler hoists.
template <int U>
__global__ void v0l(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const uint64_t row_bytes = (uint64_t)k / 32 * 18;
    const int lane = threadIdx.x & 31;
    const uint32_t t = lane & 3, blocks = k / 32;
    const uint64_t warps = (uint64_t)gridDim.x * (blockDim.x / 32);
    for (uint64_t o = (uint64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; o < n; o += warps) {
        const uint8_t* wr = w + o * row_bytes;
        float acc = 0.0f;
        for (uint32_t b0 = lane >> 2; b0 < blocks; b0 += 8 * U) {
            uint32_t q[U];
            uint16_t d[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const uint32_t b = b0 + 8 * u;
                q[u] = 0;
                d[u] = 0;
                if (b < blocks) {
                    const uint8_t* p = wr + (uint64_t)b * 18;
                    d[u] = *(const uint16_t*)p;
                    q[u] = u32_at(p + 2 + 4 * t);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const uint32_t b = b0 + 8 * u;
                if (b < blocks) {
                    const float* xb = x + (uint64_t)b * 32;
                    const float4 lo = *(const float4*)(xb + 4 * t), hi = *(const float4*)(xb + 16 + 4 * t);
                    const float sx = (lo.x + lo.y) + (lo.z + lo.w) + (hi.x + hi.y) + (hi.z + hi.w);
                    acc += __half2float(__ushort_as_half(d[u])) * (nibble_dot(q[u], lo, hi) - 8.0f * sx);
                }
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) out[o] = acc;
    }
}

// (n - 8) for a nibble n, exactly, without an integer-to-float conversion.
__device__ __forceinline__ float q4_value(uint32_t n) {
    return __int_as_float(0x4B000000u | n) - 8388616.0f;
}
__device__ __forceinline__ float q4_dot(uint32_t q, float4 lo, float4 hi) {
    float s = lo.x * q4_value(q & 15u);
    s = fmaf(lo.y, q4_value((q >> 8) & 15u), s);
    s = fmaf(lo.z, q4_value((q >> 16) & 15u), s);
    s = fmaf(lo.w, q4_value((q >> 24) & 15u), s);
    s = fmaf(hi.x, q4_value((q >> 4) & 15u), s);
    s = fmaf(hi.y, q4_value((q >> 12) & 15u), s);
    s = fmaf(hi.z, q4_value((q >> 20) & 15u), s);
    s = fmaf(hi.w, q4_value(q >> 28), s);
    return s;
}

template <int R, int U>
__global__ void __launch_bounds__(1024) split(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    __shared__ float red[32][R];
    const uint32_t units = k / 8, T = blockDim.x, tid = threadIdx.x;
    const uint64_t row_bytes = (uint64_t)k / 32 * 18;
    const uint64_t o0 = (uint64_t)blockIdx.x * R;
    uint32_t q[R][U];
    uint16_t d[R][U];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const uint32_t u = tid + j * T;
            q[r][j] = 0x88888888u;
            d[r][j] = 0;
            if (u < units && o0 + r < n) {
                const uint8_t* p = w + (o0 + r) * row_bytes + (uint64_t)(u >> 2) * 18;
                d[r][j] = *(const uint16_t*)p;
                q[r][j] = u32_at(p + 2 + 4 * (u & 3));
            }
        }
    }
    float4 lo[U], hi[U];
#pragma unroll
    for (int j = 0; j < U; ++j) {
        const uint32_t u = tid + j * T;
        lo[j] = hi[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (u < units) {
            const float* xb = x + (u >> 2) * 32 + 4 * (u & 3);
            lo[j] = *(const float4*)xb;
            hi[j] = *(const float4*)(xb + 16);
        }
    }
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < U; ++j) s = fmaf(__half2float(__ushort_as_half(d[r][j])), q4_dot(q[r][j], lo[j], hi[j]), s);
        acc[r] = warp_sum(s);
    }
    const int lane = tid & 31, warp = tid >> 5;
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) red[warp][r] = acc[r];
    }
    __syncthreads();
    if (tid < R && o0 + tid < n) {
        float s = 0.0f;
        for (uint32_t i = 0; i < T / 32; ++i) s += red[i][tid];
        out[o0 + tid] = s;
    }
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
#define NV_MAX 8

// Launch form v on weights wc.
// Threads of a split block whose threads own u units each (0: k too long for one block).
static uint32_t split_threads(uint32_t k, uint32_t u) {
    const uint32_t t = ((k / 8 + u - 1) / u + 31) / 32 * 32;
    return t <= 1024 ? t : 0;
}
static bool applies(int v, uint32_t k) {
    const uint32_t u[NV_MAX] = {0, 0, 0, 0, 0, 4, 0, 0};
    return u[v] == 0 || split_threads(k, u[v]) != 0;
}
static void launch(int v, const float* x, const uint8_t* wc, float* o, uint32_t k, uint32_t n,
                   cudaStream_t st = 0) {
    auto thr = [&](uint32_t u) { return split_threads(k, u); };
    if (!applies(v, k)) return;
    switch (v) {
    case 0: v0<<<(n + 3) / 4, 128, 0, st>>>(x, wc, o, k, n); break;
    case 1: v0l<2><<<(n + 3) / 4, 128, 0, st>>>(x, wc, o, k, n); break;
    case 2: v0l<4><<<(n + 3) / 4, 128, 0, st>>>(x, wc, o, k, n); break;
    case 3: v0l<8><<<(n + 3) / 4, 128, 0, st>>>(x, wc, o, k, n); break;
    case 4: v0l<16><<<(n + 3) / 4, 128, 0, st>>>(x, wc, o, k, n); break;
    case 5: split<4, 4><<<(n + 3) / 4, thr(4), 0, st>>>(x, wc, o, k, n); break;
    case 6: v0l<8><<<(n + 7) / 8, 256, 0, st>>>(x, wc, o, k, n); break;
    case 7: read_all<<<132 * 8, 256, 0, st>>>((const uint4*)wc, (uint64_t)k / 32 * 18 * n / 16, o, n); break;
    }
}
const int NV = 8;
const char* NAMES[NV] = {"v0", "v0l<2>", "v0l<4>", "v0l<8>", "v0l<16>", "split<4,4>", "v0l<8>b256", "read floor"};

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const Shape shapes[] = {{4096, 4096, "8B q/o"}, {6144, 4096, "8B qkv"}, {28672, 4096, "8B gate+up"},
                            {4096, 14336, "8B down"}, {128256, 4096, "8B head"}, {2048, 2048, "1B q/o"},
                            {16384, 2048, "1B gate+up"}, {2048, 8192, "1B down"}, {576, 1536, "smol down"}};
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    table_head("part 1: GB/s of back-to-back launches", NAMES, NV, 11, "max rel");
    for (const Shape& sh : shapes) {
        const uint64_t row_bytes = (uint64_t)sh.k / 32 * 18, bytes = row_bytes * sh.n;
        const int copies = copies_past_l2(bytes);
        const std::vector<uint8_t> hw = random_q4_0(rng, bytes);
        std::vector<float> hx(sh.k);
        for (auto& v : hx) v = uni(rng);
        uint8_t* dw = upload(hw, copies);
        float* dx = upload(hx);
        float* dout;
        CK(cudaMalloc(&dout, (uint64_t)sh.n * 4));
        std::vector<double> ref(64);
        for (int i = 0; i < 64; ++i) {
            const uint64_t o = (uint64_t)i * sh.n / 64;
            double s = 0;
            for (uint32_t b = 0; b < sh.k / 32; ++b) {
                const uint8_t* p = &hw[o * row_bytes + b * 18];
                uint16_t du; memcpy(&du, p, 2);
                const double d = h2f(du);
                for (int j = 0; j < 16; ++j) {
                    s += d * ((p[2 + j] & 15) - 8) * hx[b * 32 + j];
                    s += d * ((p[2 + j] >> 4) - 8) * hx[b * 32 + 16 + j];
                }
            }
            ref[i] = s;
        }
        double gbs[NV]; float worst = 0;
        std::vector<float> first(sh.n), got(sh.n);
        for (int v = 0; v < NV; ++v) {
            if (!applies(v, sh.k)) { gbs[v] = 0; continue; }
            CK(cudaMemset(dout, 0xff, (uint64_t)sh.n * 4));
            launch(v, dx, dw, dout, sh.k, sh.n);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got.data(), dout, sh.n * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (int i = 0; i < 64; ++i) {
                const double g = got[(uint64_t)i * sh.n / 64];
                num += (g - ref[i]) * (g - ref[i]); den += ref[i] * ref[i];
            }
            const double rel = sqrt(num / den);
            if (v != NV - 1 && !(rel < 1e-5)) printf("  %s %s: relative error %.3e against float64\n", sh.name, NAMES[v], rel);
            if (v == 0) first = got;
            for (uint32_t i = 0; i < sh.n && v != NV - 1; ++i) {
                const float d = fabsf(got[i] - first[i]) / (fabsf(first[i]) + 1e-3f);
                if (!(d <= worst)) worst = d;
            }
            gbs[v] = launches_gbs(bytes, [&](int i) { launch(v, dx, dw + bytes * (i % copies), dout, sh.k, sh.n); }, 200);
        }
        printf("%-11s %6u %6u", sh.name, sh.n, sh.k);
        for (int v = 0; v < NV; ++v) printf(" %11.0f", gbs[v]);
        printf(" %9.2e\n", worst);
        CK(cudaFree(dw)); CK(cudaFree(dx)); CK(cudaFree(dout));
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
    const int forms[] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int v : forms) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        uint64_t off = 0;
        for (int l = 0; l < L; ++l)
            for (const Shape& s : layer) {
                const uint8_t* w = big + off;
                off += (uint64_t)s.k / 32 * 18 * s.n;
                // A form that cannot take the down projection takes v0 there.
                launch(applies(v, s.k) ? v : 0, gx, w, gy, s.k, s.n, st);
            }
        CK(cudaStreamEndCapture(st, &g));
        const double us = graph_us(g, st, 20);
        printf("%-11s %10.1f %8.0f %10.2f\n", NAMES[v], us, per_layer * L / (us * 1e-6) / 1e9, us / L);
    }
    return 0;
}
