//! Spawning actors: placement on a node with the resources, reserving the
//! name; starting it there (and shipping the binary) is
//! [`crate::launch`]'s.
//!
//! Placement happens in the spawning process from the head's resource
//! view; the chosen node's manager has the last word (it refuses what it
//! cannot fit), so two spawners never over-commit a node.
//!
//! 1. Reserve the name at the head's directory, if any (unique
//!    cluster-wide; `NameTaken` if a live actor has it).
//! 2. An actor that may restart on another node (`max_restarts` > 0, not
//!    pinned to a node or a bundle) needs its program where the head can
//!    find it: make sure the head has this binary (`launch::ship_to_head`).
//! 3. Read the head's view; if no alive node's *total* resources could
//!    ever fit the request, fail at once (`Unsatisfiable`; `NoSuchNode`
//!    when it is pinned to a name no node has), unless the cluster has an
//!    autoscaler with a node type that fits (`ClusterStatus::autoscaler`):
//!    then wait as in step 5.
//! 4. Ask candidate nodes in order (`StartActor`); a node without this
//!    binary answers `NeedBinary` and gets it (8 MiB chunks, SHA-256
//!    checked, cached by hash), a full one answers `NoCapacity` and the
//!    next is tried. The node that starts it reports `ActorUp` (record and
//!    spec) to the directory and its new resource use to the membership
//!    (a heartbeat, so the next spawn's view includes this actor) before it
//!    answers `ActorStarted`.
//! 5. When every candidate is full (or unreachable: a node dead but not
//!    yet declared so), tell the head the spawn waits (`Waiting`, once:
//!    `nimbus status` lists pending demands), wait for a cluster event (an
//!    actor died, a node joined or died, resources changed) and try again,
//!    until the deadline (30 s by default; then `NoCapacity`). Then tell
//!    the head it stopped waiting (`Placed`).
//!
//! A spawn that fails after reserving the name releases it (`ActorDown`
//! with `SpawnFailed`). An actor spawned from another actor's worker
//! process (not a task's) is owned by that incarnation and dies with it,
//! unless detached or `survives_spawner` (Ray's fate sharing:
//! `crate::node`'s `manager/owners.rs`); a driver's actors end with its
//! job. The handle returned is the actor's id; where it
//! runs is asked of the head on first use (`handle.rs`).

use std::time::{Duration, Instant};

use crate::cluster::{
    ActorId, ActorSpec, BundleId, DirectoryReply, MembershipReply, ResourceSet, UnexpectedReply,
    CPU, GPU, MEMORY,
};
use crate::cluster::{DirectoryRequest, MembershipRequest};
use crate::launch::{
    candidates, ship_to_head, start_on, BinarySource, LaunchError, Started, Strategy,
};
use crate::runtime::{ProcessContext, RemoteActor};
use crate::wire::Incarnation;

