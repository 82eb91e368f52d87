//! `nimbus status`: the cluster's nodes, their state, resources and
//! versions, the spawns waiting for room (pending demands), and the
//! autoscaler's node types and decisions when the cluster has one.

use anyhow::Result;
use clap::Args;
use std::collections::BTreeMap;

use crate::cluster::{AutoscalerReport, ClusterStatus, Demand, NodeState, ResourceSet};

use super::head_args::HeadArgs;

/// Options of `nimbus status`.
#[derive(Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    head: HeadArgs,
    /// Print JSON: an object with a `nodes` array and a `pending` array.
    #[arg(long)]
    json: bool,
}

/// Runs `nimbus status`.
pub(crate) fn run(args: StatusArgs) -> Result<()> {
    let (status, demands) = args
        .head
        .with_client(async |client| Ok((client.status().await?, client.demands().await?)))?;
    if args.json {
        let mut json = serde_json::to_value(&status)?;
        json["pending"] = serde_json::to_value(&demands)?;
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print_table(&status);
        print_demands(&demands);
        print_requested(&status);
        if let Some(autoscaler) = &status.autoscaler {
            print_autoscaler(autoscaler, &demands);
        }
    }
    Ok(())
}

/// Pending demands grouped by what they ask for, as `ray status` shows
/// them: `pending: 3 actors waiting for GPU=1 (longest 12.0 s)` (a
/// placement group's bundles together).
fn print_demands(demands: &[Demand]) {
    let mut groups: BTreeMap<(u8, String), (usize, u64)> = BTreeMap::new();
    for demand in demands {
        let (kind, count) = match (&demand.group, demand.tasks) {
            (Some(_), _) => (1, 1),
            (None, 0) => (0, 1),
            (None, tasks) => (2, tasks as usize),
        };
        let group = groups
            .entry((kind, demand.resources.to_string()))
            .or_default();
        group.0 += count;
        group.1 = group.1.max(demand.waited_ms);
    }
    if groups.is_empty() {
        println!("pending: none");
    }
    for ((kind, resources), (count, longest)) in groups {
        let what = match (kind, count) {
            (0, 1) => "actor",
            (0, _) => "actors",
            (1, 1) => "placement group",
            (1, _) => "placement groups",
            (_, 1) => "task",
            (_, _) => "tasks",
        };
        println!(
            "pending: {count} {what} waiting for {resources} (longest {:.1} s)",
            longest as f64 / 1000.0
        );
    }
}

/// The capacity requested ahead of use, grouped by bundle, and which
/// node type would hold each bundle (or why none can).
fn print_requested(status: &ClusterStatus) {
    let mut groups: BTreeMap<String, (usize, &ResourceSet)> = BTreeMap::new();
    for bundle in &status.requested {
        groups.entry(bundle.to_string()).or_insert((0, bundle)).0 += 1;
    }
    for (text, (count, bundle)) in groups {
        let fits = match &status.autoscaler {
            Some(autoscaler) => match autoscaler.type_for(bundle) {
                Ok(t) => format!("a {} node holds each", t.name),
                Err(why) => format!("no node type can hold it: {why}"),
            },
            None => "no autoscaler runs to launch nodes for it".to_string(),
        };
        println!("requested: {count} × {text} ({fits})");
    }
}

/// The autoscaler's node types, which would take each pending demand (or
/// why none can), and its latest decisions.
fn print_autoscaler(autoscaler: &AutoscalerReport, demands: &[Demand]) {
    println!(
        "autoscaler (at most {} worker nodes):",
        autoscaler.max_workers
    );
    for t in &autoscaler.node_types {
        println!(
            "  {:<16} {}: {} running, {} launching (min {}, max {})",
            t.name, t.resources, t.running, t.launching, t.min, t.max
        );
        for (node, ms) in &t.idle {
            println!("  {:<16} {node} idle for {:.1} s", "", *ms as f64 / 1000.0);
        }
        if let Some((why, ms)) = &t.backing_off {
            println!(
                "  {:<16} backing off {:.1} s more: {why}",
                "",
                *ms as f64 / 1000.0
            );
        }
    }
    let mut shown = std::collections::BTreeSet::new();
    for demand in demands {
        let needs = demand.resources.to_string();
        if !shown.insert(needs.clone()) {
            continue;
        }
        match autoscaler.type_for(&demand.resources) {
            Ok(t) => println!("  pending {needs}: a {} node would take it", t.name),
            Err(why) => println!("  pending {needs}: no node type can take it: {why}"),
        }
    }
    for decision in &autoscaler.decisions {
        println!("  decided: {decision}");
    }
}

fn print_table(status: &ClusterStatus) {
    println!(
        "{:<24} {:<6} {:<17} {:<22} RESOURCES (total; used)",
        "NODE", "STATE", "INCARNATION", "ADDRESS"
    );
    let head = status.nodes.iter().find(|node| node.head);
    for node in &status.nodes {
        let state = match node.state {
            NodeState::Alive => "alive",
            NodeState::Dead => "dead",
        };
        let name = if node.head {
            format!("{} (head)", node.id)
        } else {
            node.id.clone()
        };
        println!(
            "{name:<24} {state:<6} {:<17} {:<22} {}; {}",
            node.incarnation, node.address, node.resources.total, node.resources.used
        );
        let differs = head
            .and_then(|head| node.versions.differences(&head.versions))
            .map(|differs| format!(" — {differs}"))
            .unwrap_or_default();
        println!("{:<24} {}{differs}", "", node.versions);
        if let Some(reason) = &node.death_reason {
            println!("{:<24} {reason}", "");
        }
        if node.rejoining {
            println!(
                "{:<24} not heard from since the head restarted ({} ms)",
                "", node.last_heartbeat_ms_ago
            );
        }
    }
    let alive = status.alive().count();
    let (mut total, mut used) = (ResourceSet::default(), ResourceSet::default());
    for node in status.alive() {
        total.add(&node.resources.total);
        used.add(&node.resources.used);
    }
    println!("{alive} alive, {} dead", status.nodes.len() - alive);
    println!("cluster (alive nodes): {total} total; {used} used");
}
