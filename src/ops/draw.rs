//! The `draw` op family: a sampled token drawn on the device (the `Session` method that records
//! it is in `session/ops.rs`).
//!
//! [`draw_advance`] is [`crate::ops::argmax::argmax_advance`] for a sampled step: it draws the
//! next token from one row of logits exactly as [`crate::sampler::Sampler::sample`] does
//! (the same penalty, temperature, top-k, min-p and top-p, the same integer quanta and the same
//! splitmix64 generator, so the same seed gives the same tokens), keeps it in the ring at the
//! step's position and advances the step's inputs, so that a replayed sampled step, like a greedy
//! one, needs nothing from the host. The generator's state and the settings live in a small u32
//! buffer ([`DrawState`]); the penalty's recent tokens in an i32 window that the op appends to.

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid, KernelId};
use crate::kernels::misc::{DRAW_ADVANCE, DRAW_ROWS};
use crate::ops::argmax::check_ring_and_inputs;
use crate::ops::elementwise::{check_disjoint, u32_size};
use crate::ops::Check;
pub use crate::sampler::device::{
    draw_scratch_len, DrawState, DRAW_MAX_ROW, DRAW_STATE_WORDS, DRAW_WINDOW,
};

/// Threads of the draw's one block (the CUDA kernel sorts up to this many candidates at once).
const DRAW_THREADS: u32 = 1024;

/// A sampled token of one row, kept on the device: draws `id` from `x` as
/// [`crate::sampler::Sampler::sample`] does with the settings and generator of `state`
/// ([`DrawState`] words; the generator advances when it draws) and the tokens of `window` as
/// its history, appends `id` to the window, then keeps it as
/// [`crate::ops::argmax::argmax_advance`] does: `ring[s % R] = id`, `inputs` advanced to the next
/// step (the token 0 for -1). `id` is -1 when no logit is finite. `x` f32 `[n]` or `[1, n]`,
/// `ring` i32 `[R]`, `inputs` i32 `[1 + 2B]`, `state` u32 `[9]`, `window` i32
/// `[DRAW_WINDOW]`, `scratch` u32 `[draw_scratch_len(n)]` (9n, even); `n` at most [`DRAW_MAX_ROW`].
pub fn draw_advance(
    x: &Buffer,
    ring: &Buffer,
    inputs: &Buffer,
    state: &Buffer,
    window: &Buffer,
    scratch: &Buffer,
) -> Result<Dispatch> {
    let check = Check::op("draw_advance");
    check.dtype("x", x, &[DType::F32])?;
    check.dtype("ring", ring, &[DType::I32])?;
    check.dtype("inputs", inputs, &[DType::I32])?;
    check.dtype("state", state, &[DType::U32])?;
    check.dtype("window", window, &[DType::I32])?;
    check.dtype("scratch", scratch, &[DType::U32])?;
    let n = x.shape().last();
    check.require(
        "x",
        x.elems() > 0 && x.shape().rows() == 1 && n <= DRAW_MAX_ROW,
        || {
            format!(
                "has shape {:?}; it must be one non-empty row of at most 2^19 values",
                x.dims()
            )
        },
    )?;
    check_ring_and_inputs(&check, ring, inputs)?;
    check.elems("state", state, DRAW_STATE_WORDS)?;
    check.elems("window", window, DRAW_WINDOW)?;
    check.elems("scratch", scratch, draw_scratch_len(n))?;
    let named = [
        ("x", x),
        ("ring", ring),
        ("inputs", inputs),
        ("state", state),
        ("window", window),
        ("scratch", scratch),
    ];
    for (i, &(name, buf)) in named.iter().enumerate().skip(1) {
        check_disjoint(&check, name, buf, &named[..i])?;
    }
    let args = vec![
        Arg::read(x),
        Arg::read_write(ring),
        Arg::read_write(inputs),
        Arg::read_write(state),
        Arg::read_write(window),
        Arg::write(scratch),
        Arg::u32(u32_size(&check, "x", n)?),
    ];
    Dispatch::new(
        KernelId::of(&DRAW_ADVANCE),
        args,
        Grid::new(1, DRAW_THREADS),
    )
}

/// A sampled token for each row of `x`, drawn on the device: row `r` is drawn as [`draw_advance`]
/// draws its one row, with the settings and generator of row `r` of `state` and the penalty's
/// tokens in row `r` of `window`, both advanced as [`draw_advance`] advances its own, and its
/// token (-1 where no logit is finite) lands in `out[r]`. The rows are independent: a batch of
/// sequences, each with its own sampler. `x` f32 `[rows, n]`, `state` u32 `[rows, 9]`, `window`
/// i32 `[rows, DRAW_WINDOW]`, `scratch` u32 `[rows, draw_scratch_len(n)]`, `out` i32 `[rows]`; `n` at most
/// [`DRAW_MAX_ROW`].
pub fn draw_rows(
    x: &Buffer,
    state: &Buffer,
    window: &Buffer,
    scratch: &Buffer,
    out: &Buffer,
) -> Result<Dispatch> {
    let check = Check::op("draw_rows");
    check.dtype("x", x, &[DType::F32])?;
    check.dtype("state", state, &[DType::U32])?;
    check.dtype("window", window, &[DType::I32])?;
    check.dtype("scratch", scratch, &[DType::U32])?;
    check.dtype("out", out, &[DType::I32])?;
    let n = x.shape().last();
    let rows = x.shape().rows();
    check.require("x", x.elems() > 0 && n <= DRAW_MAX_ROW, || {
        format!(
            "has shape {:?}; it must be non-empty rows of at most 2^19 values",
            x.dims()
        )
    })?;
    check.elems("out", out, rows)?;
    check.elems("state", state, rows * DRAW_STATE_WORDS)?;
    check.elems("window", window, rows * DRAW_WINDOW)?;
    check.elems("scratch", scratch, rows * draw_scratch_len(n))?;
    let named = [
        ("x", x),
        ("state", state),
        ("window", window),
        ("scratch", scratch),
        ("out", out),
    ];
    for (i, &(name, buf)) in named.iter().enumerate().skip(1) {
        check_disjoint(&check, name, buf, &named[..i])?;
    }
    let blocks = u32_size(&check, "x", rows)?;
    let args = vec![
        Arg::read(x),
        Arg::read_write(state),
        Arg::read_write(window),
        Arg::write(scratch),
        Arg::write(out),
        Arg::u32(u32_size(&check, "x", n)?),
    ];
    Dispatch::new(
        KernelId::of(&DRAW_ROWS),
        args,
        Grid::new(blocks, DRAW_THREADS),
    )
}

#[cfg(test)]
mod tests;
