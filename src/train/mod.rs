//! Data-parallel training across the cluster: what Ray Train's
//! `TorchTrainer` does, as actors.
//!
//! The user writes one training loop ([`TrainLoop`]) against libtorch and a
//! [`TrainContext`]; [`Trainer::fit`] runs it on N workers:
//!
//! - [`TrainerSupervisor`] (in the driver) reserves a placement group,
//!   spawns one [`TrainerWorker`] per bundle, watches them, and restarts the
//!   whole group from the latest valid checkpoint on any failure;
//! - each [`TrainerWorker`] (its own worker process) runs the loop on a
//!   thread of its own; the workers average gradients through a
//!   [`collective`] group among themselves;
//! - rank 0 writes checkpoints ([`checkpoint`]) atomically under
//!   `storage_path/<run name>/`, and the [`CheckpointReporter`] keeps the
//!   best and knows the latest valid one;
//! - a [`ParameterAggregator`] serves parameter-server style training
//!   (synchronous averaging or asynchronous updates) instead of allreduce.
//!
//! Files: `collective/` (the `Collective` trait and its backends),
//! `sampler.rs` (`DistributedSampler`), `config.rs` (`ScalingConfig`,
//! `RunConfig`, `TrainResult`), `aggregator.rs`, `context.rs`
//! (`TrainContext`), `optim.rs` (a checkpointable `Sgd`), `progress.rs`
//! (what a loop has done, shared with whoever watches it), `worker.rs`
//! (`TrainerWorker`), `supervisor/` (`TrainerSupervisor`; `policy.rs`,
//! `launch.rs`, `watch.rs`), `checkpoint/` (format, atomic save,
//! verification; `CheckpointReporter`), `faults.rs`; this file has
//! `TrainLoop`, `Trainer` and `Registry::train_loop` (the loops are the
//! registry's `LoopTable`). Everything but the collectives, the sampler,
//! the aggregator and the fault rules needs the `torch` feature. The MNIST
//! example's datasets live with the example (`examples/train_mnist/data/`).
//!
//! The protocols live with their code: an attempt, its failures and
//! restarts in `supervisor/mod.rs` (launch and teardown in
//! `supervisor/launch.rs`, the decisions in `supervisor/policy.rs`), a
//! step in `context.rs`, the collectives in [`collective`], checkpoints in
//! `checkpoint/`, training faults in `faults.rs`.
//!
//! **Bit-exact resume.** On CPU with one libtorch thread per worker, the
//! training step is deterministic given parameters, optimizer state and
//! the batch, and the reduction order is fixed; the sampler's shuffle is a
//! pure function of seed and epoch, and the checkpoint holds the epoch and
//! batch position (and the optimizer's momentum, `Sgd`); initial
//! weights come from rank 0 (`prepare_model` broadcasts them). So a run
//! restored from any checkpoint repeats the uninterrupted run's steps bit
//! for bit (tests compare losses and a SHA-256 of the final parameters,
//! `TrainResult::final_parameters_sha256`).
//!
//! ```no_run
//! use nimbus::train::{Metrics, RunConfig, ScalingConfig, TrainContext, TrainLoop, Trainer, LoopResult};
//!
//! struct MyLoop;
//! impl TrainLoop for MyLoop {
//!     const NAME: &'static str = "my.Loop";
//!     type Config = u32; // epochs
//!     fn run(epochs: u32, ctx: &mut TrainContext) -> LoopResult {
//!         for epoch in 0..epochs {
//!             ctx.report(Metrics::from([("epoch".into(), epoch as f64)]), None)?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! fn main() -> anyhow::Result<()> {
//!     let registry = nimbus::actor::Registry::new().train_loop::<MyLoop>();
//!     let driver = nimbus::init(registry)?;
//!     actix::System::new().block_on(async {
//!         driver.connect().await?;
//!         let result = Trainer::<MyLoop>::new(3, ScalingConfig::workers(2), RunConfig::new("demo", "/tmp/runs"))
//!             .fit()
//!             .await;
//!         assert!(result.error.is_none());
//!         Ok(())
//!     })
//! }
//! ```

