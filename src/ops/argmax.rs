//! The `argmax` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! [`argmax`] writes, for each row of `x`, the index of its largest value (greedy sampling on the
//! device). Ties go to the first index; NaN values are skipped; a row whose largest value is not
//! finite (an infinity, or only NaN) gives -1, so a greedy step that reads back only the index
//! learns that the logits are broken without reading them.

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid, KernelId};
use crate::kernels::misc::ARGMAX;
use crate::ops::elementwise::{check_disjoint, u32_size};
use crate::ops::Check;

/// `out[r] = argmax_i x[r, i]`; `x` f32 `[rows, n]` (or `[n]`, one row), `out` i32 `[rows]`.
pub fn argmax(x: &Buffer, out: &Buffer) -> Result<Dispatch> {
    let check = Check::op("argmax");
    check.dtype("x", x, &[DType::F32])?;
    check.dtype("out", out, &[DType::I32])?;
    let n = x.shape().last();
    check.require("x", x.elems() > 0 && n <= i32::MAX as usize, || {
        format!(
            "has shape {:?}; rows must be non-empty and index as i32",
            x.dims()
        )
    })?;
    let rows = x.shape().rows();
    check.elems("out", out, rows)?;
    check_disjoint(&check, "out", out, &[("x", x)])?;
    let args = vec![
        Arg::read(x),
        Arg::write(out),
        Arg::u32(u32_size(&check, "x", n)?),
    ];
    let grid = Grid::new(rows.min(u32::MAX as usize) as u32, 1024);
    Dispatch::new(KernelId::of(&ARGMAX), args, grid)
}

#[cfg(test)]
mod tests {
    use crate::backend::{DType, Device};
    use crate::error::Error;
    use crate::ops::copy::float_io::run_direct;
    use crate::testutil::random_f32;

    /// First index of the maximum, skipping NaN (-1 when the maximum is not finite or the row
    /// has no value but NaN).
    fn reference(row: &[f32]) -> i32 {
        let mut best: Option<(f64, usize)> = None;
        for (i, &v) in row.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|(b, _)| (v as f64) > b) {
                best = Some((v as f64, i));
            }
        }
        match best {
            Some((v, i)) if v.is_finite() => i as i32,
            _ => -1,
        }
    }

    #[test]
    fn argmax_matches_reference_with_ties_and_nan() {
        let dev = Device::cpu(2).unwrap();
        for (case, &(rows, n)) in [(1, 49_152), (3, 577), (17, 64), (2, 100_003), (4, 1)]
            .iter()
            .enumerate()
        {
            let mut xv = random_f32(rows * n, 10.0, 200 + case as u64);
            if n > 8 {
                // A tie for the maximum in row 0 at a late and an early index; NaN before both.
                let peak = 100.0;
                xv[n - 2] = peak;
                xv[n / 3] = peak;
                xv[1] = f32::NAN;
            }
            let x = dev.upload(&xv, &[rows, n]).unwrap();
            let out = dev.alloc(DType::I32, &[rows]).unwrap();
            run_direct(&dev, |s| s.argmax(&x, &out));
            let want: Vec<i32> = xv.chunks(n).map(reference).collect();
            assert_eq!(
                dev.download::<i32>(&out).unwrap(),
                want,
                "argmax [{rows}, {n}]"
            );
            if n > 8 {
                assert_eq!(want[0], (n / 3) as i32, "the tie goes to the first index");
            }
        }
        let nan_row = dev
            .upload(
                &[
                    f32::NAN,
                    f32::NAN,
                    f32::NEG_INFINITY,
                    f32::NEG_INFINITY,
                    1.0,
                    f32::INFINITY,
                    2.0,
                    f32::NAN,
                ],
                &[4, 2],
            )
            .unwrap();
        let out = dev.alloc(DType::I32, &[4]).unwrap();
        run_direct(&dev, |s| s.argmax(&nan_row, &out));
        assert_eq!(dev.download::<i32>(&out).unwrap(), vec![-1, -1, -1, 0]);
    }

    #[test]
    fn argmax_rejects_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let x = dev.alloc(DType::F32, &[3, 10]).unwrap();
        let expect = |r: crate::error::Result<crate::graph::Dispatch>, arg: &str| match r {
            Err(Error::DType {
                op: "argmax",
                arg: a,
                ..
            })
            | Err(Error::Shape {
                op: "argmax",
                arg: a,
                ..
            }) if a == arg => {}
            other => panic!("expected an error naming argmax and `{arg}`, got {other:?}"),
        };
        expect(
            super::argmax(
                &dev.alloc(DType::F16, &[3, 10]).unwrap(),
                &dev.alloc(DType::I32, &[3]).unwrap(),
            ),
            "x",
        );
        expect(
            super::argmax(&x, &dev.alloc(DType::F32, &[3]).unwrap()),
            "out",
        );
        expect(
            super::argmax(&x, &dev.alloc(DType::I32, &[2]).unwrap()),
            "out",
        );
    }
}
