// What the decode-step harnesses of this folder share (matvec_stream.cu, step_flow.cu), after
// harness.cuh: the programmatic-launch and mbarrier primitives, the in-tree one-row int8 product
// in its launch shape, and a stand-in for the decode attention. A header of its own, since
// gemm_wgmma.cu defines its own `smem_addr` beside harness.cuh.
#pragma once
#include "harness.cuh"

// Programmatic dependent launch: the wait for the grid before, and the go-ahead for the next.
__device__ __forceinline__ void grid_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void grid_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// A shared-memory pointer as the 32-bit address the PTX of bulk copies and mbarriers takes.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Waits until the mbarrier at shared address `bar` has completed the phase of `parity`.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred P1;\n"
        "WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        " @!P1 bra WAIT_%=;\n}" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// Warps a block of the in-tree int8 products.
#define RW 16

// The in-tree one-row Q4_0 product (`mm_q8_rows_pairs_q4_0`) in its launch shape: sixteen warps a
// block and a block an SM; each block waits for the kernel before, lets its dependents start,
// quantizes the activation row into shared memory (k + k / 4 bytes of dynamic shared memory) and
// reads its weights into registers, R rows a warp at a time; each output times `scale`. B: the
// prologue's rounds a batch (quantize_row).
template <int R, int B = 1>
__global__ void __launch_bounds__(RW * 32, 1)
    reg(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n, float scale) {
    grid_wait();
    grid_release();
    const SmemRow xr = smem_quantized_row<B>(x, k);
    const int lane = threadIdx.x & 31;
    const uint32_t pairs = k / 64, row_words = pairs * 9;
    for (uint64_t g = (uint64_t)blockIdx.x * RW + threadIdx.x / 32; g < n / R; g += (uint64_t)gridDim.x * RW) {
        const uint32_t* wr = (const uint32_t*)w + g * R * row_words;
        float acc[R];
        rows_pair_sums<R, 2>(wr, row_words, pairs, lane, xr.q, xr.ds, acc);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) out[g * R + r] = v * scale;
        }
    }
}

// Spins for ns nanoseconds of the global timer.
__device__ __forceinline__ void spin_ns(uint32_t ns) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// A stand-in for the decode attention between a step's qkv and o products: eight warps a block
// (two fit an SM beside a product of half an SM), a block an SM, that read no weights and hold
// the SM for `ns` nanoseconds after their grid wait.
__global__ void __launch_bounds__(256, 2) idle(uint32_t ns) {
    grid_wait();
    grid_release();
    if (threadIdx.x == 0) spin_ns(ns);
    __syncthreads();
}
