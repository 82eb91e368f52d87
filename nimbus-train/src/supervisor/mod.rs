//! The `TrainerSupervisor` actor: runs a training job as attempts, each a
//! group of `TrainerWorker`s, and restarts the whole group from the latest
//! valid checkpoint when any worker dies, fails or hangs.
//!
//! It receives `Fit` (run the job), `Watched` (progress and deaths, from
//! one watcher task per worker), `NodeJoined` (an elastic run may grow
//! back) and timer ticks (the progress deadline, checked every quarter of
//! `progress_timeout`, between 100 ms and 1 s). One attempt:
//! 1. reserve a placement group of one bundle per worker and spawn a
//!    `TrainerWorker` into each, number the ranks, pick the collective and
//!    send `StartTraining` to every rank (`launch.rs`); the workers form
//!    their collective group among themselves (nothing goes through the
//!    driver);
//! 2. watch every worker (`watch.rs`): a task per worker long-polls its
//!    progress (`PollTraining`, `POLL_WAIT` = 1 s a poll: reports,
//!    checkpoints, steps) and waits for its death (`next_death`); rank 0's
//!    reports become the metrics history, saved checkpoints go to the
//!    `CheckpointReporter` (`Saved`); a fault a worker announces is
//!    reported to the head (`ReportFault`), and the first report of rank 0
//!    after a restart to the head as a recovery (`ReportRecovery`);
//! 3. the first of these ends the attempt: a worker's death (`killed by
//!    signal 9`, `panic: ...`, `node lost: ...`), a loop that returns an
//!    error, a failed checkpoint write, a worker whose progress counter has
//!    not moved for `progress_timeout` (hung), a launch that fails; a
//!    checkpoint that found no room on its filesystem, or that rank 0 saved
//!    where this driver cannot see it (storage not shared between hosts),
//!    ends the whole run after step 4 (`TrainError::StorageFull`,
//!    `StorageNotShared`), keeping the checkpoints already saved; so does
//!    a worker that loaded another libtorch than the driver's
//!    (`TrainError::OtherLibtorch`, at launch);
//! 4. on that failure: `AbortTraining` to every worker (peers blocked in a
//!    collective fail at once), kill every worker (`ActorHandle::kill` →
//!    `KillActor` to its node → SIGKILL, no restart; it returns once the
//!    head has recorded the death, so names and resources are free again),
//!    remove the placement group;
//! 5. then, unless more than `max_failures` failures have been seen (then
//!    `fit` returns `FailuresExhausted` with their count and the first and
//!    last reasons), start the next attempt from the newest checkpoint that
//!    verifies (`Latest`: corrupt ones are skipped; a newer complete one
//!    the failed attempt wrote in the run directory but whose report had
//!    not arrived when the failure did is taken first:
//!    `checkpoint::unreported`), else from
//!    `resume_from_checkpoint` or the start. The metrics history is cut
//!    back to that checkpoint's report index, so it reads as one
//!    uninterrupted run.
//!
//! Elastic runs (a worker range): resources that vanish (a lost node) are
//! not waited for; the attempt starts with the most workers that fit
//! (`launch.rs`). While it runs below its maximum, a task long-polls the
//! head's events; when a node joins, the supervisor reserves (and at once
//! releases) a placement group for the missing workers, and if that fits
//! it ends the attempt and restarts at full size from the latest checkpoint
//! (`TrainEvent::Rescaling`; a restart that counts no failure).
//!
//! Peer heal (`heal/mod.rs`): a worker that dies while its group can heal
//! is replaced and healed from a live peer instead (`heal.rs` carries it
//! out); the attempt goes on and no step is redone.
//!
//! Which attempt is live, when it failed, hung or finished, and what
//! follows are decided by the plain state machine in `policy.rs`; this
//! actor carries its decisions out. A run of 0 workers runs the loop on a
//! thread of the driver (local mode).
//!
//! The rooms: this file is the actor and its messages; `attempts.rs`
//! starts, ends and restarts attempts, `polling.rs` follows their
//! workers, `heal.rs` replaces a lost worker from a live peer, `launch.rs`
//! and `watch.rs` start and watch workers, `events.rs` is what a run tells
//! its observer.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::checkpoint::{self, Best, CheckpointReporter, Latest};
use super::faults::TrainingFault;
use super::progress::{Progress, ProgressReport};
use super::results::{self, ResultsLog};
use super::worker::{self, TrainerWorker};
use super::{LoopFn, Metrics, RunConfig, ScalingConfig, TrainError, TrainResult, WorkerCount};
use nimbus::actor::faults::FiredFault;
use nimbus::actor::{self, ActorHandle};
use nimbus::cluster::{RunCheckpoint, RunEvent, RunHeader};
use nimbus::library;
use nimbus::placement::{PlacementError, PlacementGroup};

