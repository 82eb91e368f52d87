//! The autoscaler: adds nodes when spawns wait for resources no node has
//! free, and stops nodes that have had nothing to do for a while, within
//! the node types and limits of a cluster config (`nimbus up FILE`).
//!
//! It runs beside the head, as Ray's does (its monitor process), a client
//! of the head like the CLI: `nimbus up` starts the head, then the
//! autoscaler, which reads the head's view and reports back to it.
//!
//! 1. **Start.** Read the config (`config.rs`); adopt the nodes its
//!    provider already launched (`provider/`, records under
//!    `$NIMBUS_HOME/autoscaler/launched`): an autoscaler started again
//!    launches nothing twice.
//! 2. **Observe**, every [`POLL_INTERVAL`] (1 s): the alive members with
//!    their total and used resources, the spawns waiting for room
//!    (`ListDemands`), and, for a launched node that uses nothing, whether
//!    its store holds the only copy of an object. A launched node that
//!    joined is running; one that left is forgotten; one not joined within
//!    `launch_timeout_s` has failed (stopped, its type backs off).
//! 3. **Decide launches** (`decide.rs`): pack the waiting demands, larger
//!    first, onto the members' free resources, then the nodes still
//!    launching, then new nodes of the smallest type that offers each
//!    (first-fit decreasing); a demand no type offers launches nothing.
//!    Within each type's `max_workers`, the overall `max_workers`, and
//!    at most `upscaling_speed` × the running nodes at once (at least 5);
//!    each type's `min_workers` are kept running. Capacity requested
//!    ahead of use (`request.rs`) is packed onto the nodes' total
//!    resources, and nodes launched for what does not fit.
//! 4. **Launch** through the provider; a launch that fails backs its type
//!    off: 5 s, doubling per failure in a row, up to 5 min
//!    ([`decide::FIRST_BACKOFF`], [`decide::MAX_BACKOFF`]).
//! 5. **Stop idle nodes**: a launched node that uses no resources and
//!    holds no object's only copy for `idle_timeout_s`, and that no
//!    waiting demand or requested bundle was packed into, is stopped
//!    (SIGTERM: it leaves the cluster), down to its type's `min_workers`.
//! 6. **Report** to the head (`MembershipRequest::Autoscaler`): the node
//!    types with running, launching and idle nodes, back-offs, and the
//!    latest decisions. `nimbus status` shows them, and a spawn that no
//!    member fits waits for a node type that does instead of failing.
//! 7. **Stop** (SIGTERM or SIGINT, `nimbus down`): stop every node it
//!    launched, then exit.
//!
//! Architecture invariant: decisions are `decide.rs`'s plain state, time
//! passed in; only `monitor.rs` talks to the head, and only `provider/`
//! starts or stops processes.

pub mod config;
pub mod decide;
pub mod monitor;
pub mod provider;
mod request;
#[cfg(test)]
mod simulation;

use std::path::PathBuf;
use std::time::Duration;

pub use config::ClusterConfig;
pub use request::request_resources;

/// How often the autoscaler observes, decides and reports (step 2).
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What went wrong in the autoscaler.
#[derive(Debug, thiserror::Error)]
pub enum AutoscalerError {
    /// The cluster config is not usable.
    #[error("cluster config {path}: {problem}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        problem: String,
    },
    /// A node could not be launched.
    #[error("cannot launch node {node}: {detail}")]
    Launch {
        /// The node.
        node: String,
        /// Why.
        detail: String,
    },
    /// A node could not be stopped.
    #[error("cannot terminate node {node}: {detail}")]
    Terminate {
        /// The node.
        node: String,
        /// Why.
        detail: String,
    },
    /// The autoscaler's records could not be written.
    #[error("cannot record launched nodes in {path}: {detail} (check $NIMBUS_HOME)")]
    State {
        /// The directory.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// `nimbus::init` and `Driver::connect` have not run in this process.
    #[error("nimbus is not initialised in this process: call nimbus::init(..) and Driver::connect() first")]
    NotInitialized,
    /// The head did not take a request for capacity.
    #[error("cannot request resources: {detail}")]
    Request {
        /// Why (the head's refusal names the bundle or the limit).
        detail: String,
    },
    /// The head could not be reached.
    #[error("the head at {address}: {source}")]
    Head {
        /// Where.
        address: String,
        /// Why.
        #[source]
        source: crate::client::ClientError,
    },
}
