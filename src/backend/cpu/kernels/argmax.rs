//! CPU kernels of the `argmax` op family: the index of the largest value of each row.
//!
//! Ties go to the first index; NaN values are skipped; a row whose largest value is not finite
//! (or that holds only NaN) gives -1, so a caller reading only the index learns of it.
//!
//! Argument layout: `argmax_f32`: x, out (i32 `[rows]`), n: u32 (the row length).

use rayon::prelude::*;

use super::check::{expect_len, kernel_err};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc::ARGMAX;

/// Rows longer than this are scanned in parallel chunks.
const PARALLEL_ROW: usize = 1 << 15;

/// The best `(value, index)` of a slice whose first element has index `offset`; `None` when every
/// value is NaN.
#[inline]
fn best_of(values: &[f32], offset: usize) -> Option<(f32, usize)> {
    let mut best: Option<(f32, usize)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        match best {
            Some((b, _)) if v <= b => {}
            _ => best = Some((v, offset + i)),
        }
    }
    best
}

/// Of two candidates, the larger value, or the lower index on a tie.
fn better(a: Option<(f32, usize)>, b: Option<(f32, usize)>) -> Option<(f32, usize)> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y.0 > x.0 || (y.0 == x.0 && y.1 < x.1) {
            y
        } else {
            x
        }),
        (x, None) => x,
        (None, y) => y,
    }
}

fn argmax_f32(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let out = args.output::<i32>(1)?;
    let n = args.usize(2)?;
    if n == 0 || n > i32::MAX as usize {
        return Err(kernel_err(
            args,
            format!("n = {n} is not a row length of 1..=2^31 - 1 values"),
        ));
    }
    // Every row `r < out.len()` is `x[r * n..(r + 1) * n]`.
    expect_len(args, "x", x.len(), &[("rows of out", out.len()), ("n", n)])?;
    out.par_iter_mut().enumerate().for_each(|(r, o)| {
        let row = &x[r * n..(r + 1) * n];
        let best = if n > PARALLEL_ROW {
            row.par_chunks(PARALLEL_ROW / 4)
                .enumerate()
                .map(|(c, chunk)| best_of(chunk, c * (PARALLEL_ROW / 4)))
                .reduce(|| None, better)
        } else {
            best_of(row, 0)
        };
        *o = match best {
            Some((v, i)) if v.is_finite() => i as i32,
            _ => -1,
        };
    });
    Ok(())
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.add(&ARGMAX, argmax_f32);
}