use super::handle::{ActorHandle, DEFAULT_MAX_IN_FLIGHT};
use super::SpawnError;

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
    detached: bool,
    shared: bool,
    survives_spawner: bool,
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
            detached: false,
            shared: false,
            survives_spawner: false,
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

    /// The actor outlives its job (Ray's `lifetime="detached"`): it is not
    /// killed when its driver is gone (`crate::head::jobs`), nor with the
    /// actor that spawned it. Kill it yourself (`ActorHandle::kill`,
    /// `nimbus kill`).
    pub fn detached(mut self) -> Self {
        self.detached = true;
        self
    }

    /// The actor does not die with the actor that spawned it (it still
    /// ends with its job, or when killed): for actors a spawner keeps
    /// track of and stops itself, and that should serve on if it fails,
    /// as Serve's replicas do.
    pub fn survives_spawner(mut self) -> Self {
        self.survives_spawner = true;
        self
    }

    /// Other jobs' actors may find it by name ([`get_actor`](super::get_actor))
    /// and call it: an explicit grant, as Ray's shared namespace is (a
    /// detached parameter server, a model other jobs query). Without it
    /// only its own job's actors reach it; drivers and the CLI reach any.
    /// Objects stay their job's: pass values, not `ObjectRef`s, across jobs.
    pub fn shared(mut self) -> Self {
        self.shared = true;
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

    /// Places the actor in `bundle`, reserved on `node`: it draws from the
    /// bundle's resources. (Users write `options.in_bundle(&group, index)`,
    /// from [`InBundle`](crate::placement::InBundle).)
    pub fn bundle(mut self, bundle: BundleId, node: impl Into<String>) -> Self {
        self.bundle = Some(bundle);
        self.strategy = Strategy::Node(node.into());
        self
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
    options.resources.validate()?;
    let (args, transits) = crate::runtime::transits::encoding(|| rmp_serde::to_vec_named(&args));
    let args = args.map_err(|e| SpawnError::EncodeArgs(e.to_string()))?;
    if let Some(delivered) = transits.delivered() {
        delivered.await;
    }
    let spec = ActorSpec {
        actor: ActorId::random(),
        type_name: A::NAME.to_string(),
        name: options.name.clone(),
        args,
        resources: options.resources.clone(),
        max_restarts: options.max_restarts,
        restarts: 0,
        node: match &options.strategy {
            Strategy::Node(node) => Some(node.clone()),
            _ => None,
        },
        job: context.job.clone(),
        detached: options.detached,
        shared: options.shared,
        binary: context.binary.1.clone(),
        bundle: options.bundle,
        owner: context
            .owner
            .filter(|_| !options.detached && !options.survives_spawner),
    };
    if let Some(name) = &spec.name {
        let reserve = DirectoryRequest::ReserveName {
            name: name.clone(),
            actor: spec.actor,
        };
        if let DirectoryReply::NameTaken(_) = context.call_head(reserve).await? {
            return Err(SpawnError::NameTaken(name.clone()));
        }
    }
    let movable = spec.max_restarts > 0 && spec.node.is_none() && spec.bundle.is_none();
    let placed = match movable {
        true => ship_to_head(&context.endpoint, context.head, &context.binary)
            .await
            .map_err(SpawnError::from),
        false => Ok(()),
    };
    let placed = match placed {
        Ok(()) => place(context, &spec, &options).await,
        Err(e) => Err(e),
    };
    if placed.is_err() && spec.name.is_some() {
        let release = DirectoryRequest::ActorDown {
            actor: spec.actor,
            incarnation: Incarnation(0),
            reason: crate::cluster::DeathCause::SpawnFailed,
            restarting: false,
        };
        let _ = context.call_head(release).await;
    }
    placed?;
    Ok(ActorHandle::new(spec.actor, options.max_in_flight))
}

/// Starts `spec` on some node, per the module docs; a spawn that waited
/// for room tells the head when it ends (step 5).
async fn place(
    context: &ProcessContext,
    spec: &ActorSpec,
    options: &SpawnOptions,
) -> Result<(), SpawnError> {
    let mut waited = false;
    let placed = try_nodes(context, spec, options, &mut waited).await;
    if waited {
        let placed = DirectoryRequest::Placed(spec.actor);
        if let Err(e) = context.call_head(placed).await {
            tracing::debug!(actor = %spec.actor, "cannot tell the head the spawn stopped waiting: {e}");
        }
    }
    placed
}

/// Steps 3-5: asks the candidates until one starts `spec`; `waited` says
/// whether the head was told it waits for room.
async fn try_nodes(
    context: &ProcessContext,
    spec: &ActorSpec,
    options: &SpawnOptions,
    waited: &mut bool,
) -> Result<(), SpawnError> {
    let needs = spec.resources.to_string();
    let end = Instant::now() + options.deadline;
    // The head's requests below wait for a restarting head (up to its
    // grace) instead of failing the spawn.
    let mut seen = context.last_event().await?;
    let mut last = String::from("no node was asked");
    loop {
        let status = match context.call_head(MembershipRequest::Status).await? {
            MembershipReply::Status(status) => status,
            reply => return Err(UnexpectedReply::new("Status", reply).into()),
        };
        let candidates = candidates(&status.nodes, spec, &options.strategy);
        if candidates.is_empty() {
            // No node fits; a node type of the autoscaler may (step 3).
            last = SpawnError::unless_autoscaled(
                &status,
                (needs.clone(), &spec.resources),
                &options.strategy,
            )?;
        }
        let binary = BinarySource::File(context.binary.0.clone());
        for node in candidates {
            match start_on(&context.endpoint, node, spec, &binary).await {
                Ok(Started::Running) => return Ok(()),
                Ok(Started::Full(refusal)) => last = refusal,
                // Dead but not yet declared so: the other nodes may do.
                Err(LaunchError::Cluster(e)) => last = format!("node {}: {e}", node.id),
                Err(e) => return Err(e.into()),
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
        if !*waited {
            let waiting = DirectoryRequest::Waiting {
                actor: spec.actor,
                class: spec.type_name.clone(),
                resources: spec.resources.clone(),
                job: spec.job.clone(),
                for_ms: left.as_millis() as u64,
                node: match &options.strategy {
                    Strategy::Node(node) => Some(node.clone()),
                    Strategy::Any | Strategy::Spread => None,
                },
            };
            *waited = context.call_head(waiting).await.is_ok();
        }
        let events = context.events(seen, left).await?;
        seen = events.last().map_or(seen, |e| e.seq);
    }
}
