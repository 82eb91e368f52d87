//! Errors of the object store, in either half.

use std::time::Duration;

use crate::client::ClientError;
use crate::cluster::ObjectId;

/// A put, get or wait failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    /// `nimbus::init` and `Driver::connect` have not run in this process.
    #[error("nimbus is not initialised in this process: call nimbus::init(..) and Driver::connect() first")]
    NotInitialized,
    /// The value could not be encoded or decoded.
    #[error("object {what}: {detail}")]
    Codec {
        /// Encoding or decoding.
        what: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A node refused: its store is full even after spilling, or the
    /// request was invalid.
    #[error("{0}")]
    Store(String),
    /// The object will never be readable: the task producing it failed,
    /// its owner died, or it was freed.
    #[error("object {id} is unavailable: {reason}")]
    Unavailable {
        /// The object.
        id: ObjectId,
        /// Why, with the remote error if a task failed.
        reason: String,
    },
    /// The object was not ready in time.
    #[error("object {id} was not ready within {after:?}")]
    Timeout {
        /// The object.
        id: ObjectId,
        /// The limit.
        after: Duration,
    },
    /// The head's event stream (in the head's own process) has stopped.
    #[error("the head's event stream has stopped")]
    EventsStopped,
    /// The cluster could not be reached.
    #[error("cannot reach the object store: {0}")]
    Cluster(#[from] ClientError),
    /// A peer answered with a reply of the wrong kind.
    #[error(transparent)]
    Unexpected(#[from] crate::cluster::UnexpectedReply),
}

/// A node's object-store shard refused a request about one object.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// A new object was begun with an id in use.
    #[error("object {0} exists already")]
    Exists(ObjectId),
    /// A chunk or seal for an object that is not being received.
    #[error("object {0} is not being received")]
    NotReceiving(ObjectId),
    /// A seal for an object that is being received in chunks.
    #[error("object {0} is not being written in place")]
    NotWrittenInPlace(ObjectId),
    /// A chunk that does not continue the bytes received.
    #[error("object {id}: chunk at {offset} does not follow the {have} bytes received of {total}")]
    OutOfOrder {
        /// The object.
        id: ObjectId,
        /// Where the chunk starts.
        offset: u64,
        /// Bytes received so far.
        have: u64,
        /// The object's size.
        total: u64,
    },
    /// An object written in place has the wrong size.
    #[error("object {id}: {written} bytes were written in place, not {total}")]
    WrongSize {
        /// The object.
        id: ObjectId,
        /// Bytes in its file.
        written: u64,
        /// Its declared size.
        total: u64,
    },
    /// The object is not here (complete).
    #[error("object {0} is not here")]
    NotHere(ObjectId),
    /// The object was freed.
    #[error("object {0} was freed: no reference to it remained")]
    Freed(ObjectId),
    /// The task producing the object failed with this message.
    #[error("{0}")]
    Failed(String),
    /// A spilled object's file is not the object's size.
    #[error("spilled object {id} is {found} bytes on disk, not {total}")]
    SpillTruncated {
        /// The object.
        id: ObjectId,
        /// Bytes on disk.
        found: u64,
        /// Its size.
        total: u64,
    },
    /// A worker asked for, or to change, an object of another job.
    #[error(
        "object {id} is another job's: a worker of job {job} reads and changes only its own job's objects"
    )]
    OtherJob {
        /// The object.
        id: ObjectId,
        /// The worker's job.
        job: String,
    },
    /// Reading or writing an object's file failed.
    #[error("cannot {action} object {id} ({}): {source}", path.display())]
    Io {
        /// What was being done: `spill`, `restore`, `read`, `write`.
        action: &'static str,
        /// The object.
        id: ObjectId,
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
}
