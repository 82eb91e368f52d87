//! The control protocol: what nodes and clients send to the head (and to
//! each other), carried as request bodies by the transport.
//!
//! A [`ControlRequest`] names its subsystem, and each subsystem owns its
//! requests; the node service (`crate::node::NodeService`) is the one
//! dispatcher, and a node that is not the head refuses the head's
//! subsystems. Bodies are MessagePack with named fields; a body that does
//! not decode closes the sender's connection (close code 2).
//!
//! To the head:
//! - `Membership` ([`MembershipRequest`]): `Join`, `Heartbeat`, `Leave`,
//!   `Status`;
//! - `Events` ([`EventRequest`]): `Events { after, wait_ms }`, a long poll
//!   of the numbered cluster events, and `LastSeq`, the latest one's number;
//! - `Directory` ([`DirectoryRequest`]): `ReserveName`, `LookupName`,
//!   `LocateActor`, `ListActors`, `ListDeadActors`, `ActorUp`, `ActorDown`, `Waiting`,
//!   `Placed`, `ListDemands`;
//! - `Faults` ([`FaultRequest`]): `ReportFault`, `ReportRecovery`,
//!   `ReportPacketFaults` (published as `FaultInjected`, `Recovered`,
//!   `PacketFaults` events);
//! - `Jobs` ([`JobRequest`], types in `jobs.rs`): `DriverAlive`,
//!   `DriverDone`, `SubmitJob`, `StopJob`, `ListJobs`, `DriverExited`,
//!   `TaskStates`, `ListTasks`.
//!
//! To any node:
//! - `Workers` ([`WorkerRequest`]): `StartActor`, `KillActor`, `ReadOutput`,
//!   `ReadLog`, `ReadNodeLog`;
//! - `Binaries` ([`BinaryRequest`]): `UploadBinary`, `ReadBinary`;
//! - `Bundles` ([`BundleRequest`]): `ReserveBundle`, `ReleaseBundle`,
//!   `ListBundles`;
//! - `Faults`: `AddPacketRule` (a chaos partition or degraded link);
//! - `Jobs`: `EndJob`, `RunDriver`, `StopDriver`, `ReadJobLog`;
//! - `Objects` ([`ObjectRequest`], the object store's, types in
//!   `objects.rs`): `PutObjectChunk`, `PutObjects`, `CreateObject`, `SealObject`,
//!   `ReadObject`, `StreamObject`, `OpenObject`, `PullObject`, `AwaitObject`, `FailObject`,
//!   `UpdateRefs`, `FreeObject`, `ListObjects`;
//! - `Echo` (a probe).
//!
//! Every answer is a [`ControlReply`]. The protocol version (the wire's
//! `PROTOCOL_VERSION`, 9) counts this grouping by subsystem (3: a join
//! refused for a taken name is answered `NodeNameTaken`; 4: a join names
//! the node's worker-ticket key and is answered with its ticket; 5: the
//! event stream's `Resync` marker; 6: small puts in batches,
//! `PutObjects`; 7: `StreamObject`, bulk streams over TCP; 8: `LastSeq`,
//! the latest event's number; 9: `ListDeadActors`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::wire::{Incarnation, NodeIdentity};

use super::jobs::{JobRecord, JobSubmission, TaskRecord};
use super::objects::{
    ContainedRef, ObjectId, ObjectListing, ObjectLocation, RefHolder, RefUpdate, SharedObjectFile,
};
use super::{AutoscalerReport, DeathCause, ResourceSet, Versions};

/// A control-plane request: one variant per subsystem, each owning its own
/// requests. A node's service routes each to the subsystem that answers it
/// (`node/service.rs`, the one dispatcher); requests only the head answers
/// are refused by other nodes.
// Built once per request and encoded at once: boxing the large variant
// would save no memory and cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControlRequest {
    /// To the head: joining, heartbeats, leaving, the membership view (answered by `Membership`).
    Membership(MembershipRequest),
    /// To the head: the cluster's numbered events (answered by `ClusterEvents`).
    Events(EventRequest),
    /// To the head: actor names and records (answered by `Directory`).
    Directory(DirectoryRequest),
    /// To a node: starting and killing actors' worker processes (answered by its `NodeManager`).
    Workers(WorkerRequest),
    /// To a node: placement-group bundles (answered by its `NodeManager`).
    Bundles(BundleRequest),
    /// To a node: its cache of program binaries (answered by its `NodeManager`).
    Binaries(BinaryRequest),
    /// To a node: its object store (answered by its `NodeObjectStore`).
    Objects(ObjectRequest),
    /// Fault injection: reports to the head, packet rules to a node.
    Faults(FaultRequest),
    /// Jobs: drivers' liveness to the head, the end of a job to nodes.
    Jobs(JobRequest),
    /// Returns the payload unchanged: a liveness probe and a benchmark.
    Echo(#[serde(with = "serde_bytes")] Vec<u8>),
}

impl ControlRequest {
    /// Whether asking twice does what asking once does (reads of the
    /// head's state, reserving a name for the same actor): such requests
    /// are asked again on a new connection while the head is away
    /// (`crate::runtime`'s `call_head`).
    pub fn is_idempotent(&self) -> bool {
        matches!(
            self,
            ControlRequest::Membership(
                MembershipRequest::Status | MembershipRequest::RequestResources { .. }
            ) | ControlRequest::Events(_)
                | ControlRequest::Directory(
                    DirectoryRequest::ReserveName { .. }
                        | DirectoryRequest::LookupName(_)
                        | DirectoryRequest::LocateActor(_)
                        | DirectoryRequest::ListActors
                        | DirectoryRequest::ListDeadActors
                )
                | ControlRequest::Jobs(
                    JobRequest::ListJobs
                        | JobRequest::ListTasks
                        | JobRequest::ListRuns
                        | JobRequest::GetRun { .. }
                )
        )
    }
}

