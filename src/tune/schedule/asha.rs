//! Asynchronous successive halving (Ray's `ASHAScheduler` with one
//! bracket).
//!
//! For `grace_period` g, `reduction_factor` η and `max_t`:
//! 1. the rungs are at iterations ⌈g·η^k⌉ for every k ≥ 0 with
//!    g·η^k < `max_t` (each once);
//! 2. a result at iteration `max_t` or later stops the trial (it is done);
//! 3. otherwise, take the highest rung at or below the iteration that the
//!    trial has not yet been recorded in; if there is one, the trial stops
//!    when its score is below the `(1 − 1/η)` quantile (linear
//!    interpolation, as NumPy's `percentile`) of the scores recorded there
//!    before it; either way its score is recorded there;
//! 4. a trial never waits for others: early trials pass rungs that later
//!    ones fill (the asynchronous part).

use std::collections::BTreeMap;

use super::{Decision, Scheduler};
use crate::tune::TuneError;

/// Asynchronous successive halving; see the module docs.
pub struct Asha {
    max_t: u64,
    quantile: f64,
    /// Milestone and the scores recorded there by trial, highest first.
    rungs: Vec<(u64, BTreeMap<u64, f64>)>,
}

impl Asha {
    /// ASHA with these settings, refused unless `grace_period ≥ 1`,
    /// `reduction_factor > 1` and `max_t ≥ grace_period`.
    pub fn new(grace_period: u64, reduction_factor: f64, max_t: u64) -> Result<Self, TuneError> {
        let bad = |detail: String| Err(TuneError::BadScheduler(detail));
        if grace_period < 1 {
            return bad("ASHA grace_period must be at least 1".into());
        }
        if !(reduction_factor.is_finite() && reduction_factor > 1.0) {
            return bad(format!(
                "ASHA reduction_factor must be > 1, got {reduction_factor}"
            ));
        }
        if max_t < grace_period {
            return bad(format!(
                "ASHA max_t ({max_t}) must be at least grace_period ({grace_period})"
            ));
        }
        let mut rungs = Vec::new();
        let mut milestone = grace_period as f64;
        while milestone < max_t as f64 {
            // An iteration reaches a rung at or past its milestone (Ray
            // compares integer iterations with float milestones).
            let at = milestone.ceil() as u64;
            if rungs.last().is_none_or(|(last, _)| *last < at) {
                rungs.push((at, BTreeMap::new()));
            }
            milestone *= reduction_factor;
        }
        rungs.reverse();
        Ok(Asha {
            max_t,
            quantile: 1.0 - 1.0 / reduction_factor,
            rungs,
        })
    }

    /// The rungs' milestones, highest first.
    pub fn milestones(&self) -> Vec<u64> {
        self.rungs.iter().map(|(m, _)| *m).collect()
    }
}

impl Scheduler for Asha {
    fn on_result(&mut self, trial: u64, iteration: u64, score: f64) -> Decision {
        if iteration >= self.max_t {
            return Decision::Stop;
        }
        let quantile = self.quantile;
        let Some((_, recorded)) = self.rungs.iter_mut().find(|(milestone, recorded)| {
            iteration >= *milestone && !recorded.contains_key(&trial)
        }) else {
            return Decision::Continue;
        };
        let mut scores: Vec<f64> = recorded.values().copied().filter(|s| !s.is_nan()).collect();
        let below = percentile(&mut scores, quantile).is_some_and(|cutoff| score < cutoff);
        recorded.insert(trial, score);
        if below {
            Decision::Stop
        } else {
            Decision::Continue
        }
    }
}

/// The `q` quantile (0..=1) of `xs` with linear interpolation, as NumPy's
/// `percentile`; `None` for no values.
fn percentile(xs: &mut [f64], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let position = q * (xs.len() - 1) as f64;
    let (lower, upper) = (position.floor() as usize, position.ceil() as usize);
    let weight = position - lower as f64;
    Some(xs[lower] + (xs[upper] - xs[lower]) * weight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::{Continue, Stop};

    #[test]
    fn asha_stops_below_the_rung_quantile_by_hand() {
        // g = 1, η = 2, max_t = 8: rungs at 4, 2, 1 (8 is max_t itself).
        let mut asha = Asha::new(1, 2.0, 8).unwrap();
        assert_eq!(asha.milestones(), [4, 2, 1]);
        // Rung 1: A first (nothing to compare with), B below A's 0.5,
        // C above the median 0.4 of {0.5, 0.3}.
        assert_eq!(asha.on_result(0, 1, 0.5), Continue);
        assert_eq!(asha.on_result(1, 1, 0.3), Stop);
        assert_eq!(asha.on_result(2, 1, 0.9), Continue);
        // D: median of {0.5, 0.3, 0.9} is 0.5; 0.45 < 0.5.
        assert_eq!(asha.on_result(3, 1, 0.45), Stop);
        // Rung 2: A first, C below A's 0.6.
        assert_eq!(asha.on_result(0, 2, 0.6), Continue);
        assert_eq!(asha.on_result(2, 2, 0.55), Stop);
        // A's third result passes no new rung.
        assert_eq!(asha.on_result(0, 3, 0.1), Continue);
        // Rung 4 for A; then max_t.
        assert_eq!(asha.on_result(0, 4, 0.7), Continue);
        assert_eq!(asha.on_result(0, 8, 0.7), Stop);
        // A trial that skips iterations lands in the highest rung it
        // reached: E at 5 is compared in rung 4 ({A: 0.7}).
        assert_eq!(asha.on_result(4, 5, 0.65), Stop);
        assert_eq!(asha.on_result(5, 5, 0.75), Continue);
    }

    #[test]
    fn asha_interpolates_the_cutoff_like_numpy() {
        // η = 4: the 75th percentile of {1, 2, 3, 4} is 3.25.
        let mut asha = Asha::new(1, 4.0, 100).unwrap();
        assert_eq!(asha.milestones(), [64, 16, 4, 1]);
        for (trial, score) in [1.0, 2.0, 3.0, 4.0].into_iter().enumerate() {
            asha.on_result(trial as u64, 1, score);
        }
        assert_eq!(asha.on_result(10, 1, 3.2), Stop);
        let mut again = Asha::new(1, 4.0, 100).unwrap();
        for (trial, score) in [1.0, 2.0, 3.0, 4.0].into_iter().enumerate() {
            again.on_result(trial as u64, 1, score);
        }
        assert_eq!(again.on_result(10, 1, 3.3), Continue);
    }

    #[test]
    fn fractional_milestones_round_up_and_repeat_once() {
        assert_eq!(Asha::new(1, 2.5, 20).unwrap().milestones(), [16, 7, 3, 1]);
        assert_eq!(Asha::new(1, 1.1, 3).unwrap().milestones(), [3, 2, 1]);
    }

    #[test]
    fn bad_asha_settings_are_refused() {
        for (g, eta, max_t) in [(0, 2.0, 10), (1, 1.0, 10), (1, f64::NAN, 10), (5, 2.0, 4)] {
            let refused = Asha::new(g, eta, max_t);
            assert!(
                matches!(refused, Err(TuneError::BadScheduler(_))),
                "{g} {eta} {max_t}"
            );
        }
    }
}
