//! The passes over a vocabulary of logits that `Sampler::sample` is made of: each candidate's
//! weight (an `exp` that vectorizes) as an integer quantum, the quanta's mass in power-of-two
//! buckets, the highest value, and the candidate at a given point of the cumulative weights in
//! rank order, found by selection rather than a sort.
//!
//! Every sum is of integers, so it is exact and its order does not matter: the draw is defined
//! by the ranking alone, whatever order the passes visit the candidates in.

use std::cmp::Ordering;

/// Quantum buckets by power of two: bucket b holds quanta in [2^(29-b), 2^(30-b)) (bucket 0
/// also 2^30, the most likely candidate's); bucket 30 holds the zeros, which are never drawn.
/// A bucket is a run of the ranking.
pub(super) const BUCKETS: usize = 31;

/// The bucket of a quantum.
pub(super) fn bucket(q: u32) -> usize {
    q.leading_zeros().max(2) as usize - 2
}

/// The least quantum of bucket `b`.
pub(super) fn bucket_floor(b: usize) -> u32 {
    if b >= BUCKETS - 1 {
        0
    } else {
        1 << (29 - b)
    }
}

/// A weight in [0, 1] as the integer the draw sums: `floor(w * 2^30)`. Exact for weights of at
/// least 2^-7, and a weight under 2^-30 of the most likely candidate's counts as nothing (for
/// Llama 3's 128,256 tokens, at most 1.2e-4 of that candidate's weight in all). Their sums are
/// exact in a u64, so the draw does not depend on the order they are added in.
#[inline(always)]
pub(super) fn quantum(w: f32) -> u32 {
    const ONE: f32 = (1u32 << 30) as f32;
    let y = w * ONE;
    // Into [0, 2^30], NaN to 2^30 by the first select and nothing below 0 by the second.
    let y = if y < ONE { y } else { ONE };
    let y = if y > 0.0 { y } else { 0.0 };
    // SAFETY: y is finite and within [0, 2^30], so its truncation fits an i32. (The checked
    // `as i32` does not vectorize: 150 against 22 us for 128,256 values.)
    unsafe { y.to_int_unchecked::<i32>() as u32 }
}

/// A candidate's weight `e^x` for `x = value - max <= 0`: a polynomial on `x` reduced by powers
/// of two, within 2.5e-7 of `exp` relative to it, and 0 below -87 (where `e^x` is no normal
/// number; a quantum is 0 long before), written so that a pass over the logits vectorizes
/// (libm's `expf` is a call per value) and never computes with subnormal numbers (which cost
/// x86 cores a hundred cycles an operation: SmolLM2's synthetic logits, most of them far below
/// their maximum, took 0.8 ms a draw so).
#[inline(always)]
pub(super) fn exp_weight(x: f32) -> f32 {
    let low = x.is_nan() || x < -87.0;
    let x = if low { -87.0 } else { x };
    // x = k ln 2 + r, |r| <= ln 2 / 2: k rounded to the nearest integer by adding 1.5 * 2^23, so
    // that it also sits in the sum's low bits; k >= -126, so 2^k is a normal number.
    let shifted = x * std::f32::consts::LOG2_E + 12_582_912.0;
    let k = shifted - 12_582_912.0;
    let r = x - k * 0.693_145_75 - k * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let k = shifted.to_bits() as i32 - 0x4B40_0000;
    let w = p * f32::from_bits(((k + 127) as u32) << 23);
    if low {
        0.0
    } else {
        w
    }
}

/// Fills `quanta` with each value's weight quantum against `max`, 0 for a value that is not
/// finite or weighs less than `min_p` (a loop of its own, on slices and plain numbers, so that it
/// vectorizes).
pub(super) fn fill_quanta(quanta: &mut Vec<u32>, values: &[f32], max: f32, min_p: f32) {
    quanta.clear();
    quanta.resize(values.len(), 0);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above). Without FMA the results are the same bits
        // as the baseline loop's.
        unsafe { quanta_avx2(quanta, values, max, min_p) };
        return;
    }
    quanta_loop(quanta, values, max, min_p);
}

