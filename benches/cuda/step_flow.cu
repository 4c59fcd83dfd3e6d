// A standalone harness: a decode step's one-row Q4_0 products (int8 activations, a lane per pair
// of blocks as in-tree) in one persistent kernel whose weights stream into shared memory ahead of
// the products' dependencies, against the in-tree launch shape as graph nodes:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o step_flow benches/cuda/step_flow.cu && ./step_flow
//   reg b8: reg with its prologue's loads in one batch (reg<R, 8>), as the in-tree prologue.
//   reg: the in-tree form (steps.cuh's reg<R>), a graph node a product with programmatic
//       edges: sixteen warps a block, a block an SM; each block waits for the kernel before,
//       quantizes the activation row and reads its weights into registers.
//   flow<C, AHEAD>: one launch for every product of the step, a block an SM: C consumer warps and
//       one producer warp. Each block owns the same share of each product's rows as reg's grid
//       would spread (a contiguous run of whole rows), and its producer lane streams those rows,
//       product after product, through a ring of S slots of B bytes (12 of 16 KiB) by bulk copies
//       (`cp.async.bulk`, completion on a "full" mbarrier a slot; the consumers free a slot on its
//       "empty" mbarrier). The products are ordered by a software grid barrier (a monotonic
//       arrival counter: a block adds one after writing a product's outputs, and the next product
//       starts once every block has arrived). With AHEAD the producer does not wait for that
//       barrier: the next products' first S * B bytes an SM arrive while the barrier, the
//       row's quantization and the attention stand-in run, so DRAM is not idle there. Without
//       AHEAD it waits for the barrier as the consumers do (a persistent kernel that streams).
//       The consumers take a slot's (row, 32 pairs) items in turn, a row's partial sums added in
//       order at the product's end (other bits than reg's, the same int8 bound).
//   f16 6x32K: flow16 ahead with the ring as six slots of 32 KiB (stop 64 also ran flow8, flow12
//       and 24 slots of 8 KiB: all slower).
//   w12 12x16K, w12 24x8K, w16 16x12K, w8 24x8K: flow_w<C, SLOTS, SLOT_BYTES>, the same stream
//       ahead, but each consumer warp owns whole slots and sums every row of its chunks alone;
//       its prologue loads the row in one batch.
//   w12 pf8, w12 pf16: w12 12x16K whose producer also keeps the L2 asked (bulk prefetches) for
//       the 8 or 16 chunks after the one it copies, so DRAM reads on while the ring is full.
//   w12 noq: w12 12x16K without the row's quantization (wrong sums; the prologue's price).
//   flow16 nc: flow16 ahead's stream with no arithmetic (the consumers free each slot as it
//       lands): what the copies alone reach; nc pf16: the same with w12 pf16's prefetches.
//   barriers: the grid barriers and stand-in stages alone (no weights, no sums).
//   +att: a 6 us stand-in for the decode attention after each qkv product (reg: an idle node; flow:
//       an idle stage between two barriers).
// Part 1 checks one product of several shapes against a float64 reference within the int8
// rounding bound, for reg and every flow that writes outputs. Part 2 runs the products of a
// whole 8B and 1B step and then their output head (Q4_0, 128,256 rows; each layer's weights
// distinct, the outputs chained: a product reads the one before's outputs, scaled to unit size),
// checks the flows' and reg b8's last outputs against reg's, and times each form as a graph,
// alternately, twice. Part 3 times a kernel boundary against a grid barrier (128 empty stages
// each way).
// Status (docs/kernels.md item 49): run twice at stop 64 on an H100 80GB HBM3. The second run,
// the 8B's products and head: reg 2,010 us, flow16 ahead 2,195, the flow_w forms 2,299-2,626,
// the L2 prefetches 2,780-3,557, w12 noq 2,251, the copies alone 1,547, the barriers alone 149;
// the 1B's reg 477, flow16 ahead 520, copies 306. Part 3: a kernel boundary 0.69 us, a grid
// barrier 1.29. No persistent form came near the graph of register-form products: closed.
// (That run's reg b8 and flow_w quantized every round of their batch, since fixed in
// quantize_row; w12 noq, with no prologue, still lost.)
#include "steps.cuh"

