//! What a node's `NodeManager` answers: starting and killing actors'
//! worker processes (`ControlRequest::Workers`), placement-group bundles
//! (`Bundles`) and its cache of program binaries (`Binaries`).

use serde::{Deserialize, Serialize};

use crate::cluster::{ActorId, ActorRecord, ActorSpec, BundleId, OutputLine, ResourceSet};

/// To a node: starting and killing actors' worker processes (answered by its `NodeManager`).
// Built once per request and encoded at once: boxing the large variant
// would save no memory and cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum WorkerRequest {
    /// To a node: start an actor in a worker process. Answered with
    /// [`WorkerReply::ActorStarted`], [`WorkerReply::NeedBinary`] or
    /// [`WorkerReply::NoCapacity`].
    StartActor(ActorSpec),
    /// To a node: SIGKILL an actor's worker process and do not restart it
    /// (Ray's `ray.kill`). Answered with `Ack`, also when the actor is not
    /// (or no longer) there.
    KillActor(ActorId),
    /// To a node: the lines its workers of `job` printed to stdout after
    /// number `after` (at most `max`, and 1,000), for the job's driver to
    /// show (`log_to_driver`). Answered with [`WorkerReply::Output`].
    ReadOutput {
        /// The job.
        job: String,
        /// The last line number already read (0: none).
        after: u64,
        /// The most lines to return.
        max: u32,
    },
    /// To a node: up to `max` bytes from `offset` of the stdout or stderr
    /// log of the newest worker process that hosted `actor` there.
    /// Answered with [`WorkerReply::Log`].
    ReadLog {
        /// The actor.
        actor: ActorId,
        /// Its stderr log (`.err`) rather than its stdout's (`.out`).
        #[serde(default)]
        stderr: bool,
        /// Where to start reading.
        offset: u64,
        /// The most bytes to return (the node caps it at 1 MiB).
        max: u64,
    },
    /// To a node: up to `max` bytes from `offset` of the node's own log
    /// (where its stderr goes). Answered with [`WorkerReply::Log`].
    ReadNodeLog {
        /// Where to start reading.
        offset: u64,
        /// The most bytes to return (the node caps it at 1 MiB).
        max: u64,
    },
    /// To a node, from one of its workers or a driver it is home to, every
    /// `metrics::PUSH_INTERVAL` and once more as a driver ends: the
    /// process's metrics as Prometheus text, replacing its previous push,
    /// served summed on the node's `/metrics`. A certified worker's push is
    /// kept under its proven identity; a token holder's (a driver) under the
    /// `process` it names, so its last push from another connection
    /// replaces its earlier ones. Answered with `Ack`.
    PushMetrics {
        /// The pushing process (its endpoint's identity).
        process: String,
        /// The text (at most `metrics::MAX_PUSH_BYTES`).
        text: String,
    },
    /// From one of the node's workers, half-way through its ticket's life:
    /// a new ticket for the certificate it asks with (`crate::transport`'s
    /// `tickets.rs`, step 7). Answered with [`WorkerReply::Renewed`].
    RenewTicket,
}

/// What answers a [`WorkerRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum WorkerReply {
    /// Done.
    Ack,
    /// The actor runs.
    ActorStarted(Box<ActorRecord>),
    /// The node does not have the program binary yet: upload it first.
    NeedBinary,
    /// The node lacks free resources for the actor.
    NoCapacity(String),
    /// Lines workers printed, oldest first.
    Output {
        /// The lines.
        lines: Vec<OutputLine>,
        /// Lines of the job dropped unread since `after` (the node keeps the
        /// last 10,000 of each job).
        dropped: u64,
    },
    /// Part of a log.
    Log(LogChunk),
    /// The worker's new ticket.
    Renewed {
        /// The ticket.
        ticket: crate::wire::Ticket,
        /// The head's public ticket keys, as its node knows them.
        head_keys: crate::wire::HeadKeys,
    },
}

/// Part of a log file on a node: a worker's, a driver's or the node's own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    /// The log file, on the node.
    pub file: String,
    /// Its length now.
    pub total: u64,
    /// The bytes asked for.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// To a node: placement-group bundles (answered by its `NodeManager`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum BundleRequest {
    /// To a node: set resources aside for a placement-group bundle.
    /// Answered with `Ack` or [`BundleReply::NoCapacity`].
    ReserveBundle {
        /// The bundle.
        bundle: BundleId,
        /// Its resources.
        resources: ResourceSet,
        /// The job whose placement group it is: released when the job ends.
        #[serde(default)]
        job: String,
    },
    /// To a node: give a bundle's resources back.
    ReleaseBundle(BundleId),
    /// To a node: the bundles it holds. Answered with
    /// [`BundleReply::Bundles`].
    ListBundles,
}

/// What answers a [`BundleRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum BundleReply {
    /// Reserved or released.
    Ack,
    /// The node lacks free resources for the bundle.
    NoCapacity(String),
    /// The bundles the node holds.
    Bundles(Vec<BundleListing>),
}

/// A placement-group bundle a node holds (`nimbus list placement-groups`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BundleListing {
    /// The bundle.
    pub bundle: BundleId,
    /// What it reserves.
    pub resources: ResourceSet,
    /// What the actors placed in it use of that.
    pub used: ResourceSet,
    /// The job whose placement group it is.
    pub job: String,
}

/// To a node: its cache of program binaries (answered by its `NodeManager`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum BinaryRequest {
    /// To a node: a chunk of a program binary, identified by its SHA-256.
    UploadBinary {
        /// Hex SHA-256 of the whole binary.
        hash: String,
        /// Where this chunk starts.
        offset: u64,
        /// Length of the whole binary.
        total: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        chunk: Vec<u8>,
    },
    /// To a node: `len` bytes of a program binary from `offset`, for another
    /// node that lacks it. Answered with [`BinaryReply::Chunk`].
    ReadBinary {
        /// Hex SHA-256 of the whole binary.
        hash: String,
        /// Where the chunk starts.
        offset: u64,
        /// At most this many bytes.
        len: u64,
    },
}

/// What answers a [`BinaryRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum BinaryReply {
    /// The chunk is stored.
    Ack,
    /// A chunk of a program binary.
    Chunk {
        /// Length of the whole binary.
        total: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        chunk: Vec<u8>,
    },
}
