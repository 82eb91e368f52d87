//! What a chaos run did and saw.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The faults a run injected and the recoveries it observed, in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The plan's seed, to replay the run.
    pub seed: u64,
    /// What happened.
    pub entries: Vec<TimelineEntry>,
}

/// One line of a timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TimelineEntry {
    /// A fault was injected.
    Injected {
        /// The fault, in words.
        fault: String,
        /// The node or actor it hit.
        target: String,
        /// What triggered it: a planned time, or a message count.
        trigger: String,
        /// When it actually happened, after the start.
        at_ms: u64,
    },
    /// The cluster recovered from (or reacted to) a fault.
    Recovered {
        /// What was observed.
        what: String,
        /// The node.
        node: String,
        /// How long after the fault.
        took_ms: u64,
    },
    /// An expected recovery did not happen within its deadline.
    NotRecovered {
        /// What was awaited.
        what: String,
        /// The node.
        node: String,
        /// Why not.
        detail: String,
    },
}

impl Timeline {
    /// The injected faults as `(trigger, fault, target)`: what two runs
    /// with the same seed and plan must share.
    pub fn injected(&self) -> Vec<(&str, &str, &str)> {
        self.entries
            .iter()
            .filter_map(|entry| match entry {
                TimelineEntry::Injected {
                    fault,
                    target,
                    trigger,
                    ..
                } => Some((trigger.as_str(), fault.as_str(), target.as_str())),
                _ => None,
            })
            .collect()
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "chaos timeline (seed {}):", self.seed)?;
        for entry in &self.entries {
            match entry {
                TimelineEntry::Injected {
                    fault,
                    target,
                    trigger,
                    at_ms,
                } => writeln!(
                    f,
                    "  t={at_ms:>6} ms  inject   {fault} on {target} (trigger: {trigger})"
                )?,
                TimelineEntry::Recovered {
                    what,
                    node,
                    took_ms,
                } => writeln!(
                    f,
                    "  {:>11}  recover  {node}: {what} after {took_ms} ms",
                    ""
                )?,
                TimelineEntry::NotRecovered { what, node, detail } => {
                    writeln!(f, "  {:>11}  MISSING  {node}: {what} ({detail})", "")?
                }
            }
        }
        Ok(())
    }
}
