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
//! bundles (`crate::node`'s `manager.rs`). The head keeps the records of
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

use std::collections::{BTreeSet, HashMap, VecDeque};
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
    valid_job_id, ClusterEvent, ClusterEventKind, ControlReply, ControlRequest, DeathCause,
    JobRecord, JobRequest, JobState, JobSubmission, RunEvent, RunHeader, RunRecord, TaskRecord,
    Versions,
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
/// Ended jobs whose records the head keeps.
pub const MAX_ENDED: usize = 1000;
/// The longest job name the head takes.
const MAX_NAME: usize = 256;

/// Why the head refused a job request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// No job has that id.
    #[error("no job {job} (nimbus job list shows the jobs this head knows)")]
    Unknown {
        /// The id asked for.
        job: String,
    },
    /// The job is over.
    #[error("job {job} has ended already: {state}")]
    Ended {
        /// The job.
        job: String,
        /// How it ended.
        state: JobState,
    },
    /// The submission is not runnable.
    #[error("job submission refused: {0}")]
    BadSubmission(String),
    /// A node reported a job it does not run.
    #[error("node {node} does not run job {job}'s driver")]
    NotItsNode {
        /// The node that reported.
        node: String,
        /// The job.
        job: String,
    },
    /// The head could not record the job in its store.
    #[error("the head could not record job {job} in its store: {detail}")]
    NotRecorded {
        /// The job.
        job: String,
        /// What the store said.
        detail: String,
    },
    /// The node could not start the driver.
    #[error("node {node} could not start job {job}'s driver: {detail}")]
    NotStarted {
        /// The node.
        node: String,
        /// The job.
        job: String,
        /// What went wrong.
        detail: String,
    },
}

/// A job and what the table needs to decide about it.
#[derive(Debug)]
struct Entry {
    record: JobRecord,
    /// When its driver was last heard from (attached jobs).
    heard: Instant,
    /// A stop was asked for (submitted jobs: its driver is being stopped).
    stopping: bool,
}

/// What the head must do to stop a job.
#[derive(Debug, PartialEq, Eq)]
pub enum StopAction {
    /// Ask this node to stop the job's driver; the job ends when it exits.
    StopDriver {
        /// The node.
        node: String,
    },
    /// The job ended now (an attached or a pending job): end it everywhere.
    EndNow,
}

/// The jobs the head knows, as a plain state machine (time passed in:
/// `now` for deadlines, `wall_ms` for the records).
#[derive(Debug, Default)]
pub struct JobTable {
    jobs: HashMap<String, Entry>,
    /// Ended jobs, oldest first, to forget the oldest past [`MAX_ENDED`].
    ended: VecDeque<String>,
    /// Jobs whose records changed since [`JobTable::take_changes`].
    changed: BTreeSet<String>,
    /// Jobs forgotten since [`JobTable::take_changes`].
    forgotten: Vec<String>,
}

impl JobTable {
    /// The table a restarted head had (`head/store.rs`): every live job's
    /// grace starts again at `now`. The submitted jobs whose driver ran on
    /// a node in `lost` (with why it is lost: the previous head, nodes
    /// recorded dead) end now; they are returned with the reason.
    pub fn restore(
        jobs: Vec<StoredJob>,
        lost: &[(NodeIdentity, String)],
        now: Instant,
        wall_ms: u64,
    ) -> (Self, Vec<(String, String)>) {
        let mut table = JobTable::default();
        let mut ended: Vec<(u64, String)> = Vec::new();
        for job in jobs {
            if job.record.state.is_terminal() {
                ended.push((job.record.end_ms.unwrap_or(0), job.record.id.clone()));
            }
            let entry = Entry {
                heard: now,
                stopping: job.stopping,
                record: job.record,
            };
            table.jobs.insert(entry.record.id.clone(), entry);
        }
        ended.sort();
        table.ended = ended.into_iter().map(|(_, id)| id).collect();
        let orphaned: Vec<(String, String)> = table
            .jobs
            .values()
            .filter(|e| e.record.submitted && !e.record.state.is_terminal())
            .filter_map(|e| {
                let node = e.record.node.as_deref()?;
                if let Some((_, why)) = lost.iter().find(|(lost, _)| lost.name == node) {
                    let reason = format!("its driver's node {node} was lost: {why}");
                    return Some((e.record.id.clone(), reason));
                }
                // The head died between recording the job and hearing that
                // its driver started: no one will report on it.
                (e.record.state == JobState::Pending).then(|| {
                    let reason = "the head restarted while its driver was being started (its node is asked to stop it)";
                    (e.record.id.clone(), reason.to_string())
                })
            })
            .collect();
        for (job, reason) in &orphaned {
            table.end(job, JobState::Failed, reason, wall_ms);
        }
        (table, orphaned)
    }

