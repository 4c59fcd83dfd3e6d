// A standalone harness for the decode matrix-vector product on Q4_0 weights (one activation row),
// for trying kernel variants on the GPU machine without the Rust build:
//   nvcc -O3 -arch=sm_90 -o matvec benches/cuda/matvec_q4_0.cu && ./matvec
// Variants:
//   v0: the kernel in src/backend/cuda/kernels/matmul_blocks.cuh (one warp per output; four lanes
//       share a block; weight words read as 16-bit loads).
//   v2<R, U>: one warp per R outputs (grid-stride; "gN" launches N blocks per SM); each step the
//       warp reads U groups of 8 blocks (144 bytes, 16-byte aligned since rows are) of each of its
//       R rows with 16-byte loads into registers, stages them in shared memory, and computes from
//       there while the next step's loads are in flight. Activations are f32, read once per step
//       for the R rows. Same sums in the same order as v0: the same bits.
//   read floor: the weight bytes read once with 16-byte loads, nothing computed.
// Back-to-back launches of one kernel on one stream: each runs alone, but launch gaps are hidden,
// so a kernel's figure here is above what it gets as one node of a decode step's chain (see
// docs/kernels.md).
// Weights rotate among copies larger than L2 together; outputs are checked against a float64
// reference on the host (relative L2 error) and each variant against v0.
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
// Quarter t of a block at p, dotted with the 32 activations at xb.
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

// R outputs a warp, U groups of 8 blocks a step; WARPS warps a block.
template <int R, int U, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) v2(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    constexpr int WORDS = R * U * 9;            // 16-byte words a step
    constexpr int PER_LANE = (WORDS + 31) / 32;
    __shared__ uint4 stage[WARPS][WORDS];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const uint64_t row_bytes = (uint64_t)k / 32 * 18, row_words = row_bytes / 16;
    const uint32_t blocks = k / 32, steps = (blocks + 8 * U - 1) / (8 * U);
    for (uint64_t o0 = ((uint64_t)blockIdx.x * WARPS + wid) * R; o0 < n; o0 += (uint64_t)gridDim.x * WARPS * R) {
    const uint4* base = (const uint4*)(w + o0 * row_bytes);
    // Where word i of a step lives: row i / (U * 9), word i % (U * 9) of the step's span.
    uint4 next[PER_LANE];
    auto load = [&](uint32_t s) {
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int i = lane + 32 * j;
            const int r = i / (U * 9), c = i % (U * 9);
            const uint64_t word = (uint64_t)s * U * 9 + c;
            if (i < WORDS && o0 + r < n && word < row_words)
                next[j] = __ldg(base + r * row_words + word);
        }
    };
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    load(0);
    const uint32_t t = lane & 3;
    for (uint32_t s = 0; s < steps; ++s) {
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int i = lane + 32 * j;
            if (i < WORDS) stage[wid][i] = next[j];
        }
        __syncwarp();
        if (s + 1 < steps) load(s + 1);
        const uint8_t* sbytes = (const uint8_t*)stage[wid];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const uint32_t bl = 8 * u + (lane >> 2), b = s * 8 * U + bl;
            if (b < blocks) {
                const float* xb = x + (uint64_t)b * 32;
                const float4 lo = *(const float4*)(xb + 4 * t), hi = *(const float4*)(xb + 16 + 4 * t);
                const float sx = (lo.x + lo.y) + (lo.z + lo.w) + (hi.x + hi.y) + (hi.z + hi.w);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const uint8_t* p = sbytes + r * (U * 144) + bl * 18;
                    const float d = half_at(p);
                    const uint32_t q = u32_at(p + 2 + 4 * t);
                    acc[r] += d * (nibble_dot(q, lo, hi) - 8.0f * sx);
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && o0 + r < n) out[o0 + r] = v;
    }
    }
}

