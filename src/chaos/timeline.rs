//! What a chaos run did and saw.
//!
//! How faults and recoveries reach the timeline, all through the head's
//! event stream, which the run reads:
//! 1. Faults that kill report their `FiredFault` (written and parsed only
//!    in `crate::cluster::faults`: `chaos: KIND at TRIGGER of TARGET`) as
//!    the death cause: the worker prints `DeathCause::ChaosFault` as its
//!    died line before SIGKILLing itself; a panic fault's message is the
//!    report.
//! 2. A fault that kills a node sends `ReportFault` with `kills_node`
//!    first, and the directory puts the fault into the `NodeLost` cause of
//!    every actor lost with that node (`node lost: ...; chaos: ...`), so a
//!    training supervisor counts the rule as fired and the timeline records
//!    it once.
//! 3. Faults that do not kill are published by whoever injected them as
//!    `FaultInjected` events (training faults: the worker reports them to
//!    its supervisor, which sends `ReportFault` to the head).
//! 4. Recoveries the cluster cannot see by itself are reported the same
//!    way: a training supervisor sends `ReportRecovery` (published as
//!    `Recovered`) when a restarted group completes its first step; the
//!    run observes the others itself (declared dead, resumed, rejoined,
//!    links healed, actor restarted and where, and how long it took).
//! 5. Every process whose socket has a packet plan reports its counters to
//!    the head every 500 ms when they change, and a driver once more as it
//!    ends (`ReportPacketFaults`, published as `PacketFaults`;
//!    `crate::runtime`'s `packet_reports.rs`), summed per kind of process,
//!    with the datagrams each rule of the plan faulted.
//! 6. When the run ends, each planned fault that left no trace in 1-5 is
//!    recorded as `NoEffect` (`NO EFFECT ...: why`), and fails the run.
//!
//! The printed timeline ([`Timeline`]'s `Display`): one line per fault,
//! `fault <n> t=<seconds> <kind> target=<stable name> trigger=<what fired
//! it>`, in trigger order; then the plan's packet rules as planned
//! (`planned packets(...) target=... trigger=window=...`: the plan, not an
//! observation); then what the packet faults did (`packets injected
//! target=workload|nodes|workers processes=N sent=.. dropped=..
//! duplicated=.. reordered=.. delayed=.. cut_off=..`); then the recoveries
//! observed, and what did not happen (`recovery MISSING ...`, `NO EFFECT
//! ...`). `nimbus chaos run` prints the workload's own `summary:` line
//! last.

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
    /// A packet-fault rule of the plan, installed from the start: what was
    /// planned, not what happened (see `PacketsInjected`).
    Planned {
        /// The rule, in words.
        fault: String,
        /// The processes whose sockets got it.
        target: String,
        /// Its window.
        trigger: String,
    },
    /// What the packet faults of one kind of process did, from the
    /// counters their sockets reported.
    PacketsInjected {
        /// `workload`, `nodes` or `workers`.
        class: String,
        /// How many processes of that kind reported.
        processes: usize,
        /// Their counters, summed.
        counts: crate::transport::FaultCounts,
    },
    /// An expected recovery did not happen within its deadline, or a
    /// planned fault could not be injected.
    NotRecovered {
        /// What was awaited.
        what: String,
        /// The node.
        node: String,
        /// Why not.
        detail: String,
    },
    /// A planned fault never took effect during the run: its trigger never
    /// came (an actor got fewer messages, training stopped before the
    /// step), or its packet rule faulted no datagram.
    NoEffect {
        /// The fault, in the plan's words.
        fault: String,
        /// What it was to hit.
        target: String,
        /// Its trigger.
        trigger: String,
        /// What was seen instead.
        why: String,
    },
}