    /// Hands back changes [`JobTable::take_changes`] gave that could not be
    /// written: the next call gives them again.
    pub fn unwritten(&mut self, changed: Vec<StoredJob>, forgotten: Vec<String>) {
        for job in changed {
            if self.jobs.contains_key(&job.record.id) {
                self.changed.insert(job.record.id);
            }
        }
        self.forgotten.extend(forgotten);
    }

    /// The records changed and the jobs forgotten since the last call, to
    /// be written to the head's store.
    pub fn take_changes(&mut self) -> (Vec<StoredJob>, Vec<String>) {
        let changed = std::mem::take(&mut self.changed)
            .into_iter()
            .filter_map(|id| self.jobs.get(&id))
            .map(|entry| StoredJob {
                record: entry.record.clone(),
                stopping: entry.stopping,
            })
            .collect();
        (changed, std::mem::take(&mut self.forgotten))
    }

    /// Attached step 1-2: `job`'s driver is alive at `now`; false for a job
    /// that ended. An unknown job is recorded as an attached one. What the
    /// driver runs (`versions`) is kept from the first beat that says it.
    pub fn heard(
        &mut self,
        job: &str,
        entrypoint: &str,
        versions: Option<Versions>,
        now: Instant,
        wall_ms: u64,
    ) -> bool {
        match self.jobs.get_mut(job) {
            Some(entry) if entry.record.state.is_terminal() => false,
            Some(entry) => {
                entry.heard = now;
                if entry.record.versions.is_none() && versions.is_some() {
                    entry.record.versions = versions;
                    self.changed.insert(job.to_string());
                }
                true
            }
            None => {
                let record = JobRecord {
                    id: job.to_string(),
                    name: None,
                    submitted: false,
                    entrypoint: entrypoint.to_string(),
                    node: None,
                    state: JobState::Running,
                    message: String::new(),
                    exit: None,
                    driver_pid: None,
                    start_ms: wall_ms,
                    end_ms: None,
                    versions,
                };
                self.insert(record, now);
                true
            }
        }
    }

    /// Attached step 2: the attached jobs silent for longer than `grace` at
    /// `now`, which end now (each once), with the reason.
    pub fn expire(&mut self, now: Instant, grace: Duration, wall_ms: u64) -> Vec<(String, String)> {
        let silent: Vec<String> = self
            .jobs
            .values()
            .filter(|e| !e.record.submitted && !e.record.state.is_terminal())
            .filter(|e| now.saturating_duration_since(e.heard) > grace)
            .map(|e| e.record.id.clone())
            .collect();
        silent
            .into_iter()
            .map(|job| {
                let reason = format!(
                    "its driver was not heard from for {grace:?} (it exited, was killed, or lost the head; --driver-grace-s)"
                );
                self.end(&job, JobState::Failed, &reason, wall_ms);
                (job, reason)
            })
            .collect()
    }

    /// Attached step 3: `job`'s driver ended (`ok`: not in a panic); the
    /// reason the job ends now, if it is a live attached job (a submitted
    /// job ends when its node reports its driver's exit).
    pub fn done(&mut self, job: &str, ok: bool, wall_ms: u64) -> Option<String> {
        let entry = self.jobs.get(job)?;
        if entry.record.submitted || entry.record.state.is_terminal() {
            return None;
        }
        let (state, reason) = match ok {
            true => (JobState::Succeeded, "its driver ended"),
            false => (JobState::Failed, "its driver ended in a panic"),
        };
        self.end(job, state, reason, wall_ms);
        Some(reason.to_string())
    }

