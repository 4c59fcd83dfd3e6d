//! The `softmax` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! [`softmax`] computes, per row of `x` (f32 `[.., n]`), `softmax(x * scale + mask)`, numerically
//! stable (the row maximum is subtracted before `exp`; the sum is accumulated in f64). The
//! optional additive mask (f32, `-inf` allowed) has `mask_rows` rows of `n` where `mask_rows`
//! divides the rows of `x`: row `r` uses mask row `r % mask_rows` (one row for all, one per row,
//! or one per query row shared by every head of `[heads * rows, n]`). A fully masked row gives
//! zeros. `out` may be `x` itself (in place).

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid, KernelId};
use crate::kernels::misc::SOFTMAX;
use crate::ops::elementwise::{check_disjoint, same_view, u32_size};
use crate::ops::Check;

/// `out = softmax(x * scale + mask)` over each row (see the module documentation).
pub fn softmax(x: &Buffer, out: &Buffer, scale: f32, mask: Option<&Buffer>) -> Result<Dispatch> {
    let check = Check::op("softmax");
    check.dtype("x", x, &[DType::F32])?;
    check.require("x", x.elems() > 0, || "is empty".into())?;
    check.dtype("out", out, &[DType::F32])?;
    check.dims("out", out, x.dims())?;
    check.require("scale", scale.is_finite(), || {
        format!("{scale} is not finite")
    })?;
    let (rows, n) = (x.shape().rows(), x.shape().last());
    if let Some(m) = mask {
        check.dtype("mask", m, &[DType::F32])?;
        let mask_rows = m.shape().rows();
        check.require(
            "mask",
            m.shape().last() == n && mask_rows > 0 && rows % mask_rows == 0,
            || {
                format!(
                    "has shape {:?}; expected rows of {n}, a divisor of {rows} of them",
                    m.dims()
                )
            },
        )?;
    }
    let in_place = same_view(out, x);
    let mut inputs: Vec<(&'static str, &Buffer)> = mask.map(|m| ("mask", m)).into_iter().collect();
    let mut args = vec![if in_place {
        Arg::read_write(x)
    } else {
        Arg::read(x)
    }];
    args.extend(mask.map(Arg::read));
    if !in_place {
        inputs.push(("x", x));
        args.push(Arg::write(out));
    }
    check_disjoint(&check, if in_place { "x" } else { "out" }, out, &inputs)?;
    args.push(Arg::f32(scale));
    args.push(Arg::u32(u32_size(&check, "x", n)?));
    let kernel = KernelId::of(&SOFTMAX[2 * usize::from(mask.is_some()) + usize::from(in_place)]);
    let grid = Grid::new(rows.min(u32::MAX as usize) as u32, 256);
    Dispatch::new(kernel, args, grid)
}

#[cfg(test)]
mod tests {
    use crate::backend::{DType, Device};
    use crate::error::Error;
    use crate::ops::copy::float_io::run_direct;
    use crate::testutil::{assert_close, random_f32, rng};
    use rand::RngExt;

    fn reference(x: &[f32], mask: Option<&[f32]>, n: usize, scale: f32) -> Vec<f32> {
        let mut out = Vec::with_capacity(x.len());
        for (r, row) in x.chunks(n).enumerate() {
            let v: Vec<f64> = row
                .iter()
                .enumerate()
                .map(|(i, &xi)| {
                    let m = mask.map_or(0.0, |m| {
                        let k = r % (m.len() / n);
                        m[k * n + i] as f64
                    });
                    xi as f64 * scale as f64 + m
                })
                .collect();
            let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if max == f64::NEG_INFINITY {
                out.extend(std::iter::repeat_n(0.0, n));
                continue;
            }
            let sum: f64 = v.iter().map(|&a| (a - max).exp()).sum();
            out.extend(v.iter().map(|&a| ((a - max).exp() / sum) as f32));
        }
        out
    }

    /// A causal-style mask: `-inf` in about a third of the places, small values elsewhere.
    fn random_mask(rows: usize, n: usize, seed: u64) -> Vec<f32> {
        let mut r = rng(seed);
        (0..rows * n)
            .map(|_| {
                if r.random_range(0..3) == 0 {
                    f32::NEG_INFINITY
                } else {
                    r.random_range(-2.0..2.0)
                }
            })
            .collect()
    }

    #[test]
    fn softmax_matches_reference_with_and_without_mask() {
        let dev = Device::cpu(2).unwrap();
        // (rows, n, mask rows); large inputs (|x| up to 40) check the max subtraction.
        let cases = [
            (1, 576, 1),
            (3, 577, 3),
            (17, 64, 1),
            (12, 33, 4),
            (2, 49_152, 2),
        ];
        for (case, &(rows, n, mask_rows)) in cases.iter().enumerate() {
            for scale in [1.0f32, 0.125] {
                for in_place in [false, true] {
                    let seed = 700 + case as u64;
                    let xv = random_f32(rows * n, 40.0, seed);
                    let mv = random_mask(mask_rows, n, seed + 1);
                    let x = dev.upload(&xv, &[rows, n]).unwrap();
                    let x2 = dev.upload(&xv, &[rows, n]).unwrap();
                    let mask = dev.upload(&mv, &[mask_rows, n]).unwrap();
                    let (out, out2) = if in_place {
                        (x.clone(), x2.clone())
                    } else {
                        (
                            dev.alloc(DType::F32, &[rows, n]).unwrap(),
                            dev.alloc(DType::F32, &[rows, n]).unwrap(),
                        )
                    };
                    run_direct(&dev, |s| {
                        s.softmax(&x, &out, scale, None)?;
                        s.softmax(&x2, &out2, scale, Some(&mask))
                    });
                    let what = format!(
                        "softmax [{rows}, {n}] scale {scale} in place {in_place} seed {seed}"
                    );
                    // f32: exp and the final product, a few ulps of each probability.
                    assert_close(
                        &dev.download::<f32>(&out).unwrap(),
                        &reference(&xv, None, n, scale),
                        1e-7,
                        1e-5,
                        &what,
                    );
                    let want = reference(&xv, Some(&mv), n, scale);
                    assert_close(
                        &dev.download::<f32>(&out2).unwrap(),
                        &want,
                        1e-7,
                        1e-5,
                        &format!("{what}, masked"),
                    );
                }
            }
        }
    }

    #[test]
    fn fully_masked_row_gives_zeros() {
        let dev = Device::cpu(2).unwrap();
        let x = dev.upload(&random_f32(2 * 5, 1.0, 3), &[2, 5]).unwrap();
        let mut mv = vec![0.5f32; 10];
        mv[..5].fill(f32::NEG_INFINITY);
        let mask = dev.upload(&mv, &[2, 5]).unwrap();
        let out = dev.alloc(DType::F32, &[2, 5]).unwrap();
        run_direct(&dev, |s| s.softmax(&x, &out, 1.0, Some(&mask)));
        let got = dev.download::<f32>(&out).unwrap();
        assert_eq!(&got[..5], &[0.0; 5]);
        assert!((got[5..].iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn softmax_rejects_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let x = dev.alloc(DType::F32, &[6, 10]).unwrap();
        let out = dev.alloc(DType::F32, &[6, 10]).unwrap();
        let expect = |r: crate::error::Result<crate::graph::Dispatch>, arg: &str| match r {
            Err(Error::DType {
                op: "softmax",
                arg: a,
                ..
            })
            | Err(Error::Shape {
                op: "softmax",
                arg: a,
                ..
            }) if a == arg => {}
            other => panic!("expected an error naming softmax and `{arg}`, got {other:?}"),
        };
        expect(
            super::softmax(&dev.alloc(DType::F16, &[6, 10]).unwrap(), &out, 1.0, None),
            "x",
        );
        expect(
            super::softmax(&x, &dev.alloc(DType::F32, &[6, 11]).unwrap(), 1.0, None),
            "out",
        );
        expect(super::softmax(&x, &out, f32::NAN, None), "scale");
        expect(
            super::softmax(
                &x,
                &out,
                1.0,
                Some(&dev.alloc(DType::F32, &[4, 10]).unwrap()),
            ),
            "mask",
        );
        expect(
            super::softmax(
                &x,
                &out,
                1.0,
                Some(&dev.alloc(DType::F32, &[2, 9]).unwrap()),
            ),
            "mask",
        );
        expect(
            super::softmax(
                &x,
                &out,
                1.0,
                Some(&dev.alloc(DType::F16, &[1, 10]).unwrap()),
            ),
            "mask",
        );
        expect(super::softmax(&x, &out, 1.0, Some(&out)), "out");
    }
}
