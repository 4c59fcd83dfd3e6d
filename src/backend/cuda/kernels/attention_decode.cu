// The one-row decode attention in one launch, `attention_decode_<t>` (arguments in attention.cu's
// header; compiled after it, whose helpers it calls). For heads of 64, 128 or 256 values a block
// takes one KV head, up to AD_HEADS of the query heads that share it (`ad_heads_per_block`), and
// one split of the keys the query sees, so a K or V row is read once for those heads. The number
// of splits is chosen here from the run-time length (about one per AD_MIN_KEYS keys, at most
// AD_MAX_SPLITS and what the grid holds), so one recorded launch serves every step: a short
// context takes a few blocks and no merge, a long one fills the GPU. Blocks past the run-time
// split count return at once. Each warp runs its own online softmax over keys j0 + slot (KPI
// keys a step, LPK lanes a key, every lane holding 16 values of the query and key rows and
// HD / 32 dimensions of the V sum), the next step's K and V loads in flight while it computes;
// the block merges its warps in shared memory; with several splits each block writes a record
// per head (the partial records' layout: [split, head, (max, sum, V sum)], the maximum in base
// 2), takes a ticket from its owner's counter, and the last block merges the records of every
// head it owns (`ad_merge_splits`). Other head sizes, and caches not aligned for vector loads,
// take the chunked form of attention.cu (`attention_partial`).

#define AD_WARPS 8
#define AD_HEADS 4
// Keys a split: 32 and 48, 128 and 256 measured no faster on an H200 (docs/kernels.md item 44;
// 128 shortened SmolLM2's step at 512 tokens 2.4% and lengthened the 8B's 3.5%).
#define AD_MIN_KEYS 64
// The most splits a step takes: the final merge reads a record of every split for each dimension
// (and keeps a factor a split and head in shared memory). On an H100 (docs/kernels.md item 18):
// one split per 32 keys rather than 64 measured slower at 512 tokens of context everywhere
// (SmolLM2 1,204 -> 1,080 tok/s), and 45 splits of the SmolLM2 shape at 4096 tokens 952 tok/s
// against 1,057 with 32. On an H200 (item 35) that shape at 4096 tokens took 683-689 us a step
// with 24, 696-697 with 16, 703-705 with 20, 721-729 with 28 and 32. Only models with few KV
// heads reach the cap: the 1B's and 8B's eight KV heads fill the grid with 16 splits.
#define AD_MAX_SPLITS 24
// Scores are kept in base 2 (times log2 e), so each exponential is one `exp2f`.
#define AD_LOG2E 1.4426950408889634f

