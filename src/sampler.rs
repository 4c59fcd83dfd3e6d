//! Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p, repetition
//! penalty, with a seeded generator so a run can be repeated.

use crate::error::{Error, Result};

pub mod device;
mod passes;

use passes::{
    bucket_counts, bucket_masses, collect, fill_quanta, locate, point, rank, share, top, Candidate,
    BUCKETS,
};

/// The error of a draw past the candidates' quanta, which their sum rules out.
fn lost() -> Error {
    Error::InvalidArgument("the sampler's draw fell past every candidate".into())
}

/// The error of a step whose logits hold no finite value (a broken model, such as NaN weights).
pub const NO_FINITE_LOGIT: &str = "every logit is infinite or NaN";

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probabilities sum to at least `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely one's (0: none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of already-seen tokens by this (1: off).
    pub repetition_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub penalty_window: usize,
    /// Seed of the generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            penalty_window: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Checks the ranges of every setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidArgument(m.to_string()));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("--temperature must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("--top-p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("--min-p must be in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("--repeat-penalty must be a finite number > 0");
        }
        Ok(())
    }

    /// Whether sampling reduces to an argmax of the raw logits.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 && self.repetition_penalty == 1.0
    }
}

/// A sampler: settings plus the generator's state and reusable scratch.
///
/// A sampled token costs a few linear passes over the logits, not a sort of them
/// (`sampler/passes.rs`): weights as integer quanta, their sums per power-of-two bucket, and a
/// weighted selection inside the one bucket that holds the draw's point (`benches/sampler.rs`:
/// at 128,256 logits 4-9 ms a token for a full sort, about 0.4 ms this way).
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    state: u64,
    /// Each logit after the penalty and temperature (a candidate where finite).
    values: Vec<f32>,
    /// Each value's weight quantum (`passes::quantum`), 0 where it is not a candidate.
    quanta: Vec<u32>,
    /// The candidates being ranked: id, value, weight quantum.
    candidates: Vec<Candidate>,
    /// The distinct tokens of the penalty window, sorted.
    seen: Vec<u32>,
}

impl Sampler {
    /// A sampler with validated settings.
    pub fn new(config: SamplerConfig) -> Result<Self> {
        config.validate()?;
        let state = config.seed ^ 0x9E37_79B9_7F4A_7C15;
        Ok(Sampler {
            config,
            state,
            values: Vec::new(),
            quanta: Vec::new(),
            candidates: Vec::new(),
            seen: Vec::new(),
        })
    }

    /// A sampler with validated settings whose generator continues from `state` (a
    /// [`Sampler::state`]), as the device's draw does (`ops::draw`).
    pub(crate) fn with_state(config: SamplerConfig, state: u64) -> Result<Self> {
        let mut s = Self::new(config)?;
        s.state = state;
        Ok(s)
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// The generator's state: what the next draw starts from (a device draw's
    /// [`device::DrawState`] starts from it).
    pub fn state(&self) -> u64 {
        self.state
    }

    /// Moves the generator to `state`: where a device draw from this sampler's state left it.
    pub fn set_state(&mut self, state: u64) {
        self.state = state;
    }

    /// Advances the generator past `draws` draws, as if that many tokens had been sampled here
    /// (the device drew them from the same state).
    pub(crate) fn skip_draws(&mut self, draws: usize) {
        for _ in 0..draws {
            Self::next_bits(&mut self.state);
        }
    }

    /// 53 random bits from the generator's state (splitmix64): the draw `k / 2^53` in [0, 1).
    fn next_bits(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        z >> 11
    }

    /// Picks the next token from `logits`, given the tokens so far (for the repetition penalty).
    ///
    /// What it computes (the test module's reference does the same with a full sort): each
    /// logit, penalized, divided by the temperature, is a candidate if finite; the `top_k`
    /// highest ranked candidates are kept (rank: higher value first, then lower id); each weighs
    /// `w = exp(value - max)`, and those below `min_p` are dropped; each weight counts as the
    /// integer `floor(w * 2^30)`, and every sum is exact; with `top_p < 1` the nucleus is the
    /// shortest rank-order prefix whose sum reaches `ceil(top_p * total)`; the token is the
    /// first in rank order whose cumulative sum passes `floor(k / 2^53 * nucleus)`, k being 53
    /// random bits.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::InvalidArgument("sampling from empty logits".into()));
        }
        self.draw(logits, history)?
            .ok_or_else(|| Error::InvalidArgument(NO_FINITE_LOGIT.into()))
    }

    /// [`Sampler::sample`], with `None` where no penalized logit is finite (the generator then
    /// does not advance).
    pub(crate) fn draw(&mut self, logits: &[f32], history: &[u32]) -> Result<Option<u32>> {
        self.penalized(logits, history);
        let cfg = &self.config;
        let values = &self.values;
        let Some((best, max)) = top(values) else {
            return Ok(None);
        };
        if cfg.temperature == 0.0 {
            return Ok(Some(best));
        }
        let (top_k, top_p) = (cfg.top_k, cfg.top_p);
        let draw = Self::next_bits(&mut self.state);
        let quanta = &mut self.quanta;
        let cands = &mut self.candidates;
        fill_quanta(quanta, values, max, cfg.min_p);
        // The last bucket holds the zeros: values that are no candidates, or weigh too little to
        // be drawn.
        let count = if top_k > 0 {
            bucket_counts(quanta)
        } else {
            [0; BUCKETS]
        };
        let kept: u64 = count[..BUCKETS - 1].iter().map(|&c| c as u64).sum();
        if top_k > 0 && (top_k as u64) < kept {
            // The top k (of those at least `min_p`: both cuts keep a prefix of the ranking) lie
            // in the buckets down to the one where the count reaches k.
            let mut seen = 0u64;
            let last = count
                .iter()
                .position(|&c| {
                    seen += c as u64;
                    seen >= top_k as u64
                })
                .unwrap_or(BUCKETS - 1);
            collect(cands, quanta, values, 0, last);
            cands.select_nth_unstable_by(top_k - 1, rank);
            cands.truncate(top_k);
            let total = cands.iter().map(|c| c.2).sum();
            let nucleus = if top_p < 1.0 {
                let (end, before) = locate(cands, share(top_p, total) - 1).ok_or_else(lost)?;
                before + end.2
            } else {
                total
            };
            return Ok(Some(
                locate(cands, point(draw, nucleus)).ok_or_else(lost)?.0 .0,
            ));
        }
        let mass = bucket_masses(quanta);
        // A point of the cumulative quanta: its bucket from the bucket sums, then the candidate
        // among that bucket's alone.
        let mut locate_all = |target: u64| -> Result<(Candidate, u64)> {
            let mut before = 0u64;
            for (b, &m) in mass.iter().enumerate() {
                if target - before < m {
                    collect(cands, quanta, values, b, b);
                    let (c, within) = locate(cands, target - before).ok_or_else(lost)?;
                    return Ok((c, before + within));
                }
                before += m;
            }
            Err(lost())
        };
        let total: u64 = mass.iter().sum();
        let nucleus = if top_p < 1.0 {
            let (end, before) = locate_all(share(top_p, total) - 1)?;
            before + end.2
        } else {
            total
        };
        Ok(Some(locate_all(point(draw, nucleus))?.0 .0))
    }

    /// Fills `values` with each logit after the repetition penalty (over the last
    /// `penalty_window` tokens of `history`) and, when sampling, the temperature.
    fn penalized(&mut self, logits: &[f32], history: &[u32]) {
        let cfg = &self.config;
        let t = if cfg.temperature == 0.0 {
            1.0
        } else {
            cfg.temperature
        };
        self.values.clear();
        self.values.extend(logits.iter().map(|&v| v / t));
        if cfg.repetition_penalty == 1.0 {
            return;
        }
        let start = history.len().saturating_sub(cfg.penalty_window);
        self.seen.clear();
        self.seen.extend_from_slice(&history[start..]);
        self.seen.sort_unstable();
        self.seen.dedup();
        for &id in &self.seen {
            if let Some(&v) = logits.get(id as usize) {
                let p = if v > 0.0 {
                    v / cfg.repetition_penalty
                } else {
                    v * cfg.repetition_penalty
                };
                self.values[id as usize] = p / t;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![0.5, 3.0, -1.0, 2.9, 0.0, 1.0]
    }

    #[test]
    fn greedy_picks_the_first_maximum() {
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        assert_eq!(s.sample(&logits(), &[]).unwrap(), 1);
        assert_eq!(s.sample(&[1.0, 2.0, 2.0], &[]).unwrap(), 1);
    }

    #[test]
    fn greedy_skips_non_finite_logits_and_fails_without_a_finite_one() {
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        let nan = f32::NAN;
        assert_eq!(s.sample(&[nan, 1.0, f32::INFINITY, 0.5], &[]).unwrap(), 1);
        for bad in [vec![nan; 4], vec![f32::INFINITY, nan, f32::NEG_INFINITY]] {
            let e = s.sample(&bad, &[]).unwrap_err().to_string();
            assert!(e.contains(NO_FINITE_LOGIT), "{e}");
        }
    }

    #[test]
    fn repetition_penalty_changes_the_greedy_choice() {
        let cfg = SamplerConfig {
            repetition_penalty: 1.5,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        assert_eq!(s.sample(&logits(), &[1]).unwrap(), 3);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let cfg = SamplerConfig {
            temperature: 5.0,
            top_k: 1,
            seed: 7,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&logits(), &[]).unwrap(), 1);
        }
    }

    /// Fifty draws from [`logits`] with `cfg`, every one token 1 or 3.
    fn draws_only_one_or_three(cfg: SamplerConfig) {
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..50 {
            let t = s.sample(&logits(), &[]).unwrap();
            assert!(t == 1 || t == 3, "picked {t}");
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Token 1 and 3 hold almost all the mass at temperature 0.1.
        draws_only_one_or_three(SamplerConfig {
            temperature: 0.1,
            top_p: 0.9,
            seed: 3,
            ..SamplerConfig::default()
        });
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        draws_only_one_or_three(SamplerConfig {
            temperature: 1.0,
            min_p: 0.5,
            seed: 11,
            ..SamplerConfig::default()
        });
    }

    #[test]
    fn same_seed_same_choices_and_frequencies_follow_probabilities() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            seed: 42,
            ..SamplerConfig::default()
        };
        let l = vec![0.0f32, (3.0f32).ln()]; // probabilities 1/4 and 3/4
        let mut a = Sampler::new(cfg.clone()).unwrap();
        let mut b = Sampler::new(cfg).unwrap();
        let mut ones = 0;
        for _ in 0..4000 {
            let x = a.sample(&l, &[]).unwrap();
            assert_eq!(x, b.sample(&l, &[]).unwrap());
            ones += x as usize;
        }
        let freq = ones as f64 / 4000.0;
        assert!((freq - 0.75).abs() < 0.03, "frequency of token 1: {freq}");
    }

    /// What `Sampler::sample` computes, the simple way: every candidate ranked by a full sort,
    /// walked in order; `bits` is the draw's 53 random bits.
    fn reference(cfg: &SamplerConfig, bits: u64, logits: &[f32], history: &[u32]) -> Option<u32> {
        let seen = &history[history.len().saturating_sub(cfg.penalty_window)..];
        let value = |i: usize, v: f32| {
            let v = if cfg.repetition_penalty != 1.0 && seen.contains(&(i as u32)) {
                if v > 0.0 {
                    v / cfg.repetition_penalty
                } else {
                    v * cfg.repetition_penalty
                }
            } else {
                v
            };
            if cfg.temperature == 0.0 {
                v
            } else {
                v / cfg.temperature
            }
        };
        let mut cands: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, value(i, v), 0))
            .filter(|c| c.1.is_finite())
            .collect();
        cands.sort_by(rank);
        if cfg.temperature == 0.0 {
            // The first maximum: the lowest id among equal values.
            return cands.first().map(|c| c.0);
        }
        if cfg.top_k > 0 {
            cands.truncate(cfg.top_k);
        }
        let max = cands.first()?.1;
        cands.retain(|c| passes::exp_weight(c.1 - max) >= cfg.min_p);
        for c in &mut cands {
            c.2 = passes::quantum(passes::exp_weight(c.1 - max)) as u64;
        }
        let total: u64 = cands.iter().map(|c| c.2).sum();
        // The nucleus: the shortest prefix whose quanta reach top_p of the total.
        let want = share(cfg.top_p, total);
        let mut acc = 0u64;
        let keep = cands.iter().position(|c| {
            acc += c.2;
            acc >= want
        })?;
        cands.truncate(keep + 1);
        let at = point(bits, cands.iter().map(|c| c.2).sum());
        let mut acc = 0u64;
        cands
            .iter()
            .find(|c| {
                acc += c.2;
                acc > at
            })
            .map(|c| c.0)
    }

    /// A uniform number in [0, 1) from the sampler's generator.
    fn unit(state: &mut u64) -> f64 {
        Sampler::next_bits(state) as f64 / (1u64 << 53) as f64
    }

    /// Seeded logits: a bell of values, some tied, a few far above the rest, some not finite.
    fn random_logits(n: usize, state: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u = unit(state);
                let g = (unit(state) + unit(state) - 1.0) as f32;
                match (u * 1000.0) as u32 {
                    0..=4 => f32::NAN,
                    5..=9 => f32::NEG_INFINITY,
                    10..=29 => 12.0 + g,
                    30..=129 => (g * 4.0).round(),
                    _ => 6.0 * g,
                }
            })
            .collect()
    }

    #[test]
    fn sampling_matches_the_full_sort_reference() {
        let mut state = 5u64;
        let mut cases = 0;
        for n in [1usize, 2, 7, 64, 1000, 4099, 49_152] {
            for case in 0..12u64 {
                let pick = |k: u64, m: u64| (k.wrapping_mul(2_654_435_761) >> 7) % m;
                let cfg = SamplerConfig {
                    temperature: [0.0, 0.3, 0.8, 1.0, 2.5][pick(case + n as u64, 5) as usize],
                    top_k: [0, 1, 3, 40, 5000][pick(case * 3 + 1, 5) as usize],
                    top_p: [1.0, 0.9, 0.5, 0.999_999][pick(case * 7 + 2, 4) as usize],
                    min_p: [0.0, 0.0, 0.05, 1.0][pick(case * 11 + 3, 4) as usize],
                    repetition_penalty: [1.0, 1.3][pick(case * 13 + 4, 2) as usize],
                    penalty_window: 16,
                    seed: case,
                };
                let logits = random_logits(n, &mut state);
                let history: Vec<u32> = (0..40)
                    .map(|i| ((i * 7_919 + case as usize) % n) as u32)
                    .collect();
                let mut sampler = Sampler::new(cfg.clone()).unwrap();
                let mut units = cfg.seed ^ 0x9E37_79B9_7F4A_7C15;
                for _ in 0..8 {
                    let got = sampler.sample(&logits, &history).ok();
                    let finite = logits.iter().any(|v| v.is_finite());
                    let bits = if cfg.temperature != 0.0 && finite {
                        Sampler::next_bits(&mut units)
                    } else {
                        0
                    };
                    let want = reference(&cfg, bits, &logits, &history);
                    assert_eq!(got, want, "n {n}, case {case}, {cfg:?}");
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 7 * 12 * 8);
    }

    #[test]
    fn a_flat_distribution_draws_past_the_top_buckets() {
        // Equal values: every candidate weighs 1, so the draw lands anywhere in 4,096 of them,
        // and a high draw must reach far down the ranking.
        let cfg = SamplerConfig {
            temperature: 1.0,
            seed: 9,
            ..SamplerConfig::default()
        };
        let logits = vec![0.25f32; 4096];
        let mut sampler = Sampler::new(cfg.clone()).unwrap();
        let mut units = cfg.seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut high = 0;
        for _ in 0..64 {
            let bits = Sampler::next_bits(&mut units);
            let got = sampler.sample(&logits, &[]).unwrap();
            assert_eq!(got, (bits >> 41) as u32);
            high += usize::from(got >= 2048);
        }
        assert!(
            high > 16,
            "only {high} of 64 draws in the lower half of the ranking"
        );
    }

    #[test]
    fn bad_settings_are_rejected() {
        for cfg in [
            SamplerConfig {
                temperature: -1.0,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                top_p: 0.0,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                min_p: 2.0,
                ..SamplerConfig::default()
            },
            SamplerConfig {
                repetition_penalty: 0.0,
                ..SamplerConfig::default()
            },
        ] {
            assert!(Sampler::new(cfg).is_err());
        }
    }
}
