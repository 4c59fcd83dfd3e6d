//! CPU kernels of the `argmax` op family: the index of the largest value of each row.
//!
//! Ties go to the first index; NaN values are skipped; a row whose largest value is not finite
//! (or that holds only NaN) gives -1, so a caller reading only the index learns of it.
//!
//! Argument layout: `argmax_f32`: x, out (i32 `[rows]`), n: u32 (the row length).
//! `argmax_advance_f32`: x (one row of n values), ring (i32 `[R]`), inputs (i32 `[1 + 2B]`: the
//! step's position s, B tokens, B positions), n: u32; the row's index goes to `ring[s % R]`, and
//! the inputs become the next greedy step's: `s + 1`, the index as token (0 for -1), `s + 1`.

use rayon::prelude::*;

use super::check::{expect_len, kernel_err};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc::{ARGMAX, ARGMAX_ADVANCE};

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

/// The index of the largest value of `row` (ties to the first, NaN skipped), or -1 when the
/// largest value is not finite or the row holds only NaN.
fn row_argmax(row: &[f32]) -> i32 {
    let best = if row.len() > PARALLEL_ROW {
        row.par_chunks(PARALLEL_ROW / 4)
            .enumerate()
            .map(|(c, chunk)| best_of(chunk, c * (PARALLEL_ROW / 4)))
            .reduce(|| None, better)
    } else {
        best_of(row, 0)
    };
    match best {
        Some((v, i)) if v.is_finite() => i as i32,
        _ => -1,
    }
}

/// The row length `n`, the scalar argument at `index`; an error unless it is in `1..=2^31 - 1`.
fn row_len(args: &KernelArgs<'_>, index: usize) -> Result<usize> {
    let n = args.usize(index)?;
    if n == 0 || n > i32::MAX as usize {
        return Err(kernel_err(
            args,
            format!("n = {n} is not a row length of 1..=2^31 - 1 values"),
        ));
    }
    Ok(n)
}

fn argmax_f32(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let out = args.output::<i32>(1)?;
    let n = row_len(args, 2)?;
    // Every row `r < out.len()` is `x[r * n..(r + 1) * n]`.
    expect_len(args, "x", x.len(), &[("rows of out", out.len()), ("n", n)])?;
    out.par_iter_mut()
        .enumerate()
        .for_each(|(r, o)| *o = row_argmax(&x[r * n..(r + 1) * n]));
    Ok(())
}

fn argmax_advance_f32(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let ring = args.output::<i32>(1)?;
    let inputs = args.output::<i32>(2)?;
    let n = row_len(args, 3)?;
    expect_len(args, "x", x.len(), &[("n", n)])?;
    let s = step_of(args, ring, inputs)?;
    keep_token(ring, inputs, s, row_argmax(x));
    Ok(())
}

/// The step's position `s = inputs[0]` of a kernel that keeps its token in `ring` and advances
/// `inputs` (`[step, tokens[B], positions[B]]`); an error for an empty ring, inputs not of
/// `1 + 2B` values, or an `s` that is not a position with a successor.
pub(super) fn step_of(args: &KernelArgs<'_>, ring: &[i32], inputs: &[i32]) -> Result<i32> {
    if ring.is_empty() {
        return Err(kernel_err(args, "ring is empty".to_string()));
    }
    let len = inputs.len();
    if len < 3 || len.is_multiple_of(2) {
        return Err(kernel_err(
            args,
            format!("inputs has {len} values, not 1 + 2B with B >= 1 (step, tokens, positions)"),
        ));
    }
    let s = inputs[0];
    if !(0..i32::MAX).contains(&s) {
        return Err(kernel_err(
            args,
            format!(
                "the step's position inputs[0] = {s} is outside 0..{} (it and the next must be \
                 positions)",
                i32::MAX
            ),
        ));
    }
    Ok(s)
}

/// Keeps the token `id` of step `s` (checked by [`step_of`]): `ring[s % R] = id`, and `inputs`
/// advanced to the next step (`s + 1`, the token, 0 for -1, and `s + 1`).
pub(super) fn keep_token(ring: &mut [i32], inputs: &mut [i32], s: i32, id: i32) {
    let b = inputs.len() / 2;
    ring[s as usize % ring.len()] = id;
    inputs[0] = s + 1;
    inputs[1] = id.max(0);
    inputs[1 + b] = s + 1;
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.add(&ARGMAX, argmax_f32);
    registry.add(&ARGMAX_ADVANCE, argmax_advance_f32);
}
