// The `rope` family: rotary position embedding, as the CPU kernels
// (src/backend/cpu/kernels/rope.rs). Row r (n_heads heads of head_dim values) turns by
// positions[r]; pair i < rotary_dim / 2 turns by pos * base^(-2i / rotary_dim) / freq_factor_i,
// angle, sine and cosine in f64 once per row, the rotation in f32. Mode 0 pairs (2i, 2i + 1),
// mode 1 pairs (i, i + rotary_dim / 2). Values past rotary_dim are copied unchanged.
// One block per row (grid-stride over rows). Also the per-head norm fused with RoPE (at the end;
// its norm row code is norm_row.cuh, in front of this file).

#define ROPE_MAX_PAIRS 512

// Fills the (cos, sin) table of the `pairs` angles of position `pos` (f64, rounded to f32) and
// synchronizes the block before (the table's last readers) and after (its readers). Every thread
// of the block must call it.
__device__ __forceinline__ void rope_angles(int32_t pos_i, const float* ff, float base,
                                            uint32_t rotary_dim, float* cs_cos, float* cs_sin) {
    const uint32_t pairs = rotary_dim / 2;
    const double pos = (double)pos_i;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
        double inv_freq = pow((double)base, -2.0 * (double)i / (double)rotary_dim);
        double f = ff == nullptr ? 1.0 : (double)ff[i];
        double s, c;
        sincos(pos * inv_freq / f, &s, &c);
        cs_cos[i] = (float)c;
        cs_sin[i] = (float)s;
    }
    __syncthreads();
}

// Rotates the `heads` heads of one row: reads xr, writes o (which may be xr), pairs as `mode`.
template <typename T>
__device__ __forceinline__ void rope_rotate(const T* xr, T* o, uint32_t heads, uint32_t head_dim,
                                            uint32_t pairs, uint32_t mode, const float* cs_cos,
                                            const float* cs_sin) {
    for (uint32_t t = threadIdx.x; t < heads * pairs; t += blockDim.x) {
        const uint32_t h = t / pairs, i = t % pairs;
        const uint32_t j0 = h * head_dim + (mode == 1 ? i : 2 * i);
        const uint32_t j1 = h * head_dim + (mode == 1 ? i + pairs : 2 * i + 1);
        const float a = op_load(xr, j0), b = op_load(xr, j1);
        const float c = cs_cos[i], s = cs_sin[i];
        op_store(o, j0, a * c - b * s);
        op_store(o, j1, a * s + b * c);
    }
}

template <typename T>
__device__ void rope_rows(const T* x, const int32_t* positions, const float* ff, T* out,
                          uint32_t head_dim, uint32_t rotary_dim, float base, uint32_t mode,
                          uint64_t rows, uint64_t n_out, uint64_t n_ff) {
    __shared__ float cs_cos[ROPE_MAX_PAIRS];
    __shared__ float cs_sin[ROPE_MAX_PAIRS];
    const uint32_t pairs = rotary_dim / 2;
    if (rows == 0 || head_dim == 0 || n_out % rows != 0 || rotary_dim % 2 != 0 ||
        rotary_dim > head_dim || pairs > ROPE_MAX_PAIRS || mode > 1)
        return;
    if (ff != nullptr && n_ff != pairs) return;
    const uint64_t row_len = n_out / rows;
    if (row_len % head_dim != 0) return;
    const uint32_t heads = (uint32_t)(row_len / head_dim);
    OP_ROW_LOOP(r, rows) {
        rope_angles(positions[r], ff, base, rotary_dim, cs_cos, cs_sin);
        const T* xr = (x == nullptr ? out : x) + r * row_len;
        T* o = out + r * row_len;
        rope_rotate<T>(xr, o, heads, head_dim, pairs, mode, cs_cos, cs_sin);
        if (x != nullptr) {
            const uint32_t pass = head_dim - rotary_dim;
            for (uint32_t t = threadIdx.x; t < heads * pass; t += blockDim.x) {
                const uint32_t j = (t / pass) * head_dim + rotary_dim + t % pass;
                o[j] = xr[j];
            }
        }
    }
}

#define ROPE_KERNEL(NAME, T)                                                                        \
    extern "C" __global__ void NAME(const T* x, const int32_t* positions, T* out, uint32_t head_dim,  \
                                    uint32_t rotary_dim, float base, uint32_t mode, uint64_t n_x,     \
                                    uint64_t n_pos, uint64_t n_out) {                                 \
        OP_GRID_ENTRY();                                                                              \
        if (n_x != n_out) return;                                                                     \
        rope_rows<T>(x, positions, nullptr, out, head_dim, rotary_dim, base, mode, n_pos, n_out, 0);  \
    }
#define ROPE_FF_KERNEL(NAME, T)                                                                     \
    extern "C" __global__ void NAME(const T* x, const int32_t* positions, const float* ff, T* out,    \
                                    uint32_t head_dim, uint32_t rotary_dim, float base,               \
                                    uint32_t mode, uint64_t n_x, uint64_t n_pos, uint64_t n_ff,       \
                                    uint64_t n_out) {                                                 \
        OP_GRID_ENTRY();                                                                              \
        if (n_x != n_out) return;                                                                     \
        rope_rows<T>(x, positions, ff, out, head_dim, rotary_dim, base, mode, n_pos, n_out, n_ff);    \
    }
