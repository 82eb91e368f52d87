//! The `NodeManager` actor: owns this node's resources, keeps the head
//! informed of them by heartbeat, and runs actors in worker processes
//! (starting, reaping and restarting them).
//!
//! It reaches the head's actors in-process on the head, over QUIC
//! (control priority) elsewhere.
//!
//! - **Heartbeats**: at start, then every interval (the head's heartbeat
//!   timeout / 6), one at a time, carrying the resources in use. A refusal
//!   of this incarnation (stale, or declared dead) stops the node
//!   (`NodeError::Expelled`). An unanswered heartbeat is retried with
//!   backoff (doubling from the interval up to `MAX_BEAT_BACKOFF`, 2 s,
//!   each on a new connection once the old one is closed) while the node
//!   and its workers run on; no acknowledgement for the grace
//!   (`--head-grace-s`, 60 s by default: long enough for a head to be
//!   restarted) stops it (`NodeError::HeadLost`).
//! - **`StartActor(spec)`**: 1. without the program's binary (by hash),
//!   answer `NeedBinary`; 2. reserve the resources (in the spec's bundle,
//!   if any; GPU ids picked) or answer `NoCapacity`; 3. start the worker
//!   (`workers.rs`), with the fault rules only on an actor's first life;
//!   4. report `ActorUp` (record and spec) to the directory (reports
//!   about one actor reach it in order: `reports.rs`) and send a
//!   heartbeat, so the head's view includes the actor before the spawner
//!   hears of it; 5. answer `ActorStarted(record)`.
//! - **`WorkerExited`** (the worker's watcher): report `ActorDown` with the
//!   cause (`KilledOnRequest` if it was killed) and whether it restarts:
//!   with restarts left (`max_restarts`) and not killed, start a new
//!   incarnation from the same spec (new process, new address) and report
//!   it up; a restart that fails reports `RestartFailed`. Otherwise free
//!   its resources.
//! - **`KillActor`**: mark the actor killed (no restart) and SIGKILL its
//!   worker; the watcher reports the death.
//! - **`EndJob`**: 1. mark each of the job's (not detached) actors killed
//!   and SIGTERM its worker, which pushes its last metrics and exits
//!   (`crate::worker`); 2. SIGKILL those still running
//!   `END_JOB_GRACE` (3 s) later; 3. release the job's bundles.
//! - **`UploadBinary`**, **`ReadBinary`**: the binary cache
//!   (`binaries.rs`, its upload protocol); an upload's last chunk is hashed
//!   and synced on the blocking pool; a read returns at most
//!   `MAX_BINARY_CHUNK` (16 MiB), and a read of 0 bytes asks whether the
//!   binary is here.
//! - **`ReserveBundle`**, **`ReleaseBundle`**: set resources aside for a
//!   placement-group bundle, or give them back (`resources.rs`);
//!   **`ListBundles`**: what is set aside, for whom.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::client::{self, ClientError};
use crate::cluster::faults::ActorFault;
use crate::cluster::files::private_dir;
use crate::cluster::{
    ActorId, ActorRecord, ActorSpec, BundleId, BundleListing, ControlReply, ControlRequest,
    ResourceSet,
};
use crate::cluster::{DeathCause, MembershipRequest};
use crate::head::directory::{self, Directory};
use crate::head::membership::{self, Membership, MembershipError};
use crate::transport::{ConnectError, Endpoint, RequestError, RequestOptions};
use crate::wire::{Incarnation, NodeIdentity, RemoteError, RemoteErrorKind};

use super::authorize::{Confinement, Forbidden};
use super::binaries::BinaryCache;
use super::error::{BinaryError, GrantError, NoCapacity, NodeError, WorkerStartError};
use super::gpu_slots::GpuTake;
use super::host::HostSampler;
use super::libraries;
use super::logs;
use super::logs::Stream;
use super::output::JobOutput;
use super::reports::Reports;
use super::resources::{Grant, ResourcePool};
use super::workers::{self, LaunchedWorker, WorkerIdentities, WorkerLogs};
use crate::runtime::boot::WorkerBoot;