mod attempts;
mod events;
mod heal;
mod launch;
mod policy;
mod polling;
mod watch;

pub use events::{TrainEvent, TrainObserver};

use launch::ELASTIC_TRY;
use policy::{Attempts, Rescale, StopNow};

/// How long a progress poll waits for news.
const POLL_WAIT: Duration = Duration::from_secs(1);
/// How long the supervisor's calls to its workers (`StartTraining`,
/// `NcclUniqueId`, each `PollTraining` beyond its wait) may take before the
/// worker counts as failed: actor calls have no deadline of their own.
const WORKER_CALL_DEADLINE: Duration = Duration::from_secs(30);

/// What the run is: fixed for its lifetime.
pub(crate) struct RunPlan {
    pub loop_name: &'static str,
    pub config: Vec<u8>,
    pub scaling: ScalingConfig,
    pub run: RunConfig,
    pub local: LoopFn,
    pub resume_from: Option<PathBuf>,
    /// The run config's faults and those of `NIMBUS_TRAINING_FAULTS`.
    pub faults: Vec<TrainingFault>,
}

/// A worker of the current attempt.
#[derive(Clone)]
enum WorkerLink {
    Remote(ActorHandle<TrainerWorker>),
    /// Local mode: the loop runs on a thread of the driver.
    Local(Arc<Progress>),
}

/// The workers of the current attempt, and their resources.
struct Attempt {
    links: Vec<WorkerLink>,
    group: Option<PlacementGroup>,
    /// The node of each rank.
    nodes: Vec<String>,
    /// What every rank was told (a replacement is told the same).
    assignment: worker::Assignment,
    /// Its group heals from a peer (`heal/mod.rs`): shared memory, and the
    /// run allows it.
    heals: bool,
}

/// Supervises one training run; see the module docs.
pub struct TrainerSupervisor {
    plan: Arc<RunPlan>,
    reporter: Addr<CheckpointReporter>,
    history: Vec<(u64, Metrics)>,
    /// The decisions (`policy.rs`).
    attempts: Attempts,
    resume: Option<PathBuf>,
    attempt: Option<Attempt>,
    workers: usize,
    done: Option<oneshot::Sender<TrainResult>>,
    observer: Option<TrainObserver>,
    /// The injected faults that fired: each rule fires once per
    /// run.
    fired: Vec<FiredFault>,
    /// The generation of attempt 0 (`checkpoint/fence.rs`).
    first_generation: u64,
    /// The run's `metrics.jsonl` and `progress.csv` (`results.rs`).
    results: Option<ResultsLog>,
    /// A write to them failed and was logged (the run goes on; the
    /// checkpoints are what a resume needs).
    results_failed: bool,
    /// What the head is told of the run (`nimbus::library::RunReporter`).
    to_head: Option<library::RunReporter>,
}

impl TrainerSupervisor {
    pub(crate) fn new(plan: RunPlan, observer: Option<TrainObserver>) -> Self {
        let reporter = CheckpointReporter::new(plan.run.checkpoint.clone()).start();
        let elastic_max = match plan.scaling.workers {
            WorkerCount::Elastic { max, .. } => Some(max),
            _ => None,
        };
        let attempts = Attempts::new(
            plan.run.max_failures,
            plan.run.progress_timeout,
            elastic_max,
        );
        TrainerSupervisor {
            resume: plan.resume_from.clone(),
            plan: Arc::new(plan),
            reporter,
            history: Vec::new(),
            attempts,
            attempt: None,
            workers: 0,
            done: None,
            observer,
            fired: Vec::new(),
            first_generation: 0,
            results: None,
            results_failed: false,
            to_head: None,
        }
    }