mod aggregator;
pub mod collective;
pub mod faults;
pub mod results;
mod sampler;

pub use aggregator::{
    Aggregation, AggregatorArgs, AggregatorRefusal, ParameterAggregator, Params, Pull, PushAverage,
    PushGradient, Update,
};
pub use sampler::DistributedSampler;

#[cfg(feature = "torch")]
pub mod checkpoint;
#[cfg(feature = "torch")]
mod config;
#[cfg(feature = "torch")]
mod context;
#[cfg(feature = "torch")]
mod error;
#[cfg(feature = "torch")]
mod optim;
#[cfg(feature = "torch")]
mod progress;
#[cfg(feature = "torch")]
mod supervisor;
#[cfg(feature = "torch")]
mod worker;

#[cfg(feature = "torch")]
pub use checkpoint::{
    Checkpoint, CheckpointError, CheckpointReporter, NoSpace, NotShared, SavedCheckpoint,
};
#[cfg(feature = "torch")]
pub use config::{
    CheckpointConfig, CollectiveBackend, Metrics, RunConfig, ScalingConfig, ScoreOrder,
    TrainResult, WorkerCount,
};
#[cfg(feature = "torch")]
pub use context::{DistributedModel, Ranks, TrainContext};
#[cfg(feature = "torch")]
pub use error::{LoopFailed, TrainError, WorkerRefusal};
#[cfg(feature = "torch")]
pub use optim::Sgd;
#[cfg(feature = "torch")]
pub use progress::{ProgressReport, WorkerEvent};
#[cfg(feature = "torch")]
pub use supervisor::{TrainEvent, TrainObserver, TrainerSupervisor};
#[cfg(feature = "torch")]
pub use worker::{
    AbortTraining, Assignment, GroupSpec, PollTraining, StartTraining, TrainerWorker,
};

#[cfg(feature = "torch")]
pub(crate) use trainer::{LoopFn, LoopTable};
#[cfg(feature = "torch")]
pub use trainer::{LoopResult, TrainLoop, Trainer};

#[cfg(feature = "torch")]
mod trainer {
    use std::marker::PhantomData;
    use std::path::PathBuf;
    use std::sync::Arc;

    use actix::Actor;

    use super::supervisor::{Fit, RunPlan, TrainEvent, TrainObserver, TrainerSupervisor};
    use super::worker::{
        AbortTraining, CollectiveChunk, NcclUniqueId, PollTraining, StartTraining, TrainerWorker,
    };
    use super::{RunConfig, ScalingConfig, TrainContext, TrainError, TrainResult};
    use crate::actor::{Registry, Wire};

    /// What a training loop returns: any error, reported with its message.
    pub type LoopResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// A registered loop, type-erased: config bytes in.
    pub(crate) type LoopFn =
        Arc<dyn Fn(&[u8], &mut TrainContext) -> Result<(), TrainError> + Send + Sync>;

