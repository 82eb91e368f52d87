//! nimbus: Ray's distributed training stack, rebuilt in Rust as an actor
//! system.
//!
//! A cluster is a set of node processes (`nimbus start`), one of them the
//! head, talking QUIC with mutual TLS. The code is layered; each layer only
//! uses the ones above it in this list (ARCHITECTURE.md has the full map):
//!
//! - [`wire`]: frames, envelopes and identities; pure.
//! - [`transport`]: the QUIC endpoint, credentials from the join token, one
//!   stream per request; knows nothing of actors.
//! - [`cluster`]: resources, the control protocol, and the head's actors
//!   ([`cluster::Membership`], [`cluster::ClusterEvents`],
//!   [`cluster::Directory`]).
//! - [`node`]: the node process: [`node::NodeManager`], [`node::NodeService`]
//!   and [`node::run`].
//! - [`client`]: talking to a cluster from outside ([`client::ClusterClient`]).
//! - [`local`]: [`local::LocalCluster`], real node processes on this machine
//!   for tests, examples and benchmarks.
//! - [`actor`]: user actors in worker processes: [`actor::Registry`],
//!   [`actor::spawn`], [`actor::ActorHandle`], [`actor::get_actor`],
//!   [`actor::monitor`].
//! - [`placement`]: placement groups, bundles reserved together across nodes.
//! - [`object_store`]: values put once and read anywhere by reference.
//! - [`driver`]: [`init`], the first line of a user program's `main`.
//! - [`train`]: data-parallel training (Ray Train's `TorchTrainer`):
//!   supervisor, workers, collectives, checkpoints.
//! - [`chaos`]: seeded fault plans run against a local cluster, with a
//!   timeline of faults and recoveries.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> anyhow::Result<()> {
//! let cluster = nimbus::local::LocalCluster::start(3)?;
//! let status = cluster.client().await?.status().await?;
//! assert_eq!(status.alive().count(), 3);
//! # Ok(()) }
//! ```

pub mod actor;
pub mod chaos;
pub mod client;
pub mod cluster;
pub mod driver;
pub mod launch;
pub mod local;
pub mod node;
pub mod object_store;
pub mod placement;
pub mod runtime;
pub mod task;
pub mod train;
pub mod transport;
pub mod wire;
mod worker;

pub use driver::{init, init_with, ClusterArgs, Driver, InitError, InitOptions};

/// The libtorch bindings nimbus is built against, so training code uses the
/// same version.
#[cfg(feature = "torch")]
pub use tch;