/// The most events one `JobRequest::RunEvents` carries.
pub const MAX_RUN_EVENTS: usize = 1000;

/// The most task states one `JobRequest::TaskStates` carries.
pub const MAX_TASK_STATES: usize = 1000;

/// The most packet rules whose hits one `ReportPacketFaults` publishes.
pub const MAX_PACKET_RULES: usize = 256;

/// How long nodes, workers and drivers ride out an unreachable head, and
/// how long a restarted head waits for the members it knew
/// (`--head-grace-s`, `NIMBUS_HEAD_GRACE_S`).
pub const DEFAULT_HEAD_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// How often a driver tells the head its job is alive (`JobRequest::DriverAlive`).
pub const DRIVER_BEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Jobs (`crate::head`'s `jobs.rs`): a job is one driver program run; what
/// it creates is its own, and ends with it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum JobRequest {
    /// To the head, from a driver every second: its job is alive.
    /// Answered with `Ack`.
    DriverAlive {
        /// The job.
        job: String,
        /// The driver's command line (shown by `nimbus job list` for a
        /// driver that attached by itself).
        #[serde(default)]
        entrypoint: String,
        /// What the driver runs: its release and the libtorch it loaded
        /// (shown by `nimbus job list`).
        #[serde(default)]
        versions: Option<Versions>,
    },
    /// To the head, from a driver that attached by itself, as it ends:
    /// its job is over (`SUCCEEDED`, or `FAILED` if it is panicking), so
    /// its actors go at once rather than after the grace period. Answered
    /// with `Ack`.
    DriverDone {
        /// The job.
        job: String,
        /// Whether the driver ends well (not unwinding from a panic).
        ok: bool,
    },
    /// To a node, from the head once a job's driver is gone: kill the job's
    /// actors (not the detached ones) and release its bundles. Answered
    /// with `Ack`.
    EndJob {
        /// The job.
        job: String,
    },
    /// To the head, from a token holder: run a driver program on a node
    /// (`nimbus job submit`). Answered with [`ControlReply::Job`] once the
    /// driver runs (or with the reason it could not start).
    SubmitJob(JobSubmission),
    /// To the head, from a token holder: stop a job (its driver gets
    /// SIGTERM, then SIGKILL after the node's grace; its actors are
    /// killed). Answered with [`ControlReply::Job`].
    StopJob {
        /// The job.
        job: String,
    },
    /// To the head: every job it knows, live and ended. Answered with
    /// [`ControlReply::Jobs`].
    ListJobs,
    /// To the head, from any process that submits tasks, about once a
    /// second: the latest state of its tasks that changed (at most
    /// `MAX_TASK_STATES`). Answered with `Ack`.
    TaskStates(Vec<TaskRecord>),
    /// To the head: the tasks it knows (the last 10,000). Answered with
    /// [`ControlReply::Tasks`].
    ListTasks,
    /// To the head, from a training run's supervisor about once a second
    /// and as the run ends: what the run did since its last batch (at most
    /// [`MAX_RUN_EVENTS`]). Answered with `Ack`.
    RunEvents {
        /// The run.
        run: super::RunHeader,
        /// Its events, in order.
        events: Vec<super::RunEvent>,
    },
    /// To the head: the training runs it knows, without their points.
    /// Answered with [`ControlReply::Runs`].
    ListRuns,
    /// To the head: one training run, with its points. Answered with
    /// [`ControlReply::Run`].
    GetRun {
        /// The run's id.
        run: String,
    },
    /// To a node, from the head: start a submitted job's driver. Answered
    /// with [`ControlReply::DriverStarted`].
    RunDriver {
        /// The job.
        job: String,
        /// What to run.
        submission: JobSubmission,
        /// The head's address, for the driver.
        head: SocketAddr,
    },
    /// To a node, from the head: stop a job's driver (SIGTERM, SIGKILL
    /// after the grace). Answered with `Ack`.
    StopDriver {
        /// The job.
        job: String,
    },
    /// To the head, from the node that ran it: a submitted job's driver
    /// exited. Answered with `Ack`.
    DriverExited {
        /// The job.
        job: String,
        /// How it ended.
        exit: DeathCause,
    },
    /// To a node: up to `max` bytes from `offset` of a submitted job's
    /// driver log there. Answered with [`ControlReply::Log`].
    ReadJobLog {
        /// The job.
        job: String,
        /// Where to start reading.
        offset: u64,
        /// The most bytes to return (the node caps it at 1 MiB).
        max: u64,
    },
}

/// To the head: joining, heartbeats, leaving, the membership view (answered by `Membership`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MembershipRequest {
    /// A node asks the head to admit it. Answered with [`ControlReply::Joined`].
    Join {
        /// Who, where, with what.
        registration: NodeRegistration,
        /// The Ed25519 public key the node signs its workers' tickets with
        /// (`crate::transport`'s `tickets.rs`, step 3).
        #[serde(with = "serde_bytes")]
        signs_workers: Vec<u8>,
    },
    /// A node is alive; `used` is what it has handed out.
    Heartbeat {
        /// The node.
        node: NodeIdentity,
        /// Resources in use.
        used: ResourceSet,
        /// How busy its machine is.
        #[serde(default)]
        host: Option<HostLoad>,
    },
    /// A node is stopping on purpose.
    Leave {
        /// The node.
        node: NodeIdentity,
    },
    /// The membership and resource view. Answered with [`ControlReply::Status`].
    Status,
    /// The autoscaler's view after a decision round (`crate::autoscaler`):
    /// shown by `Status` while fresh, and what spawns that no node fits
    /// wait for. Answered with `Ack`.
    Autoscaler(AutoscalerReport),
    /// Capacity to keep ready ahead of use (Ray's `request_resources`):
    /// the autoscaler grows the cluster until these bundles fit the
    /// nodes' total resources, and keeps those nodes, until the next
    /// request replaces them (an empty one clears them). At most
    /// [`MAX_REQUESTED_BUNDLES`](super::MAX_REQUESTED_BUNDLES). Answered
    /// with `Ack`.
    RequestResources {
        /// The bundles, each to fit one node.
        bundles: Vec<ResourceSet>,
    },
}

