//! CPU kernel of the `draw` op family: a sampled token drawn from one row of logits by the host's
//! own sampler ([`Sampler::draw`]), so the CPU backend's device draw is the host draw by
//! definition, and the CUDA kernel is tested against it.
//!
//! Argument layout: `draw_advance_f32`: x (one row of n values), ring (i32 `[R]`), inputs (i32
//! `[1 + 2B]`), state (u32 `[9]`, `DrawState`), window (i32 `[DRAW_WINDOW]`), scratch (u32
//! `[9n]`, unused here), n: u32.

use super::argmax::{keep_token, step_of};
use super::check::{expect_len, kernel_err};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc::DRAW_ADVANCE;
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
        &[("9n", draw_scratch_len(n))],
    )?;
    expect_len(args, "window", window.len(), &[("window", DRAW_WINDOW)])?;
    let len = words.len();
    let words: &mut [u32; DRAW_STATE_WORDS] = words.try_into().map_err(|_| {
        kernel_err(
            args,
            format!("state has {len} words, not {DRAW_STATE_WORDS}"),
        )
    })?;
    let s = step_of(args, ring, inputs)?;
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
    keep_token(ring, inputs, s, id);
    Ok(())
}

/// Registers this family's kernel against its declaration.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.add(&DRAW_ADVANCE, draw_advance_f32);
}
