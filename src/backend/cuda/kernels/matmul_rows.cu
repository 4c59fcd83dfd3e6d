// The row-invariant products of a batched decode step (compiled after matmul.cu, in its family;
// src/ops/matmul_rows.rs says why): out[r, o] = x[r] . W[o], where a row's sums run in one order
// whatever the number of rows, so a row gets the same bits in a batch of 1, 8 or 32.
// Arguments as matmul_<w>: x, w, out, rows, k, n.
//
// On sm_90, the tensor-core form. A cluster of MR_PARTS blocks takes 64 outputs: block c of the
// cluster takes the c-th of MR_PARTS ranges of k (whole 32-value blocks) and each of its eight
// warps 8 of the outputs. A block first stages its range of the activations of up to 32 rows in
// shared memory, rounded to f16; then each lane reads straight from global memory the weight
// bytes its `mma.sync` m16n8k16 B fragment needs (for q4_0: two 16-bit words and the scale per
// 32-value block, the low nibbles giving the first 16 values, the high ones the next), turned
// into f16 exactly as the prompt form does, eight blocks' loads in flight at once; the A fragments
// come from the staged activations by `ldmatrix`. Sums are f32 in registers; the cluster's
// partial sums are then added in rank order through distributed shared memory. A row's result is
// therefore one fixed chain of f32 sums of f16 products for every row count (the tensor core
// computes each output element from its own row; rows past the live ones are zeros, and a group
// of at most 16 rows skips the second 16-row product). More than 32 rows: the next group of 32,
// computed the same way.
// Before sm_90, the warp form: one warp per output value and group of MM_ROWS rows, each row
// summed in its lanes' order whatever the group holds.
#define MR_THREADS 256
#define MR_WARPS (MR_THREADS / 32)
#define MR_TILE (8 * MR_WARPS)
#define MR_PARTS 8
#define MR_UNROLL 8

template <int FMT>
__device__ void matmul_rows_warp(const float* xp, const uint8_t* w, float* out, uint32_t rows,
                                 uint32_t k, uint32_t n) {
    const XPlain x{xp};
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    const bool blocks = mm_blocks_ok<FMT>(x, w, k);
    const uint64_t groups = ((uint64_t)rows + MM_ROWS - 1) / MM_ROWS;
    for (uint64_t t = mm_warp_id(); t < groups * n; t += mm_warp_count()) {
        const uint64_t r0 = t / n * MM_ROWS, o = t % n;
        const int nr = (int)min((uint64_t)MM_ROWS, (uint64_t)rows - r0);
        XPlain xs[MM_ROWS];
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r) xs[r] = x.row((r0 + (r < nr ? r : 0)) * k);
        float acc[MM_ROWS];
        mm_dots<FMT>(xs, nr, w + o * row_bytes, k, lane, blocks, acc);
        if (lane != 0) continue;
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r)
            if (r < nr) out[(r0 + r) * n + o] = acc[r];
    }
}

