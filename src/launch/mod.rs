//! Launching a worker process for an actor: choosing a node that fits it,
//! asking that node to start it, and shipping the program's binary there
//! when the node lacks it (from the spawning process's own file, or relayed
//! from another node that has it). One mechanism for
//! [`actor::spawn`](crate::actor::spawn), the task pool (task workers are
//! actors) and the head's [`ActorRescheduler`](crate::head::ActorRescheduler).
//!
//! Choosing: [`candidates`] are the alive nodes whose *total* resources fit
//! the request, best first per [`Strategy`]: `Any`, the most free CPU;
//! `Spread`, the smallest share of CPU in use; `Node(name)`, that node
//! only. No candidate means the cluster could never run it.
//!
//! Starting an actor on a chosen node:
//! 1. Send `StartActor` (60 s deadline); a node that can fit it starts the
//!    worker process and answers `ActorStarted`; a full one answers
//!    `NoCapacity` (the caller tries the next candidate).
//! 2. A node without the program's binary answers `NeedBinary`: take this
//!    process's upload lock for that node and ask again (another spawn may
//!    have shipped it meanwhile: concurrent uploads of one file would race,
//!    and a node cannot execute a binary still open for writing); if it
//!    still needs it, upload it in [`UPLOAD_CHUNK`] (8 MiB) chunks
//!    (`UploadBinary`, SHA-256 checked by the node, bulk priority) and ask
//!    again. Relaying from other nodes reads the same chunks from the first
//!    node that has it (`ReadBinary`) and uploads each.
//! 3. A node that asks for the binary a third time is an error.
//!
//! [`ship_to_head`]: an actor that may restart on another node is restarted
//! by the head, which must find its program; before the first such spawn a
//! process asks the head for 0 bytes of its binary (`ReadBinary`) and
//! uploads it if the head lacks it, once per process.

use std::time::Duration;

use crate::client::{self, ClientError};
use crate::cluster::{
    ActorSpec, BinaryId, BinaryReply, NodeStatus, UnexpectedReply, WorkerReply, CPU,
};
use crate::cluster::{BinaryRequest, WorkerRequest};
use crate::transport::{Connection, Endpoint, RequestError, RequestOptions};

/// Bytes per binary upload request.
pub const UPLOAD_CHUNK: usize = 8 << 20;

/// Why an actor could not be launched on a node.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The node failed to start the worker process.
    #[error("node {node} could not start the actor: {detail}")]
    Start {
        /// The node.
        node: String,
        /// What it said.
        detail: String,
    },
    /// The program's binary could not be read or supplied for shipping.
    #[error("cannot ship this program to the nodes: {0}")]
    Binary(String),
    /// The cluster could not be reached.
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[from] ClientError),
    /// A peer answered with a reply of the wrong kind.
    #[error(transparent)]
    Unexpected(#[from] crate::cluster::UnexpectedReply),
}

/// Where to place an actor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// The node with the most free CPU among those that fit.
    #[default]
    Any,
    /// Spread actors: the node with the fewest resources in use.
    Spread,
    /// This node (by name), and no other.
    Node(String),
}

