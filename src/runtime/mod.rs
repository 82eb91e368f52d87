//! What every nimbus process has once `nimbus::init` ran, and nothing any
//! feature adds: the link to the cluster ([`ProcessContext`]), the program's
//! entry points ([`Registry`], with one table per feature), the process's
//! role (driver or worker, [`ProcessRole`]), the protocol by which a node
//! starts a worker ([`boot`]), in a worker the node it runs on, and the
//! reports of what a packet-fault plan did to the process's socket.
//!
//! Features (actors, tasks, the object store, placement groups, training)
//! build on it; it imports none of them. Their per-process services are
//! started by the composition roots (`driver`, `worker`).

pub mod boot;
mod context;
mod node_of_worker;
mod packet_reports;
mod panic;
mod registry;
mod role;

pub use context::ProcessContext;
pub use node_of_worker::{kill_own_node, KillNodeRefused, NodeOfWorker};
pub use packet_reports::{report_packet_faults, REPORT_EVERY};
pub use panic::panic_text;
pub use registry::{DispatchError, HostedActor, Registry, RemoteActor, RemoteMessage, Wire};
pub use role::ProcessRole;
