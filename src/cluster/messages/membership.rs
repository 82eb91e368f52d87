//! Membership (`ControlRequest::Membership`, to the head): joining,
//! heartbeats, leaving, capacity requests, and the cluster's view of its
//! nodes that `Status` answers.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::cluster::{AutoscalerReport, ResourceSet, Versions};
use crate::wire::NodeIdentity;

/// To the head: joining, heartbeats, leaving, the membership view (answered by `Membership`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MembershipRequest {
    /// A node asks the head to admit it. Answered with [`MembershipReply::Joined`].
    Join {
        /// Who, where, with what.
        registration: NodeRegistration,
        /// The Ed25519 public key the node signs its workers' tickets with
        /// (`crate::transport`'s `tickets.rs`, step 3).
        #[serde(with = "serde_bytes")]
        signs_workers: Vec<u8>,
    },
    /// A node is alive; `used` is what it has handed out.
    Heartbeat {
        /// The node.
        node: NodeIdentity,
        /// Resources in use.
        used: ResourceSet,
        /// How busy its machine is.
        #[serde(default)]
        host: Option<HostLoad>,
        /// Its ticket is half-way through its life: a new one, naming this
        /// key for its workers' tickets (`crate::transport`'s `tickets.rs`,
        /// step 7). Answered with [`MembershipReply::Renewed`].
        #[serde(default)]
        renew: Option<serde_bytes::ByteBuf>,
    },
    /// A node is stopping on purpose.
    Leave {
        /// The node.
        node: NodeIdentity,
    },
    /// The membership and resource view. Answered with [`MembershipReply::Status`].
    Status,
    /// The autoscaler's view after a decision round (`crate::autoscaler`):
    /// shown by `Status` while fresh, and what spawns that no node fits
    /// wait for. Answered with `Ack`.
    Autoscaler(AutoscalerReport),
    /// Capacity to keep ready ahead of use (Ray's `request_resources`):
    /// the autoscaler grows the cluster until these bundles fit the
    /// nodes' total resources, and keeps those nodes, until the next
    /// request replaces them (an empty one clears them). At most
    /// [`MAX_REQUESTED_BUNDLES`](crate::cluster::MAX_REQUESTED_BUNDLES). Answered
    /// with `Ack`.
    RequestResources {
        /// The bundles, each to fit one node.
        bundles: Vec<ResourceSet>,
    },
    /// A token holder asks the head to rotate its ticket key
    /// (`crate::transport`'s `ticket_keys.rs`). Answered with
    /// [`MembershipReply::TicketKeyRotating`].
    RotateTicketKey,
}

/// What answers a [`MembershipRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MembershipReply {
    /// The node is a member; it must heartbeat at this interval.
    Joined {
        /// Heartbeat interval in milliseconds.
        heartbeat_interval_ms: u64,
        /// The node's ticket, for the certificate it joined with.
        ticket: crate::wire::Ticket,
        /// The head's public ticket keys, to check other peers' tickets.
        head_keys: crate::wire::HeadKeys,
    },
    /// A join refused: a live member has the node's name.
    NodeNameTaken {
        /// The live member.
        holder: crate::wire::NodeIdentity,
        /// Where it is.
        address: std::net::SocketAddr,
        /// When it will have been declared dead if it has stopped (a
        /// restarted node retries then); `None`: never (the head).
        retry_after_ms: Option<u64>,
    },
    /// Acknowledges a heartbeat, a leave, a report or a request for resources.
    Ack,
    /// Acknowledges a heartbeat that asked for a new ticket: the node's,
    /// for the certificate it heartbeats with.
    Renewed {
        /// The node's new ticket.
        ticket: crate::wire::Ticket,
        /// The head's public ticket keys now (they change when it rotates
        /// its key).
        head_keys: crate::wire::HeadKeys,
    },
    /// The cluster as the head sees it.
    Status(ClusterStatus),
    /// A rotation of the head's ticket key has begun.
    TicketKeyRotating {
        /// When the new key signs, in seconds since the Unix epoch.
        switch_at: u64,
        /// When the old key stops being accepted.
        done_at: u64,
    },
}

/// What a node tells the head when it joins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRegistration {
    /// Its identity.
    pub node: NodeIdentity,
    /// Where other processes reach it.
    pub address: SocketAddr,
    /// Everything it offers.
    pub resources: ResourceSet,
    /// What it runs (`versions.rs`); unknown for a node too old to say.
    #[serde(default)]
    pub versions: Versions,
}

/// Whether a node is a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Heartbeating.
    Alive,
    /// Left, or stopped heartbeating for longer than the timeout.
    Dead,
}

/// One node as the head sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node's name.
    pub id: String,
    /// Its current (or last) incarnation.
    pub incarnation: u64,
    /// Alive or dead.
    pub state: NodeState,
    /// Whether it is the head.
    pub head: bool,
    /// Where it is reached.
    pub address: SocketAddr,
    /// Total and used resources.
    pub resources: ResourceUsage,
    /// Milliseconds since its last heartbeat.
    pub last_heartbeat_ms_ago: u64,
    /// Why it is dead, if it is.
    pub death_reason: Option<String>,
    /// How busy its machine was at its last heartbeat.
    #[serde(default)]
    pub host: Option<HostLoad>,
    /// What it runs.
    #[serde(default)]
    pub versions: Versions,
    /// A member a restarted head knows from its store and has not heard
    /// from yet: it has until the head's grace ends to heartbeat, else it
    /// is declared dead.
    #[serde(default)]
    pub rejoining: bool,
}

impl NodeStatus {
    /// The node's identity.
    pub fn identity(&self) -> NodeIdentity {
        NodeIdentity {
            name: self.id.clone(),
            incarnation: crate::wire::Incarnation(self.incarnation),
        }
    }
}

/// How busy a node's machine is, as its last heartbeat said.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostLoad {
    /// CPU time busy since the heartbeat before, percent of all CPUs.
    pub cpu_percent: f64,
    /// Memory in use (total less available), bytes.
    pub memory_used: u64,
    /// The machine's memory, bytes.
    pub memory_total: u64,
}

/// Total and used amounts of a node's resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceUsage {
    /// What the node offers.
    pub total: ResourceSet,
    /// What is handed out.
    pub used: ResourceSet,
}

/// The answer to `nimbus status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Every node the head knows, head first.
    pub nodes: Vec<NodeStatus>,
    /// The autoscaler's latest report, while it is fresh (none: the
    /// cluster does not grow by itself).
    #[serde(default)]
    pub autoscaler: Option<AutoscalerReport>,
    /// The capacity requested ahead of use (`RequestResources`), bundle by
    /// bundle.
    #[serde(default)]
    pub requested: Vec<ResourceSet>,
}

impl ClusterStatus {
    /// The nodes that are alive.
    pub fn alive(&self) -> impl Iterator<Item = &NodeStatus> {
        self.nodes.iter().filter(|n| n.state == NodeState::Alive)
    }

    /// The node named `id`.
    pub fn node(&self, id: &str) -> Option<&NodeStatus> {
        self.nodes.iter().find(|n| n.id == id)
    }
}
