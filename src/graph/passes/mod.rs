//! Optimization passes over a [`ComputeGraph`](super::ComputeGraph): fusion, reordering for
//! concurrency, barrier placement from ranges, and the split point of a split submission.

mod barriers;
mod fuse;
mod reorder;

pub use barriers::{place_barriers, split_index};
pub use fuse::{fuse, FusionRule};
pub use reorder::{reorder, DEFAULT_LOOKAHEAD};

#[cfg(test)]
mod tests;