/// How the node manager reaches the head's actors.
#[derive(Clone)]
pub enum HeadLink {
    /// On the head: the actors themselves, no serialization.
    Local {
        /// The membership.
        membership: Addr<Membership>,
        /// The directory.
        directory: Addr<Directory>,
    },
    /// Elsewhere: the head's address, dialed again whenever the connection
    /// was lost.
    Remote {
        /// This node's endpoint.
        endpoint: Endpoint,
        /// The head's address.
        head: SocketAddr,
    },
}

/// What a node manager is made of.
pub struct NodeManagerConfig {
    /// This node.
    pub identity: NodeIdentity,
    /// Where it is reached.
    pub address: SocketAddr,
    /// What it offers.
    pub total: ResourceSet,
    /// How it reaches the head.
    pub head: HeadLink,
    /// The head's address, for worker processes.
    pub head_address: SocketAddr,
    /// Heartbeat interval.
    pub interval: Duration,
    /// A member that hears nothing from the head for this long stops.
    pub head_grace: Duration,
    /// Where fatal errors go.
    pub fatal: mpsc::UnboundedSender<NodeError>,
    /// How this node gives its workers their identities.
    pub workers: WorkerIdentities,
    /// The IP workers advertise.
    pub advertise_ip: IpAddr,
    /// The node's state directory (binaries, worker logs).
    pub state_dir: PathBuf,
    /// Actor fault rules (fault-injection tests; empty otherwise).
    pub actor_faults: Vec<ActorFault>,
    /// A worker log past this many bytes is rotated (`logs.rs`).
    pub log_max: u64,
}

/// Owns the node's resources and worker processes; heartbeats to the head.
pub struct NodeManager {
    config: NodeManagerConfig,
    resources: ResourcePool,
    last_ack: Instant,
    in_flight: bool,
    /// Heartbeats unanswered in a row, and when the next one may go.
    missed: (u32, Instant),
    /// What the head's directory is told of this node's actors.
    reports: Reports,
    binaries: BinaryCache,
    /// The cached binaries whose libraries this machine has.
    libraries: libraries::Checked,
    workers: HashMap<ActorId, Worker>,
    /// The job of each reserved bundle.
    bundle_jobs: HashMap<BundleId, String>,
    /// What workers printed, per job, for the jobs' drivers.
    output: JobOutput,
    /// How busy the machine is, sent with each heartbeat (`host.rs`).
    host: HostSampler,
}

/// An actor this node runs.
struct Worker {
    spec: ActorSpec,
    incarnation: Incarnation,
    /// Where this incarnation is reached.
    address: SocketAddr,
    /// Dead and being started again (its incarnation is the dead one's).
    relaunching: bool,
    restarts: u32,
    grant: Grant,
    pid: u32,
    /// Killed on request: its death is final, whatever its restart policy.
    killed: bool,
    /// Its stderr log, and how far it was read for the driver.
    err_log: (PathBuf, u64),
}

/// The longest wait between heartbeats the head does not answer.
const MAX_BEAT_BACKOFF: Duration = Duration::from_secs(2);

/// The outcome of one heartbeat.
enum Beat {
    Acked,
    /// The head refused this incarnation: stop.
    Expelled(String),
    /// No answer; try again next tick.
    Missed(String),
    /// The process at the head's address does not take this cluster's
    /// token: a head started again as another cluster. Stop.
    OtherCluster(String),
}

impl NodeManager {
    /// A node manager.
    pub fn new(config: NodeManagerConfig) -> Self {
        NodeManager {
            host: HostSampler::default(),
            binaries: BinaryCache::new(config.state_dir.join("binaries")),
            libraries: libraries::Checked::default(),
            resources: ResourcePool::new(
                config.total.clone(),
                crate::cluster::gpus::device_ids(config.total.amount(crate::cluster::GPU) as usize),
            ),
            reports: Reports::new(config.head.clone(), config.identity.clone()),
            config,
            last_ack: Instant::now(),
            in_flight: false,
            missed: (0, Instant::now()),
            workers: HashMap::new(),
            bundle_jobs: HashMap::new(),
            output: JobOutput::default(),
        }
    }

    fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || Instant::now() < self.missed.1 {
            return;
        }
        self.in_flight = true;
        let beat = self.beat();
        ctx.spawn(beat.into_actor(self).map(|beat, manager, _| {
            manager.in_flight = false;
            manager.record(beat);
        }));
    }

    /// One heartbeat to the head, with the resources in use now and how
    /// busy the machine is.
    fn beat(&mut self) -> BoxFuture<'static, Beat> {
        let node = self.config.identity.clone();
        let used = self.resources.used().clone();
        let host = self.host.sample();
        match &self.config.head {
            HeadLink::Local { membership, .. } => {
                let sent = membership.send(membership::Heartbeat { node, used, host });
                async move {
                    match sent.await {
                        Ok(Ok(())) => Beat::Acked,
                        Ok(Err(
                            e @ (MembershipError::Stale { .. } | MembershipError::Dead { .. }),
                        )) => Beat::Expelled(e.to_string()),
                        Ok(Err(e)) => Beat::Missed(e.to_string()),
                        Err(e) => Beat::Missed(e.to_string()),
                    }
                }
                .boxed()
            }
            HeadLink::Remote { endpoint, head } => {
                let call = call_head(
                    endpoint,
                    *head,
                    ControlRequest::Membership(MembershipRequest::Heartbeat { node, used, host }),
                    self.config.interval * 2,
                );
                async move {
                    match call.await {
                        Ok(_) => Beat::Acked,
                        Err(ClientError::Request(RequestError::Remote { error, .. }))
                            if error.kind == RemoteErrorKind::StaleIncarnation =>
                        {
                            Beat::Expelled(error.message)
                        }
                        Err(ClientError::Connect(e @ ConnectError::Unauthenticated { .. })) => {
                            Beat::OtherCluster(e.to_string())
                        }
                        Err(e) => Beat::Missed(e.to_string()),
                    }
                }
                .boxed()
            }
        }
    }

    fn record(&mut self, beat: Beat) {
        match beat {
            Beat::Acked => {
                // Also without a missed beat: a head that restarted between
                // two beats missed the reports made meanwhile.
                let due = self.reports.take_due();
                if self.missed.0 > 0 || due {
                    let silent = self.last_ack.elapsed();
                    info!(
                        "the head answers again after {silent:.1?}; telling it what this node runs"
                    );
                    self.report_again();
                }
                self.last_ack = Instant::now();
                self.missed = (0, self.last_ack);
            }
            Beat::Expelled(reason) => {
                let _ = self.config.fatal.send(NodeError::Expelled(reason));
            }
            Beat::OtherCluster(detail) => {
                let head = self.config.head_address;
                let _ = self
                    .config
                    .fatal
                    .send(NodeError::OtherCluster { head, detail });
            }
            Beat::Missed(reason) => {
                let silent = self.last_ack.elapsed();
                let grace = self.config.head_grace;
                let misses = self.missed.0.saturating_add(1);
                let backoff = (self.config.interval * 2u32.saturating_pow(misses.min(16) - 1))
                    .min(MAX_BEAT_BACKOFF);
                self.missed = (misses, Instant::now() + backoff);
                warn!(
                    "heartbeat to the head failed ({reason}); no acknowledgement for {silent:.1?}, giving up after {grace:?} (--head-grace-s); next try in {backoff:?}"
                );
                if silent > grace {
                    let _ = self.config.fatal.send(NodeError::HeadLost(silent));
                }
            }
        }
    }

    /// After the head was unreachable (it may have restarted): the deaths
    /// it was not told of, then every actor this node runs.
    fn report_again(&mut self) {
        let live: Vec<(ActorRecord, ActorSpec)> = self
            .workers
            .values()
            .filter(|worker| !worker.relaunching)
            .map(|worker| (self.record_of(worker, worker.address), worker.spec.clone()))
            .collect();
        self.reports.again(live);
    }

    /// Starts a worker for `spec`; `WorkerExited` reaches this actor when it dies.
    fn launch(
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
            let worker = workers::launch(&binary, &boot, &logs, gpus, on_line, on_exit).await?;
            Ok(worker)
        }
        .boxed()
    }

    /// Rotates the logs of the workers running here that grew past the
    /// limit (`logs.rs`, step 1), on the blocking pool.
    fn rotate_logs(&self) {
        let dir = self.config.state_dir.join("logs");
        let max = self.config.log_max;
        let actors: Vec<ActorId> = self.workers.keys().copied().collect();
        tokio::task::spawn_blocking(move || {
            for actor in actors {
                for stream in [Stream::Out, Stream::Err] {
                    let Some(log) = logs::newest(&dir, actor, stream) else {
                        continue;
                    };
                    match logs::rotate_if_larger(&log, max) {
                        Ok(true) => info!(%actor, log = %log.display(), "worker log rotated"),
                        Ok(false) => {}
                        Err(e) => warn!(%actor, "cannot rotate {}: {e}", log.display()),
                    }
                }
            }
        });
    }

    /// Reads what the workers running here wrote to stderr since last
    /// time (`logs.rs`), on the blocking pool; the lines come back as
    /// `StderrRead`, for the workers' drivers.
    fn read_stderr(&mut self, ctx: &mut Context<Self>) {
        let logs: Vec<(ActorId, PathBuf, u64)> = self
            .workers
            .iter()
            .map(|(actor, w)| (*actor, w.err_log.0.clone(), w.err_log.1))
            .collect();
        if logs.is_empty() {
            return;
        }
        let me = ctx.address();
        tokio::task::spawn_blocking(move || {
            let read = logs
                .into_iter()
                .filter_map(|(actor, path, offset)| {
                    let (to, lines) = logs::new_lines(&path, offset).ok()?;
                    (to != offset).then_some((actor, path, to, lines))
                })
                .collect();
            me.do_send(StderrRead(read));
        });
    }

    /// This node has no room: `cause`.
    fn no_capacity(&self, cause: GrantError) -> NoCapacity {
        NoCapacity {
            node: self.config.identity.name.clone(),
            cause,
        }
    }

    fn record_of(&self, worker: &Worker, address: SocketAddr) -> ActorRecord {
        ActorRecord {
            actor: worker.spec.actor,
            type_name: worker.spec.type_name.clone(),
            name: worker.spec.name.clone(),
            node: self.config.identity.clone(),
            address,
            incarnation: worker.incarnation,
            restarts: worker.restarts,
            dead: None,
            restarting: false,
            job: worker.spec.job.clone(),
            pid: worker.pid,
        }
    }
}

