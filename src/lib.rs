//! nimbus: Ray's distributed training stack, rebuilt in Rust as an actor
//! system.
//!
//! A cluster is a set of node processes (`nimbus start`), one of them the
//! head, talking QUIC with mutual TLS. The code is layered, from the bottom
//! up; each module imports only modules listed before it (the exact table
//! is in `tests/nimbus/architecture.rs`, which fails on any other import;
//! ARCHITECTURE.md has the full map):
//!
//! 0. [`metrics`]: Prometheus metrics every process records, and a
//!    node's `/metrics` (imports nothing of the crate).
//! 1. [`wire`]: frames, envelopes and identities; pure.
//! 2. [`transport`]: the QUIC endpoint, credentials from the join token, one
//!    stream per request; knows nothing of actors.
//! 3. [`host`]: this machine: private files, directories a node owns,
//!    digests, GPUs, node processes.
//! 4. [`cluster`]: resources, the control protocol and its types, fault
//!    rules and reports; data only.
//! 5. [`client`]: talking to a cluster from outside ([`client::ClusterClient`]).
//! 6. [`dashboard`]: the web page and JSON API of the cluster the head
//!    serves, a client of the cluster like the CLI.
//! 7. [`runtime`]: what every process has once `init` ran, and no feature:
//!    [`runtime::ProcessContext`], the [`runtime::Registry`] of entry points
//!    (features add their own tables), the process role, the worker boot
//!    protocol.
//! 8. [`library`]: the seam for libraries built on nimbus (`nimbus-train`,
//!    `nimbus-data`, `nimbus-serve`; RL to come): fault and recovery reports,
//!    ending a worker with a cause, the cluster's nodes and events, training-run reports,
//!    private files.
//! 9. [`launch`]: starting an actor's worker process on a node, shipping or
//!    relaying the program binary (used by spawns and the head).
//! 10. [`autoscaler`]: launches nodes for spawns that wait and stops idle
//!     ones, within a cluster config's node types (`nimbus up`); a client
//!     of the head beside it.
//! 11. [`head`]: the head's control-plane actors ([`head::Membership`],
//!     [`head::ClusterEvents`], [`head::Directory`],
//!     [`head::ActorRescheduler`]).
//! 12. [`object_store`]: values put once and read anywhere by reference (the
//!     calling process's half and the node's half).
//! 13. [`node`]: the node process: [`node::NodeManager`], [`node::NodeService`]
//!     and [`node::run`].
//! 14. [`local`]: [`local::LocalCluster`], real node processes on this
//!     machine for tests, examples and benchmarks.
//! 15. [`actor`]: user actors in worker processes: [`actor::spawn`],
//!     [`actor::ActorHandle`], [`actor::get_actor`], [`actor::monitor`].
//! 16. [`placement`]: placement groups, bundles reserved together across
//!     nodes ([`placement::InBundle`] places actors in them).
//! 17. [`task`]: stateless functions run on leased worker processes.
//! 18. [`train`]: what training shares without libtorch: fault rules,
//!     results files, the sampler and the parameter aggregator. Training
//!     itself (Ray Train's `TorchTrainer`: supervisor, workers, collectives,
//!     checkpoints) is the `nimbus-train` crate, the only one that links
//!     libtorch.
//! 19. [`tune`]: hyperparameter search (Ray Tune): search spaces, searchers,
//!     schedulers, trials run by reused runner actors.
//! 20. `worker`: the composition root of a worker process.
//! 21. [`chaos`]: seeded fault plans run against a local cluster, with a
//!     timeline of faults and recoveries.
//! 22. [`cli`]: the `nimbus` command line (start, inspect and stop nodes),
//!     in the library so that a user's program can run its own local
//!     cluster's nodes.
//! 23. [`driver`]: [`init`], the first line of a user program's `main`: the
//!     composition root of a driver (and of a node run from the program).
//! 24. [`testing`]: helpers for tests (deadlines, invariants, processes left
//!     behind).
//!
//! ```
//! # #[tokio::main] async fn main() -> anyhow::Result<()> {
//! // The `nimbus` binary is found at $NIMBUS_BIN, next to the program, or on PATH.
//! let cluster = nimbus::local::LocalCluster::start(3)?;
//! let status = cluster.client().await?.status().await?;
//! assert_eq!(status.alive().count(), 3);
//! # Ok(()) }
//! ```

pub mod actor;
pub mod autoscaler;
pub mod chaos;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod dashboard;
pub mod driver;
pub mod head;
pub mod host;
pub mod launch;
pub mod library;
pub mod local;
pub mod metrics;
pub mod node;
pub mod object_store;
pub mod placement;
pub mod runtime;
pub mod task;
pub mod testing;
pub mod train;
pub mod transport;
pub mod tune;
pub mod wire;
mod worker;

pub use driver::{
    init, init_parsed, init_with, ClusterArgs, ClusterChoice, Driver, InitError, InitOptions,
};

/// For the registration macros (`remote_actor!`, `remote_task!`).
#[doc(hidden)]
pub use inventory as __inventory;

/// The actor framework user actors are written with (`impl Actor`,
/// `Handler`, `#[derive(Message)]`), re-exported so a program's actix is
/// always the one nimbus hosts its actors on.
pub use actix;

/// The serialization framework actor messages, task arguments and objects
/// travel with, re-exported so a program derives `Serialize` and
/// `Deserialize` from the version nimbus encodes with
/// (`#[derive(nimbus::serde::Serialize)]` with `#[serde(crate =
/// "nimbus::serde")]`, or `serde` at this version in the program's own
/// `Cargo.toml`).
pub use serde;