    fn tell(&mut self, event: TrainEvent) {
        if let Some(to_head) = &self.to_head {
            let time_ms = library::now_ms();
            let to_head_event = match &event {
                TrainEvent::Started {
                    attempt,
                    workers,
                    resumed_from,
                    ..
                } => Some(RunEvent::Started {
                    attempt: *attempt,
                    workers: *workers,
                    resumed_from: resumed_from.as_ref().map(|p| p.display().to_string()),
                    time_ms,
                }),
                TrainEvent::CheckpointSaved(saved) => Some(RunEvent::Checkpoint(RunCheckpoint {
                    index: saved.index,
                    path: saved.path.display().to_string(),
                    metrics: saved.metrics.clone(),
                })),
                TrainEvent::Failed { attempt, reason } => Some(RunEvent::Failed {
                    attempt: *attempt,
                    reason: reason.clone(),
                    time_ms,
                }),
                // Reports go from `record`, with their attempt's generation.
                TrainEvent::Reported { .. }
                | TrainEvent::FaultInjected { .. }
                | TrainEvent::Rescaling { .. }
                | TrainEvent::Healing { .. }
                | TrainEvent::Healed { .. } => None,
            };
            if let Some(event) = to_head_event {
                to_head.send(event);
            }
        }
        if let Some(observer) = &mut self.observer {
            observer(&event);
        }
    }

    fn complete(&mut self, error: Option<TrainError>, ctx: &mut Context<Self>) {
        self.attempt = None;
        if self.results.take().is_some() && !self.history.is_empty() {
            let run_dir = self.plan.run.run_dir();
            match results::plot(&run_dir) {
                Ok(plot) => tracing::info!("losses plotted in {}", plot.display()),
                Err(results::ResultsError::NoLoss { .. }) => {}
                Err(e) => tracing::warn!("cannot plot the run's losses: {e}"),
            }
        }
        let reporter = self.reporter.clone();
        let run_dir = self.plan.run.run_dir();
        let history: Vec<Metrics> = self.history.iter().map(|(_, m)| m.clone()).collect();
        let (restarts, workers) = (self.attempts.restarts(), self.workers);
        let done = self.done.take();
        let to_head = self.to_head.take();
        if let Some(to_head) = &to_head {
            to_head.send(RunEvent::Finished {
                error: error.as_ref().map(ToString::to_string),
                time_ms: library::now_ms(),
            });
        }
        ctx.spawn(
            async move {
                if let Some(to_head) = to_head {
                    to_head.finish().await;
                }
                let checkpoint = reporter.send(Latest).await.ok().and_then(|l| l.checkpoint);
                let best_checkpoints = reporter.send(Best).await.unwrap_or_default();
                TrainResult {
                    metrics: history.last().cloned(),
                    metrics_history: history,
                    checkpoint,
                    best_checkpoints,
                    path: run_dir,
                    restarts,
                    workers,
                    error,
                }
            }
            .into_actor(self)
            .map(move |result, _, ctx| {
                if let Some(done) = done {
                    let _ = done.send(result);
                }
                ctx.stop();
            }),
        );
    }
}

impl Actor for TrainerSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let every = (self.plan.run.progress_timeout / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        ctx.run_interval(every, |act, ctx| act.check_progress(ctx));
    }
}

/// A node joined while an elastic run is below its maximum.
#[derive(Message)]
#[rtype(result = "()")]
struct NodeJoined(u64);

impl Handler<NodeJoined> for TrainerSupervisor {
    type Result = ();

    fn handle(&mut self, NodeJoined(id): NodeJoined, ctx: &mut Context<Self>) {
        let Some(extra) = self.attempts.room_wanted(id) else {
            return;
        };
        // Room for the missing workers? Reserve it for a moment to find out.
        let plan = self.plan.clone();
        let probe = async move {
            let bundles = vec![plan.scaling.bundle(); extra];
            match PlacementGroup::create(bundles, plan.scaling.placement, ELASTIC_TRY).await {
                Ok(group) => {
                    let _ = group.remove().await;
                    true
                }
                Err(_) => false,
            }
        };
        ctx.spawn(probe.into_actor(self).map(move |room, act, ctx| {
            if !room {
                return;
            }
            let Some(Rescale { from, to }) = act.attempts.room_found(id) else {
                return;
            };
            tracing::info!(
                "elastic run: room for {to} workers again; restarting from the latest checkpoint"
            );
            act.tell(TrainEvent::Rescaling { from, to });
            act.end_attempt("growing the group", ctx);
        }));
    }
}

