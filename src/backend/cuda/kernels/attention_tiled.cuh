// The tiled form of the prompt attention (compiled in front of attention.cu): one block per tile
// of query rows and KV head. The block's query vectors (the KV head's group of query heads times
// ATTN_T_QV / group rows) share every K and V tile it stages in shared memory, where the one-row
// form reads the keys again for every query row and head. Sums in f32 with an online softmax over
// tiles of ATTN_T_KEYS keys; the same masks (causal, sliding window) and score (scale, optional
// softcap) as the one-row form. Threads: ATTN_T_THREADS, eight per query vector: lane `sub` of a
// vector scores keys sub and sub + 8 of a tile and owns the output dimensions 4 sub .. 4 sub + 3
// (+ 32 i) of its vector; every shared-memory read is a 16-byte one (heads a multiple of 32).
#define ATTN_T_THREADS 256
#define ATTN_T_QV 32
#define ATTN_T_KEYS 16
#define ATTN_T_MAX_HD 128
// Floats of shared memory for heads of hd values: Q [QV][hd + 4], K [KEYS][hd + 4], V [KEYS][hd],
// P [QV][KEYS + 4] (the padded strides put the eight keys one quarter-warp reads in distinct banks).
#define ATTN_T_SMEM_FLOATS(hd)                                                                     \
    (ATTN_T_QV * ((hd) + 4) + ATTN_T_KEYS * ((hd) + 4) + ATTN_T_KEYS * (hd) +                      \
     ATTN_T_QV * (ATTN_T_KEYS + 4))

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

// Whether the tiled form serves this launch: its block size and shared memory, a head of at most
// ATTN_T_MAX_HD values and a group that fits the query vectors of a block.
__device__ __forceinline__ bool attn_tiled_ok(uint32_t hd, uint32_t group) {
    return blockDim.x == ATTN_T_THREADS && blockDim.y == 1 && hd <= ATTN_T_MAX_HD && hd % 32 == 0 &&
           group <= ATTN_T_QV && attn_dynamic_smem() >= 4u * ATTN_T_SMEM_FLOATS(hd);
}

