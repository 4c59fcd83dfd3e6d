//! CPU kernels of the `norm` op family: RMS normalization, with or without a weight, fused with
//! a following multiply, or added into an accumulator.
//!
//! Every row is normalized independently: `y = x / sqrt(mean(x^2) + eps) [* weight] [* m]`. The
//! sum of squares is accumulated in f64; the products are f32, in the same order as the unfused
//! kernels (`(x * inv) * weight`, then `* m`), so for f32 the fused kernel gives the same bits as
//! `rms_norm` followed by `mul`. `rms_norm_add` runs the same row code, rounds `y` to the dtype as
//! `rms_norm` stores it, and adds it as the in-place `add` does (`acc + y` in f32, rounded to the
//! dtype): the bits of `rms_norm` followed by `add` for every float dtype.
//!
//! Argument layouts (the ops in `ops::norm` build them):
//! - `rms_norm_<t>`: x, weight, out, eps: f32, dim: u32
//! - `rms_norm_no_scale_<t>`: x, out, eps, dim
//! - `rms_norm_mul_<t>`: x, weight, m, out, eps, dim
//! - `rms_norm_no_scale_mul_<t>`: x, m, out, eps, dim
//! - `rms_norm_add_<t>`: x, weight, acc (read-write), eps, dim
//!
//! `m` holds either one row (`dim` values, broadcast over rows) or one value per element of `x`.

use half::{bf16, f16};
use rayon::prelude::*;

use super::copy::Float;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::{Error, Result};
use crate::kernels::norm as kn;

/// Rows per parallel task: enough rows that a task holds at least this many elements.
const MIN_TASK_ELEMS: usize = 1 << 13;

/// Sum of squares of a row, accumulated in f64 over four lanes.
#[inline]
pub(crate) fn sum_squares<T: Float>(row: &[T]) -> f64 {
    let mut acc = [0f64; 4];
    let mut chunks = row.chunks_exact(4);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            let f = v.to_f32() as f64;
            *a += f * f;
        }
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|v| (v.to_f32() as f64).powi(2))
        .sum();
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}

/// The reciprocal RMS of a row: `1 / sqrt(mean(x^2) + eps)`.
#[inline]
pub(super) fn inv_rms<T: Float>(row: &[T], eps: f32) -> f32 {
    let mean = sum_squares(row) / row.len() as f64;
    (1.0 / (mean + eps as f64).sqrt()) as f32
}

/// The operands of one normalization, already taken from the kernel arguments.
struct NormOperands<'a, T> {
    x: &'a [T],
    weight: Option<&'a [T]>,
    m: Option<&'a [T]>,
    /// The output; with `ACC`, the accumulator the values are added into.
    out: &'a mut [T],
    dim: usize,
    eps: f32,
}

/// Stores one normalized value `y` into `o`: rounded to `T` (as `rms_norm` stores it) and, with
/// `ACC`, added to what `o` holds as the in-place `add` does (f32 sum, rounded to `T`).
#[inline(always)]
pub(super) fn put<T: Float, const ACC: bool>(o: &mut T, y: f32) {
    let y = T::from_f32(y);
    *o = if ACC {
        T::from_f32(o.to_f32() + y.to_f32())
    } else {
        y
    };
}

/// Normalizes the rows of `op.x` into `op.out` (`ACC`: adds them into it).
fn run_norm<T: Float, const ACC: bool>(
    args: &KernelArgs<'_>,
    op: NormOperands<'_, T>,
) -> Result<()> {
    let NormOperands {
        x,
        weight,
        m,
        out,
        dim,
        eps,
    } = op;
    let bad = |msg: String| Error::Kernel {
        kernel: args.kernel().name(),
        msg,
    };
    if dim == 0 || x.len() % dim != 0 || out.len() != x.len() {
        let out_name = if ACC { "acc" } else { "out" };
        return Err(bad(format!(
            "x has {} values, {out_name} {}: not whole rows of dim = {dim}",
            x.len(),
            out.len()
        )));
    }
    if weight.is_some_and(|w| w.len() != dim) {
        return Err(bad(format!("weight must have dim = {dim} values")));
    }
    let m_full = match m {
        Some(m) if m.len() == x.len() => true,
        Some(m) if m.len() == dim => false,
        Some(m) => {
            return Err(bad(format!(
                "m has {} values, expected {dim} or {}",
                m.len(),
                x.len()
            )))
        }
        None => false,
    };
    let min_rows = (MIN_TASK_ELEMS / dim).max(1);
    out.par_chunks_mut(dim)
        .with_min_len(min_rows)
        .enumerate()
        .for_each(|(r, o)| {
            let xr = &x[r * dim..(r + 1) * dim];
            let inv = inv_rms(xr, eps);
            let mr = m.map(|m| {
                if m_full {
                    &m[r * dim..(r + 1) * dim]
                } else {
                    m
                }
            });
            match (weight, mr) {
                (Some(w), Some(mr)) => {
                    for (((o, &xv), &wv), &mv) in o.iter_mut().zip(xr).zip(w).zip(mr) {
                        put::<T, ACC>(o, xv.to_f32() * inv * wv.to_f32() * mv.to_f32());
                    }
                }
                (Some(w), None) => {
                    for ((o, &xv), &wv) in o.iter_mut().zip(xr).zip(w) {
                        put::<T, ACC>(o, xv.to_f32() * inv * wv.to_f32());
                    }
                }
                (None, Some(mr)) => {
                    for ((o, &xv), &mv) in o.iter_mut().zip(xr).zip(mr) {
                        put::<T, ACC>(o, xv.to_f32() * inv * mv.to_f32());
                    }
                }
                (None, None) => {
                    for (o, &xv) in o.iter_mut().zip(xr) {
                        put::<T, ACC>(o, xv.to_f32() * inv);
                    }
                }
            }
        });
    Ok(())
}

