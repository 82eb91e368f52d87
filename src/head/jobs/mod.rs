//! Jobs and their drivers: what a driver program creates is its job's, and
//! is cleaned up when the driver is gone (Ray's job ownership); the head
//! keeps a record of every job, live and ended (`nimbus job list`).
//!
//! A driver that attaches by itself (`--address`):
//! 1. It sends `DriverAlive { job, entrypoint, versions }` to the head
//!    every [`DRIVER_BEAT`] (1 s) while it runs (`crate::driver`). The
//!    first one records the job, `RUNNING`; the first that says what the
//!    driver runs (release, libtorch) records that too.
//! 2. The head's [`JobTable`] keeps when it last heard from each job. A job
//!    not heard from for the grace period (`--driver-grace-s`, default
//!    [`DEFAULT_DRIVER_GRACE`], 30 s) ends `FAILED`: its driver died, was
//!    killed, or lost the head for that long. An ended job stays ended: a
//!    driver heard from again after that is refused, its actors are gone.
//! 3. A driver that ends normally says so (`DriverDone`, when its `Driver`
//!    is dropped): the job ends at once, `SUCCEEDED` (`FAILED` if it is
//!    unwinding from a panic).
//!
//! A submitted job (`nimbus job submit`, `SubmitJob`):
//! 1. The submitter uploads the packed working directory to the chosen
//!    node's binary cache (the head's unless it names one), then sends
//!    `SubmitJob`. The head records the job `PENDING` with a new id and
//!    sends `RunDriver` to the node ([`RUN_DRIVER_DEADLINE`], 60 s), which
//!    starts the program (`crate::node`'s `drivers.rs`) and answers with
//!    its pid: the job is `RUNNING` (or `FAILED` with the node's reason).
//! 2. Its driver's beats keep nothing alive: the node watches the process.
//!    When it exits, the node sends `DriverExited` with how it ended:
//!    `SUCCEEDED` on exit code 0, `FAILED` otherwise, `STOPPED` if it was
//!    asked to stop. A job whose node dies or leaves ends `FAILED` (the
//!    keeper follows `NodeDead`/`NodeLeft`, and checks the live members
//!    every `CHECK_EVERY`, half a second).
//! 3. `StopJob` asks the node to stop the driver (`StopDriver`: SIGTERM,
//!    SIGKILL after its grace) and answers at once; the node's
//!    `DriverExited` ends the job. An attached job is ended at once,
//!    `STOPPED`.
//!
//! Whenever a job ends, the head sends `EndJob { job }` to every live node
//! and publishes `JobEnded`. Each node kills the job's actors (not the
//! detached ones, `SpawnOptions::detached`) for good, which gives back
//! their resources and task leases, and releases the job's placement-group
//! bundles (`crate::node`'s `manager/`). The head keeps the records of
//! the last [`MAX_ENDED`] ended jobs.
//!
//! The nodes' object stores, watching the events, then release every
//! reference the job's driver processes held (a driver holder names its
//! job); its workers' go as they die.
//!
//! Across the head's restarts (`head/store.rs`): every change of a job's
//! record (created, started, stopping, ended, forgotten) is written to the
//! head's store before it is acknowledged or acted on. A restarted head
//! loads them, and every live job's driver grace starts again from the
//! load: an attached driver that rode the outage out beats again; one
//! that died meanwhile ends its job `FAILED` after the grace. A submitted
//! job's node re-sends its driver's exit until the head answers
//! (`crate::node`'s `drivers.rs`). A submitted job still `PENDING` (the
//! head died before its node said the driver started) ends `FAILED` at
//! the load, and its node is asked to stop the driver. A change the store
//! does not take is tried again at the next change.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use tracing::{info, warn};

use super::events::{ClusterEvents, Publish};
use super::membership::{self, Membership};
use super::runs::RunTable;
use super::store::{HeadStore, StoredJob};
use super::tasks::TaskTable;
use crate::cluster::{
    ClusterEvent, ClusterEventKind, ControlRequest, DeathCause, JobRecord, JobReply, JobRequest,
    JobSubmission, RunEvent, RunHeader, RunRecord, TaskRecord, Versions,
};
use crate::transport::{Endpoint, RequestOptions};
use crate::wire::NodeIdentity;

