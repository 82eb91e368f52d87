//! Node membership on the head: who is in the cluster, with what resources,
//! and who stopped heartbeating (the failure detector).
//!
//! The table lives in [`NodeTable`] (pure, tested without a runtime); the
//! [`Membership`] actor feeds it messages and the clock, and publishes what
//! changed to [`ClusterEvents`](super::ClusterEvents).
//!
//! 1. **Identity.** A node is a name (`--node-name`, default `IP:PORT`)
//!    plus an incarnation (microseconds since the epoch at process start,
//!    so a restart is always newer). The table keeps one entry per name.
//!    `Join` of a newer incarnation replaces the old one once that is dead
//!    or has left (`NodeJoined`); while the old one is alive the name is
//!    taken (`NameTaken`, answered as `MembershipReply::NodeNameTaken` with when
//!    the old one, if silent, will have been declared dead: a restarted
//!    node retries then; the head's name is never free). An older
//!    incarnation is refused (`Stale`), as is a declared dead one (`Dead`);
//!    joining twice is harmless.
//! 2. **Heartbeats.** Members heartbeat every `heartbeat_timeout / 6`
//!    (`BEATS_PER_TIMEOUT` in `crate::node`; 500 ms with the default
//!    timeout of 3 s, `--heartbeat-timeout-ms`) on control-priority
//!    streams, carrying their resources in use; a change is published as
//!    `ResourcesChanged` (what spawns and placement groups wait for).
//! 3. **Failure detector.** The actor checks every `heartbeat_timeout / 10`
//!    and declares dead (`NodeDead`) any member silent for longer than the
//!    timeout. The last heartbeat precedes a crash by up to one interval,
//!    so a crash is detected between `timeout - interval` and
//!    `timeout + timeout / 10` after it. The head never declares itself
//!    dead; and when its own checks were held up for more than half the
//!    timeout (the head was stopped or starved of CPU), every member gets a
//!    fresh timeout instead of being declared dead for heartbeats the head
//!    could not read.
//! 4. **Dead stays dead.** A declared-dead incarnation that comes back (a
//!    stall, a partition) is refused on its next heartbeat, which the node
//!    treats as fatal and exits; restarted, it joins as a new incarnation.
//!    Refusals of stale or dead incarnations travel as `StaleIncarnation`.
//! 5. **Leave.** A member stopping on purpose sends `Leave`: it is dead at
//!    once ("left the cluster", reported `NodeLeft`).
//! 6. **Durable.** A join, a leave and a death are written to the head's
//!    store (`head/store.rs`) before the head answers or publishes them;
//!    a join that cannot be written is refused (`NotRecorded`).
//! 7. **Head restart.** A restarted head loads the members its store
//!    holds as *unconfirmed* ([`NodeTable::restore`]): alive (what they
//!    run goes on running), each with the head's grace (`--head-grace-s`,
//!    60 s by default) to heartbeat again (same incarnation: it was not
//!    dead). The first heartbeat confirms it; one that does not come back
//!    within the grace is declared dead as any silent member. Members
//!    ride the outage out by retrying their heartbeats for the same grace
//!    (`crate::node::manager`).
//! 8. **Autoscaler.** An autoscaler (`crate::autoscaler`) reports its node
//!    types after each round (`Report`); `Status` carries the latest
//!    while younger than `REPORT_FRESH_FOR` (15 s), and the capacity a
//!    driver requested ahead of use (`Request`, the latest request; kept
//!    in memory: a restarted head starts with none).

mod actor;
mod state;

pub use actor::{Heartbeat, Join, Leave, Membership, Report, Request, Status, REPORT_FRESH_FOR};
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
    /// Another incarnation of that name is a live member.
    #[error("the node name {:?} is taken by the live member {holder} at {address}; choose another --node-name, or stop that node first", node.name)]
    NameTaken {
        /// The node that asked to join.
        node: NodeIdentity,
        /// The live member of that name.
        holder: NodeIdentity,
        /// Where the holder is.
        address: std::net::SocketAddr,
        /// When the holder, if it has stopped, will have been declared
        /// dead (`None`: the head, which never is).
        retry_after: Option<std::time::Duration>,
    },
    /// The name cannot be a node's.
    #[error(transparent)]
    BadName(#[from] crate::wire::BadNodeName),
    /// The head could not make the change durable (`head/store.rs`), so it
    /// does not acknowledge it.
    #[error("the head could not record {node} in its store: {detail}")]
    NotRecorded {
        /// The node.
        node: NodeIdentity,
        /// What the store said.
        detail: String,
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
            MembershipError::Unknown { .. }
            | MembershipError::NameTaken { .. }
            | MembershipError::BadName(_) => RemoteErrorKind::BadRequest,
            MembershipError::Stale { .. } | MembershipError::Dead { .. } => {
                RemoteErrorKind::StaleIncarnation
            }
            MembershipError::NotRecorded { .. } => RemoteErrorKind::Internal,
        };
        RemoteError::new(kind, e.to_string())
    }
}
