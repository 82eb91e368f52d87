//! Spawning actors: placement on a node with the resources, shipping this
//! program's binary there, reserving the name.
//!
//! Placement happens in the spawning process from the head's resource
//! view; the chosen node's manager has the last word (it refuses what it
//! cannot fit), so two spawners never over-commit a node.
//!
//! 1. Reserve the name at the head, if any (unique cluster-wide).
//! 2. Read the head's view; if no node's *total* resources could ever fit
//!    the request, fail at once (`Unsatisfiable`).
//! 3. Ask candidate nodes in order; a node without this binary answers
//!    `NeedBinary` and gets it (8 MiB chunks, SHA-256 checked), a full one
//!    answers `NoCapacity` and the next is tried.
//! 4. When every candidate is full (or unreachable: a node dead but not
//!    yet declared so), wait for a cluster event (an actor died, a node
//!    joined or died) and try again, until the deadline.

use std::time::{Duration, Instant};

use crate::client::{self, ClientError};
use crate::cluster::{
    ActorId, ActorSpec, BinaryId, BundleId, ControlReply, ControlRequest, NodeStatus, ResourceSet,
    CPU, GPU, MEMORY,
};
use crate::placement::{PlacementError, PlacementGroup};
use crate::transport::{Connection, Endpoint, RequestError, RequestOptions};
use crate::wire::Incarnation;

use super::context::ProcessContext;
use super::handle::{ActorHandle, DEFAULT_MAX_IN_FLIGHT};
use super::registry::RemoteActor;
use super::SpawnError;

/// Bytes per binary upload request.
const UPLOAD_CHUNK: usize = 8 << 20;

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

/// How to spawn an actor.
///
/// ```
/// use nimbus::actor::SpawnOptions;
/// let options = SpawnOptions::default().num_cpus(2.0).name("bank").max_restarts(3);
/// ```
#[derive(Clone, Debug)]
pub struct SpawnOptions {
    resources: ResourceSet,
    strategy: Strategy,
    name: Option<String>,
    max_restarts: u32,
    max_in_flight: u32,
    deadline: Duration,
    bundle: Option<BundleId>,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        let mut resources = ResourceSet::default();
        resources.set(CPU, 1.0);
        SpawnOptions {
            resources,
            strategy: Strategy::Any,
            name: None,
            max_restarts: 0,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            deadline: Duration::from_secs(30),
            bundle: None,
        }
    }
}

impl SpawnOptions {
    /// CPUs the actor holds (default 1).
    pub fn num_cpus(mut self, cpus: f64) -> Self {
        self.resources.set(CPU, cpus);
        self
    }

    /// GPUs the actor holds; its worker process sees only those
    /// (`CUDA_VISIBLE_DEVICES`).
    pub fn num_gpus(mut self, gpus: f64) -> Self {
        self.resources.set(GPU, gpus);
        self
    }

    /// Memory the actor holds, in bytes.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.resources.set(MEMORY, bytes as f64);
        self
    }

    /// A custom resource, such as `accelerator_type:H200`.
    pub fn resource(mut self, name: &str, amount: f64) -> Self {
        self.resources.set(name, amount);
        self
    }

    /// Where to place it.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// A cluster-unique name, for [`get_actor`](super::get_actor).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How many times it is re-created after it dies (default 0): by its
    /// node, or, when its node is lost, on another node by the head (unless
    /// it is pinned there by [`Strategy::Node`] or a bundle). A re-created
    /// actor starts again from its arguments.
    pub fn max_restarts(mut self, restarts: u32) -> Self {
        self.max_restarts = restarts;
        self
    }

    /// Calls in flight allowed through one handle before `MailboxFull`.
    pub fn max_in_flight(mut self, limit: u32) -> Self {
        self.max_in_flight = limit.max(1);
        self
    }

    /// Places the actor in bundle `index` of `group`: on that bundle's node,
    /// drawing from the bundle's resources.
    pub fn in_bundle(
        mut self,
        group: &PlacementGroup,
        index: usize,
    ) -> Result<Self, PlacementError> {
        self.bundle = Some(group.bundle(index)?);
        self.strategy = Strategy::Node(group.node(index)?.to_string());
        Ok(self)
    }

    /// What decides where the actor may go: equal keys, interchangeable
    /// placements (the task pool reuses workers by it).
    pub(crate) fn placement_key(&self) -> String {
        format!("{} {:?} {:?}", self.resources, self.strategy, self.bundle)
    }

    /// The resources it asks for.
    pub(crate) fn resources(&self) -> &ResourceSet {
        &self.resources
    }

    /// Where it may go.
    pub(crate) fn placement(&self) -> &Strategy {
        &self.strategy
    }

    /// How long to look for a node with free resources.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// Spawns an `A` built from `args` somewhere in the cluster.