/// Runs the job; answers with its result.
#[derive(Message)]
#[rtype(result = "Result<TrainResult, TrainError>")]
pub(crate) struct Fit;

impl Handler<Fit> for TrainerSupervisor {
    type Result = ResponseFuture<Result<TrainResult, TrainError>>;

    fn handle(&mut self, _: Fit, ctx: &mut Context<Self>) -> Self::Result {
        let (done, result) = oneshot::channel();
        self.done = Some(done);
        let run_dir = self.plan.run.run_dir();
        if let Err(e) = std::fs::create_dir_all(&run_dir) {
            let error = TrainError::RunDir {
                path: run_dir,
                source: e,
            };
            self.complete(Some(error), ctx);
        } else {
            let opened = checkpoint::fence::owner(&run_dir)
                .map_err(TrainError::from)
                .and_then(|owner| Ok((owner, ResultsLog::open(&run_dir)?)));
            match opened {
                Ok((owner, results)) => {
                    self.first_generation = owner.map_or(0, |g| g + 1);
                    self.results = Some(results);
                    self.to_head = library::RunReporter::start(RunHeader {
                        id: format!("{:08x}", rand::random::<u32>()),
                        name: self.plan.run.name.clone(),
                        dir: run_dir.display().to_string(),
                        job: library::job().unwrap_or_default(),
                    });
                    self.start_attempt(ctx);
                }
                Err(e) => self.complete(Some(e), ctx),
            }
        }
        Box::pin(async move {
            result
                .await
                .map_err(|_| TrainError::Aborted("the supervisor stopped without a result".into()))
        })
    }
}

/// Stops the run (the trainer's `StopHandle`): the running attempt is
/// torn down and `Fit` answers with the run so far, without an error.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Stop;

impl Handler<Stop> for TrainerSupervisor {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        match self.attempts.stop() {
            Some(StopNow::TearDown) => {
                tracing::info!("training run stopped: stopping its workers");
                self.end_attempt("the run was stopped", ctx);
            }
            Some(StopNow::Complete) => self.complete(None, ctx),
            None => {}
        }
    }
}

/// Which worker: attempt, rank, and the rank's worker number (one more
/// per replacement).
type WorkerId = (u64, usize, u32);

/// News from a worker's watcher.
#[derive(Message)]
#[rtype(result = "()")]
enum Watched {
    Progress(WorkerId, ProgressReport),
    /// It failed, for this reason; `true`: it died (its process is gone).
    Failed(WorkerId, String, bool),
}

impl Handler<Watched> for TrainerSupervisor {
    type Result = ();

    fn handle(&mut self, watched: Watched, ctx: &mut Context<Self>) {
        match watched {
            Watched::Progress(worker, report) => self.polled(worker, report, ctx),
            Watched::Failed(worker, reason, died) => self.worker_lost(worker, reason, died, ctx),
        }
    }
}

/// Errors no restart can fix.
fn fatal(error: &TrainError) -> bool {
    matches!(
        error,
        TrainError::Config(_)
            | TrainError::RunDir { .. }
            | TrainError::Resume { .. }
            | TrainError::ParameterKind { .. }
            | TrainError::Shape { .. }
            | TrainError::Mismatch(_)
            | TrainError::Nccl(_)
            | TrainError::NoGpu { .. }
            | TrainError::OtherLibtorch { .. }
            | TrainError::Placement(PlacementError::Infeasible { .. })
            | TrainError::Spawn(actor::SpawnError::NotRegistered(_))
            | TrainError::Spawn(actor::SpawnError::Unsatisfiable { .. })
            | TrainError::Spawn(actor::SpawnError::NotInitialized)
            | TrainError::Placement(PlacementError::NotInitialized)
    )
}
