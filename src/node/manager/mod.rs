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
//!   cause (`KilledOnRequest` if it was killed, `OwnerDied` if killed with
//!   its owner) and whether it restarts:
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
//!
//! - **Tickets** (`crate::transport`'s `tickets.rs`, step 7): a heartbeat
//!   sent once this node's ticket is half-way through its life asks for a
//!   new one, presented from then on and attached to the workers' tickets
//!   signed after; **`RenewWorkerTicket`** gives one of this node's live
//!   workers a new ticket for the certificate it asks with.
//!
//! - **Owners** (`owners.rs`): an actor spawned from another actor's
//!   worker process is killed for good when that incarnation dies (its
//!   cause `OwnerDied`), as the head's events tell.
//!
//! The rooms: `heartbeat.rs`, `tickets.rs`, `worker_processes.rs` (`StartActor`,
//! `WorkerExited`, `KillActor`, `EndJob`), `owners.rs`, `binary_uploads.rs`,
//! `bundles.rs`, and `log_reads.rs` (what workers print, their logs and
//! the node's own, read back).

mod binary_uploads;
mod bundles;
mod heartbeat;
mod log_reads;
mod owners;
mod tickets;
mod worker_processes;

pub use binary_uploads::{ReadBinary, UploadBinary};
pub use bundles::{ReleaseBundle, ReserveBundle};
pub(super) use owners::follow_owners;
pub(super) use tickets::RenewWorkerTicket;
pub use worker_processes::{KillActor, StartActor};

pub(super) use bundles::ListBundles;
pub(super) use log_reads::{ReadLog, ReadNodeLog, ReadOutput};
pub(super) use worker_processes::EndJob;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::mpsc;
use tracing::debug;

use crate::client::{self, ClientError};
use crate::cluster::faults::ActorFault;
use crate::cluster::{
    ActorId, ActorOwner, ActorRecord, ActorSpec, BundleId, ResourceSet, Subsystem,
};
use crate::head::directory::Directory;
use crate::head::membership::Membership;
use crate::transport::{Endpoint, RequestOptions, TicketAuthority};
use crate::wire::{Incarnation, NodeIdentity};

use super::binaries::BinaryCache;
use super::error::{GrantError, NoCapacity, NodeError};
use super::host::HostSampler;
use super::libraries;
use super::logs;
use super::output::JobOutput;
use super::reports::Reports;
use super::resources::{Grant, ResourcePool};
use super::sandbox::WorkerSandbox;
use super::workers::WorkerIdentities;

/// How the node manager reaches the head's actors.
#[derive(Clone)]
pub enum HeadLink {
    /// On the head: the actors themselves, no serialization.
    Local {
        /// The membership.
        membership: Addr<Membership>,
        /// The head's ticket key, which renews this node's ticket too.
        tickets: std::sync::Arc<TicketAuthority>,
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
    /// This node's endpoint, which presents its ticket.
    pub endpoint: Endpoint,
    /// The IP workers advertise.
    pub advertise_ip: IpAddr,
    /// The node's state directory (binaries, worker logs).
    pub state_dir: PathBuf,
    /// Actor fault rules (fault-injection tests; empty otherwise).
    pub actor_faults: Vec<ActorFault>,
    /// A worker log past this many bytes is rotated (`logs.rs`).
    pub log_max: u64,
    /// What its workers run in.
    pub sandbox: WorkerSandbox,
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
    /// The owner incarnations that died lately (`owners.rs`).
    dead_owners: VecDeque<ActorOwner>,
}

/// Why a worker was killed for good.
#[derive(Clone, Copy)]
enum Killed {
    /// `KillActor`, or its job ended.
    OnRequest,
    /// The actor incarnation that spawned it died (`owners.rs`).
    WithOwner(ActorOwner),
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
    /// Killed for good (on request, with its job, or with its owner): its
    /// death is final, whatever its restart policy.
    killed: Option<Killed>,
    /// Its stderr log, and how far it was read for the driver.
    err_log: (PathBuf, u64),
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
                crate::host::gpus::device_ids(config.total.amount(crate::cluster::GPU) as usize),
            ),
            reports: Reports::new(config.head.clone(), config.identity.clone()),
            config,
            last_ack: Instant::now(),
            in_flight: false,
            missed: (0, Instant::now()),
            workers: HashMap::new(),
            bundle_jobs: HashMap::new(),
            output: JobOutput::default(),
            dead_owners: VecDeque::new(),
        }
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
            shared: worker.spec.shared,
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
pub(super) fn call_head<R: Subsystem + Send + 'static>(
    endpoint: &Endpoint,
    head: SocketAddr,
    request: R,
    deadline: Duration,
) -> BoxFuture<'static, Result<R::Reply, ClientError>> {
    let endpoint = endpoint.clone();
    async move {
        let connection = endpoint.connect(head, None).await?;
        let options = RequestOptions::control().with_deadline(deadline);
        client::call(&connection, request, options).await
    }
    .boxed()
}
