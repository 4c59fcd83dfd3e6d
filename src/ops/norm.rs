//! The `norm` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! RMS normalization over the last dimension of `x` (`dim`): every row becomes
//! `x / sqrt(mean(x^2) + eps)`, times `weight` (one value per column) when there is one.
//! `rms_norm_mul` multiplies the result by `m` in the same pass; `m` is one row `[dim]` broadcast
//! over the rows, or has `x`'s shape. `rms_norm_add` adds the (weighted) result into an
//! accumulator `acc` of `x`'s shape instead of writing it. `x`, `weight`, `m`, `acc` and `out`
//! share one dtype: f32, f16 or bf16. The sum of squares is accumulated in f64.
//!
//! This file also holds two fusion rules. [`RMS_NORM_MUL_FUSION`]: an `rms_norm` (or
//! `rms_norm_no_scale`) whose output the next dispatch, a `mul`, reads as one operand becomes one
//! `rms_norm_mul`; for f32 the fused kernel gives the same bits as the pair.
//! [`RMS_NORM_ADD_FUSION`]: an `rms_norm` whose output the next dispatch, an in-place `add`,
//! adds whole into an accumulator (`acc += norm_out`, the post-block norms of Gemma 3) becomes one
//! `rms_norm_add`, which gives the pair's bits for every float dtype.

use crate::backend::Buffer;
use crate::error::{Error, Result};
use crate::graph::passes::FusionRule;
use crate::graph::{Arg, ArgRef, Dispatch, DispatchRef, DispatchSpec, Grid, OpKind, Range, Scalar};
use crate::kernels::{elementwise as ew, norm as kn};
use crate::ops::elementwise::{
    binary_operands, check_disjoint, float_kernel, u32_size, FLOAT_DTYPES,
};
use crate::ops::fused_block::one_device;
use crate::ops::Check;

/// Threads per row on a GPU; the CPU ignores it.
pub(crate) const ROW_THREADS: u32 = 256;

