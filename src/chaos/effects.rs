//! What a chaos run checks at its end: every planned fault left a trace,
//! else a `NoEffect` entry says which and why (and fails the run).

use super::{ChaosPlan, FaultAction, ResolvedFault, TimelineEntry};
use crate::cluster::ProcessClass;

/// A `NoEffect` entry for each planned fault that never took effect: timed
/// faults whose clock never started (`held`), actor and training faults
/// whose trigger never came (none among `fired`, the timeline's injected
/// faults as `(trigger, fault, target)`), packet rules that faulted no
/// datagram (`reported`: each reporting process's kind and its hits per
/// rule). `names` are the cluster's node names.
pub(super) fn missed(
    plan: &ChaosPlan,
    names: &[String],
    held: &[ResolvedFault],
    fired: &[(&str, &str, &str)],
    reported: &[(ProcessClass, &[u64])],
) -> Vec<TimelineEntry> {
    let mut missed = Vec::new();
    for fault in held {
        let at = fault.at;
        let target = match fault.action.link_rule() {
            Some((nodes, from, ..)) => format!("{}|{}", nodes.join(","), from.join(",")),
            None => match &fault.action {
                FaultAction::KillActor { actor } | FaultAction::PanicActor { actor } => {
                    actor.clone()
                }
                _ => names.get(fault.node).cloned().unwrap_or_default(),
            },
        };
        missed.push(TimelineEntry::NoEffect {
            fault: fault.action.label(),
            target,
            trigger: format!("after={}ms", at.as_millis()),
            why: "no actor started during the run, and the plan's clock is \"first_actor\"".into(),
        });
    }
    for rule in &plan.actor_faults {
        if !fired.iter().any(|(t, f, g)| rule.fired_as(f, g, t)) {
            missed.push(TimelineEntry::NoEffect {
                fault: rule.action.kind().into(),
                target: rule.target(),
                trigger: rule.trigger(),
                why: format!(
                    "no actor it targets received {} such messages during the run",
                    rule.after_messages
                ),
            });
        }
    }
    for rule in &plan.training_faults {
        let expected = rule.fired();
        let seen = fired.iter().any(|(trigger, fault, target)| {
            *fault == expected.kind && *target == expected.target && *trigger == expected.trigger
        });
        if !seen {
            missed.push(TimelineEntry::NoEffect {
                fault: expected.kind,
                target: expected.target,
                trigger: expected.trigger,
                why: "training never reached that step on that rank during the run".into(),
            });
        }
    }
    let sections = [
        (
            &plan.packet_faults,
            "workload",
            &[ProcessClass::Workload][..],
        ),
        (
            &plan.node_packet_faults,
            "nodes+workers",
            &[ProcessClass::Node, ProcessClass::Worker][..],
        ),
    ];
    for (packets, target, classes) in sections {
        let Some(packets) = packets else { continue };
        let reports: Vec<&[u64]> = reported
            .iter()
            .filter(|(class, _)| classes.contains(class))
            .map(|(_, hits)| *hits)
            .collect();
        for (index, rule) in packets.rules.iter().enumerate() {
            let hits: u64 = reports.iter().filter_map(|h| h.get(index)).sum();
            if hits > 0 {
                continue;
            }
            let why = if reports.is_empty() {
                "no process it applies to reported its packet counters".to_string()
            } else {
                "it faulted no datagram: nothing crossed the socket in its window (or the run ended before it opened)".to_string()
            };
            let until = rule
                .until_ms
                .map_or("end".to_string(), |ms| format!("{ms}ms"));
            missed.push(TimelineEntry::NoEffect {
                fault: format!("packets({})", rule.kinds().join(",")),
                target: target.into(),
                trigger: format!("window={}ms..{until}", rule.from_ms),
                why,
            });
        }
    }
    missed
}
