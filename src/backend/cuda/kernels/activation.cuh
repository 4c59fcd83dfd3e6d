// The activations the elementwise kernels and the fused MLP-input kernels share (compiled in
// front of elementwise.cu and fused_block.cu), so a fused SwiGLU or GeGLU computes its
// activation with the float operations of the plain `swiglu` / `geglu` kernel. f32 throughout,
// as the CPU kernels (src/backend/cpu/kernels/elementwise.rs); NVRTC compiles without FMA
// contraction.

// x * sigmoid(x).
__device__ __forceinline__ float act_silu(float x) { return x / (1.0f + expf(-x)); }

// GELU in its tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float act_gelu_tanh(float x) {
    const float k = 0.7978846f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