/// Checks `x`, the output (`out`, or `acc` for `rms_norm_add`) and `eps`, returning the row
/// length as a u32.
fn check_x_out(
    check: &Check,
    x: &Buffer,
    (out_name, out): (&'static str, &Buffer),
    eps: f32,
) -> Result<u32> {
    check.dtype("x", x, &FLOAT_DTYPES)?;
    check.require("x", x.elems() > 0, || "is empty".into())?;
    check.dtype(out_name, out, &[x.dtype()])?;
    check.dims(out_name, out, x.dims())?;
    check.require("eps", eps.is_finite() && eps >= 0.0, || {
        format!("{eps} is not a finite non-negative number")
    })?;
    u32_size(check, "x", x.shape().last())
}

/// `weight` (or `m` as a row) must be one row of `dim` values of `x`'s dtype.
fn check_row(check: &Check, name: &'static str, row: &Buffer, x: &Buffer) -> Result<()> {
    let dim = x.shape().last();
    check.dtype(name, row, &[x.dtype()])?;
    check.require(
        name,
        row.elems() == dim && row.shape().last() == dim && row.shape().rank() <= 2,
        || format!("has shape {:?}, expected [{dim}]", row.dims()),
    )
}

fn grid_rows(rows: usize) -> Grid {
    Grid::new(rows.min(u32::MAX as usize) as u32, ROW_THREADS)
}

/// `out = x / sqrt(mean(x^2) + eps) * weight`, per row of `x` (`[rows, dim]`, `weight` `[dim]`).
pub fn rms_norm(x: &Buffer, weight: &Buffer, out: &Buffer, eps: f32) -> Result<Dispatch> {
    let check = Check::op("rms_norm");
    let dim = check_x_out(&check, x, ("out", out), eps)?;
    check_row(&check, "weight", weight, x)?;
    check_disjoint(&check, "out", out, &[("x", x), ("weight", weight)])?;
    let kernel = float_kernel("rms_norm", x.dtype(), &kn::RMS_NORM)?;
    let args = vec![
        Arg::read(x),
        Arg::read(weight),
        Arg::write(out),
        Arg::f32(eps),
        Arg::u32(dim),
    ];
    Dispatch::new(kernel, args, grid_rows(x.shape().rows()))
}

/// `out = x / sqrt(mean(x^2) + eps)`, per row of `x`, without a weight.
pub fn rms_norm_no_scale(x: &Buffer, out: &Buffer, eps: f32) -> Result<Dispatch> {
    let check = Check::op("rms_norm_no_scale");
    let dim = check_x_out(&check, x, ("out", out), eps)?;
    check_disjoint(&check, "out", out, &[("x", x)])?;
    let kernel = float_kernel("rms_norm_no_scale", x.dtype(), &kn::RMS_NORM_NO_SCALE)?;
    let args = vec![Arg::read(x), Arg::write(out), Arg::f32(eps), Arg::u32(dim)];
    Dispatch::new(kernel, args, grid_rows(x.shape().rows()))
}

/// `out = rms_norm(x[, weight]) * m`, in one pass; `m` is one row `[dim]` broadcast over the rows,
/// or has `x`'s shape.
pub fn rms_norm_mul(
    x: &Buffer,
    weight: Option<&Buffer>,
    m: &Buffer,
    out: &Buffer,
    eps: f32,
) -> Result<Dispatch> {
    rms_norm_mul_spec(x, weight, m, out, eps)?.to_dispatch()
}

/// [`rms_norm_mul`] as a spec borrowing its buffers (what the fusion rule builds).
fn rms_norm_mul_spec<'a>(
    x: &'a Buffer,
    weight: Option<&'a Buffer>,
    m: &'a Buffer,
    out: &'a Buffer,
    eps: f32,
) -> Result<DispatchSpec<'a>> {
    let check = Check::op("rms_norm_mul");
    let dim = check_x_out(&check, x, ("out", out), eps)?;
    check.dtype("m", m, &[x.dtype()])?;
    if m.dims() != x.dims() {
        check_row(&check, "m", m, x)?;
    }
    let grid = grid_rows(x.shape().rows());
    let (eps, dim) = (ArgRef::f32(eps), ArgRef::u32(dim));
    match weight {
        Some(w) => {
            check_row(&check, "weight", w, x)?;
            check_disjoint(&check, "out", out, &[("x", x), ("weight", w), ("m", m)])?;
            let kernel = float_kernel("rms_norm_mul", x.dtype(), &kn::RMS_NORM_MUL)?;
            let args = [
                ArgRef::read(x),
                ArgRef::read(w),
                ArgRef::read(m),
                ArgRef::write(out),
                eps,
                dim,
            ];
            DispatchSpec::new(kernel, &args, grid)
        }
        None => {
            check_disjoint(&check, "out", out, &[("x", x), ("m", m)])?;
            let kernel = float_kernel("rms_norm_mul", x.dtype(), &kn::RMS_NORM_NO_SCALE_MUL)?;
            let args = [
                ArgRef::read(x),
                ArgRef::read(m),
                ArgRef::write(out),
                eps,
                dim,
            ];
            DispatchSpec::new(kernel, &args, grid)
        }
    }
}

/// `acc += x / sqrt(mean(x^2) + eps) * weight`, per row of `x` (`[rows, dim]`, `weight` `[dim]`,
/// `acc` of `x`'s shape and dtype, sharing no byte with `x` or `weight`). Each normalized value is
/// rounded to the dtype before the add, so the result is bitwise that of [`rms_norm`] into a
/// temporary followed by the in-place `add` of the temporary into `acc`.
pub fn rms_norm_add(x: &Buffer, weight: &Buffer, acc: &Buffer, eps: f32) -> Result<Dispatch> {
    rms_norm_add_spec(x, weight, acc, eps)?.to_dispatch()
}

/// [`rms_norm_add`] as a spec borrowing its buffers (what the fusion rule builds).
fn rms_norm_add_spec<'a>(
    x: &'a Buffer,
    weight: &'a Buffer,
    acc: &'a Buffer,
    eps: f32,
) -> Result<DispatchSpec<'a>> {
    let check = Check::op("rms_norm_add");
    let dim = check_x_out(&check, x, ("acc", acc), eps)?;
    check_row(&check, "weight", weight, x)?;
    check_disjoint(&check, "acc", acc, &[("x", x), ("weight", weight)])?;
    let kernel = float_kernel("rms_norm_add", x.dtype(), &kn::RMS_NORM_ADD)?;
    let args = [
        ArgRef::read(x),
        ArgRef::read(weight),
        ArgRef::read_write(acc),
        ArgRef::f32(eps),
        ArgRef::u32(dim),
    ];
    DispatchSpec::new(kernel, &args, grid_rows(x.shape().rows()))
}

