// The `softmax` family: numerically stable softmax over rows of f32, as the CPU kernels
// (src/backend/cpu/kernels/softmax.rs): v = x * scale + mask, out = exp(v - max v) / sum exp(..),
// the sum accumulated in f64, a fully masked row (every v is -inf) gives zeros. The mask has
// mask_rows rows of n; row r of x uses mask row r % mask_rows. Arguments:
//   softmax_f32: x, out, scale, n          softmax_mask_f32: x, mask, out, scale, n
//   softmax_f32_inplace: x, scale, n       softmax_mask_f32_inplace: x, mask, scale, n
// One block per row (grid-stride over rows); each thread keeps to the same columns in every pass.

__device__ void softmax_rows(const float* x, const float* mask, float* out, float scale,
                             uint32_t n, uint64_t n_x, uint64_t n_mask, uint64_t n_out,
                             uint32_t tag) {
    __shared__ float red[32];
    __shared__ double red64[32];
    OP_REQUIRE(n != 0 && n_out % n == 0 && n_x == n_out && blockDim.x % 32 == 0);
    OP_REQUIRE(mask == nullptr ||
               (n_mask != 0 && n_mask % n == 0 && (n_out / n) % (n_mask / n) == 0));
    const uint64_t rows = n_out / n, mask_rows = mask == nullptr ? 1 : n_mask / n;
    OP_ROW_LOOP(r, rows) {
        const float* xr = x + r * n;
        const float* mr = mask == nullptr ? nullptr : mask + (r % mask_rows) * n;
        float* o = out + r * n;
        float mx = -__int_as_float(0x7f800000);
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            float v = xr[i] * scale;
            if (mr != nullptr) v += mr[i];
            o[i] = v;
            mx = fmaxf(mx, v);
        }
        mx = op_block_max(mx, red);
        if (mx == -__int_as_float(0x7f800000)) {
            for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = 0.0f;
            continue;
        }
        double sum = 0.0;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float e = expf(o[i] - mx);
            o[i] = e;
            sum += (double)e;
        }
        const float inv = (float)(1.0 / op_block_sum_f64(sum, red64));
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] *= inv;
    }
}

extern "C" __global__ void softmax_f32(const float* x, float* out, float scale, uint32_t n,
                                       uint64_t n_x, uint64_t n_out) {
    OP_GRID_ENTRY();
    softmax_rows(x, nullptr, out, scale, n, n_x, 0, n_out, op_tag("softmax_f32"));
}

extern "C" __global__ void softmax_mask_f32(const float* x, const float* mask, float* out,
                                            float scale, uint32_t n, uint64_t n_x, uint64_t n_mask,
                                            uint64_t n_out) {
    OP_GRID_ENTRY();
    softmax_rows(x, mask, out, scale, n, n_x, n_mask, n_out, op_tag("softmax_mask_f32"));
}

extern "C" __global__ void softmax_f32_inplace(float* x, float scale, uint32_t n, uint64_t n_x) {
    OP_GRID_ENTRY();
    softmax_rows(x, nullptr, x, scale, n, n_x, 0, n_x, op_tag("softmax_f32_inplace"));
}

extern "C" __global__ void softmax_mask_f32_inplace(float* x, const float* mask, float scale,
                                                    uint32_t n, uint64_t n_x, uint64_t n_mask) {
    OP_GRID_ENTRY();
    softmax_rows(x, mask, x, scale, n, n_x, n_mask, n_x, op_tag("softmax_mask_f32_inplace"));
}
