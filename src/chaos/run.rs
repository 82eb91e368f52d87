//! Running a plan against a local cluster.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;

use crate::client::{ClientError, ClusterClient};
use crate::cluster::NodeState;
use crate::local::{LocalCluster, LocalClusterError};

use super::{ChaosPlan, FaultAction, Timeline, TimelineEntry};

/// A chaos run could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// The plan does not fit the cluster.
    #[error("bad chaos plan: {0}")]
    Plan(String),
    /// A node process could not be signalled or restarted.
    #[error(transparent)]
    Cluster(#[from] LocalClusterError),
    /// The head could not be asked what it saw.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Something the schedule does at a time.
enum Step {
    Fault(super::ResolvedFault),
    Resume { node: usize, stopped_at: Instant },
}

/// Injects `plan`'s faults into `cluster` at their times, observes the
/// recoveries, and returns the timeline. Nodes stopped by the plan are
/// resumed before it returns, whatever happens.
pub async fn run(cluster: &mut LocalCluster, plan: &ChaosPlan) -> Result<Timeline, ChaosError> {
    let names: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.name().to_string())
        .collect();
    let faults = plan.resolve(&names).map_err(ChaosError::Plan)?;
    let client = cluster.client().await?;
    let mut stopped = Vec::new();
    let result = schedule(cluster, &client, plan.seed, faults, &mut stopped).await;
    for node in stopped {
        let _ = cluster.resume(node);
    }
    result
}

async fn schedule(
    cluster: &mut LocalCluster,
    client: &ClusterClient,
    seed: u64,
    faults: Vec<super::ResolvedFault>,
    stopped: &mut Vec<usize>,
) -> Result<Timeline, ChaosError> {
    let start = Instant::now();
    let deadline = 3 * cluster.heartbeat_timeout() + Duration::from_secs(10);
    let mut timeline = Timeline {
        seed,
        entries: Vec::new(),
    };
    let mut steps: Vec<(Duration, Step)> =
        faults.into_iter().map(|f| (f.at, Step::Fault(f))).collect();
    let mut observations: FuturesUnordered<BoxFuture<'_, TimelineEntry>> = FuturesUnordered::new();
    loop {
        steps.sort_by_key(|(at, _)| *at);
        let next_at = steps.first().map(|(at, _)| start + *at);
        tokio::select! {
            _ = sleep_until(next_at), if next_at.is_some() => {
                let (at, step) = steps.remove(0);
                let now = Instant::now();
                let at_ms = (now - start).as_millis() as u64;
                match step {
                    Step::Fault(fault) => {
                        let node = names_of(cluster, fault.node);
                        let (label, observe) = match &fault.action {
                            FaultAction::KillNode { .. } => {
                                cluster.kill(fault.node)?;
                                ("kill (SIGKILL)".to_string(), Some(Expect::Dead))
                            }
                            FaultAction::StopNode { for_ms, .. } => {
                                cluster.suspend(fault.node)?;
                                stopped.push(fault.node);
                                steps.push((at + Duration::from_millis(*for_ms), Step::Resume { node: fault.node, stopped_at: now }));
                                (format!("stop (SIGSTOP) for {for_ms} ms"), None)
                            }
                            FaultAction::RestartNode { .. } => {
                                let before = cluster.node(fault.node)?.incarnation().0;
                                cluster.restart(fault.node)?;
                                ("restart".to_string(), Some(Expect::Rejoined { before }))
                            }
                        };
                        timeline.entries.push(TimelineEntry::Injected {
                            fault: label,
                            node: node.clone(),
                            trigger_ms: fault.at.as_millis() as u64,
                            at_ms,
                        });
                        if let Some(expect) = observe {
                            observations.push(observe_recovery(client, node, expect, now, deadline).boxed());
                        }
                    }
                    Step::Resume { node, stopped_at } => {
                        cluster.resume(node)?;
                        stopped.retain(|n| *n != node);
                        timeline.entries.push(TimelineEntry::Recovered {
                            what: "resumed (SIGCONT)".into(),
                            node: names_of(cluster, node),
                            took_ms: stopped_at.elapsed().as_millis() as u64,
                        });
                    }
                }
            }
            Some(entry) = observations.next(), if !observations.is_empty() => timeline.entries.push(entry),
            else => break,
        }
    }
    Ok(timeline)
}

/// What a fault should lead to.
enum Expect {
    Dead,
    Rejoined { before: u64 },
}

async fn observe_recovery(
    client: &ClusterClient,
    node: String,
    expect: Expect,
    since: Instant,
    deadline: Duration,
) -> TimelineEntry {
    let (what, seen) = match expect {
        Expect::Dead => {
            let dead = client
                .wait_for_status("the node declared dead", deadline, |s| {
                    s.node(&node).is_some_and(|n| n.state == NodeState::Dead)
                })
                .await;
            ("declared dead", dead)
        }
        Expect::Rejoined { before } => {
            let back = client
                .wait_for_status("the node rejoined", deadline, |s| {
                    s.node(&node)
                        .is_some_and(|n| n.state == NodeState::Alive && n.incarnation != before)
                })
                .await;
            ("rejoined as a new incarnation", back)
        }
    };
    match seen {
        Ok(_) => TimelineEntry::Recovered {
            what: what.into(),
            node,
            took_ms: since.elapsed().as_millis() as u64,
        },
        Err(e) => TimelineEntry::NotRecovered {
            what: what.into(),
            node,
            detail: e.to_string(),
        },
    }
}

fn names_of(cluster: &LocalCluster, node: usize) -> String {
    cluster
        .node(node)
        .map(|n| n.name().to_string())
        .unwrap_or_default()
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}
