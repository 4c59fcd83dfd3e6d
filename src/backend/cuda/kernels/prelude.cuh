// Shared helpers for every onepass CUDA kernel family (compiled in front of each family's source).
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// NVRTC has no C library headers: the fixed-width integers we use.
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;

#define ONEPASS_FULL_MASK 0xffffffffu

// Sum over a warp; every lane gets the result.
__device__ __forceinline__ float op_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ONEPASS_FULL_MASK, v, o);
    return v;
}

// Maximum over a warp; every lane gets the result.
__device__ __forceinline__ float op_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ONEPASS_FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call begins and ends with a barrier.
__device__ __forceinline__ float op_block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = op_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : 0.0f;
    return op_warp_sum(t);
}

// Maximum over the block, as `op_block_sum`.
__device__ __forceinline__ float op_block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = op_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : -__int_as_float(0x7f800000);
    return op_warp_max(t);
}

// Loads and stores of every float type as f32.
__device__ __forceinline__ float op_load(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float op_load(const __half* p, long i) { return __half2float(p[i]); }
__device__ __forceinline__ float op_load(const __nv_bfloat16* p, long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void op_store(float* p, long i, float v) { p[i] = v; }
__device__ __forceinline__ void op_store(__half* p, long i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void op_store(__nv_bfloat16* p, long i, float v) { p[i] = __float2bfloat16_rn(v); }

// An f16 stored as raw bits (GGML block scales are unaligned little-endian halves).
__device__ __forceinline__ float op_half_bits(const uint8_t* p) {
    unsigned short bits = (unsigned short)p[0] | ((unsigned short)p[1] << 8);
    return __half2float(__ushort_as_half(bits));
}

// Sum over the block in f64, as `op_block_sum`; `scratch` holds 32 doubles of shared memory.
__device__ __forceinline__ double op_block_sum_f64(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ONEPASS_FULL_MASK, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = lane < warps ? scratch[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(ONEPASS_FULL_MASK, t, o);
    return t;
}

// The grid as a flat index space: first item of this thread and the stride.
#define OP_GRID_STRIDE_LOOP(i, n) \
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < (uint64_t)(n); \
         i += (uint64_t)gridDim.x * blockDim.x)

// Rows spread over blocks (x, then y): first row of this block and the stride.
#define OP_ROW_LOOP(r, rows) \
    for (uint64_t r = blockIdx.y * (uint64_t)gridDim.x + blockIdx.x; r < (uint64_t)(rows); \
         r += (uint64_t)gridDim.x * gridDim.y)

// ---- Weight rows of any format, one element at a time (GGML block layouts). ----
// Formats: 0 f32, 1 f16, 2 bf16, 3 q4_0, 4 q4_1, 5 q8_0, 6 q4_k, 7 q6_k, 8 q5_0. Each function
// returns element i of a row starting at `row`, with the float operations in the host
// dequantizer's order.
#define OP_FMT_F32 0
#define OP_FMT_F16 1
#define OP_FMT_BF16 2
#define OP_FMT_Q4_0 3
#define OP_FMT_Q4_1 4
#define OP_FMT_Q8_0 5
#define OP_FMT_Q4_K 6
#define OP_FMT_Q6_K 7
#define OP_FMT_Q5_0 8

// Bytes of a row of k elements.
__device__ __forceinline__ uint64_t op_row_bytes(int fmt, uint64_t k) {
    switch (fmt) {
        case OP_FMT_F32: return k * 4;
        case OP_FMT_F16: case OP_FMT_BF16: return k * 2;
        case OP_FMT_Q4_0: return k / 32 * 18;
        case OP_FMT_Q4_1: return k / 32 * 20;
        case OP_FMT_Q5_0: return k / 32 * 22;
        case OP_FMT_Q8_0: return k / 32 * 34;
        case OP_FMT_Q4_K: return k / 256 * 144;
        default: return k / 256 * 210;
    }
}

// Elements per block of the format.
__device__ __forceinline__ uint32_t op_block_elems(int fmt) {
    return fmt <= OP_FMT_BF16 ? 1u : (fmt == OP_FMT_Q4_K || fmt == OP_FMT_Q6_K ? 256u : 32u);
}

// The Q4_K scale and minimum of sub-block `sub` (0..8) from the 12 packed bytes at `sc` (6 bits
// each; sub-blocks 4..7 keep their top two bits in the first eight bytes' high bits).
__device__ __forceinline__ void op_q4k_scale_min(const uint8_t* sc, uint32_t sub, uint32_t& s,
                                                 uint32_t& m) {
    if (sub < 4) {
        s = sc[sub] & 63;
        m = sc[sub + 4] & 63;
    } else {
        s = (sc[sub + 4] & 0x0F) | ((sc[sub - 4] >> 6) << 4);
        m = (sc[sub + 4] >> 4) | ((sc[sub] >> 6) << 4);
    }
}

template <int FMT>
__device__ __forceinline__ float op_weight(const uint8_t* row, uint32_t i) {
    if (FMT == OP_FMT_F32) return ((const float*)row)[i];
    if (FMT == OP_FMT_F16) return __half2float(((const __half*)row)[i]);
    if (FMT == OP_FMT_BF16) return __bfloat162float(((const __nv_bfloat16*)row)[i]);
    if (FMT == OP_FMT_Q4_0) {
        const uint8_t* p = row + (i / 32) * 18;
        const uint32_t j = i % 32;
        const int q = j < 16 ? (p[2 + j] & 0x0F) : (p[2 + j - 16] >> 4);
        return op_half_bits(p) * (float)(q - 8);
    }
    if (FMT == OP_FMT_Q4_1) {
        const uint8_t* p = row + (i / 32) * 20;
        const uint32_t j = i % 32;
        const int q = j < 16 ? (p[4 + j] & 0x0F) : (p[4 + j - 16] >> 4);
        return op_half_bits(p) * (float)q + op_half_bits(p + 2);
    }
    if (FMT == OP_FMT_Q8_0) {
        const uint8_t* p = row + (i / 32) * 34;
        return (float)(int8_t)p[2 + i % 32] * op_half_bits(p);
    }
    if (FMT == OP_FMT_Q5_0) {
        // d (f16), qh (bit j: the fifth bit of value j), qs (nibbles as in q4_0).
        const uint8_t* p = row + (i / 32) * 22;
        const uint32_t j = i % 32;
        const int nib = j < 16 ? (p[6 + j] & 0x0F) : (p[6 + j - 16] >> 4);
        const int q = nib | (((p[2 + j / 8] >> (j % 8)) & 1) << 4);
        return op_half_bits(p) * (float)(q - 16);
    }
    if (FMT == OP_FMT_Q4_K) {
        const uint8_t* p = row + (i / 256) * 144;
        const uint32_t j = i % 256, sub = j / 32, l = j % 32;
        uint32_t s, m;
        op_q4k_scale_min(p + 4, sub, s, m);
        const uint8_t b = p[16 + 32 * (sub / 2) + l];
        const uint32_t q = (b >> (4 * (sub % 2))) & 0x0F;
        const float d1 = op_half_bits(p) * (float)s;
        const float m1 = op_half_bits(p + 2) * (float)m;
        return d1 * (float)q - m1;
    }
    // Q6_K: ql[128], qh[64], scales[16] (int8), d (f16).
    const uint8_t* p = row + (i / 256) * 210;
    const uint32_t j = i % 256, h = j / 128, quarter = (j % 128) / 32, l = j % 32;
    const uint8_t qh = p[128 + 32 * h + l];
    const uint8_t a = p[64 * h + l], b = p[64 * h + 32 + l];
    uint32_t q;
    switch (quarter) {
        case 0: q = (a & 0x0F) | ((qh & 3) << 4); break;
        case 1: q = (b & 0x0F) | (((qh >> 2) & 3) << 4); break;
        case 2: q = (a >> 4) | (((qh >> 4) & 3) << 4); break;
        default: q = (b >> 4) | (((qh >> 6) & 3) << 4); break;
    }
    const float sc = (float)(int8_t)p[192 + j / 16];
    return op_half_bits(p + 208) * sc * (float)((int)q - 32);
}

// ---- Kernel-detected errors (a bad token id, a position outside the cache, ...). ----
// The host points `op_error_word` at the device's error record when it loads a module; a kernel
// that finds a bad argument records it and returns, and the host turns the record into an error
// after the stream is synchronized. The first error wins (atomicCAS on word 0). Record, as u32
// words: [0] the kernel's tag, [1] the check's code, [2..3] value (i64), [4..5] bound (u64),
// [6..7] index (u64). Codes and messages are mirrored in src/backend/cuda/fault.rs.
__device__ uint32_t* op_error_word;

#define OP_ERR_SHAPE 1     // value: the line of the failed size check in the family's source
#define OP_ERR_TOKEN_ID 2  // value: the id, bound: vocab, index: its position in ids
#define OP_ERR_EXPERT_ID 3 // value: the id, bound: experts, index: its position in ids
#define OP_ERR_POS0 4      // value: pos0, bound: positions of the cache, index: rows written
#define OP_ERR_CHUNKS 5    // value: KV length, bound: chunks the scratch holds, index: chunk_len
#define OP_ERR_SCRATCH 6   // value: a counter, bound: chunks, index: the head
#define OP_ERR_SLOT_ROW 7  // value: a slot or position, bound: slots or positions, index: the row

// The kernel's tag: FNV-1a (32-bit) of its name, as the host computes it.
__host__ __device__ constexpr uint32_t op_tag(const char* name) {
    uint32_t h = 2166136261u;
    for (int i = 0; name[i] != 0; i++) h = (h ^ (uint8_t)name[i]) * 16777619u;
    return h;
}

// Records an error unless one is already recorded.
__device__ __noinline__ void op_fail(uint32_t tag, uint32_t code, int64_t value, uint64_t bound,
                                     uint64_t index) {
    uint32_t* w = op_error_word;
    if (w == nullptr || *(volatile uint32_t*)w != 0) return;
    if (atomicCAS(w, 0u, tag) != 0u) return;
    w[1] = code;
    w[2] = (uint32_t)((uint64_t)value & 0xffffffffu);
    w[3] = (uint32_t)((uint64_t)value >> 32);
    w[4] = (uint32_t)(bound & 0xffffffffu);
    w[5] = (uint32_t)(bound >> 32);
    w[6] = (uint32_t)(index & 0xffffffffu);
    w[7] = (uint32_t)(index >> 32);
}

// In a kernel with a `uint32_t tag` in scope: returns after recording a size mismatch when
// `cond` does not hold.
#define OP_REQUIRE(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            op_fail(tag, OP_ERR_SHAPE, __LINE__, 0, 0);                                            \
            return;                                                                                \
        }                                                                                          \
    } while (0)

// ---- Programmatic dependent launch (sm_90+; docs/kernels.md item 17). ----
// In a CUDA graph whose edges are programmatic (src/backend/cuda/graph.rs), a kernel may start
// while the one before it still runs. Every kernel therefore begins with `OP_GRID_ENTRY()`: it
// waits until every kernel it depends on has finished and its writes are visible
// (`griddepcontrol.wait`), then lets its own dependents start (`griddepcontrol.launch_dependents`),
// so that their blocks take the SMs this kernel's blocks leave and run their prologues (weight
// prefetches) while it finishes. Outside such a graph (a plain launch, an older GPU) both are
// no-ops. Before the wait a kernel writes nothing and reads only what no kernel still running
// can write: an L2 prefetch (`mm_prefetch_row`) only asks for a line, and L2 is where every SM's
// writes meet, so it cannot make a later load see stale bytes; a load through L2 (`__ldcg`) of
// memory that only the host or kernels two or more edges back wrote (they completed before the
// kernel this one waits for passed its own wait, so before this one could start), such as the
// decode attention's older keys (`attention_decode.cu`). A kernel that reads early begins with
// `OP_GRID_ENTRY_LATE()` and calls `OP_GRID_WAIT()` on every path before its other memory work.
__device__ __forceinline__ void op_grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void op_grid_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Waits for the kernels this one depends on, then lets its dependents start.
__device__ __forceinline__ void op_grid_enter() {
    op_grid_wait();
    op_grid_release();
}

#ifdef OP_STAMPS
// ---- Block stamps (compiled with -DOP_STAMPS: `onepass bench --timeline`). ----
// Every block records, when its last thread leaves, one record of OP_STAMP_WORDS u64 words into a
// ring that follows the error record (src/backend/cuda/stamps.rs reads it): [0] the kernel's tag
// | the SM << 32, [1] the block's index | the grid's block count << 32, [2] when thread 0 arrived
// (%globaltimer, ns), [3] when its grid wait returned, [4] when the block's last thread left. The
// ring's u64 write counter sits right after the error record's eight words.
#define OP_STAMP_WORDS 5
#define OP_STAMP_CAP (1u << 18)
__shared__ unsigned long long op_stamp_times[2];
__shared__ uint32_t op_stamp_left;
__device__ __forceinline__ unsigned long long op_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint32_t op_block_thread() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
// Lives for the whole kernel (declared by OP_GRID_ENTRY at its top): its destructor runs as each
// thread leaves, and the last thread of the block writes the record.
struct OpStamp {
    uint32_t tag;
    __device__ OpStamp(const char* name, bool wait) : tag(op_tag(name)) {
        if (op_block_thread() == 0) {
            op_stamp_times[0] = op_now();
            op_stamp_left = 0;
        }
        if (wait) op_grid_wait();
        if (op_block_thread() == 0) op_stamp_times[1] = op_now();
        __syncthreads();
        if (wait) op_grid_release();
    }
    __device__ ~OpStamp() {
        const unsigned mask = __activemask();
        const uint32_t n = __popc(mask);
        if ((threadIdx.x & 31) != (uint32_t)(__ffs(mask) - 1)) return;
        const uint32_t threads = blockDim.x * blockDim.y * blockDim.z;
        __threadfence_block();  // thread 0's times are seen by the thread that counts last
        if (atomicAdd(&op_stamp_left, n) + n != threads || op_error_word == nullptr) return;
        const unsigned long long end = op_now();
        unsigned long long* ring = (unsigned long long*)(op_error_word + 8);
        const unsigned long long at = atomicAdd(ring, 1ull) % OP_STAMP_CAP;
        unsigned long long* r = ring + 1 + at * OP_STAMP_WORDS;
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        const uint32_t block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        r[0] = (unsigned long long)tag | ((unsigned long long)sm << 32);
        r[1] = (unsigned long long)block |
               ((unsigned long long)(gridDim.x * gridDim.y * gridDim.z) << 32);
        r[2] = op_stamp_times[0];
        r[3] = op_stamp_times[1];
        r[4] = end;
    }
};
#define OP_GRID_ENTRY() OpStamp op_stamp_(__func__, true)
#define OP_GRID_ENTRY_LATE() OpStamp op_stamp_(__func__, false)
#define OP_GRID_WAIT()                                                                             \
    do {                                                                                           \
        op_grid_enter();                                                                           \
        if (op_block_thread() == 0) op_stamp_times[1] = op_now();                                  \
    } while (0)
#else
// The first statement of a kernel: the wait and release at once.
#define OP_GRID_ENTRY() op_grid_enter()
// The first statement of a kernel that reads early (above); it then calls `OP_GRID_WAIT()`.
#define OP_GRID_ENTRY_LATE()
#define OP_GRID_WAIT() op_grid_enter()
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// `BYTES` (4 or 16) from global `src` to shared `dst`, asynchronously; zeros instead when
// `!live` (then `src` is only a valid address, never read). The copies a thread issued since its
// last `op_cp_commit` form one group; `op_cp_wait<N>` waits until at most N of the thread's groups
// are in flight; the others' copies are seen after a barrier that follows their waits.
template <int BYTES>
__device__ __forceinline__ void op_cp_async(void* dst, const void* src, bool live) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    const uint32_t n = live ? BYTES : 0;
    if (BYTES == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(n));
    }
}

__device__ __forceinline__ void op_cp_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void op_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
#endif
