// The `fused_block` family: the fused decoder-block products (src/ops/fused_block.rs; CPU kernels
// in src/backend/cpu/kernels/fused_block.rs), one kernel per weight format and their `_shared`
// forms, built on the vector forms of matmul_blocks.cuh and matmul_dots.cuh and the activations
// of activation.cuh (compiled in front of this file):
//   norm_qkv_rope_<w>: x, norm, wq, wk, wv, positions, step, q, k_cache, v_cache, eps, dim,
//                      n_head, n_kv_head, head_dim, base, mode, cache_f16 (the caches f32, or f16
//                      where it is 1); norm_qkv_rope_<w>_v_<v> the same with wv of format <v>
//                      (a llama.cpp Q4_K_M file's blocks whose V is Q6_K)
//   norm_qkv_rope_ff_<w>: the same with the RoPE's frequency factors (f32, one a pair) after
//                      positions (Llama 3's `rope_freqs`)
//   norm_qkv_<w>:      x, norm, wq, wk, wv, q, k, v, eps, dim, n_q, n_kv: the same norm and
//                      products without the rotation, each product to its own f32 output (the
//                      blocks whose q and k take a per-head norm first); norm_qkv_<w>_v_<v> too
//   norm_gate_up_<w>:  x, norm, w_gate, w_up, hidden, eps, dim, ffn, act (0 SiLU, 1 GELU tanh)
// The optimizer makes them on a GPU for decode steps only: each block (one-row passes with shared
// memory) or warp normalizes the row, which a prefill pass would pay per output. A one-row pass
// of a 32-value block format given the memory for it also quantizes the normalized row to
// int8 (`fb_norm_quantize_row`; matmul_blocks.cuh's int8 activations) and sums every product
// with `dp4a`, whatever its size. (Keeping f32 for the products under MM_Q8_MIN_WEIGHTS, the
// plain matmul's rule, so that the fused kernels would give the separate ops' bits, cost 8B 272
// -> 263 tok/s and 1B 864 -> 820 on an H100: both arithmetic paths in one kernel. CUDA declares
// these fusions within rounding, not bit-exact.)
// The activation row (its norm, the shared row and its int8 quantization) is fused_row.cuh's,
// compiled in front of this file.

// Output pair p of a norm_qkv_rope row: which product (0 q, 1 k, 2 v), head h, pair i, its two
// output columns d0 and d1 and their weight rows a and b.
struct QkvTask {
    int which;
    uint32_t h, i, d0, d1;
    const uint8_t *a, *b;
};
// `row_bytes`: q's and k's row bytes, `row_bytes_v` v's.
__device__ __forceinline__ QkvTask qkv_task(uint64_t p, const uint8_t* wq, const uint8_t* wk,
                                            const uint8_t* wv, uint32_t n_head, uint32_t n_kv,
                                            uint32_t hd, uint32_t mode, uint64_t row_bytes,
                                            uint64_t row_bytes_v) {
    const uint32_t half = hd / 2;
    const uint64_t q_pairs = (uint64_t)n_head * half, kv_pairs = (uint64_t)n_kv * half;
    QkvTask t;
    t.which = 0;
    const uint8_t* w = wq;
    if (p >= q_pairs + kv_pairs) {
        t.which = 2;
        w = wv;
        row_bytes = row_bytes_v;
        p -= q_pairs + kv_pairs;
    } else if (p >= q_pairs) {
        t.which = 1;
        w = wk;
        p -= q_pairs;
    }
    t.h = (uint32_t)(p / half);
    t.i = (uint32_t)(p % half);
    t.d0 = mode == 1 ? t.i : 2 * t.i;
    t.d1 = mode == 1 ? t.i + half : 2 * t.i + 1;
    t.a = w + ((uint64_t)t.h * hd + t.d0) * row_bytes;
    t.b = w + ((uint64_t)t.h * hd + t.d1) * row_bytes;
    return t;
}

// The rotation frequency of pair i, base^(-2i / head_dim) in f64 (the rope kernel's arithmetic):
// a function of the kernel's arguments only, so a kernel may compute it before its grid wait.
__device__ __forceinline__ double fb_rope_freq(uint32_t i, uint32_t hd, float base) {
    return pow((double)base, -2.0 * (double)i / (double)hd);
}

// Pair i's angle at position `pos`, `pos * inv_freq / ff[i]` as the rope kernel computes it (the
// division left out where there are no frequency factors: dividing by 1 changes nothing).
__device__ __forceinline__ double fb_rope_angle(int32_t pos, double inv_freq, const float* ff,
                                                uint32_t i) {
    const double a = (double)pos * inv_freq;
    return ff == nullptr ? a : a / (double)ff[i];
}

