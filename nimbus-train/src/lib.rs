//! nimbus-train: data-parallel training across a nimbus cluster, what Ray
//! Train's `TorchTrainer` does, as actors, with libtorch (`tch`).
//!
//! It is a crate of its own so that only programs that train link
//! libtorch: the `nimbus` CLI and node daemon, and programs that use
//! actors, tasks and objects only (the `nimbus` crate), do not. It builds
//! on `nimbus`'s public API alone, and re-exports `nimbus::train` (the fault
//! rules, results, sampler and parameter aggregator that need no libtorch),
//! so a training program imports everything from here.
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
//!   (synchronous averaging or asynchronous updates) instead of allreduce;
//! - [`tune::TrainerTrainable`] makes each trial of a `nimbus::tune`
//!   experiment a whole run.
//!
//! Files: `collective/` (the `Collective` trait and its backends),
//! `sampler.rs` (`DistributedSampler`), `config.rs` (`ScalingConfig`,
//! `RunConfig`, `TrainResult`), `aggregator.rs`, `context.rs`
//! (`TrainContext`), `optim.rs` (a checkpointable `Sgd`), `progress.rs`
//! (what a loop has done, shared with whoever watches it), `worker.rs`
//! (`TrainerWorker`), `supervisor/` (`TrainerSupervisor`; `policy.rs`,
//! `launch.rs`, `watch.rs`), `checkpoint/` (format, atomic save,
//! verification; `CheckpointReporter`), `trainer.rs` (`TrainLoop`,
//! `Trainer` and [`TrainRegistry::train_loop`]; the loops are the
//! registry's `LoopTable`), `tune.rs` (runs as Tune trials). The sampler, the aggregator, the fault rules
//! and the results files are `nimbus::train`'s (`src/train/` of the
//! `nimbus` crate). The MNIST example's datasets live with the example
//! (`nimbus-train/examples/train_mnist/data/`).
//!
//! The protocols live with their code: an attempt, its failures and
//! restarts in `supervisor/mod.rs` (launch and teardown in
//! `supervisor/launch.rs`, the decisions in `supervisor/policy.rs`), a
//! step in `context.rs`, the collectives in [`collective`], checkpoints in
//! `checkpoint/`, training faults in [`faults`].
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
//! use nimbus_train::{Metrics, RunConfig, ScalingConfig, TrainContext, TrainLoop, TrainRegistry, Trainer, LoopResult};
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

pub mod checkpoint;
pub mod collective;
mod config;
mod context;
mod error;
pub mod heal;
mod optim;
mod progress;
mod supervisor;
mod trainer;
pub mod tune;
mod worker;

pub use checkpoint::{
    Checkpoint, CheckpointError, CheckpointReporter, NoSpace, NotShared, SavedCheckpoint,
};
pub use config::{
    CheckpointConfig, CollectiveBackend, Metrics, NcclSettings, RunConfig, ScalingConfig,
    ScoreOrder, TrainResult, WorkerCount,
};
pub use context::{DistributedModel, Ranks, TrainContext};
pub use error::{LoopFailed, TrainError, WorkerRefusal};
pub use optim::Sgd;
pub use progress::{ProgressReport, WorkerEvent};
pub use supervisor::{TrainEvent, TrainObserver, TrainerSupervisor};
pub(crate) use trainer::{LoopFn, LoopTable};
pub use trainer::{LoopResult, StopHandle, TrainLoop, TrainRegistry, Trainer};
pub use worker::{
    AbortTraining, Assignment, GroupSpec, PollTraining, StartTraining, TrainerWorker,
};

pub use nimbus::train::{
    faults, results, Aggregation, AggregatorArgs, AggregatorRefusal, DistributedSampler,
    ParameterAggregator, Params, Pull, PushAverage, PushGradient, Update,
};

/// The libtorch bindings nimbus-train is built against, so training code
/// uses the same version.
pub use tch;
