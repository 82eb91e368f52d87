//! The fault hooks of a hosted actor: counting its messages against the
//! rules of [`crate::cluster::faults`] (re-exported here) and firing the
//! one that matches.

use std::sync::atomic::{AtomicU64, Ordering};

pub use crate::cluster::faults::{
    ActorFault, ActorFaultAction, FiredFault, ACTOR_FAULTS_ENV, PACKET_RULE_MESSAGE, PANIC_MESSAGE,
};

/// The rules of one hosted actor, with their message counts.
pub(crate) struct FaultTriggers {
    rules: Vec<(ActorFault, AtomicU64)>,
    /// The actor's stable name in reasons: its unique name, or its type.
    target: String,
}

/// A fault that fired.
pub(crate) struct Fired {
    pub action: ActorFaultAction,
    /// What the death reports.
    pub fault: FiredFault,
}

impl FaultTriggers {
    pub(crate) fn new(rules: Vec<ActorFault>, target: String) -> Self {
        FaultTriggers {
            rules: rules.into_iter().map(|r| (r, AtomicU64::new(0))).collect(),
            target,
        }
    }

    /// Counts a message; returns the fault it triggers, if any.
    pub(crate) fn on_message(&self, message: &str) -> Option<Fired> {
        self.rules.iter().find_map(|(rule, count)| {
            if rule.message.as_ref().is_some_and(|m| m != message) {
                return None;
            }
            let n = count.fetch_add(1, Ordering::Relaxed) + 1;
            let action = rule.action.kind();
            (n == rule.after_messages).then(|| Fired {
                action: rule.action,
                fault: FiredFault::new(action, format!("message {n} ({message})"), &self.target),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_fires_once_at_its_count_of_its_message() {
        let rule = ActorFault {
            actor_name: None,
            actor_type: None,
            message: Some("Push".into()),
            after_messages: 3,
            action: ActorFaultAction::Kill,
        };
        let triggers = FaultTriggers::new(vec![rule], "queue".into());
        let fired: Vec<bool> = ["Push", "Seen", "Push", "Push", "Push"]
            .iter()
            .map(|m| triggers.on_message(m).is_some())
            .collect();
        assert_eq!(fired, [false, false, false, true, false]);
        let again = FaultTriggers::new(
            triggers.rules.into_iter().map(|(r, _)| r).collect(),
            "queue".into(),
        );
        let reason = (0..3)
            .find_map(|_| again.on_message("Push"))
            .unwrap()
            .fault
            .to_string();
        assert_eq!(reason, "chaos: kill at message 3 (Push) of queue");
        let fired = FiredFault::from_death(&format!("panic: {reason}")).unwrap();
        assert_eq!(
            (
                fired.kind.as_str(),
                fired.trigger.as_str(),
                fired.target.as_str()
            ),
            ("kill", "message 3 (Push)", "queue")
        );
    }
}
