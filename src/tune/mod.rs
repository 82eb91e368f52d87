//! Hyperparameter search, as Ray Tune: a [`Tuner`] samples configs from a
//! [`SearchSpace`], runs each as a trial of a [`Trainable`] in a worker
//! process, stops bad trials early ([`SchedulerConfig::Asha`]) or evolves
//! a population ([`SchedulerConfig::Pbt`]), and returns a [`ResultGrid`].
//!
//! Files: `space.rs` (parameters and sampling), `search/` (which config
//! comes next: random and grid, TPE), `schedule/` (which trial goes on:
//! FIFO, ASHA, asynchronous HyperBand, median stopping, PBT; plain state
//! machines), `trial.rs` (the trainable, its context and the
//! `TrialRunner` actor), `checkpoint.rs` (a trial's saved state),
//! `experiment.rs` (the trials' records and the
//! experiment directory's files), `config.rs` (`TuneConfig`), `tuner/`
//! (the driver's loop that ties them together), `progress.rs` (the
//! progress table it shows), `to_head.rs` (each trial as a run on the
//! dashboard's training page).
//!
//! ```no_run
//! use nimbus::tune::{self, Metrics, Mode, SearchSpace, Trainable, TrialContext, TuneConfig, TuneRegistry, Tuner};
//!
//! struct Quadratic;
//! impl Trainable for Quadratic {
//!     const NAME: &'static str = "example.Quadratic";
//!     type Config = serde_json::Value;
//!     fn run(config: serde_json::Value, ctx: &mut TrialContext) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!         let x = config["x"].as_f64().unwrap_or(0.0);
//!         for step in 1..=10 {
//!             ctx.report(Metrics::from([("loss".into(), (x - 3.0).powi(2) / step as f64)]))?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! fn main() -> anyhow::Result<()> {
//!     let driver = nimbus::init(nimbus::actor::Registry::new().trainable::<Quadratic>())?;
//!     actix::System::new().block_on(async {
//!         driver.connect().await?;
//!         let space = SearchSpace::new().param("x", tune::uniform(0.0, 10.0));
//!         let config = TuneConfig::new("loss", Mode::Min).num_samples(20);
//!         let grid = Tuner::<Quadratic>::new(space, config, "quadratic", "/tmp/tune").fit().await?;
//!         println!("best: {:?}", grid.best_result().map(|t| &t.config));
//!         Ok(())
//!     })
//! }
//! ```

pub mod checkpoint;
mod config;
mod experiment;
mod progress;
mod schedule;
mod search;
pub mod space;
mod to_head;
mod trial;
mod tuner;

use std::path::PathBuf;

pub use checkpoint::TrialCheckpoint;
pub use config::{Mode, TuneConfig};
pub use experiment::{
    ExploitRecord, ResultGrid, ResultLine, TrialRecord, TrialStatus, LOCK_FILE, RESULT_FILE,
    STATE_FILE,
};
pub use schedule::{
    Asha, Decision, Fifo, HyperBand, MedianStopping, Pbt, PbtConfig, Scheduler, SchedulerConfig,
};
pub use search::{BasicSearch, SearchConfig, Searcher, Tpe, TpeConfig, TrialConfig};
pub use space::{
    choice, constant, derived, grid, loguniform, normal, quniform, randint, uniform, Domain,
    SearchSpace,
};
pub use trial::{
    Metrics, PollTrial, ReportError, RunTrial, StopTrial, Trainable, TrialContext, TrialEnd,
    TrialProgress, TrialRefusal, TrialResult, TrialRunner, TrialStopped, TuneRegistry,
};
pub use tuner::{
    Tuner, BUDGET_GRACE, DEATH_WAIT, POLL_DEADLINE, POLL_WAIT, STATE_EVERY, TIMEOUT_GRACE,
};

use crate::actor::SpawnError;

/// Why an experiment could not run or was ended.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// A search-space parameter no value could be drawn from.
    #[error("search space parameter {param:?} {detail}")]
    BadSpace {
        /// Its path (`outer.inner` for nested ones).
        param: String,
        /// What is wrong.
        detail: String,
    },
    /// Scheduler settings that are refused.
    #[error("scheduler settings refused: {0} (TuneConfig::scheduler)")]
    BadScheduler(String),
    /// Experiment settings that are refused.
    #[error("tune settings refused: {0}")]
    BadConfig(String),
    /// The experiment directory already holds an experiment.
    #[error("{} already holds an experiment ({STATE_FILE}); give this one another name (Tuner::new) or move that one away", .0.display())]
    ExperimentExists(PathBuf),
    /// `Tuner::restore` was given a directory without an experiment.
    #[error("{} holds no experiment ({STATE_FILE} is missing): give Tuner::restore the directory of an earlier fit, storage_path/name", .0.display())]
    NoExperiment(PathBuf),
    /// An experiment file that cannot be read back.
    #[error("experiment file {path} is not what this build writes: {detail}")]
    BadState {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A file of the experiment could not be written.
    #[error("experiment file {path}: {what}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// No trial runner could be started.
    #[error("cannot start a trial runner: {0}")]
    Spawn(#[from] SpawnError),
    /// A trial's results lack the metric the experiment optimises.
    #[error("trial {trial} reported {reported:?} but no {metric:?}: TuneConfig's metric must name a metric the trainable reports")]
    UnknownMetric {
        /// The experiment's metric.
        metric: String,
        /// The trial.
        trial: u64,
        /// The metrics it did report.
        reported: Vec<String>,
    },
    /// A PBT exploit could not copy the better trial's checkpoint.
    #[error("trial {trial} cannot take trial {from}'s checkpoint (PBT exploit): {detail}")]
    Exploit {
        /// The trial exploiting.
        trial: u64,
        /// The better trial.
        from: u64,
        /// Why.
        detail: String,
    },
    /// A runner refused a trial: this program cannot run the trainable.
    #[error("a trial runner refused the trial: {0}")]
    Refused(TrialRefusal),
    /// Another process holds the experiment directory.
    #[error("{} is in use by another tuner (its lock file {LOCK_FILE} is held): wait for it to end, or stop it", .0.display())]
    ExperimentInUse(PathBuf),
    /// Every trial runner was lost and none could be started again.
    #[error("every trial runner was lost: {0}")]
    RunnersLost(String),
}
