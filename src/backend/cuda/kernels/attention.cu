// The `attention` family: causal scaled dot-product attention of f32 query rows against one
// layer's KV cache [n_kv_head, max_ctx, head_dim] (f32 or f16), grouped-query heads, optional
// softcap (0 = off), pos0 read from the step buffer at run time. Same arguments as the CPU kernels
// (src/backend/cpu/kernels/attention.rs):
//   attention_<t>:                q, k, v, step, out, n_head, n_kv_head, head_dim, scale, softcap
//   attention_decode_partial_<t>: q, k, v, step, partials, n_head, n_kv_head, head_dim, scale,
//                                 softcap, chunk_len, max_chunks
//   attention_decode_combine:     partials, step, out, n_head, head_dim, chunk_len, max_chunks
// Partial records are [max, sum, acc[head_dim]] laid out [max_chunks, n_head, head_dim + 2].
// One block per (row or chunk, head), keys in tiles of blockDim.x with an online softmax.
// Limits: head_dim <= 256, blockDim.x <= 256 and a multiple of 32.

#define ATTN_MAX_HD 256
#define ATTN_MAX_TILE 256
#define ATTN_ACC 8  // head_dim <= ATTN_ACC * blockDim.x

// Folds keys [begin, end) of one KV head slab into (m, l, acc) for the query vector in `qs`.
// Every thread of the block calls it; acc[j] belongs to dimension threadIdx.x + j * blockDim.x.
template <typename T>
__device__ void attn_fold(const float* qs, const T* k, const T* v, uint32_t hd, uint64_t begin,
                          uint64_t end, float scale, float softcap, float* ps, float* red, float& m,
                          float& l, float* acc) {
    for (uint64_t tile = begin; tile < end; tile += blockDim.x) {
        const uint64_t t = tile + threadIdx.x;
        float s = -__int_as_float(0x7f800000);
        if (t < end) {
            const T* kr = k + t * hd;
            float d = 0.0f;
            for (uint32_t i = 0; i < hd; i++) d += qs[i] * op_load(kr, i);
            s = d * scale;
            if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
        }
        const float tile_max = op_block_max(s, red);
        const float new_max = fmaxf(m, tile_max);
        const float c = expf(m - new_max);
        const float p = t < end ? expf(s - new_max) : 0.0f;
        const float tile_sum = op_block_sum(p, red);
        __syncthreads();
        ps[threadIdx.x] = p;
        __syncthreads();
        l = l * c + tile_sum;
        m = new_max;
        const uint32_t n = (uint32_t)(end - tile < blockDim.x ? end - tile : blockDim.x);
        for (uint32_t j = 0; j < ATTN_ACC; j++) {
            const uint32_t dd = threadIdx.x + j * blockDim.x;
            if (dd >= hd) break;
            float a = acc[j] * c;
            for (uint32_t tt = 0; tt < n; tt++) a += ps[tt] * op_load(v + (tile + tt) * hd, dd);
            acc[j] = a;
        }
    }
}

