// A standalone harness for the one-row Q4_0 product on int8 activations: the in-tree pair form
// against the same form with each high nibble taken by a mask alone:
//   nvcc -O3 -arch=sm_90 -o matvec_nibbles benches/cuda/matvec_nibbles.cu && ./matvec_nibbles
// The in-tree form (`mm_q8_pair_q4_0` in src/backend/cuda/kernels/matmul_blocks.cuh; harness.cuh's
// `pair_dot_w`) takes a quant word's high nibbles as (w >> 4) & 0x0f0f0f0f: a shift and a mask.
// `hi16` takes them as w & 0xf0f0f0f0, sixteen times each nibble, as unsigned bytes against the
// signed int8 row (`dp4a.u32.s32`) into a sum of their own, then adds that sum shifted right by
// four to the low nibbles' sum. Every term of it is a multiple of sixteen, so the shift is exact
// and the integer sums, and so the outputs, are the in-tree form's to the bit; a quant word costs
// two instructions where it cost three (the realigned words of a pair's first block one more).
// Counted by ncu at stop 65 (docs/kernels.md item 50): the 8B's `norm_gate_up` runs 344
// instructions a round, 121 of them bit operations, and its warps wait on memory (long
// scoreboard 4.84 of about 12 cycles an instruction), so the question is how much of a product's
// time its instruction count still sets.
// Both forms run the in-tree launch shape (a block of sixteen warps an SM, each block quantizing
// the activation row into shared memory first, a warp taking R rows at a time, the pair loop
// unrolled twice). Part 1 times back-to-back launches of each shape (GB/s) and checks each form
// against a float64 reference within the int8 rounding bound and `hi16` against `reg` bit for bit;
// part 2 times the products of a whole 8B decode step (32 layers of qkv, o, gate+up and down) as
// one graph, the forms alternately, twice.
// Predicted (H100): gate+up +3-5% GB/s, a step's products about 3% shorter as one graph.
#include "harness.cuh"

#define WARPS 16

// d = a . b + c with a's four bytes unsigned and b's signed.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// pair_dot_w with the high nibbles by mask alone (see the header): the same value, bit for bit.
__device__ __forceinline__ float pair_dot_hi16(const uint32_t (&w)[9], const int* q, const float2* ds, uint32_t p) {
    const uint32_t M = 0x0f0f0f0fu, H = 0xf0f0f0f0u;
    const int4* xq = (const int4*)(q + p * 16);
    const int4 a0 = xq[0], a1 = xq[1], b0 = xq[2], b1 = xq[3];
    const float4 dd = *(const float4*)(ds + 2 * p);
    const uint32_t u0 = __funnelshift_r(w[0], w[1], 16), u1 = __funnelshift_r(w[1], w[2], 16);
    const uint32_t u2 = __funnelshift_r(w[2], w[3], 16), u3 = __funnelshift_r(w[3], w[4], 16);
    int l0 = __dp4a((int)(u0 & M), a0.x, __dp4a((int)(u1 & M), a0.z, 0));
    l0 = __dp4a((int)(u2 & M), a1.x, __dp4a((int)(u3 & M), a1.z, l0));
    int h0 = dp4a_us(u0 & H, a0.y, dp4a_us(u1 & H, a0.w, 0));
    h0 = dp4a_us(u2 & H, a1.y, dp4a_us(u3 & H, a1.w, h0));
    int l1 = __dp4a((int)(w[5] & M), b0.x, __dp4a((int)(w[6] & M), b0.z, 0));
    l1 = __dp4a((int)(w[7] & M), b1.x, __dp4a((int)(w[8] & M), b1.z, l1));
    int h1 = dp4a_us(w[5] & H, b0.y, dp4a_us(w[6] & H, b0.w, 0));
    h1 = dp4a_us(w[7] & H, b1.y, dp4a_us(w[8] & H, b1.w, h1));
    const int s0 = l0 + (h0 >> 4), s1 = l1 + (h1 >> 4);
    const float d0 = __half2float(__ushort_as_half((unsigned short)(w[0] & 0xffffu)));
    const float d1 = __half2float(__ushort_as_half((unsigned short)(w[4] >> 16)));
    return d0 * (dd.x * (float)s0 - 8.f * dd.y) + d1 * (dd.z * (float)s1 - 8.f * dd.w);
}