#define KMAX 14336
#define PART 2048

// One stage of flow: a product (w set) or an idle stage of idle_ns.
struct Product {
    const uint8_t* w;
    const float* x;
    float* out;
    uint32_t k, n;
    float scale;
    uint32_t idle_ns;
};

// A block's share of a product: rows r0 .. r0 + nrows, rb bytes a row, cr rows a slot.
struct Share {
    uint32_t r0, nrows, rb, cr, chunks;
};
template <int SLOT_BYTES>
__device__ __forceinline__ Share share_of(const Product& p) {
    Share s;
    s.rb = p.k / 32 * 18;
    s.r0 = (uint32_t)((uint64_t)p.n * blockIdx.x / gridDim.x);
    s.nrows = (uint32_t)((uint64_t)p.n * (blockIdx.x + 1) / gridDim.x) - s.r0;
    s.cr = SLOT_BYTES / s.rb;
    s.chunks = (s.nrows + s.cr - 1) / s.cr;
    return s;
}

// Spins until the arrival counter reaches `target` (an acquire at GPU scope).
__device__ __forceinline__ void wait_arrivals(const unsigned* a, unsigned target) {
    unsigned v;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
    } while (v < target);
}

__device__ __forceinline__ void consumers_sync(uint32_t threads) {
    asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}

// The L2 prefetch cursor of a producer: chunk c of product i (i == count at the end), its weights
// and this block's share of them.
struct Ahead {
    uint32_t i, c;
    const uint8_t* w;
    Share sh;
};

// Moves a to the first chunk of product a.i or the next product with weights and rows here.
template <int SLOT_BYTES>
__device__ __forceinline__ void ahead_enter(const Product* prods, uint32_t count, Ahead& a) {
    for (; a.i < count; ++a.i) {
        const Product p = prods[a.i];
        if (!p.w) continue;
        a.w = p.w;
        a.sh = share_of<SLOT_BYTES>(p);
        a.c = 0;
        if (a.sh.chunks) return;
    }
}

// Asks L2 for a's chunk (`cp.async.bulk.prefetch.L2`: no shared memory, no completion) and
// moves a to the next chunk.
template <int SLOT_BYTES>
__device__ __forceinline__ void ahead_step(const Product* prods, uint32_t count, Ahead& a) {
    const uint32_t rows = min(a.sh.cr, a.sh.nrows - a.c * a.sh.cr);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a.w + (uint64_t)(a.sh.r0 + a.c * a.sh.cr) * a.sh.rb),
                 "r"(rows * a.sh.rb)
                 : "memory");
    if (++a.c == a.sh.chunks) {
        ++a.i;
        ahead_enter<SLOT_BYTES>(prods, count, a);
    }
}

// The producer lane: streams every product's share of rows through the ring of SLOTS slots, in
// order (g counts the chunks of the whole launch); without AHEAD it waits for each product's
// barrier. With PF > 0 it also keeps the L2 asked for the PF chunks after the one it copies, so
// DRAM goes on reading while the ring is full and the consumers wait at a barrier.
template <bool AHEAD, int SLOTS, int SLOT_BYTES, int PF = 0>
__device__ __forceinline__ void produce(const Product* prods, uint32_t count, const unsigned* arrivals,
                                        uint64_t* full, uint64_t* empty, uint8_t* ring) {
    uint32_t g = 0, ga = 0;
    Ahead a{0, 0, nullptr, {}};
    if (PF) ahead_enter<SLOT_BYTES>(prods, count, a);
    for (uint32_t i = 0; i < count; ++i) {
        const Product pr = prods[i];
        if (!pr.w) continue;
        if (!AHEAD && i > 0) wait_arrivals(arrivals, gridDim.x * i);
        const Share sh = share_of<SLOT_BYTES>(pr);
        for (uint32_t c = 0; c < sh.chunks; ++c, ++g) {
            const uint32_t s = g % SLOTS, rows = min(sh.cr, sh.nrows - c * sh.cr), bytes = rows * sh.rb;
            for (; PF && a.i < count && ga <= g + PF; ++ga) ahead_step<SLOT_BYTES>(prods, count, a);
            if (g >= SLOTS) mbar_wait(smem_addr(empty + s), (g / SLOTS - 1) & 1);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const uint32_t bar = smem_addr(full + s);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                    smem_addr(ring + (uint64_t)s * SLOT_BYTES)),
                "l"(pr.w + (uint64_t)(sh.r0 + c * sh.cr) * sh.rb), "r"(bytes), "r"(bar)
                : "memory");
        }
    }
}