#if __CUDA_ARCH__ >= 800
// Two f16 values (bits) from two 4-bit quants in bits 0-3 and 16-19 of `nibs`, exactly:
// 1024 + q as f16 bits 0x6400 | q, minus `bias`, times the scale (plus q4_1's minimum).
__device__ __forceinline__ uint32_t mr_nibbles(uint32_t nibs, __half2 bias, __half2 d2, __half2 m2,
                                               bool q41) {
    const __half2 q = __hsub2(mm_u32_as_half2(nibs | 0x64006400u), bias);
    const __half2 v = q41 ? __hfma2(q, d2, m2) : __hmul2(q, d2);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Two f16 values from two signed bytes (bits 0-7 and 8-15 of `b`), exactly: 1024 + 128 + q.
__device__ __forceinline__ uint32_t mr_bytes(uint32_t b, __half2 d2) {
    const uint32_t bits = __byte_perm(b ^ 0x8080u, 0x64646464u, 0x4140u);
    const __half2 v = __hmul2(__hsub2(mm_u32_as_half2(bits), __float2half2_rn(1152.0f)), d2);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// The B fragments of one 32-value block of weight row `row` (block `b`, `live` when the row is
// in the matrix): frag[s][0] holds values 16 s + 2 q, + 1 and frag[s][1] values 16 s + 2 q + 8,
// + 9 (q = lane % 4), as f16 pairs. The raw words are loaded by `mr_load`, turned into values
// by `mr_values`; formats without a word path read each value with `op_weight`.
struct MrRaw {
    uint32_t w[4];
    uint16_t d, m;
};

template <int FMT>
__device__ __forceinline__ void mr_load(MrRaw& r, const uint8_t* row, uint32_t b, uint32_t q) {
    if (FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1) {
        const bool q41 = FMT == OP_FMT_Q4_1;
        const uint8_t* p = row + (uint64_t)b * (q41 ? 20 : 18);
        const uint8_t* qs = p + (q41 ? 4 : 2);
        r.d = *(const uint16_t*)p;
        r.m = q41 ? *(const uint16_t*)(p + 2) : 0;
        r.w[0] = *(const uint16_t*)(qs + 2 * q);
        r.w[1] = *(const uint16_t*)(qs + 2 * q + 8);
    } else if (FMT == OP_FMT_Q8_0) {
        const uint8_t* p = row + (uint64_t)b * 34;
        r.d = *(const uint16_t*)p;
#pragma unroll
        for (int i = 0; i < 4; ++i) r.w[i] = *(const uint16_t*)(p + 2 + 2 * q + 8 * i);
    }
}

template <int FMT>
__device__ __forceinline__ void mr_values(const MrRaw& r, const uint8_t* row, uint32_t b,
                                          uint32_t q, bool live, uint32_t k,
                                          uint32_t (&frag)[2][2]) {
    if (!live) {
        frag[0][0] = frag[0][1] = frag[1][0] = frag[1][1] = 0u;
        return;
    }
    if (FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1) {
        const bool q41 = FMT == OP_FMT_Q4_1;
        const __half2 d2 = __half2half2(__ushort_as_half(r.d));
        const __half2 m2 = __half2half2(__ushort_as_half(r.m));
        const __half2 bias = __float2half2_rn(q41 ? 1024.0f : 1032.0f);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const uint32_t x = r.w[j];
            frag[0][j] = mr_nibbles((x & 0x0fu) | ((x & 0x0f00u) << 8), bias, d2, m2, q41);
            frag[1][j] = mr_nibbles(((x >> 4) & 0x0fu) | ((x & 0xf000u) << 4), bias, d2, m2, q41);
        }
        return;
    }
    if (FMT == OP_FMT_Q8_0) {
        const __half2 d2 = __half2half2(__ushort_as_half(r.d));
#pragma unroll
        for (int i = 0; i < 4; ++i) frag[i / 2][i % 2] = mr_bytes(r.w[i], d2);
        return;
    }
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const uint32_t gk = 32 * b + 16 * s + 8 * j + 2 * q;
            const float v0 = gk < k ? op_weight<FMT>(row, gk) : 0.0f;
            const float v1 = gk + 1 < k ? op_weight<FMT>(row, gk + 1) : 0.0f;
            frag[s][j] = mma_pack(v0, v1);
        }
}

#endif

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t mr_cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void mr_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The float at `p` in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float mr_cluster_load(const float* p, uint32_t rank) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    uint32_t ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
    return v;
}
#endif

