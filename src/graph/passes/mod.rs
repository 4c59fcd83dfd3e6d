//! Optimization passes over a [`ComputeGraph`](super::ComputeGraph): fusion, reordering for
//! concurrency, barrier placement from ranges, and the split point of a split submission.
//! [`optimize`] runs the three passes in one go.

mod barriers;
mod fuse;
mod narrow;
mod optimize;
mod reorder;

pub use barriers::{place_barriers, program_order_barriers, split_index};
pub use fuse::{
    fuse, At, Found, FusionRule, Fusions, Matcher, Pattern, MAX_PATTERN_NODES, PATTERN_WINDOW,
};
pub use narrow::{narrow, NarrowRule};
pub use optimize::{optimize, Optimized};
pub use reorder::{reorder, DEFAULT_LOOKAHEAD};

#[cfg(test)]
mod tests;