impl Actor for NodeManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        debug!(node = %self.config.identity, resources = %self.config.total, "node manager started");
        self.heartbeat(ctx);
        ctx.run_interval(self.config.interval, Self::heartbeat);
        ctx.run_interval(logs::ROTATE_EVERY, |manager, _| manager.rotate_logs());
        ctx.run_interval(logs::STDERR_EVERY, Self::read_stderr);
    }
}

/// A control request to the head over QUIC (members only).
pub(super) fn call_head(
    endpoint: &Endpoint,
    head: SocketAddr,
    request: ControlRequest,
    deadline: Duration,
) -> BoxFuture<'static, Result<ControlReply, ClientError>> {
    let endpoint = endpoint.clone();
    async move {
        let connection = endpoint.connect(head, None).await?;
        let options = RequestOptions::control().with_deadline(deadline);
        client::call(&connection, &request, options).await
    }
    .boxed()
}

/// Start an actor in a worker process on this node.
#[derive(Message)]
#[rtype(result = "Result<ControlReply, RemoteError>")]
pub struct StartActor(pub ActorSpec);

/// A chunk of a program binary.
#[derive(Message)]
#[rtype(result = "Result<(), RemoteError>")]
pub struct UploadBinary {
    /// Who sends it (each uploader's upload is its own).
    pub uploader: String,
    /// Hex SHA-256 of the whole binary.
    pub hash: String,
    /// Offset of this chunk.
    pub offset: u64,
    /// Whole length.
    pub total: u64,
    /// The bytes.
    pub chunk: Vec<u8>,
}

/// A worker process is gone.
#[derive(Message)]
#[rtype(result = "()")]
struct WorkerExited {
    actor: ActorId,
    incarnation: Incarnation,
    reason: DeathCause,
}

/// A worker printed a line to its stdout.
#[derive(Message)]
#[rtype(result = "()")]
struct WorkerPrinted {
    job: String,
    actor: ActorId,
    name: Option<String>,
    line: String,
}

impl Handler<WorkerPrinted> for NodeManager {
    type Result = ();

    fn handle(&mut self, msg: WorkerPrinted, _: &mut Self::Context) {
        self.output.push(&msg.job, msg.actor, msg.name, &msg.line);
    }
}

/// What workers wrote to stderr: per worker, its log, how far it is read
/// now, and the new lines.
#[derive(Message)]
#[rtype(result = "()")]
struct StderrRead(Vec<(ActorId, PathBuf, u64, Vec<String>)>);