pub async fn spawn<A: RemoteActor>(
    args: A::Args,
    options: SpawnOptions,
) -> Result<ActorHandle<A>, SpawnError> {
    let context = ProcessContext::current().ok_or(SpawnError::NotInitialized)?;
    if !context.registry.has_actor(A::NAME) {
        return Err(SpawnError::NotRegistered(A::NAME));
    }
    let spec = ActorSpec {
        actor: ActorId::random(),
        type_name: A::NAME.to_string(),
        name: options.name.clone(),
        args: rmp_serde::to_vec_named(&args).map_err(|e| SpawnError::Binary(e.to_string()))?,
        resources: options.resources.clone(),
        max_restarts: options.max_restarts,
        restarts: 0,
        node: match &options.strategy {
            Strategy::Node(node) => Some(node.clone()),
            _ => None,
        },
        job: context.job.clone(),
        binary: context.binary.1.clone(),
        bundle: options.bundle,
    };
    if let Some(name) = &spec.name {
        let reserve = ControlRequest::ReserveName {
            name: name.clone(),
            actor: spec.actor,
        };
        if let ControlReply::NameTaken(_) = context.call_head(&reserve).await? {
            return Err(SpawnError::NameTaken(name.clone()));
        }
    }
    let movable = spec.max_restarts > 0 && spec.node.is_none() && spec.bundle.is_none();
    let placed = match movable {
        true => ship_to_head(context).await,
        false => Ok(()),
    };
    let placed = match placed {
        Ok(()) => place(context, &spec, &options).await,
        Err(e) => Err(e),
    };
    if placed.is_err() && spec.name.is_some() {
        let release = ControlRequest::ActorDown {
            actor: spec.actor,
            incarnation: Incarnation(0),
            reason: "spawn failed".into(),
            restarting: false,
        };
        let _ = context.call_head(&release).await;
    }
    placed?;
    Ok(ActorHandle::new(spec.actor, options.max_in_flight))
}