/// `fill_quanta`'s loop compiled for AVX2: eight values a step rather than four.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quanta_avx2(quanta: &mut [u32], values: &[f32], max: f32, min_p: f32) {
    quanta_loop(quanta, values, max, min_p);
}

#[inline(always)]
fn quanta_loop(quanta: &mut [u32], values: &[f32], max: f32, min_p: f32) {
    for (q, &v) in quanta.iter_mut().zip(values) {
        let w = exp_weight(v - max);
        *q = if v.is_finite() & (w >= min_p) {
            quantum(w)
        } else {
            0
        };
    }
}

/// Each bucket's mass, the sum of its quanta: four partial histograms, so that consecutive
/// quanta of one bucket do not wait on each other.
pub(super) fn bucket_masses(quanta: &[u32]) -> [u64; BUCKETS] {
    let mut mass = [[0u64; BUCKETS]; 4];
    let mut chunks = quanta.chunks_exact(4);
    for chunk in &mut chunks {
        for (part, &q) in chunk.iter().enumerate() {
            mass[part][bucket(q)] += q as u64;
        }
    }
    for &q in chunks.remainder() {
        mass[0][bucket(q)] += q as u64;
    }
    std::array::from_fn(|b| mass.iter().map(|m| m[b]).sum())
}

/// How many quanta each bucket holds.
pub(super) fn bucket_counts(quanta: &[u32]) -> [u32; BUCKETS] {
    let mut count = [[0u32; BUCKETS]; 4];
    let mut chunks = quanta.chunks_exact(4);
    for chunk in &mut chunks {
        for (part, &q) in chunk.iter().enumerate() {
            count[part][bucket(q)] += 1;
        }
    }
    for &q in chunks.remainder() {
        count[0][bucket(q)] += 1;
    }
    std::array::from_fn(|b| count.iter().map(|c| c[b]).sum())
}

/// A candidate: its id, value and weight quantum.
pub(super) type Candidate = (u32, f32, u64);