template <typename T>
__device__ void attention_prefill(const float* q, const T* k, const T* v, const int32_t* step,
                                  float* out, uint32_t n_head, uint32_t n_kv_head, uint32_t hd,
                                  float scale, float softcap, uint64_t n_q, uint64_t n_k,
                                  uint64_t n_v, uint64_t n_step, uint64_t n_out, uint32_t tag) {
    __shared__ float qs[ATTN_MAX_HD];
    __shared__ float ps[ATTN_MAX_TILE];
    __shared__ float red[32];
    OP_REQUIRE(n_head != 0 && n_kv_head != 0 && hd != 0 && hd <= ATTN_MAX_HD &&
               n_head % n_kv_head == 0 && blockDim.x <= ATTN_MAX_TILE && hd <= ATTN_ACC * blockDim.x &&
               n_step != 0 && n_k == n_v && n_q == n_out && n_q % ((uint64_t)n_head * hd) == 0 &&
               n_k % ((uint64_t)n_kv_head * hd) == 0);
    const uint64_t rows = n_q / ((uint64_t)n_head * hd);
    const uint64_t max_ctx = n_k / ((uint64_t)n_kv_head * hd);
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + rows > max_ctx) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, rows);
        return;
    }
    const uint32_t group = n_head / n_kv_head;
    OP_ROW_LOOP(item, rows * n_head) {
        const uint64_t r = item / n_head;
        const uint32_t h = (uint32_t)(item % n_head), kv = h / group;
        const float* qh = q + item * hd;
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qh[i];
        __syncthreads();
        float m = -__int_as_float(0x7f800000), l = 0.0f, acc[ATTN_ACC];
        for (int j = 0; j < ATTN_ACC; j++) acc[j] = 0.0f;
        const T* ks = k + (uint64_t)kv * max_ctx * hd;
        const T* vs = v + (uint64_t)kv * max_ctx * hd;
        attn_fold<T>(qs, ks, vs, hd, 0, (uint64_t)pos0 + r + 1, scale, softcap, ps, red, m, l, acc);
        const float inv = 1.0f / l;
        for (uint32_t j = 0; j < ATTN_ACC; j++) {
            const uint32_t dd = threadIdx.x + j * blockDim.x;
            if (dd >= hd) break;
            out[item * hd + dd] = acc[j] * inv;
        }
    }
}

template <typename T>
__device__ void attention_partial(const float* q, const T* k, const T* v, const int32_t* step,
                                  float* partials, uint32_t n_head, uint32_t n_kv_head, uint32_t hd,
                                  float scale, float softcap, uint32_t chunk_len, uint32_t max_chunks,
                                  uint64_t n_q, uint64_t n_k, uint64_t n_v, uint64_t n_step,
                                  uint64_t n_partials, uint32_t tag) {
    __shared__ float qs[ATTN_MAX_HD];
    __shared__ float ps[ATTN_MAX_TILE];
    __shared__ float red[32];
    OP_REQUIRE(n_head != 0 && n_kv_head != 0 && hd != 0 && hd <= ATTN_MAX_HD &&
               n_head % n_kv_head == 0 && blockDim.x <= ATTN_MAX_TILE && hd <= ATTN_ACC * blockDim.x &&
               n_step != 0 && n_k == n_v && n_q == (uint64_t)n_head * hd &&
               n_k % ((uint64_t)n_kv_head * hd) == 0 && chunk_len != 0 &&
               n_partials == (uint64_t)max_chunks * n_head * (hd + 2));
    const uint64_t max_ctx = n_k / ((uint64_t)n_kv_head * hd);
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + 1 > max_ctx) {
        op_fail(tag, OP_ERR_POS0, pos0, max_ctx, 1);
        return;
    }
    const uint64_t kv_len = (uint64_t)pos0 + 1;
    const uint64_t chunks = (kv_len + chunk_len - 1) / chunk_len;
    if (chunks > max_chunks) {
        op_fail(tag, OP_ERR_CHUNKS, (int64_t)kv_len, max_chunks, chunk_len);
        return;
    }
    const uint32_t group = n_head / n_kv_head;
    OP_ROW_LOOP(item, chunks * n_head) {
        const uint64_t chunk = item / n_head;
        const uint32_t h = (uint32_t)(item % n_head), kv = h / group;
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[(uint64_t)h * hd + i];
        __syncthreads();
        float m = -__int_as_float(0x7f800000), l = 0.0f, acc[ATTN_ACC];
        for (int j = 0; j < ATTN_ACC; j++) acc[j] = 0.0f;
        const uint64_t begin = chunk * chunk_len;
        const uint64_t end = begin + chunk_len < kv_len ? begin + chunk_len : kv_len;
        const T* ks = k + (uint64_t)kv * max_ctx * hd;
        const T* vs = v + (uint64_t)kv * max_ctx * hd;
        attn_fold<T>(qs, ks, vs, hd, begin, end, scale, softcap, ps, red, m, l, acc);
        float* rec = partials + item * (hd + 2);
        if (threadIdx.x == 0) {
            rec[0] = m;
            rec[1] = l;
        }
        for (uint32_t j = 0; j < ATTN_ACC; j++) {
            const uint32_t dd = threadIdx.x + j * blockDim.x;
            if (dd >= hd) break;
            rec[2 + dd] = acc[j];
        }
    }
}

