extern "C" __global__ void selftest_axpy_f32(const float* x, float* y, uint32_t n, float a) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