pub use crate::cluster::DRIVER_BEAT;
/// How long a job's driver may be silent before the job ends.
pub const DEFAULT_DRIVER_GRACE: Duration = Duration::from_secs(30);
/// How often the head looks for jobs past their grace or on lost nodes.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How long a node may take to start a submitted job's driver (unpacking
/// its working directory included).
pub const RUN_DRIVER_DEADLINE: Duration = Duration::from_secs(60);

mod table;

pub use table::{JobError, JobTable, StopAction, MAX_ENDED};

/// Milliseconds since the Unix epoch.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The head's job keeper: a thin shell around [`JobTable`], and the
/// keeper of the tasks its jobs submit ([`TaskTable`]) and of the training
/// runs they make ([`RunTable`]).
pub struct Jobs {
    table: JobTable,
    tasks: TaskTable,
    runs: RunTable,
    grace: Duration,
    endpoint: Endpoint,
    head: SocketAddr,
    membership: Addr<Membership>,
    events: Addr<ClusterEvents>,
    /// Where the job records go (none in tests that need no restart).
    store: Option<HeadStore>,
    /// Jobs a restarted head ended at its start, to end everywhere once
    /// the keeper runs.
    ended_at_start: Vec<(String, String)>,
}

impl Jobs {
    /// A keeper that ends attached jobs silent for `grace`, telling the
    /// nodes `membership` lists through `endpoint`; submitted drivers learn
    /// the head's address `head`.
    pub fn new(
        grace: Duration,
        endpoint: Endpoint,
        head: SocketAddr,
        membership: Addr<Membership>,
        events: Addr<ClusterEvents>,
    ) -> Self {
        Jobs {
            table: JobTable::default(),
            tasks: TaskTable::default(),
            runs: RunTable::default(),
            grace,
            endpoint,
            head,
            membership,
            events,
            store: None,
            ended_at_start: Vec::new(),
        }
    }

    /// This keeper, writing every job's changes to `store`, with the jobs
    /// the previous heads kept (`jobs`, none for a new cluster) and the
    /// nodes lost with them (`HeadStart::lost_nodes`).
    pub fn stored(
        self,
        store: HeadStore,
        jobs: Vec<StoredJob>,
        lost: &[(NodeIdentity, String)],
    ) -> Self {
        let (table, ended_at_start) = JobTable::restore(jobs, lost, Instant::now(), wall_ms());
        Jobs {
            table,
            store: Some(store),
            ended_at_start,
            ..self
        }
    }

    /// Writes the table's changes to the store; changes not written are
    /// tried again at the next write.
    fn persist(&mut self) -> Result<(), super::store::StoreError> {
        let (changed, forgotten) = self.table.take_changes();
        let written = match &self.store {
            Some(store) if !changed.is_empty() || !forgotten.is_empty() => {
                store.put_jobs(&changed, &forgotten)
            }
            _ => Ok(()),
        };
        if written.is_err() {
            self.table.unwritten(changed, forgotten);
        }
        written
    }

    /// [`Jobs::persist`] where a failed write cannot refuse anything: the
    /// change holds in memory and is said in the log.
    fn persist_or_warn(&mut self) {
        if let Err(e) = self.persist() {
            warn!("a job's change is not in the head's store; a restarted head would not know it: {e}");
        }
    }

    /// Ends `job` on every node (in the background), and its training
    /// runs still running here (their supervisor went with the job).
    fn end_everywhere(&mut self, job: String, reason: String, ctx: &mut Context<Self>) {
        info!(%job, "job ended: {reason}; killing its actors and releasing its bundles");
        self.runs.end_job(&job, &reason, wall_ms());
        let end = end_job(
            self.endpoint.clone(),
            self.membership.clone(),
            self.events.clone(),
            job,
            reason,
        );
        ctx.spawn(end.into_actor(self));
    }
}

