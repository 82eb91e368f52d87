//! `nimbus list` and `nimbus kill`: the cluster's state as rows, and
//! `ray.kill` from the command line.

use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use nimbus::client::ClusterClient;
use nimbus::cluster::{
    ActorRecord, BundleListing, NodeState, PlacementGroupId, ResourceSet, TaskRecord,
};
use serde_json::{json, Map, Value};

use crate::head::HeadArgs;

/// What `nimbus list` lists.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Listed {
    /// Live actors (alive or restarting): id, name, class, state, node, address, incarnation, restarts, job, pid.
    Actors,
    /// Nodes: id, state, head, incarnation, address, resources.
    Nodes,
    /// Objects in every live node's store: id, node, size, state, owned, holders.
    Objects,
    /// Jobs, live and ended: id, name, state, submitted, node, entrypoint, driver pid, times, message.
    Jobs,
    /// Placement groups, from the bundles the live nodes hold: id, job, bundles, nodes, resources, used.
    PlacementGroups,
    /// Tasks (the head keeps the last 10,000): id, name, state, job, node, worker, attempts, error, times.
    Tasks,
}

/// Options of `nimbus list`.
#[derive(Args)]
pub(crate) struct ListArgs {
    /// What to list.
    what: Listed,
    #[command(flatten)]
    head: HeadArgs,
    /// Only rows whose KEY (a column, as in --json) equals VALUE; repeat to
    /// require several.
    #[arg(long, value_name = "KEY=VALUE")]
    filter: Vec<String>,
    /// Print a JSON array of rows.
    #[arg(long)]
    json: bool,
    /// Print at most this many rows.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

/// Runs `nimbus list`.
pub(crate) fn list(args: ListArgs) -> Result<()> {
    let filters = args
        .filter
        .iter()
        .map(|f| {
            f.split_once('=')
                .with_context(|| format!("--filter {f:?} is not KEY=VALUE"))
        })
        .collect::<Result<Vec<_>>>()?;
    let what = args.what;
    let rows = args
        .head
        .with_client(async |client| rows(&client, what).await)?;
    if let Some(row) = rows.first() {
        for (key, _) in &filters {
            if !row.contains_key(*key) {
                let columns: Vec<&str> = row.keys().map(String::as_str).collect();
                bail!(
                    "--filter {key}: no such column (columns: {})",
                    columns.join(", ")
                );
            }
        }
    }
    let matching: Vec<Map<String, Value>> = rows
        .into_iter()
        .filter(|row| {
            filters
                .iter()
                .all(|(key, value)| row.get(*key).is_some_and(|v| text(v) == *value))
        })
        .collect();
    let shown = &matching[..matching.len().min(args.limit)];
    if args.json {
        println!("{}", serde_json::to_string_pretty(shown)?);
    } else {
        print_table(shown);
    }
    if matching.len() > shown.len() {
        eprintln!(
            "{} more not shown (--limit {})",
            matching.len() - shown.len(),
            args.limit
        );
    }
    Ok(())
}

async fn rows(client: &ClusterClient, what: Listed) -> Result<Vec<Map<String, Value>>> {
    let object = |value: Value| match value {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    Ok(match what {
        Listed::Actors => client.actors().await?.iter().map(actor_row).map(object).collect(),
        Listed::Nodes => client
            .status()
            .await?
            .nodes
            .iter()
            .map(|node| {
                object(json!({
                    "id": node.id,
                    "state": match node.state { NodeState::Alive => "ALIVE", NodeState::Dead => "DEAD" },
                    "head": node.head,
                    "incarnation": node.incarnation,
                    "address": node.address.to_string(),
                    "resources": node.resources.total.to_string(),
                    "used": node.resources.used.to_string(),
                }))
            })
            .collect(),
        Listed::Jobs => client.jobs().await?.iter().map(crate::jobs::row).collect(),
        Listed::Tasks => {
            let nodes: HashMap<String, String> = client
                .actors()
                .await?
                .into_iter()
                .map(|a| (a.actor.to_string(), a.node.name))
                .collect();
            client
                .tasks()
                .await?
                .iter()
                .map(|task| object(task_row(task, &nodes)))
                .collect()
        }
        Listed::PlacementGroups => {
            let mut bundles = Vec::new();
            for node in client.status().await?.alive() {
                for bundle in client.bundles(node).await? {
                    bundles.push((node.id.clone(), bundle));
                }
            }
            group_rows(bundles).into_iter().map(object).collect()
        }
        Listed::Objects => {
            let mut rows = Vec::new();
            let status = client.status().await?;
            for node in status.alive() {
                for summary in client.objects(node).await?.objects {
                    rows.push(object(json!({
                        "id": summary.id.to_string(),
                        "node": node.id,
                        "size": summary.size,
                        "state": summary.state.to_string(),
                        "owned": summary.primary,
                        "holders": summary.holders.join(", "),
                    })));
                }
            }
            rows
        }
    })
}

/// One row per placement group, from its bundles and the nodes that hold
/// them.
fn group_rows(bundles: Vec<(String, BundleListing)>) -> Vec<Value> {
    let mut groups: BTreeMap<PlacementGroupId, Vec<(String, BundleListing)>> = BTreeMap::new();
    for (node, bundle) in bundles {
        groups
            .entry(bundle.bundle.group)
            .or_default()
            .push((node, bundle));
    }
    groups
        .into_iter()
        .map(|(group, mut members)| {
            members.sort_by_key(|(_, b)| b.bundle.index);
            let describe = |pick: fn(&BundleListing) -> &ResourceSet| {
                let parts: Vec<String> = members
                    .iter()
                    .map(|(node, b)| format!("{}@{node}:{}", b.bundle.index, pick(b)))
                    .collect();
                parts.join(" ")
            };
            json!({
                "id": format!("{:016x}", group.0),
                "job": members.first().map(|(_, b)| b.job.clone()).unwrap_or_default(),
                "state": "CREATED",
                "bundles": members.len(),
                "resources": describe(|b| &b.resources),
                "used": describe(|b| &b.used),
            })
        })
        .collect()
}

/// A task as a row; `nodes` maps live task workers to their nodes (a
/// worker whose lease was returned is gone: its node is not shown).
fn task_row(task: &TaskRecord, nodes: &HashMap<String, String>) -> Value {
    let worker = task.worker.map(|w| w.to_string()).unwrap_or_default();
    json!({
        "id": task.id.to_string(),
        "name": task.name,
        "state": task.state.to_string(),
        "job": task.job,
        "node": nodes.get(&worker).cloned().unwrap_or_default(),
        "worker": worker,
        "attempts": task.attempts,
        "error": task.error.clone().unwrap_or_default(),
        "submitted_ms": task.submitted_ms,
        "ended_ms": task.ended_ms,
    })
}

fn actor_row(record: &ActorRecord) -> Value {
    let state = match (&record.dead, record.restarting) {
        (Some(_), _) => "DEAD",
        (None, true) => "RESTARTING",
        (None, false) => "ALIVE",
    };
    json!({
        "id": record.actor.to_string(),
        "name": record.name.clone().unwrap_or_default(),
        "class": record.type_name,
        "state": state,
        "node": record.node.name,
        "address": record.address.to_string(),
        "incarnation": record.incarnation.0,
        "restarts": record.restarts,
        "job": record.job,
        "pid": record.pid,
        "death": record.dead.as_ref().map(ToString::to_string).unwrap_or_default(),
    })
}

/// A cell as text: strings without quotes.
pub(crate) fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(crate) fn print_table(rows: &[Map<String, Value>]) {
    let Some(first) = rows.first() else {
        println!("(none)");
        return;
    };
    let columns: Vec<&String> = first.keys().collect();
    let width = |column: &String| {
        rows.iter()
            .map(|row| row.get(column.as_str()).map_or(0, |v| text(v).len()))
            .chain([column.len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = columns.iter().map(|c| width(c)).collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(columns.iter().map(|c| c.to_uppercase()).collect());
    for row in rows {
        line(
            columns
                .iter()
                .map(|c| row.get(c.as_str()).map(text).unwrap_or_default())
                .collect(),
        );
    }
}

/// Options of `nimbus kill`.
#[derive(Args)]
pub(crate) struct KillArgs {
    /// The actor: its name, or its id as `nimbus list actors` shows it.
    actor: String,
    #[command(flatten)]
    head: HeadArgs,
}

/// Runs `nimbus kill`: the actor's worker is SIGKILLed and not restarted.
pub(crate) fn kill(args: KillArgs) -> Result<()> {
    let KillArgs { actor, head } = args;
    head.with_client(async |client| {
        let record = client
            .find_actor(&actor)
            .await?
            .with_context(|| format!("no actor named {actor:?}"))?;
        if let Some(death) = &record.dead {
            bail!("actor {} is dead already: {death}", record.actor);
        }
        client.kill_actor(&record).await?;
        println!("killed: {}", record.actor);
        Ok(())
    })
}
