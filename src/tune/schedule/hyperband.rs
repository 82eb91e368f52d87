//! Asynchronous HyperBand (Li et al.'s asynchronous variant, Ray's
//! `AsyncHyperBandScheduler` with `brackets` > 1): several ASHA brackets
//! that trade how many trials are tried against how long each is given
//! before its first cut. Not Ray's synchronous `HyperBandScheduler`, which
//! pauses trials until their bracket catches up.
//!
//! For `grace_period` g, `reduction_factor` η, `max_t` and `brackets` B:
//! 1. bracket s (0 ≤ s < B) is ASHA (`asha.rs`) with grace period
//!    ⌈g·η^s⌉: bracket 0 cuts earliest, the last one lets every trial run
//!    longest before its first cut; every bracket's grace period must be
//!    at most `max_t`;
//! 2. a new trial joins bracket s with probability proportional to
//!    e^(rungs of s) (Ray's softmax over the brackets' rung counts), drawn
//!    from a hash of its number and the experiment's seed, so the same
//!    trial always joins the same bracket (a restored experiment replays
//!    its decisions) and another seed spreads trials otherwise;
//! 3. its results are decided by its bracket's ASHA alone.

use std::collections::HashMap;

use super::asha::Asha;
use super::{Decision, Scheduler};
use crate::tune::search::TrialConfig;
use crate::tune::TuneError;

/// Asynchronous HyperBand; see the module docs.
pub struct HyperBand {
    brackets: Vec<Asha>,
    /// Cumulative probabilities of joining each bracket; the last is 1.
    cumulative: Vec<f64>,
    of_trial: HashMap<u64, usize>,
    seed: u64,
}