// Cache values as loaded, before their conversion to f32: four (`R4`) or two (`R2`) of them. An
// f16 step's next K and V rows stay in these until the step that uses them, so the conversion
// does not wait on the loads issued a step ahead (converting them as they were loaded made the
// f16 cache slower than the f32 one: 41.6 against 32.5 us a layer at 4096 keys on an H100).
template <typename T>
struct AdRaw {
    using R4 = float4;
    using R2 = float2;
};
template <>
struct AdRaw<__half> {
    using R4 = uint2;
    using R2 = uint32_t;
};
__device__ __forceinline__ float4 ad_raw4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ uint2 ad_raw4(const __half* p) { return *(const uint2*)p; }
__device__ __forceinline__ float2 ad_raw2(const float* p) { return *(const float2*)p; }
__device__ __forceinline__ uint32_t ad_raw2(const __half* p) { return *(const uint32_t*)p; }
// The same through L2 only, for the loads a block issues before its grid wait (no L1 line an
// earlier kernel left can answer them).
__device__ __forceinline__ float4 ad_raw4_cg(const float* p) { return __ldcg((const float4*)p); }
__device__ __forceinline__ uint2 ad_raw4_cg(const __half* p) { return __ldcg((const uint2*)p); }
__device__ __forceinline__ float2 ad_raw2_cg(const float* p) { return __ldcg((const float2*)p); }
__device__ __forceinline__ uint32_t ad_raw2_cg(const __half* p) {
    return __ldcg((const unsigned int*)p);
}
__device__ __forceinline__ float4 ad_wide(float4 a) { return a; }
__device__ __forceinline__ float4 ad_wide(uint2 u) {
    const float2 a = __half22float2(*(const __half2*)&u.x);
    const float2 b = __half22float2(*(const __half2*)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float2 ad_wide(float2 a) { return a; }
__device__ __forceinline__ float2 ad_wide(uint32_t u) {
    return __half22float2(*(const __half2*)&u);
}

// A key's DV values of V for one lane, as loaded: DV / 4 pieces of four, or one of two.
template <typename T, int DV>
struct AdV {
    typename AdRaw<T>::R4 q[DV >= 4 ? DV / 4 : 1];
    typename AdRaw<T>::R2 d;
    // With CG through L2 only (the loads before the grid wait).
    template <bool CG = false>
    __device__ __forceinline__ void load(const T* p) {
        if constexpr (DV == 2) {
            d = CG ? ad_raw2_cg(p) : ad_raw2(p);
        } else {
#pragma unroll
            for (int i = 0; i < DV / 4; ++i) q[i] = CG ? ad_raw4_cg(p + 4 * i) : ad_raw4(p + 4 * i);
        }
    }
    __device__ __forceinline__ void zero() {
        if constexpr (DV == 2) {
            d = typename AdRaw<T>::R2{};
        } else {
#pragma unroll
            for (int i = 0; i < DV / 4; ++i) q[i] = typename AdRaw<T>::R4{};
        }
    }
    __device__ __forceinline__ void wide(float (&o)[DV]) const {
        if constexpr (DV == 2) {
            const float2 a = ad_wide(d);
            o[0] = a.x;
            o[1] = a.y;
        } else {
#pragma unroll
            for (int i = 0; i < DV / 4; ++i) {
                const float4 a = ad_wide(q[i]);
                o[4 * i] = a.x;
                o[4 * i + 1] = a.y;
                o[4 * i + 2] = a.z;
                o[4 * i + 3] = a.w;
            }
        }
    }
};

// A count known when compiled, for the key loop's heads.
template <int N>
struct AdCount {
    static constexpr int value = N;
};

// Query heads a block takes: AD_HEADS where there are AD_MIN_KV_SHARED KV heads or more, or where
// one head a block would leave more than AD_MIN_KEYS keys a split (the grid's splits for one head
// a block, at most AD_MAX_SPLITS and `max_chunks`, too few for the length); else one, so that a
// model with few KV heads spreads a short context over enough blocks, while a longer one reads
// each K and V row once for the heads that share it. The host sizes the grid for one head a block
// where that can happen (`ops::attention::split_heads_per_block`); with more heads a block, each
// owner takes more of the grid's splits. (A fixed bound of 2,048 keys left SmolLM2's shape at
// 1,024 tokens two steps a warp on 9 x 14 blocks: 702 us a step on an H200, against 625 with its
// three heads a block; docs/kernels.md item 35.)
#define AD_MIN_KV_SHARED 8
__device__ __forceinline__ uint32_t ad_heads_per_block(uint32_t n_kv, uint32_t group,
                                                       uint64_t keys, uint32_t max_chunks) {
    if (n_kv >= AD_MIN_KV_SHARED) return AD_HEADS;
    uint32_t cap = gridDim.x / (n_kv * group);
    if (cap > max_chunks) cap = max_chunks;
    if (cap > AD_MAX_SPLITS) cap = AD_MAX_SPLITS;
    return (keys + AD_MIN_KEYS - 1) / AD_MIN_KEYS > cap ? AD_HEADS : 1;
}

// Whether the split form takes this launch (block-uniform).
template <typename T>
__device__ __forceinline__ bool ad_ok(const float* q, const T* k, const T* v, uint32_t hd) {
    return (hd == 64 || hd == 128 || hd == 256) && blockDim.x == 32 * AD_WARPS &&
           (((uint64_t)k | (uint64_t)v) & (4 * sizeof(T) - 1)) == 0 && ((uint64_t)q & 15u) == 0;
}

// Merges the records of `splits` splits of heads h0..h0 + nh into out. First a warp a head reads
// every split's maximum and sum (one pass through L2, since other blocks wrote them), so that each
// split's factor 2^(max - overall max) is computed once, not once per dimension; then thread t
// takes head h0 + t / hd, dimension t % hd, and sums the splits' V sums times their factors (the
// loads of eight splits in flight). `scratch` holds 2 * AD_HEADS * AD_MAX_SPLITS floats of
// shared memory that no thread reads any more (the block's own merge is done).
__device__ __forceinline__ void ad_merge_splits(const float* partials, uint32_t splits,
                                                uint32_t n_head, uint32_t h0, uint32_t nh,
                                                uint32_t hd, float* out, float* scratch) {
    __shared__ float sum_s[AD_HEADS];
    const uint64_t stride = (uint64_t)n_head * (hd + 2);
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp < nh) {
        float* f_s = scratch + warp * AD_MAX_SPLITS;
        float* l_s = scratch + (AD_HEADS + warp) * AD_MAX_SPLITS;
        const float* r = partials + (uint64_t)(h0 + warp) * (hd + 2);
        float mx = -__int_as_float(0x7f800000);
        for (uint32_t sp = lane; sp < splits; sp += 32) {
            const float ms = __ldcg(r + sp * stride);
            f_s[sp] = ms;
            l_s[sp] = __ldcg(r + sp * stride + 1);
            mx = fmaxf(mx, ms);
        }
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(ONEPASS_FULL_MASK, mx, o));
        float sum = 0.0f;
        for (uint32_t sp = lane; sp < splits; sp += 32) {
            const float ms = f_s[sp];
            const float f = ms == -__int_as_float(0x7f800000) ? 0.0f : exp2f(ms - mx);
            f_s[sp] = f;
            sum = fmaf(f, l_s[sp], sum);
        }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(ONEPASS_FULL_MASK, sum, o);
        if (lane == 0) sum_s[warp] = sum;
    }
    __syncthreads();
    for (uint32_t t = threadIdx.x; t < nh * hd; t += blockDim.x) {
        const uint32_t h = t / hd, d = t % hd;
        const float* r = partials + (uint64_t)(h0 + h) * (hd + 2) + 2 + d;
        const float* f_s = scratch + h * AD_MAX_SPLITS;
        float val = 0.0f;
#pragma unroll 8
        for (uint32_t sp = 0; sp < splits; ++sp) val = fmaf(f_s[sp], __ldcg(r + sp * stride), val);
        out[(uint64_t)(h0 + h) * hd + d] = val / sum_s[h];
    }
}

