//! Who is at the other end of a connection.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A number fresh on every start of a process, so that a node restarted on a
/// recycled address is never mistaken for its previous life.
///
/// It is the start time in microseconds since the Unix epoch, so a later
/// start has a larger incarnation (as long as the clock does not go back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Incarnation(pub u64);

impl Incarnation {
    /// A new incarnation for a process starting now.
    pub fn fresh() -> Self {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Incarnation(micros)
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
