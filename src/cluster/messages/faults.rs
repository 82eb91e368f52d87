//! Fault injection's requests (`ControlRequest::Faults`): reports of
//! injected faults and recoveries to the head, packet rules to a node.

use serde::{Deserialize, Serialize};

use crate::cluster::ProcessClass;

/// The most packet rules whose hits one `ReportPacketFaults` publishes.
pub const MAX_PACKET_RULES: usize = 256;

/// Fault injection: reports to the head, packet rules to a node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum FaultRequest {
    /// To the head: a fault-injection rule fired; published as
    /// `FaultInjected`. Answered with `Ack`.
    ReportFault {
        /// The fault's kind.
        fault: String,
        /// What it hit, by a stable name.
        target: String,
        /// What fired it.
        trigger: String,
        /// The node the fault is about to kill, if it kills one: the
        /// directory gives the node's actors a death reason that names the
        /// fault (`node lost: ...; chaos: KIND at TRIGGER of TARGET`).
        #[serde(default)]
        kills_node: Option<String>,
    },
    /// To the head: something recovered from a failure (a training group
    /// restored from its checkpoint); published as `Recovered`. Answered
    /// with `Ack`.
    ReportRecovery {
        /// What recovered, in words.
        what: String,
        /// Who, by a stable name (a run's name).
        target: String,
        /// Milliseconds from the failure to the recovery.
        took_ms: u64,
    },
    /// To the head: what a process's socket's packet faults have done so
    /// far (counters since it started, reported when they change);
    /// published as `PacketFaults`. Answered with `Ack`.
    ReportPacketFaults {
        /// The process, by a stable name (a node's, `worker-ACTOR`, `driver-PID`).
        process: String,
        /// Its kind.
        class: ProcessClass,
        /// Its counters.
        counts: crate::transport::FaultCounts,
        /// Datagrams each rule of its plan faulted, by the rule's index
        /// (at most [`MAX_PACKET_RULES`] kept).
        #[serde(default)]
        rule_hits: Vec<u64>,
    },
    /// To a node: add a packet rule to its socket's fault plan, in front of
    /// the others; `from_ms` and `until_ms` count from its arrival (the
    /// chaos runner's partitions between chosen nodes). Refused by a node
    /// started without a packet fault plan. Answered with `Ack`.
    AddPacketRule(crate::transport::PacketRule),
}

/// What answers a [`FaultRequest`]: every one is acknowledged.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum FaultReply {
    /// Reported, or the rule added.
    Ack,
}
