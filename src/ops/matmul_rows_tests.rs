//! The row-invariant product against a float64 reference of the dequantized weights, and bitwise
//! against the one-row plain product of each row (the bits of the single-sequence decode step),
//! whatever the number of rows (the plain product's matrix form fails that comparison).
//!
//! Tolerance against the reference, as for the plain product: f32 accumulation,
//! `|got - want| <= 1e-4 * sum_i |x_i| * (|w_i| + 1)` per output.

use crate::backend::{DType, Device};
use crate::error::Error;
use crate::quant::{dequantize, quantize};
use crate::session::{Executor, Mode, Plan};
use crate::testutil::random_f32;

fn run(dev: &Device, f: impl FnOnce(&mut crate::Session) -> crate::Result<()>) {
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    f(&mut s).unwrap();
    s.finish(&Plan::SEQUENTIAL).unwrap();
}

#[test]
fn rows_match_the_reference_and_the_one_row_product_bitwise() {
    let dev = Device::cpu(2).unwrap();
    // (format, k, n): k a whole number of the format's blocks; odd n.
    let cases = [
        (DType::Q4_1, 96, 37),
        (DType::Q8_0, 160, 19),
        (DType::Q4K, 256, 13),
        (DType::F32, 45, 11),
        (DType::F16, 33, 7),
    ];
    for (case, &(dtype, k, n)) in cases.iter().enumerate() {
        let seed = 500 + 10 * case as u64;
        let wv = random_f32(n * k, 0.5, seed);
        let wb = quantize(dtype, &wv).unwrap();
        let wf = dequantize(dtype, &wb).unwrap();
        let w = dev.upload_bytes(&wb, dtype, &[n, k]).unwrap();
        for rows in [1usize, 3, 7, 13] {
            let x = random_f32(rows * k, 1.0, seed + rows as u64);
            let xb = dev.upload(&x, &[rows, k]).unwrap();
            let out = dev.alloc(DType::F32, &[rows, n]).unwrap();
            run(&dev, |s| s.matmul_rows(&xb, &w, &out));
            let got: Vec<f32> = dev.download(&out).unwrap();
            for r in 0..rows {
                let xr = &x[r * k..(r + 1) * k];
                for o in 0..n {
                    let (mut want, mut scale) = (0f64, 0f64);
                    for i in 0..k {
                        let (a, b) = (xr[i] as f64, wf[o * k + i] as f64);
                        want += a * b;
                        scale += a.abs() * (b.abs() + 1.0);
                    }
                    let g = got[r * n + o] as f64;
                    assert!(
                        (g - want).abs() <= 1e-4 * scale,
                        "{dtype} rows {rows}: out[{r}, {o}] = {g}, want {want}"
                    );
                }
                // The same row alone through the plain one-row product: the same bits.
                let one = dev.upload(xr, &[1, k]).unwrap();
                let alone = dev.alloc(DType::F32, &[1, n]).unwrap();
                run(&dev, |s| s.matmul(&one, &w, &alone));
                let alone: Vec<f32> = dev.download(&alone).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got[r * n..(r + 1) * n]),
                    bits(&alone),
                    "{dtype} rows {rows}: row {r} differs from the one-row product"
                );
            }
        }
    }
}

#[test]
fn matmul_rows_rejects_bad_arguments() {
    let dev = Device::cpu(2).unwrap();
    let w = dev.alloc(DType::Q8_0, &[5, 64]).unwrap();
    let x = dev.alloc(DType::F32, &[3, 64]).unwrap();
    let out = dev.alloc(DType::F32, &[3, 5]).unwrap();
    let expect = |r: crate::error::Result<crate::graph::Dispatch>, arg: &str| match r {
        Err(Error::DType {
            op: "matmul_rows",
            arg: a,
            ..
        })
        | Err(Error::Shape {
            op: "matmul_rows",
            arg: a,
            ..
        }) if a == arg => {}
        other => panic!("expected an error naming matmul_rows and `{arg}`, got {other:?}"),
    };
    assert!(super::matmul_rows(&x, &w, &out).is_ok());
    expect(
        super::matmul_rows(&dev.alloc(DType::F16, &[3, 64]).unwrap(), &w, &out),
        "x",
    );
    expect(
        super::matmul_rows(&dev.alloc(DType::F32, &[3, 63]).unwrap(), &w, &out),
        "x",
    );
    expect(
        super::matmul_rows(&x, &w, &dev.alloc(DType::F32, &[3, 6]).unwrap()),
        "out",
    );
    expect(
        super::matmul_rows(&x, &dev.alloc(DType::I32, &[5, 64]).unwrap(), &out),
        "w",
    );
    expect(
        super::matmul_rows(&x, &dev.alloc(DType::F32, &[5, 64, 1]).unwrap(), &out),
        "w",
    );
}
