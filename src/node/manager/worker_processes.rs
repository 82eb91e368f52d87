//! Worker processes: started for an actor, restarted when they exit
//! while restarts remain, killed on request and when their job ends.

use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;
use tracing::{info, warn};

use crate::cluster::DeathCause;
use crate::cluster::{ActorId, ActorSpec, BundleId, WorkerReply};
use crate::head::directory::{self};
use crate::host::files::private_dir;
use crate::host::processes::{signal_process, Signal};
use crate::wire::{Incarnation, RemoteError, RemoteErrorKind};

use super::bundles::ReleaseBundle;
use super::log_reads::WorkerPrinted;
use super::{Killed, NodeManager, Worker};
use crate::node::authorize::{Confinement, Forbidden};
use crate::node::error::WorkerStartError;
use crate::node::gpu_slots::GpuTake;
use crate::node::logs::Stream;
use crate::node::workers::{self, LaunchedWorker, WorkerLogs};
use crate::runtime::boot::WorkerBoot;

/// Start an actor in a worker process on this node.
#[derive(Message)]
#[rtype(result = "Result<WorkerReply, RemoteError>")]
pub struct StartActor(pub ActorSpec);

impl Handler<StartActor> for NodeManager {
    type Result = ResponseActFuture<Self, Result<WorkerReply, RemoteError>>;

    fn handle(&mut self, StartActor(spec): StartActor, ctx: &mut Self::Context) -> Self::Result {
        if self.binaries.get(&spec.binary.hash).is_none() {
            return Box::pin(fut::ready(Ok(WorkerReply::NeedBinary)));
        }
        if self.workers.contains_key(&spec.actor) {
            let error = RemoteError::new(
                RemoteErrorKind::BadRequest,
                format!("actor {} already runs here", spec.actor),
            );
            return Box::pin(fut::ready(Err(error)));
        }
        let grant = match self.resources.reserve(&spec.resources, spec.bundle) {
            Ok(grant) => grant,
            Err(cause) => {
                let short = self.no_capacity(cause).to_string();
                return Box::pin(fut::ready(Ok(WorkerReply::NoCapacity(short))));
            }
        };
        // Fault rules hit an actor's first life only, wherever it restarts.
        let first_life = spec.restarts == 0;
        let launch = self.launch(&spec, &grant.gpus, first_life, ctx);
        Box::pin(launch.into_actor(self).then(move |launched, manager, _| {
            let worker = match launched {
                Ok(worker) => worker,
                Err(e) => {
                    manager.resources.release(&spec.resources, grant);
                    let error = RemoteError::new(RemoteErrorKind::Internal, e.to_string());
                    let failed: ResponseActFuture<NodeManager, _> =
                        Box::pin(fut::ready(Err(error)));
                    return failed;
                }
            };
            info!(actor = %spec.actor, kind = %spec.type_name, pid = worker.pid, "actor started");
            let entry = Worker {
                restarts: spec.restarts,
                spec,
                incarnation: worker.incarnation,
                address: worker.address,
                relaunching: false,
                grant,
                pid: worker.pid,
                killed: None,
                err_log: (worker.err_log.clone(), 0),
            };
            let record = manager.record_of(&entry, worker.address);
            let reported = manager.reports.up(record.clone(), entry.spec.clone());
            // The head's view of this node's use, which spawns place by,
            // includes the new actor before the spawner hears of it (else
            // spawns in quick succession all see the node as it was).
            let used = manager.beat();
            let owner = entry.spec.owner;
            manager.workers.insert(entry.spec.actor, entry);
            // Its owner died while it was being started (`owners.rs`).
            if let Some(owner) = owner.filter(|owner| manager.owner_died(*owner)) {
                manager.kill_owned_by(owner);
            }
            Box::pin(
                async move {
                    reported.await;
                    used.await;
                }
                .into_actor(manager)
                .map(move |_, _, _| Ok(WorkerReply::ActorStarted(Box::new(record)))),
            )
        }))
    }
}

/// A worker process is gone.
#[derive(Message)]
#[rtype(result = "()")]
struct WorkerExited {
    actor: ActorId,
    incarnation: Incarnation,
    reason: DeathCause,
}

impl Handler<WorkerExited> for NodeManager {
    type Result = ();

