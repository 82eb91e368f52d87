//! What every process of a cluster shares: resources, the control protocol
//! and its types (nodes, actors, objects, events), fault rules and reports.
//! The head's actors that answer the protocol are in [`crate::head`].
//!
//! Files: `autoscaling.rs` (what the autoscaler reports to the head),
//! `resources.rs` (`ResourceSet`, resource detection), `jobs.rs` (jobs:
//! submissions, records, states),
//! `messages/` (the control protocol: `ControlRequest`,
//! one variant per subsystem, each with its own request enum in a file of
//! its own; `ControlReply`; nodes, actors and events), `objects.rs` (the object
//! store's wire types), `death.rs` (`DeathCause`), `faults.rs` (actor
//! fault rules, the chaos harness's reserved messages, and `FiredFault`,
//! the `chaos: KIND at TRIGGER of TARGET` form in which every fault hook
//! reports a death it caused). The machine's files, processes and GPUs
//! are [`crate::host`]'s.
//!
//! Architecture invariant: data and pure functions only; no actors, no
//! sockets, no files (but reading the host's resources, through
//! `crate::host`).

mod autoscaling;
mod death;
pub mod faults;
mod jobs;
mod messages;
mod objects;
mod resources;
mod runs;
mod versions;

pub use autoscaling::{AutoscalerReport, NodeTypeReport, MAX_REPORTED, MAX_REQUESTED_BUNDLES};
pub use death::{bounded_text, DeathCause, MAX_TEXT_BYTES};
pub use jobs::{
    valid_job_id, JobRecord, JobState, JobSubmission, TaskRecord, TaskState, MAX_JOB_ID,
};
pub use messages::{
    ActorId, ActorOwner, ActorRecord, ActorSpec, BinaryId, BinaryReply, BinaryRequest, BundleId,
    BundleListing, BundleReply, BundleRequest, ClusterEvent, ClusterEventKind, ClusterStatus,
    ControlReply, ControlRequest, Demand, DirectoryReply, DirectoryRequest, Echo, EventReply,
    EventRequest, FaultReply, FaultRequest, GroupDemand, HostLoad, JobReply, JobRequest, LogChunk,
    MembershipReply, MembershipRequest, NodeRegistration, NodeState, NodeStatus, ObjectReply,
    ObjectRequest, OutputLine, PlacementGroupId, ProcessClass, ResourceUsage, StateReply,
    StateRequest, StateScope, Subsystem, Together, UnexpectedReply, WorkerReply, WorkerRequest,
    DEFAULT_HEAD_GRACE, DRIVER_BEAT, MAX_LIBRARY_NAME, MAX_PACKET_RULES, MAX_RUN_EVENTS,
    MAX_STATE_BYTES, MAX_STATE_KEY, MAX_STATE_RECORDS, MAX_STATE_VALUE, MAX_TASK_STATES,
};
pub use objects::{
    ContainedRef, ObjectId, ObjectListing, ObjectLocation, ObjectState, ObjectSummary, RefChange,
    RefHolder, RefUpdate, SharedObjectFile, SmallObject,
};
pub use resources::{ResourceError, ResourceOverrides, ResourceSet, CPU, GPU, MEMORY};
pub use runs::{RunCheckpoint, RunEvent, RunHeader, RunNote, RunPoint, RunRecord};
pub use versions::{Torch, Versions};
