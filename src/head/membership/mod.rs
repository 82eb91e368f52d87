//! Node membership on the head: who is in the cluster, with what resources,
//! and who stopped heartbeating (the failure detector).
//!
//! The table lives in [`NodeTable`] (pure, tested without a runtime); the
//! [`Membership`] actor feeds it messages and the clock, and publishes what
//! changed to [`ClusterEvents`](super::ClusterEvents).

mod actor;
mod state;

pub use actor::{Heartbeat, Join, Leave, Membership, Status};
pub use state::NodeTable;

use crate::wire::{NodeIdentity, RemoteError, RemoteErrorKind};

/// Why the head refused a membership message.
#[derive(Clone, Debug, thiserror::Error)]
pub enum MembershipError {
    /// The head does not know this node (or this newer incarnation): join first.
    #[error("node {node} is not a member; join first")]
    Unknown {
        /// The node.
        node: NodeIdentity,
    },
    /// A newer incarnation of the node is the member.
    #[error("stale incarnation: {node} was replaced by {current}")]
    Stale {
        /// The stale node.
        node: NodeIdentity,
        /// The current incarnation.
        current: NodeIdentity,
    },
    /// The incarnation was declared dead; a dead node comes back only as a
    /// new incarnation (restart it).
    #[error("{node} was declared dead ({reason}); restart it to rejoin as a new incarnation")]
    Dead {
        /// The node.
        node: NodeIdentity,
        /// Why it was declared dead.
        reason: String,
    },
}

impl From<MembershipError> for RemoteError {
    fn from(e: MembershipError) -> Self {
        let kind = match e {
            MembershipError::Unknown { .. } => RemoteErrorKind::BadRequest,
            MembershipError::Stale { .. } | MembershipError::Dead { .. } => {
                RemoteErrorKind::StaleIncarnation
            }
        };
        RemoteError::new(kind, e.to_string())
    }
}