impl From<MembershipRequest> for ControlRequest {
    fn from(request: MembershipRequest) -> Self {
        ControlRequest::Membership(request)
    }
}

/// To the head: the cluster's numbered events (answered by `ClusterEvents`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum EventRequest {
    /// Cluster events after sequence number `after`, waiting up to
    /// `wait_ms` for one if there are none yet (a long poll).
    Events {
        /// The last sequence number the caller has seen (0 for all).
        after: u64,
        /// How long to wait for a new event.
        wait_ms: u64,
    },
    /// The number of the latest event published (answered with
    /// [`ControlReply::EventSeq`]), to read only later ones with
    /// [`Events`](Self::Events).
    LastSeq,
}

impl From<EventRequest> for ControlRequest {
    fn from(request: EventRequest) -> Self {
        ControlRequest::Events(request)
    }
}

/// To the head: actor names and records (answered by `Directory`).
// Built once per request and encoded at once: boxing the large variant
// would save no memory and cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DirectoryRequest {
    /// To the head: reserve a unique actor name. Answered with `Ack` or
    /// [`ControlReply::NameTaken`].
    ReserveName {
        /// The name.
        name: String,
        /// The actor that will carry it.
        actor: ActorId,
    },
    /// To the head: the actor with this name. Answered with [`ControlReply::Actor`].
    LookupName(String),
    /// To the head: where this actor is. Answered with [`ControlReply::Actor`].
    LocateActor(ActorId),
    /// From a node to the head: an actor (incarnation) runs, and how to
    /// start it again elsewhere should its node be lost.
    ActorUp {
        /// Where and which incarnation.
        record: ActorRecord,
        /// What it was started from.
        spec: ActorSpec,
    },
    /// From a node to the head: an actor incarnation died.
    ActorDown {
        /// The actor.
        actor: ActorId,
        /// Its dead incarnation.
        incarnation: Incarnation,
        /// Why it died.
        reason: super::DeathCause,
        /// Whether its node is starting a new incarnation.
        restarting: bool,
    },
    /// To the head: every live actor's record. Answered with
    /// [`ControlReply::Actors`].
    ListActors,
    /// To the head: the records of the dead actors it keeps (the last
    /// 1,000 per job, 10,000 in all), oldest first. Answered with
    /// [`ControlReply::Actors`].
    ListDeadActors,
    /// To the head: a spawn found no node with room and keeps trying for
    /// `for_ms` (`crate::head`'s `demands.rs`). Answered with `Ack`.
    Waiting {
        /// The actor being spawned.
        actor: ActorId,
        /// Its type.
        class: String,
        /// What it asks for.
        resources: ResourceSet,
        /// Its job.
        job: String,
        /// How much longer the spawn tries, in milliseconds.
        for_ms: u64,
        /// The node it is pinned to, if any (no new node can take it).
        #[serde(default)]
        node: Option<String>,
    },
    /// To the head: a spawn that was waiting ended (placed or failed).
    /// Answered with `Ack`.
    Placed(ActorId),
    /// To the head: the spawns waiting for room. Answered with
    /// [`ControlReply::Demands`].
    ListDemands,
    /// To the head: a placement group found no nodes with room for its
    /// bundles and keeps trying for `for_ms`. Answered with `Ack`.
    GroupWaiting {
        /// The group, its bundles and how they must be spread.
        group: GroupDemand,
        /// Its job.
        job: String,
        /// How much longer the creation tries, in milliseconds.
        for_ms: u64,
    },
    /// To the head: a placement group that was waiting was reserved or
    /// failed. Answered with `Ack`.
    GroupPlaced(PlacementGroupId),
    /// To the head: `count` tasks of one placement in one process (its
    /// queue, `queue`) wait to run, and the last worker start for them
    /// found no node with room; said again every second while they wait,
    /// with `count` 0 once none do (`crate::task`'s pool). Answered with
    /// `Ack`.
    TasksWaiting {
        /// The process's queue for this placement (a random number).
        queue: u64,
        /// What each task asks for.
        resources: ResourceSet,
        /// How many wait.
        count: u32,
        /// Their job.
        job: String,
    },
}

/// A placement group's demand: its bundles and how they must be spread
/// over nodes (what an autoscaler must launch for it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupDemand {
    /// The group.
    pub id: PlacementGroupId,
    /// Its bundles.
    pub bundles: Vec<ResourceSet>,
    /// Where they may go together.
    pub together: Together,
}

/// How a placement group's bundles must share nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Together {
    /// Anywhere (`Pack` and `Spread` prefer, but do not require).
    #[default]
    Loose,
    /// Each on a node of its own (`StrictSpread`).
    DistinctNodes,
    /// All on one node (`StrictPack`).
    OneNode,
}

/// A spawn or placement group waiting for room (`nimbus status`'s
/// pending demands).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    /// The actor being spawned (0 for a placement group).
    pub actor: ActorId,
    /// Its type (`placement group` for a group).
    pub class: String,
    /// What it asks for (a group's bundles together).
    pub resources: ResourceSet,
    /// Its job.
    pub job: String,
    /// How long it has waited, in milliseconds.
    pub waited_ms: u64,
    /// The placement group's bundles and spread, for a group.
    #[serde(default)]
    pub group: Option<GroupDemand>,
    /// For tasks waiting to run: how many, each asking for `resources`
    /// (0 for a spawn or a group).
    #[serde(default)]
    pub tasks: u32,
    /// The node a spawn is pinned to, if any: only that node can take it,
    /// so an autoscaler launches nothing for it.
    #[serde(default)]
    pub node: Option<String>,
}