// Shared memory of every flow: 512 bytes of mbarriers, a 192 KiB ring, the int8 row, the partial sums.
static constexpr uint32_t FLOW_SMEM = 512 + 196608 + KMAX + KMAX / 4 + PART * 4;

// A flow's shared memory carved from `sm`, its SLOTS full mbarriers (one arrival and the bytes)
// and empty ones (`frees` arrivals) initialized by thread 0; every thread returns after a block
// barrier.
struct Ring {
    uint64_t *full, *empty;
    uint8_t* ring;
    int* q;
    float2* ds;
    float* part;
};
template <int SLOTS>
__device__ __forceinline__ Ring ring_setup(uint8_t* sm, uint32_t frees) {
    Ring r;
    r.full = (uint64_t*)sm;
    r.empty = r.full + SLOTS;
    r.ring = sm + 512;
    r.q = (int*)(r.ring + 196608);
    r.ds = (float2*)((uint8_t*)r.q + KMAX);
    r.part = (float*)((uint8_t*)r.ds + KMAX / 4);
    if (threadIdx.x == 0) {
        for (int s = 0; s < SLOTS; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(r.full + s)) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(r.empty + s)), "r"(frees) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    return r;
}

// A consumer stage's start: the wait for every block's arrival from the stage before (i > 0),
// then the stand-in's spin where the stage has no weights; true where it is a product.
__device__ __forceinline__ bool stage_begin(const Product& pr, uint32_t i, const unsigned* arrivals, uint32_t T) {
    if (i > 0) {
        if (threadIdx.x == 0) wait_arrivals(arrivals, gridDim.x * i);
        consumers_sync(T);
    }
    if (!pr.w && threadIdx.x == 0) spin_ns(pr.idle_ns);
    return pr.w != nullptr;
}

// A consumer stage's end: every consumer done, then this block's arrival (its outputs released).
__device__ __forceinline__ void stage_end(unsigned* arrivals, uint32_t T) {
    consumers_sync(T);
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrivals, 1u);
    }
}

template <int C, bool AHEAD, bool COMPUTE, int SLOTS = 12, int SLOT_BYTES = 16384, int PF = 0>
__global__ void __launch_bounds__((C + 1) * 32, 1)
    flow(const Product* prods, uint32_t count, unsigned* arrivals) {
    extern __shared__ __align__(128) uint8_t sm[];
    const Ring rg = ring_setup<SLOTS>(sm, C);
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31, T = C * 32;
    if (warp == C) {
        if (lane == 0) produce<AHEAD, SLOTS, SLOT_BYTES, PF>(prods, count, arrivals, rg.full, rg.empty, rg.ring);
        return;
    }
    uint32_t g = 0;
    for (uint32_t i = 0; i < count; ++i) {
        const Product pr = prods[i];
        if (stage_begin(pr, i, arrivals, T)) {
            if (COMPUTE) {
                quantize_row<1, true>(pr.x, pr.k, rg.q, rg.ds, threadIdx.x, T);
                consumers_sync(T);
            }
            const Share sh = share_of<SLOT_BYTES>(pr);
            const uint32_t pairs = pr.k / 64, row_words = sh.rb / 4, segs = (pairs + 31) / 32;
            for (uint32_t c = 0; c < sh.chunks; ++c, ++g) {
                const uint32_t s = g % SLOTS, rows = min(sh.cr, sh.nrows - c * sh.cr);
                mbar_wait(smem_addr(rg.full + s), (g / SLOTS) & 1);
                if (COMPUTE) {
                    const uint32_t* base = (const uint32_t*)(rg.ring + (uint64_t)s * SLOT_BYTES);
                    for (uint32_t it = warp; it < rows * segs; it += C) {
                        const uint32_t r = it / segs, p = 32 * (it % segs) + lane;
                        float a = p < pairs ? pair_dot(base + r * row_words + p * 9, rg.q, rg.ds, p) : 0.f;
                        a = warp_sum(a);
                        if (lane == 0) rg.part[(c * sh.cr + r) * segs + it % segs] = a;
                    }
                }
                __syncwarp();
                if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(rg.empty + s)) : "memory");
            }
            consumers_sync(T);
            for (uint32_t t = threadIdx.x; t < sh.nrows; t += T) {
                float a = 0.f;
                if (COMPUTE)
                    for (uint32_t j = 0; j < segs; ++j) a += rg.part[t * segs + j];
                pr.out[sh.r0 + t] = a * pr.scale;
            }
        }
        stage_end(arrivals, T);
    }
}