/// The parts of an `rms_norm` or `rms_norm_no_scale` dispatch: `(x, weight, out, eps)`.
pub(crate) fn norm_operands(
    d: DispatchRef<'_>,
) -> Option<(&Buffer, Option<&Buffer>, &Buffer, f32)> {
    let k = d.kernel();
    let weight = if k.is_in(&kn::RMS_NORM) {
        Some(d.buffer("weight")?)
    } else if k.is_in(&kn::RMS_NORM_NO_SCALE) {
        None
    } else {
        return None;
    };
    let Some(Scalar::F32(eps)) = d.scalar("eps") else {
        return None;
    };
    Some((d.buffer("x")?, weight, d.buffer("out")?, eps))
}

/// A norm + mul pair that matches the rule.
struct NormMul<'a> {
    x: &'a Buffer,
    weight: Option<&'a Buffer>,
    eps: f32,
    /// The norm's output.
    norm_out: &'a Buffer,
    /// The norm's output as the mul reads it.
    read_as: &'a Buffer,
    /// The mul's other operand.
    m: &'a Buffer,
    /// The mul's output.
    out: &'a Buffer,
}

/// Matches when the mul reads exactly the norm's output as one operand and its
/// other operand does not touch that output.
fn norm_mul_match<'a>(norm: DispatchRef<'a>, mul: DispatchRef<'a>) -> Option<NormMul<'a>> {
    let (x, weight, norm_out, eps) = norm_operands(norm)?;
    let (a, b, out) = binary_operands(mul)?;
    // The in-place form writes its result over `a`.
    let out = out.unwrap_or(a);
    let produced = Range::of(norm_out);
    let (read_as, m) = if Range::of(a) == produced {
        (a, b)
    } else if Range::of(b) == produced {
        (b, a)
    } else {
        return None;
    };
    if m.overlaps(norm_out) {
        return None;
    }
    Some(NormMul {
        x,
        weight,
        eps,
        norm_out,
        read_as,
        m,
        out,
    })
}

fn norm_mul_intermediate(norm: DispatchRef<'_>, mul: DispatchRef<'_>) -> Option<Range> {
    norm_mul_match(norm, mul).map(|p| Range::of(p.norm_out))
}

fn build_norm_mul<'a>(norm: DispatchRef<'a>, mul: DispatchRef<'a>) -> Result<DispatchSpec<'a>> {
    let unmatched = |why: &str| Error::InvalidArgument(format!("rms_norm + mul: {why}"));
    let p = norm_mul_match(norm, mul).ok_or_else(|| unmatched("the pair does not match"))?;
    // The mul must read the norm's output with the norm's own shape and dtype, so that the
    // fused kernel's rows are the pair's rows.
    if p.read_as.dims() != p.norm_out.dims() || p.read_as.dtype() != p.norm_out.dtype() {
        return Err(unmatched(
            "the mul reads the norm's output with another shape or dtype",
        ));
    }
    rms_norm_mul_spec(p.x, p.weight, p.m, p.out, p.eps)
}

/// `rms_norm` or `rms_norm_no_scale` followed by a `mul` that reads the norm's output as `a` or
/// `b` becomes one `rms_norm_mul`. An in-place mul over the norm's output fuses into an
/// `rms_norm_mul` that writes that output.
pub const RMS_NORM_MUL_FUSION: FusionRule = FusionRule::pair(
    "rms_norm+mul",
    OpKind::RmsNorm,
    OpKind::Mul,
    norm_mul_intermediate,
    build_norm_mul,
);

/// A weighted norm + in-place add pair that matches [`RMS_NORM_ADD_FUSION`].
struct NormAdd<'a> {
    x: &'a Buffer,
    weight: &'a Buffer,
    eps: f32,
    /// The norm's output: the intermediate the fused kernel does not write.
    norm_out: &'a Buffer,
    /// The add's accumulator (its `a`, read and written in place).
    acc: &'a Buffer,
}

/// Matches an `rms_norm` with a weight and an in-place `add` (`a += b`, any float dtype) whose
/// `b` is exactly the norm's output (same bytes, shape and dtype: no broadcast, no other view),
/// and whose accumulator `a` has that shape, shares no byte with the norm's operands or output
/// and lives on the norm's device. Nothing else fuses: an out-of-place add writes a third buffer,
/// and an in-place add over the norm's output (`norm_out += b`) leaves its result in the
/// intermediate, not in an accumulator.
fn norm_add_match<'a>(norm: DispatchRef<'a>, add: DispatchRef<'a>) -> Option<NormAdd<'a>> {
    let (x, weight, norm_out, eps) = norm_operands(norm)?;
    let weight = weight?;
    if !add.kernel().is_in(&ew::ADD_INPLACE) {
        return None;
    }
    let (acc, b) = (add.buffer("a")?, add.buffer("b")?);
    let whole = Range::of(b) == Range::of(norm_out)
        && b.dims() == norm_out.dims()
        && b.dtype() == norm_out.dtype()
        && acc.dims() == norm_out.dims()
        && acc.dtype() == norm_out.dtype();
    let apart = !acc.overlaps(norm_out)
        && !acc.overlaps(x)
        && !acc.overlaps(weight)
        && one_device(acc, norm_out);
    (whole && apart).then_some(NormAdd {
        x,
        weight,
        eps,
        norm_out,
        acc,
    })
}