/// Makes sure the head at `head` has the binary `id` (at `path` here): an
/// actor that may be restarted on another node when its node is lost is
/// restarted by the head, which ships the program to the new node (once
/// per process).
pub async fn ship_to_head(
    endpoint: &Endpoint,
    head: std::net::SocketAddr,
    binary: &(std::path::PathBuf, BinaryId),
) -> Result<(), LaunchError> {
    static SHIPPED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SHIPPED
        .get_or_try_init(|| async {
            // A restarting head is waited for (up to its grace).
            let connection = client::ask_head(endpoint, head, true, |c| async { Ok(c) }).await?;
            let id = &binary.1;
            let has = BinaryRequest::ReadBinary {
                hash: id.hash.clone(),
                offset: 0,
                len: 0,
            };
            match client::call(&connection, has, RequestOptions::control()).await {
                Ok(BinaryReply::Chunk { .. }) => Ok(()),
                Ok(reply) => Err(UnexpectedReply::new("ReadBinary", reply).into()),
                Err(ClientError::Request(RequestError::Remote { .. })) => {
                    let _shipping = upload_lock(head).lock_owned().await;
                    let source = BinarySource::File(binary.0.clone());
                    upload(endpoint, &source, id, &connection).await
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
        .map(drop)
}

/// Alive nodes whose totals fit the request, best first.
pub fn candidates<'a>(
    nodes: &'a [NodeStatus],
    spec: &ActorSpec,
    strategy: &Strategy,
) -> Vec<&'a NodeStatus> {
    let fits = |n: &NodeStatus| spec.resources.fits_in(&n.resources.total);
    let free_cpu = |n: &NodeStatus| n.resources.total.amount(CPU) - n.resources.used.amount(CPU);
    let mut nodes: Vec<&NodeStatus> = nodes
        .iter()
        .filter(|n| n.state == crate::cluster::NodeState::Alive && fits(n))
        .filter(|n| match strategy {
            Strategy::Node(name) => &n.id == name,
            _ => true,
        })
        .collect();
    match strategy {
        Strategy::Spread => nodes.sort_by(|a, b| used_share(a).total_cmp(&used_share(b))),
        _ => nodes.sort_by(|a, b| free_cpu(b).total_cmp(&free_cpu(a))),
    }
    nodes
}

fn used_share(node: &NodeStatus) -> f64 {
    let total = node.resources.total.amount(CPU).max(1.0);
    node.resources.used.amount(CPU) / total
}

/// Where a node that lacks an actor's program binary gets it from.
pub enum BinarySource {
    /// This file (the spawning program itself).
    File(std::path::PathBuf),
    /// Whichever of these nodes has it (the head restarting an actor whose
    /// node was lost: the program is on the nodes that ran it).
    Nodes(Vec<NodeStatus>),
}

/// What a node did with a request to start an actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// The actor runs there.
    Running,
    /// The node has no room for it: what it said.
    Full(String),
}

/// Asks `node` to start the actor, shipping the binary if it asks for it.
pub async fn start_on(
    endpoint: &Endpoint,
    node: &NodeStatus,
    spec: &ActorSpec,
    binary: &BinarySource,
) -> Result<Started, LaunchError> {
    let connection = endpoint
        .connect(node.address, Some(&node.identity()))
        .await
        .map_err(ClientError::from)?;
    let start = WorkerRequest::StartActor(spec.clone());
    let options = RequestOptions::control().with_deadline(Duration::from_secs(60));
    // Spawns from this process ship the binary to a node one at a time: the
    // first uploads, the others then find it there. (Concurrent uploads of
    // one file would race each other, and a node cannot execute a binary
    // another upload still holds open for writing: ETXTBSY.)
    let lock = upload_lock(node.address);
    let mut shipping = None;
    for _ in 0..3 {
        let reply = match client::call(&connection, start.clone(), options).await {
            Ok(reply) => reply,
            Err(ClientError::Request(RequestError::Remote { error, .. })) => {
                return Err(LaunchError::Start {
                    node: node.id.clone(),
                    detail: error.message,
                })
            }
            Err(e) => return Err(e.into()),
        };
        match reply {
            WorkerReply::ActorStarted(_) => return Ok(Started::Running),
            WorkerReply::NoCapacity(refusal) => return Ok(Started::Full(refusal)),
            WorkerReply::NeedBinary if shipping.is_none() => {
                // Ask again once holding the lock: another spawn may have
                // shipped it meanwhile.
                shipping = Some(lock.clone().lock_owned().await);
            }
            WorkerReply::NeedBinary => upload(endpoint, binary, &spec.binary, &connection).await?,
            reply => return Err(UnexpectedReply::new("StartActor", reply).into()),
        }
    }
    Err(LaunchError::Start {
        node: node.id.clone(),
        detail: "it asked for the binary again after receiving it".into(),
    })
}

/// The lock serialising this process's uploads to the node at `address`.
fn upload_lock(address: std::net::SocketAddr) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    static LOCKS: std::sync::OnceLock<
        dashmap::DashMap<std::net::SocketAddr, std::sync::Arc<tokio::sync::Mutex<()>>>,
    > = std::sync::OnceLock::new();
    LOCKS
        .get_or_init(dashmap::DashMap::new)
        .entry(address)
        .or_default()
        .clone()
}

/// Ships the binary `id` from `source` to a node, in order, in chunks.
async fn upload(
    endpoint: &Endpoint,
    source: &BinarySource,
    id: &BinaryId,
    node: &Connection,
) -> Result<(), LaunchError> {
    match source {
        BinarySource::File(path) => {
            let bytes = tokio::fs::read(path)
                .await
                .map_err(|e| LaunchError::Binary(format!("{}: {e}", path.display())))?;
            let total = bytes.len() as u64;
            let mut offset = 0;
            for chunk in bytes.chunks(UPLOAD_CHUNK) {
                upload_chunk(node, id, offset, total, chunk.to_vec()).await?;
                offset += chunk.len() as u64;
            }
            Ok(())
        }
        BinarySource::Nodes(nodes) => {
            let mut failures = Vec::new();
            for source in nodes {
                match relay(endpoint, source, id, node).await {
                    Ok(()) => return Ok(()),
                    Err(e) => failures.push(format!("{}: {e}", source.id)),
                }
            }
            Err(LaunchError::Binary(format!(
                "no node could supply binary {}: {}",
                id.hash,
                failures.join("; ")
            )))
        }
    }
}

/// Copies the binary `id` from node `source` to `node`, chunk by chunk.
async fn relay(
    endpoint: &Endpoint,
    source: &NodeStatus,
    id: &BinaryId,
    node: &Connection,
) -> Result<(), LaunchError> {
    let from = endpoint
        .connect(source.address, Some(&source.identity()))
        .await
        .map_err(ClientError::from)?;
    let mut offset = 0;
    loop {
        let read = BinaryRequest::ReadBinary {
            hash: id.hash.clone(),
            offset,
            len: UPLOAD_CHUNK as u64,
        };
        let (total, chunk) = match client::call(&from, read, RequestOptions::bulk()).await? {
            BinaryReply::Chunk { total, chunk } => (total, chunk),
            reply => return Err(UnexpectedReply::new("ReadBinary", reply).into()),
        };
        if chunk.is_empty() {
            return Err(LaunchError::Binary(format!(
                "{} sent an empty chunk at {offset} of {total}",
                source.id
            )));
        }
        let len = chunk.len() as u64;
        upload_chunk(node, id, offset, total, chunk).await?;
        offset += len;
        if offset >= total {
            return Ok(());
        }
    }
}

async fn upload_chunk(
    node: &Connection,
    id: &BinaryId,
    offset: u64,
    total: u64,
    chunk: Vec<u8>,
) -> Result<(), LaunchError> {
    let request = BinaryRequest::UploadBinary {
        hash: id.hash.clone(),
        offset,
        total,
        chunk,
    };
    client::call(node, request, RequestOptions::bulk()).await?;
    Ok(())
}
