//! The cluster's numbered events (`ControlRequest::Events`, to the head):
//! the long poll that reads them, and the events themselves.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::cluster::{ActorId, MAX_PACKET_RULES};
use crate::wire::{Incarnation, NodeIdentity};

/// To the head: the cluster's numbered events (answered by `ClusterEvents`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum EventRequest {
    /// Cluster events after sequence number `after`, waiting up to
    /// `wait_ms` for one if there are none yet (a long poll).
    Events {
        /// The last sequence number the caller has seen (0 for all).
        after: u64,
        /// How long to wait for a new event.
        wait_ms: u64,
    },
    /// The number of the latest event published (answered with
    /// [`EventReply::LastSeq`]), to read only later ones with
    /// [`Events`](Self::Events).
    LastSeq,
}

/// What answers an [`EventRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum EventReply {
    /// Events, oldest first.
    Events(Vec<ClusterEvent>),
    /// The number of the latest event published: events after it are
    /// new (an [`EventRequest::LastSeq`]).
    LastSeq(u64),
}

/// Something that happened to the membership, numbered in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, actix::Message)]
#[rtype(result = "()")]
pub struct ClusterEvent {
    /// Position in the head's event stream, from 1.
    pub seq: u64,
    /// What happened.
    pub kind: ClusterEventKind,
    /// When the head published it, Unix milliseconds (0: not said).
    #[serde(default)]
    pub time_ms: u64,
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
    /// A job ended: its actors (all but the detached ones) were killed and
    /// its bundles released.
    JobEnded {
        /// The job.
        job: String,
        /// Why (its driver was not heard from for the grace period).
        reason: String,
    },
    /// A node was declared dead.
    NodeDead {
        /// The node.
        node: NodeIdentity,
        /// Why: missed heartbeats, or replaced by a newer incarnation.
        reason: String,
    },
    /// What a node has in use changed (reported by its heartbeat).
    ResourcesChanged {
        /// The node.
        node: NodeIdentity,
    },
    /// An actor incarnation runs (first start or restart).
    ActorStarted {
        /// The actor.
        actor: ActorId,
        /// The incarnation that runs.
        incarnation: Incarnation,
        /// Its unique name, if any.
        #[serde(default)]
        name: Option<String>,
        /// The node it runs on.
        #[serde(default)]
        node: String,
    },
    /// An actor incarnation died.
    ActorDied {
        /// The actor.
        actor: ActorId,
        /// The incarnation that died.
        incarnation: Incarnation,
        /// Why.
        reason: crate::cluster::DeathCause,
        /// Whether a new incarnation is being started.
        restarting: bool,
    },
    /// Something recovered from a failure (reported by whoever recovered).
    Recovered {
        /// What recovered, in words.
        what: String,
        /// Who, by a stable name.
        target: String,
        /// Milliseconds from the failure to the recovery.
        took_ms: u64,
    },
    /// A fault-injection rule fired (reported by whoever injected it).
    FaultInjected {
        /// The fault's kind, such as `straggle(50ms x 3 steps)`.
        fault: String,
        /// What it hit, by a stable name (`rank 1`, an actor's name).
        target: String,
        /// What fired it, such as `step 7`.
        trigger: String,
    },
    /// A process's socket injected packet faults (its counters so far).
    PacketFaults {
        /// The process.
        process: String,
        /// Its kind.
        class: ProcessClass,
        /// Its counters since it started.
        counts: crate::transport::FaultCounts,
        /// Datagrams each rule of its plan faulted, by the rule's index: a
        /// zero is a rule that has not taken effect.
        #[serde(default)]
        rule_hits: Vec<u64>,
    },
    /// The autoscaler decided to launch or stop a node, or a launch
    /// failed (`launching cpu-2-1 (cpu-2) for 2 waiting demand(s)`,
    /// `terminating cpu-2-1: idle 10.0 s`).
    Autoscaler {
        /// The decision, in words.
        decision: String,
    },
    /// Not an event: the reader asked for the events after `after`, and
    /// some of them are gone (the head restarted, or more were published
    /// than the head keeps while the reader was away). What it knows from
    /// the events is stale: it must read the state again (`ListActors`,
    /// `Status`, `ListJobs`) and go on from this marker's number.
    Resync {
        /// The number the reader asked after.
        after: u64,
        /// The first event the head still has (later events follow).
        first_kept: u64,
    },
}