#define ATTENTION_KERNEL(NAME, T)                                                                   \
    extern "C" __global__ void NAME(const float* q, const T* k, const T* v, const int32_t* step,      \
                                    float* out, uint32_t n_head, uint32_t n_kv_head, uint32_t hd,     \
                                    float scale, float softcap, uint64_t n_q, uint64_t n_k,           \
                                    uint64_t n_v, uint64_t n_step, uint64_t n_out) {                  \
        attention_prefill<T>(q, k, v, step, out, n_head, n_kv_head, hd, scale, softcap, n_q, n_k,     \
                             n_v, n_step, n_out, op_tag(#NAME));                                   \
    }
#define ATTENTION_PARTIAL_KERNEL(NAME, T)                                                           \
    extern "C" __global__ void NAME(const float* q, const T* k, const T* v, const int32_t* step,      \
                                    float* partials, uint32_t n_head, uint32_t n_kv_head,             \
                                    uint32_t hd, float scale, float softcap, uint32_t chunk_len,      \
                                    uint32_t max_chunks, uint64_t n_q, uint64_t n_k, uint64_t n_v,    \
                                    uint64_t n_step, uint64_t n_partials) {                           \
        attention_partial<T>(q, k, v, step, partials, n_head, n_kv_head, hd, scale, softcap,          \
                             chunk_len, max_chunks, n_q, n_k, n_v, n_step, n_partials,                \
                             op_tag(#NAME));                                                          \
    }

ATTENTION_KERNEL(attention_f32, float)
ATTENTION_KERNEL(attention_f16, __half)
ATTENTION_PARTIAL_KERNEL(attention_decode_partial_f32, float)
ATTENTION_PARTIAL_KERNEL(attention_decode_partial_f16, __half)

extern "C" __global__ void attention_decode_combine(const float* partials, const int32_t* step,
                                                    float* out, uint32_t n_head, uint32_t hd,
                                                    uint32_t chunk_len, uint32_t max_chunks,
                                                    uint64_t n_partials, uint64_t n_step,
                                                    uint64_t n_out) {
    const uint32_t tag = op_tag("attention_decode_combine");
    OP_REQUIRE(n_head != 0 && hd != 0 && chunk_len != 0 && n_step != 0 &&
               n_out == (uint64_t)n_head * hd &&
               n_partials == (uint64_t)max_chunks * n_head * (hd + 2));
    const int64_t pos0 = step[0];
    if (pos0 < 0 || (uint64_t)pos0 + 1 > (uint64_t)max_chunks * chunk_len) {
        op_fail(tag, OP_ERR_CHUNKS, pos0 + 1, max_chunks, chunk_len);
        return;
    }
    const uint64_t chunks = ((uint64_t)pos0 + chunk_len) / chunk_len;
    const uint32_t rec = hd + 2;
    OP_ROW_LOOP(h, n_head) {
        float mx = -__int_as_float(0x7f800000);
        for (uint64_t c = 0; c < chunks; c++) mx = fmaxf(mx, partials[(c * n_head + h) * rec]);
        float total = 0.0f;
        for (uint64_t c = 0; c < chunks; c++) {
            const float* r = partials + (c * n_head + h) * rec;
            total += expf(r[0] - mx) * r[1];
        }
        const float inv = 1.0f / total;
        for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
            float o = 0.0f;
            for (uint64_t c = 0; c < chunks; c++) {
                const float* r = partials + (c * n_head + h) * rec;
                o += expf(r[0] - mx) * r[2 + d];
            }
            out[(uint64_t)h * hd + d] = o * inv;
        }
    }
}
