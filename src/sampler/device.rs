//! What a draw on the device reads and advances (`ops::draw`, the `draw_advance` kernels): the
//! generator and the settings as the words of a small buffer, the repetition penalty's window,
//! and the sizes its buffers take. Here, below the backends, so that the CPU backend's kernel
//! (this module's sampler) and the op agree on one layout.

use crate::error::{Error, Result};
use crate::sampler::SamplerConfig;

/// Words of a [`DrawState`] buffer.
pub const DRAW_STATE_WORDS: usize = 9;

/// The most recent tokens a device draw's repetition penalty can look at (its window buffer's
/// length); a longer `penalty_window` is drawn on the host.
pub const DRAW_WINDOW: usize = 1024;

/// The longest row a draw takes (2^19 logits: the CUDA kernel sums halves of quanta in 32 bits).
pub const DRAW_MAX_ROW: usize = 1 << 19;

/// What a device draw reads and advances, as the u32 words of its state buffer: the generator
/// (`[0..2]`, low word first), `top_k`, the penalty window's length, how many tokens of history
/// the window has seen, then the bits of temperature, `top_p`, `min_p` and the penalty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawState {
    /// The generator's state ([`crate::sampler::Sampler`]'s splitmix64).
    pub rng: u64,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: u32,
    /// How many recent tokens the penalty looks at (at most [`DRAW_WINDOW`]).
    pub window: u32,
    /// Tokens of history so far: token `j` of the history is at `window[j % window]`.
    pub history: u32,
    /// Softmax temperature (0: the highest penalized logit).
    pub temperature: f32,
    /// The nucleus' share of the weight.
    pub top_p: f32,
    /// The least weight, relative to the top token's.
    pub min_p: f32,
    /// The repetition penalty (1: off).
    pub penalty: f32,
}

impl DrawState {
    /// The state of a draw with `config`'s settings whose generator is at `rng`, after
    /// `history` tokens; an error for settings a device draw cannot take (a window longer than
    /// [`DRAW_WINDOW`], a `top_k` or history past u32).
    pub fn new(config: &SamplerConfig, rng: u64, history: usize) -> Result<Self> {
        config.validate()?;
        let too_big = |what: &str| {
            Error::InvalidArgument(format!(
                "a device draw cannot take {what}: draw on the host"
            ))
        };
        if config.penalty_window > DRAW_WINDOW {
            return Err(too_big("a penalty window over 1024 tokens"));
        }
        Ok(DrawState {
            rng,
            top_k: u32::try_from(config.top_k).map_err(|_| too_big("top_k past 2^32"))?,
            window: config.penalty_window as u32,
            history: u32::try_from(history).map_err(|_| too_big("a history past 2^32"))?,
            temperature: config.temperature,
            top_p: config.top_p,
            min_p: config.min_p,
            penalty: config.repetition_penalty,
        })
    }

    /// The state buffer's words.
    pub fn words(&self) -> [u32; DRAW_STATE_WORDS] {
        [
            self.rng as u32,
            (self.rng >> 32) as u32,
            self.top_k,
            self.window,
            self.history,
            self.temperature.to_bits(),
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            self.penalty.to_bits(),
        ]
    }

    /// The state the words of a state buffer hold.
    pub fn from_words(w: &[u32; DRAW_STATE_WORDS]) -> Self {
        DrawState {
            rng: w[0] as u64 | (w[1] as u64) << 32,
            top_k: w[2],
            window: w[3],
            history: w[4],
            temperature: f32::from_bits(w[5]),
            top_p: f32::from_bits(w[6]),
            min_p: f32::from_bits(w[7]),
            penalty: f32::from_bits(w[8]),
        }
    }

    /// The sampler settings it holds (the seed is the generator's state, not a seed).
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k as usize,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.penalty,
            penalty_window: self.window as usize,
            seed: 0,
        }
    }

    /// The window's contents for `history` (its last `window` tokens, each at its index modulo
    /// the window), zeros after them, [`DRAW_WINDOW`] values in all.
    pub fn window_of(&self, history: &[u32]) -> Vec<i32> {
        let mut out = vec![0i32; DRAW_WINDOW];
        let w = self.window as usize;
        if w > 0 {
            let start = history.len().saturating_sub(w);
            for (j, &t) in history.iter().enumerate().skip(start) {
                out[j % w] = t as i32;
            }
        }
        out
    }
}

/// The scratch a draw over a row of `n` logits needs: u32 values, `9n` (three lists of
/// candidates) rounded up to even, so that each row of a batch's scratch starts 8-byte aligned.
pub fn draw_scratch_len(n: usize) -> usize {
    9 * n + (n & 1)
}
