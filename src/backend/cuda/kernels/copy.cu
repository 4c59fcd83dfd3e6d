// The `copy` family: dtype-converting copies among f32, f16 and bf16, as the CPU kernels
// (src/backend/cpu/kernels/copy.rs): load as f32, store rounded to nearest even. Arguments:
// src, dst. Grid-stride over elements.

template <typename S, typename D>
__device__ void copy_convert(const S* src, D* dst, uint64_t n) {
    OP_GRID_STRIDE_LOOP(i, n) { op_store(dst, i, op_load(src, i)); }
}

#define COPY_KERNEL(NAME, S, D)                                                                     \
    extern "C" __global__ void NAME(const S* src, D* dst, uint64_t n_src, uint64_t n_dst) {          \
        OP_GRID_ENTRY();                                                                             \
        if (n_src != n_dst) return;                                                                   \
        copy_convert<S, D>(src, dst, n_src);                                                          \
    }

COPY_KERNEL(copy_f32_f32, float, float)
COPY_KERNEL(copy_f32_f16, float, __half)
COPY_KERNEL(copy_f32_bf16, float, __nv_bfloat16)
COPY_KERNEL(copy_f16_f32, __half, float)
COPY_KERNEL(copy_f16_f16, __half, __half)
COPY_KERNEL(copy_f16_bf16, __half, __nv_bfloat16)
COPY_KERNEL(copy_bf16_f32, __nv_bfloat16, float)
COPY_KERNEL(copy_bf16_f16, __nv_bfloat16, __half)
COPY_KERNEL(copy_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
