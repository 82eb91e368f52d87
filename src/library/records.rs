//! A library's durable records: small values by key, kept by the head in
//! its store across its restarts (`crate::head`'s `state.rs`), per library
//! and job. What a library keeps here instead of adding a table of its own
//! to the head: Serve's deployments, a pipeline's progress, a run's
//! placement.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nimbus::library::LibraryError> {
//! use nimbus::library::Records;
//! let deployments = Records::of_this_job("serve")?;
//! deployments.put("deployment/mnist", b"{\"replicas\": 2}").await?;
//! for key in deployments.keys("deployment/").await? {
//!     let spec = deployments.get(&key).await?;
//!     println!("{key}: {spec:?}");
//! }
//! # Ok(()) }
//! ```

use crate::cluster::{StateReply, StateRequest, StateScope, UnexpectedReply};

use super::{context, LibraryError};

/// The records of one library for one job. A worker reads and writes its
/// own job's only; a driver any job's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Records {
    scope: StateScope,
}

impl Records {
    /// `library`'s records of the job this process belongs to.
    pub fn of_this_job(library: &str) -> Result<Records, LibraryError> {
        Ok(Records::of_job(library, &context()?.job))
    }

    /// `library`'s records of job `job` (a driver reading what an earlier
    /// job left).
    pub fn of_job(library: &str, job: &str) -> Records {
        Records {
            scope: StateScope {
                library: library.to_string(),
                job: job.to_string(),
            },
        }
    }

    /// Sets `key` (1 to `MAX_STATE_KEY` bytes) to `value` (at most
    /// `MAX_STATE_VALUE` bytes), durably: it is in the head's store when
    /// this returns.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<(), LibraryError> {
        let request = StateRequest::Put {
            scope: self.scope.clone(),
            key: key.to_string(),
            value: value.to_vec(),
        };
        match ask(request).await? {
            StateReply::Ack => Ok(()),
            reply => Err(UnexpectedReply::new("Put", reply).into()),
        }
    }

    /// The value of `key`, if it has one.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, LibraryError> {
        let request = StateRequest::Get {
            scope: self.scope.clone(),
            key: key.to_string(),
        };
        match ask(request).await? {
            StateReply::Value(value) => Ok(value.map(serde_bytes::ByteBuf::into_vec)),
            reply => Err(UnexpectedReply::new("Get", reply).into()),
        }
    }

    /// The keys that start with `prefix` (empty: all of them), in order.
    pub async fn keys(&self, prefix: &str) -> Result<Vec<String>, LibraryError> {
        let request = StateRequest::List {
            scope: self.scope.clone(),
            prefix: prefix.to_string(),
        };
        match ask(request).await? {
            StateReply::Keys(keys) => Ok(keys),
            reply => Err(UnexpectedReply::new("List", reply).into()),
        }
    }

    /// Deletes `key`; whether it had a value.
    pub async fn delete(&self, key: &str) -> Result<bool, LibraryError> {
        let request = StateRequest::Delete {
            scope: self.scope.clone(),
            key: key.to_string(),
        };
        match ask(request).await? {
            StateReply::Deleted(had) => Ok(had),
            reply => Err(UnexpectedReply::new("Delete", reply).into()),
        }
    }
}

/// Asks the head (again while it restarts: every state request is
/// idempotent).
async fn ask(request: StateRequest) -> Result<StateReply, LibraryError> {
    Ok(context()?.call_head(request).await?)
}
