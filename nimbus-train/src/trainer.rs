//! [`TrainLoop`], [`Trainer`] and the registry's table of loops.

use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;

use actix::Actor;

use nimbus::actor::{Registry, Wire};

use crate::supervisor::{Fit, RunPlan, Stop, TrainEvent, TrainObserver, TrainerSupervisor};
use crate::worker::{
    AbortTraining, CollectiveChunk, HealGroup, NcclUniqueId, PollTraining, StartTraining,
    TrainerWorker,
};
use crate::{RunConfig, ScalingConfig, TrainContext, TrainError, TrainResult};

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

/// Registers training loops in a program's [`Registry`]:
/// `Registry::new().train_loop::<MyLoop>()` (bring the trait into scope
/// with `use nimbus_train::TrainRegistry;`).
pub trait TrainRegistry {
    /// Registers training loop `L` (and the trainer's worker actor), so
    /// worker processes started from this program can run it.
    fn train_loop<L: TrainLoop>(self) -> Self;
}

impl TrainRegistry for Registry {
    fn train_loop<L: TrainLoop>(self) -> Self {
        self.actor::<TrainerWorker>()
            .message::<TrainerWorker, StartTraining>()
            .message::<TrainerWorker, PollTraining>()
            .message::<TrainerWorker, AbortTraining>()
            .message::<TrainerWorker, HealGroup>()
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
    stop: StopHandle,
    _loop: PhantomData<L>,
}

/// Stops a running [`Trainer`] from any thread (a tuner stopping a trial):
/// its workers are stopped, its placement group removed, and `fit`
/// returns the run so far, without an error (unless a failure that ends
/// the run came first). An attempt being launched (its placement group
/// awaited, up to `placement_timeout`) is stopped once it has launched. A
/// stop before `fit` makes it return at once.
#[derive(Clone, Debug)]
pub struct StopHandle(Arc<tokio::sync::watch::Sender<bool>>);

impl StopHandle {
    fn new() -> Self {
        StopHandle(Arc::new(tokio::sync::watch::channel(false).0))
    }

    /// Stops the run.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn stopped(&self) -> bool {
        *self.0.borrow()
    }
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
            stop: StopHandle::new(),
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

    /// A handle that stops the job while `fit` runs.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
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
        if let Err(e) = self.scaling.nccl.validate() {
            return failed(e);
        }
        if self.stop.stopped() {
            return TrainResult {
                error: None,
                ..failed(TrainError::Aborted(String::new()))
            };
        }
        let mut faults = self.run.faults.clone();
        match nimbus::train::faults::TrainingFault::from_env() {
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
        let mut stop = self.stop.0.subscribe();
        let stopper = supervisor.clone();
        let stopping = actix::spawn(async move {
            if stop.wait_for(|stopped| *stopped).await.is_ok() {
                stopper.do_send(Stop);
            }
        });
        let fitted = supervisor.send(Fit).await;
        stopping.abort();
        match fitted {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => failed(e),
            Err(e) => failed(TrainError::Aborted(format!("the supervisor is gone: {e}"))),
        }
    }
}
