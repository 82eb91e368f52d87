//! Fault rules for actors (kill an actor, make it panic, or kill its node,
//! when its N-th message arrives), the reserved messages of the
//! fault-injection harness, and the form in which every fault hook reports
//! a death it caused. The trigger is a message count, so a rerun with the
//! same rules fails the same message.
//!
//! Rules reach worker processes through their node manager: a node reads
//! them (JSON) from [`ACTOR_FAULTS_ENV`] and hands the matching ones to each
//! actor's first incarnation (a restarted actor does not die again of the
//! same rule).

use serde::{Deserialize, Serialize};

use super::ActorSpec;

/// Environment variable a node reads its actor fault rules from (JSON list).
pub const ACTOR_FAULTS_ENV: &str = "NIMBUS_ACTOR_FAULTS";

/// Fail an actor when a message arrives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorFault {
    /// Actors with this unique name (`None`: any name)...
    #[serde(default)]
    pub actor_name: Option<String>,
    /// ...and of this registered type (`None`: any type).
    #[serde(default)]
    pub actor_type: Option<String>,
    /// Count only messages of this registered name (`None`: all).
    #[serde(default)]
    pub message: Option<String>,
    /// The fault fires when this counted message arrives, before it is
    /// handled (1 = the first).
    pub after_messages: u64,
    /// What happens.
    pub action: ActorFaultAction,
}

/// What an actor fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorFaultAction {
    /// SIGKILL the worker process.
    Kill,
    /// Panic while dispatching the message.
    Panic,
    /// SIGKILL the node process that runs the worker (the worker dies with
    /// it): a whole node lost at a chosen message. Not on the head, which
    /// the cluster cannot lose.
    KillNode,
}

impl ActorFault {
    /// Whether the rule targets the actor `spec` describes.
    pub fn targets(&self, spec: &ActorSpec) -> bool {
        self.actor_name
            .as_ref()
            .is_none_or(|n| spec.name.as_ref() == Some(n))
            && self
                .actor_type
                .as_ref()
                .is_none_or(|t| *t == spec.type_name)
    }

    /// Rules from [`ACTOR_FAULTS_ENV`], if set.
    pub fn from_env() -> Result<Vec<ActorFault>, String> {
        match std::env::var(ACTOR_FAULTS_ENV) {
            Ok(json) => serde_json::from_str(&json)
                .map_err(|e| format!("{ACTOR_FAULTS_ENV} is not a list of actor faults: {e}")),
            Err(_) => Ok(Vec::new()),
        }
    }
}

/// A fault that killed a process, read back from its death reason:
/// `chaos: KIND at TRIGGER of TARGET` (maybe behind `panic: `), the form
/// every fault hook reports before the process dies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FiredFault {
    /// `chaos: ...` as reported: the fault's identity.
    pub reason: String,
    /// Its kind (`kill`, `panic`, `torn_checkpoint_write`, ...).
    pub kind: String,
    /// What fired it (`message 3 (Push)`, `step 10`).
    pub trigger: String,
    /// What it hit (an actor's name or type, `rank-1`).
    pub target: String,
}

/// The reserved message name that makes a worker panic at once (a chaos
/// plan's `panic_actor` at a time); the payload is the panic's message.
pub const PANIC_MESSAGE: &str = "nimbus.chaos.Panic";

/// The reserved message name that adds a packet rule to a worker's socket
/// (a chaos plan's partition); the payload is the
/// [`PacketRule`](crate::transport::PacketRule), MessagePack, its window
/// counted from its arrival.
pub const PACKET_RULE_MESSAGE: &str = "nimbus.chaos.PacketRule";

impl FiredFault {
    /// The fault in a death reason, if a fault hook caused the death.
    pub fn from_death(reason: &str) -> Option<Self> {
        let at = reason.find("chaos: ")?;
        let said = &reason[at..];
        let body = &said["chaos: ".len()..];
        let (kind, rest) = body.split_once(" at ").unwrap_or((body, ""));
        let (trigger, target) = rest.rsplit_once(" of ").unwrap_or((rest, "an actor"));
        Some(FiredFault {
            reason: said.to_string(),
            kind: kind.to_string(),
            trigger: trigger.to_string(),
            target: target.to_string(),
        })
    }
}