template <typename T>
__device__ void attention_tiled(const float* q, const T* k, const T* v, float* out,
                                uint64_t rows, uint64_t max_ctx, int64_t pos0, uint32_t n_head,
                                uint32_t n_kv_head, uint32_t hd, float scale, float softcap,
                                uint32_t window) {
    extern __shared__ __align__(16) float attn_smem[];
    const uint32_t ld = hd + 4, pld = ATTN_T_KEYS + 4;
    float* qs = attn_smem;
    float* ks = qs + ATTN_T_QV * ld;
    float* vs = ks + ATTN_T_KEYS * ld;
    float* ps = vs + ATTN_T_KEYS * hd;
    const float neg_inf = -__int_as_float(0x7f800000);
    const uint32_t group = n_head / n_kv_head, per_tile = ATTN_T_QV / group;
    const uint32_t t = threadIdx.x, qv = t / 8, sub = t % 8;
    // Vector qv is head (kv * group + qv % group) of row r0 + qv / group.
    const uint32_t gi = qv % group, rr = qv / group;
    const uint64_t tiles = (rows + per_tile - 1) / per_tile;
    for (uint64_t item = blockIdx.x; item < tiles * n_kv_head; item += gridDim.x) {
        const uint32_t kv = (uint32_t)(item % n_kv_head);
        const uint64_t r0 = item / n_kv_head * per_tile;
        const uint64_t r_end = min(rows, r0 + per_tile);
        const uint64_t row = r0 + rr;
        const bool active = rr < per_tile && row < r_end;
        const uint64_t pos = (uint64_t)pos0 + row;
        const uint64_t first = active ? attn_first_key(pos, window) : 0;
        const uint64_t lo = attn_first_key((uint64_t)pos0 + r0, window);
        const uint64_t hi = (uint64_t)pos0 + r_end;
        const uint32_t h = kv * group + gi;
        __syncthreads();
        for (uint32_t i = t; i < ATTN_T_QV * hd; i += ATTN_T_THREADS) {
            const uint32_t vq = i / hd, d = i % hd;
            const uint64_t vrow = r0 + vq / group;
            const bool live = vq / group < per_tile && vrow < r_end;
            qs[vq * ld + d] =
                live ? q[(vrow * n_head + kv * group + vq % group) * hd + d] : 0.0f;
        }
        float4 acc[ATTN_T_MAX_HD / 32];
#pragma unroll
        for (int i = 0; i < ATTN_T_MAX_HD / 32; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float m = neg_inf, l = 0.0f;
        const T* kh = k + (uint64_t)kv * max_ctx * hd;
        const T* vh = v + (uint64_t)kv * max_ctx * hd;
        for (uint64_t k0 = lo; k0 < hi; k0 += ATTN_T_KEYS) {
            __syncthreads();
            for (uint32_t i = t; i < ATTN_T_KEYS * hd; i += ATTN_T_THREADS) {
                const uint32_t j = i / hd, d = i % hd;
                const uint64_t key = k0 + j;
                const bool live = key < hi;
                ks[j * ld + d] = live ? op_load(kh, key * hd + d) : 0.0f;
                vs[j * hd + d] = live ? op_load(vh, key * hd + d) : 0.0f;
            }
            __syncthreads();
            float s[2];
            float4 dots[2] = {make_float4(0.0f, 0.0f, 0.0f, 0.0f), make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
            for (uint32_t d = 0; d < hd; d += 4) {
                const float4 a = *(const float4*)&qs[qv * ld + d];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float4 b = *(const float4*)&ks[(sub + 8 * e) * ld + d];
                    dots[e].x += a.x * b.x;
                    dots[e].y += a.y * b.y;
                    dots[e].z += a.z * b.z;
                    dots[e].w += a.w * b.w;
                }
            }
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const uint32_t j = sub + 8 * e;
                const uint64_t key = k0 + j;
                const float dot = (dots[e].x + dots[e].y) + (dots[e].z + dots[e].w);
                float sc = dot * scale;
                if (softcap != 0.0f) sc = softcap * tanhf(sc / softcap);
                const bool seen = active && key < hi && key <= pos && key >= first;
                s[e] = seen ? sc : neg_inf;
            }
            float tile_max = fmaxf(s[0], s[1]);
            tile_max = fmaxf(tile_max, __shfl_xor_sync(ONEPASS_FULL_MASK, tile_max, 1));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(ONEPASS_FULL_MASK, tile_max, 2));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(ONEPASS_FULL_MASK, tile_max, 4));
            const float m_new = fmaxf(m, tile_max);
            // No key seen yet: nothing to rescale and nothing to add (avoids -inf - -inf).
            const bool none = m_new == neg_inf;
            const float c = none ? 1.0f : expf(m - m_new);
            const float p0 = none || s[0] == neg_inf ? 0.0f : expf(s[0] - m_new);
            const float p1 = none || s[1] == neg_inf ? 0.0f : expf(s[1] - m_new);
            float psum = p0 + p1;
            psum += __shfl_xor_sync(ONEPASS_FULL_MASK, psum, 1);
            psum += __shfl_xor_sync(ONEPASS_FULL_MASK, psum, 2);
            psum += __shfl_xor_sync(ONEPASS_FULL_MASK, psum, 4);
            l = l * c + psum;
            m = m_new;
            ps[qv * pld + sub] = p0;
            ps[qv * pld + sub + 8] = p1;
            __syncwarp();
#pragma unroll
            for (int i = 0; i < ATTN_T_MAX_HD / 32; ++i) {
                acc[i].x *= c;
                acc[i].y *= c;
                acc[i].z *= c;
                acc[i].w *= c;
            }
#pragma unroll 4
            for (uint32_t j = 0; j < ATTN_T_KEYS; ++j) {
                const float p = ps[qv * pld + j];
#pragma unroll
                for (int i = 0; i < ATTN_T_MAX_HD / 32; ++i) {
                    const uint32_t d = 4 * sub + 32 * i;
                    if (d < hd) {
                        const float4 b = *(const float4*)&vs[j * hd + d];
                        acc[i].x += p * b.x;
                        acc[i].y += p * b.y;
                        acc[i].z += p * b.z;
                        acc[i].w += p * b.w;
                    }
                }
            }
            __syncwarp();
        }
        if (active) {
            const float inv = 1.0f / l;
            float* o = out + (row * n_head + h) * hd;
#pragma unroll
            for (int i = 0; i < ATTN_T_MAX_HD / 32; ++i) {
                const uint32_t d = 4 * sub + 32 * i;
                if (d < hd) {
                    o[d] = acc[i].x * inv;
                    o[d + 1] = acc[i].y * inv;
                    o[d + 2] = acc[i].z * inv;
                    o[d + 3] = acc[i].w * inv;
                }
            }
        }
    }
}
