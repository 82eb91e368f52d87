//! Who is at the other end of a connection.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A number fresh on every start of a process, so that a node restarted on a
/// recycled address is never mistaken for its previous life.
///
/// It is the start time in microseconds since the Unix epoch, so a later
/// start has a larger incarnation (as long as the clock does not go back).
/// This crate's wire format reads no clock: `Incarnation::fresh`, which
/// does, is `crate::transport`'s (`incarnation.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Incarnation(pub u64);

impl Incarnation {
    /// The incarnation of a process starting `since_epoch` after the Unix
    /// epoch.
    pub fn starting_at(since_epoch: Duration) -> Self {
        Incarnation(u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX))
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A node: its name (stable across restarts) and its incarnation (fresh on
/// every start).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// Stable name, `--node-name` or `HOST:PORT` by default.
    pub name: String,
    /// This life of the node.
    pub incarnation: Incarnation,
}

/// The longest node name, in bytes.
pub const MAX_NODE_NAME: usize = 128;
/// How a worker's name begins (`worker-ACTOR`); no node's may.
pub const WORKER_NAME_PREFIX: &str = "worker-";

/// A node name that cannot be one: names appear in file names, logs,
/// certificates and command lines.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node name {name:?} is not allowed: use 1 to {MAX_NODE_NAME} letters, digits and . _ - : [ ] @, not beginning with {WORKER_NAME_PREFIX:?} (workers' names) (--node-name)")]
pub struct BadNodeName {
    /// The name refused.
    pub name: String,
}

impl NodeIdentity {
    /// Checks that `name` is a usable node name.
    pub fn check_name(name: &str) -> Result<(), BadNodeName> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._-:[]@".contains(c);
        if name.is_empty()
            || name.len() > MAX_NODE_NAME
            || !name.chars().all(allowed)
            || name.starts_with(WORKER_NAME_PREFIX)
        {
            return Err(BadNodeName {
                name: name.chars().take(MAX_NODE_NAME + 1).collect(),
            });
        }
        Ok(())
    }
}

impl NodeIdentity {
    /// Whether this names a worker process (`worker-ACTOR`), not a node or
    /// a client.
    pub fn names_a_worker(&self) -> bool {
        self.name.starts_with(WORKER_NAME_PREFIX)
    }
}

impl fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.name, self.incarnation)
    }
}

/// What kind of process a peer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PeerRole {
    /// A node process (head or not).
    Node,
    /// A client: the CLI, a driver program, a benchmark.
    Client,
    /// A worker process hosting an actor.
    Worker,
}

/// The identity a peer announces in its [`Hello`](crate::wire::Hello).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PeerIdentity {
    /// Node or client.
    pub role: PeerRole,
    /// Name and incarnation.
    pub identity: NodeIdentity,
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = match self.role {
            PeerRole::Node => "node",
            PeerRole::Client => "client",
            PeerRole::Worker => "worker",
        };
        write!(f, "{role} {}", self.identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_short_plain_and_not_empty() {
        for good in [
            "node-3",
            "10.0.0.7:6379",
            "[::1]:6379",
            "gpu_box.a@rack2",
            "my-worker-1",
        ] {
            assert_eq!(NodeIdentity::check_name(good), Ok(()), "{good}");
        }
        let long = "n".repeat(MAX_NODE_NAME + 1);
        let worker = "worker-00000000000000ab";
        for bad in [
            "",
            "a/b",
            "../x",
            "a b",
            "tab\t",
            "ünï",
            long.as_str(),
            worker,
        ] {
            assert!(NodeIdentity::check_name(bad).is_err(), "{bad:?}");
        }
    }
}
