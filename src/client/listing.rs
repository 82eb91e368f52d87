//! The cluster's state as rows of named columns, as an operator sees it:
//! what `nimbus list` prints and the dashboard's `/api/…` serves, built
//! in one place so both show the same columns.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Map, Value};

use crate::cluster::{
    ActorRecord, BundleListing, JobRecord, NodeState, PlacementGroupId, ResourceSet, RunRecord,
    TaskRecord,
};

use super::{ClientError, ClusterClient};

/// One row: column name to value.
pub type Row = Map<String, Value>;

/// What can be listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// Live actors (alive or restarting), then the dead ones the head
    /// keeps (`DEAD`, the last 1,000 per job): id, name, class, state,
    /// node, address, incarnation, restarts, job, pid, death.
    Actors,
    /// Nodes: id, state, head, incarnation, address, resources, used.
    Nodes,
    /// Objects in every live node's store: id, node, size, state, owned,
    /// holders.
    Objects,
    /// Jobs, live and ended: id, name, state, submitted, node, entrypoint,
    /// driver pid, times, message.
    Jobs,
    /// Placement groups, from the bundles the live nodes hold: id, job,
    /// bundles, resources, used.
    PlacementGroups,
    /// Tasks (the head keeps the last 10,000): id, name, state, job, node,
    /// worker, attempts, error, times.
    Tasks,
    /// Training runs (the head keeps the last 100): id, name, job, state,
    /// attempts, reports, checkpoints, the last loss, dir, times.
    Runs,
}

impl ClusterClient {
    /// Every row of `what`, in the head's order (nodes and objects node by
    /// node).
    pub async fn list(&self, what: Listing) -> Result<Vec<Row>, ClientError> {
        Ok(match what {
            Listing::Actors => {
                let mut actors = self.actors().await?;
                actors.extend(self.dead_actors().await?);
                actors.iter().map(actor_row).collect()
            }
            Listing::Nodes => self
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
            Listing::Jobs => self.jobs().await?.iter().map(job_row).collect(),
            Listing::Runs => self.runs().await?.iter().map(run_row).collect(),
            Listing::Tasks => {
                // The node of each task's worker, live or gone (a finished
                // job's task workers are dead actors the head keeps).
                let mut workers = self.dead_actors().await?;
                workers.extend(self.actors().await?);
                let nodes: HashMap<String, String> = workers
                    .into_iter()
                    .map(|a| (a.actor.to_string(), a.node.name))
                    .collect();
                self.tasks()
                    .await?
                    .iter()
                    .map(|task| task_row(task, &nodes))
                    .collect()
            }
            Listing::PlacementGroups => {
                let mut bundles = Vec::new();
                for node in self.status().await?.alive() {
                    for bundle in self.bundles(node).await? {
                        bundles.push((node.id.clone(), bundle));
                    }
                }
                group_rows(bundles)
            }
            Listing::Objects => {
                let mut rows = Vec::new();
                let status = self.status().await?;
                for node in status.alive() {
                    for summary in self.objects(node).await?.objects {
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
}

/// A JSON object as a row (anything else: an empty row).
fn object(value: Value) -> Row {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// One row per placement group, from its bundles and the nodes that hold
/// them.
fn group_rows(bundles: Vec<(String, BundleListing)>) -> Vec<Row> {
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
            object(json!({
                "id": format!("{:016x}", group.0),
                "job": members.first().map(|(_, b)| b.job.clone()).unwrap_or_default(),
                "state": "CREATED",
                "bundles": members.len(),
                "resources": describe(|b| &b.resources),
                "used": describe(|b| &b.used),
            }))
        })
        .collect()
}

/// A task as a row; `nodes` maps live task workers to their nodes (a
/// worker whose lease was returned is gone: its node is not shown).
fn task_row(task: &TaskRecord, nodes: &HashMap<String, String>) -> Row {
    let worker = task.worker.map(|w| w.to_string()).unwrap_or_default();
    object(json!({
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
    }))
}

/// An actor as a row.
fn actor_row(record: &ActorRecord) -> Row {
    let state = match (&record.dead, record.restarting) {
        (Some(_), _) => "DEAD",
        (None, true) => "RESTARTING",
        (None, false) => "ALIVE",
    };
    object(json!({
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
    }))
}

/// A training run as a row.
fn run_row(run: &RunRecord) -> Row {
    object(json!({
        "id": run.header.id,
        "name": run.header.name,
        "job": run.header.job,
        "state": run.state,
        "attempts": run.attempts,
        "reports": run.reports,
        "checkpoints": run.checkpoints.len(),
        "loss": run.last.get("loss"),
        "dir": run.header.dir,
        "start_ms": run.started_ms,
        "end_ms": run.ended_ms,
    }))
}

/// A job as a row.
pub fn job_row(job: &JobRecord) -> Row {
    let duration = job
        .end_ms
        .map(|end| format!("{:.1}s", end.saturating_sub(job.start_ms) as f64 / 1000.0))
        .unwrap_or_default();
    object(json!({
        "id": job.id,
        "name": job.name.clone().unwrap_or_default(),
        "state": job.state.to_string(),
        "submitted": job.submitted,
        "node": job.node.clone().unwrap_or_default(),
        "entrypoint": job.entrypoint,
        "driver_pid": job.driver_pid,
        "start_ms": job.start_ms,
        "end_ms": job.end_ms,
        "duration": duration,
        "message": job.message,
        "versions": job.versions.as_ref().map(ToString::to_string).unwrap_or_default(),
    }))
}