    fn handle(&mut self, msg: WorkerExited, ctx: &mut Self::Context) {
        let Some(worker) = self.workers.get(&msg.actor) else {
            return;
        };
        if worker.incarnation != msg.incarnation {
            return;
        }
        let restarting = worker.killed.is_none() && worker.restarts < worker.spec.max_restarts;
        let death = Box::new(msg.reason.clone());
        let reason = match worker.killed {
            None => msg.reason.clone(),
            Some(Killed::OnRequest) => DeathCause::KilledOnRequest(death),
            Some(Killed::WithOwner(owner)) => DeathCause::OwnerDied { owner, death },
        };
        let msg = WorkerExited { reason, ..msg };
        let (spec, grant) = (worker.spec.clone(), worker.grant.clone());
        warn!(actor = %msg.actor, restarting, "actor died: {}", msg.reason);
        let down = directory::ActorDown {
            actor: msg.actor,
            incarnation: msg.incarnation,
            reason: msg.reason.clone(),
            restarting,
            node: None,
        };
        self.reports.down(down);
        if !restarting {
            self.workers.remove(&msg.actor);
            self.resources.release(&spec.resources, grant);
            return;
        }
        if let Some(worker) = self.workers.get_mut(&msg.actor) {
            worker.restarts += 1;
            worker.relaunching = true;
        }
        let launch = self.launch(&spec, &grant.gpus, false, ctx);
        ctx.spawn(launch.into_actor(self).then(move |launched, manager, _| {
            let reported = match launched {
                Ok(launched) => manager.restarted(spec.actor, launched),
                Err(e) => {
                    manager.workers.remove(&spec.actor);
                    manager.resources.release(&spec.resources, grant);
                    let down = directory::ActorDown {
                        actor: spec.actor,
                        incarnation: msg.incarnation,
                        reason: DeathCause::RestartFailed {
                            death: Box::new(msg.reason),
                            error: e.to_string(),
                        },
                        restarting: false,
                        node: None,
                    };
                    manager.reports.down(down);
                    futures::future::ready(()).boxed()
                }
            };
            reported.into_actor(manager)
        }));
    }
}

/// Kill an actor's worker process for good; asked by a worker
/// (`confined`), only an actor of its job.
#[derive(Message)]
#[rtype(result = "Result<(), Forbidden>")]
pub struct KillActor {
    /// The actor.
    pub actor: ActorId,
    /// Asked by a worker: only its job's actors.
    pub confined: Option<Confinement>,
}

impl Handler<KillActor> for NodeManager {
    type Result = Result<(), Forbidden>;

    fn handle(&mut self, msg: KillActor, _: &mut Self::Context) -> Self::Result {
        let actor = msg.actor;
        let job = self.workers.get(&actor).map(|w| w.spec.job.as_str());
        // An actor not here is not killed, whoever asks.
        if let (Some(confined), Some(job)) = (&msg.confined, job) {
            let rule = "a worker kills its own job's actors only";
            confined.allows("KillActor", Some(job), rule)?;
        }
        let Some(worker) = self.workers.get_mut(&actor) else {
            return Ok(());
        };
        worker.killed = Some(Killed::OnRequest);
        info!(actor = %actor, pid = worker.pid, "killing actor on request");
        // The exit is reported by the worker's watcher (`WorkerExited`).
        signal_worker(worker.pid, Signal::KILL);
        Ok(())
    }
}

/// Sends `signal` to worker process `pid`, a child of this node still in
/// its table (reaped only by its watcher, which removes it first, so the
/// pid cannot have been reused).
pub(super) fn signal_worker(pid: u32, signal: Signal) {
    if let Err(e) = signal_process(pid, signal) {
        tracing::debug!("cannot signal worker process {pid}: {e}");
    }
}

/// How long the workers of a job that ended have to exit after SIGTERM (a
/// worker's last metrics push takes at most
/// [`LAST_PUSH_WAIT`](crate::runtime::LAST_PUSH_WAIT), 2 s) before SIGKILL.
const END_JOB_GRACE: Duration = Duration::from_secs(3);

/// A job ended (`crate::head::jobs`, step 3): stop its actors here,
/// but the detached ones, for good, and release its bundles (the protocol
/// is in the module docs).
#[derive(Message)]
#[rtype(result = "()")]
pub struct EndJob(pub String);

impl Handler<EndJob> for NodeManager {
    type Result = ();

