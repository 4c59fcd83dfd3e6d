#![allow(dead_code)]
//! Helpers shared by the unit tests: seeded random inputs (never zeros) and comparisons.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A seeded generator; print the seed in assertion messages so failures replay.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values uniform in `[-scale, scale]`, none exactly zero.
pub fn random_f32(n: usize, scale: f32, seed: u64) -> Vec<f32> {
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

/// Largest absolute difference; panics with `what` and the index when lengths differ.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts `|a - b| <= atol + rtol * |b|` elementwise, naming the first failing index.
pub fn assert_close(a: &[f32], b: &[f32], atol: f32, rtol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: length mismatch");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let tol = atol + rtol * y.abs();
        assert!(
            (x - y).abs() <= tol || (x.is_nan() && y.is_nan()),
            "{what}: index {i}: got {x}, expected {y} (tolerance {tol})"
        );
    }
}