impl Demand {
    /// Its bundles (one for a spawn, one per task) and how they must
    /// share nodes.
    pub fn bundles(&self) -> (Vec<ResourceSet>, Together) {
        match &self.group {
            Some(group) => (group.bundles.clone(), group.together),
            None => (
                vec![self.resources.clone(); self.tasks.max(1) as usize],
                Together::Loose,
            ),
        }
    }
}

impl From<DirectoryRequest> for ControlRequest {
    fn from(request: DirectoryRequest) -> Self {
        ControlRequest::Directory(request)
    }
}

/// To a node: starting and killing actors' worker processes (answered by its `NodeManager`).
// Built once per request and encoded at once: boxing the large variant
// would save no memory and cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum WorkerRequest {
    /// To a node: start an actor in a worker process. Answered with
    /// [`ControlReply::ActorStarted`], [`ControlReply::NeedBinary`] or
    /// [`ControlReply::NoCapacity`].
    StartActor(ActorSpec),
    /// To a node: SIGKILL an actor's worker process and do not restart it
    /// (Ray's `ray.kill`). Answered with `Ack`, also when the actor is not
    /// (or no longer) there.
    KillActor(ActorId),
    /// To a node: the lines its workers of `job` printed to stdout after
    /// number `after` (at most `max`, and 1,000), for the job's driver to
    /// show (`log_to_driver`). Answered with [`ControlReply::Output`].
    ReadOutput {
        /// The job.
        job: String,
        /// The last line number already read (0: none).
        after: u64,
        /// The most lines to return.
        max: u32,
    },
    /// To a node: up to `max` bytes from `offset` of the stdout or stderr
    /// log of the newest worker process that hosted `actor` there.
    /// Answered with [`ControlReply::Log`].
    ReadLog {
        /// The actor.
        actor: ActorId,
        /// Its stderr log (`.err`) rather than its stdout's (`.out`).
        #[serde(default)]
        stderr: bool,
        /// Where to start reading.
        offset: u64,
        /// The most bytes to return (the node caps it at 1 MiB).
        max: u64,
    },
    /// To a node: up to `max` bytes from `offset` of the node's own log
    /// (where its stderr goes). Answered with [`ControlReply::Log`].
    ReadNodeLog {
        /// Where to start reading.
        offset: u64,
        /// The most bytes to return (the node caps it at 1 MiB).
        max: u64,
    },
    /// To a node, from one of its workers or a driver it is home to, every
    /// `metrics::PUSH_INTERVAL` and once more as a driver ends: the
    /// process's metrics as Prometheus text, replacing its previous push,
    /// served summed on the node's `/metrics`. A certified worker's push is
    /// kept under its proven identity; a token holder's (a driver) under the
    /// `process` it names, so its last push from another connection
    /// replaces its earlier ones. Answered with `Ack`.
    PushMetrics {
        /// The pushing process (its endpoint's identity).
        process: String,
        /// The text (at most `metrics::MAX_PUSH_BYTES`).
        text: String,
    },
}

impl From<WorkerRequest> for ControlRequest {
    fn from(request: WorkerRequest) -> Self {
        ControlRequest::Workers(request)
    }
}

/// To a node: placement-group bundles (answered by its `NodeManager`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum BundleRequest {
    /// To a node: set resources aside for a placement-group bundle.
    /// Answered with `Ack` or [`ControlReply::NoCapacity`].
    ReserveBundle {
        /// The bundle.
        bundle: BundleId,
        /// Its resources.
        resources: ResourceSet,
        /// The job whose placement group it is: released when the job ends.
        #[serde(default)]
        job: String,
    },
    /// To a node: give a bundle's resources back.
    ReleaseBundle(BundleId),
    /// To a node: the bundles it holds. Answered with
    /// [`ControlReply::Bundles`].
    ListBundles,
}

/// A placement-group bundle a node holds (`nimbus list placement-groups`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BundleListing {
    /// The bundle.
    pub bundle: BundleId,
    /// What it reserves.
    pub resources: ResourceSet,
    /// What the actors placed in it use of that.
    pub used: ResourceSet,
    /// The job whose placement group it is.
    pub job: String,
}

impl From<BundleRequest> for ControlRequest {
    fn from(request: BundleRequest) -> Self {
        ControlRequest::Bundles(request)
    }
}

/// To a node: its cache of program binaries (answered by its `NodeManager`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum BinaryRequest {
    /// To a node: a chunk of a program binary, identified by its SHA-256.
    UploadBinary {
        /// Hex SHA-256 of the whole binary.
        hash: String,
        /// Where this chunk starts.
        offset: u64,
        /// Length of the whole binary.
        total: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        chunk: Vec<u8>,
    },
    /// To a node: `len` bytes of a program binary from `offset`, for another
    /// node that lacks it. Answered with [`ControlReply::BinaryChunk`].
    ReadBinary {
        /// Hex SHA-256 of the whole binary.
        hash: String,
        /// Where the chunk starts.
        offset: u64,
        /// At most this many bytes.
        len: u64,
    },
}

impl From<BinaryRequest> for ControlRequest {
    fn from(request: BinaryRequest) -> Self {
        ControlRequest::Binaries(request)
    }
}