    fn handle(&mut self, EndJob(job): EndJob, ctx: &mut Self::Context) {
        let actors: Vec<ActorId> = self
            .workers
            .iter()
            .filter(|(_, worker)| worker.spec.job == job && !worker.spec.detached)
            .map(|(actor, _)| *actor)
            .collect();
        let bundles: Vec<BundleId> = self
            .bundle_jobs
            .iter()
            .filter(|(_, of)| **of == job)
            .map(|(bundle, _)| *bundle)
            .collect();
        info!(%job, actors = actors.len(), bundles = bundles.len(), "job ended: stopping its actors, releasing its bundles");
        let shm = std::path::Path::new(crate::host::shared_memory::SHM);
        crate::host::shared_memory::remove_if_empty(shm, &job);
        let mut stopping = Vec::new();
        for actor in actors {
            let Some(worker) = self.workers.get_mut(&actor) else {
                continue;
            };
            worker.killed = Some(Killed::OnRequest);
            stopping.push((actor, worker.pid));
            signal_worker(worker.pid, Signal::TERM);
        }
        ctx.run_later(END_JOB_GRACE, move |manager, _| {
            for (actor, pid) in stopping {
                // Still the same worker (its watcher removes it before its
                // pid is reaped, so the pid cannot have been reused).
                if manager.workers.get(&actor).is_some_and(|w| w.pid == pid) {
                    warn!(%actor, pid, "worker still running {END_JOB_GRACE:?} after SIGTERM: SIGKILL");
                    signal_worker(pid, Signal::KILL);
                }
            }
        });
        for bundle in bundles {
            let release = ReleaseBundle {
                bundle,
                confined: None,
            };
            // Unconfined: it cannot be refused.
            let _ = <Self as Handler<ReleaseBundle>>::handle(self, release, ctx);
        }
        self.output.forget(&job);
    }
}

impl NodeManager {
    /// Starts a worker for `spec`; `WorkerExited` reaches this actor when it dies.
    pub(super) fn launch(
        &self,
        spec: &ActorSpec,
        gpus: &GpuTake,
        first_life: bool,
        ctx: &mut Context<Self>,
    ) -> BoxFuture<'static, Result<LaunchedWorker, WorkerStartError>> {
        let Some(binary) = self.binaries.get(&spec.binary.hash) else {
            let gone = WorkerStartError::BinaryGone(spec.binary.hash.clone());
            return futures::future::ready(Err(gone)).boxed();
        };
        let identity = match self.config.workers.issue(spec) {
            Ok(identity) => identity,
            Err(e) => return futures::future::ready(Err(e)).boxed(),
        };
        let boot = WorkerBoot {
            spec: spec.clone(),
            identity,
            head: self.config.head_address,
            node: self.config.identity.clone(),
            node_address: self.config.address,
            advertise_ip: self.config.advertise_ip,
            faults: self
                .config
                .actor_faults
                .iter()
                .filter(|rule| first_life && rule.targets(spec))
                .cloned()
                .collect(),
        };
        let log_dir = self.config.state_dir.join("logs");
        let incarnation = boot.identity.name.incarnation.0;
        let logs = WorkerLogs {
            out: Stream::Out.path(&log_dir, spec.actor, incarnation),
            err: Stream::Err.path(&log_dir, spec.actor, incarnation),
        };
        // An actor sees its own devices only; one without GPUs sees none.
        let gpus = gpus.ids().join(",");
        let me = ctx.address();
        let actor = spec.actor;
        let printer = me.clone();
        let (job, name) = (spec.job.clone(), spec.name.clone());
        let on_line = move |line: &str| {
            printer.do_send(WorkerPrinted {
                job: job.clone(),
                actor,
                name: name.clone(),
                line: line.to_string(),
            });
        };
        let checked = self.libraries.clone();
        let sandbox = self.config.sandbox.clone();
        async move {
            private_dir(&log_dir).map_err(|source| WorkerStartError::Io {
                action: "create",
                path: log_dir.clone(),
                source,
            })?;
            let on_exit = move |incarnation, reason| {
                me.do_send(WorkerExited {
                    actor,
                    incarnation,
                    reason,
                });
            };
            let lacking = checked.lacking(&binary).await;
            if !lacking.is_empty() {
                return Err(WorkerStartError::CannotLoad {
                    node: boot.node.name.clone(),
                    binary,
                    lacking: Box::new(lacking),
                });
            }
            let worker =
                workers::launch(&binary, &boot, &logs, gpus, &sandbox, on_line, on_exit).await?;
            Ok(worker)
        }
        .boxed()
    }

    /// Records a restarted actor's new incarnation and reports it up.
    pub(super) fn restarted(
        &mut self,
        actor: ActorId,
        launched: LaunchedWorker,
    ) -> BoxFuture<'static, ()> {
        let Some(worker) = self.workers.get_mut(&actor) else {
            return futures::future::ready(()).boxed();
        };
        worker.incarnation = launched.incarnation;
        worker.address = launched.address;
        worker.relaunching = false;
        worker.pid = launched.pid;
        worker.err_log = (launched.err_log, 0);
        info!(actor = %actor, restarts = worker.restarts, "actor restarted");
        if worker.killed.is_some() {
            // Killed for good while its new process was starting.
            signal_worker(worker.pid, Signal::KILL);
        }
        let worker = &self.workers[&actor];
        let record = self.record_of(worker, launched.address);
        let spec = worker.spec.clone();
        self.reports.up(record, spec)
    }
}
