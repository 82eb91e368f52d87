//! Trial schedulers: whether a running trial goes on after each result.
//!
//! Plain state machines fed each trial's results in order; scores are
//! normalised by the tuner so that higher is better (`Mode::Min` negates),
//! iterations are the trial's report count (Ray's `training_iteration`).
//!
//! Files: `asha.rs` (asynchronous successive halving), `hyperband.rs`
//! (asynchronous HyperBand: ASHA brackets), `median.rs` (the median
//! stopping rule), `pbt.rs` (population-based training).

mod asha;
mod hyperband;
mod median;
mod pbt;

pub use asha::Asha;
pub use hyperband::HyperBand;
pub use median::MedianStopping;
pub use pbt::{Pbt, PbtConfig};

use super::search::TrialConfig;
use super::TuneError;

/// What a running trial does after a result.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Goes on.
    Continue,
    /// Is stopped (early, or done at `max_t`).
    Stop,
    /// PBT: stops, and goes on from trial `from`'s latest checkpoint with
    /// `config` (`from`'s, explored).
    Exploit {
        /// The better trial whose checkpoint it takes.
        from: u64,
        /// Its new config.
        config: TrialConfig,
    },
}

/// Decides, result by result, which trials go on.
pub trait Scheduler: Send {
    /// Trial `trial` starts with `config` (for schedulers that change
    /// configs).
    fn on_trial_add(&mut self, _trial: u64, _config: &TrialConfig) {}
    /// Trial `trial` reported `score` (higher is better) at `iteration`.
    fn on_result(&mut self, trial: u64, iteration: u64, score: f64) -> Decision;
}

/// Which scheduler an experiment uses.
#[derive(Clone, Debug, Default)]
pub enum SchedulerConfig {
    /// Every trial runs to its end.
    #[default]
    Fifo,
    /// Asynchronous successive halving (`asha.rs`).
    Asha {
        /// Iterations before a trial can first be stopped (the lowest rung).
        grace_period: u64,
        /// η: about 1/η of the trials pass each rung.
        reduction_factor: f64,
        /// Iterations at which every trial stops.
        max_t: u64,
    },
    /// Asynchronous HyperBand (`hyperband.rs`): `brackets` ASHA brackets,
    /// bracket s with grace period `grace_period`·η^s.
    HyperBand {
        /// The first bracket's grace period.
        grace_period: u64,
        /// η, in every bracket.
        reduction_factor: f64,
        /// Iterations at which every trial stops.
        max_t: u64,
        /// How many brackets (Ray's `brackets`).
        brackets: u32,
    },
    /// The median stopping rule (`median.rs`).
    MedianStopping {
        /// Iterations before a trial can be stopped.
        grace_period: u64,
        /// Other trials needed at an iteration to compare with.
        min_samples_required: usize,
    },
    /// Population-based training (`pbt.rs`).
    Pbt(PbtConfig),
}

impl SchedulerConfig {
    /// ASHA with Ray's defaults: `grace_period` 1, `reduction_factor` 4.
    pub fn asha(max_t: u64) -> Self {
        SchedulerConfig::Asha {
            grace_period: 1,
            reduction_factor: 4.0,
            max_t,
        }
    }

    /// The iteration at which the scheduler ends every trial, if it does
    /// (a stop there is the trial's end, not an early stop).
    pub fn max_t(&self) -> Option<u64> {
        match self {
            SchedulerConfig::Asha { max_t, .. } | SchedulerConfig::HyperBand { max_t, .. } => {
                Some(*max_t)
            }
            SchedulerConfig::Fifo
            | SchedulerConfig::MedianStopping { .. }
            | SchedulerConfig::Pbt(_) => None,
        }
    }

    /// The scheduler, or why these settings are refused; `seed` (the
    /// experiment's) seeds HyperBand's brackets.
    pub fn build(&self, seed: u64) -> Result<Box<dyn Scheduler>, TuneError> {
        match self {
            SchedulerConfig::Fifo => Ok(Box::new(Fifo)),
            SchedulerConfig::Asha {
                grace_period,
                reduction_factor,
                max_t,
            } => Ok(Box::new(Asha::new(
                *grace_period,
                *reduction_factor,
                *max_t,
            )?)),
            SchedulerConfig::HyperBand {
                grace_period,
                reduction_factor,
                max_t,
                brackets,
            } => Ok(Box::new(HyperBand::new(
                *grace_period,
                *reduction_factor,
                *max_t,
                *brackets,
                seed,
            )?)),
            SchedulerConfig::MedianStopping {
                grace_period,
                min_samples_required,
            } => Ok(Box::new(MedianStopping::new(
                *grace_period,
                *min_samples_required,
            )?)),
            SchedulerConfig::Pbt(config) => Ok(Box::new(Pbt::new(config.clone())?)),
        }
    }
}

/// Runs every trial to its end.
pub struct Fifo;

impl Scheduler for Fifo {
    fn on_result(&mut self, _: u64, _: u64, _: f64) -> Decision {
        Decision::Continue
    }
}
