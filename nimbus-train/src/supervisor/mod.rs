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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::checkpoint::{
    self, Best, CheckpointReporter, Latest, NotShared, Saved, SavedCheckpoint,
};
use super::faults::TrainingFault;
use super::progress::{Progress, ProgressReport, WorkerEvent};
use super::results::{self, ReportLine, ResultsLog};
use super::worker::{self, TrainerWorker};
use super::{
    CollectiveBackend, LoopFn, Metrics, RunConfig, ScalingConfig, TrainError, TrainResult,
    WorkerCount,
};
use nimbus::actor::faults::FiredFault;
use nimbus::actor::{self, ActorHandle};
use nimbus::cluster::{RunCheckpoint, RunEvent, RunHeader, RunPoint};
use nimbus::library;
use nimbus::placement::{PlacementError, PlacementGroup};

mod heal;
mod launch;
mod policy;
mod watch;

use launch::{launch, stop_workers, Launched, ELASTIC_TRY};
use policy::{Attempts, Failure, Next, Rescale, StopNow, Unrecoverable};
use watch::{watch, watch_for_room};

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

/// What happens during a run, as it happens (for progress displays).
#[derive(Clone, Debug, PartialEq)]
pub enum TrainEvent {
    /// An attempt's workers are training.
    Started {
        /// 0 first, then one per restart.
        attempt: u32,
        /// Its workers (0: local mode).
        workers: usize,
        /// The checkpoint it resumed from.
        resumed_from: Option<PathBuf>,
        /// The collective its workers average gradients with (`None`: local
        /// mode, no collective).
        backend: Option<CollectiveBackend>,
        /// The node each rank runs on, by rank (empty in local mode).
        nodes: Vec<String>,
    },
    /// Rank 0 reported.
    Reported {
        /// The report's index.
        index: u64,
        /// Its metrics.
        metrics: Metrics,
        /// Whether a checkpoint was saved with it (its `CheckpointSaved`
        /// follows once complete, unless the attempt fails first).
        checkpoint: bool,
    },
    /// A checkpoint is complete on disk.
    CheckpointSaved(checkpoint::SavedCheckpoint),
    /// A fault-injection rule fired in a worker.
    FaultInjected {
        /// The fault's kind.
        fault: String,
        /// What it hit (`rank-N`).
        target: String,
        /// What fired it (`step N`).
        trigger: String,
    },
    /// An elastic run is restarting with a different number of workers
    /// (resources came back).
    Rescaling {
        /// Workers now.
        from: usize,
        /// Workers it restarts with.
        to: usize,
    },
    /// Workers died and are being replaced, healed from a live peer
    /// (`heal/mod.rs`): the attempt goes on.
    Healing {
        /// The ranks being replaced.
        ranks: Vec<usize>,
        /// The survivor that sends its state.
        source: usize,
        /// Why (the death).
        reason: String,
    },
    /// Every replaced rank reported: the heal is over.
    Healed {
        /// The ranks it replaced.
        ranks: Vec<usize>,
        /// From the first death it mended to the last replacement's first
        /// report.
        took: Duration,
    },
    /// An attempt failed; the group is being torn down.
    Failed {
        /// The attempt.
        attempt: u32,
        /// Why.
        reason: String,
    },
}