    /// A user's training loop: the same code runs on every worker, with 1,
    /// 2 or N workers, on CPU or GPU.
    pub trait TrainLoop: 'static {
        /// Stable name, the same in every build of the program.
        const NAME: &'static str;
        /// The loop's configuration, sent to every worker.
        type Config: Wire + Clone;
        /// The loop. Resume from `ctx.checkpoint()` when there is one.
        fn run(config: Self::Config, ctx: &mut TrainContext) -> LoopResult;
    }

    fn entry<L: TrainLoop>() -> LoopFn {
        Arc::new(|bytes: &[u8], ctx: &mut TrainContext| {
            let config: L::Config = rmp_serde::from_slice(bytes).map_err(|e| {
                TrainError::Config(format!("{}: cannot decode the loop config: {e}", L::NAME))
            })?;
            L::run(config, ctx).map_err(|e| match e.downcast::<TrainError>() {
                Ok(e) => *e,
                Err(e) => TrainError::Loop(e.to_string()),
            })
        })
    }

    impl Registry {
        /// Registers training loop `L` (and the trainer's worker actor), so
        /// worker processes started from this program can run it.
        pub fn train_loop<L: TrainLoop>(self) -> Self {
            self.actor::<TrainerWorker>()
                .message::<TrainerWorker, StartTraining>()
                .message::<TrainerWorker, PollTraining>()
                .message::<TrainerWorker, AbortTraining>()
                .message::<TrainerWorker, CollectiveChunk>()
                .message::<TrainerWorker, NcclUniqueId>()
                .extend(|table: &mut LoopTable| {
                    table.0.insert(L::NAME, entry::<L>());
                })
        }
    }

    /// The training loops a program registered, by name (its table in the
    /// [`Registry`]).
    #[derive(Clone, Default)]
    pub(crate) struct LoopTable(std::collections::HashMap<&'static str, LoopFn>);

    impl LoopTable {
        /// The loop registered as `name` in `registry`.
        pub(crate) fn lookup(registry: &Registry, name: &str) -> Option<LoopFn> {
            registry.table::<LoopTable>()?.0.get(name).cloned()
        }
    }

    /// A training job: loop `L` with its config, scaled and stored as told.
    pub struct Trainer<L: TrainLoop> {
        config: L::Config,
        scaling: ScalingConfig,
        run: RunConfig,
        resume_from: Option<PathBuf>,
        observer: Option<TrainObserver>,
        _loop: PhantomData<L>,
    }

    impl<L: TrainLoop> Trainer<L> {
        /// A job running `L` with `config`.
        pub fn new(config: L::Config, scaling: ScalingConfig, run: RunConfig) -> Self {
            Trainer {
                config,
                scaling,
                run,
                resume_from: None,
                observer: None,
                _loop: PhantomData,
            }
        }

        /// Starts from this checkpoint directory (of this or another run).
        pub fn resume_from_checkpoint(mut self, path: impl Into<PathBuf>) -> Self {
            self.resume_from = Some(path.into());
            self
        }

        /// Calls `observer` with every [`TrainEvent`] while the job runs.
        pub fn on_event(mut self, observer: impl FnMut(&TrainEvent) + 'static) -> Self {
            self.observer = Some(Box::new(observer));
            self
        }

        /// Runs the job to the end: success, or failures beyond
        /// `max_failures` (then `error` says why, the first failure first).
        /// Call it inside the actix system of the driver.
        pub async fn fit(self) -> TrainResult {
            let run_dir = self.run.run_dir();
            let failed = |error: TrainError| TrainResult {
                metrics: None,
                metrics_history: Vec::new(),
                checkpoint: None,
                best_checkpoints: Vec::new(),
                path: run_dir.clone(),
                restarts: 0,
                workers: 0,
                error: Some(error),
            };
            let config = match rmp_serde::to_vec_named(&self.config) {
                Ok(config) => config,
                Err(e) => {
                    return failed(TrainError::Config(format!(
                        "cannot encode the loop config: {e}"
                    )))
                }
            };
            let mut faults = self.run.faults.clone();
            match super::faults::TrainingFault::from_env() {
                Ok(from_env) => faults.extend(from_env),
                Err(e) => return failed(TrainError::FaultPlan(e)),
            }
            let plan = RunPlan {
                faults,
                loop_name: L::NAME,
                config,
                scaling: self.scaling,
                run: self.run,
                local: entry::<L>(),
                resume_from: self.resume_from,
            };
            let supervisor = TrainerSupervisor::new(plan, self.observer).start();
            match supervisor.send(Fit).await {
                Ok(Ok(result)) => result,
                Ok(Err(e)) => failed(e),
                Err(e) => failed(TrainError::Aborted(format!("the supervisor is gone: {e}"))),
            }
        }
    }
}
