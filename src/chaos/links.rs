//! Partitions and degraded links: the rule each process on either side
//! gets, installed concurrently (a stopped node must not hold up the
//! schedule), and what the run learns once every process has answered.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::client::ClusterClient;
use crate::cluster::{
    ActorRecord, DirectoryReply, DirectoryRequest, FaultRequest, NodeState, NodeStatus,
    UnexpectedReply,
};
use crate::transport::{PacketRule, RequestOptions};

use super::run::NotInjected;

/// A link fault's rules, once every process was asked to add them.
pub(super) struct Cut {
    /// The fault, in the timeline's words.
    pub(super) fault: String,
    /// The sides' stable name (`a,b|c`).
    pub(super) sides: String,
    pub(super) trigger: String,
    pub(super) for_ms: u64,
    /// When the last process answered.
    pub(super) installed_at: Instant,
    /// The processes that did not add the rule, and why.
    pub(super) failures: Vec<String>,
}

/// Applies `rule` to the links between the processes of `nodes` and those
/// of `from` (every other node if empty) for `for_ms`: each node process
/// and each worker of a live actor on those nodes gets the rule, naming the
/// other side's addresses. Yields the fault (`fault`, planned at `planned`)
/// once every process has answered, with those that did not add it.
pub(super) fn links<'a>(
    client: &'a ClusterClient,
    fault: String,
    nodes: &[String],
    from: &[String],
    for_ms: u64,
    rule: PacketRule,
    planned: Duration,
) -> BoxFuture<'a, Cut> {
    let other = if from.is_empty() {
        "rest".to_string()
    } else {
        from.join(",")
    };
    let sides = format!("{}|{other}", nodes.join(","));
    let (nodes, from) = (nodes.to_vec(), from.to_vec());
    async move {
        let failures = match link_rules(client, &nodes, &from, for_ms, rule).await {
            Ok(failures) => failures,
            Err(e) => vec![e.to_string()],
        };
        Cut {
            fault,
            sides,
            trigger: format!("after={}ms", planned.as_millis()),
            for_ms,
            installed_at: Instant::now(),
            failures,
        }
    }
    .boxed()
}

/// A process on one side of a partition.
enum Process {
    Node(NodeStatus),
    Worker(ActorRecord),
}

impl Process {
    fn address(&self) -> SocketAddr {
        match self {
            Process::Node(node) => node.address,
            Process::Worker(record) => record.address,
        }
    }

    /// Adds `rule` to the process's socket.
    async fn cut(&self, client: &ClusterClient, rule: PacketRule) -> Result<(), NotInjected> {
        let options = RequestOptions::control().with_deadline(Duration::from_secs(2));
        match self {
            Process::Node(node) => {
                let connection = client
                    .endpoint()
                    .connect(node.address, Some(&node.identity()))
                    .await?;
                let request = FaultRequest::AddPacketRule(rule);
                crate::client::call(&connection, request, options).await?;
                Ok(())
            }
            Process::Worker(record) => {
                let worker = crate::wire::NodeIdentity {
                    name: crate::actor::worker_name(record.actor),
                    incarnation: record.incarnation,
                };
                let call = crate::actor::ActorCall {
                    actor: record.actor,
                    message: crate::actor::faults::PACKET_RULE_MESSAGE.to_string(),
                    payload: rmp_serde::to_vec_named(&rule)?,
                };
                let body = rmp_serde::to_vec_named(&call)?;
                let connection = client
                    .endpoint()
                    .connect(record.address, Some(&worker))
                    .await?;
                connection.request(body, options).await?;
                Ok(())
            }
        }
    }
}

/// Adds the link rule to every process on both sides; returns the
/// processes it could not reach.
async fn link_rules(
    client: &ClusterClient,
    nodes: &[String],
    from: &[String],
    for_ms: u64,
    template: PacketRule,
) -> Result<Vec<String>, NotInjected> {
    let status = client.status().await?;
    let actors = match client.call(DirectoryRequest::ListActors).await? {
        DirectoryReply::Actors(actors) => actors,
        reply => return Err(UnexpectedReply::new("ListActors", reply).into()),
    };
    let on_side_a = |name: &str| nodes.iter().any(|n| n == name);
    let on_side_b = |name: &str| {
        if from.is_empty() {
            !on_side_a(name)
        } else {
            from.iter().any(|n| n == name)
        }
    };
    let side = |on: &dyn Fn(&str) -> bool| -> Vec<Process> {
        let node_processes = status
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Alive && on(&n.id))
            .cloned()
            .map(Process::Node);
        let workers = actors
            .iter()
            .filter(|r| !r.restarting && on(&r.node.name))
            .cloned()
            .map(Process::Worker);
        node_processes.chain(workers).collect()
    };
    let (a, b) = (side(&on_side_a), side(&on_side_b));
    let rule = |other: &[Process]| PacketRule {
        peers: other.iter().map(Process::address).collect(),
        from_ms: 0,
        until_ms: Some(for_ms),
        ..template.clone()
    };
    let (to_a, to_b) = (rule(&b), rule(&a));
    let cuts = a
        .iter()
        .map(|p| (p, to_a.clone()))
        .chain(b.iter().map(|p| (p, to_b.clone())))
        .map(|(process, rule)| async move {
            process
                .cut(client, rule)
                .await
                .map_err(|e| format!("{}: {e}", process.address()))
        });
    let results = futures::future::join_all(cuts).await;
    Ok(results.into_iter().filter_map(Result::err).collect())
}