/// To a node: its object store (answered by its `NodeObjectStore`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ObjectRequest {
    /// To a node: the next chunk of an object put there (the first, at
    /// offset 0, reserves `total` bytes, spilling older objects to disk if
    /// needed). Answered with `Ack`.
    PutObjectChunk {
        /// The object.
        id: ObjectId,
        /// Where the chunk starts.
        offset: u64,
        /// The object's size.
        total: u64,
        /// Who holds the first reference (the putter, or a task's caller).
        holder: RefHolder,
        /// References inside the object, kept alive as long as it lives
        /// (read at offset 0).
        contains: Vec<ContainedRef>,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        chunk: Vec<u8>,
    },
    /// To a node: small objects one process put, whole and without
    /// references, in the order it put them (it keeps its own copies and
    /// sends them with its reference changes, ahead of them). Each begins
    /// as a first `PutObjectChunk` would; one here already (a batch sent
    /// again) is left as it is, one that cannot be stored fails with the
    /// reason for its readers. Answered with `Ack`.
    PutObjects {
        /// Who holds each object's first reference: the putter.
        holder: RefHolder,
        /// The objects.
        objects: Vec<super::SmallObject>,
    },
    /// To a node: bytes of an object it holds. Answered with
    /// [`ControlReply::ObjectBytes`].
    ReadObject {
        /// The object.
        id: ObjectId,
        /// Where to start.
        offset: u64,
        /// How many bytes at most.
        len: u64,
        /// The node caching a copy, when a node pulls (recorded so the copy
        /// is dropped when the object is freed).
        copy_at: Option<ObjectLocation>,
    },
    /// To a node: fetch an object from the node that owns it, unless it is
    /// here already; concurrent pulls of one object share one transfer.
    /// Answered with [`ControlReply::ObjectReady`] once the object is here.
    PullObject {
        /// The object.
        id: ObjectId,
        /// The node owning it.
        owner: ObjectLocation,
        /// How long to wait for an object still being produced.
        wait_ms: u64,
    },
    /// To a node: wait up to `wait_ms` for an object it owns to be complete.
    /// Answered with [`ControlReply::ObjectReady`],
    /// [`ControlReply::ObjectFailed`] or [`ControlReply::ObjectNotReady`].
    AwaitObject {
        /// The object.
        id: ObjectId,
        /// How long to wait.
        wait_ms: u64,
    },
    /// To a node: the task that was to produce object `id` there failed;
    /// reads of the object report `message`. Answered with `Ack`.
    FailObject {
        /// The object.
        id: ObjectId,
        /// Who holds the reference to it.
        holder: RefHolder,
        /// The task's error.
        message: String,
    },
    /// To a node: reference changes of objects it owns, made by one holder,
    /// in the order they happened. Answered with `Ack`.
    UpdateRefs {
        /// Who made them.
        holder: RefHolder,
        /// The changes.
        updates: Vec<RefUpdate>,
    },
    /// To a node: drop the copy of an object its owner freed. Answered with
    /// `Ack`.
    FreeObject(ObjectId),
    /// To a node, from another node: a bulk stream (TLS over TCP,
    /// `transport/bulk.rs`) of an object it holds, `size` bytes.
    /// Answered with [`ControlReply::ObjectStream`], or an error when the
    /// node has no bulk listener (read in chunks then).
    StreamObject {
        /// The object.
        id: ObjectId,
        /// Its size, as `AwaitObject` answered.
        size: u64,
        /// The node caching a copy (as for `ReadObject`).
        copy_at: Option<ObjectLocation>,
    },
    /// To a node, from a process of its host: the shared-memory file of a
    /// complete object. Answered with [`ControlReply::ObjectFile`] (`None`:
    /// read it in chunks).
    OpenObject(ObjectId),
    /// To a node, from a process of its host: reserve an object to write in
    /// place (as the first chunk of a put does). Answered with
    /// [`ControlReply::ObjectFile`]: `None` if the node keeps no shared
    /// memory, and nothing was reserved.
    CreateObject {
        /// The object.
        id: ObjectId,
        /// Its size.
        total: u64,
        /// Who holds the first reference.
        holder: RefHolder,
        /// References inside it.
        contains: Vec<ContainedRef>,
    },
    /// To a node: an object created with `CreateObject` is written
    /// (`written`) or abandoned. Answered with `Ack`.
    SealObject {
        /// The object.
        id: ObjectId,
        /// Whether the bytes are all there.
        written: bool,
    },
    /// To a node: the objects it holds. Answered with [`ControlReply::Objects`].
    ListObjects,
}

impl From<ObjectRequest> for ControlRequest {
    fn from(request: ObjectRequest) -> Self {
        ControlRequest::Objects(request)
    }
}

/// Fault injection: reports to the head, packet rules to a node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum FaultRequest {
    /// To the head: a fault-injection rule fired; published as
    /// `FaultInjected`. Answered with `Ack`.
    ReportFault {
        /// The fault's kind.
        fault: String,
        /// What it hit, by a stable name.
        target: String,
        /// What fired it.
        trigger: String,
        /// The node the fault is about to kill, if it kills one: the
        /// directory gives the node's actors a death reason that names the
        /// fault (`node lost: ...; chaos: KIND at TRIGGER of TARGET`).
        #[serde(default)]
        kills_node: Option<String>,
    },
    /// To the head: something recovered from a failure (a training group
    /// restored from its checkpoint); published as `Recovered`. Answered
    /// with `Ack`.
    ReportRecovery {
        /// What recovered, in words.
        what: String,
        /// Who, by a stable name (a run's name).
        target: String,
        /// Milliseconds from the failure to the recovery.
        took_ms: u64,
    },
    /// To the head: what a process's socket's packet faults have done so
    /// far (counters since it started, reported when they change);
    /// published as `PacketFaults`. Answered with `Ack`.
    ReportPacketFaults {
        /// The process, by a stable name (a node's, `worker-ACTOR`, `driver-PID`).
        process: String,
        /// Its kind.
        class: ProcessClass,
        /// Its counters.
        counts: crate::transport::FaultCounts,
        /// Datagrams each rule of its plan faulted, by the rule's index
        /// (at most [`MAX_PACKET_RULES`] kept).
        #[serde(default)]
        rule_hits: Vec<u64>,
    },
    /// To a node: add a packet rule to its socket's fault plan, in front of
    /// the others; `from_ms` and `until_ms` count from its arrival (the
    /// chaos runner's partitions between chosen nodes). Refused by a node
    /// started without a packet fault plan. Answered with `Ack`.
    AddPacketRule(crate::transport::PacketRule),
}