fn norm_add_intermediate(norm: DispatchRef<'_>, add: DispatchRef<'_>) -> Option<Range> {
    norm_add_match(norm, add).map(|p| Range::of(p.norm_out))
}

fn build_norm_add<'a>(norm: DispatchRef<'a>, add: DispatchRef<'a>) -> Result<DispatchSpec<'a>> {
    let p = norm_add_match(norm, add)
        .ok_or_else(|| Error::InvalidArgument("rms_norm + add: the pair does not match".into()))?;
    rms_norm_add_spec(p.x, p.weight, p.acc, p.eps)
}

/// `rms_norm` (with a weight) followed by an in-place `add` of its whole output into an
/// accumulator (`acc += norm_out`) becomes one `rms_norm_add` writing the accumulator; the norm's
/// output must be dead after the add (the fuse pass proves it).
pub const RMS_NORM_ADD_FUSION: FusionRule = FusionRule::pair(
    "rms_norm+add",
    OpKind::RmsNorm,
    OpKind::Add,
    norm_add_intermediate,
    build_norm_add,
);

#[cfg(test)]
mod tests {
    use crate::backend::{Buffer, DType, Device};
    use crate::error::Error;
    use crate::ops::copy::float_io::*;
    use crate::testutil::{assert_close, random_f32};
    use crate::{Executor, Mode, Plan};

    const SHAPES: [(usize, usize); 4] = [(1, 576), (3, 577), (17, 64), (2, 5)];
    const EPS: f32 = 1e-5;

    /// f64 reference: `x / sqrt(mean(x^2) + eps) * weight * m` per row (`m` one row or full).
    fn reference(x: &[f32], weight: Option<&[f32]>, m: Option<&[f32]>, dim: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(x.len());
        for (r, row) in x.chunks(dim).enumerate() {
            let mean = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
            let inv = 1.0 / (mean + EPS as f64).sqrt();
            for (i, &v) in row.iter().enumerate() {
                let mut y = v as f64 * inv;
                if let Some(w) = weight {
                    y *= w[i] as f64;
                }
                if let Some(m) = m {
                    y *= if m.len() == dim { m[i] } else { m[r * dim + i] } as f64;
                }
                out.push(y as f32);
            }
        }
        out
    }

    fn inputs(dev: &Device, dt: DType, rows: usize, dim: usize, seed: u64) -> (Buffer, Vec<f32>) {
        let values = rounded(dt, &random_f32(rows * dim, 2.0, seed));
        (upload(dev, dt, &values, &[rows, dim]), values)
    }

    #[test]
    fn rms_norm_and_no_scale_match_reference() {
        let dev = Device::cpu(2).unwrap();
        for dt in FLOATS {
            let (atol, rtol) = tolerance(dt);
            for (case, &(rows, dim)) in SHAPES.iter().enumerate() {
                let seed = 10 * case as u64;
                let (x, xv) = inputs(&dev, dt, rows, dim, seed);
                let (w, wv) = inputs(&dev, dt, 1, dim, seed + 1);
                let w = w.reshape(&[dim]).unwrap();
                let out = dev.alloc(dt, &[rows, dim]).unwrap();
                let out2 = dev.alloc(dt, &[rows, dim]).unwrap();
                run_direct(&dev, |s| {
                    s.rms_norm(&x, &w, &out, EPS)?;
                    s.rms_norm_no_scale(&x, &out2, EPS)
                });
                let what = format!("rms_norm {dt} [{rows}, {dim}] seed {seed}");
                assert_close(
                    &download(&dev, &out),
                    &reference(&xv, Some(&wv), None, dim),
                    atol,
                    rtol,
                    &what,
                );
                let what = format!("rms_norm_no_scale {dt} [{rows}, {dim}] seed {seed}");
                assert_close(
                    &download(&dev, &out2),
                    &reference(&xv, None, None, dim),
                    atol,
                    rtol,
                    &what,
                );
            }
        }
    }

