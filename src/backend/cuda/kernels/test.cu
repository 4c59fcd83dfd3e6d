// A kernel for the backend's own tests (launch path, modes); not part of the op catalog.
// y = a * x + y over n values.
extern "C" __global__ void selftest_axpy_f32(const float* x, float* y, uint32_t n, float a,
                                             uint64_t n_x, uint64_t n_y) {
    OP_GRID_ENTRY();
    uint64_t limit = n < n_x ? n : n_x;
    limit = limit < n_y ? limit : n_y;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < limit; i += (uint64_t)gridDim.x * blockDim.x)
        y[i] = a * x[i] + y[i];
}

// For the error-path tests only (never used by an op): one thread stores through `y` with the
// address's upper 32 bits replaced by `high`. With a `high` such as 0xdead0000 the address is
// non-canonical, so the store faults (CUDA_ERROR_ILLEGAL_ADDRESS) and breaks the context.
extern "C" __global__ void selftest_fault_f32(float* y, uint32_t high, uint64_t n_y) {
    OP_GRID_ENTRY();
    if (blockIdx.x != 0 || threadIdx.x != 0 || n_y == 0) return;
    uint64_t bad = ((uint64_t)high << 32) | ((uint64_t)y & 0xffffffffull);
    *(volatile float*)bad = 1.0f;
}
