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
//!
//! Files: `ControlRequest` and `ControlReply` here; each subsystem's
//! requests in a file of its own (`membership.rs`, with the nodes' status;
//! `events.rs`, with the events; `directory.rs`, with the demands;
//! `workers.rs`: workers, bundles and binaries; `objects.rs`; `faults.rs`;
//! `jobs.rs`); `actors.rs`, the actors' ids, specs and records they share.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::cluster::{JobRecord, ObjectListing, SharedObjectFile, TaskRecord};
use crate::wire::NodeIdentity;

mod actors;
mod directory;
mod events;
mod faults;
mod jobs;
mod membership;
mod objects;
mod workers;

pub use actors::{
    ActorId, ActorRecord, ActorSpec, BinaryId, BundleId, OutputLine, PlacementGroupId,
};
pub use directory::{Demand, DirectoryRequest, GroupDemand, Together};
pub use events::{ClusterEvent, ClusterEventKind, EventRequest, ProcessClass};
pub use faults::{FaultRequest, MAX_PACKET_RULES};
pub use jobs::{JobRequest, DRIVER_BEAT, MAX_RUN_EVENTS, MAX_TASK_STATES};
pub use membership::{
    ClusterStatus, HostLoad, MembershipRequest, NodeRegistration, NodeState, NodeStatus,
    ResourceUsage,
};
pub use objects::ObjectRequest;
pub use workers::{BinaryRequest, BundleListing, BundleRequest, WorkerRequest};

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

/// How long nodes, workers and drivers ride out an unreachable head, and
/// how long a restarted head waits for the members it knew
/// (`--head-grace-s`, `NIMBUS_HEAD_GRACE_S`).
pub const DEFAULT_HEAD_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

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
