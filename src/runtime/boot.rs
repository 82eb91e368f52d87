//! How a node starts a worker process and hears from it.
//!
//! Every user actor runs in a worker process of its own (one per actor, CPU
//! or GPU), started from the driver's own executable: the same binary
//! everywhere, as with MPI. The protocol with a worker process is an
//! argument, three lines and a pipe:
//! 1. the node starts the program with [`WORKER_ARG`] first, then
//!    `--job J --actor ID`, which puts it in worker mode (and lets
//!    `pgrep -f nimbus-worker` find workers);
//! 2. the node writes a [`WorkerBoot`] (MessagePack: the actor's spec, the
//!    worker's identity — its name and incarnation, a certificate the node
//!    issued for it and its ticket, never the token — the head's address,
//!    the node's identity and address, the IP to advertise, and the fault
//!    rules of the actor's first incarnation) to the worker's stdin and
//!    closes it (nothing secret appears in the command line or the
//!    environment);
//! 3. the worker prints [`ready_line`] (`nimbus-worker-ready ADDRESS
//!    INCARNATION`) once it serves its actor;
//! 4. before dying of a panic (or of a fault, SIGTERM, or a failure to
//!    start) it prints [`died_line`] (`nimbus-worker-died CAUSE`, the
//!    [`DeathCause`] as JSON). The node watches the process itself (not the
//!    pipe, which a child of the actor may hold open), and reports the death
//!    with that cause, or with its exit code or signal.
//!
//! The node's side (the start timeout, the environment, the death signal)
//! is in `crate::node`'s `workers.rs`.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::cluster::faults::ActorFault;
use crate::cluster::{ActorSpec, DeathCause};
use crate::transport::WorkerCredentials;
use crate::wire::{Incarnation, NodeIdentity, Ticket};

/// Argument that puts a program in worker mode (and lets `pgrep -f
/// nimbus-worker` find worker processes).
pub const WORKER_ARG: &str = "nimbus-worker";
/// The start of the line a worker prints once it serves.
pub(crate) const READY: &str = "nimbus-worker-ready ";
/// The start of the line a worker prints before it dies.
pub(crate) const DIED: &str = "nimbus-worker-died ";

/// What a worker process reads from stdin when it starts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerBoot {
    /// The actor to host.
    pub spec: ActorSpec,
    /// Who the worker is, and its proof (`crate::transport`'s `tickets.rs`,
    /// step 3).
    pub identity: WorkerIdentity,
    /// The head's address (for lookups and spawns from inside the actor).
    pub head: SocketAddr,
    /// The node that started it.
    pub node: NodeIdentity,
    /// That node's address (its object store is the worker's home).
    pub node_address: SocketAddr,
    /// The IP to advertise.
    pub advertise_ip: IpAddr,
    /// Fault rules to apply to this incarnation (fault-injection tests).
    pub faults: Vec<ActorFault>,
}

/// Who this worker process is, for the actor's own code (its node and
/// incarnation, e.g. for a line it prints when it starts); `None` in a
/// driver.
pub fn this_worker() -> Option<&'static ThisWorker> {
    THIS_WORKER.get()
}

/// What [`this_worker`] says.
#[derive(Clone, Debug)]
pub struct ThisWorker {
    /// The node that started it.
    pub node: NodeIdentity,
    /// Its own name (`worker-ACTOR`) and incarnation: the actor's, for this
    /// life.
    pub worker: NodeIdentity,
}

static THIS_WORKER: std::sync::OnceLock<ThisWorker> = std::sync::OnceLock::new();

impl WorkerBoot {
    /// Records who this process is ([`this_worker`]), before the actor is
    /// made.
    pub(crate) fn remember(&self) {
        let _ = THIS_WORKER.set(ThisWorker {
            node: self.node.clone(),
            worker: self.identity.name.clone(),
        });
    }
}

/// A worker's identity, as its node hands it over.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerIdentity {
    /// Its name (`worker-ACTOR`) and incarnation.
    pub name: NodeIdentity,
    /// Its certificate and key.
    pub credentials: WorkerCredentials,
    /// Its ticket, signed by the node.
    pub ticket: Ticket,
    /// The head's public ticket keys.
    pub head_keys: crate::wire::HeadKeys,
}

/// The line a worker prints once it serves.
pub fn ready_line(address: SocketAddr, incarnation: Incarnation) -> String {
    format!("{READY}{address} {incarnation}")
}

/// The line a worker prints before it dies of `cause`.
pub fn died_line(cause: &DeathCause) -> String {
    // A panic message may be megabytes: the cluster keeps 4 KiB of it.
    let cause = cause.clone().bounded();
    // JSON escapes newlines: the cause stays on one line.
    let json = serde_json::to_string(&cause)
        .unwrap_or_else(|_| serde_json::json!({ "Failed": cause.to_string() }).to_string());
    format!("{DIED}{json}")
}

/// The cause of a died line, after [`DIED`]; a line that is not one is
/// taken as the worker's own words.
pub(crate) fn parse_died(died: &str) -> DeathCause {
    let cause: DeathCause =
        serde_json::from_str(died).unwrap_or_else(|_| DeathCause::Failed(died.to_string()));
    cause.bounded()
}

/// The address and incarnation of a ready line, after [`READY`].
pub(crate) fn parse_ready(ready: &str) -> Option<(SocketAddr, Incarnation)> {
    let (address, incarnation) = ready.split_once(' ')?;
    Some((
        address.parse().ok()?,
        Incarnation(incarnation.trim().parse().ok()?),
    ))
}
