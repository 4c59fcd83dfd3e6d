//! The three-product fusion on the GPU (`ops::matmul_triple`): three prompt products of one x,
//! recorded and optimized into one `matmul3_mma_<w>`, give bitwise what direct mode (three
//! `matmul_mma_<w>`, no fusion) gives on the same GPU, and the CPU's products within the f16
//! rounding of the tensor-core form. At the real prompt shapes (the q, k and v products of the
//! Llama 3.1 8B, Llama 3.2 1B and SmolLM2 files) and at odd ones: rows that end in a partial tile
//! (100, 513), widths that end in a partial tile (576, 192, 200, 72), both tile heights, the
//! pipelined formats and a float format (whose fused kernel runs the three products one by one).
//! Seeded random inputs, never zeros. Needs a GPU: ignored by default, it fails where there is
//! none (`ops::matmul_triple`'s tests run the CPU kernel alone).

mod cuda_open;

mod seeded;

use cuda_open::cuda_device;
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

/// Runs the three products `x . w_i` on `dev` in `mode` and returns the three outputs and the
/// report's fusion and dispatch counts.
fn run(
    dev: &Device,
    dtype: DType,
    rows: usize,
    k: usize,
    widths: [usize; 3],
    mode: Mode,
) -> (Vec<Vec<f32>>, usize, usize) {
    let x = dev
        .upload::<f32>(&random_f32(rows * k, 1.0, 31), &[rows, k])
        .unwrap();
    let ws: Vec<Buffer> = widths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let values = random_f32(n * k, 1.0, 40 + i as u64);
            let bytes = onepass::quant::quantize(dtype, &values).unwrap();
            dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap()
        })
        .collect();
    let outs: Vec<Buffer> = widths
        .iter()
        .map(|&n| dev.alloc(DType::F32, &[rows, n]).unwrap())
        .collect();
    let mut s = Executor::new(dev.clone()).begin(mode);
    for (w, out) in ws.iter().zip(&outs) {
        s.matmul(&x, w, out).unwrap();
    }
    let plan = if mode == Mode::Direct {
        Plan::SEQUENTIAL
    } else {
        Plan::OPTIMIZED
    };
    let report = s.finish(&plan).unwrap();
    let values = outs
        .iter()
        .map(|o| dev.download::<f32>(o).unwrap())
        .collect();
    (values, report.fusions, report.dispatches)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn three_products_fused_give_the_unfused_bits() {
    let gpu = cuda_device();
    let cpu = Device::cpu(4).unwrap();
    let cases: [(DType, usize, usize, [usize; 3]); 6] = [
        // Llama 3.1 8B's q, k, v at a 512-token prompt: 48 + 8 + 8 tiles of 128 x 128.
        (DType::Q4_0, 512, 4096, [4096, 1024, 1024]),
        // Llama 3.2 1B's, 513 rows: a last row tile of one row.
        (DType::Q4K, 513, 2048, [2048, 512, 512]),
        // SmolLM2's (partial output tiles), 100 rows: tiles of 64 rows.
        (DType::Q4_1, 100, 576, [576, 192, 192]),
        (DType::Q8_0, 64, 256, [200, 64, 72]),
        (DType::Q6K, 70, 512, [72, 200, 64]),
        (DType::F16, 100, 256, [200, 64, 72]),
    ];
    for (dtype, rows, k, widths) in cases {
        let what = format!("{dtype} rows {rows} k {k} widths {widths:?}");
        let (fused, fusions, dispatches) = run(&gpu, dtype, rows, k, widths, Mode::Recorded);
        assert_eq!((fusions, dispatches), (1, 1), "{what}: one matmul3_mma");
        let (direct, fusions, _) = run(&gpu, dtype, rows, k, widths, Mode::Direct);
        assert_eq!(fusions, 0, "{what}");
        for (i, (f, d)) in fused.iter().zip(&direct).enumerate() {
            let differ = f
                .iter()
                .zip(d)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                differ, None,
                "{what}: product {i}: fused and unfused differ"
            );
        }
        let (want, _, _) = run(&cpu, dtype, rows, k, widths, Mode::Direct);
        // x and w rounded to f16 (2^-11 each) in the tensor-core form: each output is within
        // 2^-10 of the sum of its k products' magnitudes, below k / 1024 for values below 1;
        // the rest is f32 rounding in another order.
        let tol = 1e-3 + k as f32 / 1024.0;
        for (i, (g, c)) in fused.iter().zip(&want).enumerate() {
            for (j, (a, b)) in g.iter().zip(c).enumerate() {
                assert!(
                    (a - b).abs() <= tol,
                    "{what}: product {i} element {j}: cuda {a}, cpu {b} (bound {tol})"
                );
            }
        }
    }
}
