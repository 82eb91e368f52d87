//! The trial side: a [`Trainable`] (the user's function), the
//! [`TrialContext`] it reports through, and the [`TrialRunner`] actor that
//! runs trials, one at a time, in a worker process the tuner reuses from
//! trial to trial (Ray's `reuse_actors`: a short trial costs a few calls,
//! not a process start).
//!
//! Protocol between the tuner and a runner:
//! 1. `RunTrial` (trial number, trainable name, config as JSON, trial
//!    directory): refused if a trial still runs there or the trainable is
//!    not registered in this binary; else the function starts on a thread
//!    of its own;
//! 2. `PollTrial { after, wait_ms }` long-polls: it answers the results
//!    reported after the first `after` as soon as there are any, when the
//!    trial ended, or after `wait_ms`. It also says the tuner has decided
//!    on the first `after` results: a `report` returns only once the
//!    tuner has decided on its result (lock-step, as Ray's function
//!    trainables), so a trial never runs ahead of its scheduler;
//! 3. `StopTrial` (sent before the poll that acknowledges the result it
//!    decided on): the waiting `report`, or the next one, returns
//!    [`TrialStopped`]; a function that returns it (`?`) ends as stopped,
//!    not failed. A function that never reports again is ended by the
//!    tuner killing the runner (`TIMEOUT_GRACE` after its trial timeout,
//!    or `BUDGET_GRACE` after the time budget);
//! 4. an error the function returns ends the trial as failed; a panic
//!    also ends its worker process (as any actor's panic does), so the
//!    tuner replaces the runner.

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::checkpoint::{self, CheckpointError, TrialCheckpoint};
use crate::actor::{Registry, RemoteActor, RemoteMessage};
use crate::library::{self, LoopProgress};

/// What a trial reports: metric name to value.
pub type Metrics = BTreeMap<String, f64>;

/// A function trainable: one trial's work, given its config.
pub trait Trainable: 'static {
    /// Stable name, the same in every build of the program.
    const NAME: &'static str;
    /// The trial's config, decoded from the sampled JSON object.
    type Config: DeserializeOwned;
    /// Runs the trial, reporting through `ctx`; return `ctx.report`'s
    /// [`TrialStopped`] (`?`) when the tuner stops it.
    fn run(
        config: Self::Config,
        ctx: &mut TrialContext,
    ) -> Result<(), Box<dyn Error + Send + Sync>>;
}

type TrainableFn = Arc<dyn Fn(&str, &mut TrialContext) -> Result<(), TrialEnd> + Send + Sync>;

/// The trainables this binary registered, by name.
#[derive(Clone, Default)]
struct TrainableTable(HashMap<&'static str, TrainableFn>);

/// Registers trainables (and the runner actor) with a [`Registry`].
pub trait TuneRegistry {
    /// Makes `T` runnable as a trial in this program's worker processes.
    fn trainable<T: Trainable>(self) -> Self;
}

impl TuneRegistry for Registry {
    fn trainable<T: Trainable>(self) -> Self {
        let run: TrainableFn = Arc::new(|config: &str, ctx: &mut TrialContext| {
            let config: T::Config = serde_json::from_str(config).map_err(|e| {
                TrialEnd::BadConfig(format!(
                    "a trial's config does not decode as {}'s Config: {e}; make the search space's parameters match its fields",
                    T::NAME
                ))
            })?;
            match T::run(config, ctx) {
                Ok(()) => Ok(()),
                Err(e) if e.is::<TrialStopped>() => Ok(()),
                Err(e) if matches!(e.downcast_ref(), Some(ReportError::Stopped)) => Ok(()),
                Err(e) => Err(TrialEnd::Failed(e.to_string())),
            }
        });
        self.actor::<TrialRunner>()
            .message::<TrialRunner, RunTrial>()
            .message::<TrialRunner, PollTrial>()
            .message::<TrialRunner, StopTrial>()
            .extend(|table: &mut TrainableTable| {
                table.0.insert(T::NAME, run);
            })
    }
}

/// The tuner stopped this trial (its scheduler, a stopping criterion or
/// the experiment's time budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the tuner stopped this trial")]
pub struct TrialStopped;

/// How a trial ended on its runner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TrialEnd {
    /// The function returned (stopped or not).
    Returned,
    /// The function returned an error: why.
    Failed(String),
    /// The function panicked (its process ends too): the message.
    Panicked(String),
    /// The config does not decode as the trainable's (a mistake in the
    /// search space: the experiment ends).
    BadConfig(String),
    /// The runner refused the trial (the experiment ends).
    Refused(TrialRefusal),
}