impl Timeline {
    /// What went wrong with the plan itself, one line each: faults that
    /// never took effect or could not be injected, and recoveries that did
    /// not come. A run with any is a failed run (`nimbus chaos run` fails).
    pub fn missed(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    TimelineEntry::NotRecovered { .. } | TimelineEntry::NoEffect { .. }
                )
            })
            .map(|e| {
                let mut line = String::new();
                let _ = write_entry(&mut line, e);
                line.trim_end().to_string()
            })
            .collect()
    }

    /// The injected faults as `(trigger, fault, target)`, in trigger order
    /// (see [`Display`](#impl-Display-for-Timeline)): what two runs with the
    /// same seed and plan must share.
    pub fn injected(&self) -> Vec<(&str, &str, &str)> {
        self.injected_entries()
            .into_iter()
            .map(|(fault, target, trigger, _)| (trigger, fault, target))
            .collect()
    }

    /// Injected entries as `(fault, target, trigger, at_ms)`, ordered by
    /// trigger (numbers compared as numbers), then target and fault: an
    /// order that does not depend on which of two concurrent faults was
    /// reported first.
    fn injected_entries(&self) -> Vec<(&str, &str, &str, u64)> {
        let mut injected: Vec<_> = self
            .entries
            .iter()
            .filter_map(|entry| match entry {
                TimelineEntry::Injected {
                    fault,
                    target,
                    trigger,
                    at_ms,
                } => Some((fault.as_str(), target.as_str(), trigger.as_str(), *at_ms)),
                _ => None,
            })
            .collect();
        injected.sort_by(|a, b| {
            natural(a.2)
                .cmp(&natural(b.2))
                .then_with(|| natural(a.1).cmp(&natural(b.1)))
                .then_with(|| a.0.cmp(b.0))
        });
        injected
    }
}

/// A sort key comparing runs of digits as numbers: `step 5` < `step 20`.
fn natural(text: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            key.push((rest[..digits].parse().unwrap_or(u64::MAX), String::new()));
            rest = &rest[digits..];
        } else {
            let text = rest.len() - rest.trim_start_matches(|c: char| !c.is_ascii_digit()).len();
            key.push((0, rest[..text].to_string()));
            rest = &rest[text..];
        }
    }
    key
}

impl fmt::Display for Timeline {
    /// One line per injected fault, `fault <n> t=<seconds> <kind>
    /// target=<name> trigger=<what fired it>`, in trigger order (wall-clock
    /// time only in `t=`, so two runs of one seed and plan differ only
    /// there), then the planned packet rules (`planned ...`), what the
    /// packet faults did per kind of process (`packets injected target=KIND
    /// processes=N sent=.. dropped=.. ...`, counts that vary between runs),
    /// and one line per recovery.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "chaos timeline (seed {}):", self.seed)?;
        for (n, (fault, target, trigger, at_ms)) in self.injected_entries().into_iter().enumerate()
        {
            let seconds = at_ms as f64 / 1000.0;
            writeln!(
                f,
                "fault {} t={seconds:.2} {fault} target={target} trigger={trigger}",
                n + 1
            )?;
        }
        for entry in &self.entries {
            write_entry(f, entry)?;
        }
        Ok(())
    }
}

/// One line of the printed timeline for `entry` (none for an injected
/// fault: those print first, in trigger order).
fn write_entry(f: &mut impl fmt::Write, entry: &TimelineEntry) -> fmt::Result {
    match entry {
        TimelineEntry::Injected { .. } => Ok(()),
        TimelineEntry::Planned {
            fault,
            target,
            trigger,
        } => writeln!(f, "planned {fault} target={target} trigger={trigger}"),
        TimelineEntry::PacketsInjected {
            class,
            processes,
            counts,
        } => writeln!(
            f,
            "packets injected target={class} processes={processes} {counts}"
        ),
        TimelineEntry::Recovered {
            what,
            node,
            took_ms,
        } => writeln!(f, "recovery {node}: {what} after {took_ms} ms"),
        TimelineEntry::NotRecovered { what, node, detail } => {
            writeln!(f, "recovery MISSING {node}: {what} ({detail})")
        }
        TimelineEntry::NoEffect {
            fault,
            target,
            trigger,
            why,
        } => writeln!(
            f,
            "NO EFFECT {fault} target={target} trigger={trigger}: {why}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_print_in_trigger_order_whatever_order_they_were_seen_in() {
        let injected = |trigger: &str, at_ms| TimelineEntry::Injected {
            fault: "kill".into(),
            target: "rank-1".into(),
            trigger: trigger.into(),
            at_ms,
        };
        let timeline = Timeline {
            seed: 3,
            entries: vec![injected("step 20", 900), injected("step 5", 1000)],
        };
        let text = timeline.to_string();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(
            lines,
            [
                "fault 1 t=1.00 kill target=rank-1 trigger=step 5",
                "fault 2 t=0.90 kill target=rank-1 trigger=step 20"
            ]
        );
    }
}
