//! Seeded random test inputs shared by the test files: the same seed gives the same values.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The generator for `seed`.
pub(crate) fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` uniform values in `[-scale, scale]`, never exactly zero.
pub(crate) fn random_f32(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    (0..n)
        .map(|_| match r.random_range(-scale..scale) {
            0.0 => scale * 0.5,
            v => v,
        })
        .collect()
}
