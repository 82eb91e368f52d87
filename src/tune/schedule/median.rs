//! The median stopping rule (Ray's `MedianStoppingRule`, Vizier's rule):
//! stop a trial whose best result so far is worse than the median of the
//! other trials' running averages at the same iteration.
//!
//! After trial T's result at iteration t:
//! 1. record it; before `grace_period` iterations, `Continue`;
//! 2. take the other trials that have reached iteration t; with fewer than
//!    `min_samples_required`, `Continue`;
//! 3. each one's running average is the mean of its results up to
//!    iteration t; if T's best score so far is below the median of those
//!    (the mean of the middle two for an even count), `Stop`.

use std::collections::HashMap;

use super::{Decision, Scheduler};
use crate::tune::TuneError;

/// The median stopping rule; see the module docs.
pub struct MedianStopping {
    grace_period: u64,
    min_samples_required: usize,
    /// Each trial's (iteration, score), in order.
    results: HashMap<u64, Vec<(u64, f64)>>,
}

impl MedianStopping {
    /// The rule, refused unless `min_samples_required ≥ 1`.
    pub fn new(grace_period: u64, min_samples_required: usize) -> Result<Self, TuneError> {
        if min_samples_required == 0 {
            return Err(TuneError::BadScheduler(
                "median stopping needs min_samples_required >= 1".into(),
            ));
        }
        Ok(MedianStopping {
            grace_period,
            min_samples_required,
            results: HashMap::new(),
        })
    }
}

impl Scheduler for MedianStopping {
    fn on_result(&mut self, trial: u64, iteration: u64, score: f64) -> Decision {
        self.results
            .entry(trial)
            .or_default()
            .push((iteration, score));
        if iteration < self.grace_period {
            return Decision::Continue;
        }
        let mut averages: Vec<f64> = self
            .results
            .iter()
            .filter(|(other, results)| {
                **other != trial && results.last().is_some_and(|(i, _)| *i >= iteration)
            })
            .map(|(_, results)| {
                let upto: Vec<f64> = results
                    .iter()
                    .filter(|(i, _)| *i <= iteration)
                    .map(|(_, s)| *s)
                    .collect();
                upto.iter().sum::<f64>() / upto.len().max(1) as f64
            })
            .collect();
        if averages.len() < self.min_samples_required {
            return Decision::Continue;
        }
        averages.sort_by(f64::total_cmp);
        let n = averages.len();
        let median = if n % 2 == 1 {
            averages[n / 2]
        } else {
            (averages[n / 2 - 1] + averages[n / 2]) / 2.0
        };
        let best = self.results[&trial]
            .iter()
            .map(|(_, s)| *s)
            .fold(f64::NEG_INFINITY, f64::max);
        if best < median {
            Decision::Stop
        } else {
            Decision::Continue
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::{Continue, Stop};

    #[test]
    fn a_trial_below_the_median_of_running_averages_stops() {
        let mut rule = MedianStopping::new(2, 2).unwrap();
        // Trials 0 and 1: scores 1, 3 and 2, 4 at iterations 1, 2.
        assert_eq!(rule.on_result(0, 1, 1.0), Continue);
        assert_eq!(rule.on_result(1, 1, 2.0), Continue);
        // Iteration 2 of trial 0: no other trial has reached 2 yet.
        assert_eq!(rule.on_result(0, 2, 3.0), Continue);
        assert_eq!(
            rule.on_result(1, 2, 4.0),
            Continue,
            "one other trial: too few"
        );
        // Trial 2 at iteration 1: within the grace period.
        assert_eq!(rule.on_result(2, 1, 0.5), Continue);
        // At 2: the others' running averages are 2 and 3, median 2.5;
        // trial 2's best is 2.4.
        assert_eq!(rule.on_result(2, 2, 2.4), Stop);
        // Trial 3 at 2: the others' averages are 2, 3 and 1.45, median 2;
        // its best, 2.5, is not below it.
        assert_eq!(rule.on_result(3, 1, 2.5), Continue);
        assert_eq!(rule.on_result(3, 2, 0.0), Continue);
        assert!(MedianStopping::new(1, 0).is_err());
    }
}
