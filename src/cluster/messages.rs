//! The control protocol: what nodes and clients send to the head (and to
//! each other), carried as request bodies by the transport.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::wire::NodeIdentity;

use super::ResourceSet;

/// A control-plane request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControlRequest {
    /// A node asks the head to admit it. Answered with [`ControlReply::Joined`].
    Join(NodeRegistration),
    /// A node is alive; `used` is what it has handed out.
    Heartbeat {
        /// The node.
        node: NodeIdentity,
        /// Resources in use.
        used: ResourceSet,
    },
    /// A node is stopping on purpose.
    Leave {
        /// The node.
        node: NodeIdentity,
    },
    /// The membership and resource view. Answered with [`ControlReply::Status`].
    Status,
    /// Cluster events after sequence number `after`, waiting up to
    /// `wait_ms` for one if there are none yet (a long poll).
    Events {
        /// The last sequence number the caller has seen (0 for all).
        after: u64,
        /// How long to wait for a new event.
        wait_ms: u64,
    },
    /// Returns the payload unchanged: a liveness probe and a benchmark.
    Echo(#[serde(with = "serde_bytes")] Vec<u8>),
}

/// A control-plane reply.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControlReply {
    /// The node is a member; it must heartbeat at this interval.
    Joined {
        /// Heartbeat interval in milliseconds.
        heartbeat_interval_ms: u64,
    },
    /// Acknowledges a heartbeat or a leave.
    Ack,
    /// The cluster as the head sees it.
    Status(ClusterStatus),
    /// Events, oldest first.
    Events(Vec<ClusterEvent>),
    /// The payload of an [`ControlRequest::Echo`].
    Echo(#[serde(with = "serde_bytes")] Vec<u8>),
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

/// Something that happened to the membership, numbered in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, actix::Message)]
#[rtype(result = "()")]
pub struct ClusterEvent {
    /// Position in the head's event stream, from 1.
    pub seq: u64,
    /// What happened.
    pub kind: ClusterEventKind,
}

/// Kinds of [`ClusterEvent`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClusterEventKind {
    /// A node (incarnation) became a member.
    NodeJoined {
        /// The node.
        node: NodeIdentity,
        /// Where it is reached.
        address: SocketAddr,
    },
    /// A node stopped on purpose.
    NodeLeft {
        /// The node.
        node: NodeIdentity,
    },
    /// A node was declared dead.
    NodeDead {
        /// The node.
        node: NodeIdentity,
        /// Why: missed heartbeats, or replaced by a newer incarnation.
        reason: String,
    },
}

impl ClusterEventKind {
    /// The node the event is about.
    pub fn node(&self) -> &NodeIdentity {
        match self {
            ClusterEventKind::NodeJoined { node, .. }
            | ClusterEventKind::NodeLeft { node }
            | ClusterEventKind::NodeDead { node, .. } => node,
        }
    }
}