/// Why `report_with_checkpoint` did not report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The tuner stopped the trial: return this.
    #[error("the tuner stopped this trial")]
    Stopped,
    /// The checkpoint could not be written (the result was not reported).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl From<TrialStopped> for ReportError {
    fn from(_: TrialStopped) -> Self {
        ReportError::Stopped
    }
}

/// One result, and the checkpoint saved with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialResult {
    /// What was reported.
    pub metrics: Metrics,
    /// The checkpoint saved with it, complete.
    pub checkpoint: Option<TrialCheckpoint>,
}

/// What the trial's thread and the runner share: the trial's results and
/// end, in `nimbus::library`'s loop protocol (a result is an event the
/// tuner acknowledges once it has decided on it).
struct Shared {
    trial: u64,
    progress: LoopProgress<TrialResult, TrialEnd>,
}

/// What a trial's function reports through.
pub struct TrialContext {
    shared: Arc<Shared>,
    dir: PathBuf,
    iteration: u64,
    resume: Option<TrialCheckpoint>,
}

impl TrialContext {
    /// Reports one result (one iteration). `Err(TrialStopped)` once the
    /// tuner has stopped the trial: return it.
    /// Returns once the tuner has decided on it (step 2).
    pub fn report(&mut self, metrics: Metrics) -> Result<(), TrialStopped> {
        self.push(TrialResult {
            metrics,
            checkpoint: None,
        })
    }

    /// Reports one result with a checkpoint of the trial's `state`, written
    /// first (`checkpoint.rs`); a retry, a restored experiment or a PBT
    /// exploit goes on from it ([`restore`](Self::restore)).
    pub fn report_with_checkpoint<S: Serialize + ?Sized>(
        &mut self,
        metrics: Metrics,
        state: &S,
    ) -> Result<(), ReportError> {
        if self.should_stop() {
            return Err(ReportError::Stopped);
        }
        let checkpoint = checkpoint::write(&self.dir, self.iteration + 1, state)?;
        Ok(self.push(TrialResult {
            metrics,
            checkpoint: Some(checkpoint),
        })?)
    }

    /// The state of the checkpoint this run starts from (`None`: it starts
    /// from scratch); its iteration is [`iteration`](Self::iteration).
    pub fn restore<S: DeserializeOwned>(&self) -> Result<Option<S>, CheckpointError> {
        self.resume
            .as_ref()
            .map(|c| checkpoint::read(&c.path))
            .transpose()
    }

    fn push(&mut self, result: TrialResult) -> Result<(), TrialStopped> {
        if self.should_stop() {
            return Err(TrialStopped);
        }
        let progress = &self.shared.progress;
        let number = progress.push(result);
        progress.wait_acked(number);
        self.iteration += 1;
        if self.should_stop() {
            return Err(TrialStopped);
        }
        Ok(())
    }

    /// Whether the tuner has stopped this trial.
    pub fn should_stop(&self) -> bool {
        self.shared.progress.stop_reason().is_some()
    }

    /// The trial's number in its experiment.
    pub fn trial_id(&self) -> u64 {
        self.shared.trial
    }

    /// Results reported so far, counting those before the checkpoint
    /// this run starts from.
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// The trial's own directory (its `params.json` and results files):
    /// where to keep files of its own.
    pub fn trial_dir(&self) -> &Path {
        &self.dir
    }
}

/// Runs trials, one at a time; see the module docs.
pub struct TrialRunner {
    current: Option<Arc<Shared>>,
}

impl Actor for TrialRunner {
    type Context = Context<Self>;
}

impl RemoteActor for TrialRunner {
    const NAME: &'static str = "nimbus.tune.TrialRunner";
    type Args = ();
    fn from_args(_: ()) -> Self {
        TrialRunner { current: None }
    }
}

/// Why a runner refused a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum TrialRefusal {
    /// Trial `running` has not ended on this runner.
    #[error("trial runner busy: trial {running} has not ended")]
    Busy {
        /// The trial still running.
        running: u64,
    },
    /// This binary did not register the trainable.
    #[error("trainable {0:?} is not registered in this program: add .trainable::<T>() to the registry given to nimbus::init")]
    UnknownTrainable(String),
    /// The trial is not the one this runner runs.
    #[error("trial {0} does not run on this runner")]
    NotHere(u64),
    /// Not in a nimbus worker process.
    #[error("the trial runner is not in a nimbus process (nimbus::init was not called)")]
    NotInitialized,
}