// Whether a one-row pass of `pairs` output pairs splits each pair's sums between two warps of a
// block (a warp each half of k; the shared forms, blocks of whole warp pairs, at most 15 of them
// for the named barriers 1..15): more pairs than warps, k a multiple of 512 and each row's second
// half 16-byte aligned, so both halves take the same path through `mm_dot_pair`. The 8B's 3,072
// pairs on 2,112 warps took two rounds of a whole pair; split, three of half (docs/kernels.md
// item 19).
template <int FMT, int FMT_V>
__device__ __forceinline__ bool fb_qkv_split(uint64_t pairs, uint32_t k, const uint8_t* wq,
                                             const uint8_t* wk, const uint8_t* wv) {
    const uint64_t row_bytes = op_row_bytes(FMT, k), row_bytes_v = op_row_bytes(FMT_V, k);
    return pairs > mm_warp_count() && k % 512 == 0 && (row_bytes / 2) % 16 == 0 &&
           (row_bytes_v / 2) % 16 == 0 &&
           blockDim.x % 64 == 0 && blockDim.x <= 64 * 15 && blockDim.y == 1 &&
           (((uint64_t)wq | (uint64_t)wk | (uint64_t)wv) & 15u) == 0;
}

// The two warps of a split pair meet: named barrier 1 + (pair within the block), 64 threads.
__device__ __forceinline__ void fb_pair_sync() {
    asm volatile("bar.sync %0, 64;" ::"r"(1 + (threadIdx.x >> 6)) : "memory");
}

// Fills `tab` with (cos, sin) of position `pos` times each pair's frequency, rounded to f32 as
// the rope kernel rounds them; `freq` is this thread's pair's (threadIdx.x), computed early.
__device__ __forceinline__ void fb_rope_table(float2* tab, int32_t pos, uint32_t hd, float base,
                                              double freq, const float* ff) {
    for (uint32_t i = threadIdx.x; i < hd / 2; i += blockDim.x) {
        double s, c;
        sincos(fb_rope_angle(pos, i == threadIdx.x ? freq : fb_rope_freq(i, hd, base), ff, i), &s,
               &c);
        tab[i] = make_float2((float)c, (float)s);
    }
}

// The K and V caches of `norm_qkv_rope`: f32, or f16 where `half` (the `cache_f16` argument; the
// value rounded to nearest once, as `kv_write` into an f16 cache does); and the RoPE's frequency
// factors, one a pair (null: none; the `_ff` kernels).
struct FbKv {
    void* k;
    void* v;
    bool half;
    const float* ff;
    __device__ __forceinline__ void store(int which, uint64_t at, float x) const {
        void* c = which == 1 ? k : v;
        if (half) {
            ((__half*)c)[at] = __float2half_rn(x);
        } else {
            ((float*)c)[at] = x;
        }
    }
};

