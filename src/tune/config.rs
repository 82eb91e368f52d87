//! An experiment's settings ([`TuneConfig`]) and which way its metric is
//! better ([`Mode`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::schedule::SchedulerConfig;
use super::search::SearchConfig;
use super::TuneError;

/// Whether higher or lower values of the metric are better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Higher is better (accuracy).
    Max,
    /// Lower is better (loss).
    Min,
}

impl Mode {
    /// `value` as a score where higher is better.
    pub fn score(self, value: f64) -> f64 {
        match self {
            Mode::Max => value,
            Mode::Min => -value,
        }
    }
}

/// An experiment's settings.
#[derive(Clone, Debug)]
pub struct TuneConfig {
    /// The metric the scheduler and `best_result` compare.
    pub metric: String,
    /// Whether higher or lower is better.
    pub mode: Mode,
    /// Draws per grid point (trials = `num_samples` × grid points).
    pub num_samples: usize,
    /// Trials running at once (each holds a runner).
    pub max_concurrent_trials: usize,
    /// CPUs each trial's runner holds.
    pub cpus_per_trial: f64,
    /// Which trials go on.
    pub scheduler: SchedulerConfig,
    /// Which configs come next.
    pub search: SearchConfig,
    /// Seeds the search.
    pub seed: u64,
    /// Failures a trial may have before it ends in `Error`.
    pub max_failures: u32,
    /// A trial running longer is stopped as failed.
    pub trial_timeout: Option<Duration>,
    /// The whole experiment's time: then running trials are stopped and
    /// no new one starts.
    pub time_budget: Option<Duration>,
    /// A trial stops after this many results.
    pub stop_iterations: Option<u64>,
    /// How often the progress table is shown on standard error (`None`:
    /// never).
    pub progress_every: Option<Duration>,
}

impl TuneConfig {
    /// Ray Tune's defaults: one sample, FIFO, 1 CPU per trial, as many
    /// trials at once as… 2 (set `max_concurrent_trials`).
    pub fn new(metric: impl Into<String>, mode: Mode) -> Self {
        TuneConfig {
            metric: metric.into(),
            mode,
            num_samples: 1,
            max_concurrent_trials: 2,
            cpus_per_trial: 1.0,
            scheduler: SchedulerConfig::Fifo,
            search: SearchConfig::Basic,
            seed: 0,
            max_failures: 0,
            trial_timeout: None,
            time_budget: None,
            stop_iterations: None,
            progress_every: Some(Duration::from_secs(5)),
        }
    }

    /// Sets `num_samples`.
    pub fn num_samples(mut self, n: usize) -> Self {
        self.num_samples = n;
        self
    }

    /// Sets `max_concurrent_trials`.
    pub fn max_concurrent_trials(mut self, n: usize) -> Self {
        self.max_concurrent_trials = n;
        self
    }

    /// Sets `cpus_per_trial`.
    pub fn cpus_per_trial(mut self, cpus: f64) -> Self {
        self.cpus_per_trial = cpus;
        self
    }

    /// Sets the scheduler.
    pub fn scheduler(mut self, scheduler: SchedulerConfig) -> Self {
        self.scheduler = scheduler;
        self
    }

    /// Sets the searcher.
    pub fn search(mut self, search: SearchConfig) -> Self {
        self.search = search;
        self
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets `max_failures`.
    pub fn max_failures(mut self, n: u32) -> Self {
        self.max_failures = n;
        self
    }

    /// Sets `trial_timeout`.
    pub fn trial_timeout(mut self, timeout: Duration) -> Self {
        self.trial_timeout = Some(timeout);
        self
    }

    /// Sets `time_budget`.
    pub fn time_budget(mut self, budget: Duration) -> Self {
        self.time_budget = Some(budget);
        self
    }

    /// Sets `progress_every` (`None`: no progress table).
    pub fn progress_every(mut self, every: Option<Duration>) -> Self {
        self.progress_every = every;
        self
    }

    /// Sets `stop_iterations`.
    pub fn stop_iterations(mut self, n: u64) -> Self {
        self.stop_iterations = Some(n);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), TuneError> {
        let bad = |s: &str| Err(TuneError::BadConfig(s.to_string()));
        if self.metric.is_empty() {
            return bad("TuneConfig::metric is empty: name the metric to optimise");
        }
        if self.num_samples == 0 {
            return bad("TuneConfig::num_samples must be at least 1");
        }
        if self.max_concurrent_trials == 0 {
            return bad("TuneConfig::max_concurrent_trials must be at least 1");
        }
        if self.trial_timeout.is_some_and(|t| t.is_zero()) {
            return bad("TuneConfig::trial_timeout must be more than 0 (None: no timeout)");
        }
        if self.time_budget.is_some_and(|t| t.is_zero()) {
            return bad("TuneConfig::time_budget must be more than 0 (None: no budget)");
        }
        if !(self.cpus_per_trial.is_finite() && self.cpus_per_trial >= 0.0) {
            return bad("TuneConfig::cpus_per_trial must be a finite number >= 0");
        }
        Ok(())
    }
}