// A warp's R rows at a time over the grid (grid-stride), the pair loop unrolled twice, as
// harness.cuh's `rows_pair_sums`; HI16 picks the pair's sum.
template <int R, bool HI16>
__global__ void __launch_bounds__(WARPS * 32, 1) rows(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const SmemRow xr = smem_quantized_row(x, k);
    const int lane = threadIdx.x & 31;
    const uint32_t pairs = k / 64, row_words = pairs * 9;
    const uint64_t stride = (uint64_t)gridDim.x * WARPS;
    for (uint64_t g = (uint64_t)blockIdx.x * WARPS + threadIdx.x / 32; g < n / R; g += stride) {
        const uint32_t* wr = (const uint32_t*)w + g * R * row_words;
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll 2
        for (uint32_t p = lane; p < pairs; p += 32)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                uint32_t words[9];
#pragma unroll
                for (int i = 0; i < 9; ++i) words[i] = wr[r * row_words + p * 9 + i];
                acc[r] += HI16 ? pair_dot_hi16(words, xr.q, xr.ds, p) : pair_dot_w(words, xr.q, xr.ds, p);
            }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) out[g * R + r] = v;
        }
    }
}

static int sms = 132;
#define NV 2
static const char* NAMES[NV] = {"reg", "hi16"};

static void launch(int v, int R, const float* x, const uint8_t* w, float* o, uint32_t k, uint32_t n, cudaStream_t st = 0) {
    const uint32_t smem = k + k / 4;
    if (R == 2) {
        if (v == 0) rows<2, false><<<sms, WARPS * 32, smem, st>>>(x, w, o, k, n);
        else rows<2, true><<<sms, WARPS * 32, smem, st>>>(x, w, o, k, n);
    } else {
        if (v == 0) rows<1, false><<<sms, WARPS * 32, smem, st>>>(x, w, o, k, n);
        else rows<1, true><<<sms, WARPS * 32, smem, st>>>(x, w, o, k, n);
    }
}

struct Shape { uint32_t n, k; int R; const char* name; };

int main() {
    sms = print_device();
    const Shape shapes[] = {{6144, 4096, 2, "8B qkv"}, {4096, 4096, 2, "8B o"}, {28672, 4096, 2, "8B gate+up"},
                            {4096, 14336, 2, "8B down"}, {3072, 2048, 2, "1B qkv"}, {2048, 2048, 1, "1B o"},
                            {16384, 2048, 2, "1B gate+up"}, {2048, 8192, 1, "1B down"}, {1001, 4160, 1, "odd"}};
    std::mt19937_64 rng(11);
    table_head("part 1: GB/s of back-to-back launches (err: worst |error| / int8 rounding bound)", NAMES, NV, 10, "err");
    for (const Shape& sh : shapes) {
        const uint64_t bytes = (uint64_t)sh.k / 32 * 18 * sh.n;
        const int copies = copies_past_l2(bytes);
        Q4Case c = q4_case(rng, sh.k, sh.n);
        uint8_t* dw = upload(c.hw, copies);
        double gbs[NV], worst = 0;
        std::vector<float> first;
        for (int v = 0; v < NV; ++v) {
            const std::vector<float> got = poisoned_run([&] { launch(v, sh.R, c.dx, dw, c.dout, sh.k, sh.n); }, c.dout, sh.n);
            worst = std::max(worst, worst_over_bound(got, c.refs, sh.n));
            if (v == 0) first = got;
            else if (memcmp(first.data(), got.data(), (size_t)sh.n * 4) != 0) printf("  %s %s: not the bits of reg\n", sh.name, NAMES[v]);
            gbs[v] = launches_gbs(bytes, [&](int i) { launch(v, sh.R, c.dx, dw + bytes * (i % copies), c.dout, sh.k, sh.n); }, 200);
        }
        printf("%-11s %6u %6u", sh.name, sh.n, sh.k);
        for (int v = 0; v < NV; ++v) printf(" %10.0f", gbs[v]);
        printf(" %8.3f\n", worst);
        CK(cudaFree(dw));
        free_case(c);
    }

    // Part 2: the products of a whole 8B decode step as one graph (harness.cuh's StepProducts).
    StepProducts sp = step_products(rng);
    printf("part 2: a step's products (%.2f GB) as one graph, 32 layers\n%-11s %10s %8s\n",
           sp.per_layer * StepProducts::L / 1e9, "form", "step us", "GB/s");
    for (int rep = 0; rep < 2; ++rep)
        for (int v = 0; v < NV; ++v) {
            const double us = step_graph_us(
                sp,
                [&](const float* x, const uint8_t* w, float* y, uint32_t k, uint32_t n, cudaStream_t st) {
                    launch(v, 2, x, w, y, k, n, st);
                },
                20);
            printf("%-11s %10.1f %8.0f\n", NAMES[v], us, sp.per_layer * StepProducts::L / (us * 1e-6) / 1e9);
        }
    free_step_products(sp);
    return 0;
}
