//! The SIMD and scalar inner loops against each other (the f64 reference tests live in
//! `ops::matmul`). Tolerance: `1e-5 * sum_i |x_i| * (|w_i| + 1)`: both are f32 sums, in different
//! orders.

use super::*;
use crate::ops::matmul::WEIGHT_DTYPES;
use crate::quant::{dequantize, quantize};
use crate::testutil::random_f32;

fn scale(x: &[f32], wf: &[f32], rows: usize, k: usize, n: usize) -> Vec<f32> {
    let mut s = vec![0f32; rows * n];
    for r in 0..rows {
        for o in 0..n {
            s[r * n + o] = (0..k)
                .map(|i| x[r * k + i].abs() * (wf[o * k + i].abs() + 1.0))
                .sum();
        }
    }
    s
}

/// The scalar, AVX2 and detected forms of one product agree within the tolerance.
fn isas_agree(dtype: DType, k: usize, n: usize, rows: usize) {
    let seed = (k + n + rows) as u64;
    let x = random_f32(rows * k, 1.0, seed);
    let wb = quantize(dtype, &random_f32(n * k, 0.5, seed + 1)).unwrap();
    let wf = dequantize(dtype, &wb).unwrap();
    let row_bytes = dtype.bytes_for(k).unwrap();
    let w = WeightRows::Plain {
        dtype,
        bytes: &wb,
        row_bytes,
    };
    let mut a = vec![0f32; rows * n];
    let mut b = vec![0f32; rows * n];
    matmul_rows(Isa::Scalar, &w, &x, rows, k, n, &mut a);
    matmul_rows(Isa::Avx2, &w, &x, rows, k, n, &mut b);
    let mut c = vec![0f32; rows * n];
    matmul_rows(Isa::detect(), &w, &x, rows, k, n, &mut c);
    let s = scale(&x, &wf, rows, k, n);
    for i in 0..rows * n {
        let tol = 1e-5 * s[i];
        assert!(
            (a[i] - c[i]).abs() <= tol,
            "{dtype} k {k} n {n} rows {rows} i {i}: scalar {} vs {:?} {}",
            a[i],
            Isa::detect(),
            c[i]
        );
        assert!(
            (a[i] - b[i]).abs() <= tol,
            "{dtype} k {k} n {n} rows {rows} i {i}: {} vs {}",
            a[i],
            b[i]
        );
    }
}

#[test]
fn simd_agrees_with_scalar_for_every_format() {
    if Isa::detect() == Isa::Scalar {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    for dtype in WEIGHT_DTYPES {
        for (k, n, rows) in [
            (256, 7, 1),
            (512, 19, 1),
            (1536, 5, 1),
            (256, 17, 2),
            (512, 33, 7),
            (1536, 16, 13),
        ] {
            isas_agree(dtype, k, n, rows);
        }
    }
}

/// Q5_0 at widths that are not whole 256-value blocks: one block, three, and the Gemma 3 270M
/// width of 640 (20 blocks: one whole group of 16 scales and a partial one in the AVX-512 loop).
#[test]
fn simd_agrees_with_scalar_for_q5_0_at_odd_widths() {
    if Isa::detect() == Isa::Scalar {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    for (k, n, rows) in [(32, 3, 1), (96, 21, 1), (640, 37, 1), (640, 19, 3)] {
        isas_agree(DType::Q5_0, k, n, rows);
    }
}

#[test]
fn vector_and_matrix_forms_agree() {
    // Row r of a multi-row product equals the one-row product of row r.
    let (k, n, rows) = (576, 37, 9);
    let x = random_f32(rows * k, 1.0, 5);
    let wb = quantize(DType::Q4_1, &random_f32(n * k, 0.5, 6)).unwrap();
    let wf = dequantize(DType::Q4_1, &wb).unwrap();
    let w = WeightRows::Plain {
        dtype: DType::Q4_1,
        bytes: &wb,
        row_bytes: DType::Q4_1.bytes_for(k).unwrap(),
    };
    for isa in [Isa::Scalar, Isa::detect()] {
        let mut all = vec![0f32; rows * n];
        matmul_rows(isa, &w, &x, rows, k, n, &mut all);
        let s = scale(&x, &wf, rows, k, n);
        for r in 0..rows {
            let mut one = vec![0f32; n];
            matmul_rows(isa, &w, &x[r * k..(r + 1) * k], 1, k, n, &mut one);
            for (o, &v) in one.iter().enumerate() {
                let i = r * n + o;
                assert!((all[i] - v).abs() <= 1e-5 * s[i], "{isa:?} row {r} col {o}");
            }
        }
    }
}
