//! The tensor-core form of the products (`matmul_mma_<w>`, `matmul_add_mma_<w>`: prompts of 64 rows
//! and more) on CUDA, in every weight format, at the real prompt shapes and at odd sizes: rows 1,
//! 3, 17, 100, 511, 513 (the row forms below 64 rows, then partial 128-row tiles), output counts
//! that end in a partial 128-output tile, k that ends in a partial 32-value step (float weights).
//! Seeded random inputs, never zeros; outputs start as NaN.
//!
//! Tolerances, from the arithmetic. Let `S = sum_i |x_i| |w_i|` for an output.
//! - Against float64 sums of the f16-rounded operands (what the tensor cores multiply; products of
//!   two f16 values are exact in f32): the kernel's only error is its f32 accumulation, blocks of
//!   16 products summed inside the tensor core and then `k / 16` block sums added in turn, so at
//!   most `(k / 16 + 16)` roundings of at most `2^-23` relative each (truncation, the tensor core's
//!   worst case, not round-to-nearest): `|got - ref16| <= (k / 16 + 16) 2^-23 S`. One missing or
//!   doubled product (about `S / k`) is larger than that at every k tested.
//! - Against the CPU backend (f32 operands): rounding x and w to f16 moves each product by at most
//!   `2^-10` of its magnitude (`2^-11` each, round to nearest), and each side's f32 accumulation by
//!   at most `k 2^-24 S`: `|got - cpu| <= (2^-10 + 2 k 2^-24) S`.
//!
//! Below 64 rows the products keep their f32 forms: there the bound against the float64 sums of
//! the unrounded operands is the accumulation term alone, `(k + 16) 2^-23 S`.
//!
//! The row-invariant product of batched decode steps (`matmul_rows_<w>`, 1 to 32 rows a tile) takes
//! tensor cores at every row count: the same f16 rounding, and per row a chain of at most `k / 16`
//! f32 additions of tensor-core sums, then the eight warps' partial sums added in turn (7 more):
//! `|got - ref16| <= (k / 16 + 24) 2^-23 S`; against the CPU the same bound as above.
//! Every test needs a GPU: ignored by default, it fails where there is none.

// The harness serves `cuda_ops.rs`; this file uses part of it.
#[allow(dead_code, unused_imports)]
mod cuda_harness;
mod cuda_open;
mod seeded;

use cuda_harness::{random_tensor, run_on, weight_tensor, Host, WEIGHT_DTYPES};
use cuda_open::cuda_device;
use half::f16;
use onepass::{DType, Device};
use rayon::prelude::*;

/// Rows from which the products take the tensor-core form (`ops::matmul::MMA_MIN_ROWS`).
const MMA_MIN_ROWS: usize = 64;

/// A value as the tensor-core form multiplies it.
fn f16_round(v: f32) -> f64 {
    f16::from_f32(v).to_f64()
}

/// Float64 references of `x [rows, k] . w [n, k]^T`: the sums of the products, the sums of the
/// f16-rounded products, and `S`, the sums of the products' magnitudes.
fn references(x: &[f32], w: &[f32], rows: usize, k: usize, n: usize) -> Vec<[f64; 3]> {
    let x16: Vec<f64> = x.iter().map(|&v| f16_round(v)).collect();
    let w16: Vec<f64> = w.iter().map(|&v| f16_round(v)).collect();
    (0..rows * n)
        .into_par_iter()
        .map(|t| {
            let (r, o) = (t / n, t % n);
            let (xr, wr) = (&x[r * k..(r + 1) * k], &w[o * k..(o + 1) * k]);
            let (xr16, wr16) = (&x16[r * k..(r + 1) * k], &w16[o * k..(o + 1) * k]);
            let mut acc = [0f64; 3];
            for i in 0..k {
                let p = xr[i] as f64 * wr[i] as f64;
                acc[0] += p;
                acc[1] += xr16[i] * wr16[i];
                acc[2] += p.abs();
            }
            acc
        })
        .collect()
}

