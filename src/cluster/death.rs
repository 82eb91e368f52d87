//! Why an actor incarnation died, as a type: reported by its node (or by
//! the head, for a lost node), kept in the directory's record, published in
//! `ActorDied` events, and shown to callers. [`Display`](std::fmt::Display)
//! gives the words operators read (`killed by signal 9`, `panic: ...`,
//! `node lost: ...`); code matches on the variants, never on the words.
//!
//! Who says what:
//! - the worker, on its died line (`crate::runtime::boot`): `Panicked` (a
//!   panic and its message), `ChaosFault` (a fault hook killed it),
//!   `Stopped` (SIGTERM), `Failed` (it could not host the actor);
//! - its node, when there is no died line: `Exited` (the exit code) or
//!   `Killed` (the signal); and `KilledOnRequest` (wrapping how it ended)
//!   after a `KillActor`, `OwnerDied` (wrapping it too) after the actor
//!   incarnation that spawned it died, `RestartFailed` when it could not
//!   start it again;
//! - the head: `NodeLost` (the directory, for every actor of a node it
//!   declared dead, with the fault that killed the node if one did) and
//!   `NotRescheduled` (the rescheduler, when no other node took it);
//! - the spawner: `SpawnFailed` (the spawn that reserved its name failed).

use serde::{Deserialize, Serialize};

use super::faults::FiredFault;
use super::ActorOwner;

/// Why an actor incarnation died.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeathCause {
    /// Its worker process exited with this code.
    Exited {
        /// The exit code.
        code: i32,
    },
    /// Its worker process was killed by this signal.
    Killed {
        /// The signal.
        signal: i32,
    },
    /// It panicked (a handler, its constructor, or any thread of its
    /// process); a chaos `panic` fault's report is the message.
    Panicked {
        /// The panic's message.
        message: String,
    },
    /// A fault hook killed its process (a chaos `kill` rule fired in it).
    ChaosFault(FiredFault),
    /// Its worker process was stopped with SIGTERM (its node is stopping).
    Stopped,
    /// Killed on request (`ActorHandle::kill`); how its process ended.
    KilledOnRequest(Box<DeathCause>),
    /// Killed because the actor incarnation that spawned it died (Ray's
    /// fate sharing with the owner); how its process ended.
    OwnerDied {
        /// The owner incarnation that died.
        owner: ActorOwner,
        /// How this actor's process ended.
        death: Box<DeathCause>,
    },
    /// Its node was lost: declared dead by the head.
    NodeLost {
        /// The node (`name#incarnation`).
        node: String,
        /// Why the head declared it dead.
        reason: String,
        /// The fault that killed the node, if a fault hook did.
        fault: Option<FiredFault>,
    },
    /// Its node could not start it again after it died.
    RestartFailed {
        /// The death it was restarting from.
        death: Box<DeathCause>,
        /// Why the restart failed.
        error: String,
    },
    /// No other node could start it again after its node was lost.
    NotRescheduled {
        /// The death it was to be restarted from.
        death: Box<DeathCause>,
        /// Why no node took it.
        error: String,
    },
    /// The spawn that had reserved its name failed; it never ran.
    SpawnFailed,
    /// Its process failed before it could host the actor, in its own words.
    Failed(String),
}

impl DeathCause {
    /// The cause's kind, as the `cause` label of
    /// `nimbus_workers_died_total` (`crate::metrics`).
    pub fn kind(&self) -> &'static str {
        match self {
            DeathCause::Exited { .. } => "exited",
            DeathCause::Killed { .. } => "signal",
            DeathCause::Panicked { .. } => "panicked",
            DeathCause::ChaosFault(_) => "chaos_fault",
            DeathCause::Stopped => "stopped",
            DeathCause::KilledOnRequest(_) => "killed",
            DeathCause::OwnerDied { .. } => "owner_died",
            DeathCause::NodeLost { .. } => "node_lost",
            DeathCause::RestartFailed { .. } => "restart_failed",
            DeathCause::NotRescheduled { .. } => "not_rescheduled",
            DeathCause::SpawnFailed => "spawn_failed",
            DeathCause::Failed(_) => "failed",
        }
    }
}

/// The most bytes of one text (a panic message, a reason) the cluster
/// keeps: the head's records and events stay far below the frame limit
/// however large a panic message is.
pub const MAX_TEXT_BYTES: usize = 4096;

/// `text`, cut to at most [`MAX_TEXT_BYTES`] (on a character boundary)
/// with a note of how much was cut.
pub fn bounded_text(text: String) -> String {
    if text.len() <= MAX_TEXT_BYTES {
        return text;
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes cut)", &text[..end], text.len() - end)
}

