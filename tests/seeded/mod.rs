//! Seeded random test inputs and float comparisons: the same seed gives the same values.
//!
//! The one copy of these helpers: the integration tests include it with `mod seeded;`, the unit
//! tests as `crate::testutil` (`src/lib.rs` points a `#[path]` here). Not every test file uses
//! every helper.
#![allow(dead_code)]

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The generator for `seed`; print the seed in assertion messages so failures replay.
pub(crate) fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` uniform values in `[-scale, scale)`, never exactly zero: a drawn zero (either sign)
/// becomes `scale * 0.5`.
pub(crate) fn random_f32(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    (0..n)
        .map(|_| {
            let v: f32 = r.random_range(-scale..scale);
            if v == 0.0 {
                scale * 0.5
            } else {
                v
            }
        })
        .collect()
}

/// The largest absolute difference of two slices of the same length.
pub(crate) fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts `|a - b| <= atol + rtol * |b|` elementwise (NaN matches NaN), naming `what` and the
/// first failing index.
pub(crate) fn assert_close(a: &[f32], b: &[f32], atol: f32, rtol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: length mismatch");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let tol = atol + rtol * y.abs();
        assert!(
            (x - y).abs() <= tol || (x.is_nan() && y.is_nan()),
            "{what}: index {i}: got {x}, expected {y} (tolerance {tol})"
        );
    }
}