// q = rope(norm(x) Wq), k_cache[pos] = rope(norm(x) Wk), v_cache[pos] = norm(x) Wv for each row,
// one warp per output pair (the two values one rotation mixes; mode 0 pairs (2i, 2i + 1), mode 1
// (i, i + head_dim / 2)), the whole head rotating, angles as the rope kernel computes them (f64
// pow and sincos, the rotation in f32). Row r is position positions[r] and is written to cache
// row step[0] + r (a position outside the cache is a kernel error, nothing written).
// With `swap`, two warps a pair, each half of k (`fb_qkv_split`): the odd warp hands its sums to
// the even one through `swap` (two float2 a warp pair and round parity; one code path either
// way, as two paths in one kernel spilled registers). `rope`: the one row's (cos, sin) table
// (`fb_rope_table`), or null to compute each angle where it is used. The v products read weights
// of FMT_V (FMT's own where the three are of one format). Without ROPE (`norm_qkv`): no rotation
// and no cache; q, k (kv.k) and v (kv.v) are f32 [rows, heads * hd] outputs, `positions`,
// `step` and `rope` unread.
template <int FMT, int FMT_V, bool ROPE, typename RowX>
__device__ void norm_qkv_rope_rows(RowX row_x, const uint8_t* wq,
                              const uint8_t* wk, const uint8_t* wv, const int32_t* positions,
                              const int32_t* step, float* q, FbKv kv, uint32_t k,
                              uint32_t n_head, uint32_t n_kv, uint32_t hd, float base,
                              uint32_t mode, uint64_t n_pos, uint64_t n_kc, const float2* rope,
                              float2* swap, uint32_t tag) {
    const uint64_t rows = n_pos, max_ctx = n_kc / ((uint64_t)n_kv * hd);
    const int64_t pos0 = ROPE ? step[0] : 0;
    if (ROPE && (pos0 < 0 || (uint64_t)pos0 + rows > max_ctx)) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, rows);
        return;
    }
    const uint64_t pairs = ((uint64_t)n_head + 2 * n_kv) * (hd / 2);
    const uint64_t row_bytes = op_row_bytes(FMT, k), row_bytes_v = op_row_bytes(FMT_V, k);
    const int lane = threadIdx.x & 31;
    const bool even = (((uint64_t)wq | (uint64_t)wk | (uint64_t)wv) & 1u) == 0;
    // Split: warp 2j + h takes half h of pair j's sums.
    const bool split = swap != nullptr;
    const uint32_t h = split ? (uint32_t)(mm_warp_id() & 1) : 0;
    const uint64_t first = split ? mm_warp_id() / 2 : mm_warp_id();
    const uint64_t stride = split ? mm_warp_count() / 2 : mm_warp_count();
    const uint32_t kk = split ? k / 2 : k;
    uint32_t round = 0;
    for (uint64_t t = first; t < rows * pairs; t += stride, ++round) {
        const uint64_t r = t / pairs;
        const QkvTask task =
            qkv_task(t % pairs, wq, wk, wv, n_head, n_kv, hd, mode, row_bytes, row_bytes_v);
        const int which = task.which;
        const uint32_t i = task.i, d0 = task.d0, d1 = task.d1;
        const auto xn = row_x(r);
        float a, b;
        if (FMT_V != FMT && which == 2) {  // warp-uniform
            const uint64_t w_off = h * (row_bytes_v / 2);
            const bool blocks = even && mm_blocks_ok<FMT_V>(xn, task.a, k);
            mm_dot_pair<FMT_V>(xn.from(h * kk), task.a + w_off, task.b + w_off, kk, row_bytes_v,
                               lane, blocks, row_x.stage(), a, b);
        } else {
            const uint64_t w_off = h * (row_bytes / 2);
            const bool blocks = even && mm_blocks_ok<FMT>(xn, task.a, k);
            mm_dot_pair<FMT>(xn.from(h * kk), task.a + w_off, task.b + w_off, kk, row_bytes,
                             lane, blocks, row_x.stage(), a, b);
        }
        if (split) {
            float2* slot = swap + 2 * (threadIdx.x >> 6) + (round & 1);
            if (h == 1 && lane == 0) *slot = make_float2(a, b);
            fb_pair_sync();
            if (h == 1) continue;
            const float2 o = *slot;
            a += o.x;
            b += o.y;
        }
        if (lane != 0) continue;
        if (ROPE && which < 2) {
            float cf, sf;
            if (rope != nullptr) {
                cf = rope[i].x;
                sf = rope[i].y;
            } else {
                double s, c;
                sincos(fb_rope_angle(positions[r], fb_rope_freq(i, hd, base), kv.ff, i), &s, &c);
                cf = (float)c;
                sf = (float)s;
            }
            const float ra = a * cf - b * sf, rb = a * sf + b * cf;
            a = ra;
            b = rb;
        }
        if (which == 0) {
            float* qr = q + (r * n_head + task.h) * hd;
            qr[d0] = a;
            qr[d1] = b;
        } else if (!ROPE) {
            float* o = (float*)(which == 1 ? kv.k : kv.v) + (r * n_kv + task.h) * hd;
            o[d0] = a;
            o[d1] = b;
        } else {
            const uint64_t at = ((uint64_t)task.h * max_ctx + (uint64_t)pos0 + r) * hd;
            kv.store(which, at + d0, a);
            kv.store(which, at + d1, b);
        }
    }
}

// Bytes of dynamic shared memory before the rope table: the row, the tail and (where the row is
// quantized) the int8 row.
template <int FMT>
__device__ __forceinline__ uint32_t fb_table_offset(uint32_t k) {
    return 4u * k + FB_SHARED_TAIL + (fb_q8_ok<FMT>(k) ? MM_Q8_BYTES(k) : 0u);
}

// The shared form's one row: the rope table where the launch gives its 4 * hd bytes after the
// rest, the split where `fb_qkv_split` allows it.
template <int FMT, int FMT_V, bool ROPE, typename RowX>
__device__ void norm_qkv_rope_one(RowX row, const uint8_t* wq, const uint8_t* wk,
                                  const uint8_t* wv, const int32_t* positions, const int32_t* step,
                                  float* q, FbKv kv, uint32_t k, uint32_t n_head,
                                  uint32_t n_kv, uint32_t hd, float base, uint32_t mode,
                                  uint64_t n_kc, const float2* rope, uint32_t tag) {
    extern __shared__ __align__(16) float fb_smem[];
    // The sum-of-squares scratch, free once the row is written.
    float2* swap = (float2*)(fb_smem + k + 4 * MM_STAGE_WARPS * MM_STAGE_MAX_WORDS);
    norm_qkv_rope_rows<FMT, FMT_V, ROPE>(row, wq, wk, wv, positions, step, q, kv, k, n_head, n_kv,
                                   hd, base, mode, 1, n_kc, rope,
                                   fb_qkv_split<FMT, FMT_V>(((uint64_t)n_head + 2 * n_kv) * (hd / 2),
                                                            k, wq, wk, wv)
                                ? swap
                                : nullptr,
                            tag);
}