impl HyperBand {
    /// HyperBand with these settings, drawing brackets from `seed`;
    /// refused unless ASHA takes each bracket's and `brackets ≥ 1`.
    pub fn new(
        grace_period: u64,
        reduction_factor: f64,
        max_t: u64,
        brackets: u32,
        seed: u64,
    ) -> Result<Self, TuneError> {
        if brackets < 1 {
            return Err(TuneError::BadScheduler(
                "HyperBand brackets must be at least 1".into(),
            ));
        }
        let mut built = Vec::new();
        for s in 0..brackets {
            let grace = (grace_period as f64 * reduction_factor.powi(s as i32)).ceil();
            if !(grace.is_finite() && grace <= max_t as f64) {
                return Err(TuneError::BadScheduler(format!(
                    "HyperBand bracket {s}'s grace period ({grace_period}·{reduction_factor}^{s} = {grace}) exceeds max_t ({max_t}): use fewer brackets or a larger max_t"
                )));
            }
            built.push(Asha::new(grace as u64, reduction_factor, max_t)?);
        }
        // e^(rungs − most rungs): the same shares, and no overflow.
        let most = built
            .iter()
            .map(|b| b.milestones().len())
            .max()
            .unwrap_or(0);
        let weights: Vec<f64> = built
            .iter()
            .map(|b| (b.milestones().len() as f64 - most as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let mut cumulative: Vec<f64> = weights
            .iter()
            .map(|w| {
                sum += w / total;
                sum
            })
            .collect();
        if let Some(last) = cumulative.last_mut() {
            *last = 1.0;
        }
        Ok(HyperBand {
            brackets: built,
            cumulative,
            of_trial: HashMap::new(),
            seed,
        })
    }

    /// Each bracket's rungs, highest first.
    pub fn milestones(&self) -> Vec<Vec<u64>> {
        self.brackets.iter().map(Asha::milestones).collect()
    }

    /// The bracket trial `trial` joins (step 2).
    pub fn bracket_of(&self, trial: u64) -> usize {
        let draw = unit(trial ^ mix(self.seed));
        self.cumulative
            .iter()
            .position(|c| draw < *c)
            .unwrap_or(self.brackets.len() - 1)
    }
}

/// A number in [0, 1) from `key`.
fn unit(key: u64) -> f64 {
    (mix(key) >> 11) as f64 / (1u64 << 53) as f64
}

/// SplitMix64's finaliser: every bit of `key` moves every bit out.
fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Scheduler for HyperBand {
    fn on_trial_add(&mut self, trial: u64, _: &TrialConfig) {
        let bracket = self.bracket_of(trial);
        self.of_trial.entry(trial).or_insert(bracket);
    }

    fn on_result(&mut self, trial: u64, iteration: u64, score: f64) -> Decision {
        let bracket = self.bracket_of(trial);
        let bracket = *self.of_trial.entry(trial).or_insert(bracket);
        self.brackets[bracket].on_result(trial, iteration, score)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::{Continue, Stop};

    #[test]
    fn brackets_are_ashas_with_growing_grace_periods() {
        // g = 1, η = 3, max_t = 27: graces 1, 3, 9.
        let hyperband = HyperBand::new(1, 3.0, 27, 3, 0).unwrap();
        assert_eq!(hyperband.milestones(), [vec![9, 3, 1], vec![9, 3], vec![9]]);
        // Softmax over 3, 2 and 1 rungs: e³ : e² : e¹.
        let e = std::f64::consts::E;
        let total = e.powi(3) + e.powi(2) + e;
        let expected = [e.powi(3) / total, e.powi(2) / total, e / total];
        let mut joined = [0usize; 3];
        let trials = 20_000;
        for trial in 0..trials {
            joined[hyperband.bracket_of(trial)] += 1;
        }
        for (joined, expected) in joined.iter().zip(expected) {
            let share = *joined as f64 / trials as f64;
            assert!((share - expected).abs() < 0.015, "{share} vs {expected}");
        }
    }

    #[test]
    fn the_seed_decides_which_trial_joins_which_bracket() {
        let brackets = |seed| {
            let hyperband = HyperBand::new(1, 2.0, 8, 2, seed).unwrap();
            (0..64).map(|t| hyperband.bracket_of(t)).collect::<Vec<_>>()
        };
        assert_eq!(brackets(7), brackets(7));
        assert_ne!(brackets(7), brackets(8));
    }

    #[test]
    fn each_trial_is_decided_by_its_own_bracket() {
        let mut hyperband = HyperBand::new(1, 2.0, 8, 2, 0).unwrap();
        assert_eq!(hyperband.milestones(), [vec![4, 2, 1], vec![4, 2]]);
        let in_bracket = |b: usize| (0..).find(|t| hyperband.bracket_of(*t) == b).unwrap();
        let (first, second) = (in_bracket(0), in_bracket(1));
        let config = TrialConfig::new();
        hyperband.on_trial_add(first, &config);
        hyperband.on_trial_add(second, &config);
        // Bracket 0 records at iteration 1, bracket 1 does not: a worse
        // score there is not compared with bracket 0's.
        assert_eq!(hyperband.on_result(first, 1, 0.9), Continue);
        assert_eq!(hyperband.on_result(second, 1, 0.1), Continue);
        assert_eq!(hyperband.on_result(second, 2, 0.1), Continue);
        // A third trial of bracket 1, worse at its first rung (2): cut.
        let third = (second + 1..)
            .find(|t| hyperband.bracket_of(*t) == 1)
            .unwrap();
        hyperband.on_trial_add(third, &config);
        assert_eq!(hyperband.on_result(third, 2, 0.05), Stop);
        // max_t ends any trial.
        assert_eq!(hyperband.on_result(first, 8, 0.9), Stop);
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(HyperBand::new(1, 3.0, 27, 0, 0).is_err());
        let err = HyperBand::new(4, 3.0, 27, 3, 0).err().unwrap().to_string();
        assert!(err.contains("bracket 2") && err.contains("max_t"), "{err}");
        assert!(HyperBand::new(1, 1.0, 27, 2, 0).is_err());
    }
}