impl Handler<StderrRead> for NodeManager {
    type Result = ();

    fn handle(&mut self, StderrRead(read): StderrRead, _: &mut Self::Context) {
        for (actor, path, to, lines) in read {
            // The same incarnation's log still (not restarted meanwhile).
            let Some(worker) = self.workers.get_mut(&actor).filter(|w| w.err_log.0 == path) else {
                continue;
            };
            worker.err_log.1 = to;
            let (job, name) = (worker.spec.job.clone(), worker.spec.name.clone());
            for line in lines {
                self.output.push(&job, actor, name.clone(), &line);
            }
        }
    }
}

/// The lines workers of a job printed here after a number.
#[derive(Message)]
#[rtype(result = "ControlReply")]
pub struct ReadOutput {
    /// The job.
    pub job: String,
    /// The last line number read.
    pub after: u64,
    /// At most this many.
    pub max: u32,
}

impl Handler<ReadOutput> for NodeManager {
    type Result = MessageResult<ReadOutput>;

    fn handle(&mut self, msg: ReadOutput, _: &mut Self::Context) -> Self::Result {
        let (lines, dropped) = self.output.since(&msg.job, msg.after, msg.max as usize);
        MessageResult(ControlReply::Output { lines, dropped })
    }
}

/// Read part of the log of an actor's newest worker here.
#[derive(Message)]
#[rtype(result = "Result<ControlReply, RemoteError>")]
pub struct ReadLog {
    /// The actor.
    pub actor: ActorId,
    /// Asked by a worker: only its job's actors that run here.
    pub confined: Option<Confinement>,
    /// Its stderr log rather than its stdout's.
    pub stderr: bool,
    /// From where.
    pub offset: u64,
    /// At most this many bytes.
    pub max: u64,
}

impl Handler<ReadLog> for NodeManager {
    type Result = ResponseFuture<Result<ControlReply, RemoteError>>;

    /// The directory is searched and the file read on the blocking pool.
    fn handle(&mut self, msg: ReadLog, _: &mut Self::Context) -> Self::Result {
        if let Some(confined) = &msg.confined {
            let job = self.workers.get(&msg.actor).map(|w| w.spec.job.as_str());
            let rule = "a worker reads the logs of its own job's running actors only";
            if let Err(e) = confined.allows("ReadLog", job, rule) {
                return Box::pin(futures::future::ready(Err(e.into())));
            }
        }
        let dir = self.config.state_dir.join("logs");
        let node = self.config.identity.name.clone();
        let stream = match msg.stderr {
            true => Stream::Err,
            false => Stream::Out,
        };
        let find = move || {
            logs::newest(&dir, msg.actor, stream)
                .ok_or_else(|| format!("no worker of actor {} ran on node {node}", msg.actor))
        };
        Box::pin(logs::read_reply(find, msg.offset, msg.max))
    }
}

/// Read part of this node's own log.
#[derive(Message)]
#[rtype(result = "Result<ControlReply, RemoteError>")]
pub struct ReadNodeLog {
    /// From where.
    pub offset: u64,
    /// At most this many bytes.
    pub max: u64,
}

impl Handler<ReadNodeLog> for NodeManager {
    type Result = ResponseFuture<Result<ControlReply, RemoteError>>;

    /// The log is where this process's stderr goes (`nimbus start` sends
    /// it to a file); read on the blocking pool.
    fn handle(&mut self, msg: ReadNodeLog, _: &mut Self::Context) -> Self::Result {
        let node = self.config.identity.name.clone();
        let find = move || {
            let path = std::fs::read_link("/proc/self/fd/2")
                .map_err(|e| format!("node {node} cannot tell where its log goes: {e}"))?;
            match path.is_file() {
                true => Ok(path),
                false => Err(format!(
                    "node {node} writes its log to {}, not to a file (started in a terminal with --block?)",
                    path.display()
                )),
            }
        };
        Box::pin(logs::read_reply(find, msg.offset, msg.max))
    }
}

/// Read a chunk of a cached program binary.
#[derive(Message)]
#[rtype(result = "Result<ControlReply, RemoteError>")]
pub struct ReadBinary {
    /// Hex SHA-256 of the whole binary.
    pub hash: String,
    /// Where the chunk starts.
    pub offset: u64,
    /// At most this many bytes.
    pub len: u64,
}

