// The tensor-core ceiling the prompt products are measured against: the rate of back-to-back
// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (the instruction `matmul_mma_<w>` uses) with
// operands in registers, no memory traffic, on every SM. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o mma_peak benches/cuda/mma_peak.cu && ./mma_peak
// Each warp keeps eight independent accumulator tiles (so the chain of dependent products does
// not bound the rate) and issues ITERS rounds of eight products; blocks of 8 warps, 8 blocks per
// SM. The result is written out so the compiler keeps the work.
#include <cuda_fp16.h>
#include <cstdint>
#include <cstdio>

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e = (x);                                                                      \
        if (e != cudaSuccess) {                                                                   \
            printf("%s: %s\n", #x, cudaGetErrorString(e));                                        \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

constexpr int ITERS = 4096;
constexpr int TILES = 8;

__global__ void mma_loop(float* out, uint32_t seed) {
    uint32_t a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = seed * (threadIdx.x + 1) + i;
    for (int i = 0; i < 2; ++i) b[i] = seed ^ (threadIdx.x * 7 + i);
    float c[TILES][4] = {};
    for (int it = 0; it < ITERS; ++it) {
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                : "+f"(c[t][0]), "+f"(c[t][1]), "+f"(c[t][2]), "+f"(c[t][3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
        }
    }
    float s = 0.0f;
    for (int t = 0; t < TILES; ++t) s += c[t][0] + c[t][1] + c[t][2] + c[t][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

int main() {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int blocks = sms * 8, threads = 256;
    float* out;
    CK(cudaMalloc(&out, sizeof(float) * blocks * threads));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    mma_loop<<<blocks, threads>>>(out, 1u);  // warm-up
    CK(cudaDeviceSynchronize());
    float best = 0.0f;
    for (int rep = 0; rep < 5; ++rep) {
        CK(cudaEventRecord(e0));
        mma_loop<<<blocks, threads>>>(out, 2u + rep);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double flops = 2.0 * 16 * 8 * 16 * (double)TILES * ITERS * (blocks * threads / 32);
        const float tflops = (float)(flops / (ms * 1e-3) / 1e12);
        if (tflops > best) best = tflops;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs: mma.sync m16n8k16 f16 -> f32: %.1f TFLOP/s (best of 5)\n", prop.name, sms,
           best);
    return 0;
}