    /// Submitted step 1: records a submission as `id`, `PENDING`, to run on
    /// `node`.
    pub fn submit(
        &mut self,
        id: &str,
        submission: &JobSubmission,
        node: &str,
        now: Instant,
        wall_ms: u64,
    ) -> Result<JobRecord, JobError> {
        check(submission)?;
        if !valid_job_id(id) || self.jobs.contains_key(id) {
            return Err(JobError::BadSubmission(format!(
                "job id {id:?} is taken or malformed"
            )));
        }
        let record = JobRecord {
            id: id.to_string(),
            name: submission.name.clone(),
            submitted: true,
            entrypoint: submission.entrypoint.join(" "),
            node: Some(node.to_string()),
            state: JobState::Pending,
            message: String::new(),
            exit: None,
            driver_pid: None,
            start_ms: wall_ms,
            end_ms: None,
            versions: None,
        };
        self.insert(record.clone(), now);
        Ok(record)
    }

    /// Submitted step 1: the node started `job`'s driver as `pid`. False if
    /// the job was stopped meanwhile (the driver must be stopped too).
    pub fn started(&mut self, job: &str, pid: u32) -> bool {
        let Some(entry) = self.jobs.get_mut(job) else {
            return false;
        };
        entry.record.driver_pid = Some(pid);
        self.changed.insert(job.to_string());
        if entry.record.state == JobState::Pending {
            entry.record.state = JobState::Running;
            return true;
        }
        false
    }

    /// Submitted step 1: the node could not start `job`'s driver.
    pub fn start_failed(&mut self, job: &str, why: &str, wall_ms: u64) {
        self.end(job, JobState::Failed, why, wall_ms);
    }

    /// Submitted step 2: `job`'s driver exited from `node`; the reason the
    /// job ends now, if it was live.
    pub fn exited(
        &mut self,
        job: &str,
        node: &str,
        exit: DeathCause,
        wall_ms: u64,
    ) -> Result<Option<String>, JobError> {
        let entry = self.jobs.get_mut(job).ok_or_else(|| JobError::Unknown {
            job: job.to_string(),
        })?;
        if entry.record.node.as_deref() != Some(node) {
            return Err(JobError::NotItsNode {
                node: node.to_string(),
                job: job.to_string(),
            });
        }
        entry.record.exit = Some(exit.clone());
        self.changed.insert(job.to_string());
        if entry.record.state.is_terminal() {
            return Ok(None);
        }
        let (state, reason) = match (&exit, entry.stopping) {
            (_, true) => (
                JobState::Stopped,
                format!("stopped on request; its driver {exit}"),
            ),
            (DeathCause::Exited { code: 0 }, false) => {
                (JobState::Succeeded, "its driver exited with code 0".into())
            }
            (exit, false) => (JobState::Failed, format!("its driver {exit}")),
        };
        self.end(job, state, &reason, wall_ms);
        Ok(Some(reason))
    }

    /// Submitted step 2: the live submitted jobs on node `node`, which died
    /// or left (`why`), end now; they are returned with the reason.
    pub fn node_gone(&mut self, node: &str, why: &str, wall_ms: u64) -> Vec<(String, String)> {
        let on_it: Vec<String> = self
            .jobs
            .values()
            .filter(|e| e.record.submitted && !e.record.state.is_terminal())
            .filter(|e| e.record.node.as_deref() == Some(node))
            .map(|e| e.record.id.clone())
            .collect();
        on_it
            .into_iter()
            .map(|job| {
                let reason = format!("its driver's node {node} {why}");
                self.end(&job, JobState::Failed, &reason, wall_ms);
                (job, reason)
            })
            .collect()
    }

