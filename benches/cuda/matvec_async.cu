// A standalone harness for the one-row Q4_0 product on int8 activations with the weights staged
// through shared memory by `cp.async`, against the in-tree register form:
//   nvcc -O3 -arch=sm_90 -o matvec_async benches/cuda/matvec_async.cu && ./matvec_async
// Both forms run the in-tree launch shape: a block of sixteen warps an SM, each block quantizing
// the activation row into shared memory first, each warp taking R rows at a time (grid-stride),
// a lane a pair of 32-value blocks (`mm_q8_rows_pairs_q4_0` in
// src/backend/cuda/kernels/matmul_blocks.cuh: nine 4-byte words for 64 values).
//   reg<R, U>: the in-tree form: a lane's words loaded into registers, the pair loop unrolled U
//       times (the kernels: twice), so a lane asks for U pairs of each row at a time; a warp's
//       next rows are asked for only after its current rows are summed. "reg U4" and "reg U8".
//   cpa<R, S>: a warp's work cut into chunks of 32 pairs of each of its R rows (1,152 bytes a
//       row); S chunks in flight a warp through its own ring of S shared-memory slots, filled by
//       16-byte `cp.async` copies that need no registers; the first S - 1 asked for before the
//       block quantizes the row. A lane reads its nine words from the slot (a stride of nine
//       words: no bank conflicts). The same sums in the same order as reg<R>: the same bits.
//   reg P: reg<R, 2> with each lane's next two pairs of its rows loaded before the current two
//       are summed (the loads a step ahead, in registers).
//   read floor: the weight bytes read once with 16-byte loads, nothing computed.
// Part 1 times back-to-back launches of one shape (GB/s); part 2 the products of a whole 8B
// decode step (32 layers of qkv, o, gate+up, down, each layer's weights distinct) as one graph;
// part 3 the same products in one persistent kernel with grid barriers (reg<2, 2>'s form).
// Each form is checked against a float64 reference within the int8 rounding bound, and against
// reg<R> bit for bit.
// Measured on an H200 (stop 57; docs/kernels.md item 44), GB/s, reg / cpa S2 / S3 / S4 / reg P /
// reg U4 / reg U8 / read floor: 8B gate+up 2,901 / 2,859 / 2,587 / 2,575 / 2,560 / 1,938 / 1,940
// / 3,512; 8B down 2,076 / 2,017 / 1,876 / 1,813 / 1,761 / 1,819 / 1,557 / 3,024; 8B qkv 1,411 /
// 1,366 / 1,248 / 1,229 / 1,224 / 1,114 / 1,112 / 2,168; a step's products as one graph 1,653 /
// 1,669 / 1,851 / 1,878 / 1,939 / 2,218 / 2,312 us. (An earlier run with a cpa S6 form: 2,383 on
// gate+up, 2,125 us a step.) Every form with more of a warp's bytes in flight is slower. Part 3:
// 1,786 us a step (chain), 1,723 (chain PF), against part 2's 1,653: kernel boundaries in a graph
// cost less than these grid barriers.
#include "harness.cuh"

#define WARPS 16
#define CHUNK_WORDS 288  // 32 pairs of 36 bytes

// What a warp of the register forms works with: the block's activation row quantized into its
// shared memory (harness.cuh's `quantize_row`; every thread past the barrier), a row's pairs and
// words, and the warp's walk over the groups of R rows (grid-stride).
struct RowWalk {
    const int* q;
    const float2* ds;
    uint32_t pairs, row_words;
    uint64_t first, stride, groups;
};
template <int R>
__device__ __forceinline__ RowWalk row_walk(const float* x, uint32_t k, uint32_t n) {
    const SmemRow xr = smem_quantized_row(x, k);
    return {xr.q, xr.ds, k / 64, k / 64 * 9, (uint64_t)blockIdx.x * WARPS + threadIdx.x / 32,
            (uint64_t)gridDim.x * WARPS, n / R};
}

