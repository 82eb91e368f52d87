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
use futures::future::join_all;
use tokio::sync::oneshot;

use super::checkpoint::{self, Best, CheckpointReporter, Latest, Saved};
use super::collective::{SoloGroup, MAX_WORLD};
use super::context::Ranks;
use super::faults::TrainingFault;
use super::progress::{Progress, ProgressReport, WorkerEvent};
use super::worker::{
    self, AbortTraining, Assignment, GroupSpec, NcclUniqueId, PollTraining, StartTraining,
    TrainerWorker,
};
use super::{
    CollectiveBackend, LoopFn, Metrics, RunConfig, ScalingConfig, TrainError, TrainResult,
    WorkerCount,
};
use crate::actor::{self, ActorHandle, ProcessContext, SpawnOptions};
use crate::cluster::ControlRequest;
use crate::placement::{PlacementError, PlacementGroup};

/// Bytes per rank slot of the shared-memory group: the allreduce bucket.
const BUCKET_BYTES: usize = 4 << 20;
/// How long a progress poll waits for news.
const POLL_WAIT: Duration = Duration::from_secs(1);
/// How long teardown waits for a killed worker's death to be reported.
const DEATH_WAIT: Duration = Duration::from_secs(10);
/// How long an elastic run waits for a larger group before trying a smaller.
const ELASTIC_TRY: Duration = Duration::from_secs(2);

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
    seen_events: u64,
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
    /// Reasons of the injected faults that fired: each rule fires once per
    /// run.
    fired: Vec<String>,
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
            .filter(|f| !self.fired.contains(&f.reason()))
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
            seen_events: launched.seen_events,
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
        if let Some(at) = reason.find("chaos: ") {
            // A fault rule killed it: it has fired.
            self.fired.push(reason[at..].to_string());
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
        let (links, group, seen) = match attempt {
            Some(a) => (a.links.clone(), a.group.take(), a.seen_events),
            None => (Vec::new(), None, 0),
        };
        stop_workers(links, group, seen, reason.to_string())
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
                    self.fired
                        .push(format!("chaos: {fault} at {trigger} of {target}"));
                    self.tell(TrainEvent::FaultInjected {
                        fault: fault.clone(),
                        target: target.clone(),
                        trigger: trigger.clone(),
                    });
                    if let Some(context) = ProcessContext::current() {
                        // On the cluster's event stream, for chaos timelines.
                        let report = ControlRequest::ReportFault {
                            fault,
                            target,
                            trigger,
                        };
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
        let report = ControlRequest::ReportRecovery {
            what: format!(
                "training restored (attempt {}, first step {index} done)",
                self.restarts
            ),
            target: format!("run {}", self.plan.run.name),
            took_ms,
        };
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

/// Tells the supervisor of every node that joins, until the attempt ends
/// (its messages are then ignored) or the head is lost.
async fn watch_for_room(me: Addr<TrainerSupervisor>, id: u64, mut after: u64) {
    let Some(context) = ProcessContext::current() else {
        return;
    };
    while me.connected() {
        let Ok(events) = context.events(after, Duration::from_secs(30)).await else {
            return;
        };
        after = events.last().map_or(after, |e| e.seq);
        let joined = events
            .iter()
            .any(|e| matches!(e.kind, crate::cluster::ClusterEventKind::NodeJoined { .. }));
        if joined && me.send(NodeJoined(id)).await.is_err() {
            return;
        }
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

/// Polls one worker's progress until it finishes, fails or dies.
async fn watch(me: Addr<TrainerSupervisor>, id: u64, rank: usize, link: WorkerLink, seen: u64) {
    let handle = match link {
        WorkerLink::Local(progress) => {
            let mut after = 0;
            loop {
                let report = progress.poll(after, POLL_WAIT).await;
                after += report.events.len() as u64;
                let finished = report.finished.is_some();
                me.do_send(Watched::Progress(id, rank, report));
                if finished {
                    return;
                }
            }
        }
        WorkerLink::Remote(handle) => handle,
    };
    let mut after = seen;
    let death = actor::next_death(&handle, &mut after);
    tokio::pin!(death);
    let polls = async {
        let mut seen = 0;
        loop {
            let poll = PollTraining {
                after: seen,
                wait_ms: POLL_WAIT.as_millis() as u64,
            };
            match handle.send(poll).await {
                Ok(Ok(report)) => {
                    seen += report.events.len() as u64;
                    let finished = report.finished.is_some();
                    me.do_send(Watched::Progress(id, rank, report));
                    if finished {
                        return None;
                    }
                }
                Ok(Err(e)) => return Some(e),
                Err(e) => return Some(e.to_string()),
            }
        }
    };
    let reason = tokio::select! {
        died = &mut death => Some(describe_death(died)),
        failed = polls => match failed {
            // Finished: its teardown kill is no failure.
            None => None,
            // A failed call usually means the worker died: prefer its
            // death's reason, if it comes soon.
            Some(call) => Some(
                tokio::time::timeout(Duration::from_secs(5), &mut death)
                    .await
                    .map_or(call, describe_death),
            ),
        },
    };
    if let Some(reason) = reason {
        me.do_send(Watched::Failed(id, rank, reason));
    }
}

fn describe_death(died: Result<actor::ActorDied, actor::CallError>) -> String {
    match died {
        Ok(died) => format!("died: {}", died.reason),
        Err(e) => format!("lost track of it: {e}"),
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

/// A started attempt.
struct Launched {
    links: Vec<WorkerLink>,
    group: Option<PlacementGroup>,
    world_size: usize,
    seen_events: u64,
}

/// Places, spawns and starts one attempt's workers.
async fn launch(
    plan: Arc<RunPlan>,
    id: u64,
    attempt: u32,
    resume: Option<PathBuf>,
    faults: Vec<TrainingFault>,
) -> Result<Launched, TrainError> {
    let counts: Vec<usize> = match plan.scaling.workers {
        WorkerCount::Fixed(n) => vec![n],
        WorkerCount::Elastic { min, max } if min <= max && max > 0 => {
            (min.max(1)..=max).rev().collect()
        }
        WorkerCount::Elastic { min, max } => {
            return Err(TrainError::Config(format!(
                "elastic worker range {min}..={max} is empty"
            )))
        }
    };
    if let Some(path) = &resume {
        checkpoint::verify(path).map_err(|e| TrainError::Config(format!("cannot resume: {e}")))?;
    }
    let mut assignment = Assignment {
        loop_name: plan.loop_name.to_string(),
        config: plan.config.clone(),
        ranks: Ranks {
            world_size: 1,
            world_rank: 0,
            local_rank: 0,
            node_rank: 0,
        },
        group: None,
        resume,
        run_dir: plan.run.run_dir(),
        use_gpu: plan.scaling.use_gpu,
        threads: plan
            .scaling
            .resources_per_worker
            .amount(crate::cluster::CPU)
            .floor()
            .max(1.0) as usize,
        attempt,
        faults: Vec::new(),
    };
    let faults_of = |rank: usize| -> Vec<TrainingFault> {
        faults.iter().filter(|f| f.rank == rank).cloned().collect()
    };
    if counts == [0] {
        assignment.faults = faults_of(0);
        return Ok(launch_local(&plan, assignment));
    }
    let context = ProcessContext::current()
        .ok_or_else(|| TrainError::Config("nimbus is not initialised in this process".into()))?;
    let seen_events = context
        .last_event()
        .await
        .map_err(|e| TrainError::Call(e.into()))?;
    let bundle = plan.scaling.bundle();
    let mut group = None;
    for (i, &n) in counts.iter().enumerate() {
        let last = i + 1 == counts.len();
        let deadline = if last {
            plan.run.placement_timeout
        } else {
            ELASTIC_TRY
        };
        match PlacementGroup::create(vec![bundle.clone(); n], plan.scaling.placement, deadline)
            .await
        {
            Ok(placed) => {
                group = Some(placed);
                break;
            }
            Err(e) if last => return Err(e.into()),
            Err(e) => tracing::info!(workers = n, "elastic run: {e}; trying fewer workers"),
        }
    }
    let group = group.ok_or_else(|| TrainError::Config("no worker count to try".into()))?;
    let n = group.len();
    let mut spawns = Vec::new();
    for index in 0..n {
        let mut options = SpawnOptions::default().max_restarts(0);
        for (name, amount) in bundle.iter() {
            options = options.resource(name, amount);
        }
        let options = options.in_bundle(&group, index)?;
        spawns.push(actor::spawn::<TrainerWorker>((), options));
    }
    let spawned = join_all(spawns).await;
    let mut handles = Vec::new();
    let mut spawn_error = None;
    for result in spawned {
        match result {
            Ok(handle) => handles.push(handle),
            Err(e) => spawn_error = spawn_error.or(Some(e)),
        }
    }
    let links: Vec<WorkerLink> = handles.iter().cloned().map(WorkerLink::Remote).collect();
    if let Some(e) = spawn_error {
        stop_workers(links, Some(group), seen_events, "could not start".into()).await;
        return Err(e.into());
    }
    // Ranks follow bundle order; nodes are numbered in order of appearance.
    let nodes: Vec<String> = (0..n)
        .map(|i| group.node(i).unwrap_or_default().to_string())
        .collect();
    let mut order: Vec<&str> = Vec::new();
    for node in &nodes {
        if !order.contains(&node.as_str()) {
            order.push(node);
        }
    }
    let hosts = group_hosts(&group);
    let timeout_ms = plan.run.collective_timeout.as_millis() as u64;
    let shared_memory = GroupSpec::SharedMemory {
        path: shm_dir().join(format!(
            "nimbus-train-{}-{id}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        )),
        capacity: BUCKET_BYTES,
        timeout_ms,
    };
    let network = GroupSpec::Network {
        peers: handles.clone(),
        timeout_ms,
    };
    let backend = match plan.scaling.collective {
        CollectiveBackend::Auto if plan.scaling.use_gpu => CollectiveBackend::Nccl,
        CollectiveBackend::Auto if hosts == 1 && n <= MAX_WORLD => CollectiveBackend::SharedMemory,
        CollectiveBackend::Auto => CollectiveBackend::Network,
        chosen => chosen,
    };
    assignment.group = Some(match backend {
        CollectiveBackend::Nccl => {
            // Rank 0 makes the communicator's id; a program or machine
            // without NCCL fails here, clearly and for good.
            let id = match handles[0].send(NcclUniqueId).await {
                Ok(Ok(id)) => id,
                Ok(Err(e)) => {
                    stop_workers(links, Some(group), seen_events, "no NCCL".into()).await;
                    return Err(TrainError::Config(format!(
                        "cannot form an NCCL group: {e}"
                    )));
                }
                Err(e) => {
                    stop_workers(links, Some(group), seen_events, "unreachable".into()).await;
                    return Err(e.into());
                }
            };
            GroupSpec::Nccl { id, timeout_ms }
        }
        CollectiveBackend::Network => network,
        _ if hosts == 1 && n <= MAX_WORLD => shared_memory,
        _ => {
            stop_workers(links, Some(group), seen_events, "unsupported".into()).await;
            return Err(TrainError::Config(format!(
                "the shared-memory collective needs every worker on one host (and at most {MAX_WORLD}); these {n} landed on {hosts} hosts"
            )));
        }
    });
    let starts = handles.iter().enumerate().map(|(rank, handle)| {
        let mut assignment = assignment.clone();
        assignment.ranks = Ranks {
            world_size: n,
            world_rank: rank,
            local_rank: nodes[..rank].iter().filter(|m| **m == nodes[rank]).count(),
            node_rank: order.iter().position(|m| *m == nodes[rank]).unwrap_or(0),
        };
        assignment.faults = faults_of(rank);
        handle.send(StartTraining(assignment))
    });
    let started = join_all(starts).await;
    let failure = started
        .into_iter()
        .enumerate()
        .find_map(|(rank, r)| match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(TrainError::WorkerFailed { rank, reason: e }),
            Err(e) => Some(TrainError::WorkerFailed {
                rank,
                reason: e.to_string(),
            }),
        });
    if let Some(e) = failure {
        stop_workers(links, Some(group), seen_events, "could not start".into()).await;
        return Err(e);
    }
    Ok(Launched {
        links,
        group: Some(group),
        world_size: n,
        seen_events,
    })
}

/// Local mode: the loop on a thread of this (the driver) process.
fn launch_local(plan: &RunPlan, assignment: Assignment) -> Launched {
    let progress = Arc::new(Progress::default());
    let run = plan.local.clone();
    let thread_progress = progress.clone();
    std::thread::spawn(move || {
        let outcome = worker::run_loop(
            &run,
            &assignment,
            Box::new(SoloGroup),
            thread_progress.clone(),
        );
        thread_progress.finish(outcome.map_err(|e| e.to_string()));
    });
    Launched {
        links: vec![WorkerLink::Local(progress)],
        group: None,
        world_size: 0,
        seen_events: 0,
    }
}

/// Aborts, kills and waits for every worker, then releases the group.
async fn stop_workers(
    links: Vec<WorkerLink>,
    group: Option<PlacementGroup>,
    seen: u64,
    reason: String,
) {
    let stops = links.into_iter().map(|link| {
        let reason = reason.clone();
        async move {
            match link {
                WorkerLink::Local(progress) => {
                    progress.abort(&reason);
                    // The loop stops at its next report; wait for it.
                    let end = Instant::now() + DEATH_WAIT;
                    let mut after = 0;
                    while Instant::now() < end {
                        let report = progress.poll(after, POLL_WAIT).await;
                        after += report.events.len() as u64;
                        if report.finished.is_some() {
                            break;
                        }
                    }
                }
                WorkerLink::Remote(handle) => {
                    let _ = handle.do_send(AbortTraining { reason });
                    if let Err(e) = handle.kill().await {
                        tracing::warn!(actor = %handle.id(), "cannot kill training worker: {e}");
                    }
                    let mut after = seen;
                    let died = tokio::time::timeout(DEATH_WAIT, actor::next_death(&handle, &mut after)).await;
                    if died.is_err() {
                        tracing::warn!(actor = %handle.id(), "training worker not reported dead within {DEATH_WAIT:?}");
                    }
                }
            }
        }
    });
    join_all(stops).await;
    if let Some(group) = group {
        if let Err(e) = group.remove().await {
            tracing::warn!("cannot remove the training placement group: {e}");
        }
    }
}

/// Number of distinct hosts (IP addresses) the group's nodes are on.
fn group_hosts(group: &PlacementGroup) -> usize {
    let mut ips: Vec<std::net::IpAddr> = (0..group.len())
        .filter_map(|i| group.address(i).ok().map(|a| a.ip()))
        .collect();
    ips.sort();
    ips.dedup();
    ips.len()
}

/// Where shared-memory segments go.
fn shm_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}