/// Step 1: run a trial.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), TrialRefusal>")]
pub struct RunTrial {
    /// The trial's number.
    pub trial: u64,
    /// The trainable's name.
    pub trainable: String,
    /// The config, a JSON object.
    pub config: String,
    /// The trial's directory.
    pub dir: PathBuf,
    /// The checkpoint to start from.
    pub resume: Option<TrialCheckpoint>,
}

impl RemoteMessage for RunTrial {
    const NAME: &'static str = "nimbus.tune.RunTrial";
}

impl Handler<RunTrial> for TrialRunner {
    type Result = Result<(), TrialRefusal>;

    fn handle(&mut self, run: RunTrial, _: &mut Context<Self>) -> Self::Result {
        if let Some(current) = &self.current {
            if !current.progress.ended() {
                return Err(TrialRefusal::Busy {
                    running: current.trial,
                });
            }
        }
        let registry = library::registry().ok_or(TrialRefusal::NotInitialized)?;
        let function = registry
            .table::<TrainableTable>()
            .and_then(|t| t.0.get(run.trainable.as_str()).cloned())
            .ok_or_else(|| TrialRefusal::UnknownTrainable(run.trainable.clone()))?;
        let shared = Arc::new(Shared {
            trial: run.trial,
            progress: LoopProgress::default(),
        });
        self.current = Some(shared.clone());
        let mut ctx = TrialContext {
            shared: shared.clone(),
            dir: run.dir,
            iteration: run.resume.as_ref().map_or(0, |c| c.iteration),
            resume: run.resume,
        };
        let config = run.config;
        std::thread::Builder::new()
            .name(format!("trial-{}", run.trial))
            .spawn(move || {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    function(&config, &mut ctx)
                }));
                let end = match ran {
                    Ok(Ok(())) => TrialEnd::Returned,
                    Ok(Err(end)) => end,
                    Err(panic) => TrialEnd::Panicked(library::panic_text(&*panic)),
                };
                ctx.shared.progress.finish(end);
            })
            .map_err(|e| {
                shared.progress.finish(TrialEnd::Failed(format!(
                    "cannot start the trial's thread: {e}"
                )));
            })
            .ok();
        Ok(())
    }
}

/// What a trial has reported since the poll's `after`, and how it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialProgress {
    /// The new results, in order.
    pub results: Vec<TrialResult>,
    /// Set once the function returned.
    pub end: Option<TrialEnd>,
}

/// Step 2: long-poll a trial's results.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<TrialProgress, TrialRefusal>")]
pub struct PollTrial {
    /// The trial.
    pub trial: u64,
    /// Results already seen.
    pub after: u64,
    /// How long to wait for news, in milliseconds.
    pub wait_ms: u64,
}

impl RemoteMessage for PollTrial {
    const NAME: &'static str = "nimbus.tune.PollTrial";
}

impl Handler<PollTrial> for TrialRunner {
    type Result = ResponseFuture<Result<TrialProgress, TrialRefusal>>;

    fn handle(&mut self, poll: PollTrial, _: &mut Context<Self>) -> Self::Result {
        let current = self.current.clone().filter(|c| c.trial == poll.trial);
        Box::pin(async move {
            let shared = current.ok_or(TrialRefusal::NotHere(poll.trial))?;
            shared.progress.ack(poll.after);
            let wait = Duration::from_millis(poll.wait_ms);
            let polled = shared.progress.poll(poll.after, wait).await;
            Ok(TrialProgress {
                results: polled.events.into_iter().map(|(_, r)| r).collect(),
                end: polled.end,
            })
        })
    }
}

/// Step 3: stop a trial at its next report.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct StopTrial {
    /// The trial.
    pub trial: u64,
}

impl RemoteMessage for StopTrial {
    const NAME: &'static str = "nimbus.tune.StopTrial";
}

impl Handler<StopTrial> for TrialRunner {
    type Result = ();

    fn handle(&mut self, stop: StopTrial, _: &mut Context<Self>) {
        if let Some(current) = self.current.as_ref().filter(|c| c.trial == stop.trial) {
            current.progress.stop("the tuner stopped this trial");
        }
    }
}