// reg<R, 2> with the next two pairs of each row loaded before the current two are summed.
template <int R>
__global__ void __launch_bounds__(WARPS * 32, 1) regp(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const RowWalk xr = row_walk<R>(x, k, n);
    const int lane = threadIdx.x & 31;
    const uint32_t pairs = xr.pairs, row_words = xr.row_words;
    for (uint64_t g = xr.first; g < xr.groups; g += xr.stride) {
        const uint32_t* wr = (const uint32_t*)w + g * R * row_words;
        uint32_t cur[R][2][9], nxt[R][2][9];
        auto load = [&](uint32_t (&dst)[R][2][9], uint32_t p0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t p = p0 + 32 * h;
#pragma unroll
                    for (int i = 0; i < 9; ++i) dst[r][h][i] = p < pairs ? wr[r * row_words + p * 9 + i] : 0u;
                }
        };
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        load(cur, lane);
        for (uint32_t p0 = lane; p0 < pairs; p0 += 64) {
            if (p0 + 64 < pairs) load(nxt, p0 + 64);
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (p0 + 32 * h < pairs)
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] += pair_dot_w(cur[r][h], xr.q, xr.ds, p0 + 32 * h);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int i = 0; i < 9; ++i) cur[r][h][i] = nxt[r][h][i];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) out[g * R + r] = v;
        }
    }
}

template <int R, int U>
__global__ void __launch_bounds__(WARPS * 32, 1) reg(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    const RowWalk xr = row_walk<R>(x, k, n);
    const int lane = threadIdx.x & 31;
    const uint32_t pairs = xr.pairs, row_words = xr.row_words;
    for (uint64_t g = xr.first; g < xr.groups; g += xr.stride) {
        const uint32_t* wr = (const uint32_t*)w + g * R * row_words;
        float acc[R];
        rows_pair_sums<R, U>(wr, row_words, pairs, lane, xr.q, xr.ds, acc);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) out[g * R + r] = v;
        }
    }
}