// SHARED: the `_shared` kernels (the row in shared memory where the launch gives it; the plain
// kernels never take that path, so their code is what it was before it existed). `freq`: this
// thread's pair's rotation frequency (`fb_rope_freq` of threadIdx.x). FMT_V: the v weights' format,
// whose int8 products (if any) read the row FMT's quantization writes.
template <int FMT, int FMT_V, bool SHARED>
__device__ void norm_qkv_rope(const float* x, const float* nw, const uint8_t* wq,
                              const uint8_t* wk, const uint8_t* wv, const int32_t* positions,
                              const int32_t* step, float* q, FbKv kv, float eps,
                              uint32_t k, uint32_t n_head, uint32_t n_kv, uint32_t hd, float base,
                              uint32_t mode, uint64_t n_x, uint64_t n_nw, uint64_t n_pos,
                              uint64_t n_step, uint64_t n_q, uint64_t n_kc, uint64_t n_vc,
                              double freq, uint32_t tag) {
    static_assert(FMT_V == FMT || (mm_q8_format<FMT>() == mm_q8_format<FMT_V>() &&
                                   mm_q8_swizzled<FMT>() == mm_q8_swizzled<FMT_V>()),
                  "the v products must read the int8 row as the q and k products do");
    OP_REQUIRE(k != 0 && k % op_block_elems(FMT) == 0 && k % op_block_elems(FMT_V) == 0 &&
               hd != 0 && hd % 2 == 0 && n_nw == k &&
               n_step != 0 && mode <= 1 && n_x == n_pos * k && n_q == n_pos * n_head * hd &&
               n_kc == n_vc && n_kv != 0 && n_kc % ((uint64_t)n_kv * hd) == 0);
    if (SHARED && fb_shared_ok(n_pos, x, nw, k)) {
        extern __shared__ __align__(16) float fb_smem[];
        float2* rope = nullptr;
        const uint32_t at = fb_table_offset<FMT>(k);
        if (mm_dynamic_smem() >= at + 4u * hd) {
            // Written before the row's barriers, read after them.
            rope = (float2*)((uint8_t*)fb_smem + at);
            fb_rope_table(rope, positions[0], hd, base, freq, kv.ff);
        }
        if (fb_q8_ok<FMT>(k)) {
            norm_qkv_rope_one<FMT, FMT_V, true>(fb_norm_quantize_row<FMT>(x, nw, k, eps), wq, wk, wv,
                                          positions, step, q, kv, k, n_head, n_kv, hd, base, mode,
                                          n_kc, rope, tag);
            return;
        }
        const FbShared row{fb_shared_row(x, nw, k, eps), k};
        norm_qkv_rope_one<FMT, FMT_V, true>(row, wq, wk, wv, positions, step, q, kv, k, n_head,
                                            n_kv, hd, base, mode, n_kc, rope, tag);
    } else {
        // One row given 4 * hd bytes: the rope table too, so that no warp computes an angle's f64
        // `pow` and `sincos` after its sums (SmolLM2's rows are normalized per warp).
        float2* rope = nullptr;
        if (n_pos == 1 && mm_dynamic_smem() >= 4u * hd) {
            extern __shared__ __align__(16) float fb_smem[];
            rope = (float2*)fb_smem;
            fb_rope_table(rope, positions[0], hd, base, freq, kv.ff);
            __syncthreads();
        }
        const FbPerWarp row{x, nw, k, eps, (int)(threadIdx.x & 31)};
        norm_qkv_rope_rows<FMT, FMT_V, true>(row, wq, wk, wv, positions, step, q, kv, k, n_head,
                                             n_kv, hd, base, mode, n_pos, n_kc, rope, nullptr, tag);
    }
}

// The norm and the three products without the rotation (`norm_qkv_<w>`): n_q / 2 "heads" of two
// q outputs and n_kv / 2 of k and v, each pair a warp's (mode 0's adjacent rows), so the work is
// norm_qkv_rope's with `norm_qkv_rope_rows`'s ROPE off.
template <int FMT, int FMT_V, bool SHARED>
__device__ void norm_qkv(const float* x, const float* nw, const uint8_t* wq, const uint8_t* wk,
                         const uint8_t* wv, float* q, float* ko, float* vo, float eps, uint32_t k,
                         uint32_t n_q, uint32_t n_kv, uint64_t n_x, uint64_t n_nw, uint64_t n_qo,
                         uint64_t n_ko, uint64_t n_vo, uint32_t tag) {
    static_assert(FMT_V == FMT || (mm_q8_format<FMT>() == mm_q8_format<FMT_V>() &&
                                   mm_q8_swizzled<FMT>() == mm_q8_swizzled<FMT_V>()),
                  "the v products must read the int8 row as the q and k products do");
    const uint64_t rows = k == 0 ? 0 : n_x / k;
    OP_REQUIRE(k != 0 && k % op_block_elems(FMT) == 0 && k % op_block_elems(FMT_V) == 0 &&
               n_nw == k && n_x % k == 0 && n_q != 0 && n_q % 2 == 0 && n_kv != 0 &&
               n_kv % 2 == 0 && n_qo == rows * n_q && n_ko == rows * n_kv && n_vo == n_ko);
    const FbKv kv{ko, vo, false, nullptr};
    const uint32_t heads = n_q / 2, kv_heads = n_kv / 2;
    if (SHARED && fb_shared_ok(rows, x, nw, k)) {
        if (fb_q8_ok<FMT>(k)) {
            norm_qkv_rope_one<FMT, FMT_V, false>(fb_norm_quantize_row<FMT>(x, nw, k, eps), wq, wk,
                                                 wv, nullptr, nullptr, q, kv, k, heads, kv_heads,
                                                 2, 1.0f, 0, n_ko, nullptr, tag);
            return;
        }
        const FbShared row{fb_shared_row(x, nw, k, eps), k};
        norm_qkv_rope_one<FMT, FMT_V, false>(row, wq, wk, wv, nullptr, nullptr, q, kv, k, heads,
                                             kv_heads, 2, 1.0f, 0, n_ko, nullptr, tag);
    } else {
        const FbPerWarp row{x, nw, k, eps, (int)(threadIdx.x & 31)};
        norm_qkv_rope_rows<FMT, FMT_V, false>(row, wq, wk, wv, nullptr, nullptr, q, kv, k, heads,
                                              kv_heads, 2, 1.0f, 0, rows, n_ko, nullptr, nullptr,
                                              tag);
    }
}