// The tensor-core form (see above); `false` before sm_90, where the caller takes the warp form.
// Dynamic shared memory: 32 rows of `ld` halves, `ld` = the part's values rounded up to 32, + 8.
template <int FMT>
__device__ bool matmul_rows_mma(const float* x, const uint8_t* w, float* out, uint32_t rows,
                                uint32_t k, uint32_t n) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) float mr_smem[];
    __shared__ float red[MR_WARPS][32][8];
    __half* xs = (__half*)mr_smem;
    constexpr bool words = FMT == OP_FMT_Q4_0 || FMT == OP_FMT_Q4_1 || FMT == OP_FMT_Q8_0;
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t q = lane % 4, g = lane / 4;
    const uint32_t part = mr_cluster_rank();
    const uint32_t nb = (k + 31) / 32, per = (nb + MR_PARTS - 1) / MR_PARTS;
    const uint32_t b_beg = min(nb, part * per), b_end = min(nb, b_beg + per);
    const uint32_t ld = 32 * per + 8;
    const uint32_t kbeg = 32 * b_beg, kend = min(k, 32 * b_end);
    const uint64_t tiles = ((uint64_t)n + MR_TILE - 1) / MR_TILE;
    const uint64_t groups = ((uint64_t)rows + 31) / 32;
    for (uint64_t item = blockIdx.x / MR_PARTS; item < tiles * groups; item += gridDim.x / MR_PARTS) {
        const uint64_t r0 = item / tiles * 32, o0 = item % tiles * MR_TILE;
        const uint32_t live_rows = (uint32_t)min((uint64_t)32, rows - r0);
        const int mt = live_rows > 16 ? 2 : 1;
        // This part's activations of the group's rows, f16, zeros past the live rows and k.
        const uint32_t span = 32 * (b_end - b_beg);
        for (uint32_t t = threadIdx.x; t < 16 * mt * (span / 2); t += blockDim.x) {
            const uint32_t r = t / (span / 2), c = 2 * (t % (span / 2));
            const uint32_t gk = kbeg + c;
            float v0 = 0.0f, v1 = 0.0f;
            if (r < live_rows) {
                const float* xr = x + (r0 + r) * k;
                v0 = gk < kend ? xr[gk] : 0.0f;
                v1 = gk + 1 < kend ? xr[gk + 1] : 0.0f;
            }
            *(uint32_t*)&xs[r * ld + c] = mma_pack(v0, v1);
        }
        __syncthreads();
        const uint64_t o = o0 + 8 * warp + g;
        const bool live = o < n;
        const uint8_t* wrow = w + (live ? o : 0) * row_bytes;
        float acc[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
        if (o0 + 8 * warp < n) {
            for (uint32_t b0 = b_beg; b0 < b_end; b0 += MR_UNROLL) {
                MrRaw raw[MR_UNROLL];
                if (words) {
#pragma unroll
                    for (int u = 0; u < MR_UNROLL; ++u)
                        if (live && b0 + u < b_end) mr_load<FMT>(raw[u], wrow, b0 + u, q);
                }
#pragma unroll
                for (int u = 0; u < MR_UNROLL; ++u) {
                    const uint32_t b = b0 + u;
                    if (b >= b_end) break;
                    uint32_t frag[2][2];
                    mr_values<FMT>(raw[u], wrow, b, q, live, k, frag);
#pragma unroll
                    for (int s = 0; s < 2; ++s) {
                        const uint32_t kk = 32 * (b - b_beg) + 16 * s;
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            if (i >= mt) continue;
                            uint32_t a[4];
                            mma_ldmatrix4(a, xs + (16 * i + (lane & 15)) * ld + kk + (lane >> 4) * 8);
                            mma_16816(acc[i], a, frag[s][0], frag[s][1]);
                        }
                    }
                }
            }
        }
        // Accumulator e of group i: row 16 i + g (+ 8 for e >= 2), output 2 q + e % 2.
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) red[warp][16 * i + g + (e >= 2 ? 8 : 0)][2 * q + e % 2] = acc[i][e];
        // The cluster's partial sums in rank order; block c writes the c-th eighth of the tile.
        mr_cluster_sync();
        constexpr uint32_t share = MR_TILE * 32 / MR_PARTS;
        for (uint32_t t = part * share + threadIdx.x; t < (part + 1) * share; t += blockDim.x) {
            // Element t of the tile: warp t / 256's outputs, row t % 256 / 8, output t % 8.
            const uint32_t wp = t / 256, r = t % 256 / 8, c = t % 8;
            const uint64_t gr = r0 + r, go = o0 + 8 * wp + c;
            const float* cell = &red[wp][r][c];
            float sum = mr_cluster_load(cell, 0);
#pragma unroll
            for (uint32_t p = 1; p < MR_PARTS; ++p) sum += mr_cluster_load(cell, p);
            if (gr < rows && go < n) out[gr * n + go] = sum;
        }
        // No block of the cluster overwrites its shared memory before the others have read it.
        mr_cluster_sync();
    }
    return true;
#else
    return false;
#endif
}

#if __CUDA_ARCH__ >= 900
#define MR_CLUSTER_DIMS __cluster_dims__(MR_PARTS, 1, 1)
#else
#define MR_CLUSTER_DIMS
#endif

template <int FMT>
__device__ void matmul_rows(const float* x, const uint8_t* w, float* out, uint32_t rows,
                            uint32_t k, uint32_t n, uint64_t n_x, uint64_t n_out, uint32_t tag) {
    OP_REQUIRE(k % op_block_elems(FMT) == 0 && n_x == (uint64_t)rows * k &&
               n_out == (uint64_t)rows * n && blockDim.x == MR_THREADS &&
               gridDim.x % MR_PARTS == 0);
    if (!matmul_rows_mma<FMT>(x, w, out, rows, k, n))
        matmul_rows_warp<FMT>(x, w, out, rows, k, n);
}

#define MATMUL_ROWS_KERNEL(NAME, FMT)                                                               \
    extern "C" __global__ __launch_bounds__(MR_THREADS) MR_CLUSTER_DIMS void NAME(                    \
        const float* x, const uint8_t* w, float* out, uint32_t rows, uint32_t k, uint32_t n,          \
        uint64_t n_x, uint64_t n_w, uint64_t n_out) {                                                 \
        OP_GRID_ENTRY();                                                                              \
        matmul_rows<FMT>(x, w, out, rows, k, n, n_x, n_out, op_tag(#NAME));                          \
    }

MATMUL_ROWS_KERNEL(matmul_rows_f32, OP_FMT_F32)
MATMUL_ROWS_KERNEL(matmul_rows_f16, OP_FMT_F16)
MATMUL_ROWS_KERNEL(matmul_rows_bf16, OP_FMT_BF16)
MATMUL_ROWS_KERNEL(matmul_rows_q4_0, OP_FMT_Q4_0)
MATMUL_ROWS_KERNEL(matmul_rows_q4_1, OP_FMT_Q4_1)
MATMUL_ROWS_KERNEL(matmul_rows_q5_0, OP_FMT_Q5_0)
MATMUL_ROWS_KERNEL(matmul_rows_q8_0, OP_FMT_Q8_0)
MATMUL_ROWS_KERNEL(matmul_rows_q4_k, OP_FMT_Q4_K)
MATMUL_ROWS_KERNEL(matmul_rows_q6_k, OP_FMT_Q6_K)