impl From<FaultRequest> for ControlRequest {
    fn from(request: FaultRequest) -> Self {
        ControlRequest::Faults(request)
    }
}

/// A control-plane reply.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControlReply {
    /// The node is a member; it must heartbeat at this interval.
    Joined {
        /// Heartbeat interval in milliseconds.
        heartbeat_interval_ms: u64,
        /// The node's ticket, for the certificate it joined with.
        ticket: crate::wire::Ticket,
        /// The head's public ticket key, to check other peers' tickets.
        #[serde(with = "serde_bytes")]
        head_key: Vec<u8>,
    },
    /// A join refused: a live member has the node's name.
    NodeNameTaken {
        /// The live member.
        holder: NodeIdentity,
        /// Where it is.
        address: SocketAddr,
        /// When it will have been declared dead if it has stopped (a
        /// restarted node retries then); `None`: never (the head).
        retry_after_ms: Option<u64>,
    },
    /// Acknowledges a heartbeat or a leave.
    Ack,
    /// The cluster as the head sees it.
    Status(ClusterStatus),
    /// Events, oldest first.
    Events(Vec<ClusterEvent>),
    /// The payload of an [`ControlRequest::Echo`].
    Echo(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The actor runs.
    ActorStarted(ActorRecord),
    /// The node does not have the program binary yet: upload it first.
    NeedBinary,
    /// The node lacks free resources for the actor.
    NoCapacity(String),
    /// The name belongs to another live actor.
    NameTaken(Box<ActorRecord>),
    /// An actor's record, if known.
    Actor(Option<Box<ActorRecord>>),
    /// Bytes of an object.
    ObjectBytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The objects a node holds, and its store's use.
    Objects(ObjectListing),
    /// The object is complete.
    ObjectReady {
        /// Its size in bytes.
        size: u64,
        /// The job whose workers may read it (`None`: not known; drivers
        /// and nodes only): a node keeping a copy keeps it too.
        job: Option<String>,
    },
    /// The object will never be: the task producing it failed, or it was
    /// freed.
    ObjectFailed {
        /// Why.
        reason: String,
        /// The job whose worker or driver recorded the failure (its reason
        /// is that job's to read); `None` for what a node found itself (a
        /// lost owner, a freed object), which any reader may see.
        job: Option<String>,
    },
    /// The object was not complete within the wait.
    ObjectNotReady,
    /// An object's shared-memory file, if it has one.
    ObjectFile(Option<SharedObjectFile>),
    /// Where to read a bulk stream of an object: the node's bulk port (on
    /// its QUIC address's IP) and the one-time ticket to present there.
    ObjectStream {
        /// The TCP port.
        port: u16,
        /// The ticket.
        ticket: crate::transport::BulkTicket,
    },
    /// Live actors.
    Actors(Vec<ActorRecord>),
    /// A chunk of a program binary.
    BinaryChunk {
        /// Length of the whole binary.
        total: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        chunk: Vec<u8>,
    },
    /// Lines workers printed, oldest first.
    Output {
        /// The lines.
        lines: Vec<OutputLine>,
        /// Lines of the job dropped unread since `after` (the node keeps the
        /// last 10,000 of each job).
        dropped: u64,
    },
    /// The placement-group bundles a node holds.
    Bundles(Vec<BundleListing>),
    /// The spawns waiting for room.
    Demands(Vec<Demand>),
    /// A job, as the head knows it.
    Job(Box<JobRecord>),
    /// Every job the head knows.
    Jobs(Vec<JobRecord>),
    /// The tasks the head knows.
    Tasks(Vec<TaskRecord>),
    /// The training runs the head knows (without their points).
    Runs(Vec<super::RunRecord>),
    /// One training run, if the head knows it.
    Run(Option<Box<super::RunRecord>>),
    /// A submitted job's driver runs, with this process id.
    DriverStarted {
        /// Its process id on the node.
        pid: u32,
    },
    /// Part of a worker's log.
    Log {
        /// The log file, on the node.
        file: String,
        /// Its length now.
        total: u64,
        /// The bytes asked for.
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// The number of the latest event published: events after it are
    /// new (an [`EventRequest::LastSeq`]).
    EventSeq(u64),
}

/// A line a worker printed to its stdout, as its node keeps it for the
/// job's driver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputLine {
    /// Its number among the job's lines on that node (from 1).
    pub seq: u64,
    /// The actor that printed it.
    pub actor: ActorId,
    /// Its name, if it has one.
    pub name: Option<String>,
    /// The line, without its newline (at most 4 KiB of it).
    pub line: String,
}

/// A cluster-unique actor id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ActorId(pub u64);

impl ActorId {
    /// A new random id.
    pub fn random() -> Self {
        ActorId(rand::random())
    }
}

impl ActorId {
    /// The name of the worker process hosting this actor (its endpoint's
    /// identity), `worker-ACTOR`.
    pub fn worker_name(self) -> String {
        format!("{}{self}", crate::wire::WORKER_NAME_PREFIX)
    }
}

impl std::fmt::Display for ActorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A placement group: bundles of resources reserved together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PlacementGroupId(pub u64);

/// One bundle of a placement group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BundleId {
    /// The group.
    pub group: PlacementGroupId,
    /// The bundle's position in the group.
    pub index: u32,
}

impl std::fmt::Display for BundleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}/{}", self.group.0, self.index)
    }
}