// hidden = act(norm(x) Wg) * (norm(x) Wu), one warp per output value; act SiLU (SwiGLU) or GELU
// tanh (GeGLU), activation.cuh's functions, which the elementwise `swiglu` / `geglu` kernels call.
template <int FMT, typename RowX>
__device__ void norm_gate_up_rows(RowX row_x, const uint8_t* wg, const uint8_t* wu, float* hidden,
                                  uint32_t k, uint32_t n, uint32_t act, uint64_t n_hidden) {
    const uint64_t row_bytes = op_row_bytes(FMT, k);
    const int lane = threadIdx.x & 31;
    const bool even = (((uint64_t)wg | (uint64_t)wu) & 1u) == 0;
    for (uint64_t t = mm_warp_id(); t < n_hidden; t += mm_warp_count()) {
        const uint64_t r = t / n, o = t % n;
        const auto xn = row_x(r);
        const bool blocks = even && mm_blocks_ok<FMT>(xn, wg, k);
        float g, u;
        mm_dot_pair<FMT>(xn, wg + o * row_bytes, wu + o * row_bytes, k, row_bytes, lane, blocks,
                         row_x.stage(), g, u);
        if (lane == 0) hidden[t] = (act == 1 ? act_gelu_tanh(g) : act_silu(g)) * u;
    }
}

template <int FMT, bool SHARED>
__device__ void norm_gate_up(const float* x, const float* nw, const uint8_t* wg, const uint8_t* wu,
                             float* hidden, float eps, uint32_t k, uint32_t n, uint32_t act,
                             uint64_t n_x, uint64_t n_nw, uint64_t n_hidden, uint32_t tag) {
    OP_REQUIRE(k != 0 && k % op_block_elems(FMT) == 0 && n_nw == k && n_x % k == 0 &&
               n_hidden == n_x / k * n && act <= 1);
    if (SHARED && fb_shared_ok(n_x / k, x, nw, k)) {
        if (fb_q8_ok<FMT>(k)) {
            norm_gate_up_rows<FMT>(fb_norm_quantize_row<FMT>(x, nw, k, eps), wg, wu, hidden, k,
                                   n, act, n_hidden);
            return;
        }
        const FbShared row{fb_shared_row(x, nw, k, eps), k};
        norm_gate_up_rows<FMT>(row, wg, wu, hidden, k, n, act, n_hidden);
    } else {
        const FbPerWarp row{x, nw, k, eps, (int)(threadIdx.x & 31)};
        norm_gate_up_rows<FMT>(row, wg, wu, hidden, k, n, act, n_hidden);
    }
}

// Before the grid wait (prelude.cuh): a one-row pass asks L2 for its warp's first output pair's
// two weight rows, which no earlier kernel writes (`mm_prefetch_row`, matmul_dots.cuh).
template <int FMT, int FMT_V, bool SHARED>
__device__ __forceinline__ void fb_prefetch_qkv(const float* x, const float* nw,
                                                const uint8_t* wq, const uint8_t* wk,
                                                const uint8_t* wv, uint32_t k, uint32_t n_head,
                                                uint32_t n_kv, uint32_t hd, uint32_t mode,
                                                uint64_t n_pos) {
    if (n_pos != 1 || k == 0 || k % op_block_elems(FMT) != 0 || k % op_block_elems(FMT_V) != 0 ||
        hd == 0 || hd % 2 != 0 || mode > 1)
        return;
    // Where the pass splits its pairs, each warp's half of its first pair's rows.
    const uint64_t pairs = ((uint64_t)n_head + 2 * n_kv) * (hd / 2);
    const bool split = SHARED && fb_shared_ok(n_pos, x, nw, k) &&
                       fb_qkv_split<FMT, FMT_V>(pairs, k, wq, wk, wv);
    const uint64_t t = split ? mm_warp_id() / 2 : mm_warp_id();
    if (t >= pairs) return;
    const QkvTask task = qkv_task(t, wq, wk, wv, n_head, n_kv, hd, mode, op_row_bytes(FMT, k),
                                  op_row_bytes(FMT_V, k));
    const uint64_t row_bytes = op_row_bytes(task.which == 2 ? FMT_V : FMT, k);
    const uint64_t off = split ? (mm_warp_id() & 1) * (row_bytes / 2) : 0;
    const uint64_t bytes = split ? row_bytes / 2 : row_bytes;
    mm_prefetch_row(task.a + off, bytes);
    mm_prefetch_row(task.b + off, bytes);
}
template <int FMT>
__device__ __forceinline__ void fb_prefetch_gate_up(const uint8_t* wg, const uint8_t* wu,
                                                    uint32_t k, uint32_t n, uint64_t n_x) {
    if (n_x != k || k == 0 || k % op_block_elems(FMT) != 0) return;
    const uint64_t o = mm_warp_id(), row_bytes = op_row_bytes(FMT, k);
    if (o >= n) return;
    mm_prefetch_row(wg + o * row_bytes, row_bytes);
    mm_prefetch_row(wu + o * row_bytes, row_bytes);
}