    #[test]
    fn rms_norm_mul_matches_reference_for_row_and_full_m() {
        let dev = Device::cpu(2).unwrap();
        for dt in FLOATS {
            let (atol, rtol) = tolerance(dt);
            for (case, &(rows, dim)) in SHAPES.iter().enumerate() {
                let seed = 1000 + 10 * case as u64;
                let (x, xv) = inputs(&dev, dt, rows, dim, seed);
                let (w, wv) = inputs(&dev, dt, 1, dim, seed + 1);
                let (m_row, m_row_v) = inputs(&dev, dt, 1, dim, seed + 2);
                let m_row = m_row.reshape(&[dim]).unwrap();
                let (m_full, m_full_v) = inputs(&dev, dt, rows, dim, seed + 3);
                let outs: Vec<Buffer> = (0..4)
                    .map(|_| dev.alloc(dt, &[rows, dim]).unwrap())
                    .collect();
                run_direct(&dev, |s| {
                    s.rms_norm_mul(&x, Some(&w), &m_row, &outs[0], EPS)?;
                    s.rms_norm_mul(&x, Some(&w), &m_full, &outs[1], EPS)?;
                    s.rms_norm_mul(&x, None, &m_row, &outs[2], EPS)?;
                    s.rms_norm_mul(&x, None, &m_full, &outs[3], EPS)
                });
                let wants = [
                    reference(&xv, Some(&wv), Some(&m_row_v), dim),
                    reference(&xv, Some(&wv), Some(&m_full_v), dim),
                    reference(&xv, None, Some(&m_row_v), dim),
                    reference(&xv, None, Some(&m_full_v), dim),
                ];
                for (k, (out, want)) in outs.iter().zip(&wants).enumerate() {
                    let what = format!("rms_norm_mul case {k} {dt} [{rows}, {dim}] seed {seed}");
                    assert_close(&download(&dev, out), want, atol, rtol, &what);
                }
            }
        }
    }

