// The tensor-core form of the prompt attention for heads of 64 or 128 values (compiled in front of
// attention.cu, whose `attention_mma_<t>` kernels take it; sm_80 and newer): a block of ATTN_M_THREADS threads
// takes ATTN_M_ROWS query rows of one head, 16 a warp. Q, and each tile of ATTN_M_KEYS keys of K
// and V, are rounded to f16 in shared memory; the scores S = Q K^T and the sums P V are
// `mma.sync` m16n8k16 products with f32 sums, P (the tile's exponentials) rounded to f16 in
// registers on its way from the score accumulators to the P V operands. The same masks (causal,
// sliding window), score (scale, optional softcap) and online softmax, in f32, as the other forms,
// the exponentials taken as powers of 2 (`attn_exp2`); tiles inside every row's range unmasked.
// With an f32 cache and the shared memory for it (`ATTN_M_SMEM_PIPE`), the next tile's K and V
// rows are copied by `cp.async` into f32 slots while the block multiplies the current tile, and each
// thread rounds the values it copied into the f16 tiles (the same values as a direct load: the same
// bits). With an f16 cache and `ATTN_M_SMEM_PIPE16`, the tiles are copied straight into two pairs
// of f16 tiles in the layout `ldmatrix` reads, the next pair while the block multiplies the other
// (one barrier a tile; Q staged in the second pair before the first tile).
// The first key the query at position `pos` sees: 0, or with a window the last `window`
// positions up to `pos`.
__device__ __forceinline__ uint64_t attn_first_key(uint64_t pos, uint32_t window) {
    return window != 0 && pos + 1 > window ? pos + 1 - window : 0;
}

__device__ __forceinline__ uint32_t attn_dynamic_smem() {
    uint32_t bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

#define ATTN_M_THREADS 128
#define ATTN_M_ROWS 64
#define ATTN_M_KEYS 64
// Shared memory for heads of `hd` values: Q, K and V tiles of 64 rows, each row padded by 8
// values so the eight rows one `ldmatrix` phase reads fall in distinct banks.
#define ATTN_M_SMEM(hd) (3 * ATTN_M_ROWS * ((hd) + 8) * 2)
// The pipelined form's: the f16 K and V tiles (Q staged in K's before the first tile), then the
// f32 K and V slots of the next tile.
#define ATTN_M_SMEM_PIPE(hd) (2 * ATTN_M_KEYS * ((hd) + 8) * 2 + 2 * ATTN_M_KEYS * (hd) * 4)
// The f16 cache's pipelined form's: two pairs of f16 K and V tiles.
#define ATTN_M_SMEM_PIPE16(hd) (4 * ATTN_M_KEYS * ((hd) + 8) * 2)

__device__ __forceinline__ bool attn_mma_ok(uint32_t hd) {
#if __CUDA_ARCH__ >= 800
    return blockDim.x == ATTN_M_THREADS && blockDim.y == 1 && (hd == 64 || hd == 128) &&
           attn_dynamic_smem() >= ATTN_M_SMEM(hd);
#else
    return false;
#endif
}

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t attn_pack(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void attn_ldmatrix4(uint32_t (&r)[4], const __half* p, bool trans) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    if (trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    }
}

__device__ __forceinline__ void attn_mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ATTN_M_ROWS rows of HD values at `src` (row stride `stride` values; rows at or past `live` are
// zeros) rounded to f16 into `dst` (row stride HD + 8). Every load of the thread first, then the
// stores: a store through `dst` (a generic pointer the compiler cannot tell apart from `src`)
// between two loads would make the second wait for the first, one round trip to memory each.
template <typename T, int HD>
__device__ __forceinline__ void attn_stage_f16(__half* dst, const T* src, uint64_t stride,
                                               uint32_t live) {
    // 4-value chunks a thread (the block is ATTN_M_THREADS threads: `attn_mma_ok`).
    constexpr int N = ATTN_M_ROWS * HD / 4 / ATTN_M_THREADS;
    float a[N][4];
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const uint32_t i = threadIdx.x + j * ATTN_M_THREADS;
        const uint32_t row = i / (HD / 4), c = 4 * (i % (HD / 4));
#pragma unroll
        for (int e = 0; e < 4; ++e)
            a[j][e] = row < live ? op_load(src, (long)(row * stride + c + e)) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const uint32_t i = threadIdx.x + j * ATTN_M_THREADS;
        const uint32_t row = i / (HD / 4), c = 4 * (i % (HD / 4));
        uint2 p;
        p.x = attn_pack(a[j][0], a[j][1]);
        p.y = attn_pack(a[j][2], a[j][3]);
        *(uint2*)&dst[row * (HD + 8) + c] = p;
    }
}

// 2^x by the special-function unit (`ex2.approx`: relative error about 2^-22, far under the f16
// rounding of the weights it feeds; -inf gives 0).
__device__ __forceinline__ float attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Issues this thread's copies of a tile's first `keys` rows of HD f32 values (contiguous at `src`)
// into the slot `dst` (the same layout): 4-value chunks threadIdx.x + j ATTN_M_THREADS, each one
// 16-byte copy where `wide` (`src` 16-byte aligned), else four 4-byte ones. A whole aligned tile
// takes the unchecked loop (one address each, then constant offsets).
template <int HD>
__device__ __forceinline__ void attn_copy_tile(float* dst, const float* src, uint32_t keys, bool wide) {
    constexpr int N = ATTN_M_KEYS * HD / 4 / ATTN_M_THREADS;
    if (wide && keys == ATTN_M_KEYS) {
        const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst + 4 * threadIdx.x);
        const float* g = src + 4 * threadIdx.x;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d + 16 * j * ATTN_M_THREADS),
                         "l"(g + 4 * j * ATTN_M_THREADS));
        }
        return;
    }
    const uint32_t chunks = keys * (HD / 4);
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const uint32_t i = threadIdx.x + j * ATTN_M_THREADS;
        if (i >= chunks) break;
        if (wide) {
            op_cp_async<16>(dst + 4 * i, src + 4 * i, true);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) op_cp_async<4>(dst + 4 * i + e, src + 4 * i + e, true);
        }
    }
}

