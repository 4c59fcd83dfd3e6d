//! What a server's scheduler needs from a model that holds several sequences at once: a KV cache
//! of fixed slots, a prompt chunk run into one slot, and one decode step for a batch of slots.
//!
//! The contract that makes a server's results batch-invariant: the logits a row gets from
//! [`SlotModel::decode`] depend only on its own slot's history, never on which other rows share
//! the step or on how many there are; and [`SlotModel::prefill`] gives, chunk by chunk, the same
//! values as one `Engine::prefill` of the whole prompt.

use crate::error::Result;

/// One row of a batched decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRow {
    /// The KV-cache slot the row's sequence lives in.
    pub slot: usize,
    /// The token fed at this step (the last one sampled for the sequence).
    pub token: u32,
    /// Its position in the sequence (the number of tokens the slot already holds).
    pub pos: usize,
    /// Whether the row only needs the most likely next token (computed on the device), or its
    /// whole logits row for sampling on the host.
    pub greedy: bool,
}

/// What one row of a decode step gives back.
#[derive(Debug, Clone, PartialEq)]
pub enum RowOutput {
    /// The most likely next token (rows with `greedy`).
    Token(u32),
    /// The row's logits, `vocab` values (rows without `greedy`).
    Logits(Vec<f32>),
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