// One block of the split form. `acc_s` is AD_WARPS * AD_HEADS * HD floats of shared memory.
template <typename T, int HD>
__device__ void ad_block(const float* q, const T* k, const T* v, float* partials, float* out,
                         uint32_t n_head, uint32_t n_kv, float scale, float softcap, uint64_t ctx,
                         uint64_t lo, uint64_t kv_len, uint32_t max_chunks, uint64_t records,
                         float* acc_s, uint32_t tag) {
    constexpr int LPK = HD / 16, KPI = 32 / LPK, DV = HD / 32;
    __shared__ float m_s[AD_WARPS][AD_HEADS], l_s[AD_WARPS][AD_HEADS];
    const uint64_t keys = kv_len - lo;
    const uint32_t group = n_head / n_kv, hpb = ad_heads_per_block(n_kv, group, keys, max_chunks);
    const uint32_t hgroups = (group + hpb - 1) / hpb;
    const uint32_t owners = n_kv * hgroups;
    const uint32_t grid_splits = gridDim.x / owners;
    uint32_t splits_max = grid_splits < max_chunks ? grid_splits : max_chunks;
    if (splits_max > AD_MAX_SPLITS) splits_max = AD_MAX_SPLITS;
    const uint64_t want = (keys + AD_MIN_KEYS - 1) / AD_MIN_KEYS;
    const uint32_t splits = (uint32_t)(want < splits_max ? want : splits_max);
    // Split-major order: the blocks that have work are the grid's first, so a short context's
    // blocks start in the first wave rather than among blocks that return at once.
    const uint32_t owner = blockIdx.x % owners, split = blockIdx.x / owners;
    if (splits == 0 || owner >= owners || split >= splits) return;
    const uint32_t kv = owner / hgroups, hg = owner % hgroups;
    const uint32_t h0 = kv * group + hg * hpb;
    const uint32_t nh = group - hg * hpb < hpb ? group - hg * hpb : hpb;
    const uint64_t per = (keys + splits - 1) / splits;
    const uint64_t a = lo + split * per;
    const uint64_t b = a + per < kv_len ? a + per : kv_len;

    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t slot = lane / LPK, sub = lane % LPK;
    const T* ks = k + (uint64_t)kv * ctx * HD;
    const T* vs = v + (uint64_t)kv * ctx * HD;
    float m[AD_HEADS], l[AD_HEADS], acc[AD_HEADS][DV];
#pragma unroll
    for (int h = 0; h < AD_HEADS; ++h) {
        m[h] = -__int_as_float(0x7f800000);
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < DV; ++e) acc[h][e] = 0.0f;
    }
    // The K and V of a step: loaded one step ahead, so a warp's next loads are in flight while
    // it scores and sums the current keys.
    using R4 = typename AdRaw<T>::R4;
    R4 kk[4];
    AdV<T, DV> vv[KPI];
    auto load = [&](uint64_t j0) {
        const uint64_t j = j0 + slot;
#pragma unroll
        for (int i = 0; i < 4; ++i) kk[i] = j < b ? ad_raw4(ks + j * HD + 4 * sub + 4 * LPK * i) : R4{};
#pragma unroll
        for (int t = 0; t < KPI; ++t) {
            if (j0 + t < b) {
                vv[t].load(vs + (j0 + t) * HD + lane * DV);
            } else {
                vv[t].zero();
            }
        }
    };
    // The first step's keys before the grid wait (prelude.cuh), all but the newest: the kernel
    // before this one writes q and the newest key's K and V rows; every older row was written by
    // an earlier step or prompt pass, complete before this kernel could start. So the loads that
    // start each warp's chain are in flight while that kernel finishes.
    const uint64_t newest = kv_len - 1;
    const uint64_t stride = (uint64_t)AD_WARPS * KPI;
    uint64_t j0 = a + (uint64_t)warp * KPI;
    if (j0 < b) {
        const uint64_t j = j0 + slot;
        const bool old = j < b && j != newest;
#pragma unroll
        for (int i = 0; i < 4; ++i) kk[i] = old ? ad_raw4_cg(ks + j * HD + 4 * sub + 4 * LPK * i) : R4{};
#pragma unroll
        for (int t = 0; t < KPI; ++t) {
            if (j0 + t < b && j0 + t != newest) {
                vv[t].template load<true>(vs + (j0 + t) * HD + lane * DV);
            } else {
                vv[t].zero();
            }
        }
    }
    OP_GRID_WAIT();
    if (j0 < b && j0 <= newest && newest < j0 + KPI) {
        if (j0 + slot == newest) {
#pragma unroll
            for (int i = 0; i < 4; ++i) kk[i] = ad_raw4(ks + newest * HD + 4 * sub + 4 * LPK * i);
        }
#pragma unroll
        for (int t = 0; t < KPI; ++t)
            if (j0 + t == newest) vv[t].load(vs + newest * HD + lane * DV);
    }
    float4 qr[AD_HEADS][4];