/// Called with every [`TrainEvent`], on the driver's actix thread.
pub type TrainObserver = Box<dyn FnMut(&TrainEvent)>;

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

    fn start_attempt(&mut self, ctx: &mut Context<Self>) {
        let Some(id) = self.attempts.begin() else {
            return;
        };
        let faults = self.unfired_faults();
        // Fence the run directory off from workers of earlier attempts.
        let attempt = self.attempts.restarts();
        if attempt > 0 {
            metrics::counter!("nimbus_train_restarts_total").increment(1);
        }
        let generation = self.first_generation + u64::from(attempt);
        if let Err(e) = checkpoint::fence::claim(&self.plan.run.run_dir(), generation) {
            return self.complete(Some(e.into()), ctx);
        }
        let launch = launch(
            self.plan.clone(),
            id,
            (attempt, generation),
            self.resume.clone(),
            faults,
        );
        ctx.spawn(
            launch
                .into_actor(self)
                .map(move |launched, act, ctx| act.launched(id, launched, ctx)),
        );
    }

    fn launched(
        &mut self,
        id: u64,
        launched: Result<Launched, TrainError>,
        ctx: &mut Context<Self>,
    ) {
        let now = Instant::now();
        let launched = match launched {
            Ok(launched) => launched,
            Err(e) if fatal(&e) => return self.complete(Some(e), ctx),
            Err(e) => {
                if let Some(failure) = self.attempts.launch_failed(id, e.to_string(), now) {
                    self.tell_failed(failure);
                    self.ended(ctx);
                }
                return;
            }
        };
        if !self.attempts.launched(id, launched.links.len(), now) {
            // Stopped while it launched: its workers never train.
            self.attempt = Some(Attempt {
                links: launched.links,
                group: launched.group,
                nodes: launched.nodes,
                assignment: launched.assignment,
                heals: false,
            });
            return self.end_attempt("the run was stopped", ctx);
        }
        self.workers = launched.world_size;
        self.tell(TrainEvent::Started {
            attempt: self.attempts.restarts(),
            workers: launched.world_size,
            resumed_from: self.resume.clone(),
            backend: launched.backend,
            nodes: launched.nodes.clone(),
        });
        let me = ctx.address();
        for (rank, link) in launched.links.iter().enumerate() {
            let worker = (id, rank, 0);
            tokio::spawn(watch(
                me.clone(),
                worker,
                link.clone(),
                launched.seen_events,
            ));
        }
        if self.attempts.room_wanted(id).is_some() {
            tokio::spawn(watch_for_room(me.clone(), id, launched.seen_events));
        }
        let heals =
            self.plan.run.peer_heal && launched.backend == Some(CollectiveBackend::SharedMemory);
        self.attempt = Some(Attempt {
            links: launched.links,
            group: launched.group,
            nodes: launched.nodes,
            assignment: launched.assignment,
            heals,
        });
    }

    /// The run's fault rules that have not fired.
    fn unfired_faults(&self) -> Vec<TrainingFault> {
        self.plan
            .faults
            .iter()
            .filter(|f| !self.fired.contains(&f.fired()))
            .cloned()
            .collect()
    }

    /// A death by a fault rule: it has fired. Its announcement may have
    /// died with the process, so the death tells the observer (the head
    /// has the death reason already).
    fn record_fired(&mut self, reason: &str) {
        if let Some(fired) = FiredFault::from_death(reason) {
            if !self.fired.contains(&fired) {
                self.tell(TrainEvent::FaultInjected {
                    fault: fired.kind.clone(),
                    target: fired.target.clone(),
                    trigger: fired.trigger.clone(),
                });
                self.fired.push(fired);
            }
        }
    }

    /// A worker of attempt `id` failed: if that is the attempt's first
    /// failure, tear it down, then restart or give up.
    fn worker_failed(&mut self, id: u64, rank: usize, reason: String, ctx: &mut Context<Self>) {
        self.record_fired(&reason);
        let Some(failure) = self.attempts.rank_failed(id, rank, &reason, Instant::now()) else {
            return;
        };
        self.attempt_failed(id, failure, ctx);
    }

    /// Attempt `id` failed: tear it down, then restart or give up.
    fn attempt_failed(&mut self, id: u64, failure: Failure, ctx: &mut Context<Self>) {
        tracing::warn!(attempt = id, "training attempt failed: {}", failure.reason);
        let why = failure.reason.clone();
        self.tell_failed(failure);
        self.end_attempt(&why, ctx);
    }

    fn tell_failed(&mut self, failure: Failure) {
        self.tell(TrainEvent::Failed {
            attempt: failure.attempt,
            reason: failure.reason,
        });
    }

    /// Tears the ending attempt down (for `why`), then acts on what follows.
    fn end_attempt(&mut self, why: &str, ctx: &mut Context<Self>) {
        let teardown = self.teardown(why);
        ctx.spawn(teardown.into_actor(self).map(|_, act, ctx| act.ended(ctx)));
    }

    /// The ending attempt is gone: restart, finish or give up.
    fn ended(&mut self, ctx: &mut Context<Self>) {
        self.attempt = None;
        match self.attempts.ended() {
            Some(Next::Restart) => self.restart(ctx),
            Some(Next::Done | Next::Stopped) => self.complete(None, ctx),
            Some(Next::Stop(Unrecoverable::StorageFull(full))) => {
                self.complete(Some(TrainError::StorageFull(full)), ctx)
            }
            Some(Next::Stop(Unrecoverable::StorageNotShared(unshared))) => {
                self.complete(Some(TrainError::StorageNotShared(unshared)), ctx)
            }
            Some(Next::GiveUp(exhausted)) => {
                let error = TrainError::FailuresExhausted {
                    failures: exhausted.failures,
                    max_failures: exhausted.max_failures,
                    first: exhausted.first,
                    last: exhausted.last,
                };
                self.complete(Some(error), ctx);
            }
            None => {}
        }
    }

    /// Starts the next attempt from the newest checkpoint that verifies.
    fn restart(&mut self, ctx: &mut Context<Self>) {
        let latest = self.reporter.send(Latest);
        ctx.spawn(latest.into_actor(self).map(|latest, act, ctx| {
            let reported = latest.ok().and_then(|l| l.checkpoint);
            let ended = act.attempts.restarts() - 1;
            let unreported = checkpoint::unreported(
                &act.plan.run.run_dir(),
                ended,
                reported.as_ref().map(|c| c.index),
            );
            if let Some(saved) = &unreported {
                act.adopt(ended, saved);
            }
            match unreported.or(reported) {
                Some(checkpoint) => {
                    tracing::info!(path = %checkpoint.path.display(), "restarting from checkpoint");
                    act.history.retain(|(i, _)| *i <= checkpoint.index);
                    act.resume = Some(checkpoint.path);
                }
                None => {
                    tracing::info!("restarting from the start: no checkpoint yet");
                    let start = act
                        .plan
                        .resume_from
                        .as_deref()
                        .and_then(|p| checkpoint::verify(p).ok())
                        .map_or(0, |m| m.index);
                    act.history.retain(|(i, _)| *i <= start);
                    act.resume = act.plan.resume_from.clone();
                }
            }
            act.start_attempt(ctx);
        }));
    }

    /// Takes a checkpoint the ended attempt `ended` saved but whose
    /// report had not arrived as if it had: kept by the reporter, told to
    /// the observer, and its report in the history (under its attempt).
    fn adopt(&mut self, ended: u32, saved: &SavedCheckpoint) {
        tracing::info!(path = %saved.path.display(), "found a checkpoint saved before the failure but not yet reported");
        self.reporter.do_send(Saved(saved.clone()));
        self.tell(TrainEvent::CheckpointSaved(saved.clone()));
        if !self.history.iter().any(|(i, _)| *i == saved.index) {
            self.history.retain(|(i, _)| *i < saved.index);
            self.history.push((saved.index, saved.metrics.clone()));
            self.record(ended, saved.index, &saved.metrics);
            self.tell(TrainEvent::Reported {
                index: saved.index,
                metrics: saved.metrics.clone(),
                checkpoint: true,
            });
        }
    }

    /// Stops every worker of the current attempt and frees its resources.
    fn teardown(&mut self, reason: &str) -> impl std::future::Future<Output = ()> {
        let attempt = self.attempt.as_mut();
        let (links, group) = match attempt {
            Some(a) => (a.links.clone(), a.group.take()),
            None => (Vec::new(), None),
        };
        stop_workers(links, group, reason.to_string())
    }

    fn polled(
        &mut self,
        (id, rank, worker): WorkerId,
        report: ProgressReport,
        ctx: &mut Context<Self>,
    ) {
        let now = Instant::now();
        if !self.attempts.current(id, rank, worker)
            || !self.attempts.progress(id, rank, report.steps, now)
        {
            return;
        }
        self.attempts.healable(id, rank, report.healable);
        let mut failure = None;
        let mut unrecoverable = None;
        for (_, event) in report.events {
            if matches!(event, WorkerEvent::Report { .. }) {
                if let Some(healed) = self.attempts.healed((id, rank, worker), now) {
                    self.tell_healed(healed);
                }
            }
            match event {
                WorkerEvent::Report {
                    index,
                    metrics,
                    checkpoint,
                } if rank == 0 => {
                    if let Some(took) = self.attempts.report(id, rank, Instant::now()) {
                        self.report_recovery(index, took);
                    }
                    self.history.retain(|(i, _)| *i < index);
                    self.history.push((index, metrics.clone()));
                    self.record(self.attempts.restarts(), index, &metrics);
                    self.tell(TrainEvent::Reported {
                        index,
                        metrics,
                        checkpoint,
                    });
                }
                WorkerEvent::Report { .. } => {}
                WorkerEvent::CheckpointSaved(saved) if !self.sees(&saved) => {
                    let node = self
                        .attempt
                        .as_ref()
                        .and_then(|a| a.nodes.get(rank).cloned());
                    let unshared = NotShared {
                        path: saved.path,
                        node: node.unwrap_or_default(),
                    };
                    unrecoverable = Some(Unrecoverable::StorageNotShared(unshared));
                }
                WorkerEvent::CheckpointSaved(saved) => {
                    self.tell(TrainEvent::CheckpointSaved(saved.clone()));
                    self.reporter.do_send(Saved(saved));
                }
                WorkerEvent::FaultInjected {
                    fault,
                    target,
                    trigger,
                } => {
                    let fired = FiredFault::new(&fault, &trigger, &target);
                    self.fired.push(fired.clone());
                    self.tell(TrainEvent::FaultInjected {
                        fault,
                        target,
                        trigger,
                    });
                    // On the cluster's event stream, for chaos timelines.
                    tokio::spawn(async move {
                        if let Err(e) = library::report_fault(&fired).await {
                            tracing::warn!("cannot report an injected fault: {e}");
                        }
                    });
                }
                WorkerEvent::CheckpointFailed { index, error } => {
                    failure = Some(format!("checkpoint {index} could not be written: {error}"));
                }
                WorkerEvent::StorageFull(full) => {
                    unrecoverable = Some(Unrecoverable::StorageFull(full));
                }
            }
        }
        if let Some(stop) = unrecoverable {
            if let Some(failure) = self.attempts.unrecoverable(id, rank, stop, Instant::now()) {
                tracing::error!(attempt = id, "training stops: {}", failure.reason);
                let why = failure.reason.clone();
                self.tell_failed(failure);
                self.end_attempt(&why, ctx);
            }
            return;
        }
        if let Some(reason) = failure {
            return self.worker_failed(id, rank, reason, ctx);
        }
        match report.finished {
            None => {}
            Some(Err(e)) => self.worker_lost((id, rank, worker), e.0, false, ctx),
            Some(Ok(())) if self.attempts.rank_finished(id, rank) => {
                self.end_attempt("training finished", ctx);
            }
            Some(Ok(())) => {}
        }
    }

    /// Whether the checkpoint rank 0 saved is where this driver reads it:
    /// without storage shared by every host, a restart would find no
    /// checkpoint and start over.
    fn sees(&self, saved: &SavedCheckpoint) -> bool {
        saved.path.join(checkpoint::MANIFEST_FILE).is_file()
    }

    /// Tells the cluster (for chaos timelines) that the group trains again.
    fn report_recovery(&self, index: u64, took: Duration) {
        metrics::histogram!("nimbus_train_recovery_seconds").record(took.as_secs_f64());
        if let Some(to_head) = &self.to_head {
            to_head.send(RunEvent::Recovered {
                index,
                took_ms: took.as_millis() as u64,
                time_ms: library::now_ms(),
            });
        }
        let took_ms = took.as_millis() as u64;
        tracing::info!(took_ms, "training restored: step {index} done");
        let what = format!(
            "training restored (attempt {}, first step {index} done)",
            self.attempts.restarts()
        );
        let target = format!("run {}", self.plan.run.name);
        tokio::spawn(async move {
            if let Err(e) = library::report_recovery(what, target, took).await {
                tracing::warn!("cannot report a recovery: {e}");
            }
        });
    }

    fn check_progress(&mut self, ctx: &mut Context<Self>) {
        let timeout = self.plan.run.progress_timeout;
        if let Some((id, rank)) = self.attempts.hung(Instant::now()) {
            let reason = format!("no progress (report or collective step) for {timeout:?}: hung");
            self.worker_failed(id, rank, reason, ctx);
        }
    }

    /// Appends rank 0's report `index`, made in `attempt`, to the run's
    /// results files.
    fn record(&mut self, attempt: u32, index: u64, metrics: &Metrics) {
        let attempt = self.first_generation + u64::from(attempt);
        let line = ReportLine::now(index, attempt, metrics.clone());
        if let Some(to_head) = &self.to_head {
            to_head.send(RunEvent::Reported(RunPoint {
                index,
                attempt,
                time_ms: line.time_ms,
                metrics: metrics.clone(),
            }));
        }
        let Some(results) = &mut self.results else {
            return;
        };
        if let Err(e) = results.append(&line) {
            if !std::mem::replace(&mut self.results_failed, true) {
                tracing::warn!(
                    "report {index} (and any later) is missing from the run's results files: {e}"
                );
            }
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
            let error = TrainError::Config(format!(
                "cannot create the run directory {}: {e}",
                run_dir.display()
            ));
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
            | TrainError::OtherLibtorch { .. }
            | TrainError::Placement(PlacementError::Infeasible { .. })
            | TrainError::Spawn(actor::SpawnError::NotRegistered(_))
            | TrainError::Spawn(actor::SpawnError::Unsatisfiable { .. })
            | TrainError::Spawn(actor::SpawnError::NotInitialized)
            | TrainError::Placement(PlacementError::NotInitialized)
    )
}