// flow_w<C, SLOTS, SLOT_BYTES>: flow16 ahead's stream, but a consumer warp owns whole slots (slot
// s belongs to warp s % C, SLOTS a multiple of C) and sums every row of its chunk by itself, so C
// chunks are summed at once rather than each chunk by every warp in turn; a slot is freed by its
// one warp, and each row's sum is one value (no per-segment partials). Without QUANT the
// consumers skip the row's quantization and sum against whatever int8 row shared memory holds
// (wrong sums, right timing: what a row quantized by its producer could save at most).
template <int C, int SLOTS, int SLOT_BYTES, int PF = 0, bool QUANT = true>
__global__ void __launch_bounds__((C + 1) * 32, 1)
    flow_w(const Product* prods, uint32_t count, unsigned* arrivals) {
    static_assert(SLOTS % C == 0, "a consumer warp owns whole slots");
    extern __shared__ __align__(128) uint8_t sm[];
    const Ring rg = ring_setup<SLOTS>(sm, 1);
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x & 31, T = C * 32;
    if (warp == C) {
        if (lane == 0) produce<true, SLOTS, SLOT_BYTES, PF>(prods, count, arrivals, rg.full, rg.empty, rg.ring);
        return;
    }
    uint32_t g0 = 0;  // the chunks of the products before this one
    for (uint32_t i = 0; i < count; ++i) {
        const Product pr = prods[i];
        if (stage_begin(pr, i, arrivals, T)) {
            if (QUANT) {
                quantize_row<8, true>(pr.x, pr.k, rg.q, rg.ds, threadIdx.x, T);
                consumers_sync(T);
            }
            const Share sh = share_of<SLOT_BYTES>(pr);
            const uint32_t pairs = pr.k / 64, row_words = sh.rb / 4;
            for (uint32_t c = (warp + C - g0 % C) % C; c < sh.chunks; c += C) {
                const uint32_t g = g0 + c, s = g % SLOTS, rows = min(sh.cr, sh.nrows - c * sh.cr);
                mbar_wait(smem_addr(rg.full + s), (g / SLOTS) & 1);
                const uint32_t* base = (const uint32_t*)(rg.ring + (uint64_t)s * SLOT_BYTES);
                for (uint32_t r = 0; r < rows; ++r) {
                    float a = 0.f;
                    for (uint32_t p = lane; p < pairs; p += 32) a += pair_dot(base + r * row_words + p * 9, rg.q, rg.ds, p);
                    a = warp_sum(a);
                    if (lane == 0) rg.part[c * sh.cr + r] = a;
                }
                __syncwarp();
                if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(rg.empty + s)) : "memory");
            }
            g0 += sh.chunks;
            consumers_sync(T);
            for (uint32_t t = threadIdx.x; t < sh.nrows; t += T) pr.out[sh.r0 + t] = rg.part[t] * pr.scale;
        }
        stage_end(arrivals, T);
    }
}

// The grid barriers of a flow and its stand-in stages alone: no weights, no sums (what the
// chain of barriers costs a step by itself).
__global__ void __launch_bounds__(17 * 32, 1) barriers(const Product* prods, uint32_t count, unsigned* arrivals) {
    for (uint32_t i = 0; i < count; ++i) {
        stage_begin(prods[i], i, arrivals, blockDim.x);
        stage_end(arrivals, blockDim.x);
    }
}