impl Actor for Jobs {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.persist_or_warn();
        for (job, reason) in std::mem::take(&mut self.ended_at_start) {
            let pending = self.table.get(&job).is_some_and(|r| r.driver_pid.is_none());
            if pending {
                self.stop_driver(&job, ctx);
            }
            self.end_everywhere(job, reason, ctx);
        }
        ctx.run_interval(CHECK_EVERY, |jobs, ctx| {
            let expired = jobs.table.expire(Instant::now(), jobs.grace, wall_ms());
            jobs.persist_or_warn();
            for (job, reason) in expired {
                jobs.end_everywhere(job, reason, ctx);
            }
            let status = jobs.membership.send(membership::Status);
            ctx.spawn(status.into_actor(jobs).map(|status, jobs, ctx| {
                let Ok(status) = status else { return };
                let alive: Vec<&str> = status.alive().map(|n| n.id.as_str()).collect();
                let lost = jobs.table.nodes_lost(&alive, wall_ms());
                jobs.persist_or_warn();
                for (job, reason) in lost {
                    jobs.end_everywhere(job, reason, ctx);
                }
            }));
        });
    }
}

/// Sends `request` to the live node named `node`.
async fn call_node(
    endpoint: Endpoint,
    membership: Addr<Membership>,
    node: String,
    request: JobRequest,
    deadline: Duration,
) -> Result<JobReply, String> {
    let status = membership
        .send(membership::Status)
        .await
        .map_err(|e| e.to_string())?;
    let target = status
        .alive()
        .find(|n| n.id == node)
        .ok_or_else(|| format!("node {node} is not an alive member (nimbus status lists them)"))?;
    let connection = endpoint
        .connect(target.address, Some(&target.identity()))
        .await
        .map_err(|e| e.to_string())?;
    let body =
        rmp_serde::to_vec_named(&ControlRequest::from(request)).map_err(|e| e.to_string())?;
    let reply = connection
        .request(body, RequestOptions::control().with_deadline(deadline))
        .await
        .map_err(|e| e.to_string())?;
    let reply = rmp_serde::from_slice(&reply).map_err(|e| e.to_string())?;
    <JobRequest as crate::cluster::Subsystem>::expect(reply).map_err(|e| e.to_string())
}

/// Every live node ends `job`; then `JobEnded` is published.
async fn end_job(
    endpoint: Endpoint,
    membership: Addr<Membership>,
    events: Addr<ClusterEvents>,
    job: String,
    reason: String,
) {
    let Ok(status) = membership.send(membership::Status).await else {
        return;
    };
    let request = JobRequest::EndJob { job: job.clone() };
    let Ok(body) = rmp_serde::to_vec_named(&ControlRequest::from(request)) else {
        return;
    };
    for node in status.alive() {
        let ended = match endpoint.connect(node.address, Some(&node.identity())).await {
            Ok(connection) => connection
                .request(body.clone(), RequestOptions::control())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = ended {
            warn!(%job, node = %node.id, "could not end the job there: {e}");
        }
    }
    events.do_send(Publish(ClusterEventKind::JobEnded { job, reason }));
}

/// Attached step 1, at the head: a driver of `job` is alive. Answers false
/// for a job that ended.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct DriverAlive {
    /// The job.
    pub job: String,
    /// The driver's command line.
    pub entrypoint: String,
    /// What the driver runs, if it says.
    pub versions: Option<Versions>,
}

impl Handler<DriverAlive> for Jobs {
    type Result = bool;

    fn handle(&mut self, msg: DriverAlive, _: &mut Self::Context) -> bool {
        let (now, wall) = (Instant::now(), wall_ms());
        let alive = self
            .table
            .heard(&msg.job, &msg.entrypoint, msg.versions, now, wall);
        self.persist_or_warn();
        alive
    }
}

/// Attached step 3: a driver ended.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DriverDone {
    /// The job.
    pub job: String,
    /// Not in a panic.
    pub ok: bool,
}

impl Handler<DriverDone> for Jobs {
    type Result = ();

    fn handle(&mut self, msg: DriverDone, ctx: &mut Self::Context) {
        let ended = self.table.done(&msg.job, msg.ok, wall_ms());
        self.persist_or_warn();
        if let Some(reason) = ended {
            self.end_everywhere(msg.job, reason, ctx);
        }
    }
}

