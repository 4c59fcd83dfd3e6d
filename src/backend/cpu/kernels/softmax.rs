//! CPU kernels of the `softmax` op family: numerically stable softmax over rows, with a scale and
//! an optional additive mask.
//!
//! Per row: `v_i = x_i * scale + mask_i`, `out_i = exp(v_i - max v) / sum_j exp(v_j - max v)`,
//! the sum accumulated in f64. A row whose values are all `-inf` (fully masked) becomes zeros.
//! The mask has `mask_rows` rows of `n`; row `r` of `x` uses mask row `r % mask_rows`.
//!
//! Argument layouts (the op in `ops::softmax` builds them), buffers first, then scalars:
//! - `softmax_f32`: x, out, scale: f32, n: u32; `softmax_mask_f32`: x, mask, out, scale, n
//! - `..._inplace`: the same without `out`, `x` read-write.

use rayon::prelude::*;

use super::check::kernel_err;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc::SOFTMAX;

/// Rows per parallel task, at least.
const MIN_TASK_ELEMS: usize = 1 << 13;

/// Softmax of `x * scale + mask` into `out` (`x` `None`: `out` holds the input, in place).
#[inline]
fn softmax_row(x: Option<&[f32]>, mask: Option<&[f32]>, out: &mut [f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for (i, o) in out.iter_mut().enumerate() {
        let mut v = x.map_or(*o, |x| x[i]) * scale;
        if let Some(m) = mask {
            v += m[i];
        }
        *o = v;
        max = max.max(v);
    }
    if max == f32::NEG_INFINITY {
        out.fill(0.0);
        return;
    }
    let mut sum = 0f64;
    for o in out.iter_mut() {
        let e = (*o - max).exp();
        *o = e;
        sum += e as f64;
    }
    let inv = (1.0 / sum) as f32;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

fn softmax<const MASK: bool, const INPLACE: bool>(args: &KernelArgs<'_>) -> Result<()> {
    let bad = |msg: String| kernel_err(args, msg);
    let x = if INPLACE {
        None
    } else {
        Some(args.input::<f32>(0)?)
    };
    let mask = if MASK {
        Some(args.input::<f32>(1)?)
    } else {
        None
    };
    let out_index = if INPLACE { 0 } else { 1 + MASK as usize };
    let out = args.output::<f32>(out_index)?;
    let s = if INPLACE {
        1 + MASK as usize
    } else {
        out_index + 1
    };
    let (scale, n) = (args.f32(s)?, args.usize(s + 1)?);
    if n == 0 || out.len() % n != 0 || x.is_some_and(|x| x.len() != out.len()) {
        return Err(bad(format!(
            "x has {} values (out {}), not whole rows of n = {n}",
            x.map_or(out.len(), <[f32]>::len),
            out.len()
        )));
    }
    // `n > 0` from here; a mask has at least one whole row, and its rows tile those of x.
    if let Some(m) =
        mask.filter(|m| m.is_empty() || m.len() % n != 0 || (out.len() / n) % (m.len() / n) != 0)
    {
        return Err(bad(format!(
            "mask has {} values, not whole rows of n = {n} that tile the {} rows of x",
            m.len(),
            out.len() / n
        )));
    }
    let mask_rows = mask.map_or(1, |m| m.len() / n);
    let min_rows = (MIN_TASK_ELEMS / n).max(1);
    out.par_chunks_mut(n)
        .with_min_len(min_rows)
        .enumerate()
        .for_each(|(r, o)| {
            let xr = x.map(|x| &x[r * n..(r + 1) * n]);
            let mr = mask.map(|m| {
                let k = r % mask_rows;
                &m[k * n..(k + 1) * n]
            });
            softmax_row(xr, mr, o, scale);
        });
    Ok(())
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    // Indexed `2 * masked + in_place`.
    registry.family(
        &SOFTMAX,
        [
            softmax::<false, false>,
            softmax::<false, true>,
            softmax::<true, false>,
            softmax::<true, true>,
        ],
    );
}
