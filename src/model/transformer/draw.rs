//! The sampled side of [`Transformer`]'s decode step: the buffers of a draw on the device (the
//! generator and settings, the penalty's window, the draw's scratch) and the decode step that ends
//! with it ([`Transformer::record_sampled_step`]).

use super::*;
use crate::ops::draw::{draw_scratch_len, DrawState, DRAW_STATE_WORDS, DRAW_WINDOW};

/// What a sampled decode step's draw reads and advances on the device.
pub(super) struct DrawBuffers {
    /// u32 `[DRAW_STATE_WORDS]`: [`DrawState`]'s words.
    state: Buffer,
    /// i32 `[DRAW_WINDOW]`: the repetition penalty's recent tokens.
    window: Buffer,
    /// u32 `[9 * vocab]`: the draw's candidates.
    scratch: Buffer,
}

impl DrawBuffers {
    pub(super) fn new(device: &Device, vocab: usize) -> Result<Self> {
        Ok(DrawBuffers {
            state: device.alloc(DType::U32, &[DRAW_STATE_WORDS])?,
            window: device.alloc(DType::I32, &[DRAW_WINDOW])?,
            scratch: device.alloc(DType::U32, &[draw_scratch_len(vocab)])?,
        })
    }

    /// Every buffer, named.
    pub(super) fn named(&self) -> Vec<(String, Buffer)> {
        vec![
            ("draw.state".into(), self.state.clone()),
            ("draw.window".into(), self.window.clone()),
            ("draw.scratch".into(), self.scratch.clone()),
        ]
    }
}

impl Transformer {
    /// Records one decode step (inputs from [`Transformer::set_inputs`]) that ends by drawing
    /// the next token on the device from the step's logits, with the settings and generator that
    /// [`Transformer::set_draw`] wrote: the token lands in [`Transformer::step_token`]'s slot,
    /// and the step inputs, the generator and the penalty's window are advanced, so the step's
    /// graph can be launched again without the host writing anything (as a greedy step's is).
    pub fn record_sampled_step(&self, s: &mut Session) -> Result<()> {
        self.record_pass(s, 1, Logits::Last, StepEnd::Draw, 0)
    }

    /// Writes what the next sampled step's draw starts from: `state` (settings, generator, the
    /// history's length) and the penalty's window of `history` (the tokens so far).
    pub fn set_draw(&self, state: &DrawState, history: &[u32]) -> Result<()> {
        let d = &self.draw;
        self.device.write(&d.state, &state.words())?;
        self.device.write(&d.window, &state.window_of(history))
    }

    /// The draw's state as the device has it now (waits for the device).
    pub fn draw_state(&self) -> Result<DrawState> {
        let words = self.device.download::<u32>(&self.draw.state)?;
        let words: [u32; DRAW_STATE_WORDS] = words
            .try_into()
            .map_err(|_| Error::Backend("the draw's state buffer has the wrong length".into()))?;
        Ok(DrawState::from_words(&words))
    }

    /// Records the device draw that ends a sampled step over the logits row `out`.
    pub(super) fn record_draw(&self, s: &mut Session, out: &Buffer) -> Result<()> {
        let d = &self.draw;
        s.draw_advance(
            out,
            &self.next_token,
            &self.inputs.all,
            &d.state,
            &d.window,
            &d.scratch,
        )
    }
}
