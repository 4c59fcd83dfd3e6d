// A standalone harness for a decode step's one-row Q4_0 products as a chain of graph nodes with
// programmatic edges, in two forms:
//   nvcc -O3 -arch=sm_90a -o matvec_stream benches/cuda/matvec_stream.cu && ./matvec_stream
//   reg: the in-tree form (`mm_q8_rows_pairs_q4_0`, as matvec_async.cu's reg<R, 2>): sixteen warps
//       a block and a block an SM, so the next product's blocks find no room on an SM until this
//       one's block there has left; each block waits for the kernel before, lets its dependents
//       start, quantizes the activation row into shared memory and reads its weights into
//       registers, R rows a warp at a time.
//   stream<S, B>: eight warps a block with at most 128 registers a thread and about 100 KB of
//       shared memory, so two blocks fit an SM: the block of the next product sits beside this
//       one's. Each block owns a run of whole rows, whose bytes are contiguous, and streams them
//       through a ring of S slots of B bytes by bulk copies (`cp.async.bulk`, the copy engine of
//       the SM: no registers, one instruction a slot, completion on an mbarrier). With EARLY the
//       first S copies are issued before the block's grid wait: the weights depend on nothing
//       the kernels before write, so a product's first S * B bytes an SM arrive while the
//       product before it still runs. A warp takes whole rows of a slot, a lane the pairs p =
//       lane + 32 j of a row in order: the same sums in the same order as reg, the same bits.
//   f<S, B> W<n>: stream<S, B> with n warps sharing each slot's work as (row, 32 pairs) items, a
//       row's partial sums added in order once the slot is done (other bits than reg's).
// Part 1 checks every form on each shape against a float64 reference within the int8 rounding
// bound and against reg bit for bit; part 1b times each shape alone, 20 launches as one graph;
// part 2 times the products of a whole decode step (the 8B's 32 layers and the 1B's 16 of qkv,
// o, gate+up, down; each layer's weights distinct) as one graph, forms alternately, twice, and
// again with a 6 us stand-in for the attention after each qkv product (`idle`, steps.cuh).
// Measured on an H100 (stop 62; docs/kernels.md item 48): every form within its bound, st<S, B>
// with reg's bits; two blocks an SM of every streamed form (`./matvec_stream 1`: part 1 and the
// occupancy only). A step's products, us: 8B reg 1,886 / reg plain 1,917-1,923 /
// st5x16 E 2,632-2,669 / st5x16 L 2,724-2,725 / st3x24 E 2,581-2,592 / f3x24 W12 2,486-2,491;
// 1B reg 419.5-419.9 / reg plain 381.8-383.2 / st3x24 E 463.8-464.5 / f3x24 W12 461.1-461.7.
// One shape alone, GB/s, reg / best streamed form: 8B gate+up 2,553 / 1,927, down 1,888 /
// 1,360, qkv 1,580 / 1,460, o 1,462 / 1,138. The stand-in added 212 us to reg's 8B step and to
// st5x16 L's, 116-162 to the early forms' (a third of it taken back by the copies issued before
// the wait), but a streamed product is slower than reg's alone at every shape: a block an SM of
// 8-12 warps behind one ring of bulk copies does not keep DRAM as busy as sixteen warps of
// register loads. Not taken in-tree.
#include "steps.cuh"

#define SW 8

// Shared memory of stream<S, B>: 128 bytes of mbarriers, the ring, the int8 row and its scales
// (k + k / 4 bytes), then FLAT's 128 partial sums.
template <int S, int B>
static constexpr uint32_t stream_smem(uint32_t k) { return 128 + S * B + k + k / 4 + 512; }