__device__ __forceinline__ void cp16(uint32_t* dst, const uint8_t* src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

template <int R, int S>
__global__ void __launch_bounds__(WARPS * 32, 1) cpa(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    extern __shared__ float4 smem[];
    int* q = (int*)smem;
    float2* ds = (float2*)(q + k / 4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    uint32_t* ring = (uint32_t*)(ds + k / 32) + warp * S * R * CHUNK_WORDS;
    const uint32_t per_row = k / 2048;  // chunks a row
    const uint64_t row_bytes = (uint64_t)k / 32 * 18;
    const uint64_t groups = n / R, nw = (uint64_t)gridDim.x * WARPS;
    const uint64_t gw = (uint64_t)blockIdx.x * WARPS + warp;
    const uint64_t items = gw < groups ? (groups - gw + nw - 1) / nw * per_row : 0;
    auto ask = [&](uint64_t it) {
        if (it < items) {
            const uint64_t g = gw + it / per_row * nw, c = it % per_row;
            uint32_t* slot = ring + (it % S) * R * CHUNK_WORDS;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint8_t* src = w + (g * R + r) * row_bytes + c * 1152;
                for (int j = lane; j < 72; j += 32) cp16(slot + r * CHUNK_WORDS + 4 * j, src + 16 * j);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (int s = 0; s < S - 1; ++s) ask(s);
    quantize_row(x, k, q, ds, threadIdx.x, blockDim.x);
    __syncthreads();
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (uint64_t it = 0; it < items; ++it) {
        ask(it + S - 1);
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
        __syncwarp();
        const uint32_t c = (uint32_t)(it % per_row), p = c * 32 + lane;
        const uint32_t* slot = ring + (it % S) * R * CHUNK_WORDS + lane * 9;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += pair_dot(slot + r * CHUNK_WORDS, q, ds, p);
        __syncwarp();
        if (c == per_row - 1) {
            const uint64_t g = gw + it / per_row * nw;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float v = warp_sum(acc[r]);
                if (lane == 0) out[g * R + r] = v;
                acc[r] = 0.f;
            }
        }
    }
}

__global__ void read_all(const uint4* w, uint64_t words, float* out) {
    uint32_t acc = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (uint64_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(w + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[threadIdx.x] = 1.0f;
}

const int NV = 8;
const char* NAMES[NV] = {"reg", "cpa S2", "cpa S3", "cpa S4", "reg P", "read floor", "reg U4", "reg U8"};
static int sms = 132;

template <int R, int S>
static void cpa_launch(const float* x, const uint8_t* w, float* o, uint32_t k, uint32_t n, cudaStream_t st) {
    const uint32_t smem = k + k / 4 + WARPS * S * R * CHUNK_WORDS * 4;
    static uint32_t granted = 0;  // set before any capture: part 1 launches every form first
    if (smem > granted) {
        CK(cudaFuncSetAttribute(cpa<R, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        granted = smem;
    }
    cpa<R, S><<<sms, WARPS * 32, smem, st>>>(x, w, o, k, n);
}

// R: rows a warp takes at a time (the in-tree kernels: two for the fused qkv and gate+up, and for
// the plain products with more outputs than the grid has warps, else one).
static void launch(int v, int R, const float* x, const uint8_t* w, float* o, uint32_t k, uint32_t n, cudaStream_t st = 0) {
    const uint32_t base = k + k / 4;
    if (v == 5) {
        read_all<<<sms * 8, 256, 0, st>>>((const uint4*)w, (uint64_t)k / 32 * 18 * n / 16, o);
        return;
    }
    if (R == 2) {
        switch (v) {
        case 0: reg<2, 2><<<sms, WARPS * 32, base, st>>>(x, w, o, k, n); break;
        case 1: cpa_launch<2, 2>(x, w, o, k, n, st); break;
        case 2: cpa_launch<2, 3>(x, w, o, k, n, st); break;
        case 3: cpa_launch<2, 4>(x, w, o, k, n, st); break;
        case 4: regp<2><<<sms, WARPS * 32, base, st>>>(x, w, o, k, n); break;
        case 6: reg<2, 4><<<sms, WARPS * 32, base, st>>>(x, w, o, k, n); break;
        case 7: reg<2, 8><<<sms, WARPS * 32, base, st>>>(x, w, o, k, n); break;
        }
    } else {
        switch (v) {
        case 0: reg<1, 2><<<sms, WARPS * 32, base, st>>>(x, w, o, k, n); break;
        case 6: reg<1, 4><<<sms, WARPS * 32, base, st>>>(x, w, o, k, n); break;
        case 7: reg<1, 8><<<sms, WARPS * 32, base, st>>>(x, w, o, k, n); break;
        case 1: cpa_launch<1, 2>(x, w, o, k, n, st); break;
        case 2: cpa_launch<1, 3>(x, w, o, k, n, st); break;
        case 3: cpa_launch<1, 4>(x, w, o, k, n, st); break;
        case 4: regp<1><<<sms, WARPS * 32, base, st>>>(x, w, o, k, n); break;
        }
    }
}

struct Shape { uint32_t n, k; int R; const char* name; };

// Part 3: the same chain of products in one persistent kernel, a block an SM, the products
// separated by a grid barrier (an arrival counter and a generation word in global memory) rather
// than by kernel boundaries. Each product quantizes its input row into shared memory first, as the
// kernels do. With PF, each warp asks L2 for the first 2 KiB of its first rows of the next product
// before it arrives at the barrier (weights depend on nothing the barrier orders).
struct Product { const uint8_t* w; uint32_t k, n; };

__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* gen, unsigned blocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned* vg = gen;
        const unsigned g = *vg;
        __threadfence();
        if (atomicAdd(count, 1u) == blocks - 1) {
            atomicExch(count, 0u);
            __threadfence();
            atomicAdd(gen, 1u);
        } else {
            while (*vg == g) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

template <bool PF>
__global__ void __launch_bounds__(WARPS * 32, 1) chain(const Product* prods, uint32_t count, const float* x, float* out,
                                                       unsigned* bar) {
    extern __shared__ float4 smem[];
    int* q = (int*)smem;
    const int lane = threadIdx.x & 31;
    const uint64_t nw = (uint64_t)gridDim.x * WARPS, gw = (uint64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    for (uint32_t i = 0; i < count; ++i) {
        const Product pr = prods[i];
        float2* ds = (float2*)(q + pr.k / 4);
        quantize_row(x, pr.k, q, ds, threadIdx.x, blockDim.x);
        __syncthreads();
        const uint32_t pairs = pr.k / 64, row_words = pairs * 9;
        const uint64_t groups = pr.n / 2;
        for (uint64_t g = gw; g < groups; g += nw) {
            const uint32_t* wr = (const uint32_t*)pr.w + g * 2 * row_words;
            float a = 0.f, b = 0.f;
#pragma unroll 2
            for (uint32_t p = lane; p < pairs; p += 32) {
                a += pair_dot(wr + p * 9, q, ds, p);
                b += pair_dot(wr + row_words + p * 9, q, ds, p);
            }
            a = warp_sum(a);
            b = warp_sum(b);
            if (lane == 0) {
                out[g * 2] = a;
                out[g * 2 + 1] = b;
            }
        }
        if (PF && i + 1 < count) {
            const Product nx = prods[i + 1];
            const uint64_t rb = (uint64_t)nx.k / 32 * 18;
            if (gw < nx.n / 2)
                for (uint64_t off = 128 * (uint64_t)lane; off < 2 * rb && off < 4096; off += 32 * 128)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(nx.w + gw * 2 * rb + off));
        }
        grid_barrier(bar, bar + 1, gridDim.x);
    }
}

int main() {
    sms = print_device();
    const Shape shapes[] = {{6144, 4096, 2, "8B qkv"}, {4096, 4096, 2, "8B o"}, {28672, 4096, 2, "8B gate+up"},
                            {4096, 14336, 2, "8B down"}, {3072, 2048, 2, "1B qkv"}, {2048, 2048, 1, "1B o"},
                            {16384, 2048, 2, "1B gate+up"}, {2048, 8192, 1, "1B down"}};
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    table_head("part 1: GB/s of back-to-back launches (err: worst |error| / int8 rounding bound)", NAMES, NV, 10, "err");
    for (const Shape& sh : shapes) {
        const uint64_t row_bytes = (uint64_t)sh.k / 32 * 18, bytes = row_bytes * sh.n;
        const int copies = copies_past_l2(bytes);
        const std::vector<uint8_t> hw = random_q4_0(rng, bytes);
        std::vector<float> hx(sh.k);
        for (auto& v : hx) v = uni(rng) * (1.0f + 3.0f * (uni(rng) > 0.9f));
        uint8_t* dw = upload(hw, copies);
        float* dx = upload(hx);
        float* dout;
        CK(cudaMalloc(&dout, (uint64_t)sh.n * 4));
        const Q4Refs refs = q4_0_refs(hw, hx, sh.k, sh.n);
        const std::vector<double>& ref = refs.ref;
        const std::vector<double>& bound = refs.bound;
        double gbs[NV], worst = 0;
        std::vector<float> got(sh.n), first(sh.n);
        for (int v = 0; v < NV; ++v) {
            got = poisoned_run([&] { launch(v, sh.R, dx, dw, dout, sh.k, sh.n); }, dout, sh.n);
            if (v != 5) {
                for (int i = 0; i < 64; ++i) {
                    const double e = fabs(got[(uint64_t)i * sh.n / 64] - ref[i]);
                    if (!(e <= bound[i] * 1.001 + 1e-4)) printf("  %s %s row %d: error %.3e over bound %.3e\n", sh.name, NAMES[v], i, e, bound[i]);
                    worst = std::max(worst, e / bound[i]);
                }
                if (v == 0) first = got;
                else if (memcmp(first.data(), got.data(), sh.n * 4) != 0) printf("  %s %s: not the bits of reg\n", sh.name, NAMES[v]);
            }
            gbs[v] = launches_gbs(bytes, [&](int i) { launch(v, sh.R, dx, dw + bytes * (i % copies), dout, sh.k, sh.n); }, 200);
        }
        printf("%-11s %6u %6u", sh.name, sh.n, sh.k);
        for (int v = 0; v < NV; ++v) printf(" %10.0f", gbs[v]);
        printf(" %7.3f\n", worst);
        CK(cudaFree(dw)); CK(cudaFree(dx)); CK(cudaFree(dout));
    }

    // Part 2: the products of a whole 8B decode step as one graph (random bytes: timing only).
    const Shape layer[] = {{6144, 4096, 2, "qkv"}, {4096, 4096, 2, "o"}, {28672, 4096, 2, "gate+up"}, {4096, 14336, 2, "down"}};
    const int L = 32;
    uint64_t per_layer = 0;
    for (const Shape& s : layer) per_layer += (uint64_t)s.k / 32 * 18 * s.n;
    uint8_t* big;
    CK(cudaMalloc(&big, per_layer * L));
    {
        const std::vector<uint8_t> h = random_q4_0(rng, per_layer);
        for (int l = 0; l < L; ++l) CK(cudaMemcpy(big + per_layer * l, h.data(), per_layer, cudaMemcpyHostToDevice));
    }
    float *gx, *gy;
    CK(cudaMalloc(&gx, 14336 * 4));
    CK(cudaMalloc(&gy, 28672 * 4));
    CK(cudaMemset(gx, 0, 14336 * 4));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("part 2: a step's products (%.2f GB) as one graph, 32 layers\n%-11s %10s %8s %10s\n", per_layer * L / 1e9, "form", "step us", "GB/s", "us/layer");
    for (int rep = 0; rep < 2; ++rep)
        for (int v = 0; v < NV; ++v) {
            if (v == 5) continue;
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            uint64_t off = 0;
            for (int l = 0; l < L; ++l)
                for (const Shape& s : layer) {
                    launch(v, s.R, gx, big + off, gy, s.k, s.n, st);
                    off += (uint64_t)s.k / 32 * 18 * s.n;
                }
            CK(cudaStreamEndCapture(st, &gr));
            const double us = graph_us(gr, st, 20);
            printf("%-11s %10.1f %8.0f %10.2f\n", NAMES[v], us, per_layer * L / (us * 1e-6) / 1e9, us / L);
        }
    // Part 3: one persistent kernel over the same 128 products.
    {
        std::vector<Product> hp;
        uint64_t off = 0;
        for (int l = 0; l < L; ++l)
            for (const Shape& s : layer) {
                hp.push_back({big + off, s.k, s.n});
                off += (uint64_t)s.k / 32 * 18 * s.n;
            }
        Product* dp;
        unsigned* bar;
        CK(cudaMalloc(&dp, hp.size() * sizeof(Product)));
        CK(cudaMemcpy(dp, hp.data(), hp.size() * sizeof(Product), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&bar, 8));
        CK(cudaMemset(bar, 0, 8));
        const uint32_t smem = 14336 + 14336 / 4;
        printf("part 3: the same products in one persistent kernel, grid barriers between them\n");
        for (int rep = 0; rep < 2; ++rep)
            for (int pf = 0; pf < 2; ++pf) {
                auto go = [&]() {
                    if (pf) chain<true><<<sms, WARPS * 32, smem, st>>>(dp, (uint32_t)hp.size(), gx, gy, bar);
                    else chain<false><<<sms, WARPS * 32, smem, st>>>(dp, (uint32_t)hp.size(), gx, gy, bar);
                };
                go();
                CK(cudaGetLastError());
                cudaGraph_t gr;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                go();
                CK(cudaStreamEndCapture(st, &gr));
                const double us = graph_us(gr, st, 20);
                printf("%-11s %10.1f %8.0f %10.2f\n", pf ? "chain PF" : "chain", us, per_layer * L / (us * 1e-6) / 1e9, us / L);
            }
    }
    return 0;
}