#pragma unroll
    for (int h = 0; h < AD_HEADS; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            qr[h][i] = (uint32_t)h < nh
                           ? *(const float4*)(q + (uint64_t)(h0 + h) * HD + 4 * sub + 4 * LPK * i)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // The key loop for NH heads a block, known when compiled: one, or AD_HEADS where the block
    // has more than one (the query rows of heads past nh are zeros, their states unused), so that
    // the heads' chains of shuffles and exponentials interleave rather than run one after the
    // other behind a run-time bound.
    auto keys_loop = [&](auto nh_c) {
        constexpr int NH = decltype(nh_c)::value;
        for (; j0 < b; j0 += stride) {
            const bool valid = j0 + slot < b;
            R4 kr[4];
            AdV<T, DV> vr[KPI];
#pragma unroll
            for (int i = 0; i < 4; ++i) kr[i] = kk[i];
#pragma unroll
            for (int t = 0; t < KPI; ++t) vr[t] = vv[t];
            if (j0 + stride < b) load(j0 + stride);
            float4 kc[4];
            float vc[KPI][DV];
#pragma unroll
            for (int i = 0; i < 4; ++i) kc[i] = ad_wide(kr[i]);
#pragma unroll
            for (int t = 0; t < KPI; ++t) vr[t].wide(vc[t]);
#pragma unroll
            for (int h = 0; h < AD_HEADS; ++h) {
                if (h >= NH) break;
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    d = fmaf(qr[h][i].x, kc[i].x, d);
                    d = fmaf(qr[h][i].y, kc[i].y, d);
                    d = fmaf(qr[h][i].z, kc[i].z, d);
                    d = fmaf(qr[h][i].w, kc[i].w, d);
                }
#pragma unroll
                for (int o = 1; o < LPK; o <<= 1) d += __shfl_xor_sync(ONEPASS_FULL_MASK, d, o);
                float s = d * scale;
                if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
                s = valid ? s * AD_LOG2E : -__int_as_float(0x7f800000);
                float t = s;
#pragma unroll
                for (int o = LPK; o < 32; o <<= 1)
                    t = fmaxf(t, __shfl_xor_sync(ONEPASS_FULL_MASK, t, o));
                const float nm = fmaxf(m[h], t);
                const float c = exp2f(m[h] - nm);
                const float p = valid ? exp2f(s - nm) : 0.0f;
                float ps = p;
#pragma unroll
                for (int o = LPK; o < 32; o <<= 1) ps += __shfl_xor_sync(ONEPASS_FULL_MASK, ps, o);
                l[h] = l[h] * c + ps;
                m[h] = nm;
#pragma unroll
                for (int e = 0; e < DV; ++e) acc[h][e] *= c;
#pragma unroll
                for (int t2 = 0; t2 < KPI; ++t2) {
                    const float pk = __shfl_sync(ONEPASS_FULL_MASK, p, t2 * LPK);
#pragma unroll
                    for (int e = 0; e < DV; ++e) acc[h][e] = fmaf(pk, vc[t2][e], acc[h][e]);
                }
            }
        }
    };
    if (nh == 1)
        keys_loop(AdCount<1>{});
    else
        keys_loop(AdCount<AD_HEADS>{});
    // The warps' states side by side; each (warp, head)'s factor 2^(max - block max) computed
    // once; then merged per (head, dimension).