    /// Submitted step 2: the live submitted jobs whose node is not among
    /// `alive`, which end now, with the reason.
    pub fn nodes_lost(&mut self, alive: &[&str], wall_ms: u64) -> Vec<(String, String)> {
        let lost: Vec<(String, String)> = self
            .jobs
            .values()
            .filter(|e| e.record.submitted && !e.record.state.is_terminal())
            .filter_map(|e| {
                let node = e.record.node.as_deref()?;
                (!alive.contains(&node)).then(|| (e.record.id.clone(), node.to_string()))
            })
            .collect();
        lost.into_iter()
            .map(|(job, node)| {
                let reason = format!("its driver's node {node} left the cluster");
                self.end(&job, JobState::Failed, &reason, wall_ms);
                (job, reason)
            })
            .collect()
    }

    /// Step 3: how to stop `job`.
    pub fn stop(&mut self, job: &str, wall_ms: u64) -> Result<StopAction, JobError> {
        let entry = self.jobs.get_mut(job).ok_or_else(|| JobError::Unknown {
            job: job.to_string(),
        })?;
        if entry.record.state.is_terminal() {
            return Err(JobError::Ended {
                job: job.to_string(),
                state: entry.record.state,
            });
        }
        entry.stopping = true;
        self.changed.insert(job.to_string());
        match (&entry.record.node, entry.record.state) {
            (Some(node), JobState::Running) => Ok(StopAction::StopDriver { node: node.clone() }),
            _ => {
                self.end(job, JobState::Stopped, "stopped on request", wall_ms);
                Ok(StopAction::EndNow)
            }
        }
    }

    /// The record of `job`.
    pub fn get(&self, job: &str) -> Option<&JobRecord> {
        self.jobs.get(job).map(|e| &e.record)
    }

    /// Every job, oldest first.
    pub fn list(&self) -> Vec<JobRecord> {
        let mut all: Vec<JobRecord> = self.jobs.values().map(|e| e.record.clone()).collect();
        all.sort_by(|a, b| (a.start_ms, &a.id).cmp(&(b.start_ms, &b.id)));
        all
    }

    fn insert(&mut self, record: JobRecord, now: Instant) {
        self.changed.insert(record.id.clone());
        let entry = Entry {
            record,
            heard: now,
            stopping: false,
        };
        self.jobs.insert(entry.record.id.clone(), entry);
    }

    /// Ends `job` in `state`, and forgets the oldest ended jobs past
    /// [`MAX_ENDED`].
    fn end(&mut self, job: &str, state: JobState, message: &str, wall_ms: u64) {
        let Some(entry) = self.jobs.get_mut(job) else {
            return;
        };
        if entry.record.state.is_terminal() {
            return;
        }
        entry.record.state = state;
        entry.record.message = message.to_string();
        entry.record.end_ms = Some(wall_ms);
        self.changed.insert(job.to_string());
        self.ended.push_back(job.to_string());
        while self.ended.len() > MAX_ENDED {
            if let Some(oldest) = self.ended.pop_front() {
                self.jobs.remove(&oldest);
                self.changed.remove(&oldest);
                self.forgotten.push(oldest);
            }
        }
    }
}

