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
use crate::transport::FaultPlanError;

/// Environment variable a node reads its actor fault rules from (JSON list).
pub const ACTOR_FAULTS_ENV: &str = "NIMBUS_ACTOR_FAULTS";

/// Set (to anything) in a node's environment when its cluster injects
/// `kill_node` faults, which kill the node from inside a worker: the
/// node's workers may then signal it (`crate::node`'s sandbox scopes
/// workers' signals otherwise).
pub const WORKERS_KILL_NODE_ENV: &str = "NIMBUS_WORKERS_KILL_NODE";

/// Fail an actor when a message arrives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

impl ActorFaultAction {
    /// The fault's kind, in the words of the chaos timeline.
    pub fn kind(self) -> &'static str {
        match self {
            ActorFaultAction::Kill => "kill",
            ActorFaultAction::Panic => "panic",
            ActorFaultAction::KillNode => "kill_node",
        }
    }
}

impl ActorFault {
    /// What the rule hits, as a chaos timeline names it: the actor's
    /// name, `type:TYPE`, or `any actor`.
    pub fn target(&self) -> String {
        match (&self.actor_name, &self.actor_type) {
            (Some(name), _) => name.clone(),
            (None, Some(type_name)) => format!("type:{type_name}"),
            (None, None) => "any actor".into(),
        }
    }

    /// Its trigger, as the chaos timeline prints it once fired:
    /// `message N (MESSAGE)` (`message N (any)` without a message name).
    pub fn trigger(&self) -> String {
        let message = self.message.as_deref().unwrap_or("any");
        format!("message {} ({message})", self.after_messages)
    }

    /// Whether a fired fault's timeline line (`kind`, `target`, `trigger`)
    /// is this rule's.
    pub fn fired_as(&self, kind: &str, target: &str, trigger: &str) -> bool {
        let count = format!("message {} (", self.after_messages);
        kind == self.action.kind()
            && trigger.starts_with(&count)
            && self
                .message
                .as_ref()
                .is_none_or(|m| trigger == format!("{count}{m})"))
            && self.actor_name.as_ref().is_none_or(|n| target == n)
    }

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
    pub fn from_env() -> Result<Vec<ActorFault>, FaultPlanError> {
        let rules = FaultPlanError::read(ACTOR_FAULTS_ENV, "a list of actor faults")?;
        Ok(rules.unwrap_or_default())
    }
}

/// A fault a fault hook fired, as every hook reports it before the process
/// dies: `chaos: KIND at TRIGGER of TARGET` ([`Display`](std::fmt::Display)),
/// read back from a death reason by [`FiredFault::from_death`]. The one
/// place that format is written and parsed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiredFault {
    /// Its kind (`kill`, `panic`, `torn_checkpoint_write`, ...).
    pub kind: String,
    /// What fired it (`message 3 (Push)`, `step 10`).
    pub trigger: String,
    /// What it hit (an actor's name or type, `rank-1`).
    pub target: String,
}

impl FiredFault {
    /// This report with each text cut to
    /// [`MAX_TEXT_BYTES`](crate::cluster::MAX_TEXT_BYTES).
    pub fn bounded(self) -> FiredFault {
        use crate::cluster::bounded_text;
        FiredFault {
            kind: bounded_text(self.kind),
            trigger: bounded_text(self.trigger),
            target: bounded_text(self.target),
        }
    }
}

/// The reserved message name that makes a worker panic at once (a chaos
/// plan's `panic_actor` at a time); the payload is the panic's message.
pub const PANIC_MESSAGE: &str = "nimbus.chaos.Panic";

/// The reserved message name that adds a packet rule to a worker's socket
/// (a chaos plan's partition); the payload is the
/// [`PacketRule`](crate::transport::PacketRule), MessagePack, its window
/// counted from its arrival.
pub const PACKET_RULE_MESSAGE: &str = "nimbus.chaos.PacketRule";

/// How a fault's report starts.
const REPORT_PREFIX: &str = "chaos: ";

impl FiredFault {
    /// The fault `kind` fired by `trigger` on `target`.
    pub fn new(
        kind: impl Into<String>,
        trigger: impl Into<String>,
        target: impl Into<String>,
    ) -> Self {
        FiredFault {
            kind: kind.into(),
            trigger: trigger.into(),
            target: target.into(),
        }
    }

    /// The fault in a death reason (where it may follow `panic: ` or a lost
    /// node's description), if a fault hook caused the death.
    pub fn from_death(reason: &str) -> Option<Self> {
        let at = reason.find(REPORT_PREFIX)?;
        let body = &reason[at + REPORT_PREFIX.len()..];
        let (kind, rest) = body.split_once(" at ").unwrap_or((body, ""));
        let (trigger, target) = rest.rsplit_once(" of ").unwrap_or((rest, "an actor"));
        Some(FiredFault::new(kind, trigger, target))
    }
}

impl std::fmt::Display for FiredFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{REPORT_PREFIX}{} at {} of {}",
            self.kind, self.trigger, self.target
        )
    }
}