#pragma unroll
    for (int h = 0; h < AD_HEADS; ++h) {
        if ((uint32_t)h >= nh) break;
        if (lane == 0) {
            m_s[warp][h] = m[h];
            l_s[warp][h] = l[h];
        }
#pragma unroll
        for (int e = 0; e < DV; ++e) acc_s[(warp * AD_HEADS + h) * HD + lane * DV + e] = acc[h][e];
    }
    __syncthreads();
    __shared__ float f_s[AD_WARPS][AD_HEADS], mx_s[AD_HEADS];
    if (threadIdx.x < AD_WARPS * AD_HEADS) {
        const uint32_t w = threadIdx.x / AD_HEADS, h = threadIdx.x % AD_HEADS;
        if (h < nh) {
            float mx = -__int_as_float(0x7f800000);
#pragma unroll
            for (int i = 0; i < AD_WARPS; ++i) mx = fmaxf(mx, m_s[i][h]);
            f_s[w][h] = mx == -__int_as_float(0x7f800000) ? 0.0f : exp2f(m_s[w][h] - mx);
            if (w == 0) mx_s[h] = mx;
        }
    }
    __syncthreads();
    for (uint32_t t = threadIdx.x; t < nh * HD; t += blockDim.x) {
        const uint32_t h = t / HD, d = t % HD;
        float sum = 0.0f, val = 0.0f;
#pragma unroll
        for (int w = 0; w < AD_WARPS; ++w) {
            sum = fmaf(f_s[w][h], l_s[w][h], sum);
            val = fmaf(f_s[w][h], acc_s[(w * AD_HEADS + h) * HD + d], val);
        }
        if (splits == 1) {
            out[(uint64_t)(h0 + h) * HD + d] = val / sum;
        } else {
            float* rec = partials + ((uint64_t)split * n_head + h0 + h) * (HD + 2);
            if (d == 0) {
                rec[0] = mx_s[h];
                rec[1] = sum;
            }
            rec[2 + d] = val;
        }
    }
    if (splits == 1) return;
    if (!attn_last_ticket((uint32_t*)(partials + records) + owner, splits, h0, tag)) return;
    ad_merge_splits(partials, splits, n_head, h0, nh, HD, out, acc_s);
}

