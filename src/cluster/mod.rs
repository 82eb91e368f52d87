//! The control plane: resources, membership, the event stream and the
//! directory. The actors here run on the head node only; the data types
//! travel between all processes.
//!
//! Architecture invariant: nothing here touches sockets; requests reach
//! these actors through the node service, which decodes them.

mod digest;
pub mod directory;
pub mod events;
pub mod faults;
pub mod gpus;
pub mod membership;
mod messages;
mod objects;
mod resources;

pub use digest::sha256_file;
pub use directory::Directory;
pub use events::ClusterEvents;
pub use membership::Membership;
pub use messages::{
    ActorId, ActorRecord, ActorSpec, BinaryId, BundleId, ClusterEvent, ClusterEventKind,
    ClusterStatus, ControlReply, ControlRequest, NodeRegistration, NodeState, NodeStatus,
    PlacementGroupId, ResourceUsage,
};
pub use objects::{
    ContainedRef, ObjectId, ObjectListing, ObjectLocation, ObjectState, ObjectSummary, RefChange,
    RefHolder, RefUpdate, SharedObjectFile,
};
pub use resources::{ResourceError, ResourceOverrides, ResourceSet, CPU, GPU, MEMORY};