/// The ranking: higher value first, then lower id.
pub(super) fn rank(a: &Candidate, b: &Candidate) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Puts into `cands` each candidate whose quantum lies in buckets `first..=last` (none of the
/// zeros).
pub(super) fn collect(
    cands: &mut Vec<Candidate>,
    quanta: &[u32],
    values: &[f32],
    first: usize,
    last: usize,
) {
    let floor = bucket_floor(last).max(1);
    let ceiling = if first == 0 {
        u32::MAX
    } else {
        bucket_floor(first - 1) - 1
    };
    let within = |q: u32| (q >= floor) & (q <= ceiling);
    cands.clear();
    // Runs of 16 quanta tested at once (a loop that vectorizes), most of them holding none.
    for (run, (qs, vs)) in quanta.chunks(16).zip(values.chunks(16)).enumerate() {
        if qs.iter().fold(false, |any, &q| any | within(q)) {
            for (i, (&q, &v)) in qs.iter().zip(vs).enumerate() {
                if within(q) {
                    cands.push(((run * 16 + i) as u32, v, q as u64));
                }
            }
        }
    }
}

/// The candidate of `cands` (in any order; reordered) whose span of the cumulative quanta in
/// rank order holds `target`, and the quanta ranked before it; `None` if the quanta end first.
/// A weighted selection: each round splits the range at its median rank and keeps the side that
/// holds the target, so the cost is linear, not a sort's.
pub(super) fn locate(cands: &mut [Candidate], target: u64) -> Option<(Candidate, u64)> {
    let (mut lo, mut hi, mut before, mut target) = (0, cands.len(), 0u64, target);
    loop {
        let part = &mut cands[lo..hi];
        if part.len() <= 32 {
            part.sort_unstable_by(rank);
            for c in part.iter() {
                if target < c.2 {
                    return Some((*c, before));
                }
                target -= c.2;
                before += c.2;
            }
            return None;
        }
        let mid = part.len() / 2;
        part.select_nth_unstable_by(mid, rank);
        let above: u64 = part[..mid].iter().map(|c| c.2).sum();
        let pivot = part[mid];
        if target < above {
            hi = lo + mid;
        } else if target - above < pivot.2 {
            return Some((pivot, before + above));
        } else {
            target -= above + pivot.2;
            before += above + pivot.2;
            lo += mid + 1;
        }
    }
}

/// `ceil(p * total)` exactly, for p in (0, 1].
pub(super) fn share(p: f32, total: u64) -> u64 {
    let bits = p.to_bits();
    let (exponent, fraction) = ((bits >> 23) as i32, (bits & 0x7F_FFFF) as u128);
    let (mantissa, shift) = if exponent == 0 {
        (fraction, 149)
    } else {
        (fraction | 0x80_0000, 150 - exponent)
    };
    let product = mantissa * total as u128;
    if shift >= 128 {
        return u64::from(product > 0);
    }
    product.div_ceil(1u128 << shift) as u64
}

/// `floor(k / 2^53 * total)` exactly: the point a draw of `k` (53 random bits) picks.
pub(super) fn point(k: u64, total: u64) -> u64 {
    ((k as u128 * total as u128) >> 53) as u64
}

/// A key whose integer order is `total_cmp`'s order of finite values, below every one of them for
/// values that are not finite.
pub(super) fn order_key(v: f32) -> i32 {
    let b = v.to_bits() as i32;
    let key = b ^ (((b >> 31) as u32) >> 1) as i32;
    if v.is_finite() {
        key
    } else {
        i32::MIN
    }
}

/// The highest ranked finite value and its id (the lowest id among equal values), if any.
pub(super) fn top(values: &[f32]) -> Option<(u32, f32)> {
    // A plain loop over the keys, so that it vectorizes.
    let mut high = i32::MIN;
    for &v in values {
        high = high.max(order_key(v));
    }
    if high == i32::MIN {
        return None;
    }
    // The key's inverse: equal bits are equal in the ranking (the value is finite).
    let bits = (high ^ (((high >> 31) as u32) >> 1) as i32) as u32;
    let id = values.iter().position(|&v| v.to_bits() == bits)?;
    Some((id as u32, values[id]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A uniform number in [0, 1) (the sampler's generator, for seeded inputs).
    fn unit(state: &mut u64) -> f64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (*state ^ (*state >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn weights_follow_exp() {
        let mut state = 21u64;
        for i in 0..20_000 {
            let x = if i < 10 {
                [
                    0.0f32,
                    -0.0,
                    -1e-30,
                    -0.5,
                    -87.0,
                    -87.5,
                    -103.0,
                    -104.0,
                    -200.0,
                    f32::MIN,
                ][i]
            } else {
                -(unit(&mut state) * 110.0) as f32
            };
            let (got, want) = (exp_weight(x) as f64, (x as f64).exp());
            if x >= -87.0 {
                assert!(
                    ((got - want) / want).abs() < 2.5e-7,
                    "e^{x}: {got} against {want}"
                );
            } else {
                assert_eq!(got, 0.0, "e^{x}");
            }
        }
        assert_eq!(exp_weight(0.0), 1.0);
    }

    #[test]
    fn bucket_sums_count_every_quantum_once_and_exactly() {
        let mut state = 4u64;
        let q: Vec<u32> = (0..1_003)
            .map(|i| {
                if i % 7 == 0 {
                    0
                } else {
                    quantum(unit(&mut state).powi(9) as f32)
                }
            })
            .chain([1 << 30, 0, 1 << 29, (1 << 29) - 1, 1])
            .collect();
        let (mass, count) = (bucket_masses(&q), bucket_counts(&q));
        for b in 0..BUCKETS {
            let members = q.iter().filter(|&&q| bucket(q) == b);
            assert_eq!(
                mass[b],
                members.clone().map(|&q| q as u64).sum::<u64>(),
                "bucket {b}"
            );
            assert_eq!(count[b] as usize, members.count(), "bucket {b}");
            // A bucket's quanta run from its floor up to the floor of the bucket above.
            for &x in &q {
                let below = b == 0 || x < bucket_floor(b - 1);
                assert_eq!(bucket(x) == b, x >= bucket_floor(b) && below, "{x} in {b}");
            }
        }
        assert_eq!(count.iter().sum::<u32>(), 1_008);
        assert_eq!(
            count[BUCKETS - 1] as usize,
            q.iter().filter(|&&q| q == 0).count()
        );
        assert_eq!(
            (bucket(1 << 30), bucket((1 << 29) - 1), bucket(1)),
            (0, 1, 29)
        );
        assert_eq!(
            (quantum(1.0), quantum(0.75), quantum(1e-10)),
            (1 << 30, 3 << 28, 0)
        );
    }

    #[test]
    fn collect_takes_a_run_of_buckets() {
        let q = [1u32 << 30, 5, 0, 1 << 28, (1 << 29) - 1, 1 << 29, 3];
        let v = [9.0f32, 1.0, 0.0, 7.0, 8.0, 8.5, 0.5];
        let mut cands = Vec::new();
        let ids = |c: &Vec<Candidate>| c.iter().map(|c| c.0).collect::<Vec<_>>();
        collect(&mut cands, &q, &v, 0, 0);
        assert_eq!(ids(&cands), [0, 5]);
        collect(&mut cands, &q, &v, 1, 2);
        assert_eq!(ids(&cands), [3, 4]);
        collect(&mut cands, &q, &v, 0, BUCKETS - 1);
        assert_eq!(ids(&cands), [0, 1, 3, 4, 5, 6]);
        assert_eq!(cands[1], (1, 1.0, 5));
    }

    #[test]
    fn locate_finds_the_span_that_holds_each_point() {
        let mut state = 8u64;
        for n in [1usize, 5, 33, 200, 3_001] {
            let mut cands: Vec<Candidate> = (0..n)
                .map(|i| {
                    let v = (unit(&mut state) * 6.0).round() as f32;
                    let q = if i % 11 == 3 {
                        0
                    } else {
                        (unit(&mut state) * 1e6) as u64
                    };
                    (i as u32, v, q)
                })
                .collect();
            let mut ranked = cands.clone();
            ranked.sort_by(rank);
            let total: u64 = ranked.iter().map(|c| c.2).sum();
            let mut before = 0u64;
            for c in &ranked {
                for t in [before, before + c.2 / 2, (before + c.2).saturating_sub(1)] {
                    if c.2 > 0 {
                        assert_eq!(
                            locate(&mut cands, t),
                            Some((*c, before)),
                            "n {n}, point {t}"
                        );
                    }
                }
                before += c.2;
            }
            assert_eq!(locate(&mut cands, total), None);
        }
    }

    #[test]
    fn shares_and_points_are_exact() {
        let total = (1u64 << 57) - 3;
        assert_eq!(share(1.0, total), total);
        assert_eq!(share(0.5, total), total.div_ceil(2));
        assert_eq!(share(0.75, 4), 3);
        assert_eq!(share(0.9, 10), 9);
        assert_eq!(
            share(0.9, 1 << 40),
            ((0.9f32 as f64) * (1u64 << 40) as f64).ceil() as u64
        );
        assert_eq!(share(f32::from_bits(1), 1 << 40), 1);
        assert_eq!(point(0, total), 0);
        assert_eq!(point((1 << 53) - 1, total), total - 16);
        assert_eq!(point((1 << 53) - 1, 10), 9);
        assert_eq!(point(1 << 52, 10), 5);
    }

    #[test]
    fn the_top_is_the_highest_finite_value_first_by_id() {
        let nan = f32::NAN;
        assert_eq!(
            top(&[nan, -3.0, f32::INFINITY, -1.0, -1.0]),
            Some((3, -1.0))
        );
        assert_eq!(top(&[-0.0, 0.0, -5.0]), Some((1, 0.0)));
        assert_eq!(top(&[f32::MIN, f32::NEG_INFINITY]), Some((0, f32::MIN)));
        assert_eq!(top(&[nan, f32::NEG_INFINITY]), None);
    }
}
