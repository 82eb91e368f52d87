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
//!   `TaskStates`, `ListTasks`;
//! - `State` ([`StateRequest`], `state.rs`): `Put`, `Get`, `List`,
//!   `Delete`, libraries' durable records.
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
//! Each subsystem answers with a reply type of its own (`MembershipReply`,
//! `DirectoryReply`, ...), carried in the same variant of [`ControlReply`];
//! the [`Subsystem`] trait ties a request type to its reply type, so a
//! handler cannot answer, nor a caller expect, another subsystem's reply.
//! The protocol version (the wire's `PROTOCOL_VERSION`, 16) counts this
//! grouping by subsystem (3: a join refused for a taken name is answered
//! `NodeNameTaken`; 4: a join names the node's worker-ticket key and is
//! answered with its ticket; 5: the event stream's `Resync` marker; 6:
//! small puts in batches, `PutObjects`; 7: `StreamObject`, bulk streams
//! over TCP; 8: `LastSeq`, the latest event's number; 9: `ListDeadActors`;
//! 16: replies grouped by subsystem, and `State`).
//!
//! Files: `ControlRequest`, `ControlReply` and `Subsystem` here; each
//! subsystem's requests and reply in a file of its own (`membership.rs`, with the nodes' status;
//! `events.rs`, with the events; `directory.rs`, with the demands;
//! `workers.rs`: workers, bundles and binaries; `objects.rs`; `faults.rs`;
//! `jobs.rs`); `actors.rs`, the actors' ids, specs and records they share.

use serde::{Deserialize, Serialize};

mod actors;
mod directory;
mod events;
mod faults;
mod jobs;
mod membership;
mod objects;
mod state;
mod workers;

pub use actors::{
    ActorId, ActorOwner, ActorRecord, ActorSpec, BinaryId, BundleId, OutputLine, PlacementGroupId,
};
pub use directory::{Demand, DirectoryReply, DirectoryRequest, GroupDemand, Together};
pub use events::{ClusterEvent, ClusterEventKind, EventReply, EventRequest, ProcessClass};
pub use faults::{FaultReply, FaultRequest, MAX_PACKET_RULES};
pub use jobs::{JobReply, JobRequest, DRIVER_BEAT, MAX_RUN_EVENTS, MAX_TASK_STATES};
pub use membership::{
    ClusterStatus, HostLoad, MembershipReply, MembershipRequest, NodeRegistration, NodeState,
    NodeStatus, ResourceUsage,
};
pub use objects::{ObjectReply, ObjectRequest};
pub use state::{
    StateReply, StateRequest, StateScope, MAX_LIBRARY_NAME, MAX_STATE_BYTES, MAX_STATE_KEY,
    MAX_STATE_RECORDS, MAX_STATE_VALUE,
};
pub use workers::{
    BinaryReply, BinaryRequest, BundleListing, BundleReply, BundleRequest, LogChunk, WorkerReply,
    WorkerRequest,
};

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
    /// To the head: libraries' durable records (answered by `LibraryState`).
    State(StateRequest),
    /// Returns the payload unchanged: a liveness probe and a benchmark.
    Echo(Echo),
}

impl ControlRequest {
    /// Whether asking twice does what asking once does (reads of the
    /// head's state, reserving a name for the same actor, setting or
    /// deleting a library's record): such requests
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
                | ControlRequest::State(_)
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

/// A control-plane reply: one variant per subsystem, each holding that
/// subsystem's reply type ([`Subsystem::Reply`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControlReply {
    /// Answers a [`MembershipRequest`].
    Membership(MembershipReply),
    /// Answers an [`EventRequest`].
    Events(EventReply),
    /// Answers a [`DirectoryRequest`].
    Directory(DirectoryReply),
    /// Answers a [`WorkerRequest`].
    Workers(WorkerReply),
    /// Answers a [`BundleRequest`].
    Bundles(BundleReply),
    /// Answers a [`BinaryRequest`].
    Binaries(BinaryReply),
    /// Answers an [`ObjectRequest`].
    Objects(ObjectReply),
    /// Answers a [`FaultRequest`].
    Faults(FaultReply),
    /// Answers a [`JobRequest`].
    Jobs(JobReply),
    /// Answers a [`StateRequest`].
    State(StateReply),
    /// Answers an [`Echo`]: the same payload.
    Echo(Echo),
}

/// A liveness probe and a benchmark: answered with the same payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Echo(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// A subsystem's requests, with the one reply type that answers them: the
/// node service's handler of a subsystem returns its `Reply`, and a typed
/// call (`crate::client::call`, `ProcessContext::call_head`) returns it to
/// the caller, so neither side can mix up subsystems. [`ControlRequest`]
/// itself is one, answered by any [`ControlReply`].
pub trait Subsystem: Into<ControlRequest> {
    /// What answers this subsystem's requests.
    type Reply: Into<ControlReply> + std::fmt::Debug;
    /// The subsystem's name, for errors.
    const NAME: &'static str;
    /// The reply, if it is this subsystem's; else the error naming both.
    fn expect(reply: ControlReply) -> Result<Self::Reply, UnexpectedReply>;
}

impl Subsystem for ControlRequest {
    type Reply = ControlReply;
    const NAME: &'static str = "a control request";
    fn expect(reply: ControlReply) -> Result<ControlReply, UnexpectedReply> {
        Ok(reply)
    }
}

/// Ties each subsystem's request type to its variant of [`ControlRequest`]
/// and its reply type to the same variant of [`ControlReply`].
macro_rules! subsystems {
    ($($variant:ident: $request:ty => $reply:ty,)*) => {$(
        impl From<$request> for ControlRequest {
            fn from(request: $request) -> Self {
                ControlRequest::$variant(request)
            }
        }
        impl From<$reply> for ControlReply {
            fn from(reply: $reply) -> Self {
                ControlReply::$variant(reply)
            }
        }
        impl Subsystem for $request {
            type Reply = $reply;
            const NAME: &'static str = stringify!($request);
            fn expect(reply: ControlReply) -> Result<$reply, UnexpectedReply> {
                match reply {
                    ControlReply::$variant(reply) => Ok(reply),
                    other => Err(UnexpectedReply::new(Self::NAME, other)),
                }
            }
        }
    )*};
}

subsystems! {
    Membership: MembershipRequest => MembershipReply,
    Events: EventRequest => EventReply,
    Directory: DirectoryRequest => DirectoryReply,
    Workers: WorkerRequest => WorkerReply,
    Bundles: BundleRequest => BundleReply,
    Binaries: BinaryRequest => BinaryReply,
    Objects: ObjectRequest => ObjectReply,
    Faults: FaultRequest => FaultReply,
    Jobs: JobRequest => JobReply,
    State: StateRequest => StateReply,
    Echo: Echo => Echo,
}

/// A reply that does not answer the request it came for: a peer of
/// another protocol version, or a bug. The one way every layer names it.
#[derive(Debug, thiserror::Error)]
#[error("{request} was answered with {reply:?}")]
pub struct UnexpectedReply {
    /// The request, by name.
    pub request: &'static str,
    /// What came back.
    pub reply: Box<ControlReply>,
}

impl UnexpectedReply {
    /// `request` (its name) was answered with `reply`.
    pub fn new(request: &'static str, reply: impl Into<ControlReply>) -> Self {
        UnexpectedReply {
            request,
            reply: Box::new(reply.into()),
        }
    }
}