// Issues this thread's 16-byte copies of a tile's first `keys` rows of HD f16 values (contiguous at
// `src`, 16-byte aligned) into the f16 tile `dst` (row stride HD + 8); rows at or past `keys`
// become zeros (copies of no bytes).
template <int HD>
__device__ __forceinline__ void attn_copy_tile_f16(__half* dst, const __half* src, uint32_t keys) {
    constexpr int N = ATTN_M_KEYS * HD / 8 / ATTN_M_THREADS;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const uint32_t i = threadIdx.x + j * ATTN_M_THREADS;
        const uint32_t row = i / (HD / 8), c = 8 * (i % (HD / 8));
        const bool live = row < keys;
        op_cp_async<16>(dst + row * (HD + 8) + c, live ? src + row * HD + c : src, live);
    }
}

// Rounds the chunks of the slot `src` that this thread copied (`attn_copy_tile`, waited for) to f16
// into `dst` (row stride HD + 8); rows at or past `keys` become zeros. Eight chunks loaded, then
// stored: a store through `dst` between two loads would make the second wait for it.
template <int HD>
__device__ __forceinline__ void attn_round_tile(__half* dst, const float* src, uint32_t keys) {
    constexpr int N = ATTN_M_KEYS * HD / 4 / ATTN_M_THREADS, B = 8;
#pragma unroll
    for (int j0 = 0; j0 < N; j0 += B) {
        float4 a[B];
#pragma unroll
        for (int j = 0; j < B; ++j) {
            const uint32_t i = threadIdx.x + (j0 + j) * ATTN_M_THREADS;
            a[j] = i / (HD / 4) < keys ? *(const float4*)(src + 4 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < B; ++j) {
            const uint32_t i = threadIdx.x + (j0 + j) * ATTN_M_THREADS;
            const uint32_t row = i / (HD / 4), c = 4 * (i % (HD / 4));
            uint2 p;
            p.x = attn_pack(a[j].x, a[j].y);
            p.y = attn_pack(a[j].z, a[j].w);
            *(uint2*)&dst[row * (HD + 8) + c] = p;
        }
    }
}
#endif

template <typename T, int HD, typename O>
__device__ void attention_mma(const float* q, const T* k, const T* v, O* out, uint64_t rows,
                              uint64_t max_ctx, int64_t pos0, uint32_t n_head, uint32_t n_kv_head,
                              float scale, float softcap, uint32_t window) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) float attn_smem[];
    // The pipelined form (f32 caches): K, V, then the two f32 slots, Q in K's place; else Q, K, V.
    // The f16 pipelined form: tiles K0, V0, K1, V1, Q staged in K1 (where the cache is aligned).
    const bool pipe = sizeof(T) == 4 && attn_dynamic_smem() >= ATTN_M_SMEM_PIPE(HD);
    const bool pipe16 = sizeof(T) == 2 && attn_dynamic_smem() >= ATTN_M_SMEM_PIPE16(HD);
    constexpr uint32_t TILE = ATTN_M_KEYS * (HD + 8);
    __half* qs = (__half*)attn_smem;
    __half* ks = pipe ? qs : qs + ATTN_M_ROWS * (HD + 8);
    __half* vs = ks + ATTN_M_KEYS * (HD + 8);
    float* k_slot = (float*)(vs + ATTN_M_KEYS * (HD + 8));
    float* v_slot = k_slot + ATTN_M_KEYS * HD;
    const float neg_inf = -__int_as_float(0x7f800000);
    const uint32_t group = n_head / n_kv_head;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // exp(x) = 2^(x log2(e)): the scores carry the factor, so each weight is one `ex2`.
    const float log2e = 1.4426950408889634f, scale2 = scale * log2e, softcap2 = softcap * log2e;
    const uint64_t tiles = (rows + ATTN_M_ROWS - 1) / ATTN_M_ROWS;
    for (uint64_t item = blockIdx.x; item < tiles * n_head; item += gridDim.x) {
        const uint32_t h = (uint32_t)(item % n_head), kvh = h / group;
        const uint64_t r0 = item / n_head * ATTN_M_ROWS;
        const uint64_t r_end = min(rows, r0 + ATTN_M_ROWS);
        const T* kh = k + (uint64_t)kvh * max_ctx * HD;
        const T* vh = v + (uint64_t)kvh * max_ctx * HD;
        const uint64_t lo = attn_first_key((uint64_t)pos0 + r0, window);
        const uint64_t hi = (uint64_t)pos0 + r_end;
        // Rows are HD values (a multiple of 16 bytes), so the heads' starts decide the alignment.
        const bool wide = ((uint64_t)kh | (uint64_t)vh) % 16 == 0;
        const bool p16 = pipe16 && wide;
        if constexpr (sizeof(T) == 4) {
            // The first tile's copies (the slots are free: the last tile's values were rounded
            // before a barrier every thread has passed).
            if (pipe) {
                const uint32_t keys = (uint32_t)min((uint64_t)ATTN_M_KEYS, hi - lo);
                attn_copy_tile<HD>(k_slot, (const float*)kh + lo * HD, keys, wide);
                attn_copy_tile<HD>(v_slot, (const float*)vh + lo * HD, keys, wide);
                op_cp_commit();
            }
        }
        __syncthreads();
        if constexpr (sizeof(T) == 2) {
            // After the barrier: the last item's tiles are read.
            if (p16) {
                const uint32_t keys = (uint32_t)min((uint64_t)ATTN_M_KEYS, hi - lo);
                __half* base = (__half*)attn_smem;
                attn_copy_tile_f16<HD>(base, (const __half*)kh + lo * HD, keys);
                attn_copy_tile_f16<HD>(base + TILE, (const __half*)vh + lo * HD, keys);
                op_cp_commit();
            }
        }
        attn_stage_f16<float, HD>(p16 ? (__half*)attn_smem + 2 * TILE : qs,
                                  q + (r0 * n_head + h) * HD, (uint64_t)n_head * HD,
                                  (uint32_t)(r_end - r0));
        __syncthreads();
        uint32_t qf[HD / 16][4];
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)
            attn_ldmatrix4(qf[kk], (p16 ? (__half*)attn_smem + 2 * TILE : qs) + (warp * 16 + (lane & 15)) * (HD + 8) + kk * 16 + (lane >> 4) * 8,
                           false);
        // This thread's two rows: g and g + 8 of the warp's 16.
        uint64_t pos[2], first[2];
        bool live[2];
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const uint64_t row = r0 + warp * 16 + lane / 4 + 8 * b;
            live[b] = row < r_end;
            pos[b] = (uint64_t)pos0 + row;
            first[b] = attn_first_key(pos[b], window);
        }
        float o[HD / 8][4];
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
        // The row maxima in log2 units (scores times log2(e)); the sums of the weights.
        float m[2] = {neg_inf, neg_inf}, l[2] = {0.0f, 0.0f};
        uint32_t tile = 0;
        for (uint64_t k0 = lo; k0 < hi; k0 += ATTN_M_KEYS, ++tile) {
            const uint32_t keys = (uint32_t)min((uint64_t)ATTN_M_KEYS, hi - k0);
            bool staged = false;
            const __half* kt = ks;
            const __half* vt = vs;
            if constexpr (sizeof(T) == 2) {
                if (p16) {
                    // This tile landed (this thread's copies waited for, the others' seen after
                    // the barrier); every warp is past the tile before, so its pair is free.
                    op_cp_wait<0>();
                    __syncthreads();
                    __half* base = (__half*)attn_smem;
                    if (k0 + ATTN_M_KEYS < hi) {
                        const uint64_t next = k0 + ATTN_M_KEYS;
                        const uint32_t n = (uint32_t)min((uint64_t)ATTN_M_KEYS, hi - next);
                        __half* pair = base + 2 * TILE * ((tile + 1) & 1);
                        attn_copy_tile_f16<HD>(pair, (const __half*)kh + next * HD, n);
                        attn_copy_tile_f16<HD>(pair + TILE, (const __half*)vh + next * HD, n);
                        op_cp_commit();
                    }
                    kt = base + 2 * TILE * (tile & 1);
                    vt = kt + TILE;
                    staged = true;
                }
            }
            if constexpr (sizeof(T) == 4) {
                if (pipe) {
                    // This thread's copies of the tile landed; after the barrier no warp reads
                    // the last tile (or Q) any more, so the f16 tiles are free.
                    op_cp_wait<0>();
                    __syncthreads();
                    attn_round_tile<HD>(ks, k_slot, keys);
                    attn_round_tile<HD>(vs, v_slot, keys);
                    __syncthreads();
                    if (k0 + ATTN_M_KEYS < hi) {
                        const uint64_t next = k0 + ATTN_M_KEYS;
                        const uint32_t n = (uint32_t)min((uint64_t)ATTN_M_KEYS, hi - next);
                        attn_copy_tile<HD>(k_slot, (const float*)kh + next * HD, n, wide);
                        attn_copy_tile<HD>(v_slot, (const float*)vh + next * HD, n, wide);
                        op_cp_commit();
                    }
                    staged = true;
                }
            }
            if (!staged) {
                __syncthreads();
                attn_stage_f16<T, HD>(ks, kh + k0 * HD, HD, keys);
                attn_stage_f16<T, HD>(vs, vh + k0 * HD, HD, keys);
                __syncthreads();
            }
            float s[ATTN_M_KEYS / 8][4];
#pragma unroll
            for (int nt = 0; nt < ATTN_M_KEYS / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
                for (int p = 0; p < ATTN_M_KEYS / 16; ++p) {
                    uint32_t b[4];
                    attn_ldmatrix4(b, kt + (p * 16 + (lane & 7) + (lane >> 4) * 8) * (HD + 8) +
                                          kk * 16 + ((lane >> 3) & 1) * 8,
                                   false);
                    attn_mma16816(s[2 * p], qf[kk], b[0], b[1]);
                    attn_mma16816(s[2 * p + 1], qf[kk], b[2], b[3]);
                }
            }
            // Scores (in log2 units: the scale and softcap carry log2(e), so `attn_exp2` gives the
            // weights), masks and the tile's maximum of each of this thread's two rows. A tile
            // whose every score the warp's 16 rows see (all rows live, every key in the causal
            // range and the window of each) skips the masks.
            const uint64_t w_first = (uint64_t)pos0 + r0 + warp * 16;
            const bool full = r0 + warp * 16 + 16 <= r_end && keys == ATTN_M_KEYS &&
                              k0 + ATTN_M_KEYS - 1 <= w_first &&
                              k0 >= attn_first_key(w_first + 15, window);
            float mx[2] = {neg_inf, neg_inf};
#pragma unroll
            for (int nt = 0; nt < ATTN_M_KEYS / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int b = e / 2;
                    float sc = s[nt][e] * scale2;
                    if (softcap != 0.0f) sc = softcap2 * tanhf(s[nt][e] * scale / softcap);
                    if (!full) {
                        const uint64_t key = k0 + nt * 8 + 2 * (lane % 4) + e % 2;
                        const bool seen =
                            live[b] && key < hi && key <= pos[b] && key >= first[b];
                        sc = seen ? sc : neg_inf;
                    }
                    s[nt][e] = sc;
                    mx[b] = fmaxf(mx[b], sc);
                }
            }
            float c[2];
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                mx[b] = fmaxf(mx[b], __shfl_xor_sync(ONEPASS_FULL_MASK, mx[b], 1));
                mx[b] = fmaxf(mx[b], __shfl_xor_sync(ONEPASS_FULL_MASK, mx[b], 2));
                const float m_new = fmaxf(m[b], mx[b]);
                // No key seen yet: nothing to rescale, nothing to add (avoids -inf - -inf).
                c[b] = m_new == neg_inf ? 1.0f : attn_exp2(m[b] - m_new);
                m[b] = m_new;
            }
            float rowsum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < ATTN_M_KEYS / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int b = e / 2;
                    // In a full tile every score and the maximum are finite.
                    const float p = !full && s[nt][e] == neg_inf ? 0.0f : attn_exp2(s[nt][e] - m[b]);
                    s[nt][e] = p;
                    rowsum[b] += p;
                }
            }
