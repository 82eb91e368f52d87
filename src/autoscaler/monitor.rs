//! The autoscaler's loop (steps 1, 2, 4, 6 and 7 of [`super`]): a client
//! of the head that observes, asks `decide.rs`, launches and stops nodes
//! through the provider, and reports back.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;

use crate::client::{ClientError, ClusterClient};
use crate::cluster::{AutoscalerReport, Demand, MembershipRequest, NodeStatus};
use crate::transport::JoinToken;

use super::config::ProviderConfig;
use super::decide::{Action, Observed, ObservedNode, Scaler, Wanted};
use super::provider::{self, LaunchSpec, NodeProvider};
use super::{AutoscalerError, ClusterConfig, POLL_INTERVAL};

/// Runs the autoscaler for `config` against the head at `head` until
/// `stop` completes, then stops every node it launched (step 7). Its
/// records live under `home` (`$NIMBUS_HOME`).
pub async fn run(
    config: ClusterConfig,
    (head, token): (String, JoinToken),
    home: &Path,
    stop: impl Future<Output = ()>,
) -> Result<(), AutoscalerError> {
    let provider: Arc<dyn NodeProvider> = Arc::from(provider::for_config(&config, home));
    let mut scaler = Scaler::new(&config);
    let mut stopping = JoinSet::new();
    // Step 1: adopt what an autoscaler before this one launched.
    for node in blocking(&provider, |p| p.list()).await {
        match config.node_type(&node.node_type) {
            Some(_) => {
                tracing::info!(
                    "adopting {} ({}), launched before",
                    node.name,
                    node.node_type
                );
                scaler.adopt(&node.name, &node.node_type, Instant::now());
            }
            None => {
                tracing::info!(
                    "stopping {}: its type {} is no longer in {}",
                    node.name,
                    node.node_type,
                    config.path.display()
                );
                stop_node(&mut stopping, &provider, node.name);
            }
        }
    }
    let mut client = None;
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {}
        }
        if client.is_none() {
            match ClusterClient::connect(&head, &token).await {
                Ok(connected) => client = Some(connected),
                Err(e) => {
                    unreachable_head(&head, e);
                    continue;
                }
            }
        }
        let Some(connected) = &client else { continue };
        let observed = match observe(connected, &scaler).await {
            Ok(observed) => observed,
            Err(e) => {
                unreachable_head(&head, e);
                client = None;
                continue;
            }
        };
        for action in scaler.decide(&observed, Instant::now()) {
            match action {
                Action::Launch { node_type, name } => {
                    let Some(node_type) = config.node_type(&node_type).cloned() else {
                        continue;
                    };
                    let spec = LaunchSpec {
                        name: name.clone(),
                        node_type,
                        head: head.clone(),
                        token: token.clone(),
                        // Nodes of this machine advertise the head's
                        // address; others find their own.
                        node_ip_address: match config.provider {
                            ProviderConfig::Local => config.head.node_ip_address,
                            _ => None,
                        },
                    };
                    if let Err(e) = blocking(&provider, move |p| p.launch(&spec)).await {
                        tracing::warn!("{e}");
                        scaler.launch_failed(&name, &e.to_string(), Instant::now());
                    }
                }
                Action::Terminate { name, .. } => stop_node(&mut stopping, &provider, name),
            }
        }
        let report = AutoscalerReport {
            pid: std::process::id(),
            ..scaler.report(Instant::now())
        };
        let report = MembershipRequest::Autoscaler(report);
        if let Err(e) = connected.call(report).await {
            tracing::warn!("cannot report to the head: {e}");
        }
    }
    // Step 7.
    let launched: Vec<String> = scaler
        .launched()
        .map(|(name, _)| name.to_string())
        .collect();
    for name in launched {
        tracing::info!("stopping {name}: the autoscaler stops");
        stop_node(&mut stopping, &provider, name);
    }
    while stopping.join_next().await.is_some() {}
    Ok(())
}

/// Step 2: the head's view, and whether each launched node that uses
/// nothing holds an object's only copy (asked of its store; a store that
/// does not answer is taken to hold one: nothing is stopped blind).
async fn observe(client: &ClusterClient, scaler: &Scaler) -> Result<Observed, ClientError> {
    let status = client.status().await?;
    let demands = client.demands().await?;
    let launched: Vec<&str> = scaler.launched().map(|(name, _)| name).collect();
    let mut nodes = Vec::new();
    for node in status.alive() {
        let unused = node.resources.used.iter().all(|(_, amount)| amount <= 1e-9);
        let holds_objects = match launched.contains(&node.id.as_str()) && unused {
            true => holds_objects(client, node).await,
            false => false,
        };
        nodes.push(ObservedNode {
            name: node.id.clone(),
            total: node.resources.total.clone(),
            used: node.resources.used.clone(),
            holds_objects,
        });
    }
    Ok(Observed {
        nodes,
        demands: wanted(&demands),
        requested: status.requested.clone(),
    })
}

/// What the waiting demands want of new nodes: all but spawns pinned to a
/// node (only that node can take them).
fn wanted(demands: &[Demand]) -> Vec<Wanted> {
    demands
        .iter()
        .filter(|d| d.node.is_none())
        .map(|d| {
            let (bundles, together) = d.bundles();
            Wanted { bundles, together }
        })
        .collect()
}

async fn holds_objects(client: &ClusterClient, node: &NodeStatus) -> bool {
    match client.objects(node).await {
        Ok(listing) => listing.objects.iter().any(|o| o.primary),
        Err(e) => {
            tracing::warn!("cannot list {}'s objects, so it is kept: {e}", node.id);
            true
        }
    }
}

/// Logs that the head at `address` could not be reached (tried again
/// next round).
fn unreachable_head(address: &str, source: ClientError) {
    let address = address.to_string();
    tracing::warn!("{}", AutoscalerError::Head { address, source });
}

/// Stops `name` on a blocking thread (a graceful stop takes seconds).
fn stop_node(stopping: &mut JoinSet<()>, provider: &Arc<dyn NodeProvider>, name: String) {
    let provider = provider.clone();
    stopping.spawn_blocking(move || {
        if let Err(e) = provider.terminate(&name) {
            tracing::warn!("{e}");
        }
    });
}

/// Runs `work` with the provider on a blocking thread.
async fn blocking<T: Send + 'static>(
    provider: &Arc<dyn NodeProvider>,
    work: impl FnOnce(&dyn NodeProvider) -> T + Send + 'static,
) -> T {
    let provider = provider.clone();
    tokio::task::spawn_blocking(move || work(provider.as_ref()))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ActorId, ResourceSet, CPU};

    #[test]
    fn a_spawn_pinned_to_a_node_wants_no_new_node() {
        let demand = |node: Option<&str>, tasks| Demand {
            actor: ActorId(1),
            class: "T".into(),
            resources: ResourceSet::of(CPU, 2.0),
            job: "job".into(),
            waited_ms: 0,
            group: None,
            tasks,
            node: node.map(String::from),
        };
        let wanted = wanted(&[demand(Some("node-1"), 0), demand(None, 0), demand(None, 3)]);
        let bundles: Vec<usize> = wanted.iter().map(|w| w.bundles.len()).collect();
        assert_eq!(bundles, [1, 3], "the free spawn, and a bundle per task");
    }
}
