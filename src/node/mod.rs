//! A node: one OS process running an actix `System`, with one QUIC endpoint,
//! a [`NodeManager`] and, on the head, the control-plane actors.
//!
//! [`run`] is what `nimbus start --block` calls. Its steps:
//!
//! 1. Resolve resources (command line, else detected) and bind the UDP port,
//!    so that a port in use fails before anything else starts.
//! 2. Pick a fresh incarnation (microseconds since the epoch: a restart is
//!    always newer), issue this process's certificate from the join token,
//!    make the key it signs its workers' tickets with, and open the
//!    endpoint (with the packet-fault plan of `NIMBUS_PACKET_FAULTS`, if
//!    any).
//! 3. On the head, start the control-plane actors (`ClusterEvents`,
//!    `Membership`, the `Directory` subscribed to the events, and the
//!    [`ActorRescheduler`](crate::head::ActorRescheduler), which restarts
//!    actors lost with their node on other nodes) and register itself; the
//!    heartbeat interval is the heartbeat timeout / `BEATS_PER_TIMEOUT`
//!    (6); the head takes its ticket key from its store (opened by the
//!    caller: `head/store.rs`), bumps the store's epoch, loads the members
//!    a previous head recorded, and certifies itself. On other
//!    nodes, join the head as a token holder, which answers with the
//!    interval and the node's ticket (a refused or unreachable head is an
//!    error and the process exits non-zero); from then on the node presents
//!    the ticket (`crate::transport`'s `tickets.rs`).
//! 4. Start the [`NodeManager`], which heartbeats until the process stops,
//!    and the object store: first remove the shared-memory and spill
//!    directories that killed nodes of this host left behind (their
//!    process is gone), then start it with `--object-store-memory` (default
//!    30 % of the node's memory), watching worker deaths. Serve requests
//!    through the [`NodeService`], report packet-fault counts if a plan is
//!    active, and report readiness. Every request is checked against its
//!    caller's proven identity first (`authorize.rs`).
//! 5. On SIGTERM or SIGINT, a member sends `Leave` (2 s deadline; reported
//!    `NodeLeft`), every connection is closed with a "shutting down" reason
//!    (close code 4), and the object store removes its directories. On a
//!    fatal error (declared dead or replaced: `Expelled`; no heartbeat
//!    acknowledged for the grace, `--head-grace-s`, 60 s by default:
//!    `HeadLost`),
//!    stop with that error.
//!
//! Files: `config.rs` (`NodeConfig`), `manager/` (the `NodeManager`
//! actor), `workers.rs` (starting a worker process and reaping it),
//! `binaries.rs` (the content-addressed cache of shipped program
//! binaries), `libraries.rs` (whether a program finds its shared
//! libraries here, checked before its first worker starts), `drivers.rs` (the `DriverRunner` actor: submitted jobs'
//! driver programs, started, watched, stopped, their logs), `authorize.rs` (who may ask what), `logs.rs` (workers' logs, read with `ReadLog`), `output.rs` (what
//! workers print, kept per job for its driver: `ReadOutput`), `resources.rs` (the pure `ResourcePool`: what actors and
//! placement-group bundles hold), `gpu_slots.rs` (which GPU devices, or
//! fractions of one, each actor gets: its `CUDA_VISIBLE_DEVICES`), `service.rs` (`NodeService`,
//! the one dispatcher), `runtime.rs` (`run`), `error.rs`.

mod authorize;
mod binaries;
mod config;
mod drivers;
mod error;
mod gpu_slots;
mod host;
mod libraries;
mod logs;
mod manager;
mod output;
mod reports;
mod resources;
mod runtime;
mod sandbox;
mod service;
mod workers;

pub use authorize::Forbidden;
pub use config::{default_state_dir, NodeConfig, NodeRole};
pub use drivers::{DriverError, DriverRunner, STOP_GRACE};
pub use error::{BinaryError, GrantError, NoCapacity, NodeError, NotServing, WorkerStartError};
pub use gpu_slots::{GpuSlotError, GpuSlots, GpuTake, FRACTION_EPSILON};
pub use libraries::Lacking;
pub use logs::DEFAULT_LOG_MAX;
pub use manager::{
    HeadLink, KillActor, NodeManager, NodeManagerConfig, ReadBinary, ReleaseBundle, ReserveBundle,
    StartActor, UploadBinary,
};
pub use resources::{Grant, ResourcePool};
pub use runtime::{detect_ip, run, NodeReady};
pub use sandbox::{SandboxError, SandboxMode, Step as SandboxStep, WorkerSandbox};
pub use service::NodeService;
pub use workers::WorkerIdentities;