#define ROPE_INPLACE_KERNEL(NAME, T)                                                                \
    extern "C" __global__ void NAME(T* x, const int32_t* positions, uint32_t head_dim,                \
                                    uint32_t rotary_dim, float base, uint32_t mode, uint64_t n_x,     \
                                    uint64_t n_pos) {                                                 \
        OP_GRID_ENTRY();                                                                              \
        rope_rows<T>(nullptr, positions, nullptr, x, head_dim, rotary_dim, base, mode, n_pos, n_x, 0);\
    }
#define ROPE_FF_INPLACE_KERNEL(NAME, T)                                                             \
    extern "C" __global__ void NAME(T* x, const int32_t* positions, const float* ff,                  \
                                    uint32_t head_dim, uint32_t rotary_dim, float base,               \
                                    uint32_t mode, uint64_t n_x, uint64_t n_pos, uint64_t n_ff) {     \
        OP_GRID_ENTRY();                                                                              \
        rope_rows<T>(nullptr, positions, ff, x, head_dim, rotary_dim, base, mode, n_pos, n_x, n_ff);  \
    }

ROPE_KERNEL(rope_f32, float)
ROPE_KERNEL(rope_f16, __half)
ROPE_KERNEL(rope_bf16, __nv_bfloat16)
ROPE_FF_KERNEL(rope_ff_f32, float)
ROPE_FF_KERNEL(rope_ff_f16, __half)
ROPE_FF_KERNEL(rope_ff_bf16, __nv_bfloat16)
ROPE_INPLACE_KERNEL(rope_f32_inplace, float)
ROPE_INPLACE_KERNEL(rope_f16_inplace, __half)
ROPE_INPLACE_KERNEL(rope_bf16_inplace, __nv_bfloat16)
ROPE_FF_INPLACE_KERNEL(rope_ff_f32_inplace, float)
ROPE_FF_INPLACE_KERNEL(rope_ff_f16_inplace, __half)
ROPE_FF_INPLACE_KERNEL(rope_ff_bf16_inplace, __nv_bfloat16)

// The per-head RMS norm fused with the in-place RoPE after it (src/ops/norm_rope.rs): x, weight
// ([head_dim]), positions, out (not aliasing x), eps, head_dim, rotary_dim, base, mode; f32, no
// frequency factors. One block per row (grid-stride), launched with the norm's block size: each
// head of the row is normalized into `out` by rms_norm_row (norm_row.cuh), then rope_angles
// synchronizes the block and the heads rotate in place, as rope_f32_inplace rotates them. The
// same code with the same block size gives the bits of `rms_norm` then `rope`.
extern "C" __global__ void rms_norm_rope_f32(const float* x, const float* w,
                                             const int32_t* positions, float* out, float eps,
                                             uint32_t head_dim, uint32_t rotary_dim, float base,
                                             uint32_t mode, uint64_t n_x, uint64_t n_w,
                                             uint64_t n_pos, uint64_t n_out) {
    OP_GRID_ENTRY();
    __shared__ double scratch[32];
    __shared__ float cs_cos[ROPE_MAX_PAIRS];
    __shared__ float cs_sin[ROPE_MAX_PAIRS];
    const uint32_t pairs = rotary_dim / 2;
    const uint64_t rows = n_pos;
    if (n_x != n_out || n_w != head_dim || rows == 0 || head_dim == 0 || n_out % rows != 0 ||
        rotary_dim % 2 != 0 || rotary_dim > head_dim || pairs > ROPE_MAX_PAIRS || mode > 1)
        return;
    const uint64_t row_len = n_out / rows;
    if (row_len % head_dim != 0) return;
    const uint32_t heads = (uint32_t)(row_len / head_dim);
    OP_ROW_LOOP(r, rows) {
        for (uint32_t h = 0; h < heads; ++h) {
            const uint64_t at = r * row_len + (uint64_t)h * head_dim;
            rms_norm_row<float, false>(x + at, w, nullptr, out + at, eps, head_dim, scratch);
        }
        rope_angles(positions[r], nullptr, base, rotary_dim, cs_cos, cs_sin);
        float* o = out + r * row_len;
        rope_rotate<float>(o, o, heads, head_dim, pairs, mode, cs_cos, cs_sin);
    }
}

