// The `elementwise` family: add, mul, SwiGLU, GeGLU (binary; `b` full or one row broadcast over rows)
// and scale, GELU (tanh, erf), SiLU, softcap (unary), each out of place and in place, for f32,
// f16 and bf16. Same argument order and semantics as the CPU kernels
// (src/backend/cpu/kernels/elementwise.rs): values are loaded as f32, computed in f32 (GELU-erf
// in f64) and stored in the buffer's dtype. Grid-stride over elements: any grid works. SiLU and
// GELU tanh are activation.cuh's (compiled in front of this file), which the fused MLP-input
// kernels share.

struct OpAdd { __device__ static float apply(float a, float b) { return a + b; } };
struct OpMul { __device__ static float apply(float a, float b) { return a * b; } };
struct OpSwiglu { __device__ static float apply(float g, float u) { return act_silu(g) * u; } };

struct OpScale { __device__ static float apply(float x, float s) { return x * s; } };
struct OpGeluTanh {
    __device__ static float apply(float x, float) { return act_gelu_tanh(x); }
};
struct OpGeglu {
    __device__ static float apply(float g, float u) { return OpGeluTanh::apply(g, 0.0f) * u; }
};
// erfc(z) for z >= 0: Abramowitz and Stegun 7.1.26 in f64, as the CPU kernel.
__device__ __forceinline__ double ew_erfc_nonneg(double z) {
    const double p = 0.3275911;
    const double a0 = 0.254829592, a1 = -0.284496736, a2 = 1.421413741, a3 = -1.453152027,
                 a4 = 1.061405429;
    double t = 1.0 / (1.0 + p * z);
    double poly = t * (a0 + t * (a1 + t * (a2 + t * (a3 + t * a4))));
    return poly * exp(-z * z);
}
struct OpGeluErf {
    __device__ static float apply(float x, float) {
        double xd = (double)x;
        double z = xd * 0.70710678118654752440;
        double y = z >= 0.0 ? 0.5 * xd * (2.0 - ew_erfc_nonneg(z)) : 0.5 * xd * ew_erfc_nonneg(-z);
        return (float)y;
    }
};
struct OpSilu { __device__ static float apply(float x, float) { return act_silu(x); } };
struct OpSoftcap { __device__ static float apply(float x, float cap) { return cap * tanhf(x / cap); } };

// out[i] = Op(a[i], b[i or i % row_len]); `a` may be `out` itself (in place).
template <typename T, typename Op>
__device__ void ew_binary(const T* a, const T* b, T* out, uint32_t row_len, uint64_t n,
                          uint64_t n_b) {
    const bool full = n_b == n;
    if (!full && (row_len == 0 || n_b != row_len || n % row_len != 0)) return;
    OP_GRID_STRIDE_LOOP(i, n) {
        float bv = op_load(b, full ? (long)i : (long)(i % row_len));
        op_store(out, i, Op::apply(op_load(a, i), bv));
    }
}

template <typename T, typename Op>
__device__ void ew_unary(const T* x, T* out, float param, uint64_t n) {
    OP_GRID_STRIDE_LOOP(i, n) { op_store(out, i, Op::apply(op_load(x, i), param)); }
}

#define BINARY_KERNEL(NAME, T, OP)                                                                  \
    extern "C" __global__ void NAME(const T* a, const T* b, T* out, uint32_t row_len, uint64_t n_a,  \
                                    uint64_t n_b, uint64_t n_out) {                                   \
        OP_GRID_ENTRY();                                                                              \
        ew_binary<T, OP>(a, b, out, row_len, n_a < n_out ? n_a : n_out, n_b);                         \
    }
#define BINARY_INPLACE_KERNEL(NAME, T, OP)                                                          \
    extern "C" __global__ void NAME(T* a, const T* b, uint32_t row_len, uint64_t n_a, uint64_t n_b) { \
        OP_GRID_ENTRY();                                                                              \
        ew_binary<T, OP>(a, b, a, row_len, n_a, n_b);                                                 \
    }
#define UNARY_KERNEL(NAME, T, OP)                                                                   \
    extern "C" __global__ void NAME(const T* x, T* out, uint64_t n_x, uint64_t n_out) {               \
        OP_GRID_ENTRY();                                                                              \
        ew_unary<T, OP>(x, out, 0.0f, n_x < n_out ? n_x : n_out);                                     \
    }
#define UNARY_INPLACE_KERNEL(NAME, T, OP)                                                           \
    extern "C" __global__ void NAME(T* x, uint64_t n_x) {                                            \
        OP_GRID_ENTRY();                                                                              \
        ew_unary<T, OP>(x, x, 0.0f, n_x);                                                             \
    }
#define UNARY_PARAM_KERNEL(NAME, T, OP)                                                             \
    extern "C" __global__ void NAME(const T* x, T* out, float p, uint64_t n_x, uint64_t n_out) {      \
        OP_GRID_ENTRY();                                                                              \
        ew_unary<T, OP>(x, out, p, n_x < n_out ? n_x : n_out);                                        \
    }
#define UNARY_PARAM_INPLACE_KERNEL(NAME, T, OP)                                                     \
    extern "C" __global__ void NAME(T* x, float p, uint64_t n_x) {                                   \
        OP_GRID_ENTRY();                                                                              \
        ew_unary<T, OP>(x, x, p, n_x);                                                                \
    }