// At most 128 registers a thread, so that sixteen warps fit an SM: the shared form's blocks are
// eight warps, two an SM, or sixteen, one an SM, where the row is quantized (each SM then
// normalizes and quantizes it once); fewer warps an SM leave too few loads in flight. The
// per-warp forms keep the bounds of two 256-thread blocks (SmolLM2's step measured 1.6% slower
// with the shared forms' 512-thread bounds, the same register cap).
#define FB_BOUNDS(SH) __launch_bounds__((SH) ? 512 : 256, (SH) ? 1 : 2)
#define NORM_QKV_ROPE_KERNEL(NAME, FMT, SH) NORM_QKV_ROPE_MIXED_KERNEL(NAME, FMT, FMT, SH)
#define NORM_QKV_ROPE_MIXED_KERNEL(NAME, FMT, FMT_V, SH)                                                 \
    extern "C" __global__ FB_BOUNDS(SH) void NAME(                                                 \
        const float* x, const float* nw, const uint8_t* wq, const uint8_t* wk, const uint8_t* wv,    \
        const int32_t* positions, const int32_t* step, float* q, void* kc, void* vc, float eps,      \
        uint32_t k, uint32_t n_head, uint32_t n_kv, uint32_t hd, float base, uint32_t mode,          \
        uint32_t cache_f16, uint64_t n_x, uint64_t n_nw, uint64_t n_wq, uint64_t n_wk,               \
        uint64_t n_wv, uint64_t n_pos, uint64_t n_step, uint64_t n_q, uint64_t n_kc,                 \
        uint64_t n_vc) {                                                                             \
        fb_prefetch_qkv<FMT, FMT_V, SH>(x, nw, wq, wk, wv, k, n_head, n_kv, hd, mode, n_pos);         \
        const double rope_freq = fb_rope_freq(threadIdx.x, hd, base);                                \
        OP_GRID_ENTRY();                                                                             \
        const FbKv kv{kc, vc, cache_f16 != 0, nullptr};                                              \
        norm_qkv_rope<FMT, FMT_V, SH>(x, nw, wq, wk, wv, positions, step, q, kv, eps, k, n_head,    \
                                      n_kv, hd, base, mode, n_x, n_nw, n_pos, n_step, n_q, n_kc,    \
                                      n_vc, rope_freq, op_tag(#NAME));                              \
    }
// The same with the RoPE's frequency factors (Llama 3's `rope_freqs`, one a pair) after positions.
#define NORM_QKV_ROPE_FF_KERNEL(NAME, FMT, SH) NORM_QKV_ROPE_FF_MIXED_KERNEL(NAME, FMT, FMT, SH)
#define NORM_QKV_ROPE_FF_MIXED_KERNEL(NAME, FMT, FMT_V, SH)                                           \
    extern "C" __global__ FB_BOUNDS(SH) void NAME(                                                 \
        const float* x, const float* nw, const uint8_t* wq, const uint8_t* wk, const uint8_t* wv,    \
        const int32_t* positions, const float* ff, const int32_t* step, float* q, void* kc,          \
        void* vc, float eps, uint32_t k, uint32_t n_head, uint32_t n_kv, uint32_t hd, float base,    \
        uint32_t mode, uint32_t cache_f16, uint64_t n_x, uint64_t n_nw, uint64_t n_wq,               \
        uint64_t n_wk, uint64_t n_wv, uint64_t n_pos, uint64_t n_ff, uint64_t n_step, uint64_t n_q,  \
        uint64_t n_kc, uint64_t n_vc) {                                                              \
        fb_prefetch_qkv<FMT, FMT_V, SH>(x, nw, wq, wk, wv, k, n_head, n_kv, hd, mode, n_pos);         \
        const double rope_freq = fb_rope_freq(threadIdx.x, hd, base);                                \
        OP_GRID_ENTRY();                                                                             \
        const uint32_t tag = op_tag(#NAME);                                                          \
        OP_REQUIRE(n_ff == hd / 2);                                                                  \
        const FbKv kv{kc, vc, cache_f16 != 0, ff};                                                   \
        norm_qkv_rope<FMT, FMT_V, SH>(x, nw, wq, wk, wv, positions, step, q, kv, eps, k, n_head,    \
                                      n_kv, hd, base, mode, n_x, n_nw, n_pos, n_step, n_q, n_kc,    \
                                      n_vc, rope_freq, tag);                                        \
    }
#define NORM_QKV_KERNEL(NAME, FMT, SH) NORM_QKV_MIXED_KERNEL(NAME, FMT, FMT, SH)
#define NORM_QKV_MIXED_KERNEL(NAME, FMT, FMT_V, SH)                                                   \
    extern "C" __global__ FB_BOUNDS(SH) void NAME(                                                 \
        const float* x, const float* nw, const uint8_t* wq, const uint8_t* wk, const uint8_t* wv,    \
        float* q, float* ko, float* vo, float eps, uint32_t k, uint32_t n_q, uint32_t n_kv,          \
        uint64_t n_x, uint64_t n_nw, uint64_t n_wq, uint64_t n_wk, uint64_t n_wv, uint64_t n_qo,     \
        uint64_t n_ko, uint64_t n_vo) {                                                              \
        fb_prefetch_qkv<FMT, FMT_V, SH>(x, nw, wq, wk, wv, k, n_q / 2, n_kv / 2, 2, 0,               \
                                        k == 0 ? 0 : n_x / k);                               \
        OP_GRID_ENTRY();                                                                             \
        norm_qkv<FMT, FMT_V, SH>(x, nw, wq, wk, wv, q, ko, vo, eps, k, n_q, n_kv, n_x, n_nw, n_qo,  \
                                 n_ko, n_vo, op_tag(#NAME));                                         \
    }
#define NORM_GATE_UP_KERNEL(NAME, FMT, SH)                                                           \
    extern "C" __global__ FB_BOUNDS(SH) void NAME(                                                 \
        const float* x, const float* nw, const uint8_t* wg, const uint8_t* wu, float* hidden,         \
        float eps, uint32_t k, uint32_t n, uint32_t act, uint64_t n_x, uint64_t n_nw, uint64_t n_wg,  \
        uint64_t n_wu, uint64_t n_hidden) {                                                           \
        fb_prefetch_gate_up<FMT>(wg, wu, k, n, n_x);                                                  \
        OP_GRID_ENTRY();                                                                              \
        norm_gate_up<FMT, SH>(x, nw, wg, wu, hidden, eps, k, n, act, n_x, n_nw, n_hidden,             \
                              op_tag(#NAME));                                                         \
    }

NORM_QKV_ROPE_KERNEL(norm_qkv_rope_f32, OP_FMT_F32, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_f16, OP_FMT_F16, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_bf16, OP_FMT_BF16, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q4_0, OP_FMT_Q4_0, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q4_1, OP_FMT_Q4_1, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q5_0, OP_FMT_Q5_0, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q8_0, OP_FMT_Q8_0, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q4_k, OP_FMT_Q4_K, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_q6_k, OP_FMT_Q6_K, false)
NORM_GATE_UP_KERNEL(norm_gate_up_f32, OP_FMT_F32, false)
NORM_GATE_UP_KERNEL(norm_gate_up_f16, OP_FMT_F16, false)
NORM_GATE_UP_KERNEL(norm_gate_up_bf16, OP_FMT_BF16, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q4_0, OP_FMT_Q4_0, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q4_1, OP_FMT_Q4_1, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q5_0, OP_FMT_Q5_0, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q8_0, OP_FMT_Q8_0, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q4_k, OP_FMT_Q4_K, false)
NORM_GATE_UP_KERNEL(norm_gate_up_q6_k, OP_FMT_Q6_K, false)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_f32, OP_FMT_F32, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_f16, OP_FMT_F16, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_bf16, OP_FMT_BF16, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q4_0, OP_FMT_Q4_0, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q4_1, OP_FMT_Q4_1, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q5_0, OP_FMT_Q5_0, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q8_0, OP_FMT_Q8_0, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q4_k, OP_FMT_Q4_K, true)
NORM_QKV_ROPE_KERNEL(norm_qkv_rope_shared_q6_k, OP_FMT_Q6_K, true)
// Q4_K q and k with Q6_K v (llama.cpp's Q4_K_M gives half the blocks' v more bits).
NORM_QKV_ROPE_MIXED_KERNEL(norm_qkv_rope_q4_k_v_q6_k, OP_FMT_Q4_K, OP_FMT_Q6_K, false)
NORM_QKV_ROPE_MIXED_KERNEL(norm_qkv_rope_shared_q4_k_v_q6_k, OP_FMT_Q4_K, OP_FMT_Q6_K, true)
// Their fallbacks where rows are not whole super-blocks (Gemma 3's 640): Q5_0 with Q8_0 v.
NORM_QKV_ROPE_MIXED_KERNEL(norm_qkv_rope_q5_0_v_q8_0, OP_FMT_Q5_0, OP_FMT_Q8_0, false)
NORM_QKV_ROPE_MIXED_KERNEL(norm_qkv_rope_shared_q5_0_v_q8_0, OP_FMT_Q5_0, OP_FMT_Q8_0, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_f32, OP_FMT_F32, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_f16, OP_FMT_F16, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_bf16, OP_FMT_BF16, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q4_0, OP_FMT_Q4_0, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q4_1, OP_FMT_Q4_1, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q5_0, OP_FMT_Q5_0, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q8_0, OP_FMT_Q8_0, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q4_k, OP_FMT_Q4_K, true)
NORM_GATE_UP_KERNEL(norm_gate_up_shared_q6_k, OP_FMT_Q6_K, true)
NORM_QKV_KERNEL(norm_qkv_f32, OP_FMT_F32, false)
NORM_QKV_KERNEL(norm_qkv_f16, OP_FMT_F16, false)
NORM_QKV_KERNEL(norm_qkv_bf16, OP_FMT_BF16, false)
NORM_QKV_KERNEL(norm_qkv_q4_0, OP_FMT_Q4_0, false)
NORM_QKV_KERNEL(norm_qkv_q4_1, OP_FMT_Q4_1, false)
NORM_QKV_KERNEL(norm_qkv_q5_0, OP_FMT_Q5_0, false)
NORM_QKV_KERNEL(norm_qkv_q8_0, OP_FMT_Q8_0, false)
NORM_QKV_KERNEL(norm_qkv_q4_k, OP_FMT_Q4_K, false)
NORM_QKV_KERNEL(norm_qkv_q6_k, OP_FMT_Q6_K, false)
NORM_QKV_KERNEL(norm_qkv_shared_f32, OP_FMT_F32, true)
NORM_QKV_KERNEL(norm_qkv_shared_f16, OP_FMT_F16, true)
NORM_QKV_KERNEL(norm_qkv_shared_bf16, OP_FMT_BF16, true)
NORM_QKV_KERNEL(norm_qkv_shared_q4_0, OP_FMT_Q4_0, true)
NORM_QKV_KERNEL(norm_qkv_shared_q4_1, OP_FMT_Q4_1, true)
NORM_QKV_KERNEL(norm_qkv_shared_q5_0, OP_FMT_Q5_0, true)
NORM_QKV_KERNEL(norm_qkv_shared_q8_0, OP_FMT_Q8_0, true)
NORM_QKV_KERNEL(norm_qkv_shared_q4_k, OP_FMT_Q4_K, true)
NORM_QKV_KERNEL(norm_qkv_shared_q6_k, OP_FMT_Q6_K, true)
NORM_QKV_MIXED_KERNEL(norm_qkv_q4_k_v_q6_k, OP_FMT_Q4_K, OP_FMT_Q6_K, false)
NORM_QKV_MIXED_KERNEL(norm_qkv_shared_q4_k_v_q6_k, OP_FMT_Q4_K, OP_FMT_Q6_K, true)
NORM_QKV_MIXED_KERNEL(norm_qkv_q5_0_v_q8_0, OP_FMT_Q5_0, OP_FMT_Q8_0, false)
NORM_QKV_MIXED_KERNEL(norm_qkv_shared_q5_0_v_q8_0, OP_FMT_Q5_0, OP_FMT_Q8_0, true)
// With Llama 3's frequency factors.
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_f32, OP_FMT_F32, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_f16, OP_FMT_F16, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_bf16, OP_FMT_BF16, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_q4_0, OP_FMT_Q4_0, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_q4_1, OP_FMT_Q4_1, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_q5_0, OP_FMT_Q5_0, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_q8_0, OP_FMT_Q8_0, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_q4_k, OP_FMT_Q4_K, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_q6_k, OP_FMT_Q6_K, false)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_f32, OP_FMT_F32, true)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_f16, OP_FMT_F16, true)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_bf16, OP_FMT_BF16, true)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_q4_0, OP_FMT_Q4_0, true)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_q4_1, OP_FMT_Q4_1, true)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_q5_0, OP_FMT_Q5_0, true)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_q8_0, OP_FMT_Q8_0, true)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_q4_k, OP_FMT_Q4_K, true)
NORM_QKV_ROPE_FF_KERNEL(norm_qkv_rope_ff_shared_q6_k, OP_FMT_Q6_K, true)
NORM_QKV_ROPE_FF_MIXED_KERNEL(norm_qkv_rope_ff_q4_k_v_q6_k, OP_FMT_Q4_K, OP_FMT_Q6_K, false)
NORM_QKV_ROPE_FF_MIXED_KERNEL(norm_qkv_rope_ff_shared_q4_k_v_q6_k, OP_FMT_Q4_K, OP_FMT_Q6_K, true)
NORM_QKV_ROPE_FF_MIXED_KERNEL(norm_qkv_rope_ff_q5_0_v_q8_0, OP_FMT_Q5_0, OP_FMT_Q8_0, false)
NORM_QKV_ROPE_FF_MIXED_KERNEL(norm_qkv_rope_ff_shared_q5_0_v_q8_0, OP_FMT_Q5_0, OP_FMT_Q8_0, true)
