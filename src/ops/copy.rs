//! The `copy` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! `copy(src, dst)` copies every element of `src` into `dst`, converting among f32, f16 and bf16
//! (round to nearest even when narrowing). The two views hold the same number of elements; their
//! shapes may differ (a copy is also a reshape).

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid, KernelId};
use crate::kernels::{misc::COPY, FLOATS};
use crate::ops::elementwise::{check_disjoint, FLOAT_DTYPES};
use crate::ops::Check;

fn copy_kernel(src: DType, dst: DType) -> Option<KernelId> {
    let from = FLOATS.iter().position(|&d| d == src)?;
    let to = FLOATS.iter().position(|&d| d == dst)?;
    Some(KernelId::of(&COPY[3 * from + to]))
}

/// `dst = src`, element by element, converting the dtype (f32, f16, bf16 in any pair).
pub fn copy(src: &Buffer, dst: &Buffer) -> Result<Dispatch> {
    let check = Check::op("copy");
    check.dtype("src", src, &FLOAT_DTYPES)?;
    check.dtype("dst", dst, &FLOAT_DTYPES)?;
    check.require("src", src.elems() > 0, || "is empty".into())?;
    check.elems("dst", dst, src.elems())?;
    check_disjoint(&check, "dst", dst, &[("src", src)])?;
    let kernel = copy_kernel(src.dtype(), dst.dtype()).ok_or_else(|| {
        crate::error::Error::Unsupported(format!("copy {} -> {}", src.dtype(), dst.dtype()))
    })?;
    let args = vec![Arg::read(src), Arg::write(dst)];
    Dispatch::new(kernel, args, Grid::cover(src.elems(), 256))
}

/// Test helpers shared by the float op families: upload and download in any float dtype, the
/// values a dtype stores, per-dtype tolerances, and running ops through a direct session.
#[cfg(test)]
pub(crate) mod float_io {
    use half::{bf16, f16};

    use crate::backend::{Buffer, DType, Device};
    use crate::error::Result;
    use crate::{Executor, Mode, Plan, Session};

    /// `values` rounded to `dtype` and back (what a buffer of that dtype holds).
    pub(crate) fn rounded(dtype: DType, values: &[f32]) -> Vec<f32> {
        match dtype {
            DType::F16 => values.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
            DType::BF16 => values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
            _ => values.to_vec(),
        }
    }

    /// Uploads `values` as `dtype` (f32, f16 or bf16).
    pub(crate) fn upload(dev: &Device, dtype: DType, values: &[f32], dims: &[usize]) -> Buffer {
        match dtype {
            DType::F16 => {
                let v: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
                dev.upload(&v, dims).unwrap()
            }
            DType::BF16 => {
                let v: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
                dev.upload(&v, dims).unwrap()
            }
            DType::F32 => dev.upload(values, dims).unwrap(),
            other => panic!("not a float dtype: {other}"),
        }
    }

    /// Downloads a float buffer as f32.
    pub(crate) fn download(dev: &Device, buf: &Buffer) -> Vec<f32> {
        match buf.dtype() {
            DType::F16 => dev
                .download::<f16>(buf)
                .unwrap()
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            DType::BF16 => dev
                .download::<bf16>(buf)
                .unwrap()
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            DType::F32 => dev.download::<f32>(buf).unwrap(),
            other => panic!("not a float dtype: {other}"),
        }
    }

    /// `(atol, rtol)` for one rounding to `dtype` of an f32 computation, against an f64
    /// reference: f32 1e-6 / 1e-5; f16 1e-5 / 1e-3 (half an ulp is 4.9e-4); bf16 1e-5 / 8e-3
    /// (half an ulp is 3.9e-3).
    pub(crate) fn tolerance(dtype: DType) -> (f32, f32) {
        match dtype {
            DType::F16 => (1e-5, 1e-3),
            DType::BF16 => (1e-5, 8e-3),
            _ => (1e-6, 1e-5),
        }
    }

    /// Runs `ops` in a direct session on `dev` and waits for it.
    pub(crate) fn run_direct(dev: &Device, ops: impl FnOnce(&mut Session) -> Result<()>) {
        let mut session = Executor::new(dev.clone()).begin(Mode::Direct);
        ops(&mut session).unwrap();
        session.finish(&Plan::SEQUENTIAL).unwrap();
    }

    /// The three float dtypes, for test loops.
    pub(crate) const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
}

#[cfg(test)]
mod tests {
    use super::float_io::*;
    use crate::backend::{DType, Device};
    use crate::error::Error;
    use crate::testutil::{assert_close, random_f32};

    #[test]
    fn copy_converts_between_every_float_pair() {
        let dev = Device::cpu(2).unwrap();
        for (case, &n) in [1usize, 577, 40_000].iter().enumerate() {
            let values = random_f32(n, 3.0, 100 + case as u64);
            for src_t in FLOATS {
                for dst_t in FLOATS {
                    let src = upload(&dev, src_t, &values, &[n]);
                    let dst = dev.alloc(dst_t, &[1, n]).unwrap();
                    run_direct(&dev, |s| s.copy(&src, &dst));
                    // Reference: the source's stored values, rounded once to the target.
                    let want = rounded(dst_t, &rounded(src_t, &values));
                    let got = download(&dev, &dst);
                    assert_close(
                        &got,
                        &want,
                        0.0,
                        0.0,
                        &format!("copy {src_t}->{dst_t} n={n}"),
                    );
                }
            }
        }
    }

    #[test]
    fn copy_rejects_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let a = dev.alloc(DType::F32, &[4, 8]).unwrap();
        let ints = dev.alloc(DType::I32, &[32]).unwrap();
        let short = dev.alloc(DType::F16, &[31]).unwrap();
        match super::copy(&ints, &a) {
            Err(Error::DType {
                op: "copy",
                arg: "src",
                ..
            }) => {}
            other => panic!("expected a dtype error on src, got {other:?}"),
        }
        match super::copy(&a, &short) {
            Err(Error::Shape {
                op: "copy",
                arg: "dst",
                ..
            }) => {}
            other => panic!("expected a shape error on dst, got {other:?}"),
        }
        let half = a.rows(0, 2).unwrap();
        let half2 = a.rows(1, 2).unwrap();
        match super::copy(&half, &half2) {
            Err(Error::Shape {
                op: "copy",
                arg: "dst",
                ..
            }) => {}
            other => panic!("expected an overlap error on dst, got {other:?}"),
        }
    }
}
