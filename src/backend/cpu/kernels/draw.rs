//! CPU kernel of the `draw` op family: a sampled token drawn from one row of logits by the host's
//! own sampler ([`Sampler::draw`]), so the CPU backend's device draw is the host draw by
//! definition, and the CUDA kernel is tested against it.
//!
//! Argument layouts: `draw_advance_f32`: x (one row of n values), ring (i32 `[R]`), inputs (i32
//! `[1 + 2B]`), state (u32 `[9]`, `DrawState`), window (i32 `[DRAW_WINDOW]`), scratch (u32
//! `[draw_scratch_len(n)]`, unused here), n: u32. `draw_rows_f32`: x (`[rows, n]`), state (u32 `[rows, 9]`),
//! window (i32 `[rows, DRAW_WINDOW]`), scratch (u32 `[rows, draw_scratch_len(n)]`, unused), out (i32 `[rows]`),
//! n: u32.

use super::argmax::{keep_token, step_of};
use super::check::{expect_len, kernel_err};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc::{DRAW_ADVANCE, DRAW_ROWS};
use crate::sampler::device::{draw_scratch_len, DrawState, DRAW_STATE_WORDS, DRAW_WINDOW};
use crate::sampler::Sampler;

fn draw_advance_f32(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let ring = args.output::<i32>(1)?;
    let inputs = args.output::<i32>(2)?;
    let words = args.output::<u32>(3)?;
    let window = args.output::<i32>(4)?;
    let scratch = args.output::<u32>(5)?;
    let n = args.usize(6)?;
    if n == 0 {
        return Err(kernel_err(args, "n = 0: the row is empty".to_string()));
    }
    expect_len(args, "x", x.len(), &[("n", n)])?;
    expect_len(
        args,
        "scratch",
        scratch.len(),
        &[("9n rounded up to even", draw_scratch_len(n))],
    )?;
    expect_len(args, "window", window.len(), &[("window", DRAW_WINDOW)])?;
    let s = step_of(args, ring, inputs)?;
    let id = draw_row(args, x, words, window)?;
    keep_token(ring, inputs, s, id);
    Ok(())
}

fn draw_rows_f32(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let words = args.output::<u32>(1)?;
    let window = args.output::<i32>(2)?;
    let scratch = args.output::<u32>(3)?;
    let out = args.output::<i32>(4)?;
    let n = args.usize(5)?;
    if n == 0 {
        return Err(kernel_err(args, "n = 0: the rows are empty".to_string()));
    }
    let rows = out.len();
    if rows == 0 {
        return Err(kernel_err(args, "out is empty: no rows".to_string()));
    }
    expect_len(args, "x", x.len(), &[("rows * n", rows * n)])?;
    expect_len(
        args,
        "state",
        words.len(),
        &[("rows * 9", rows * DRAW_STATE_WORDS)],
    )?;
    expect_len(
        args,
        "window",
        window.len(),
        &[("rows * 1024", rows * DRAW_WINDOW)],
    )?;
    expect_len(
        args,
        "scratch",
        scratch.len(),
        &[("rows * (9n rounded up to even)", rows * draw_scratch_len(n))],
    )?;
    let rows_of = x
        .chunks_exact(n)
        .zip(words.chunks_exact_mut(DRAW_STATE_WORDS))
        .zip(window.chunks_exact_mut(DRAW_WINDOW));
    for (((x, words), window), id) in rows_of.zip(out.iter_mut()) {
        *id = draw_row(args, x, words, window)?;
    }
    Ok(())
}

/// Draws a token from one row `x` with the settings and generator of `words` (a [`DrawState`])
/// and the penalty's tokens in `window`, then keeps it there: the generator advanced, the token
/// appended to the window. -1 where no value is finite (the generator unchanged).
fn draw_row(
    args: &KernelArgs<'_>,
    x: &[f32],
    words: &mut [u32],
    window: &mut [i32],
) -> Result<i32> {
    let len = words.len();
    let words: &mut [u32; DRAW_STATE_WORDS] = words.try_into().map_err(|_| {
        kernel_err(
            args,
            format!("state has {len} words, not {DRAW_STATE_WORDS}"),
        )
    })?;
    let mut state = DrawState::from_words(words);
    let w = state.window as usize;
    if w > DRAW_WINDOW {
        return Err(kernel_err(
            args,
            format!("the penalty window of {w} tokens is longer than the {DRAW_WINDOW} it holds"),
        ));
    }
    let bad = |e| kernel_err(args, format!("the draw: {e}"));
    let mut sampler = Sampler::with_state(state.config(), state.rng).map_err(bad)?;
    // The window's tokens in any order: the penalty looks at each distinct one once.
    let seen = (state.history as usize).min(w);
    let history: Vec<u32> = window[..seen].iter().map(|&t| t as u32).collect();
    let id = match sampler.draw(x, &history).map_err(bad)? {
        Some(id) => id as i32,
        None => -1,
    };
    state.rng = sampler.state();
    if id >= 0 && w > 0 {
        window[state.history as usize % w] = id;
        state.history = state.history.wrapping_add(1);
    }
    *words = state.words();
    Ok(id)
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.add(&DRAW_ADVANCE, draw_advance_f32);
    registry.add(&DRAW_ROWS, draw_rows_f32);
}