/// Submitted step 1: run a driver program on a node.
#[derive(Message)]
#[rtype(result = "Result<JobRecord, JobError>")]
pub struct Submit(pub JobSubmission);

impl Handler<Submit> for Jobs {
    type Result = ResponseActFuture<Self, Result<JobRecord, JobError>>;

    fn handle(&mut self, Submit(submission): Submit, _: &mut Self::Context) -> Self::Result {
        let id = loop {
            let id = format!("{:08x}", rand::random::<u32>());
            if self.table.get(&id).is_none() {
                break id;
            }
        };
        let endpoint = self.endpoint.clone();
        let membership = self.membership.clone();
        let head = self.head;
        let pick = async move {
            let status = membership.send(membership::Status).await.ok();
            let node = match (&submission.node, &status) {
                (Some(node), _) => node.clone(),
                (None, Some(status)) => status
                    .alive()
                    .find(|n| n.head)
                    .map(|n| n.id.clone())
                    .unwrap_or_default(),
                (None, None) => String::new(),
            };
            (submission, node, endpoint, membership, head)
        };
        Box::pin(pick.into_actor(self).then(
            move |(submission, node, endpoint, membership, head), jobs, _| {
                let recorded = jobs
                    .table
                    .submit(&id, &submission, &node, Instant::now(), wall_ms())
                    .and_then(|_| {
                        jobs.persist().map_err(|e| {
                            let detail = e.to_string();
                            jobs.table.start_failed(&id, &detail, wall_ms());
                            jobs.persist_or_warn();
                            JobError::NotRecorded {
                                job: id.clone(),
                                detail,
                            }
                        })
                    });
                let run = async move {
                    recorded?;
                    let request = JobRequest::RunDriver {
                        job: id.clone(),
                        submission,
                        head,
                    };
                    let reply = call_node(
                        endpoint,
                        membership,
                        node.clone(),
                        request,
                        RUN_DRIVER_DEADLINE,
                    )
                    .await;
                    let detail = match reply {
                        Ok(JobReply::DriverStarted { pid }) => return Ok((id, Ok(pid))),
                        Ok(reply) => format!("unexpected reply {reply:?}"),
                        Err(e) => e,
                    };
                    Ok((
                        id.clone(),
                        Err(JobError::NotStarted {
                            node,
                            job: id,
                            detail,
                        }),
                    ))
                };
                run.into_actor(jobs).map(|ran, jobs, ctx| {
                    let (id, started) = ran?;
                    match started {
                        Ok(pid) => {
                            let live = jobs.table.started(&id, pid);
                            jobs.persist_or_warn();
                            if !live {
                                jobs.stop_driver(&id, ctx);
                            }
                        }
                        Err(e) => {
                            jobs.table.start_failed(&id, &e.to_string(), wall_ms());
                            jobs.persist_or_warn();
                            return Err(e);
                        }
                    }
                    let record = jobs.table.get(&id).cloned();
                    record.ok_or(JobError::Unknown { job: id })
                })
            },
        ))
    }
}

impl Jobs {
    /// Asks the node that runs `job`'s driver to stop it (in the
    /// background; its `DriverExited` ends the job).
    fn stop_driver(&self, job: &str, ctx: &mut Context<Self>) {
        let Some(node) = self.table.get(job).and_then(|r| r.node.clone()) else {
            return;
        };
        let request = JobRequest::StopDriver {
            job: job.to_string(),
        };
        let call = call_node(
            self.endpoint.clone(),
            self.membership.clone(),
            node.clone(),
            request,
            Duration::from_secs(10),
        );
        let job = job.to_string();
        ctx.spawn(
            async move {
                if let Err(e) = call.await {
                    warn!(%job, %node, "could not ask the node to stop the job's driver: {e}");
                }
            }
            .into_actor(self),
        );
    }
}

/// Step 3: stop a job.
#[derive(Message)]
#[rtype(result = "Result<JobRecord, JobError>")]
pub struct Stop(pub String);

impl Handler<Stop> for Jobs {
    type Result = Result<JobRecord, JobError>;