template <int S, int B, bool EARLY, int W = SW, bool FLAT = false>
__global__ void __launch_bounds__(W * 32, 2) stream(const float* x, const uint8_t* w, float* out, uint32_t k, uint32_t n) {
    extern __shared__ __align__(128) uint8_t sm[];
    uint64_t* bars = (uint64_t*)sm;
    uint8_t* ring = sm + 128;
    int* q = (int*)(ring + S * B);
    float2* ds = (float2*)(q + k / 4);
    const uint32_t rb = k / 32 * 18, cr = B / rb;
    const uint32_t r0 = (uint32_t)((uint64_t)n * blockIdx.x / gridDim.x);
    const uint32_t r1 = (uint32_t)((uint64_t)n * (blockIdx.x + 1) / gridDim.x);
    const uint32_t nrows = r1 - r0, chunks = (nrows + cr - 1) / cr;
    auto issue = [&](uint32_t c) {
        const uint32_t s = c % S, rows = min(cr, nrows - c * cr), bytes = rows * rb;
        const uint32_t bar = smem_addr(bars + s);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_addr(ring + (uint64_t)s * B)),
                     "l"(w + (uint64_t)(r0 + c * cr) * rb), "r"(bytes), "r"(bar)
                     : "memory");
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bars + s)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (EARLY)
            for (uint32_t c = 0; c < chunks && c < S; ++c) issue(c);
    }
    grid_wait();
    grid_release();
    if (!EARLY && threadIdx.x == 0)
        for (uint32_t c = 0; c < chunks && c < S; ++c) issue(c);
    quantize_row(x, k, q, ds, threadIdx.x, blockDim.x);
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const uint32_t pairs = k / 64, row_words = rb / 4, segs = (pairs + 31) / 32;
    float* part = (float*)(ds + k / 32);  // FLAT: 2 x 64 partial sums
    for (uint32_t c = 0; c < chunks; ++c) {
        const uint32_t s = c % S;
        mbar_wait(smem_addr(bars + s), (c / S) & 1);
        const uint32_t rows = min(cr, nrows - c * cr);
        const uint32_t* base = (const uint32_t*)(ring + (uint64_t)s * B);
        if constexpr (FLAT) {
            // Every warp takes (row, 32 pairs) items of the slot in turn; a row's partial sums
            // are added in order once the slot is done (other bits than reg's, same bound).
            float* pc = part + 64 * (c & 1);
            for (uint32_t i = warp; i < rows * segs; i += W) {
                const uint32_t r = i / segs, p = 32 * (i % segs) + lane;
                float a = p < pairs ? pair_dot(base + r * row_words + p * 9, q, ds, p) : 0.f;
                a = warp_sum(a);
                if (lane == 0) pc[i] = a;
            }
            __syncthreads();
            if (threadIdx.x < rows) {
                float a = 0.f;
                for (uint32_t j = 0; j < segs; ++j) a += pc[threadIdx.x * segs + j];
                out[r0 + c * cr + threadIdx.x] = a;
            }
            if (threadIdx.x == W * 32 - 1 && c + S < chunks) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue(c + S);
            }
        } else {
            for (uint32_t r = warp; r < rows; r += W) {
                const uint32_t* wr = base + r * row_words;
                float a = 0.f;
                for (uint32_t p = lane; p < pairs; p += 32) a += pair_dot(wr + p * 9, q, ds, p);
                a = warp_sum(a);
                if (lane == 0) out[r0 + c * cr + r] = a;
            }
            __syncthreads();
            if (threadIdx.x == 0 && c + S < chunks) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue(c + S);
            }
        }
    }
}

static int sms = 132;

template <typename... Args, typename... Vals>
static void launch_ex(void (*kern)(Args...), uint32_t grid, uint32_t threads, uint32_t smem, cudaStream_t st, bool pdl,
                      Vals... v) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, kern, (Args)v...));
}

const int NV = 7;
const char* NAMES[NV] = {"reg", "reg plain", "st5x16 E", "st3x24 E", "f3x24 W8", "f3x24 W12", "f5x16 W12"};

