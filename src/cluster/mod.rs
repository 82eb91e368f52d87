//! What every process of a cluster shares: resources, the control protocol
//! and its types (nodes, actors, objects, events), fault rules and reports.
//! The head's actors that answer the protocol are in [`crate::head`].
//!
//! Architecture invariant: data and pure functions only; no actors, no
//! sockets.

mod death;
mod digest;
pub mod faults;
pub mod gpus;
mod messages;
mod objects;
mod resources;

pub use death::DeathCause;
pub use digest::sha256_file;
pub use messages::{
    ActorId, ActorRecord, ActorSpec, BinaryId, BinaryRequest, BundleId, BundleRequest,
    ClusterEvent, ClusterEventKind, ClusterStatus, ControlReply, ControlRequest, DirectoryRequest,
    EventRequest, FaultRequest, MembershipRequest, NodeRegistration, NodeState, NodeStatus,
    ObjectRequest, PlacementGroupId, ProcessClass, ResourceUsage, WorkerRequest,
};
pub use objects::{
    ContainedRef, ObjectId, ObjectListing, ObjectLocation, ObjectState, ObjectSummary, RefChange,
    RefHolder, RefUpdate, SharedObjectFile,
};
pub use resources::{ResourceError, ResourceOverrides, ResourceSet, CPU, GPU, MEMORY};