// A prompt's RoPE on q and k and its k and v rows written into f32 KV caches, or f16 ones where
// `cache_f16` (each value rounded to nearest once, as kv_write_f32_f16 rounds it),
// [n_kv_head, max_ctx, head_dim] at rows step[0] + r (`rope_kv_f32`, `rope_ff_kv_f32`; the fusion
// of src/ops/rope_kv.rs): q rotates in place as rope_f32_inplace rotates it, each k value is the
// same rotation (`a c - b s`, `a s + b c` of the row's table) written straight to the cache, the
// values past rotary_dim copied, and v is copied as kv_write_f32_f32 copies it. One block per row
// (grid-stride), one table of angles per row for q and k. A step that leaves no room for the rows
// is a kernel error before anything is written, as kv_write's.
template <bool FF>
__device__ void rope_kv(float* q, const float* k, const float* v, const int32_t* positions,
                        const float* ff, const int32_t* step, void* kc, void* vc,
                        uint32_t head_dim, uint32_t rotary_dim, float base, uint32_t mode,
                        uint32_t n_kv_head, uint32_t cache_f16, uint64_t n_q, uint64_t n_k, uint64_t n_v,
                        uint64_t n_pos, uint64_t n_ff, uint64_t n_step, uint64_t n_kc,
                        uint64_t n_vc, uint32_t tag) {
    __shared__ float cs_cos[ROPE_MAX_PAIRS];
    __shared__ float cs_sin[ROPE_MAX_PAIRS];
    const uint32_t pairs = rotary_dim / 2;
    const uint64_t rows = n_pos, row_kv = (uint64_t)n_kv_head * head_dim;
    OP_REQUIRE(rows != 0 && head_dim != 0 && row_kv != 0 && rotary_dim % 2 == 0 &&
               rotary_dim <= head_dim && pairs <= ROPE_MAX_PAIRS && mode <= 1 &&
               (!FF || n_ff == pairs) && n_step != 0);
    OP_REQUIRE(n_q % rows == 0 && (n_q / rows) % head_dim == 0 && n_k == rows * row_kv &&
               n_v == n_k && n_kc == n_vc && n_kc % row_kv == 0);
    const uint64_t q_len = n_q / rows, max_ctx = n_kc / row_kv;
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + rows > max_ctx) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, rows);
        return;
    }
    const uint32_t kv_len = (uint32_t)row_kv;
    OP_ROW_LOOP(r, rows) {
        rope_angles(positions[r], FF ? ff : nullptr, base, rotary_dim, cs_cos, cs_sin);
        float* qr = q + r * q_len;
        rope_rotate<float>(qr, qr, (uint32_t)(q_len / head_dim), head_dim, pairs, mode, cs_cos,
                           cs_sin);
        const float* kr = k + r * row_kv;
        const float* vr = v + r * row_kv;
        for (uint32_t t = threadIdx.x; t < kv_len; t += blockDim.x) {
            const uint32_t h = t / head_dim, d = t % head_dim;
            const float* kh = kr + h * head_dim;
            float val = kh[d];
            if (d < rotary_dim) {
                // The pair of d, and whether d is its first value.
                const uint32_t i = mode == 1 ? d % pairs : d / 2;
                const bool first = mode == 1 ? d < pairs : d % 2 == 0;
                const float a = kh[mode == 1 ? i : 2 * i], b = kh[mode == 1 ? i + pairs : 2 * i + 1];
                const float c = cs_cos[i], s = cs_sin[i];
                val = first ? a * c - b * s : a * s + b * c;
            }
            const uint64_t at = ((uint64_t)h * max_ctx + (uint64_t)pos0 + r) * head_dim + d;
            if (cache_f16 != 0) {
                ((__half*)kc)[at] = __float2half_rn(val);
                ((__half*)vc)[at] = __float2half_rn(vr[t]);
            } else {
                ((float*)kc)[at] = val;
                ((float*)vc)[at] = vr[t];
            }
        }
    }
}

extern "C" __global__ void rope_kv_f32(float* q, const float* k, const float* v,
                                       const int32_t* positions, const int32_t* step,
                                       void* k_cache, void* v_cache, uint32_t head_dim,
                                       uint32_t rotary_dim, float base, uint32_t mode,
                                       uint32_t n_kv_head, uint32_t cache_f16, uint64_t n_q,
                                       uint64_t n_k,
                                       uint64_t n_v, uint64_t n_pos, uint64_t n_step,
                                       uint64_t n_kc, uint64_t n_vc) {
    OP_GRID_ENTRY();
    rope_kv<false>(q, k, v, positions, nullptr, step, k_cache, v_cache, head_dim, rotary_dim,
                   base, mode, n_kv_head, cache_f16, n_q, n_k, n_v, n_pos, 0, n_step, n_kc, n_vc,
                   op_tag("rope_kv_f32"));
}

extern "C" __global__ void rope_ff_kv_f32(float* q, const float* k, const float* v,
                                          const int32_t* positions, const float* ff,
                                          const int32_t* step, void* k_cache, void* v_cache,
                                          uint32_t head_dim, uint32_t rotary_dim, float base,
                                          uint32_t mode, uint32_t n_kv_head, uint32_t cache_f16,
                                          uint64_t n_q,
                                          uint64_t n_k, uint64_t n_v, uint64_t n_pos,
                                          uint64_t n_ff, uint64_t n_step, uint64_t n_kc,
                                          uint64_t n_vc) {
    OP_GRID_ENTRY();
    rope_kv<true>(q, k, v, positions, ff, step, k_cache, v_cache, head_dim, rotary_dim, base,
                  mode, n_kv_head, cache_f16, n_q, n_k, n_v, n_pos, n_ff, n_step, n_kc, n_vc,
                  op_tag("rope_ff_kv_f32"));
}
