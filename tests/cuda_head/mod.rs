//! The output heads' one-row products on f32 activations (`matmul_f32_activations`) on CUDA
//! against the CPU backend: the four-rows-a-warp form, the tensor-core form (`matmul_head.cuh`)
//! and the real heads' shapes. Part of `cuda_ops.rs` (whose harness they use); every test needs a
//! GPU.

use super::*;

/// `matmul_f32_activations` of the one row x against w (n rows) on CUDA and on the CPU, within
/// `atol + 1e-4 |want|`.
fn compare_head(dev: &Device, what: &str, x: Host, w: Host, n: usize, atol: f64) {
    compare(
        what,
        dev,
        &[x, w],
        &[(DType::F32, vec![1, n])],
        atol,
        1e-4,
        &|s, i, o| s.matmul_f32_activations(&i[0], &i[1], &o[0]),
    );
}

/// `compare_head` on seeded random weights (n rows of k values of `dt`) and a random row x, within
/// 2e-4 + 1e-4 |want|.
fn compare_random_head(dev: &Device, dt: DType, n: usize, k: usize, w_seed: u64, x_seed: u64) {
    let w = weight_tensor(dt, n, k, w_seed);
    let x = random_tensor(DType::F32, &[1, k], 1.0, x_seed);
    let what = format!("matmul_f32_activations {dt} {n}x{k}");
    compare_head(dev, &what, x, w, n, 2e-4);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_head_family() {
    let dev = cuda_device();
    // An output head's one-row f32 product: from 16,384 outputs the 32-value block formats take
    // four rows a warp (`MM_HEAD_ROWS`; Q8_0 up to 1,024 values a row, so k = 576 and not 2080);
    // 16,387 outputs leave the last warp three rows past the end, and k = 2080 (65 blocks) a
    // partial batch of quarters. F16 keeps a warp an output. Q4_0 and Q8_0 rows of 2,048 values
    // and Q4_K rows of 256 (one step) and 2,048 take the tensor-core form, its last group of 16
    // rows partial. The CPU multiplies the same f32 row
    // (`compare`, not `compare_product`: this product never rounds x to int8).
    let n = 16387usize;
    let formats = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::F16,
    ];
    for (j, (&dt, k)) in formats
        .iter()
        .flat_map(|d| [(d, 2080usize), (d, 576)])
        .chain([(&DType::Q4_0, 2048), (&DType::Q8_0, 2048)])
        .chain([(&DType::Q4K, 256), (&DType::Q4K, 2048)])
        .enumerate()
    {
        compare_random_head(&dev, dt, n, k, 880 + j as u64, 890 + k as u64);
    }
    // Q6_K: rows of 256 values (210 bytes, so each row's step starts at another even byte of a
    // 16-byte word; 16,392 rows end on a whole word) and of 2,048 take the tensor-core form, its
    // last group partial; 16,387 rows of 256 end inside a word and keep a warp a row.
    let cases = [
        (DType::Q6K, 256usize, 16392usize),
        (DType::Q6K, 2048, 16387),
        (DType::Q6K, 256, 16387),
    ];
    for (j, (dt, k, n)) in cases.into_iter().enumerate() {
        compare_random_head(&dev, dt, n, k, 900 + j as u64, 910 + k as u64);
    }
    // A value f16 cannot hold: the tensor-core form of Q4_0, Q8_0, Q4_K and Q6_K heads
    // (`matmul_head.cuh`) hands the row to the f32 form, whose sums then carry that value's
    // magnitude (Q8_0's q x up to 8.9e6, whose ulp is 1, before the scale d of about 1/127; Q4_0's
    // d (sum q x - 8 sum x)), hence the wider atol: a row left to the int8 or the tensor-core form
    // would miss by far more.
    for (j, dt) in [DType::Q4_0, DType::Q8_0, DType::Q4K, DType::Q6K]
        .into_iter()
        .enumerate()
    {
        let w = weight_tensor(dt, n, 2048, 870 + j as u64);
        let mut x = random_tensor(DType::F32, &[1, 2048], 1.0, 875);
        x.bytes[28..32].copy_from_slice(&70_000.0f32.to_le_bytes());
        let what = format!("matmul_f32_activations {dt} {n}x2048, one value of 70,000");
        compare_head(&dev, &what, x, w, n, 0.25);
    }
}

/// The output heads at their real shapes: SmolLM2's Q8_0 head (49,152 x 576, four rows a warp),
/// then through the tensor-core form (x in two f16 halves, f32 sums in another order than the
/// CPU's) the Llama-3.2-1B's Q8_0 head (128,256 x 2,048) and the Llama-3.1-8B's in Q4_0, Q4_K,
/// Q6_K (a Q4_K_M file's) and Q8_0 (128,256 x 4,096).
#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_head_at_real_shapes() {
    let dev = cuda_device();
    for (j, (dt, n, k)) in [
        (DType::Q8_0, 49_152, 576usize),
        (DType::Q8_0, 128_256, 2048),
        (DType::Q4_0, 128_256, 4096),
        (DType::Q4K, 128_256, 4096),
        (DType::Q6K, 128_256, 4096),
        (DType::Q8_0, 128_256, 4096),
    ]
    .into_iter()
    .enumerate()
    {
        compare_random_head(&dev, dt, n, k, 860 + j as u64, 865 + j as u64);
    }
}
