//! Why a node could not start or had to stop, and why it refused to
//! grant resources, cache a binary or start a worker.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::client::ClientError;
use crate::cluster::{BundleId, ResourceError};
use crate::transport::{CredentialError, EndpointError};

use super::libraries::Lacking;

/// A node failed to start, or stopped on an error.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// `--num-cpus`, `--num-gpus`, `--memory` or `--resources` is invalid.
    #[error(transparent)]
    Resources(#[from] ResourceError),
    /// `--metrics-export-port` cannot be served.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// `--node-name` is not a usable name.
    #[error(transparent)]
    BadName(#[from] crate::wire::BadNodeName),
    /// The spill directory (`--object-spill-dir`) cannot be used.
    #[error("the spill directory (--object-spill-dir): {0}")]
    SpillDir(#[from] crate::host::ownership::OwnershipError),
    /// The state directory (`NIMBUS_HOME`) is not this user's alone.
    #[error(transparent)]
    StateDir(#[from] crate::host::files::StateDirError),
    /// The token is unusable.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// `--worker-sandbox required` on a host that refuses a layer.
    #[error(transparent)]
    Sandbox(#[from] super::sandbox::SandboxError),
    /// The port is taken, or QUIC could not start.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The head could not be reached, refused us, or refused to admit us.
    #[error("cannot join the head at {head}: {cause}")]
    Join {
        /// The head's address.
        head: SocketAddr,
        /// What went wrong.
        cause: ClientError,
    },
    /// A live member of the cluster has this node's name.
    #[error("cannot join the head at {head}: the node name is taken by the live member {holder} at {address}; choose another --node-name, or stop that node first")]
    NameTaken {
        /// The head's address.
        head: SocketAddr,
        /// The live member of that name.
        holder: crate::wire::NodeIdentity,
        /// Where it is.
        address: SocketAddr,
    },
    /// The head declared this node dead (it was unreachable for longer than
    /// the heartbeat timeout); restart it to rejoin as a new incarnation.
    #[error("the head no longer counts this node as a member: {0}")]
    Expelled(String),
    /// The head did not answer heartbeats for the grace (`--head-grace-s`).
    #[error("lost the head: no heartbeat acknowledged for {0:.1?}, longer than the grace for the head to come back (--head-grace-s)")]
    HeadLost(Duration),
    /// The head's address answers as another cluster: it does not take
    /// this cluster's token.
    #[error("the head at {head} is another cluster now: it does not take this cluster's token ({detail}); it was started again with another NIMBUS_HOME or token. Restart this node against the new head with its token")]
    OtherCluster {
        /// The head's address.
        head: SocketAddr,
        /// What the handshake said.
        detail: String,
    },
    /// The head's store cannot be used (`head/store.rs`).
    #[error(transparent)]
    Store(#[from] crate::head::store::StoreError),
    /// A fault plan in the environment (`NIMBUS_PACKET_FAULTS`,
    /// `NIMBUS_ACTOR_FAULTS`) is malformed.
    #[error(transparent)]
    FaultPlan(#[from] crate::transport::FaultPlanError),
    /// The async runtime or signal handling failed.
    #[error("node runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// A node cannot grant resources to an actor or a bundle.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrantError {
    /// What is free (on the node, or in the bundle) is short of the request.
    #[error("the {scope} lacks {}", short.join(", "))]
    Short {
        /// `node` or `bundle`.
        scope: &'static str,
        /// What is missing, one entry per resource.
        short: Vec<String>,
    },
    /// The GPU amount fits in the totals but not on the devices (a
    /// fraction no single device has free, or a fractional amount above 1).
    #[error("the {scope} cannot hand out the GPUs: {cause}")]
    Gpus {
        /// `node` or `bundle`.
        scope: &'static str,
        /// Why.
        cause: super::gpu_slots::GpuSlotError,
    },
    /// The actor asked for a bundle this node does not hold.
    #[error("bundle {0} is not reserved on this node")]
    NoBundle(BundleId),
    /// An amount is negative, infinite or NaN.
    #[error(transparent)]
    BadAmount(#[from] ResourceError),
}

/// A node's binary cache refused a read or an upload.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    /// The hash is not 64 lowercase hex digits (it becomes a file name).
    #[error("{0:?} is not a SHA-256 in hex")]
    BadHash(String),
    /// The binary is not cached here.
    #[error("this node has no binary {0}")]
    Missing(String),
    /// A chunk after the first, but no upload began.
    #[error("no upload of {0} in progress; start at offset 0")]
    NoUpload(String),
    /// A chunk that does not continue the bytes received.
    #[error("chunk at {offset} does not follow the {expected} bytes received of {total}")]
    OutOfOrder {
        /// Where it starts.
        offset: u64,
        /// Bytes received so far.
        expected: u64,
        /// The binary's size.
        total: u64,
    },
    /// The uploaded bytes are not the binary named.
    #[error("uploaded binary hashes to {actual}, not {expected}")]
    HashMismatch {
        /// What the bytes hash to.
        actual: String,
        /// The name they were sent under.
        expected: String,
    },
    /// The program is larger than a node takes.
    #[error("a binary of {bytes} bytes is larger than the {max} bytes a node takes")]
    TooLarge {
        /// Its size.
        bytes: u64,
        /// The limit (`MAX_BINARY_BYTES`).
        max: u64,
    },
    /// As many uploads as a node takes at once are in progress.
    #[error("{max} binary uploads are in progress on this node already; try again once one ends")]
    TooManyUploads {
        /// The limit (`MAX_UPLOADS`).
        max: usize,
    },
    /// The binary cache's filesystem has no room for the program.
    #[error("no space for a binary of {needed} bytes in {}: {free} bytes are free; free space there or move NIMBUS_HOME", dir.display())]
    NoSpace {
        /// The cache directory.
        dir: PathBuf,
        /// The binary's size.
        needed: u64,
        /// Bytes free there.
        free: u64,
    },
    /// A file of the cache could not be read or written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A node could not start a worker process.
#[derive(Debug, thiserror::Error)]
pub enum WorkerStartError {
    /// The program's binary was removed from the cache meanwhile.
    #[error("the program binary {0} left this node's binary cache")]
    BinaryGone(String),
    /// The log directory or file could not be created, or the process
    /// could not be started.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The boot message could not be encoded.
    #[error("cannot encode the worker's boot message: {0}")]
    Boot(#[from] rmp_serde::encode::Error),
    /// The worker's certificate could not be issued.
    #[error("cannot issue the worker's certificate: {0}")]
    Credentials(#[from] CredentialError),
    /// The program cannot load on this node's machine: libraries, symbol
    /// versions or symbols are missing there (`libraries.rs`). The worker
    /// is not started.
    #[error(
        "node {node} cannot run the program {binary} on its machine: {lacking}; install there \
         the libraries the program was built against (a program built with nimbus-train looks \
         for libtorch at the path it was built against) or give `nimbus start` an \
         LD_LIBRARY_PATH that has them (README.md, \"Several machines\")"
    )]
    CannotLoad {
        /// The node's name.
        node: String,
        /// The program (its cached copy on the node).
        binary: PathBuf,
        /// What is missing.
        lacking: Box<Lacking>,
    },
    /// The node has no ticket of its own yet to vouch for its worker.
    #[error("this node has no ticket from the head yet, so it cannot vouch for a worker")]
    Uncertified,
    /// The process started but never announced it serves.
    #[error("worker process failed to start: {why} ({status}); {log} says: {tail}")]
    NotServing {
        /// What happened instead.
        why: NotServing,
        /// How the process ended.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
}

/// Why a started worker process is not serving.
#[derive(Debug, thiserror::Error)]
pub enum NotServing {
    /// It exited first.
    #[error("it exited before serving")]
    Exited,
    /// It took too long.
    #[error("it did not serve within {0:?}")]
    Timeout(Duration),
    /// Its readiness line is malformed.
    #[error("unreadable line {0:?}")]
    Unreadable(String),
    /// Its standard input or output failed.
    #[error("its pipes failed: {0}")]
    Pipe(#[from] std::io::Error),
}

/// A node has no room for an actor or a bundle.
#[derive(Debug, Clone, thiserror::Error)]
#[error("node {node}: {cause}")]
pub struct NoCapacity {
    /// The node's name.
    pub node: String,
    /// What it lacks.
    pub cause: GrantError,
}

/// A worker's ticket was not renewed (`manager/tickets.rs`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum RenewalRefused {
    /// The caller is not one of this node's live workers.
    #[error("{0} is not a live worker of this node (a worker renews its ticket with the node that started it)")]
    NotAWorker(crate::wire::NodeIdentity),
    /// The node has not been certified itself.
    #[error("this node has no ticket of its own yet")]
    Uncertified,
}