// A byte of two quants with 0 (the value -8) made 8 (the value 0): quants from -7 to 7 with a
// mean of zero, so a chain of products does not grow the rows' common part (with -8 in, each
// weight's mean is -d/2 and a chained row's mean grows about 0.1 sqrt(k) times a product).
__device__ __forceinline__ uint8_t balanced(uint8_t b) {
    if ((b & 15) == 0) b |= 8;
    if ((b >> 4) == 0) b |= 0x80;
    return b;
}
// Q4_0 weights of `blocks` blocks from a hash of (seed, block): scale in [0.01, 0.05], balanced quants.
__device__ __forceinline__ uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__global__ void fill_q4_0(uint8_t* w, uint64_t blocks, uint64_t seed) {
    for (uint64_t b = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; b < blocks; b += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t h0 = mix(seed * 0x9e3779b97f4a7c15ull + 2 * b), h1 = mix(h0 + 1), h2 = mix(h0 + 2);
        const __half d = __float2half(0.01f + 0.04f * (float)(h0 >> 40) / (float)(1ull << 24));
        uint8_t* p = w + b * 18;
        memcpy(p, &d, 2);
        for (int j = 0; j < 8; ++j) p[2 + j] = balanced((uint8_t)(h1 >> (8 * j)));
        for (int j = 0; j < 8; ++j) p[10 + j] = balanced((uint8_t)(h2 >> (8 * j)));
    }
}

static int sms = 132;

// reg's launch of one stage (the stand-in `idle` where it has no weights); b8: the prologue in
// one batch of eight rounds (reg<R, 8>) rather than a round trip a round.
static void launch_reg(const Product& p, int R, cudaStream_t st, bool b8 = false) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(p.w ? sms : sms);
    cfg.blockDim = dim3(p.w ? RW * 32 : 256);
    cfg.dynamicSmemBytes = p.w ? p.k + p.k / 4 : 0;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    if (!p.w) CK(cudaLaunchKernelEx(&cfg, idle, p.idle_ns));
    else if (R == 2) CK(cudaLaunchKernelEx(&cfg, b8 ? reg<2, 8> : reg<2>, p.x, p.w, p.out, p.k, p.n, p.scale));
    else CK(cudaLaunchKernelEx(&cfg, b8 ? reg<1, 8> : reg<1>, p.x, p.w, p.out, p.k, p.n, p.scale));
}

// The forms; the first NCHECK write outputs (checked), the rest only stream or only wait.
const int NF = 13, NCHECK = 9;
const char* FLOWS[NF] = {"flow16 ahead", "flow16 after", "f16 6x32K", "w12 12x16K", "w12 24x8K",
                         "w16 16x12K",   "w8 24x8K",     "w12 pf8",   "w12 pf16",   "w12 noq",
                         "flow16 nc",    "nc pf16",      "barriers"};

// A form's name: -2 reg b8, -1 reg, then FLOWS.
static const char* form_name(int v) { return v == -2 ? "reg b8" : v == -1 ? "reg" : FLOWS[v]; }

static void launch_flow(int v, const Product* dp, uint32_t count, unsigned* arr, cudaStream_t st) {
    CK(cudaMemsetAsync(arr, 0, 4, st));
    switch (v) {
    case 0: flow<16, true, true><<<sms, 17 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 1: flow<16, false, true><<<sms, 17 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 2: flow<16, true, true, 6, 32768><<<sms, 17 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 3: flow_w<12, 12, 16384><<<sms, 13 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 4: flow_w<12, 24, 8192><<<sms, 13 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 5: flow_w<16, 16, 12288><<<sms, 17 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 6: flow_w<8, 24, 8192><<<sms, 9 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 7: flow_w<12, 12, 16384, 8><<<sms, 13 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 8: flow_w<12, 12, 16384, 16><<<sms, 13 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 9: flow_w<12, 12, 16384, 0, false><<<sms, 13 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 10: flow<16, true, false><<<sms, 17 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 11: flow<16, true, false, 12, 16384, 16><<<sms, 17 * 32, FLOW_SMEM, st>>>(dp, count, arr); break;
    case 12: barriers<<<sms, 17 * 32, 0, st>>>(dp, count, arr); break;
    }
    CK(cudaGetLastError());
}

template <typename K>
static void raise_smem(K k) {
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, FLOW_SMEM));
}

struct Shape { uint32_t n, k; int R; const char* name; };