BINARY_KERNEL(add_f32, float, OpAdd)
BINARY_KERNEL(add_f16, __half, OpAdd)
BINARY_KERNEL(add_bf16, __nv_bfloat16, OpAdd)
BINARY_INPLACE_KERNEL(add_f32_inplace, float, OpAdd)
BINARY_INPLACE_KERNEL(add_f16_inplace, __half, OpAdd)
BINARY_INPLACE_KERNEL(add_bf16_inplace, __nv_bfloat16, OpAdd)
BINARY_KERNEL(mul_f32, float, OpMul)
BINARY_KERNEL(mul_f16, __half, OpMul)
BINARY_KERNEL(mul_bf16, __nv_bfloat16, OpMul)
BINARY_INPLACE_KERNEL(mul_f32_inplace, float, OpMul)
BINARY_INPLACE_KERNEL(mul_f16_inplace, __half, OpMul)
BINARY_INPLACE_KERNEL(mul_bf16_inplace, __nv_bfloat16, OpMul)
BINARY_KERNEL(swiglu_f32, float, OpSwiglu)
BINARY_KERNEL(swiglu_f16, __half, OpSwiglu)
BINARY_KERNEL(swiglu_bf16, __nv_bfloat16, OpSwiglu)
BINARY_INPLACE_KERNEL(swiglu_f32_inplace, float, OpSwiglu)
BINARY_INPLACE_KERNEL(swiglu_f16_inplace, __half, OpSwiglu)
BINARY_INPLACE_KERNEL(swiglu_bf16_inplace, __nv_bfloat16, OpSwiglu)
// `swiglu_f32_to_f16`: the f32 SwiGLU's values rounded to f16 (round to nearest even); gate and
// up as long as out (the narrowing's form, `graph::passes::narrow`).
extern "C" __global__ void swiglu_f32_to_f16(const float* gate, const float* up, __half* out,
                                             uint64_t n_gate, uint64_t n_up, uint64_t n_out) {
    OP_GRID_ENTRY();
    const uint32_t tag = op_tag("swiglu_f32_to_f16");
    OP_REQUIRE(n_gate == n_out && n_up == n_out);
    OP_GRID_STRIDE_LOOP(i, n_out) { out[i] = __float2half_rn(OpSwiglu::apply(gate[i], up[i])); }
}
BINARY_KERNEL(geglu_f32, float, OpGeglu)
BINARY_KERNEL(geglu_f16, __half, OpGeglu)
BINARY_KERNEL(geglu_bf16, __nv_bfloat16, OpGeglu)
BINARY_INPLACE_KERNEL(geglu_f32_inplace, float, OpGeglu)
BINARY_INPLACE_KERNEL(geglu_f16_inplace, __half, OpGeglu)
BINARY_INPLACE_KERNEL(geglu_bf16_inplace, __nv_bfloat16, OpGeglu)
UNARY_PARAM_KERNEL(scale_f32, float, OpScale)
UNARY_PARAM_KERNEL(scale_f16, __half, OpScale)
UNARY_PARAM_KERNEL(scale_bf16, __nv_bfloat16, OpScale)
UNARY_PARAM_INPLACE_KERNEL(scale_f32_inplace, float, OpScale)
UNARY_PARAM_INPLACE_KERNEL(scale_f16_inplace, __half, OpScale)
UNARY_PARAM_INPLACE_KERNEL(scale_bf16_inplace, __nv_bfloat16, OpScale)
UNARY_KERNEL(gelu_tanh_f32, float, OpGeluTanh)
UNARY_KERNEL(gelu_tanh_f16, __half, OpGeluTanh)
UNARY_KERNEL(gelu_tanh_bf16, __nv_bfloat16, OpGeluTanh)
UNARY_INPLACE_KERNEL(gelu_tanh_f32_inplace, float, OpGeluTanh)
UNARY_INPLACE_KERNEL(gelu_tanh_f16_inplace, __half, OpGeluTanh)
UNARY_INPLACE_KERNEL(gelu_tanh_bf16_inplace, __nv_bfloat16, OpGeluTanh)
UNARY_KERNEL(gelu_erf_f32, float, OpGeluErf)
UNARY_KERNEL(gelu_erf_f16, __half, OpGeluErf)
UNARY_KERNEL(gelu_erf_bf16, __nv_bfloat16, OpGeluErf)
UNARY_INPLACE_KERNEL(gelu_erf_f32_inplace, float, OpGeluErf)
UNARY_INPLACE_KERNEL(gelu_erf_f16_inplace, __half, OpGeluErf)
UNARY_INPLACE_KERNEL(gelu_erf_bf16_inplace, __nv_bfloat16, OpGeluErf)
UNARY_KERNEL(silu_f32, float, OpSilu)
UNARY_KERNEL(silu_f16, __half, OpSilu)
UNARY_KERNEL(silu_bf16, __nv_bfloat16, OpSilu)
UNARY_INPLACE_KERNEL(silu_f32_inplace, float, OpSilu)
UNARY_INPLACE_KERNEL(silu_f16_inplace, __half, OpSilu)
UNARY_INPLACE_KERNEL(silu_bf16_inplace, __nv_bfloat16, OpSilu)
UNARY_PARAM_KERNEL(softcap_f32, float, OpSoftcap)
UNARY_PARAM_KERNEL(softcap_f16, __half, OpSoftcap)
UNARY_PARAM_KERNEL(softcap_bf16, __nv_bfloat16, OpSoftcap)
UNARY_PARAM_INPLACE_KERNEL(softcap_f32_inplace, float, OpSoftcap)
UNARY_PARAM_INPLACE_KERNEL(softcap_f16_inplace, __half, OpSoftcap)
UNARY_PARAM_INPLACE_KERNEL(softcap_bf16_inplace, __nv_bfloat16, OpSoftcap)
