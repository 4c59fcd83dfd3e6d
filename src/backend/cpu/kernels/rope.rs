//! CPU kernels of the `rope` op family: rotary position embedding, normal (adjacent pairs) and
//! NeoX (halves) layouts, partial rotary dimension, optional frequency factors.
//!
//! Row `r` of `x` holds `n_heads` heads of `head_dim` values and is rotated by the position
//! `positions[r]`. Pair `i < rotary_dim / 2` of each head turns by
//! `theta_i = pos * base^(-2i / rotary_dim) / freq_factor_i`; the angle and its sine and cosine are
//! computed in f64 once per row (shared by every head), the rotation in f32. Values past
//! `rotary_dim` are copied unchanged.
//!
//! Argument layouts (the op in `ops::rope` builds them), buffers first, then scalars:
//! - `rope_<t>`: x, positions (i32), out, then head_dim: u32, rotary_dim: u32, base: f32, mode: u32
//! - `rope_ff_<t>`: x, positions, freq_factors (f32), out, then the same scalars
//! - `..._inplace`: the same without `out`, `x` read-write.
//! - `rms_norm_rope_f32`: x, weight, positions, out, then eps: f32, head_dim, rotary_dim, base,
//!   mode: every head normalized as `rms_norm` does (its rows are the heads), then rotated.
//!
//! `mode` 0 rotates `(x[2i], x[2i + 1])`, mode 1 rotates `(x[i], x[i + rotary_dim / 2])`.

use half::{bf16, f16};
use rayon::prelude::*;

use super::check::kernel_err;
use super::copy::Float;
use super::norm::{inv_rms, put};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::{misc as km, norm as kn};

/// The most rotated pairs per head the kernel supports (its per-row table lives on the stack);
/// half of `ops::rope::MAX_ROTARY_DIM`.
pub(super) const MAX_ROPE_PAIRS: usize = 512;

/// Rows per parallel task, at least.
const MIN_TASK_ELEMS: usize = 1 << 13;

fn rope<T: Float, const FREQ_FACTORS: bool, const INPLACE: bool>(
    args: &KernelArgs<'_>,
) -> Result<()> {
    let bad = |msg: String| kernel_err(args, msg);
    let x = if INPLACE {
        None
    } else {
        Some(args.input::<T>(0)?)
    };
    let positions = args.input::<i32>(1)?;
    let freq = if FREQ_FACTORS {
        Some(args.input::<f32>(2)?)
    } else {
        None
    };
    let out_index = if INPLACE {
        0
    } else {
        2 + FREQ_FACTORS as usize
    };
    let out = args.output::<T>(out_index)?;
    let s = if INPLACE {
        2 + FREQ_FACTORS as usize
    } else {
        out_index + 1
    };
    let (head_dim, rotary_dim, base, mode) = (
        args.usize(s)?,
        args.usize(s + 1)?,
        args.f32(s + 2)?,
        args.u32(s + 3)?,
    );
    let rows = positions.len();
    if let Some(x) = x.filter(|x| x.len() != out.len()) {
        return Err(bad(format!("x has {} values, out {}", x.len(), out.len())));
    }
    // Whole rows of at least one value: `row_len > 0` is the chunk size and a divisor below.
    if rows == 0 || out.is_empty() || out.len() % rows != 0 {
        return Err(bad(format!(
            "x has {} values, not {rows} whole rows (one per entry of positions)",
            out.len()
        )));
    }
    let row_len = out.len() / rows;
    if head_dim == 0 || row_len % head_dim != 0 {
        return Err(bad(format!(
            "head_dim = {head_dim} does not divide the rows of {row_len} values"
        )));
    }
    check_rotation(args, head_dim, rotary_dim, freq, mode)?;
    let neox = mode == 1;
    let min_rows = (MIN_TASK_ELEMS / row_len).max(1);
    out.par_chunks_mut(row_len)
        .with_min_len(min_rows)
        .enumerate()
        .for_each(|(r, o)| {
            let mut table = [(0f32, 0f32); MAX_ROPE_PAIRS];
            let cos_sin = angle_table(positions[r], base, rotary_dim, freq, &mut table);
            let xr = x.map(|x| &x[r * row_len..(r + 1) * row_len]);
            for (h, oh) in o.chunks_exact_mut(head_dim).enumerate() {
                if let Some(xr) = xr {
                    oh.copy_from_slice(&xr[h * head_dim..(h + 1) * head_dim]);
                }
                rotate_head(oh, cos_sin, neox);
            }
        });
    Ok(())
}

/// An error unless `rotary_dim` is even, at most `head_dim` and `2 * MAX_ROPE_PAIRS`, the
/// frequency factors (if any) number `rotary_dim / 2`, and `mode` is 0 or 1.
pub(super) fn check_rotation(
    args: &KernelArgs<'_>,
    head_dim: usize,
    rotary_dim: usize,
    freq: Option<&[f32]>,
    mode: u32,
) -> Result<()> {
    let pairs = rotary_dim / 2;
    let msg = if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim || pairs > MAX_ROPE_PAIRS {
        format!(
            "rotary_dim = {rotary_dim} must be even and at most head_dim = {head_dim} and {}",
            2 * MAX_ROPE_PAIRS
        )
    } else if let Some(f) = freq.filter(|f| f.len() != pairs) {
        format!(
            "freq_factors has {} values, expected rotary_dim / 2 = {pairs}",
            f.len()
        )
    } else if mode > 1 {
        format!("mode = {mode} is neither 0 (adjacent pairs) nor 1 (NeoX halves)")
    } else {
        return Ok(());
    };
    Err(kernel_err(args, msg))
}

