//! The `TrainerSupervisor` actor: runs a training job as attempts, each a
//! group of `TrainerWorker`s, and restarts the whole group from the latest
//! valid checkpoint when any worker dies, fails or hangs.
//!
//! One attempt:
//! 1. reserve a placement group of one bundle per worker (for an elastic
//!    run: the most workers that fit, down to the minimum);
//! 2. spawn a `TrainerWorker` into each bundle and assign ranks;
//! 3. `StartTraining` on every worker; the workers form their collective
//!    group among themselves (nothing goes through the driver);
//! 4. watch every worker: a task per worker long-polls its progress
//!    (reports, checkpoints, steps) and waits for its death; a timer checks
//!    the per-worker progress deadline.
//!
//! On the first failure of an attempt: abort the survivors (their
//! collective fails at once), kill every worker, wait for the deaths,
//! release the placement group, then start the next attempt from the
//! latest checkpoint that verifies, unless `max_failures` is spent.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::checkpoint::{self, Best, CheckpointReporter, Latest, Saved};
use super::faults::TrainingFault;
use super::progress::{Progress, ProgressReport, WorkerEvent};
use super::worker::TrainerWorker;
use super::{
    CollectiveBackend, LoopFn, Metrics, RunConfig, ScalingConfig, TrainError, TrainResult,
    WorkerCount,
};
use crate::actor::faults::FiredFault;
use crate::actor::{self, ActorHandle, ProcessContext};
use crate::cluster::ControlRequest;
use crate::cluster::FaultRequest;
use crate::placement::{PlacementError, PlacementGroup};

mod launch;
mod watch;

use launch::{launch, stop_workers, Launched, ELASTIC_TRY};
use watch::{watch, watch_for_room};

/// How long a progress poll waits for news.
const POLL_WAIT: Duration = Duration::from_secs(1);

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

struct Attempt {
    id: u64,
    links: Vec<WorkerLink>,
    group: Option<PlacementGroup>,
    finished: Vec<bool>,
    progress: Vec<(u64, Instant)>,
    ending: bool,
}

/// Supervises one training run; see the module docs.
pub struct TrainerSupervisor {
    plan: Arc<RunPlan>,
    reporter: Addr<CheckpointReporter>,
    history: Vec<(u64, Metrics)>,
    failures: Vec<String>,
    restarts: u32,
    resume: Option<PathBuf>,
    attempt: Option<Attempt>,
    next_attempt: u64,
    workers: usize,
    done: Option<oneshot::Sender<TrainResult>>,
    observer: Option<TrainObserver>,
    /// The injected faults that fired: each rule fires once per
    /// run.
    fired: Vec<FiredFault>,
    /// When the last failure was seen, until the next attempt's first
    /// report (the recovery).
    failed_at: Option<Instant>,
}

impl TrainerSupervisor {
    pub(crate) fn new(plan: RunPlan, observer: Option<TrainObserver>) -> Self {
        let reporter = CheckpointReporter::new(plan.run.checkpoint.clone()).start();
        TrainerSupervisor {
            resume: plan.resume_from.clone(),
            plan: Arc::new(plan),
            reporter,
            history: Vec::new(),
            failures: Vec::new(),
            restarts: 0,
            attempt: None,
            next_attempt: 0,
            workers: 0,
            done: None,
            observer,
            fired: Vec::new(),
            failed_at: None,
        }
    }

    fn tell(&mut self, event: TrainEvent) {
        if let Some(observer) = &mut self.observer {
            observer(&event);
        }
    }