template <int S, int B, bool E, int W = SW, bool F = false>
static void stream_launch(const float* x, const uint8_t* w, float* o, uint32_t k, uint32_t n, cudaStream_t st) {
    static bool set = false;
    if (!set) {
        CK(cudaFuncSetAttribute(stream<S, B, E, W, F>, cudaFuncAttributeMaxDynamicSharedMemorySize, stream_smem<S, B>(14336)));
        CK(cudaFuncSetAttribute(stream<S, B, E, W, F>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        set = true;
    }
    launch_ex(stream<S, B, E, W, F>, sms, W * 32, stream_smem<S, B>(k), st, true, x, w, o, k, n);
}

// R: rows a warp of reg takes at a time (the in-tree choice: two where the grid's warps have
// more than one group of two rows each, else one).
static void launch(int v, int R, const float* x, const uint8_t* w, float* o, uint32_t k, uint32_t n, cudaStream_t st = 0) {
    const uint32_t base = k + k / 4;
    switch (v) {
    case 0:
    case 1:
        if (R == 2) launch_ex(reg<2>, sms, RW * 32, base, st, v == 0, x, w, o, k, n, 1.0f);
        else launch_ex(reg<1>, sms, RW * 32, base, st, v == 0, x, w, o, k, n, 1.0f);
        break;
    case 2: stream_launch<5, 16384, true>(x, w, o, k, n, st); break;
    case 3: stream_launch<3, 24576, true>(x, w, o, k, n, st); break;
    case 4: stream_launch<3, 24576, true, 8, true>(x, w, o, k, n, st); break;
    case 5: stream_launch<3, 24576, true, 12, true>(x, w, o, k, n, st); break;
    case 6: stream_launch<5, 16384, true, 12, true>(x, w, o, k, n, st); break;
    }
}

struct Shape { uint32_t n, k; int R; const char* name; };

int main(int argc, char**) {
    sms = print_device();
    const Shape shapes[] = {{6144, 4096, 2, "8B qkv"}, {4096, 4096, 2, "8B o"}, {28672, 4096, 2, "8B gate+up"},
                            {4096, 14336, 2, "8B down"}, {3072, 2048, 2, "1B qkv"}, {2048, 2048, 1, "1B o"},
                            {16384, 2048, 2, "1B gate+up"}, {2048, 8192, 1, "1B down"}, {1000, 4096, 1, "odd 1000"}};
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    // Part 1 launches every form first (their attributes set outside any capture).
    printf("part 1: each form against a float64 reference (worst |error| / int8 rounding bound) and reg's bits\n");
    for (const Shape& sh : shapes) {
        Q4Case c = q4_case(rng, sh.k, sh.n);
        std::vector<float> got(sh.n), first(sh.n);
        printf("%-11s", sh.name);
        for (int v = 0; v < NV; ++v) {
            got = poisoned_run([&] { launch(v, sh.R, c.dx, c.dw, c.dout, sh.k, sh.n); }, c.dout, sh.n);
            const double worst = worst_over_bound(got, c.refs, sh.n);
            if (v == 0) first = got;
            const bool same = memcmp(first.data(), got.data(), sh.n * 4) == 0;
            printf(" %s %.3f%s", NAMES[v], worst, same ? "" : " NOT reg's bits");
        }
        printf("\n");
        free_case(c);
    }

    {
        // After part 1: every form has been launched, so its shared-memory limit is raised.
        int a = 0, b = 0, c = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&a, stream<5, 16384, true>, SW * 32, stream_smem<5, 16384>(14336)));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, stream<3, 24576, true, 12, true>, 12 * 32, stream_smem<3, 24576>(14336)));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, stream<5, 16384, true, 12, true>, 12 * 32, stream_smem<5, 16384>(14336)));
        printf("blocks an SM at k = 14336: st5x16 %d, f3x24 W12 %d, f5x16 W12 %d\n", a, b, c);
    }
    if (argc > 1) return 0;  // part 1 only
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *gx, *gy;
    CK(cudaMalloc(&gx, 14336 * 4));
    CK(cudaMalloc(&gy, 28672 * 4));
    {
        std::vector<float> hx(14336);
        for (auto& v : hx) v = uni(rng);
        CK(cudaMemcpy(gx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    table_head("part 1b: GB/s of one shape, 20 launches as one graph (programmatic edges but reg plain), copies past L2", NAMES, NV, 10, "");
    for (const Shape& sh : shapes) {
        if (sh.n == 1000) continue;
        const uint64_t bytes = (uint64_t)sh.k / 32 * 18 * sh.n;
        const int copies = copies_past_l2(bytes);
        uint8_t* dw = upload(random_q4_0(rng, bytes), copies);
        printf("%-11s %6u %6u", sh.name, sh.n, sh.k);
        for (int v = 0; v < NV; ++v) {
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < 20; ++i) launch(v, sh.R, gx, dw + bytes * (i % copies), gy, sh.k, sh.n, st);
            CK(cudaStreamEndCapture(st, &gr));
            const double us = graph_us(gr, st, 10) / 20;
            printf(" %10.0f", bytes / (us * 1e-6) / 1e9);
        }
        printf("\n");
        CK(cudaFree(dw));
    }
    struct Step { const char* name; int layers; Shape layer[4]; };
    const Step steps[] = {
        {"8B", 32, {{6144, 4096, 2, "qkv"}, {4096, 4096, 2, "o"}, {28672, 4096, 2, "gate+up"}, {4096, 14336, 2, "down"}}},
        {"1B", 16, {{3072, 2048, 2, "qkv"}, {2048, 2048, 1, "o"}, {16384, 2048, 2, "gate+up"}, {2048, 8192, 1, "down"}}},
    };
    for (const Step& sp : steps) {
        uint64_t per_layer = 0;
        for (const Shape& s : sp.layer) per_layer += (uint64_t)s.k / 32 * 18 * s.n;
        uint8_t* big;
        CK(cudaMalloc(&big, per_layer * sp.layers));
        {
            const std::vector<uint8_t> h = random_q4_0(rng, per_layer);
            for (int l = 0; l < sp.layers; ++l) CK(cudaMemcpy(big + per_layer * l, h.data(), per_layer, cudaMemcpyHostToDevice));
        }
        printf("part 2: the %s step's products (%.2f GB) as one graph, %d layers\n%-11s %10s %8s %10s\n", sp.name,
               per_layer * sp.layers / 1e9, sp.layers, "form", "step us", "GB/s", "us/layer");
        // Without and with a 6 us stand-in for the attention after each qkv product.
        for (int att = 0; att < 2; ++att)
            for (int rep = 0; rep < 2; ++rep)
                for (int v = 0; v < NV; ++v) {
                    cudaGraph_t gr;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                    uint64_t off = 0;
                    for (int l = 0; l < sp.layers; ++l)
                        for (int i = 0; i < 4; ++i) {
                            const Shape& s = sp.layer[i];
                            launch(v, s.R, gx, big + off, gy, s.k, s.n, st);
                            off += (uint64_t)s.k / 32 * 18 * s.n;
                            if (att && i == 0) launch_ex(idle, sms, SW * 32, 0, st, true, 6000u);
                        }
                    CK(cudaStreamEndCapture(st, &gr));
                    const double us = graph_us(gr, st, 20);
                    printf("%-11s %s %10.1f %8.0f %10.2f\n", NAMES[v], att ? "+att" : "    ", us,
                           per_layer * sp.layers / (us * 1e-6) / 1e9, us / sp.layers);
                }
        CK(cudaFree(big));
    }
    return 0;
}