int main() {
    sms = print_device();
    raise_smem(flow<16, true, true>);
    raise_smem(flow<16, false, true>);
    raise_smem(flow<16, true, true, 6, 32768>);
    raise_smem(flow_w<12, 12, 16384>);
    raise_smem(flow_w<12, 24, 8192>);
    raise_smem(flow_w<16, 16, 12288>);
    raise_smem(flow_w<8, 24, 8192>);
    raise_smem(flow_w<12, 12, 16384, 8>);
    raise_smem(flow_w<12, 12, 16384, 16>);
    raise_smem(flow_w<12, 12, 16384, 0, false>);
    raise_smem(flow<16, true, false>);
    raise_smem(flow<16, true, false, 12, 16384, 16>);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned* arr;
    CK(cudaMalloc(&arr, 4));
    Product* dp;
    CK(cudaMalloc(&dp, 512 * sizeof(Product)));
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);

    // Part 1: one product, each form against the float64 reference.
    printf("part 1: one product, worst |error| / int8 rounding bound over 64 rows (reg, then each flow)\n");
    const Shape shapes[] = {{6144, 4096, 2, "8B qkv"}, {4096, 14336, 2, "8B down"}, {28672, 4096, 2, "8B gate+up"},
                            {2048, 8192, 1, "1B down"}, {2048, 2048, 1, "1B o"}, {1000, 4096, 1, "odd 1000"}};
    for (const Shape& sh : shapes) {
        Q4Case c = q4_case(rng, sh.k, sh.n);
        const Product p{c.dw, c.dx, c.dout, sh.k, sh.n, 1.0f, 0};
        CK(cudaMemcpy(dp, &p, sizeof p, cudaMemcpyHostToDevice));
        printf("%-11s", sh.name);
        for (int v = -1; v < NCHECK; ++v) {
            const std::vector<float> got = poisoned_run(
                [&] {
                    if (v < 0) launch_reg(p, sh.R, st);
                    else launch_flow(v, dp, 1, arr, st);
                    CK(cudaStreamSynchronize(st));
                },
                c.dout, sh.n);
            printf(" %s %.3f", v < 0 ? "reg" : FLOWS[v], worst_over_bound(got, c.refs, sh.n));
        }
        printf("\n");
        free_case(c);
    }

    // Each step's layers, then its output head (Q4_0 here; the 1B's in-tree head is Q8_0).
    struct Step { const char* name; int layers; Shape layer[4]; Shape head; };
    const Step steps[] = {
        {"8B", 32, {{6144, 4096, 2, "qkv"}, {4096, 4096, 2, "o"}, {28672, 4096, 2, "gate+up"}, {4096, 14336, 2, "down"}},
         {128256, 4096, 2, "head"}},
        {"1B", 16, {{3072, 2048, 2, "qkv"}, {2048, 2048, 1, "o"}, {16384, 2048, 2, "gate+up"}, {2048, 8192, 1, "down"}},
         {128256, 2048, 2, "head"}},
    };
    const uint32_t widest = 128256;
    float *ba, *bb;
    CK(cudaMalloc(&ba, widest * 4));
    CK(cudaMalloc(&bb, widest * 4));
    std::vector<float> x0(widest);
    for (auto& v : x0) v = uni(rng);
    for (const Step& sp : steps) {
        uint64_t per_layer = 0;
        for (const Shape& s : sp.layer) per_layer += (uint64_t)s.k / 32 * 18 * s.n;
        const uint64_t total = per_layer * sp.layers + (uint64_t)sp.head.k / 32 * 18 * sp.head.n;
        uint8_t* big;
        CK(cudaMalloc(&big, total));
        fill_q4_0<<<1024, 256>>>(big, total / 18, 77);
        CK(cudaDeviceSynchronize());
        // The chain, without and with the attention stand-in; R of each product for reg.
        for (int att = 0; att < 2; ++att) {
            std::vector<Product> hp;
            std::vector<int> rs;
            uint64_t off = 0;
            float *cur = ba, *nxt = bb;
            for (int l = 0; l <= sp.layers; ++l)
                for (int i = 0; i < (l < sp.layers ? 4 : 1); ++i) {
                    const Shape& s = l < sp.layers ? sp.layer[i] : sp.head;
                    // 0.134: the rms of a weight (scale rms 0.032 times the balanced quants' rms 4.18).
                    hp.push_back({big + off, cur, nxt, s.k, s.n, 1.0f / (0.134f * sqrtf((float)s.k)), 0});
                    rs.push_back(s.R);
                    std::swap(cur, nxt);
                    off += (uint64_t)s.k / 32 * 18 * s.n;
                    if (att && i == 0 && l < sp.layers) {
                        hp.push_back({nullptr, nullptr, nullptr, 0, 0, 0.f, 6000});
                        rs.push_back(0);
                    }
                }
            CK(cudaMemcpy(dp, hp.data(), hp.size() * sizeof(Product), cudaMemcpyHostToDevice));
            const uint32_t count = (uint32_t)hp.size();
            // The last outputs of reg and of each flow from the same first row.
            const uint32_t last_n = sp.head.n;
            float* last = hp.back().out;
            auto run_once = [&](int v) {
                CK(cudaMemcpy(ba, x0.data(), x0.size() * 4, cudaMemcpyHostToDevice));
                if (v < 0)
                    for (size_t j = 0; j < hp.size(); ++j) launch_reg(hp[j], rs[j], st, v == -2);
                else launch_flow(v, dp, count, arr, st);
                CK(cudaStreamSynchronize(st));
                std::vector<float> o(last_n);
                CK(cudaMemcpy(o.data(), last, last_n * 4, cudaMemcpyDeviceToHost));
                return o;
            };
            const std::vector<float> ref = run_once(-1);
            double rms = 0;
            for (float v : ref) rms += (double)v * v;
            rms = sqrt(rms / last_n);
            printf("part 2: the %s step's products and head%s (%.2f GB, %d layers); last outputs' rms %.3f\n",
                   sp.name, att ? " + a 6 us attention stand-in after each qkv" : "", total / 1e9, sp.layers, rms);
            for (int v = -2; v < NCHECK; ++v) {
                if (v == -1) continue;
                const std::vector<float> got = run_once(v);
                double worst = 0;
                for (uint32_t j = 0; j < last_n; ++j) worst = std::max(worst, (double)fabsf(got[j] - ref[j]));
                printf("  %-13s last outputs' worst |difference| from reg's %.3e (%.2e of their rms)\n", form_name(v),
                       worst, worst / rms);
            }
            printf("  %-13s %10s %8s %10s\n", "form", "step us", "GB/s", "us/layer");
            for (int rep = 0; rep < 2; ++rep)
                for (int v = -2; v < NF; ++v) {
                    cudaGraph_t gr;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                    if (v < 0)
                        for (size_t j = 0; j < hp.size(); ++j) launch_reg(hp[j], rs[j], st, v == -2);
                    else launch_flow(v, dp, count, arr, st);
                    CK(cudaStreamEndCapture(st, &gr));
                    const double us = graph_us(gr, st, 20);
                    printf("  %-13s %10.1f %8.0f %10.2f\n", form_name(v), us,
                           total / (us * 1e-6) / 1e9, us / sp.layers);
                }
        }
        CK(cudaFree(big));
    }

    // Part 3: 128 empty stages, as graph nodes with programmatic edges (idle(0), a block an SM)
    // and as grid barriers inside one kernel (`barriers`): a kernel boundary against a barrier.
    const std::vector<Product> empties(128, Product{nullptr, nullptr, nullptr, 0, 0, 0.f, 0});
    CK(cudaMemcpy(dp, empties.data(), empties.size() * sizeof(Product), cudaMemcpyHostToDevice));
    printf("part 3: 128 empty stages, us a stage (kernel boundaries, grid barriers)\n");
    for (int rep = 0; rep < 2; ++rep) {
        double us[2];
        for (int v = 0; v < 2; ++v) {
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            if (v == 0)
                for (const Product& e : empties) launch_reg(e, 0, st);
            else launch_flow(NF - 1, dp, (uint32_t)empties.size(), arr, st);
            CK(cudaStreamEndCapture(st, &gr));
            us[v] = graph_us(gr, st, 20) / empties.size();
        }
        printf("  boundary %.3f  barrier %.3f\n", us[0], us[1]);
    }
    return 0;
}