/// Refuses a submission that cannot run, naming what is wrong.
fn check(submission: &JobSubmission) -> Result<(), JobError> {
    let bad = |why: String| Err(JobError::BadSubmission(why));
    match submission.entrypoint.first() {
        None => return bad("no program to run (nimbus job submit -- PROGRAM ARGS...)".into()),
        Some(program) if program.is_empty() => return bad("the program is an empty string".into()),
        Some(_) => {}
    }
    if let Some(arg) = submission.entrypoint.iter().find(|a| a.contains('\0')) {
        return bad(format!("argument {arg:?} holds a NUL byte"));
    }
    if let Some(name) = &submission.name {
        if name.len() > MAX_NAME || name.contains('\0') {
            return bad(format!(
                "the name must be at most {MAX_NAME} bytes without NUL"
            ));
        }
    }
    for (key, value) in &submission.env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return bad(format!(
                "environment variable {key:?}: a name needs no '=' or NUL, a value no NUL"
            ));
        }
    }
    Ok(())
}

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
    request: ControlRequest,
    deadline: Duration,
) -> Result<ControlReply, String> {
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
    let body = rmp_serde::to_vec_named(&request).map_err(|e| e.to_string())?;
    let reply = connection
        .request(body, RequestOptions::control().with_deadline(deadline))
        .await
        .map_err(|e| e.to_string())?;
    rmp_serde::from_slice(&reply).map_err(|e| e.to_string())
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
    let request = ControlRequest::Jobs(JobRequest::EndJob { job: job.clone() });
    let Ok(body) = rmp_serde::to_vec_named(&request) else {
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
                    let request = ControlRequest::Jobs(JobRequest::RunDriver {
                        job: id.clone(),
                        submission,
                        head,
                    });
                    let reply = call_node(
                        endpoint,
                        membership,
                        node.clone(),
                        request,
                        RUN_DRIVER_DEADLINE,
                    )
                    .await;
                    let detail = match reply {
                        Ok(ControlReply::DriverStarted { pid }) => return Ok((id, Ok(pid))),
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
        let request = ControlRequest::Jobs(JobRequest::StopDriver {
            job: job.to_string(),
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn submission(program: &str) -> JobSubmission {
        JobSubmission {
            name: Some("nightly".into()),
            entrypoint: vec![program.into(), "--epochs".into(), "3".into()],
            env: vec![("K".into(), "V".into())],
            working_dir: None,
            node: None,
        }
    }

    #[test]
    fn an_attached_job_ends_once_after_its_grace_and_stays_ended() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        assert!(table.heard("a", "prog a", None, t0, 1));
        assert!(table.heard("b", "prog b", None, t0, 2));
        assert!(table.heard("a", "prog a", None, t0 + Duration::from_secs(20), 3));
        assert!(
            table.expire(t0 + grace, grace, 4).is_empty(),
            "not past it yet"
        );
        let ended = table.expire(t0 + grace + Duration::from_secs(1), grace, 5);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].0, "b");
        let b = table.get("b").unwrap();
        assert_eq!(
            (b.state, b.end_ms, b.entrypoint.as_str()),
            (JobState::Failed, Some(5), "prog b")
        );
        assert_eq!(table.get("a").unwrap().state, JobState::Running);
        assert!(table
            .expire(t0 + grace * 2, grace, 6)
            .iter()
            .all(|(job, _)| job == "a"));
        assert!(
            !table.heard("b", "prog b", None, t0 + grace * 3, 7),
            "an ended job stays ended"
        );
        assert!(table.expire(t0 + grace * 9, grace, 8).is_empty());
        assert_eq!(table.list().len(), 2, "ended jobs are still listed");
        assert!(table.heard("d", "prog d", None, t0, 9));
        assert!(table.done("d", true, 9).is_some());
        assert_eq!(table.get("d").unwrap().state, JobState::Succeeded);
        assert!(table.done("d", true, 10).is_none(), "once");
        assert!(table.heard("c", "prog c", None, t0, 11));
        assert!(table.done("c", false, 12).is_some());
        assert_eq!(table.get("c").unwrap().state, JobState::Failed);
        table
            .submit("s", &submission("prog"), "head", t0, 13)
            .unwrap();
        table.started("s", 1);
        assert!(
            table.done("s", true, 14).is_none(),
            "its node reports a submitted driver's end"
        );
    }

    #[test]
    fn a_submitted_job_runs_and_ends_as_its_driver_exits() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(1);
        let job = table
            .submit("j1", &submission("/bin/prog"), "head", t0, 10)
            .unwrap();
        assert_eq!(
            (job.state, job.entrypoint.as_str()),
            (JobState::Pending, "/bin/prog --epochs 3")
        );
        assert!(table.started("j1", 42));
        assert!(
            table.heard("j1", "", None, t0, 11),
            "its driver's beats are taken"
        );
        assert!(
            table.expire(t0 + grace * 100, grace, 12).is_empty(),
            "a submitted job is watched by its node, not by beats"
        );
        assert_eq!(
            table.exited("j1", "node-2", DeathCause::Exited { code: 0 }, 13),
            Err(JobError::NotItsNode {
                node: "node-2".into(),
                job: "j1".into()
            })
        );
        let ended = table
            .exited("j1", "head", DeathCause::Exited { code: 0 }, 14)
            .unwrap();
        assert!(ended.is_some());
        let record = table.get("j1").unwrap();
        assert_eq!(
            (record.state, record.driver_pid, record.end_ms),
            (JobState::Succeeded, Some(42), Some(14))
        );
        assert_eq!(record.exit_status(), 0);

        table
            .submit("j2", &submission("prog"), "head", t0, 20)
            .unwrap();
        table.started("j2", 43);
        table
            .exited("j2", "head", DeathCause::Exited { code: 3 }, 21)
            .unwrap();
        let record = table.get("j2").unwrap();
        assert_eq!((record.state, record.exit_status()), (JobState::Failed, 3));
        assert!(record.message.contains('3'), "{}", record.message);
        assert_eq!(
            table
                .exited("j2", "head", DeathCause::Exited { code: 0 }, 22)
                .unwrap(),
            None,
            "an ended job ends once"
        );
    }

    #[test]
    fn a_stopped_job_ends_stopped_once_its_driver_exits() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        table
            .submit("j", &submission("prog"), "node-1", t0, 1)
            .unwrap();
        table.started("j", 7);
        assert_eq!(
            table.stop("j", 2),
            Ok(StopAction::StopDriver {
                node: "node-1".into()
            })
        );
        assert_eq!(
            table.get("j").unwrap().state,
            JobState::Running,
            "until it exits"
        );
        table
            .exited("j", "node-1", DeathCause::Killed { signal: 15 }, 3)
            .unwrap();
        let record = table.get("j").unwrap();
        assert_eq!(
            (record.state, record.exit_status()),
            (JobState::Stopped, 128 + 15)
        );
        assert_eq!(
            table.stop("j", 4),
            Err(JobError::Ended {
                job: "j".into(),
                state: JobState::Stopped
            })
        );
        assert_eq!(
            table.stop("nope", 4),
            Err(JobError::Unknown { job: "nope".into() })
        );

        assert!(table.heard("attached", "prog", None, t0, 5));
        assert_eq!(table.stop("attached", 6), Ok(StopAction::EndNow));
        assert_eq!(table.get("attached").unwrap().state, JobState::Stopped);

        table
            .submit("pending", &submission("prog"), "node-1", t0, 7)
            .unwrap();
        assert_eq!(table.stop("pending", 8), Ok(StopAction::EndNow));
        assert!(
            !table.started("pending", 9),
            "a driver started after its stop is stopped"
        );
    }

    #[test]
    fn jobs_on_a_lost_node_fail_and_bad_submissions_are_refused() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        table
            .submit("j", &submission("prog"), "node-1", t0, 1)
            .unwrap();
        table.started("j", 7);
        assert!(table.nodes_lost(&["head", "node-1"], 2).is_empty());
        let lost = table.nodes_lost(&["head"], 3);
        assert_eq!(lost.len(), 1);
        assert_eq!(table.get("j").unwrap().state, JobState::Failed);

        let mut bad = submission("prog");
        bad.entrypoint.clear();
        assert!(matches!(
            table.submit("x", &bad, "head", t0, 4),
            Err(JobError::BadSubmission(_))
        ));
        let mut bad = submission("prog");
        bad.env.push(("A=B".into(), "c".into()));
        assert!(matches!(
            table.submit("y", &bad, "head", t0, 4),
            Err(JobError::BadSubmission(_))
        ));
        assert!(
            matches!(
                table.submit("j", &submission("prog"), "head", t0, 4),
                Err(JobError::BadSubmission(_))
            ),
            "an id is used once"
        );
        assert!(matches!(
            table.submit("../j", &submission("prog"), "head", t0, 4),
            Err(JobError::BadSubmission(_))
        ));
    }

    #[test]
    fn only_the_last_ended_jobs_are_kept() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENDED + 5 {
            let job = format!("j{i}");
            assert!(table.heard(&job, "prog", None, t0, i as u64));
            table.stop(&job, i as u64).unwrap();
        }
        assert!(table.heard("live", "prog", None, t0, 0));
        assert_eq!(table.list().len(), MAX_ENDED + 1);
        assert!(table.get("j0").is_none() && table.get("j5").is_some());
    }

    #[test]
    fn what_changed_is_handed_to_the_store_and_a_restored_table_goes_on() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        table
            .submit("m", &submission("prog"), "node-1", t0, 1)
            .unwrap();
        table
            .submit("h", &submission("prog"), "head", t0, 2)
            .unwrap();
        assert!(table.heard("a", "prog a", None, t0, 3));
        assert!(table.started("m", 41) && table.started("h", 42));
        let (changed, forgotten) = table.take_changes();
        let ids: Vec<&str> = changed.iter().map(|j| j.record.id.as_str()).collect();
        assert_eq!(ids, ["a", "h", "m"]);
        assert!(forgotten.is_empty());
        assert!(table.heard("a", "prog a", None, t0, 4));
        assert!(
            table.take_changes().0.is_empty(),
            "a beat changes no record"
        );
        table.stop("m", 5).unwrap();
        let (changed, _) = table.take_changes();
        assert!(changed.len() == 1 && changed[0].stopping);

        // A change the store did not take is given again.
        table.unwritten(changed, Vec::new());
        let (changed, _) = table.take_changes();
        assert!(changed.len() == 1 && changed[0].stopping);
        // Submitted, not started yet when the head died.
        table
            .submit("p", &submission("prog"), "node-1", t0, 5)
            .unwrap();
        let mut stored = changed;
        stored.extend(["a", "h", "p"].map(|id| StoredJob {
            record: table.get(id).unwrap().clone(),
            stopping: false,
        }));
        let lost = [(
            NodeIdentity {
                name: "head".into(),
                incarnation: crate::wire::Incarnation(1),
            },
            "the head restarted".to_string(),
        )];
        let t1 = t0 + Duration::from_secs(100);
        let (mut restored, mut ended) = JobTable::restore(stored, &lost, t1, 6);
        ended.sort();
        assert_eq!(ended.len(), 2);
        assert_eq!(ended[0].0, "h");
        assert!(ended[0].1.contains("head was lost"), "{}", ended[0].1);
        assert_eq!(ended[1].0, "p");
        assert!(ended[1].1.contains("being started"), "{}", ended[1].1);
        assert_eq!(restored.get("h").unwrap().state, JobState::Failed);
        assert_eq!(restored.get("p").unwrap().state, JobState::Failed);
        assert_eq!(restored.take_changes().0.len(), 2, "the ends are written");
        let grace = Duration::from_secs(30);
        assert!(
            restored.expire(t1 + grace, grace, 7).is_empty(),
            "the grace starts again at the restore"
        );
        let exited = restored.exited("m", "node-1", DeathCause::Exited { code: 0 }, 8);
        assert!(exited.unwrap().unwrap().contains("stopped on request"));
        assert_eq!(restored.get("m").unwrap().state, JobState::Stopped);
    }

    #[test]
    fn the_jobs_of_a_node_that_died_fail_at_once() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        table
            .submit("x", &submission("prog"), "node-1", t0, 1)
            .unwrap();
        table
            .submit("y", &submission("prog"), "node-2", t0, 1)
            .unwrap();
        assert!(table.started("x", 7) && table.started("y", 8));
        let ended = table.node_gone("node-1", "died: no heartbeat", 2);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].0, "x");
        assert!(ended[0].1.contains("node-1 died"), "{}", ended[0].1);
        assert_eq!(table.get("y").unwrap().state, JobState::Running);
        assert!(table.node_gone("node-1", "left the cluster", 3).is_empty());
    }
}