/// Fills `table` with the `(cos, sin)` of the `rotary_dim / 2` angles of position `pos` (f64,
/// rounded to f32) and returns the filled part.
#[inline]
pub(super) fn angle_table<'t>(
    pos: i32,
    base: f32,
    rotary_dim: usize,
    freq: Option<&[f32]>,
    table: &'t mut [(f32, f32); MAX_ROPE_PAIRS],
) -> &'t [(f32, f32)] {
    let pairs = rotary_dim / 2;
    let pos = pos as f64;
    for (i, cs) in table[..pairs].iter_mut().enumerate() {
        let inv_freq = (base as f64).powf(-2.0 * i as f64 / rotary_dim as f64);
        let ff = freq.map_or(1.0, |f| f[i] as f64);
        let (s, c) = (pos * inv_freq / ff).sin_cos();
        *cs = (c as f32, s as f32);
    }
    &table[..pairs]
}

/// Rotates the pairs of one head in place by the angles of `cos_sin` (in f32).
#[inline]
pub(super) fn rotate_head<T: Float>(oh: &mut [T], cos_sin: &[(f32, f32)], neox: bool) {
    let pairs = cos_sin.len();
    for (i, &(c, s)) in cos_sin.iter().enumerate() {
        let (j0, j1) = if neox {
            (i, i + pairs)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (a, b) = (oh[j0].to_f32(), oh[j1].to_f32());
        oh[j0] = T::from_f32(a * c - b * s);
        oh[j1] = T::from_f32(a * s + b * c);
    }
}

/// `rms_norm_rope_f32`: x, weight, positions, out, eps, head_dim, rotary_dim, base, mode. Each
/// head is normalized by the norm kernel's own row code (`inv_rms`, then `x * inv * w` stored as
/// `rms_norm` stores it) and rotated by the rope kernel's (`angle_table`, `rotate_head`), so the
/// result is the bits of `rms_norm` followed by the in-place `rope`.
fn rms_norm_rope(args: &KernelArgs<'_>) -> Result<()> {
    let bad = |msg: String| kernel_err(args, msg);
    let (x, weight, positions) = (
        args.input::<f32>(0)?,
        args.input::<f32>(1)?,
        args.input::<i32>(2)?,
    );
    let out = args.output::<f32>(3)?;
    let (eps, head_dim, rotary_dim, base, mode) = (
        args.f32(4)?,
        args.usize(5)?,
        args.usize(6)?,
        args.f32(7)?,
        args.u32(8)?,
    );
    let rows = positions.len();
    if x.len() != out.len() {
        return Err(bad(format!("x has {} values, out {}", x.len(), out.len())));
    }
    if rows == 0 || out.is_empty() || out.len() % rows != 0 {
        return Err(bad(format!(
            "x has {} values, not {rows} whole rows (one per entry of positions)",
            out.len()
        )));
    }
    let row_len = out.len() / rows;
    if head_dim == 0 || row_len % head_dim != 0 {
        return Err(bad(format!(
            "head_dim = {head_dim} does not divide the rows of {row_len} values"
        )));
    }
    if weight.len() != head_dim {
        return Err(bad(format!(
            "weight has {} values, expected head_dim = {head_dim}",
            weight.len()
        )));
    }
    if rotary_dim % 2 != 0 || rotary_dim > head_dim || rotary_dim / 2 > MAX_ROPE_PAIRS {
        return Err(bad(format!(
            "rotary_dim = {rotary_dim} must be even and at most head_dim = {head_dim} and {}",
            2 * MAX_ROPE_PAIRS
        )));
    }
    if mode > 1 {
        return Err(bad(format!(
            "mode = {mode} is neither 0 (adjacent pairs) nor 1 (NeoX halves)"
        )));
    }
    let neox = mode == 1;
    let min_rows = (MIN_TASK_ELEMS / row_len).max(1);
    out.par_chunks_mut(row_len)
        .with_min_len(min_rows)
        .enumerate()
        .for_each(|(r, o)| {
            let mut table = [(0f32, 0f32); MAX_ROPE_PAIRS];
            let cos_sin = angle_table(positions[r], base, rotary_dim, None, &mut table);
            let xr = &x[r * row_len..(r + 1) * row_len];
            for (oh, xh) in o.chunks_exact_mut(head_dim).zip(xr.chunks_exact(head_dim)) {
                let inv = inv_rms(xh, eps);
                for ((o, &xv), &wv) in oh.iter_mut().zip(xh).zip(weight) {
                    put::<f32, false>(o, xv * inv * wv);
                }
                rotate_head(oh, cos_sin, neox);
            }
        });
    Ok(())
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(
        &km::ROPE,
        [
            rope::<f32, false, false>,
            rope::<f16, false, false>,
            rope::<bf16, false, false>,
        ],
    );
    registry.family(
        &km::ROPE_FF,
        [
            rope::<f32, true, false>,
            rope::<f16, true, false>,
            rope::<bf16, true, false>,
        ],
    );
    registry.family(
        &km::ROPE_INPLACE,
        [
            rope::<f32, false, true>,
            rope::<f16, false, true>,
            rope::<bf16, false, true>,
        ],
    );
    registry.family(&kn::RMS_NORM_ROPE, [rms_norm_rope]);
    registry.family(
        &km::ROPE_FF_INPLACE,
        [
            rope::<f32, true, true>,
            rope::<f16, true, true>,
            rope::<bf16, true, true>,
        ],
    );
}