    #[test]
    fn norm_ops_reject_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let x = dev.alloc(DType::F32, &[3, 64]).unwrap();
        let out = dev.alloc(DType::F32, &[3, 64]).unwrap();
        let w16 = dev.alloc(DType::F16, &[64]).unwrap();
        let w_short = dev.alloc(DType::F32, &[63]).unwrap();
        let ints = dev.alloc(DType::I32, &[3, 64]).unwrap();
        let m_bad = dev.alloc(DType::F32, &[2, 64]).unwrap();
        match super::rms_norm(&x, &w16, &out, EPS) {
            Err(Error::DType {
                op: "rms_norm",
                arg: "weight",
                ..
            }) => {}
            other => panic!("expected a dtype error on weight, got {other:?}"),
        }
        match super::rms_norm(&x, &w_short, &out, EPS) {
            Err(Error::Shape {
                op: "rms_norm",
                arg: "weight",
                ..
            }) => {}
            other => panic!("expected a shape error on weight, got {other:?}"),
        }
        match super::rms_norm_no_scale(&ints, &out, EPS) {
            Err(Error::DType {
                op: "rms_norm_no_scale",
                arg: "x",
                ..
            }) => {}
            other => panic!("expected a dtype error on x, got {other:?}"),
        }
        match super::rms_norm_no_scale(&x, &m_bad, EPS) {
            Err(Error::Shape {
                op: "rms_norm_no_scale",
                arg: "out",
                ..
            }) => {}
            other => panic!("expected a shape error on out, got {other:?}"),
        }
        match super::rms_norm_no_scale(&x, &x, EPS) {
            Err(Error::Shape {
                op: "rms_norm_no_scale",
                arg: "out",
                ..
            }) => {}
            other => panic!("expected an overlap error on out, got {other:?}"),
        }
        match super::rms_norm_mul(&x, None, &m_bad, &out, EPS) {
            Err(Error::Shape {
                op: "rms_norm_mul",
                arg: "m",
                ..
            }) => {}
            other => panic!("expected a shape error on m, got {other:?}"),
        }
        match super::rms_norm_no_scale(&x, &out, f32::NAN) {
            Err(Error::Shape {
                op: "rms_norm_no_scale",
                arg: "eps",
                ..
            }) => {}
            other => panic!("expected an error on eps, got {other:?}"),
        }
    }

    /// Records `norm -> mul -> tail` and runs it with `plan`; returns (fusions, mul output).
    fn run_norm_mul(
        dev: &Device,
        plan: &Plan,
        weighted: bool,
        norm_out_as_b: bool,
        tail_reads_intermediate: bool,
    ) -> (usize, Vec<f32>) {
        let (rows, dim) = (3, 577);
        let x = dev
            .upload(&random_f32(rows * dim, 2.0, 7), &[rows, dim])
            .unwrap();
        let w = dev.upload(&random_f32(dim, 1.5, 8), &[dim]).unwrap();
        let m = dev.upload(&random_f32(dim, 1.5, 9), &[dim]).unwrap();
        let tmp = dev.alloc(DType::F32, &[rows, dim]).unwrap();
        let out = dev.alloc(DType::F32, &[rows, dim]).unwrap();
        let other = dev.alloc(DType::F32, &[rows, dim]).unwrap();
        let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
        if weighted {
            s.rms_norm(&x, &w, &tmp, EPS).unwrap();
        } else {
            s.rms_norm_no_scale(&x, &tmp, EPS).unwrap();
        }
        if norm_out_as_b {
            // `m` as `a` must have the full shape: broadcast only applies to `b`.
            let m_full = dev
                .upload(&random_f32(rows * dim, 1.5, 10), &[rows, dim])
                .unwrap();
            s.mul(&m_full, &tmp, &out).unwrap();
        } else {
            s.mul(&tmp, &m, &out).unwrap();
        }
        if tail_reads_intermediate {
            s.add(&tmp, &x, &other).unwrap();
        } else {
            // Overwrites the whole intermediate, so it is dead after the mul.
            s.copy(&x, &tmp).unwrap();
        }
        let report = s.finish(plan).unwrap();
        (report.fusions, dev.download(&out).unwrap())
    }

    #[test]
    fn norm_then_mul_fuses_and_matches_unfused() {
        let dev = Device::cpu(2).unwrap();
        for weighted in [true, false] {
            for as_b in [false, true] {
                let (f0, unfused) = run_norm_mul(&dev, &Plan::SEQUENTIAL, weighted, as_b, false);
                let (f1, fused) = run_norm_mul(&dev, &Plan::OPTIMIZED, weighted, as_b, false);
                assert_eq!(
                    (f0, f1),
                    (0, 1),
                    "weighted {weighted}, norm output as b {as_b}"
                );
                // Stated tolerance 1e-6 relative (for f32 the kernels give the same bits).
                let what = format!("fused vs unfused, weighted {weighted}, as b {as_b}");
                assert_close(&fused, &unfused, 0.0, 1e-6, &what);
            }
        }
    }

    #[test]
    fn norm_then_mul_is_not_fused_when_the_intermediate_is_read_later() {
        let dev = Device::cpu(2).unwrap();
        let (_, unfused) = run_norm_mul(&dev, &Plan::SEQUENTIAL, true, false, true);
        let (fusions, optimized) = run_norm_mul(&dev, &Plan::OPTIMIZED, true, false, true);
        assert_eq!(fusions, 0);
        assert_close(&optimized, &unfused, 0.0, 0.0, "optimized vs sequential");
    }

    #[test]
    fn in_place_mul_over_the_norm_output_fuses() {
        let dev = Device::cpu(2).unwrap();
        let (rows, dim) = (17, 64);
        let x = dev
            .upload(&random_f32(rows * dim, 2.0, 21), &[rows, dim])
            .unwrap();
        let w = dev.upload(&random_f32(dim, 1.5, 22), &[dim]).unwrap();
        let m = dev.upload(&random_f32(dim, 1.5, 23), &[dim]).unwrap();
        let mut results = Vec::new();
        for plan in [Plan::SEQUENTIAL, Plan::OPTIMIZED] {
            let tmp = dev.alloc(DType::F32, &[rows, dim]).unwrap();
            let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
            s.rms_norm(&x, &w, &tmp, EPS).unwrap();
            s.mul_inplace(&tmp, &m).unwrap();
            let report = s.finish(&plan).unwrap();
            results.push((report.fusions, dev.download(&tmp).unwrap()));
        }
        assert_eq!((results[0].0, results[1].0), (0, 1));
        assert_close(
            &results[1].1,
            &results[0].1,
            0.0,
            1e-6,
            "in-place fused vs unfused",
        );
    }
}

#[cfg(test)]
#[path = "norm_add_tests.rs"]
mod norm_add_tests;