impl DeathCause {
    /// This cause with every text in it cut to [`MAX_TEXT_BYTES`].
    pub fn bounded(self) -> DeathCause {
        let nested = |death: Box<DeathCause>| Box::new(death.bounded());
        match self {
            DeathCause::Panicked { message } => DeathCause::Panicked {
                message: bounded_text(message),
            },
            DeathCause::ChaosFault(fault) => DeathCause::ChaosFault(fault.bounded()),
            DeathCause::KilledOnRequest(death) => DeathCause::KilledOnRequest(nested(death)),
            DeathCause::OwnerDied { owner, death } => DeathCause::OwnerDied {
                owner,
                death: nested(death),
            },
            DeathCause::NodeLost {
                node,
                reason,
                fault,
            } => DeathCause::NodeLost {
                node: bounded_text(node),
                reason: bounded_text(reason),
                fault: fault.map(FiredFault::bounded),
            },
            DeathCause::RestartFailed { death, error } => DeathCause::RestartFailed {
                death: nested(death),
                error: bounded_text(error),
            },
            DeathCause::NotRescheduled { death, error } => DeathCause::NotRescheduled {
                death: nested(death),
                error: bounded_text(error),
            },
            DeathCause::Failed(text) => DeathCause::Failed(bounded_text(text)),
            plain @ (DeathCause::Exited { .. }
            | DeathCause::Killed { .. }
            | DeathCause::Stopped
            | DeathCause::SpawnFailed) => plain,
        }
    }

    /// The fault that caused this death, if a fault hook did (directly, by
    /// a panic it caused, or by killing the actor's node).
    pub fn fault(&self) -> Option<FiredFault> {
        match self {
            DeathCause::ChaosFault(fault) => Some(fault.clone()),
            DeathCause::Panicked { message } => FiredFault::from_death(message),
            DeathCause::NodeLost { fault, .. } => fault.clone(),
            DeathCause::KilledOnRequest(death)
            | DeathCause::OwnerDied { death, .. }
            | DeathCause::RestartFailed { death, .. }
            | DeathCause::NotRescheduled { death, .. } => death.fault(),
            DeathCause::Exited { .. }
            | DeathCause::Killed { .. }
            | DeathCause::Stopped
            | DeathCause::SpawnFailed
            | DeathCause::Failed(_) => None,
        }
    }

    /// The death at the root of this one (the first death of an actor whose
    /// restart failed, for one).
    pub fn root(&self) -> &DeathCause {
        match self {
            DeathCause::KilledOnRequest(death)
            | DeathCause::OwnerDied { death, .. }
            | DeathCause::RestartFailed { death, .. }
            | DeathCause::NotRescheduled { death, .. } => death.root(),
            other => other,
        }
    }

    /// Whether it died with its node.
    pub fn is_node_lost(&self) -> bool {
        matches!(self.root(), DeathCause::NodeLost { .. })
    }

    /// The panic's message, if it panicked.
    pub fn panic_message(&self) -> Option<&str> {
        match self.root() {
            DeathCause::Panicked { message } => Some(message),
            _ => None,
        }
    }
}

impl std::fmt::Display for DeathCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeathCause::Exited { code } => write!(f, "exited with code {code}"),
            DeathCause::Killed { signal } => write!(f, "killed by signal {signal}"),
            DeathCause::Panicked { message } => write!(f, "panic: {message}"),
            DeathCause::ChaosFault(fault) => fault.fmt(f),
            DeathCause::Stopped => f.write_str("stopped by SIGTERM"),
            DeathCause::KilledOnRequest(death) => write!(f, "killed on request ({death})"),
            DeathCause::OwnerDied { owner, death } => {
                write!(f, "the actor that spawned it died: {owner} ({death})")
            }
            DeathCause::NodeLost {
                node,
                reason,
                fault,
            } => {
                write!(f, "node lost: {node} ({reason})")?;
                match fault {
                    Some(fault) => write!(f, "; {fault}"),
                    None => Ok(()),
                }
            }
            DeathCause::RestartFailed { death, error } => {
                write!(f, "{death}; the restart failed: {error}")
            }
            DeathCause::NotRescheduled { death, error } => {
                write!(f, "{death}; no other node could restart it: {error}")
            }
            DeathCause::SpawnFailed => f.write_str("spawn failed"),
            DeathCause::Failed(detail) => f.write_str(detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_read_as_before_and_carry_their_fault() {
        let fault = FiredFault::new("kill_node", "step 25", "rank-1");
        let lost = DeathCause::NodeLost {
            node: "node-2#7".into(),
            reason: "no heartbeat for 3s".into(),
            fault: Some(fault.clone()),
        };
        assert_eq!(
            lost.to_string(),
            "node lost: node-2#7 (no heartbeat for 3s); chaos: kill_node at step 25 of rank-1"
        );
        let gone = DeathCause::NotRescheduled {
            death: Box::new(lost),
            error: "no alive node offers unique=1".into(),
        };
        assert!(gone.is_node_lost());
        assert_eq!(gone.fault(), Some(fault));
        let panicked = DeathCause::Panicked {
            message: "chaos: panic at message 3 (Push) of queue".into(),
        };
        assert_eq!(panicked.fault().map(|f| f.kind), Some("panic".into()));
        assert_eq!(
            DeathCause::Killed { signal: 9 }.to_string(),
            "killed by signal 9"
        );
        assert_eq!(
            DeathCause::KilledOnRequest(Box::new(DeathCause::Killed { signal: 9 })).to_string(),
            "killed on request (killed by signal 9)"
        );
    }
}