impl ClusterEventKind {
    /// This event with each text in it cut to
    /// [`MAX_TEXT_BYTES`](crate::cluster::MAX_TEXT_BYTES), so that no event
    /// (a huge panic message) can push the event history past a frame.
    pub fn bounded(self) -> ClusterEventKind {
        use crate::cluster::bounded_text;
        match self {
            ClusterEventKind::NodeDead { node, reason } => ClusterEventKind::NodeDead {
                node,
                reason: bounded_text(reason),
            },
            ClusterEventKind::ActorStarted {
                actor,
                incarnation,
                name,
                node,
            } => ClusterEventKind::ActorStarted {
                actor,
                incarnation,
                name: name.map(bounded_text),
                node: bounded_text(node),
            },
            ClusterEventKind::ActorDied {
                actor,
                incarnation,
                reason,
                restarting,
            } => ClusterEventKind::ActorDied {
                actor,
                incarnation,
                reason: reason.bounded(),
                restarting,
            },
            ClusterEventKind::Recovered {
                what,
                target,
                took_ms,
            } => ClusterEventKind::Recovered {
                what: bounded_text(what),
                target: bounded_text(target),
                took_ms,
            },
            ClusterEventKind::FaultInjected {
                fault,
                target,
                trigger,
            } => ClusterEventKind::FaultInjected {
                fault: bounded_text(fault),
                target: bounded_text(target),
                trigger: bounded_text(trigger),
            },
            ClusterEventKind::PacketFaults {
                process,
                class,
                counts,
                mut rule_hits,
            } => ClusterEventKind::PacketFaults {
                process: bounded_text(process),
                class,
                counts,
                rule_hits: {
                    rule_hits.truncate(MAX_PACKET_RULES);
                    rule_hits
                },
            },
            ClusterEventKind::Autoscaler { decision } => ClusterEventKind::Autoscaler {
                decision: bounded_text(decision),
            },
            plain @ (ClusterEventKind::NodeJoined { .. }
            | ClusterEventKind::NodeLeft { .. }
            | ClusterEventKind::JobEnded { .. }
            | ClusterEventKind::ResourcesChanged { .. }
            | ClusterEventKind::Resync { .. }) => plain,
        }
    }
}

/// The kinds of process whose sockets a fault plan can reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ProcessClass {
    /// The program run under the plan (a driver).
    Workload,
    /// A node process.
    Node,
    /// A worker process hosting an actor.
    Worker,
}

impl std::fmt::Display for ProcessClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProcessClass::Workload => "workload",
            ProcessClass::Node => "nodes",
            ProcessClass::Worker => "workers",
        })
    }
}

impl ClusterEventKind {
    /// The node the event is about, for node events.
    pub fn node(&self) -> Option<&NodeIdentity> {
        match self {
            ClusterEventKind::NodeJoined { node, .. }
            | ClusterEventKind::NodeLeft { node }
            | ClusterEventKind::NodeDead { node, .. }
            | ClusterEventKind::ResourcesChanged { node } => Some(node),
            ClusterEventKind::ActorStarted { .. }
            | ClusterEventKind::ActorDied { .. }
            | ClusterEventKind::Recovered { .. }
            | ClusterEventKind::FaultInjected { .. }
            | ClusterEventKind::JobEnded { .. }
            | ClusterEventKind::PacketFaults { .. }
            | ClusterEventKind::Autoscaler { .. }
            | ClusterEventKind::Resync { .. } => None,
        }
    }
}
