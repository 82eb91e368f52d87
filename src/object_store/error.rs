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
    /// The cluster could not be reached.
    #[error("cannot reach the object store: {0}")]
    Cluster(#[from] ClientError),
}