    fn handle(&mut self, Stop(job): Stop, ctx: &mut Self::Context) -> Self::Result {
        let action = self.table.stop(&job, wall_ms())?;
        self.persist_or_warn();
        match action {
            StopAction::StopDriver { .. } => self.stop_driver(&job, ctx),
            StopAction::EndNow => {
                self.end_everywhere(job.clone(), "stopped on request".into(), ctx)
            }
        }
        self.table
            .get(&job)
            .cloned()
            .ok_or(JobError::Unknown { job })
    }
}

/// Every job the head knows.
#[derive(Message)]
#[rtype(result = "Vec<JobRecord>")]
pub struct List;

impl Handler<List> for Jobs {
    type Result = MessageResult<List>;

    fn handle(&mut self, _: List, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.table.list())
    }
}

/// A process reports the latest state of its tasks (`tasks.rs`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct TaskStates(pub Vec<TaskRecord>);

impl Handler<TaskStates> for Jobs {
    type Result = ();

    fn handle(&mut self, TaskStates(records): TaskStates, _: &mut Self::Context) {
        self.tasks.update(records);
    }
}

/// The tasks the head knows.
#[derive(Message)]
#[rtype(result = "Vec<TaskRecord>")]
pub struct ListTasks;

impl Handler<ListTasks> for Jobs {
    type Result = MessageResult<ListTasks>;

    fn handle(&mut self, _: ListTasks, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.tasks.list())
    }
}

/// A training run's events (`runs.rs`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct RunEvents(pub RunHeader, pub Vec<RunEvent>);

impl Handler<RunEvents> for Jobs {
    type Result = ();

    fn handle(&mut self, RunEvents(header, events): RunEvents, _: &mut Self::Context) {
        self.runs.apply(header, events);
    }
}

/// The training runs the head knows, without their points.
#[derive(Message)]
#[rtype(result = "Vec<RunRecord>")]
pub struct ListRuns;

impl Handler<ListRuns> for Jobs {
    type Result = MessageResult<ListRuns>;

    fn handle(&mut self, _: ListRuns, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.runs.list())
    }
}

/// One training run, with its points.
#[derive(Message)]
#[rtype(result = "Option<RunRecord>")]
pub struct GetRun(pub String);

impl Handler<GetRun> for Jobs {
    type Result = Option<RunRecord>;

    fn handle(&mut self, GetRun(id): GetRun, _: &mut Self::Context) -> Self::Result {
        self.runs.get(&id)
    }
}

/// Submitted step 2: a node incarnation died or left (the head's events,
/// to which the keeper subscribes): the jobs whose drivers ran there end
/// now, before a new incarnation of the same name can take its place.
impl Handler<ClusterEvent> for Jobs {
    type Result = ();

    fn handle(&mut self, event: ClusterEvent, ctx: &mut Self::Context) {
        let (node, why) = match &event.kind {
            ClusterEventKind::NodeDead { node, reason } => (node, format!("died: {reason}")),
            ClusterEventKind::NodeLeft { node } => (node, "left the cluster".to_string()),
            _ => return,
        };
        let ended = self.table.node_gone(&node.name, &why, wall_ms());
        self.persist_or_warn();
        for (job, reason) in ended {
            self.end_everywhere(job, reason, ctx);
        }
    }
}

/// Submitted step 2: `node` reports that `job`'s driver exited.
#[derive(Message)]
#[rtype(result = "Result<(), JobError>")]
pub struct Exited {
    /// The job.
    pub job: String,
    /// The node that reported it (it must be the job's).
    pub node: String,
    /// How the driver ended.
    pub exit: DeathCause,
}

impl Handler<Exited> for Jobs {
    type Result = Result<(), JobError>;

    fn handle(&mut self, msg: Exited, ctx: &mut Self::Context) -> Self::Result {
        let ended = self
            .table
            .exited(&msg.job, &msg.node, msg.exit, wall_ms())?;
        self.persist_or_warn();
        if let Some(reason) = ended {
            self.end_everywhere(msg.job, reason, ctx);
        }
        Ok(())
    }
}