/// Makes sure the head has this program's binary: an actor that may be
/// restarted on another node when its node is lost is restarted by the
/// head, which ships the program to the new node (once per process).
async fn ship_to_head(context: &ProcessContext) -> Result<(), SpawnError> {
    static SHIPPED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SHIPPED
        .get_or_try_init(|| async {
            let head = context.head().await?;
            let id = &context.binary.1;
            let has = ControlRequest::ReadBinary {
                hash: id.hash.clone(),
                offset: 0,
                len: 0,
            };
            match client::call(&head, &has, RequestOptions::control()).await {
                Ok(ControlReply::BinaryChunk { .. }) => Ok(()),
                Ok(reply) => Err(unexpected("ReadBinary", reply)),
                Err(ClientError::Request(RequestError::Remote { .. })) => {
                    let _shipping = upload_lock(context.head).lock_owned().await;
                    let binary = BinarySource::File(context.binary.0.clone());
                    upload(&context.endpoint, &binary, id, &head).await
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
        .map(drop)
}

/// Starts `spec` on some node, per the module docs.
async fn place(
    context: &ProcessContext,
    spec: &ActorSpec,
    options: &SpawnOptions,
) -> Result<(), SpawnError> {
    let needs = spec.resources.to_string();
    let end = Instant::now() + options.deadline;
    let head = context.head().await?;
    let mut seen = client::last_event_seq(&head).await?;
    let mut last = String::from("no node was asked");
    loop {
        let status =
            match client::call(&head, &ControlRequest::Status, RequestOptions::control()).await? {
                ControlReply::Status(status) => status,
                reply => return Err(unexpected("Status", reply)),
            };
        let candidates = candidates(&status.nodes, spec, &options.strategy);
        if candidates.is_empty() {
            let offers: Vec<String> = status
                .alive()
                .map(|n| format!("{} offers {}", n.id, n.resources.total))
                .collect();
            return Err(SpawnError::Unsatisfiable {
                needs,
                detail: if offers.is_empty() {
                    "no node is alive".into()
                } else {
                    offers.join("; ")
                },
            });
        }
        let binary = BinarySource::File(context.binary.0.clone());
        for node in candidates {
            match start_on(&context.endpoint, node, spec, &binary).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(refusal)) => last = refusal,
                // Dead but not yet declared so: the other nodes may do.
                Err(SpawnError::Cluster(e)) => last = format!("node {}: {e}", node.id),
                Err(e) => return Err(e),
            }
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(SpawnError::NoCapacity {
                needs,
                after: options.deadline,
                last,
            });
        }
        let events = client::events(&head, seen, left).await?;
        seen = events.last().map_or(seen, |e| e.seq);
    }
}

/// Alive nodes whose totals fit the request, best first.
pub(crate) fn candidates<'a>(
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
pub(crate) enum BinarySource {
    /// This file (the spawning program itself).
    File(std::path::PathBuf),
    /// Whichever of these nodes has it (the head restarting an actor whose
    /// node was lost: the program is on the nodes that ran it).
    Nodes(Vec<NodeStatus>),
}

/// Asks `node` to start the actor, shipping the binary if it asks for it.
/// `Ok(Err(refusal))`: the node is full.
pub(crate) async fn start_on(
    endpoint: &Endpoint,
    node: &NodeStatus,
    spec: &ActorSpec,
    binary: &BinarySource,
) -> Result<Result<(), String>, SpawnError> {
    let connection = endpoint
        .connect(node.address, Some(&node.identity()))
        .await
        .map_err(ClientError::from)?;
    let start = ControlRequest::StartActor(spec.clone());
    let options = RequestOptions::control().with_deadline(Duration::from_secs(60));
    // Spawns from this process ship the binary to a node one at a time: the
    // first uploads, the others then find it there. (Concurrent uploads of
    // one file would race each other, and a node cannot execute a binary
    // another upload still holds open for writing: ETXTBSY.)
    let lock = upload_lock(node.address);
    let mut shipping = None;
    for _ in 0..3 {
        let reply = match client::call(&connection, &start, options).await {
            Ok(reply) => reply,
            Err(ClientError::Request(RequestError::Remote { error, .. })) => {
                return Err(SpawnError::Start {
                    node: node.id.clone(),
                    detail: error.message,
                })
            }
            Err(e) => return Err(e.into()),
        };
        match reply {
            ControlReply::ActorStarted(_) => return Ok(Ok(())),
            ControlReply::NoCapacity(refusal) => return Ok(Err(refusal)),
            ControlReply::NeedBinary if shipping.is_none() => {
                // Ask again once holding the lock: another spawn may have
                // shipped it meanwhile.
                shipping = Some(lock.clone().lock_owned().await);
            }
            ControlReply::NeedBinary => upload(endpoint, binary, &spec.binary, &connection).await?,
            reply => return Err(unexpected("StartActor", reply)),
        }
    }
    Err(SpawnError::Start {
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
) -> Result<(), SpawnError> {
    match source {
        BinarySource::File(path) => {
            let bytes = tokio::fs::read(path)
                .await
                .map_err(|e| SpawnError::Binary(format!("{}: {e}", path.display())))?;
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
            Err(SpawnError::Binary(format!(
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
) -> Result<(), SpawnError> {
    let from = endpoint
        .connect(source.address, Some(&source.identity()))
        .await
        .map_err(ClientError::from)?;
    let mut offset = 0;
    loop {
        let read = ControlRequest::ReadBinary {
            hash: id.hash.clone(),
            offset,
            len: UPLOAD_CHUNK as u64,
        };
        let (total, chunk) = match client::call(&from, &read, RequestOptions::bulk()).await? {
            ControlReply::BinaryChunk { total, chunk } => (total, chunk),
            reply => return Err(unexpected("ReadBinary", reply)),
        };
        if chunk.is_empty() {
            return Err(SpawnError::Binary(format!(
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
) -> Result<(), SpawnError> {
    let request = ControlRequest::UploadBinary {
        hash: id.hash.clone(),
        offset,
        total,
        chunk,
    };
    client::call(node, &request, RequestOptions::bulk()).await?;
    Ok(())
}

fn unexpected(request: &'static str, reply: ControlReply) -> SpawnError {
    SpawnError::Cluster(ClientError::UnexpectedReply {
        request,
        reply: Box::new(reply),
    })
}