#pragma unroll
            for (int b = 0; b < 2; ++b) l[b] = l[b] * c[b] + rowsum[b];
#pragma unroll
            for (int nt = 0; nt < HD / 8; ++nt) {
                o[nt][0] *= c[0];
                o[nt][1] *= c[0];
                o[nt][2] *= c[1];
                o[nt][3] *= c[1];
            }
#pragma unroll
            for (int j = 0; j < ATTN_M_KEYS / 16; ++j) {
                const uint32_t a[4] = {attn_pack(s[2 * j][0], s[2 * j][1]),
                                       attn_pack(s[2 * j][2], s[2 * j][3]),
                                       attn_pack(s[2 * j + 1][0], s[2 * j + 1][1]),
                                       attn_pack(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
                for (int dp = 0; dp < HD / 16; ++dp) {
                    uint32_t b[4];
                    attn_ldmatrix4(b, vt + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * (HD + 8) +
                                          dp * 16 + (lane >> 4) * 8,
                                   true);
                    attn_mma16816(o[2 * dp], a, b[0], b[1]);
                    attn_mma16816(o[2 * dp + 1], a, b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            l[b] += __shfl_xor_sync(ONEPASS_FULL_MASK, l[b], 1);
            l[b] += __shfl_xor_sync(ONEPASS_FULL_MASK, l[b], 2);
        }
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            if (!live[b]) continue;
            const uint64_t row = r0 + warp * 16 + lane / 4 + 8 * b;
            const float inv = 1.0f / l[b];
            O* dst = out + (row * n_head + h) * HD;
#pragma unroll
            for (int nt = 0; nt < HD / 8; ++nt) {
                const uint32_t d = nt * 8 + 2 * (lane % 4);
                op_store(dst, d, o[nt][2 * b] * inv);
                op_store(dst, d + 1, o[nt][2 * b + 1] * inv);
            }
        }
    }
#endif
}