template <typename T>
__device__ void attention_decode(const float* q, const T* k, const T* v, const int32_t* step,
                                 float* partials, float* out, uint32_t n_head, uint32_t n_kv_head,
                                 uint32_t hd, float scale, float softcap, uint32_t window,
                                 uint32_t chunk_len, uint32_t max_chunks, uint64_t n_q,
                                 uint64_t n_k, uint64_t n_v, uint64_t n_step, uint64_t n_partials,
                                 uint64_t n_out, uint32_t tag) {
    __shared__ __align__(16) float acc_s[AD_WARPS * AD_HEADS * ATTN_MAX_HD];
    if (!ad_ok(q, k, v, hd)) {
        OP_GRID_WAIT();
        attention_partial<T>(q, k, v, step, partials, out, n_head, n_kv_head, hd, scale, softcap,
                             window, chunk_len, max_chunks, n_q, n_k, n_v, n_step, n_partials,
                             n_out, tag);
        return;
    }
    // Until ad_block's grid wait, this block reads only what no kernel still running writes:
    // the step buffer (the host's, written before the graph) and the older keys.
    const uint64_t records = (uint64_t)max_chunks * n_head * (hd + 2);
    if (!(n_head != 0 && n_kv_head != 0 && n_head % n_kv_head == 0 && n_step != 0 &&
          n_k == n_v && n_q == (uint64_t)n_head * hd && n_k % ((uint64_t)n_kv_head * hd) == 0 &&
          chunk_len != 0 && max_chunks != 0 && n_partials == records + n_head && n_out == n_q)) {
        OP_GRID_WAIT();
        op_fail(tag, OP_ERR_SHAPE, __LINE__, 0, 0);
        return;
    }
    const uint64_t max_ctx = n_k / ((uint64_t)n_kv_head * hd);
    const int64_t pos0 = __ldcg(step);
    if (pos0 < 0 || (uint64_t)pos0 + 1 > max_ctx) {
        OP_GRID_WAIT();
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, 1);
        return;
    }
    const uint64_t kv_len = (uint64_t)pos0 + 1, lo = attn_first_key((uint64_t)pos0, window);
    if (hd == 64)
        ad_block<T, 64>(q, k, v, partials, out, n_head, n_kv_head, scale, softcap, max_ctx, lo,
                        kv_len, max_chunks, records, acc_s, tag);
    else if (hd == 128)
        ad_block<T, 128>(q, k, v, partials, out, n_head, n_kv_head, scale, softcap, max_ctx, lo,
                         kv_len, max_chunks, records, acc_s, tag);
    else
        ad_block<T, 256>(q, k, v, partials, out, n_head, n_kv_head, scale, softcap, max_ctx, lo,
                         kv_len, max_chunks, records, acc_s, tag);
}

#define ATTENTION_DECODE_KERNEL(NAME, T)                                                            \
    extern "C" __global__ void NAME(const float* q, const T* k, const T* v, const int32_t* step,      \
                                    float* partials, float* out, uint32_t n_head, uint32_t n_kv_head, \
                                    uint32_t hd, float scale, float softcap, uint32_t window,         \
                                    uint32_t chunk_len, uint32_t max_chunks, uint64_t n_q,            \
                                    uint64_t n_k, uint64_t n_v, uint64_t n_step, uint64_t n_partials, \
                                    uint64_t n_out) {                                                 \
        OP_GRID_ENTRY_LATE();                                                                         \
        attention_decode<T>(q, k, v, step, partials, out, n_head, n_kv_head, hd, scale, softcap,      \
                            window, chunk_len, max_chunks, n_q, n_k, n_v, n_step, n_partials, n_out,  \
                            op_tag(#NAME));                                                           \
    }

ATTENTION_DECODE_KERNEL(attention_decode_f32, float)
ATTENTION_DECODE_KERNEL(attention_decode_f16, __half)
