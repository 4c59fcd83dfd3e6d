//! What a server's scheduler needs from a model that holds several sequences at once: a KV cache
//! of fixed slots, a prompt chunk run into one slot, and one decode step for a batch of slots.
//!
//! The contract that makes a server's results batch-invariant: the logits a row gets from
//! [`SlotModel::decode`] depend only on its own slot's history, never on which other rows share
//! the step or on how many there are; and [`SlotModel::prefill`] gives, chunk by chunk, the same
//! values as one `Engine::prefill` of the whole prompt.

use crate::error::Result;
use crate::sampler::device::DrawState;

/// One row of a batched decode step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    /// The KV-cache slot the row's sequence lives in.
    pub slot: usize,
    /// The token fed at this step (the last one sampled for the sequence).
    pub token: u32,
    /// Its position in the sequence (the number of tokens the slot already holds).
    pub pos: usize,
    /// How the row's next token is chosen.
    pub pick: Pick,
}

/// How a decode row's next token is chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Pick {
    /// The most likely token, found on the device ([`RowOutput::Token`]).
    Greedy,
    /// By a sampler on the host, from the whole logits row ([`RowOutput::Logits`]).
    Logits,
    /// Drawn on the device as the sequence's sampler would draw it ([`RowOutput::Drawn`]; a model
    /// that cannot may give [`RowOutput::Logits`] instead).
    Draw(RowDraw),
}

/// What a device draw needs of a sequence's sampler.
#[derive(Debug, Clone, PartialEq)]
pub struct RowDraw {
    /// The settings, the generator's state and the history's length.
    pub state: DrawState,
    /// The repetition penalty's window of the history ([`DrawState::window_of`]); empty when the
    /// penalty is off.
    pub window: Vec<i32>,
}

impl RowDraw {
    /// The draw of a sampler with `state` after the tokens of `history`.
    pub fn new(state: DrawState, history: &[u32]) -> Self {
        let window = if state.penalty == 1.0 {
            Vec::new()
        } else {
            state.window_of(history)
        };
        RowDraw { state, window }
    }
}

/// What one row of a decode step gives back.
#[derive(Debug, Clone, PartialEq)]
pub enum RowOutput {
    /// The most likely next token ([`Pick::Greedy`]).
    Token(u32),
    /// The row's logits, `vocab` values ([`Pick::Logits`], or a [`Pick::Draw`] the model did not
    /// draw: a vocabulary too large for the device's draw, or no finite logit).
    Logits(Vec<f32>),
    /// The token drawn on the device ([`Pick::Draw`]) and the generator's state after the draw.
    Drawn {
        /// The token.
        token: u32,
        /// The sampler's generator after it.
        rng: u64,
    },
}

/// A model with a KV cache of [`SlotModel::slots`] independent sequences.
pub trait SlotModel: Send {
    /// Sequences the cache holds at once.
    fn slots(&self) -> usize;
    /// Positions each slot holds (the context of one sequence).
    fn slot_ctx(&self) -> usize;
    /// Vocabulary size (the length of a logits row).
    fn vocab(&self) -> usize;
    /// Most tokens one [`SlotModel::prefill`] call takes.
    fn max_chunk(&self) -> usize;
    /// Most rows one [`SlotModel::decode`] call takes.
    fn max_rows(&self) -> usize;
    /// Runs `tokens` (1 to [`SlotModel::max_chunk`]) through `slot` at positions `pos0..`,
    /// after the `pos0` tokens the slot already holds, and returns the logits of the last one.
    fn prefill(&mut self, slot: usize, tokens: &[u32], pos0: usize) -> Result<Vec<f32>>;
    /// One decode step for every row (1 to [`SlotModel::max_rows`]), giving back one output per
    /// row in the same order. Rows of one slot take distinct positions: a prompt's tokens in
    /// position order, each row attending over the slot up to its own position (the rows before
    /// it in this step included), as if fed one step at a time.
    fn decode(&mut self, rows: &[StepRow]) -> Result<Vec<RowOutput>>;
}