/// Which product a check runs.
#[derive(Clone, Copy, PartialEq)]
enum Product {
    /// `Session::matmul`: the tensor-core form from [`MMA_MIN_ROWS`] rows.
    Plain,
    /// `Session::matmul_rows`: the tensor-core form at every row count.
    Rows,
}

/// Runs `out = x . w^T` on CUDA and on the CPU and checks both bounds of the module documentation
/// for every output. Returns the largest error against the CPU relative to `S`.
fn check(dev: &Device, what: &str, x: &Host, w: &Host, rows: usize, k: usize, n: usize) -> f64 {
    check_product(Product::Plain, dev, what, x, w, rows, k, n)
}

#[allow(clippy::too_many_arguments)]
fn check_product(
    product: Product,
    dev: &Device,
    what: &str,
    x: &Host,
    w: &Host,
    rows: usize,
    k: usize,
    n: usize,
) -> f64 {
    let op =
        move |s: &mut onepass::Session, i: &[onepass::Buffer], o: &[onepass::Buffer]| match product
        {
            Product::Plain => s.matmul(&i[0], &i[1], &o[0]),
            Product::Rows => s.matmul_rows(&i[0], &i[1], &o[0]),
        };
    let outs = [(DType::F32, vec![rows, n])];
    let cpu = Device::cpu(0).unwrap();
    let want: Vec<f32> =
        bytemuck::cast_slice(&run_on(&cpu, &[x.clone(), w.clone()], &outs, &op)[2]).to_vec();
    let got: Vec<f32> =
        bytemuck::cast_slice(&run_on(dev, &[x.clone(), w.clone()], &outs, &op)[2]).to_vec();
    let xv: Vec<f32> = bytemuck::cast_slice(&x.bytes).to_vec();
    let wv = onepass::quant::dequantize(w.dtype, &w.bytes).unwrap();
    let refs = references(&xv, &wv, rows, k, n);
    let mma = rows >= MMA_MIN_ROWS || product == Product::Rows;
    let kf = k as f64;
    let chain = if product == Product::Rows { 24.0 } else { 16.0 };
    let mut worst = 0f64;
    for (t, (&[exact, rounded, s], (&g, &c))) in refs.iter().zip(got.iter().zip(&want)).enumerate()
    {
        let (g, c) = (g as f64, c as f64);
        let (r, o) = (t / n, t % n);
        let (reference, bound) = if mma {
            (rounded, (kf / 16.0 + chain) * 2f64.powi(-23) * s)
        } else {
            (exact, (kf + 16.0) * 2f64.powi(-23) * s)
        };
        assert!(
            (g - reference).abs() <= bound,
            "{what}: out[{r}, {o}] = {g}, the float64 reference {reference} (bound {bound:.3e})"
        );
        let cpu_bound = (2f64.powi(-10) + 2.0 * kf * 2f64.powi(-24)) * s;
        assert!(
            (g - c).abs() <= cpu_bound,
            "{what}: out[{r}, {o}] = {g}, the CPU's {c} (bound {cpu_bound:.3e})"
        );
        worst = worst.max((g - c).abs() / s.max(f64::MIN_POSITIVE));
    }
    worst
}

/// Every weight format at odd sizes, rows on both sides of the tensor-core threshold.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tensor_core_products_in_every_format_at_odd_sizes() {
    let dev = cuda_device();
    for (j, &dt) in WEIGHT_DTYPES.iter().enumerate() {
        // Q4_K and Q6_K rows are whole 256-value super-blocks; the others take 32-value steps
        // (544: 17 blocks, rows of q4_0, q8_0 and q5_0 not a whole number of words, so not the
        // pipelined form), and float weights a k that ends inside a step.
        let shapes: &[(usize, usize)] = match dt {
            DType::Q4K | DType::Q6K => &[(129, 512), (40, 768)],
            d if d.is_float() => &[(129, 576), (40, 100)],
            _ => &[(129, 576), (200, 4352), (70, 544)],
        };
        for (s, &(n, k)) in shapes.iter().enumerate() {
            let w = weight_tensor(dt, n, k, 3000 + (10 * j + s) as u64);
            for rows in [1usize, 3, 17, 100, 511, 513] {
                let x = random_tensor(DType::F32, &[rows, k], 1.0, 3100 + rows as u64);
                let what = format!("matmul {dt} {n}x{k} rows {rows}");
                let worst = check(&dev, &what, &x, &w, rows, k, n);
                eprintln!("{what}: largest |cuda - cpu| / S {worst:.2e}");
            }
        }
    }
}

