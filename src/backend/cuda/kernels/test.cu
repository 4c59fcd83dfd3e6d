// A kernel for the backend's own tests (launch path, modes); not part of the op catalog.
// y = a * x + y over n values.
extern "C" __global__ void selftest_axpy_f32(const float* x, float* y, uint32_t n, float a,
                                             uint64_t n_x, uint64_t n_y) {
    uint64_t limit = n < n_x ? n : n_x;
    limit = limit < n_y ? limit : n_y;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < limit; i += (uint64_t)gridDim.x * blockDim.x)
        y[i] = a * x[i] + y[i];
}