/// Everything a node needs to start (and restart) an actor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActorSpec {
    /// The actor's id.
    pub actor: ActorId,
    /// Its registered type name.
    pub type_name: String,
    /// Its unique name, if any.
    pub name: Option<String>,
    /// Serialized constructor arguments.
    #[serde(with = "serde_bytes")]
    pub args: Vec<u8>,
    /// Resources it holds while alive.
    pub resources: ResourceSet,
    /// How many times it is re-created after a death: by its node, or,
    /// when its node is lost, by the head on another node.
    pub max_restarts: u32,
    /// Restarts already used when this start was asked for (non-zero when
    /// the head restarts an actor whose node was lost).
    #[serde(default)]
    pub restarts: u32,
    /// The node it must run on (`Strategy::Node`), if any: such an actor
    /// is not restarted elsewhere when that node is lost.
    #[serde(default)]
    pub node: Option<String>,
    /// The job (driver program run) it belongs to.
    pub job: String,
    /// It outlives its job (Ray's `lifetime="detached"`): it is not killed
    /// when the job's driver is gone.
    #[serde(default)]
    pub detached: bool,
    /// The program that hosts it.
    pub binary: BinaryId,
    /// The placement-group bundle whose resources it uses, if any.
    pub bundle: Option<BundleId>,
}

/// A program binary, by content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinaryId {
    /// Hex SHA-256.
    pub hash: String,
    /// Length in bytes.
    pub len: u64,
}

/// Where an actor runs, and whether it still does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActorRecord {
    /// The actor.
    pub actor: ActorId,
    /// Its type name.
    pub type_name: String,
    /// Its unique name, if any.
    pub name: Option<String>,
    /// Its node.
    pub node: NodeIdentity,
    /// The worker process's address.
    pub address: SocketAddr,
    /// The worker process's incarnation: a restart is a new one.
    pub incarnation: Incarnation,
    /// Restarts so far.
    pub restarts: u32,
    /// Why it is dead, if it is (for good).
    pub dead: Option<super::DeathCause>,
    /// Its last incarnation died and its node is starting the next one.
    pub restarting: bool,
    /// The job it belongs to.
    #[serde(default)]
    pub job: String,
    /// Its worker's process id on its node.
    #[serde(default)]
    pub pid: u32,
}

/// What a node tells the head when it joins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRegistration {
    /// Its identity.
    pub node: NodeIdentity,
    /// Where other processes reach it.
    pub address: SocketAddr,
    /// Everything it offers.
    pub resources: ResourceSet,
    /// What it runs (`versions.rs`); unknown for a node too old to say.
    #[serde(default)]
    pub versions: Versions,
}

/// Whether a node is a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Heartbeating.
    Alive,
    /// Left, or stopped heartbeating for longer than the timeout.
    Dead,
}

/// One node as the head sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node's name.
    pub id: String,
    /// Its current (or last) incarnation.
    pub incarnation: u64,
    /// Alive or dead.
    pub state: NodeState,
    /// Whether it is the head.
    pub head: bool,
    /// Where it is reached.
    pub address: SocketAddr,
    /// Total and used resources.
    pub resources: ResourceUsage,
    /// Milliseconds since its last heartbeat.
    pub last_heartbeat_ms_ago: u64,
    /// Why it is dead, if it is.
    pub death_reason: Option<String>,
    /// How busy its machine was at its last heartbeat.
    #[serde(default)]
    pub host: Option<HostLoad>,
    /// What it runs.
    #[serde(default)]
    pub versions: Versions,
    /// A member a restarted head knows from its store and has not heard
    /// from yet: it has until the head's grace ends to heartbeat, else it
    /// is declared dead.
    #[serde(default)]
    pub rejoining: bool,
}

impl NodeStatus {
    /// The node's identity.
    pub fn identity(&self) -> NodeIdentity {
        NodeIdentity {
            name: self.id.clone(),
            incarnation: crate::wire::Incarnation(self.incarnation),
        }
    }
}

/// How busy a node's machine is, as its last heartbeat said.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostLoad {
    /// CPU time busy since the heartbeat before, percent of all CPUs.
    pub cpu_percent: f64,
    /// Memory in use (total less available), bytes.
    pub memory_used: u64,
    /// The machine's memory, bytes.
    pub memory_total: u64,
}

/// Total and used amounts of a node's resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceUsage {
    /// What the node offers.
    pub total: ResourceSet,
    /// What is handed out.
    pub used: ResourceSet,
}

/// The answer to `nimbus status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Every node the head knows, head first.
    pub nodes: Vec<NodeStatus>,
    /// The autoscaler's latest report, while it is fresh (none: the
    /// cluster does not grow by itself).
    #[serde(default)]
    pub autoscaler: Option<AutoscalerReport>,
    /// The capacity requested ahead of use (`RequestResources`), bundle by
    /// bundle.
    #[serde(default)]
    pub requested: Vec<ResourceSet>,
}

impl ClusterStatus {
    /// The nodes that are alive.
    pub fn alive(&self) -> impl Iterator<Item = &NodeStatus> {
        self.nodes.iter().filter(|n| n.state == NodeState::Alive)
    }