/// The prompt shapes of the models the benchmarks use (512 rows): SmolLM2 (576 wide, FFN 1536),
/// Llama 3.2 1B (2048, 8192) and the 8B's attention output (4096 x 4096), in the formats their
/// synthetic files use.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tensor_core_products_at_prompt_shapes() {
    let dev = cuda_device();
    let shapes = [
        (DType::Q4_1, 1536usize, 576usize),
        (DType::Q4_1, 576, 1536),
        (DType::Q4_0, 8192, 2048),
        (DType::Q4_0, 2048, 8192),
        (DType::Q4_0, 4096, 4096),
        (DType::Q4K, 2048, 2048),
        (DType::Q6K, 2048, 2048),
        (DType::Q8_0, 2048, 2048),
    ];
    for (s, &(dt, n, k)) in shapes.iter().enumerate() {
        let w = weight_tensor(dt, n, k, 3200 + s as u64);
        let x = random_tensor(DType::F32, &[512, k], 1.0, 3300 + s as u64);
        let what = format!("matmul {dt} {n}x{k} rows 512");
        let worst = check(&dev, &what, &x, &w, 512, k, n);
        eprintln!("{what}: largest |cuda - cpu| / S {worst:.2e}");
    }
}

/// The row-invariant product of batched decode steps in every weight format: rows 1 to 33 (a
/// second 16-row half, a second 32-row tile), outputs that end in a partial 32-output tile, k that
/// ends inside a 256-value step, and the Llama 3.2 1B decode shapes at 16 rows.
#[test]
#[ignore = "needs a CUDA GPU"]
fn row_invariant_products_in_every_format() {
    let dev = cuda_device();
    for (j, &dt) in WEIGHT_DTYPES.iter().enumerate() {
        let shapes: &[(usize, usize)] = match dt {
            DType::Q4K | DType::Q6K => &[(45, 512), (40, 768)],
            d if d.is_float() => &[(45, 576), (40, 100)],
            _ => &[(45, 576), (70, 4352)],
        };
        for (s, &(n, k)) in shapes.iter().enumerate() {
            let w = weight_tensor(dt, n, k, 3400 + (10 * j + s) as u64);
            for rows in [1usize, 3, 16, 17, 32, 33] {
                let x = random_tensor(DType::F32, &[rows, k], 1.0, 3500 + rows as u64);
                let what = format!("matmul_rows {dt} {n}x{k} rows {rows}");
                let worst = check_product(Product::Rows, &dev, &what, &x, &w, rows, k, n);
                eprintln!("{what}: largest |cuda - cpu| / S {worst:.2e}");
            }
        }
    }
    for (s, &(n, k)) in [
        (2048usize, 2048usize),
        (512, 2048),
        (8192, 2048),
        (2048, 8192),
    ]
    .iter()
    .enumerate()
    {
        let w = weight_tensor(DType::Q4_0, n, k, 3600 + s as u64);
        let x = random_tensor(DType::F32, &[16, k], 1.0, 3700 + s as u64);
        let what = format!("matmul_rows q4_0 {n}x{k} rows 16");
        let worst = check_product(Product::Rows, &dev, &what, &x, &w, 16, k, n);
        eprintln!("{what}: largest |cuda - cpu| / S {worst:.2e}");
    }
}
