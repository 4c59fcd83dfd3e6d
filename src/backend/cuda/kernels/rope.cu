// The `rope` family: rotary position embedding, as the CPU kernels
// (src/backend/cpu/kernels/rope.rs). Row r (n_heads heads of head_dim values) turns by
// positions[r]; pair i < rotary_dim / 2 turns by pos * base^(-2i / rotary_dim) / freq_factor_i,
// angle, sine and cosine in f64 once per row, the rotation in f32. Mode 0 pairs (2i, 2i + 1),
// mode 1 pairs (i, i + rotary_dim / 2). Values past rotary_dim are copied unchanged.
// One block per row (grid-stride over rows). Also the per-head norm fused with RoPE (at the end;
// a warp a head, reducing as norm_row.cuh's `rms_norm_row` reduces in a block).

#define ROPE_MAX_PAIRS 512

// Fills the (cos, sin) table of the `pairs` angles of position `pos` (f64, rounded to f32) and
// synchronizes the block before (the table's last readers) and after (its readers). Every thread
// of the block must call it.
__device__ __forceinline__ void rope_angles_fill(int32_t pos_i, const float* ff, float base,
                                                 uint32_t rotary_dim, float* cs_cos, float* cs_sin) {
    const uint32_t pairs = rotary_dim / 2;
    const double pos = (double)pos_i;
    for (uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
        double inv_freq = pow((double)base, -2.0 * (double)i / (double)rotary_dim);
        double f = ff == nullptr ? 1.0 : (double)ff[i];
        double s, c;
        sincos(pos * inv_freq / f, &s, &c);
        cs_cos[i] = (float)c;
        cs_sin[i] = (float)s;
    }
}
// This thread's pair's inverse frequency, base^(-2 threadIdx.x / rotary_dim) as rope_angles_fill
// computes it: a function of the arguments alone, so a kernel may compute it before its grid wait.
__device__ __forceinline__ double rope_own_freq(float base, uint32_t rotary_dim) {
    return pow((double)base, -2.0 * (double)threadIdx.x / (double)rotary_dim);
}
// rope_angles_fill without frequency factors, taking this thread's pair's inverse frequency from
// `own` (rope_own_freq): the same table, its `pow` off the chain after the wait.
__device__ __forceinline__ void rope_angles_fill_own(int32_t pos_i, double own, float base,
                                                     uint32_t rotary_dim, float* cs_cos,
                                                     float* cs_sin) {
    const uint32_t pairs = rotary_dim / 2;
    const double pos = (double)pos_i;
    for (uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
        const double inv_freq = i == threadIdx.x
                                    ? own
                                    : pow((double)base, -2.0 * (double)i / (double)rotary_dim);
        double s, c;
        sincos(pos * inv_freq / 1.0, &s, &c);
        cs_cos[i] = (float)c;
        cs_sin[i] = (float)s;
    }
}
__device__ __forceinline__ void rope_angles(int32_t pos_i, const float* ff, float base,
                                            uint32_t rotary_dim, float* cs_cos, float* cs_sin) {
    __syncthreads();
    rope_angles_fill(pos_i, ff, base, rotary_dim, cs_cos, cs_sin);
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
// frequency factors. A warp per head: block b takes row b / g and its heads `warps` (b % g) ..,
// one a warp, g = ceil(heads / warps) blocks a row (grid-stride over them). The block fills its
// row's angle table (rope_angles), then each warp reduces its head as a block of
// RNR_NORM_THREADS threads of the `rms_norm` kernel does (the norm's block size,
// src/ops/norm.rs `ROW_THREADS`): it keeps the partial sum of each of that block's warps
// (`rnr_head_sum`), adds each with its shuffle tree and those totals as op_block_sum_f64 adds
// them, so `inv` is that kernel's; each value is (x * inv) * w in f32 and the pairs rotate as
// rope_f32_inplace rotates them: the bits of `rms_norm` then `rope`. Given (1 + warps) head_dim
// floats of dynamic shared memory, the block stages the weight and each warp its head there
// first (every load of a head in flight at once), else they read global memory. One block a row
// took the heads one after another before (16 block reductions a row for Qwen 3's queries).
#define RNR_NORM_THREADS 256u
#define RNR_NORM_WARPS (RNR_NORM_THREADS / 32u)
// The longest head the stage takes (the host gives the stage to heads that fit 48 KiB anyway),
// with blocks of RNR_NORM_THREADS threads: each thread loads at most four of the weight's values.
#define RNR_STAGE_MAX 1024u

// The block's sum from the partial sums of its RNR_NORM_WARPS warps' threads (part[q]: lane l
// holds thread 32 q + l's), added as op_block_sum_f64 adds them: each warp's shuffle tree, then
// lane q holding warp q's total (0 past the warps) and a shuffle tree of those.
__device__ __forceinline__ double rnr_block_sum(double (&part)[RNR_NORM_WARPS], uint32_t lane) {
#pragma unroll
    for (uint32_t q = 0; q < RNR_NORM_WARPS; ++q) {
        for (int o = 16; o > 0; o >>= 1) part[q] += __shfl_xor_sync(ONEPASS_FULL_MASK, part[q], o);
    }
    double t = 0.0;
#pragma unroll
    for (uint32_t q = 0; q < RNR_NORM_WARPS; ++q) {
        if (lane == q) t = part[q];
    }
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(ONEPASS_FULL_MASK, t, o);
    return t;
}

// The sum of squares of the `dim` values of `xr` as op_block_sum_f64 adds them in a block of
// RNR_NORM_THREADS threads whose thread t sums values t, t + RNR_NORM_THREADS, ... (rms_norm_row).
__device__ __forceinline__ double rnr_head_sum(const float* xr, uint32_t dim, uint32_t lane) {
    double part[RNR_NORM_WARPS];
#pragma unroll
    for (uint32_t q = 0; q < RNR_NORM_WARPS; ++q) {
        double ss = 0.0;
        for (uint32_t i = 32 * q + lane; i < dim; i += RNR_NORM_THREADS) {
            const double v = (double)xr[i];
            ss += v * v;
        }
        part[q] = ss;
    }
    return rnr_block_sum(part, lane);
}

// Whether a head takes the register form: NeoX pairs turning the whole head of at most
// RNR_NORM_THREADS values, a whole number of pairs a lane, so that lane l holds values l + 32 k
// and each of its pairs' two values (k and k + pairs / 32).
__device__ __forceinline__ bool rnr_regs_ok(uint32_t head_dim, uint32_t rotary_dim,
                                            uint32_t mode) {
    return mode == 1 && rotary_dim == head_dim && head_dim <= RNR_NORM_THREADS &&
           (head_dim / 2) % 32 == 0;
}

// A warp's head of the register form: lane l's values l + 32 k (k < head_dim / 32) of `src` and
// of the weight `w`.
__device__ __forceinline__ void rnr_regs_load(const float* src, const float* w, uint32_t head_dim,
                                              uint32_t lane, float (&v)[RNR_NORM_WARPS],
                                              float (&wv)[RNR_NORM_WARPS]) {
    const uint32_t per_lane = head_dim / 32;
#pragma unroll
    for (uint32_t k = 0; k < RNR_NORM_WARPS; ++k) {
        v[k] = k < per_lane ? src[lane + 32 * k] : 0.0f;
        wv[k] = k < per_lane ? w[lane + 32 * k] : 0.0f;
    }
}

// Normalizes and rotates a head loaded by rnr_regs_load (the block's angle table filled), handing
// each rotated pair (i, i + pairs) to `put(i, first, second)`: the arithmetic of `rms_norm` then
// `rope` (the reduction in the norm's block order, `(v * inv) * w`, the rotation in f32).
template <typename Put>
__device__ __forceinline__ void rnr_regs_head(const float (&v)[RNR_NORM_WARPS],
                                              const float (&wv)[RNR_NORM_WARPS], float eps,
                                              uint32_t head_dim, uint32_t lane,
                                              const float* cs_cos, const float* cs_sin, Put put) {
    const uint32_t per_lane = head_dim / 32;
    // Thread 32 q + l of the norm's block holds value 32 q + l alone: 0.0 + v v.
    double part[RNR_NORM_WARPS];
#pragma unroll
    for (uint32_t q = 0; q < RNR_NORM_WARPS; ++q) {
        part[q] = q < per_lane ? (double)v[q] * (double)v[q] : 0.0;
    }
    const double ss = rnr_block_sum(part, lane);
    const float inv = (float)(1.0 / sqrt(ss / (double)head_dim + (double)eps));
    float y[RNR_NORM_WARPS];
#pragma unroll
    for (uint32_t k = 0; k < RNR_NORM_WARPS; ++k) y[k] = (v[k] * inv) * wv[k];
#pragma unroll
    for (uint32_t p = 0; p < RNR_NORM_WARPS / 2; ++p) {
        if (p >= per_lane / 2) break;
        const uint32_t i = lane + 32 * p;
        const float a = y[p], c = y[p + per_lane / 2], cs = cs_cos[i], sn = cs_sin[i];
        put(i, a * cs - c * sn, a * sn + c * cs);
    }
}

// One row's heads in the register form (rnr_regs_ok): each warp loads its head and the weight
// before the block computes the angles, then reduces, normalizes and rotates from registers.
__device__ __forceinline__ void rnr_regs_row(const float* x, const float* w, float* out,
                                             int32_t pos, float eps, uint32_t head_dim,
                                             float base, uint32_t h, uint32_t heads,
                                             uint64_t at, float* cs_cos, float* cs_sin) {
    const uint32_t lane = threadIdx.x & 31, pairs = head_dim / 2;
    const bool mine = h < heads;  // warp-uniform
    float v[RNR_NORM_WARPS], wv[RNR_NORM_WARPS];
    if (mine) rnr_regs_load(x + at, w, head_dim, lane, v, wv);
    __syncthreads();  // the table's last readers are done
    rope_angles_fill(pos, nullptr, base, head_dim, cs_cos, cs_sin);
    __syncthreads();
    if (!mine) return;
    float* o = out + at;
    rnr_regs_head(v, wv, eps, head_dim, lane, cs_cos, cs_sin, [&](uint32_t i, float a, float b) {
        o[i] = a;
        o[i + pairs] = b;
    });
}

extern "C" __global__ void rms_norm_rope_f32(const float* x, const float* w,
                                             const int32_t* positions, float* out, float eps,
                                             uint32_t head_dim, uint32_t rotary_dim, float base,
                                             uint32_t mode, uint64_t n_x, uint64_t n_w,
                                             uint64_t n_pos, uint64_t n_out) {
    OP_GRID_ENTRY();
    __shared__ float cs_cos[ROPE_MAX_PAIRS];
    __shared__ float cs_sin[ROPE_MAX_PAIRS];
    extern __shared__ __align__(16) float rnr_smem[];
    const uint32_t pairs = rotary_dim / 2;
    const uint64_t rows = n_pos;
    if (n_x != n_out || n_w != head_dim || rows == 0 || head_dim == 0 || n_out % rows != 0 ||
        rotary_dim % 2 != 0 || rotary_dim > head_dim || pairs > ROPE_MAX_PAIRS || mode > 1 ||
        blockDim.x % 32 != 0)
        return;
    const uint64_t row_len = n_out / rows;
    if (row_len % head_dim != 0) return;
    const uint32_t heads = (uint32_t)(row_len / head_dim), warps = blockDim.x / 32;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint64_t groups = (heads + warps - 1) / warps;
    if (rnr_regs_ok(head_dim, rotary_dim, mode)) {
        for (uint64_t b = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; b < rows * groups;
             b += (uint64_t)gridDim.x * gridDim.y) {
            const uint64_t r = b / groups;
            const uint32_t h = (uint32_t)(b % groups) * warps + warp;
            rnr_regs_row(x, w, out, positions[r], eps, head_dim, base, h, heads,
                         r * row_len + (uint64_t)h * head_dim, cs_cos, cs_sin);
        }
        return;
    }
    uint32_t smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem));
    const bool staged = smem >= 4ull * head_dim * (1 + warps) && head_dim <= RNR_STAGE_MAX &&
                        blockDim.x == RNR_NORM_THREADS;
    // The weight's loads, stored to the stage once the first row's angles are computed.
    float wv[RNR_STAGE_MAX / RNR_NORM_THREADS];
    if (staged) {
#pragma unroll
        for (uint32_t k = 0; k < RNR_STAGE_MAX / RNR_NORM_THREADS; ++k) {
            const uint32_t i = threadIdx.x + k * blockDim.x;
            wv[k] = i < head_dim ? w[i] : 0.0f;
        }
    }
    bool weight_staged = !staged;
    const float* ws = staged ? rnr_smem : w;
    float* hs = rnr_smem + (uint64_t)head_dim * (1 + warp);
    for (uint64_t b = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; b < rows * groups;
         b += (uint64_t)gridDim.x * gridDim.y) {
        const uint64_t r = b / groups;
        const uint32_t h = (uint32_t)(b % groups) * warps + warp;
        const bool mine = h < heads;  // warp-uniform
        const uint64_t at = r * row_len + (uint64_t)(mine ? h : 0) * head_dim;
        const float* xr = x + at;
        float* o = out + at;
        // A head of up to 256 values: its loads in registers, in flight while the block computes
        // the angles, stored to the stage after them. A longer one is staged first, eight loads a
        // lane before their stores (a store right behind its load waits for it).
        const bool early = staged && mine && head_dim <= 256;
        float v[8];
        if (early) {
#pragma unroll
            for (uint32_t j = 0; j < 8; ++j) {
                const uint32_t i = lane + 32 * j;
                v[j] = i < head_dim ? xr[i] : 0.0f;
            }
        } else if (staged && mine) {
            for (uint32_t i0 = lane; i0 < head_dim; i0 += 256) {
#pragma unroll
                for (uint32_t j = 0; j < 8; ++j) {
                    const uint32_t i = i0 + 32 * j;
                    v[j] = i < head_dim ? xr[i] : 0.0f;
                }
#pragma unroll
                for (uint32_t j = 0; j < 8; ++j) {
                    const uint32_t i = i0 + 32 * j;
                    if (i < head_dim) hs[i] = v[j];
                }
            }
        }
        // The table's last readers are done; the weight's stores wait behind the angles.
        const int32_t pos = positions[r];
        __syncthreads();
        rope_angles_fill(pos, nullptr, base, rotary_dim, cs_cos, cs_sin);
        if (!weight_staged) {
#pragma unroll
            for (uint32_t k = 0; k < RNR_STAGE_MAX / RNR_NORM_THREADS; ++k) {
                const uint32_t i = threadIdx.x + k * blockDim.x;
                if (i < head_dim) rnr_smem[i] = wv[k];
            }
            weight_staged = true;
        }
        __syncthreads();
        if (!mine) continue;
        if (early) {
#pragma unroll
            for (uint32_t j = 0; j < 8; ++j) {
                const uint32_t i = lane + 32 * j;
                if (i < head_dim) hs[i] = v[j];
            }
        }
        if (staged) {
            __syncwarp();
            xr = hs;
        }
        const double ss = rnr_head_sum(xr, head_dim, lane);
        const float inv = (float)(1.0 / sqrt(ss / (double)head_dim + (double)eps));
        for (uint32_t i = lane; i < pairs; i += 32) {
            const uint32_t j0 = mode == 1 ? i : 2 * i, j1 = mode == 1 ? i + pairs : 2 * i + 1;
            const float a = (xr[j0] * inv) * ws[j0], c = (xr[j1] * inv) * ws[j1];
            const float cs = cs_cos[i], sn = cs_sin[i];
            o[j0] = a * cs - c * sn;
            o[j1] = a * sn + c * cs;
        }
        for (uint32_t j = rotary_dim + lane; j < head_dim; j += 32) o[j] = (xr[j] * inv) * ws[j];
        // The head's stage is read before the next head overwrites it.
        __syncwarp();
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

// The query and key norms with their RoPE and the k and v cache writes of a block in one kernel
// (`rms_norm_rope_kv_f32`, src/ops/norm_rope_kv.rs): q_in, q_weight, k_in, k_weight, v, positions,
// step, q, k_cache, v_cache, eps, head_dim, base, mode (1: NeoX), n_kv_head, cache_f16. A warp a
// head of the register form (rnr_regs_ok): row r's q heads, then its k heads, then its v heads,
// blocks of RNR_NORM_THREADS as rms_norm_rope_f32's. A q or k head is normalized and rotated by
// rnr_regs_head (the bits of rms_norm then rope); q's go to `q`, k's to cache row step[0] + r
// of their head's slab [n_kv_head, max_ctx, head_dim], v's copied there (f32, or f16 where
// `cache_f16`, each value rounded to nearest once as kv_write_f32_f16 rounds it). Each thread's
// pair's `pow` runs before the grid wait (rope_own_freq). A step that leaves no room for the rows
// is a kernel error before anything is written.
extern "C" __global__ void rms_norm_rope_kv_f32(
    const float* q_in, const float* q_w, const float* k_in, const float* k_w, const float* v_in,
    const int32_t* positions, const int32_t* step, float* q, void* kc, void* vc, float eps,
    uint32_t head_dim, float base, uint32_t mode, uint32_t n_kv, uint32_t cache_f16,
    uint64_t n_qin, uint64_t n_qw, uint64_t n_kin, uint64_t n_kw, uint64_t n_v, uint64_t n_pos,
    uint64_t n_step, uint64_t n_q, uint64_t n_kc, uint64_t n_vc) {
    const double own_freq = rope_own_freq(base, head_dim);
    OP_GRID_ENTRY();
    __shared__ float cs_cos[ROPE_MAX_PAIRS];
    __shared__ float cs_sin[ROPE_MAX_PAIRS];
    const uint32_t tag = op_tag("rms_norm_rope_kv_f32");
    const uint64_t rows = n_pos, row_kv = (uint64_t)n_kv * head_dim;
    OP_REQUIRE(rows != 0 && n_step != 0 && rnr_regs_ok(head_dim, head_dim, mode) && n_kv != 0 &&
               n_qw == head_dim && n_kw == head_dim && blockDim.x % 32 == 0);
    OP_REQUIRE(n_qin == n_q && n_q % (rows * head_dim) == 0 && n_kin == rows * row_kv &&
               n_v == n_kin && n_kc == n_vc && n_kc % row_kv == 0);
    const uint64_t q_row = n_q / rows, max_ctx = n_kc / row_kv;
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + rows > max_ctx) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, rows);
        return;
    }
    const uint32_t q_heads = (uint32_t)(q_row / head_dim), heads = q_heads + 2 * n_kv;
    const uint32_t warps = blockDim.x / 32, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t pairs = head_dim / 2;
    const uint64_t groups = (heads + warps - 1) / warps;
    auto store = [&](void* cache, uint64_t at, float x) {
        if (cache_f16 != 0) {
            ((__half*)cache)[at] = __float2half_rn(x);
        } else {
            ((float*)cache)[at] = x;
        }
    };
    for (uint64_t b = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; b < rows * groups;
         b += (uint64_t)gridDim.x * gridDim.y) {
        const uint64_t r = b / groups;
        const uint32_t h = (uint32_t)(b % groups) * warps + warp;
        // Which tensor this warp's head is (warp-uniform): 0 q, 1 k, 2 v, 3 none.
        const int which = h < q_heads ? 0 : h < q_heads + n_kv ? 1 : h < heads ? 2 : 3;
        const uint32_t kh = which == 1 ? h - q_heads : which == 2 ? h - q_heads - n_kv : 0;
        const float* src = which == 0   ? q_in + r * q_row + (uint64_t)h * head_dim
                           : which == 1 ? k_in + (r * n_kv + kh) * head_dim
                                        : v_in + (r * n_kv + kh) * head_dim;
        // The position's load first: the angles wait for it, the head's values only later.
        const int32_t pos = positions[r];
        float v[RNR_NORM_WARPS], wv[RNR_NORM_WARPS];
        if (which < 3) rnr_regs_load(src, which == 1 ? k_w : q_w, head_dim, lane, v, wv);
        __syncthreads();  // the table's last readers are done
        rope_angles_fill_own(pos, own_freq, base, head_dim, cs_cos, cs_sin);
        __syncthreads();
        const uint64_t at = ((uint64_t)kh * max_ctx + (uint64_t)pos0 + r) * head_dim;
        if (which == 0) {
            float* o = q + r * q_row + (uint64_t)h * head_dim;
            rnr_regs_head(v, wv, eps, head_dim, lane, cs_cos, cs_sin,
                          [&](uint32_t i, float a, float c) {
                              o[i] = a;
                              o[i + pairs] = c;
                          });
        } else if (which == 1) {
            rnr_regs_head(v, wv, eps, head_dim, lane, cs_cos, cs_sin,
                          [&](uint32_t i, float a, float c) {
                              store(kc, at + i, a);
                              store(kc, at + i + pairs, c);
                          });
        } else if (which == 2) {
#pragma unroll
            for (uint32_t k = 0; k < RNR_NORM_WARPS; ++k) {
                if (k < head_dim / 32) store(vc, at + lane + 32 * k, v[k]);
            }
        }
    }
}
