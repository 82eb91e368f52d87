//! Libraries' durable records (`ControlRequest::State`, to the head): the
//! table a library keeps its own state in (Serve's deployments, a data
//! pipeline's progress), kept in the head's store across head restarts
//! (`crate::head::state`), reached through `nimbus::library::Records`.
//!
//! A record is named by its library, its scope and its key. The scope is a
//! job id: a worker reads and writes its own job's records only
//! (`crate::node`'s `authorize.rs`); a token holder (a driver, the CLI)
//! any job's. Records stay until deleted: a job that ends keeps them, so
//! a later driver can read what an earlier one left.

use serde::{Deserialize, Serialize};

use crate::cluster::{valid_job_id, MAX_JOB_ID};

/// The longest library name: 1 to 64 letters, digits, `-` or `_`.
pub const MAX_LIBRARY_NAME: usize = 64;
/// The longest key, in bytes (any UTF-8).
pub const MAX_STATE_KEY: usize = 512;
/// The largest value, in bytes.
pub const MAX_STATE_VALUE: usize = 1 << 20;
/// The most records of one library in one scope (so a `List` answers at
/// most this many keys).
pub const MAX_STATE_RECORDS: usize = 10_000;
/// The most bytes (keys and values) the head keeps for every library and
/// job together: the table lives in the head's memory.
pub const MAX_STATE_BYTES: usize = 256 << 20;

/// Where a record lives: its library and its scope (a job id).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StateScope {
    /// The library's name (`serve`, `data`).
    pub library: String,
    /// The job whose records these are.
    pub job: String,
}

impl StateScope {
    /// Why the scope cannot name records, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let named = |s: &str, max| {
            !s.is_empty()
                && s.len() <= max
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !named(&self.library, MAX_LIBRARY_NAME) {
            return Err(format!(
                "library name {:?} is malformed: 1 to {MAX_LIBRARY_NAME} letters, digits, '-' or '_'",
                self.library
            ));
        }
        if !valid_job_id(&self.job) {
            return Err(format!(
                "job id {:?} is malformed: 1 to {MAX_JOB_ID} letters, digits, '-' or '_'",
                self.job
            ));
        }
        Ok(())
    }
}

/// To the head: a library's durable records (answered by its
/// `LibraryState`). Each change is in the head's store before it is
/// answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StateRequest {
    /// Sets `key` to `value` (at most [`MAX_STATE_VALUE`] bytes; at most
    /// [`MAX_STATE_RECORDS`] records per scope, [`MAX_STATE_BYTES`] in
    /// all). Answered with `Ack`.
    Put {
        /// Whose records.
        scope: StateScope,
        /// The key (at most [`MAX_STATE_KEY`] bytes).
        key: String,
        /// The value.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// The value of `key`. Answered with [`StateReply::Value`].
    Get {
        /// Whose records.
        scope: StateScope,
        /// The key.
        key: String,
    },
    /// The keys that start with `prefix`, in order. Answered with
    /// [`StateReply::Keys`].
    List {
        /// Whose records.
        scope: StateScope,
        /// The prefix (empty: every key).
        prefix: String,
    },
    /// Deletes `key`. Answered with [`StateReply::Deleted`].
    Delete {
        /// Whose records.
        scope: StateScope,
        /// The key.
        key: String,
    },
}

impl StateRequest {
    /// The records the request is about.
    pub fn scope(&self) -> &StateScope {
        match self {
            StateRequest::Put { scope, .. }
            | StateRequest::Get { scope, .. }
            | StateRequest::List { scope, .. }
            | StateRequest::Delete { scope, .. } => scope,
        }
    }
}

/// What answers a [`StateRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum StateReply {
    /// Stored.
    Ack,
    /// The value, if the key has one.
    Value(Option<serde_bytes::ByteBuf>),
    /// The keys, in order.
    Keys(Vec<String>),
    /// Whether the key had a value.
    Deleted(bool),
}