    fn start_attempt(&mut self, ctx: &mut Context<Self>) {
        let id = self.next_attempt;
        self.next_attempt += 1;
        let faults: Vec<TrainingFault> = self
            .plan
            .faults
            .iter()
            .filter(|f| !self.fired.contains(&f.fired()))
            .cloned()
            .collect();
        let launch = launch(
            self.plan.clone(),
            id,
            self.restarts,
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
        let launched = match launched {
            Ok(launched) => launched,
            Err(e) if fatal(&e) => return self.complete(Some(e), ctx),
            Err(e) => return self.attempt_failed(e.to_string(), ctx),
        };
        let n = launched.links.len();
        self.workers = launched.world_size;
        self.tell(TrainEvent::Started {
            attempt: self.restarts,
            workers: launched.world_size,
            resumed_from: self.resume.clone(),
            backend: launched.backend,
            nodes: launched.nodes.clone(),
        });
        let now = Instant::now();
        let me = ctx.address();
        for (rank, link) in launched.links.iter().enumerate() {
            tokio::spawn(watch(
                me.clone(),
                id,
                rank,
                link.clone(),
                launched.seen_events,
            ));
        }
        if let WorkerCount::Elastic { max, .. } = self.plan.scaling.workers {
            if launched.world_size < max {
                tokio::spawn(watch_for_room(me.clone(), id, launched.seen_events));
            }
        }
        self.attempt = Some(Attempt {
            id,
            links: launched.links,
            group: launched.group,
            finished: vec![false; n],
            progress: vec![(0, now); n],
            ending: false,
        });
    }

    fn current(&mut self, id: u64) -> Option<&mut Attempt> {
        self.attempt.as_mut().filter(|a| a.id == id && !a.ending)
    }

    /// The first failure of the current attempt: tear it down, then restart
    /// or give up.
    fn worker_failed(&mut self, id: u64, rank: usize, reason: String, ctx: &mut Context<Self>) {
        let Some(attempt) = self.current(id) else {
            return;
        };
        if attempt.finished.get(rank).copied().unwrap_or(false) {
            return;
        }
        attempt.ending = true;
        self.failed_at.get_or_insert_with(Instant::now);
        if let Some(fired) = FiredFault::from_death(&reason) {
            // A fault rule killed it: it has fired. Its announcement may
            // have died with the process, so the death tells the observer
            // (the head has the death reason already).
            if !self.fired.contains(&fired) {
                self.tell(TrainEvent::FaultInjected {
                    fault: fired.kind.clone(),
                    target: fired.target.clone(),
                    trigger: fired.trigger.clone(),
                });
                self.fired.push(fired);
            }
        }
        let reason = format!("worker rank {rank}: {reason}");
        tracing::warn!(attempt = id, "training attempt failed: {reason}");
        self.tell(TrainEvent::Failed {
            attempt: self.restarts,
            reason: reason.clone(),
        });
        let teardown = self.teardown(&reason);
        ctx.spawn(
            teardown
                .into_actor(self)
                .map(move |_, act, ctx| act.attempt_failed(reason, ctx)),
        );
    }

    fn attempt_failed(&mut self, reason: String, ctx: &mut Context<Self>) {
        self.failed_at.get_or_insert_with(Instant::now);
        if self.attempt.is_none() {
            // It failed to launch: nobody told the observer yet.
            self.tell(TrainEvent::Failed {
                attempt: self.restarts,
                reason: reason.clone(),
            });
        }
        self.attempt = None;
        self.failures.push(reason);
        if self.failures.len() as u32 > self.plan.run.max_failures {
            let error = TrainError::FailuresExhausted {
                failures: self.failures.len() as u32,
                max_failures: self.plan.run.max_failures,
                first: self.failures[0].clone(),
                last: self.failures[self.failures.len() - 1].clone(),
            };
            return self.complete(Some(error), ctx);
        }
        self.restart(ctx);
    }

    /// Starts the next attempt from the newest checkpoint that verifies.
    fn restart(&mut self, ctx: &mut Context<Self>) {
        self.attempt = None;
        self.restarts += 1;
        let latest = self.reporter.send(Latest);
        ctx.spawn(latest.into_actor(self).map(|latest, act, ctx| {
            match latest.ok().and_then(|l| l.checkpoint) {
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

    /// Stops every worker of the current attempt and frees its resources.
    fn teardown(&mut self, reason: &str) -> impl std::future::Future<Output = ()> {
        let attempt = self.attempt.as_mut();
        let (links, group) = match attempt {
            Some(a) => (a.links.clone(), a.group.take()),
            None => (Vec::new(), None),
        };
        stop_workers(links, group, reason.to_string())
    }

    fn polled(&mut self, id: u64, rank: usize, report: ProgressReport, ctx: &mut Context<Self>) {
        let Some(attempt) = self.current(id) else {
            return;
        };
        if report.steps != attempt.progress[rank].0 {
            attempt.progress[rank] = (report.steps, Instant::now());
        }
        let mut failure = None;
        for (_, event) in report.events {
            match event {
                WorkerEvent::Report { index, metrics, .. } if rank == 0 => {
                    if let Some(failed) = self.failed_at.take() {
                        self.report_recovery(index, failed);
                    }
                    self.history.retain(|(i, _)| *i < index);
                    self.history.push((index, metrics.clone()));
                    self.tell(TrainEvent::Reported { index, metrics });
                }
                WorkerEvent::Report { .. } => {}
                WorkerEvent::CheckpointSaved(saved) => {
                    self.tell(TrainEvent::CheckpointSaved(saved.clone()));
                    self.reporter.do_send(Saved(saved));
                }
                WorkerEvent::FaultInjected {
                    fault,
                    target,
                    trigger,
                } => {
                    self.fired.push(FiredFault::new(&fault, &trigger, &target));
                    self.tell(TrainEvent::FaultInjected {
                        fault: fault.clone(),
                        target: target.clone(),
                        trigger: trigger.clone(),
                    });
                    if let Some(context) = ProcessContext::current() {
                        // On the cluster's event stream, for chaos timelines.
                        let report = ControlRequest::Faults(FaultRequest::ReportFault {
                            fault,
                            target,
                            trigger,
                            kills_node: None,
                        });
                        tokio::spawn(async move {
                            if let Err(e) = context.call_head(&report).await {
                                tracing::warn!("cannot report an injected fault: {e}");
                            }
                        });
                    }
                }
                WorkerEvent::CheckpointFailed { index, error } => {
                    failure = Some(format!("checkpoint {index} could not be written: {error}"));
                }
            }
        }
        if let Some(reason) = failure {
            return self.worker_failed(id, rank, reason, ctx);
        }
        match report.finished {
            None => {}
            Some(Err(e)) => self.worker_failed(id, rank, e, ctx),
            Some(Ok(())) => {
                let Some(attempt) = self.current(id) else {
                    return;
                };
                attempt.finished[rank] = true;
                if attempt.finished.iter().all(|f| *f) {
                    attempt.ending = true;
                    let teardown = self.teardown("training finished");
                    ctx.spawn(
                        teardown
                            .into_actor(self)
                            .map(|_, act, ctx| act.complete(None, ctx)),
                    );
                }
            }
        }
    }

    /// Tells the cluster (for chaos timelines) that the group trains again.
    fn report_recovery(&self, index: u64, failed: Instant) {
        let took_ms = failed.elapsed().as_millis() as u64;
        tracing::info!(took_ms, "training restored: step {index} done");
        let Some(context) = ProcessContext::current() else {
            return;
        };
        let report = ControlRequest::Faults(FaultRequest::ReportRecovery {
            what: format!(
                "training restored (attempt {}, first step {index} done)",
                self.restarts
            ),
            target: format!("run {}", self.plan.run.name),
            took_ms,
        });
        tokio::spawn(async move {
            if let Err(e) = context.call_head(&report).await {
                tracing::warn!("cannot report a recovery: {e}");
            }
        });
    }

    fn check_progress(&mut self, ctx: &mut Context<Self>) {
        let timeout = self.plan.run.progress_timeout;
        let Some(attempt) = self.attempt.as_ref().filter(|a| !a.ending) else {
            return;
        };
        let stalled = attempt
            .progress
            .iter()
            .enumerate()
            .find(|(rank, (_, at))| !attempt.finished[*rank] && at.elapsed() > timeout)
            .map(|(rank, _)| rank);
        if let Some(rank) = stalled {
            let id = attempt.id;
            let reason = format!("no progress (report or collective step) for {timeout:?}: hung");
            self.worker_failed(id, rank, reason, ctx);
        }
    }

    fn complete(&mut self, error: Option<TrainError>, ctx: &mut Context<Self>) {
        self.attempt = None;
        let reporter = self.reporter.clone();
        let run_dir = self.plan.run.run_dir();
        let history: Vec<Metrics> = self.history.iter().map(|(_, m)| m.clone()).collect();
        let (restarts, workers) = (self.restarts, self.workers);
        let done = self.done.take();
        ctx.spawn(
            async move {
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
        let WorkerCount::Elastic { max, .. } = self.plan.scaling.workers else {
            return;
        };
        let Some(attempt) = self.current(id) else {
            return;
        };
        let extra = max.saturating_sub(attempt.links.len());
        if extra == 0 {
            return;
        }
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
            let Some(attempt) = act.current(id) else {
                return;
            };
            if !room {
                return;
            }
            attempt.ending = true;
            let n = attempt.links.len();
            tracing::info!(
                "elastic run: room for {max} workers again; restarting from the latest checkpoint"
            );
            act.tell(TrainEvent::Rescaling { from: n, to: max });
            let teardown = act.teardown("growing the group");
            ctx.spawn(teardown.into_actor(act).map(|_, act, ctx| act.restart(ctx)));
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
        if let Err(e) = std::fs::create_dir_all(self.plan.run.run_dir()) {
            let error = TrainError::Config(format!(
                "cannot create the run directory {}: {e}",
                self.plan.run.run_dir().display()
            ));
            self.complete(Some(error), ctx);
        } else {
            self.start_attempt(ctx);
        }
        Box::pin(async move {
            result
                .await
                .map_err(|_| TrainError::Aborted("the supervisor stopped without a result".into()))
        })
    }
}

/// News from a worker's watcher.
#[derive(Message)]
#[rtype(result = "()")]
enum Watched {
    Progress(u64, usize, ProgressReport),
    Failed(u64, usize, String),
}

impl Handler<Watched> for TrainerSupervisor {
    type Result = ();

    fn handle(&mut self, watched: Watched, ctx: &mut Context<Self>) {
        match watched {
            Watched::Progress(id, rank, report) => self.polled(id, rank, report, ctx),
            Watched::Failed(id, rank, reason) => self.worker_failed(id, rank, reason, ctx),
        }
    }
}

/// Errors no restart can fix.
fn fatal(error: &TrainError) -> bool {
    matches!(
        error,
        TrainError::Config(_)
            | TrainError::Placement(PlacementError::Infeasible { .. })
            | TrainError::Spawn(actor::SpawnError::NotRegistered(_))
            | TrainError::Spawn(actor::SpawnError::Unsatisfiable { .. })
            | TrainError::Spawn(actor::SpawnError::NotInitialized)
            | TrainError::Placement(PlacementError::NotInitialized)
    )
}