// The read floor: every weight byte read once with 16-byte loads (grid-stride), nothing computed.
__global__ void read_all(const uint4* w, uint64_t words, float* out, uint32_t n) {
    uint32_t acc = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (uint64_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(w + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[threadIdx.x % n] = 1.0f;
}

struct Shape { uint32_t n, k; const char* name; };

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const Shape shapes[] = {{4096, 4096, "8B q/o"}, {14336, 4096, "8B gate/up"}, {4096, 14336, "8B down"},
                            {128256, 4096, "8B head"}, {2048, 2048, "1B q/o"}, {8192, 2048, "1B gate/up"},
                            {576, 1536, "smol down"}};
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    const int NV = 10;
    const char* names[NV] = {"v0", "v0 g132x8", "v0 g132x16", "v2<2,2>", "v2<2,2>g4", "v2<2,2>g8",
                             "v2<1,2>g8", "v2<1,4>g8", "v2<4,2>g4", "read floor"};
    printf("%-11s %6s %6s", "GB/s", "n", "k");
    for (int v = 0; v < NV; ++v) printf(" %11s", names[v]);
    printf(" %9s\n", "max rel");
    for (const Shape& sh : shapes) {
        const uint64_t row_bytes = (uint64_t)sh.k / 32 * 18, bytes = row_bytes * sh.n;
        const int copies = copies_past_l2(bytes);
        const std::vector<uint8_t> hw = random_q4_0(rng, bytes);
        std::vector<float> hx(sh.k);
        for (auto& v : hx) v = uni(rng);
        uint8_t* dw = upload(hw, copies);
        float* dx = upload(hx);
        float* dout;
        CK(cudaMalloc(&dout, (uint64_t)sh.n * 4 * 8));
        // float64 reference of 64 rows
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
            auto launch = [&](int c, float* o) {
                const uint8_t* wc = dw + bytes * (c % copies);
                switch (v) {
                case 0: v0<<<(sh.n + 3) / 4, 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 1: v0<<<std::min((sh.n + 3) / 4, 132u * 8), 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 2: v0<<<std::min((sh.n + 3) / 4, 132u * 16), 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 3: v2<2, 2, 4><<<(sh.n + 7) / 8, 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 4: v2<2, 2, 4><<<std::min((sh.n + 7) / 8, 132u * 4), 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 5: v2<2, 2, 4><<<std::min((sh.n + 7) / 8, 132u * 8), 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 6: v2<1, 2, 4><<<std::min((sh.n + 3) / 4, 132u * 8), 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 7: v2<1, 4, 4><<<std::min((sh.n + 3) / 4, 132u * 8), 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 8: v2<4, 2, 4><<<std::min((sh.n + 15) / 16, 132u * 4), 128>>>(dx, wc, o, sh.k, sh.n); break;
                case 9: read_all<<<132 * 8, 256>>>((const uint4*)wc, bytes / 16, o, sh.n); break;
                }
            };
            CK(cudaMemset(dout, 0xff, (uint64_t)sh.n * 4));
            launch(0, dout);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got.data(), dout, sh.n * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            for (int i = 0; i < 64; ++i) {
                const double g = got[(uint64_t)i * sh.n / 64];
                num += (g - ref[i]) * (g - ref[i]); den += ref[i] * ref[i];
            }
            const double rel = sqrt(num / den);
            if (v != 9 && !(rel < 1e-5)) printf("  %s v%d: relative error %.3e against float64\n", sh.name, v, rel);
            if (v == 0) first = got;
            for (uint32_t i = 0; i < sh.n && v != 9; ++i) {
                const float d = fabsf(got[i] - first[i]) / (fabsf(first[i]) + 1e-3f);
                if (!(d <= worst)) worst = d;
            }
            gbs[v] = launches_gbs(bytes, [&](int i) { launch(i, dout); }, 200);
        }
        printf("%-11s %6u %6u", sh.name, sh.n, sh.k);
        for (int v = 0; v < NV; ++v) printf(" %11.0f", gbs[v]);
        printf(" %9.2e\n", worst);
        CK(cudaFree(dw)); CK(cudaFree(dx)); CK(cudaFree(dout));
    }
    return 0;
}