impl Handler<ReadBinary> for NodeManager {
    type Result = ResponseFuture<Result<ControlReply, RemoteError>>;

    /// The file is read on the blocking pool, off this actor's thread.
    fn handle(&mut self, msg: ReadBinary, _: &mut Self::Context) -> Self::Result {
        let refused = |e: BinaryError| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string());
        let len = msg.len.min(MAX_BINARY_CHUNK);
        let reader = self.binaries.reader(&msg.hash, msg.offset, len);
        Box::pin(async move {
            let reader = reader.map_err(refused)?;
            let (total, chunk) = tokio::task::spawn_blocking(move || reader.run())
                .await
                .map_err(|e| RemoteError::new(RemoteErrorKind::Internal, e.to_string()))?
                .map_err(refused)?;
            Ok(ControlReply::BinaryChunk { total, chunk })
        })
    }
}

/// The largest binary chunk a node reads for one request.
const MAX_BINARY_CHUNK: u64 = 16 << 20;

impl Handler<UploadBinary> for NodeManager {
    type Result = ResponseFuture<Result<(), RemoteError>>;

    /// Each chunk's write (and the last one's fsync, hash and publish) runs
    /// on the blocking pool, not on this actor's thread, which heartbeats
    /// and starts workers; a failed write ends the upload.
    fn handle(&mut self, msg: UploadBinary, ctx: &mut Self::Context) -> Self::Result {
        let refused = |e: BinaryError| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string());
        let UploadBinary {
            uploader,
            hash,
            offset,
            total,
            chunk,
        } = msg;
        let write = self
            .binaries
            .receive(&uploader, &hash, offset, total, chunk, Instant::now());
        let me = ctx.address();
        Box::pin(async move {
            let write = write.map_err(refused)?;
            let last = write.is_last();
            let written = tokio::task::spawn_blocking(move || write.run())
                .await
                .map_err(|e| RemoteError::new(RemoteErrorKind::Internal, e.to_string()))?;
            if written.is_err() && !last {
                me.do_send(AbortUpload { uploader, hash });
            }
            written.map_err(refused)
        })
    }
}

/// A chunk of this upload failed to be written: end it.
#[derive(Message)]
#[rtype(result = "()")]
struct AbortUpload {
    uploader: String,
    hash: String,
}

impl Handler<AbortUpload> for NodeManager {
    type Result = ();

    fn handle(&mut self, msg: AbortUpload, _: &mut Self::Context) {
        self.binaries.abort_upload(&msg.uploader, &msg.hash);
    }
}

/// Set resources aside for a placement-group bundle.
#[derive(Message)]
#[rtype(result = "Result<(), NoCapacity>")]
pub struct ReserveBundle {
    /// The bundle.
    pub bundle: BundleId,
    /// Its resources.
    pub resources: ResourceSet,
    /// The job whose placement group it is.
    pub job: String,
}

/// Give a bundle's resources back; asked by a worker (`confined`), only a
/// bundle of its job.
#[derive(Message)]
#[rtype(result = "Result<(), Forbidden>")]
pub struct ReleaseBundle {
    /// The bundle.
    pub bundle: BundleId,
    /// Asked by a worker: only its job's bundles.
    pub confined: Option<Confinement>,
}

/// The bundles this node holds.
#[derive(Message)]
#[rtype(result = "Vec<BundleListing>")]
pub struct ListBundles;

impl Handler<ListBundles> for NodeManager {
    type Result = MessageResult<ListBundles>;

    fn handle(&mut self, _: ListBundles, _: &mut Self::Context) -> Self::Result {
        let mut listed: Vec<BundleListing> = self
            .resources
            .bundles()
            .map(|(bundle, resources, used)| BundleListing {
                bundle,
                resources: resources.clone(),
                used: used.clone(),
                job: self.bundle_jobs.get(&bundle).cloned().unwrap_or_default(),
            })
            .collect();
        listed.sort_by_key(|b| b.bundle);
        MessageResult(listed)
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
        worker.killed = true;
        info!(actor = %actor, pid = worker.pid, "killing actor on request");
        // The exit is reported by the worker's watcher (`WorkerExited`).
        signal_worker(worker.pid, libc::SIGKILL);
        Ok(())
    }
}

