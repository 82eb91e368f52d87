//! A node: one OS process running an actix `System`, with one QUIC endpoint,
//! a [`NodeManager`] and, on the head, the control-plane actors.
//!
//! [`run`] is what `nimbus start --block` calls. Its steps:
//!
//! 1. Resolve resources (command line, else detected) and bind the UDP port,
//!    so that a port in use fails before anything else starts.
//! 2. Pick a fresh incarnation, issue this process's certificate from the
//!    join token, and start serving.
//! 3. On the head, start the control-plane actors (and the
//!    [`ActorRescheduler`](crate::head::ActorRescheduler), which restarts actors lost with their node on
//!    other nodes) and register itself; on
//!    other nodes, join the head (a refused or unreachable head is an error
//!    and the process exits non-zero).
//! 4. Start the [`NodeManager`], which heartbeats until the process stops,
//!    and report readiness.
//! 5. On SIGTERM or SIGINT, leave the cluster and close every connection
//!    with a "shutting down" reason; on a fatal error (declared dead, head
//!    lost), stop with that error.

mod binaries;
mod config;
mod error;
mod manager;
mod resources;
mod runtime;
mod service;
mod workers;

pub use config::{default_state_dir, NodeConfig, NodeRole};
pub use error::{BinaryError, GrantError, NoCapacity, NodeError, NotServing, WorkerStartError};
pub use manager::{
    HeadLink, KillActor, NodeManager, NodeManagerConfig, ReadBinary, ReleaseBundle, ReserveBundle,
    StartActor, UploadBinary,
};
pub use resources::{Grant, ResourcePool};
pub use runtime::{run, NodeReady};
pub use service::NodeService;