    /// The node named `id`.
    pub fn node(&self, id: &str) -> Option<&NodeStatus> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

/// Something that happened to the membership, numbered in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, actix::Message)]
#[rtype(result = "()")]
pub struct ClusterEvent {
    /// Position in the head's event stream, from 1.
    pub seq: u64,
    /// What happened.
    pub kind: ClusterEventKind,
    /// When the head published it, Unix milliseconds (0: not said).
    #[serde(default)]
    pub time_ms: u64,
}

/// Kinds of [`ClusterEvent`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClusterEventKind {
    /// A node (incarnation) became a member.
    NodeJoined {
        /// The node.
        node: NodeIdentity,
        /// Where it is reached.
        address: SocketAddr,
    },
    /// A node stopped on purpose.
    NodeLeft {
        /// The node.
        node: NodeIdentity,
    },
    /// A job ended: its actors (all but the detached ones) were killed and
    /// its bundles released.
    JobEnded {
        /// The job.
        job: String,
        /// Why (its driver was not heard from for the grace period).
        reason: String,
    },
    /// A node was declared dead.
    NodeDead {
        /// The node.
        node: NodeIdentity,
        /// Why: missed heartbeats, or replaced by a newer incarnation.
        reason: String,
    },
    /// What a node has in use changed (reported by its heartbeat).
    ResourcesChanged {
        /// The node.
        node: NodeIdentity,
    },
    /// An actor incarnation runs (first start or restart).
    ActorStarted {
        /// The actor.
        actor: ActorId,
        /// The incarnation that runs.
        incarnation: Incarnation,
        /// Its unique name, if any.
        #[serde(default)]
        name: Option<String>,
        /// The node it runs on.
        #[serde(default)]
        node: String,
    },
    /// An actor incarnation died.
    ActorDied {
        /// The actor.
        actor: ActorId,
        /// The incarnation that died.
        incarnation: Incarnation,
        /// Why.
        reason: super::DeathCause,
        /// Whether a new incarnation is being started.
        restarting: bool,
    },
    /// Something recovered from a failure (reported by whoever recovered).
    Recovered {
        /// What recovered, in words.
        what: String,
        /// Who, by a stable name.
        target: String,
        /// Milliseconds from the failure to the recovery.
        took_ms: u64,
    },
    /// A fault-injection rule fired (reported by whoever injected it).
    FaultInjected {
        /// The fault's kind, such as `straggle(50ms x 3 steps)`.
        fault: String,
        /// What it hit, by a stable name (`rank 1`, an actor's name).
        target: String,
        /// What fired it, such as `step 7`.
        trigger: String,
    },
    /// A process's socket injected packet faults (its counters so far).
    PacketFaults {
        /// The process.
        process: String,
        /// Its kind.
        class: ProcessClass,
        /// Its counters since it started.
        counts: crate::transport::FaultCounts,
        /// Datagrams each rule of its plan faulted, by the rule's index: a
        /// zero is a rule that has not taken effect.
        #[serde(default)]
        rule_hits: Vec<u64>,
    },
    /// The autoscaler decided to launch or stop a node, or a launch
    /// failed (`launching cpu-2-1 (cpu-2) for 2 waiting demand(s)`,
    /// `terminating cpu-2-1: idle 10.0 s`).
    Autoscaler {
        /// The decision, in words.
        decision: String,
    },
    /// Not an event: the reader asked for the events after `after`, and
    /// some of them are gone (the head restarted, or more were published
    /// than the head keeps while the reader was away). What it knows from
    /// the events is stale: it must read the state again (`ListActors`,
    /// `Status`, `ListJobs`) and go on from this marker's number.
    Resync {
        /// The number the reader asked after.
        after: u64,
        /// The first event the head still has (later events follow).
        first_kept: u64,
    },
}

impl ClusterEventKind {
    /// This event with each text in it cut to
    /// [`MAX_TEXT_BYTES`](crate::cluster::MAX_TEXT_BYTES), so that no event
    /// (a huge panic message) can push the event history past a frame.
    pub fn bounded(self) -> ClusterEventKind {
        use crate::cluster::bounded_text;
        match self {
            ClusterEventKind::NodeDead { node, reason } => ClusterEventKind::NodeDead {
                node,
                reason: bounded_text(reason),
            },
            ClusterEventKind::ActorStarted {
                actor,
                incarnation,
                name,
                node,
            } => ClusterEventKind::ActorStarted {
                actor,
                incarnation,
                name: name.map(bounded_text),
                node: bounded_text(node),
            },
            ClusterEventKind::ActorDied {
                actor,
                incarnation,
                reason,
                restarting,
            } => ClusterEventKind::ActorDied {
                actor,
                incarnation,
                reason: reason.bounded(),
                restarting,
            },
            ClusterEventKind::Recovered {
                what,
                target,
                took_ms,
            } => ClusterEventKind::Recovered {
                what: bounded_text(what),
                target: bounded_text(target),
                took_ms,
            },
            ClusterEventKind::FaultInjected {
                fault,
                target,
                trigger,
            } => ClusterEventKind::FaultInjected {
                fault: bounded_text(fault),
                target: bounded_text(target),
                trigger: bounded_text(trigger),
            },
            ClusterEventKind::PacketFaults {
                process,
                class,
                counts,
                mut rule_hits,
            } => ClusterEventKind::PacketFaults {
                process: bounded_text(process),
                class,
                counts,
                rule_hits: {
                    rule_hits.truncate(MAX_PACKET_RULES);
                    rule_hits
                },
            },
            ClusterEventKind::Autoscaler { decision } => ClusterEventKind::Autoscaler {
                decision: bounded_text(decision),
            },
            plain @ (ClusterEventKind::NodeJoined { .. }
            | ClusterEventKind::NodeLeft { .. }
            | ClusterEventKind::JobEnded { .. }
            | ClusterEventKind::ResourcesChanged { .. }
            | ClusterEventKind::Resync { .. }) => plain,
        }
    }
}

/// The kinds of process whose sockets a fault plan can reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ProcessClass {
    /// The program run under the plan (a driver).
    Workload,
    /// A node process.
    Node,
    /// A worker process hosting an actor.
    Worker,
}

impl std::fmt::Display for ProcessClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProcessClass::Workload => "workload",
            ProcessClass::Node => "nodes",
            ProcessClass::Worker => "workers",
        })
    }
}

impl ClusterEventKind {
    /// The node the event is about, for node events.
    pub fn node(&self) -> Option<&NodeIdentity> {
        match self {
            ClusterEventKind::NodeJoined { node, .. }
            | ClusterEventKind::NodeLeft { node }
            | ClusterEventKind::NodeDead { node, .. }
            | ClusterEventKind::ResourcesChanged { node } => Some(node),
            ClusterEventKind::ActorStarted { .. }
            | ClusterEventKind::ActorDied { .. }
            | ClusterEventKind::Recovered { .. }
            | ClusterEventKind::FaultInjected { .. }
            | ClusterEventKind::JobEnded { .. }
            | ClusterEventKind::PacketFaults { .. }
            | ClusterEventKind::Autoscaler { .. }
            | ClusterEventKind::Resync { .. } => None,
        }
    }
}