impl Handler<ReserveBundle> for NodeManager {
    type Result = Result<(), NoCapacity>;

    fn handle(&mut self, msg: ReserveBundle, _: &mut Self::Context) -> Self::Result {
        self.resources
            .reserve_bundle(msg.bundle, &msg.resources)
            .map_err(|cause| self.no_capacity(cause))?;
        self.bundle_jobs.insert(msg.bundle, msg.job);
        Ok(())
    }
}

impl Handler<ReleaseBundle> for NodeManager {
    type Result = Result<(), Forbidden>;

    fn handle(&mut self, msg: ReleaseBundle, _: &mut Self::Context) -> Self::Result {
        let bundle = msg.bundle;
        let job = self.bundle_jobs.get(&bundle).map(String::as_str);
        // A bundle not held here is not released, whoever asks.
        if let (Some(confined), Some(job)) = (&msg.confined, job) {
            let rule = "a worker releases its own job's bundles only";
            confined.allows("ReleaseBundle", Some(job), rule)?;
        }
        self.resources.release_bundle(bundle);
        self.bundle_jobs.remove(&bundle);
        Ok(())
    }
}

/// Sends `signal` to worker process `pid`, a child of this node still in
/// its table (reaped only by its watcher, which removes it first, so the
/// pid cannot have been reused).
fn signal_worker(pid: u32, signal: libc::c_int) {
    // SAFETY: plain syscall on our own child, as above.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
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
        let mut stopping = Vec::new();
        for actor in actors {
            let Some(worker) = self.workers.get_mut(&actor) else {
                continue;
            };
            worker.killed = true;
            stopping.push((actor, worker.pid));
            signal_worker(worker.pid, libc::SIGTERM);
        }
        ctx.run_later(END_JOB_GRACE, move |manager, _| {
            for (actor, pid) in stopping {
                // Still the same worker (its watcher removes it before its
                // pid is reaped, so the pid cannot have been reused).
                if manager.workers.get(&actor).is_some_and(|w| w.pid == pid) {
                    warn!(%actor, pid, "worker still running {END_JOB_GRACE:?} after SIGTERM: SIGKILL");
                    signal_worker(pid, libc::SIGKILL);
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

impl Handler<StartActor> for NodeManager {
    type Result = ResponseActFuture<Self, Result<ControlReply, RemoteError>>;

    fn handle(&mut self, StartActor(spec): StartActor, ctx: &mut Self::Context) -> Self::Result {
        if self.binaries.get(&spec.binary.hash).is_none() {
            return Box::pin(fut::ready(Ok(ControlReply::NeedBinary)));
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
                return Box::pin(fut::ready(Ok(ControlReply::NoCapacity(short))));
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
                killed: false,
                err_log: (worker.err_log.clone(), 0),
            };
            let record = manager.record_of(&entry, worker.address);
            let reported = manager.reports.up(record.clone(), entry.spec.clone());
            // The head's view of this node's use, which spawns place by,
            // includes the new actor before the spawner hears of it (else
            // spawns in quick succession all see the node as it was).
            let used = manager.beat();
            manager.workers.insert(entry.spec.actor, entry);
            Box::pin(
                async move {
                    reported.await;
                    used.await;
                }
                .into_actor(manager)
                .map(move |_, _, _| Ok(ControlReply::ActorStarted(record))),
            )
        }))
    }
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
        let restarting = !worker.killed && worker.restarts < worker.spec.max_restarts;
        let reason = if worker.killed {
            DeathCause::KilledOnRequest(Box::new(msg.reason.clone()))
        } else {
            msg.reason.clone()
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

impl NodeManager {
    /// Records a restarted actor's new incarnation and reports it up.
    fn restarted(&mut self, actor: ActorId, launched: LaunchedWorker) -> BoxFuture<'static, ()> {
        let Some(worker) = self.workers.get_mut(&actor) else {
            return futures::future::ready(()).boxed();
        };
        worker.incarnation = launched.incarnation;
        worker.address = launched.address;
        worker.relaunching = false;
        worker.pid = launched.pid;
        worker.err_log = (launched.err_log, 0);
        info!(actor = %actor, restarts = worker.restarts, "actor restarted");
        let worker = &self.workers[&actor];
        let record = self.record_of(worker, launched.address);
        let spec = worker.spec.clone();
        self.reports.up(record, spec)
    }
}
