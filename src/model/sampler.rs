//! Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p, repetition
//! penalty, with a seeded generator so a run can be repeated.

use crate::error::{Error, Result};

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
pub struct Sampler {
    config: SamplerConfig,
    state: u64,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler with validated settings.
    pub fn new(config: SamplerConfig) -> Result<Self> {
        config.validate()?;
        let state = config.seed ^ 0x9E37_79B9_7F4A_7C15;
        Ok(Sampler {
            config,
            state,
            candidates: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// A uniform number in [0, 1) (splitmix64).
    fn next_unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks the next token from `logits`, given the tokens so far (for the repetition penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::InvalidArgument("sampling from empty logits".into()));
        }
        let cfg = self.config.clone();
        let penalized = |id: usize, v: f32| -> f32 {
            if cfg.repetition_penalty == 1.0 {
                return v;
            }
            let start = history.len().saturating_sub(cfg.penalty_window);
            if history[start..].contains(&(id as u32)) {
                if v > 0.0 {
                    v / cfg.repetition_penalty
                } else {
                    v * cfg.repetition_penalty
                }
            } else {
                v
            }
        };
        if cfg.temperature == 0.0 {
            // As sampling does, only finite logits are candidates.
            let mut best: Option<(usize, f32)> = None;
            for (i, &v) in logits.iter().enumerate() {
                let v = penalized(i, v);
                if v.is_finite() && best.is_none_or(|(_, b)| v > b) {
                    best = Some((i, v));
                }
            }
            return best
                .map(|(i, _)| i as u32)
                .ok_or_else(|| Error::InvalidArgument(NO_FINITE_LOGIT.into()));
        }
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as u32, penalized(i, v) / cfg.temperature)),
        );
        cands.retain(|c| c.1.is_finite());
        if cands.is_empty() {
            return Err(Error::InvalidArgument(NO_FINITE_LOGIT.into()));
        }
        cands.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if cfg.top_k > 0 {
            cands.truncate(cfg.top_k);
        }
        let max = cands[0].1;
        let mut total = 0.0f64;
        for c in cands.iter_mut() {
            c.1 = (c.1 - max).exp();
            total += c.1 as f64;
        }
        if cfg.min_p > 0.0 {
            let floor = cfg.min_p; // the top candidate has weight exp(0) = 1
            cands.retain(|c| c.1 >= floor);
            total = cands.iter().map(|c| c.1 as f64).sum();
        }
        if cfg.top_p < 1.0 {
            let mut acc = 0.0f64;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                acc += c.1 as f64 / total;
                if acc >= cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep);
            total = cands.iter().map(|c| c.1 as f64).sum();
        }
        let mut target = self.next_unit() * total;
        let cands = &self.candidates;
        for c in cands {
            target -= c.1 as f64;
            if target < 0.0 {
                return Ok(c.0);
            }
        }
        Ok(cands[cands.len() - 1].0)
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

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Token 1 and 3 hold almost all the mass at temperature 0.1.
        let cfg = SamplerConfig {
            temperature: 0.1,
            top_p: 0.9,
            seed: 3,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..50 {
            let t = s.sample(&logits(), &[]).unwrap();
            assert!(t == 1 || t == 3, "picked {t}");
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            min_p: 0.5,
            seed: 11,
            ..SamplerConfig::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..50 {
            let t = s.sample(&logits(), &[]).unwrap();
            assert!(t == 1 || t == 3, "picked {t}");
        }
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