fn rms_norm<T: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let op = NormOperands {
        x: args.input::<T>(0)?,
        weight: Some(args.input::<T>(1)?),
        m: None,
        out: args.output::<T>(2)?,
        eps: args.f32(3)?,
        dim: args.usize(4)?,
    };
    run_norm::<T, false>(args, op)
}

/// `rms_norm_f32_to_f16`: the f32 norm's values, then each rounded to f16.
fn rms_norm_to_f16(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let out = args.output::<f16>(2)?;
    let mut values = vec![0f32; out.len()];
    let op = NormOperands {
        x,
        weight: Some(args.input::<f32>(1)?),
        m: None,
        out: &mut values,
        eps: args.f32(3)?,
        dim: args.usize(4)?,
    };
    run_norm::<f32, false>(args, op)?;
    for (o, v) in out.iter_mut().zip(&values) {
        *o = f16::from_f32(*v);
    }
    Ok(())
}

fn rms_norm_no_scale<T: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let op = NormOperands {
        x: args.input::<T>(0)?,
        weight: None,
        m: None,
        out: args.output::<T>(1)?,
        eps: args.f32(2)?,
        dim: args.usize(3)?,
    };
    run_norm::<T, false>(args, op)
}

fn rms_norm_mul<T: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let op = NormOperands {
        x: args.input::<T>(0)?,
        weight: Some(args.input::<T>(1)?),
        m: Some(args.input::<T>(2)?),
        out: args.output::<T>(3)?,
        eps: args.f32(4)?,
        dim: args.usize(5)?,
    };
    run_norm::<T, false>(args, op)
}

fn rms_norm_no_scale_mul<T: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let op = NormOperands {
        x: args.input::<T>(0)?,
        weight: None,
        m: Some(args.input::<T>(1)?),
        out: args.output::<T>(2)?,
        eps: args.f32(3)?,
        dim: args.usize(4)?,
    };
    run_norm::<T, false>(args, op)
}

fn rms_norm_add<T: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let op = NormOperands {
        x: args.input::<T>(0)?,
        weight: Some(args.input::<T>(1)?),
        m: None,
        out: args.output::<T>(2)?,
        eps: args.f32(3)?,
        dim: args.usize(4)?,
    };
    run_norm::<T, true>(args, op)
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(
        &kn::RMS_NORM,
        [rms_norm::<f32>, rms_norm::<f16>, rms_norm::<bf16>],
    );
    registry.family(
        &kn::RMS_NORM_NO_SCALE,
        [
            rms_norm_no_scale::<f32>,
            rms_norm_no_scale::<f16>,
            rms_norm_no_scale::<bf16>,
        ],
    );
    registry.family(
        &kn::RMS_NORM_MUL,
        [
            rms_norm_mul::<f32>,
            rms_norm_mul::<f16>,
            rms_norm_mul::<bf16>,
        ],
    );
    registry.family(
        &kn::RMS_NORM_NO_SCALE_MUL,
        [
            rms_norm_no_scale_mul::<f32>,
            rms_norm_no_scale_mul::<f16>,
            rms_norm_no_scale_mul::<bf16>,
        ],
    );
    registry.family(
        &kn::RMS_NORM_ADD,
        [
            rms_norm_add::<f32>,
            rms_norm_add::<f16>,
            rms_norm_add::<bf16>,
        ],
    );
    registry.add(&kn::RMS_NORM_TO_F16, rms_norm_to_f16);
}
