//! What every nimbus process has once `nimbus::init` ran, and nothing any
//! feature adds: the link to the cluster ([`ProcessContext`]), the program's
//! entry points ([`Registry`], with one table per feature), the process's
//! role (driver or worker, [`ProcessRole`]), the protocol by which a node
//! starts a worker ([`boot`]), in a worker the node it runs on, and the
//! reports of what a packet-fault plan did to the process's socket.
//!
//! Files: `context.rs` (`ProcessContext`: the endpoint, head, home node,
//! registry, job and binary; the death watch), `registry.rs` (`Registry`:
//! actor and message types by stable name, type-erased construction and
//! dispatch, and one table per feature, added with `Registry::extend` and
//! read with `Registry::table`: task functions, training loops),
//! `role.rs` (`ProcessRole`, decided from the command line in one place),
//! `boot.rs` (the worker boot protocol), `node_of_worker.rs` (a worker's
//! node, and `kill_own_node` for `kill_node` faults), `packet_reports.rs`,
//! `panic.rs` (a panic payload as a death reason; panics caught as a task's failure), `run_reports.rs` (what a
//! training run or a Tune trial tells the head for the dashboard),
//! `transits.rs` (a
//! message carrying object references leaves only once their owners know).
//!
//! Features (actors, tasks, the object store, placement groups, training)
//! build on it; it imports none of them. Their per-process services are
//! started by the composition roots (`driver`, `worker`).

pub mod boot;
mod context;
mod extensions;
pub mod logging;
mod node_of_worker;
mod packet_reports;
mod panic;
mod registry;
mod role;
pub mod run_reports;
pub mod transits;

pub use context::{ProcessContext, LAST_PUSH_WAIT};
pub use node_of_worker::{kill_own_node, KillNodeRefused, NodeOfWorker};
pub use packet_reports::{packet_report, report_packet_faults, REPORT_EVERY};
pub(crate) use panic::panic_is_caught;
pub use panic::{catch_panic, panic_text};
pub use registry::{
    DispatchError, HostedActor, Registration, Registry, RemoteActor, RemoteMessage, Replied,
    ReplySink, ReplyTo, Wire,
};
pub use role::{ProcessRole, NODE_ARG, TASK_WORKER};
