//! Starting and stopping an attempt's workers: placement, spawning, ranks,
//! the collective group, and teardown.
//!
//! Launching one attempt, in phases (see `launch`):
//! 1. The worker counts to try, largest first (a fixed count, or an elastic
//!    range from its maximum down to its minimum), and the checkpoint to
//!    resume from, verified.
//! 2. Local mode (0 workers): the loop on a thread of the driver, done.
//! 3. Reserve a placement group of one bundle per worker
//!    (`resources_per_worker`, plus `GPU: 1` with `use_gpu`): each count but
//!    the last gets `ELASTIC_TRY` (2 s) before a smaller one is tried, the
//!    last the run's placement timeout.
//! 4. Spawn a `TrainerWorker` into each bundle (`max_restarts` 0: the
//!    supervisor, not the node, restarts).
//! 5. Number the ranks in bundle order (`node_rank` by first appearance of
//!    a node, `local_rank` within it); choose the collective (`Auto`: NCCL
//!    with `use_gpu`, else shared memory when every worker is on one host
//!    and there are at most `MAX_WORLD`, else the network; shared memory
//!    asked for across hosts is refused); describe its group: a segment
//!    path in the job's shared-memory directory (which only the job's
//!    workers see: `nimbus::library::job_shared_memory`) with
//!    `BUCKET_BYTES` (4 MiB) per rank slot, the
//!    peers' handles for the network ring, or for NCCL the unique id rank 0
//!    makes (`NcclUniqueId`).
//! 6. `StartTraining(Assignment)` on every rank: the loop's name and
//!    serialized config, its ranks, the group, the checkpoint to resume
//!    from, the run directory, the attempt number and its generation
//!    (which the supervisor claimed the run directory for just before:
//!    `checkpoint/fence.rs`), its libtorch threads
//!    (its CPUs), its fault rules, and the driver's libtorch: a worker that
//!    loaded another release or CUDA build refuses, and the run stops
//!    (`TrainError::OtherLibtorch`, naming the rank, its node and both).
//!
//! A failure after step 3 stops the workers started and frees the group.
//! Teardown (`stop_workers`): each worker gets `AbortTraining`, then
//! `kill` (which returns once the head has recorded its death, or fails
//! after 10 s); a local loop is aborted and awaited for at most
//! `DEATH_WAIT` (10 s); then the group is removed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;

use super::{RunPlan, WorkerLink, POLL_WAIT};
use crate::checkpoint;
use crate::collective::{SoloGroup, MAX_WORLD};
use crate::context::Ranks;
use crate::faults::TrainingFault;
use crate::progress::Progress;
use crate::worker::{
    self, AbortTraining, Assignment, GroupSpec, NcclUniqueId, StartTraining, TrainerWorker,
};
use crate::{CollectiveBackend, LoopFailed, TrainError, WorkerCount, WorkerRefusal};
use nimbus::actor::{self, ActorHandle, SpawnOptions};
use nimbus::cluster::Torch;
use nimbus::placement::{InBundle, PlacementGroup};

/// Bytes per rank slot of the shared-memory group: the allreduce bucket.
const BUCKET_BYTES: usize = 4 << 20;
/// How long teardown waits for a killed worker's death to be reported.
const DEATH_WAIT: Duration = Duration::from_secs(10);
/// How long an elastic run waits for a larger group before trying a smaller.
pub(super) const ELASTIC_TRY: Duration = Duration::from_secs(2);

/// A started attempt.
pub(super) struct Launched {
    pub(super) links: Vec<WorkerLink>,
    pub(super) group: Option<PlacementGroup>,
    pub(super) world_size: usize,
    pub(super) seen_events: u64,
    /// The collective the workers use (`None`: local mode).
    pub(super) backend: Option<CollectiveBackend>,
    /// The node of each rank.
    pub(super) nodes: Vec<String>,
    /// What every rank was told, but its ranks and faults (a replacement
    /// is told the same, `heal.rs`).
    pub(super) assignment: Assignment,
}

/// Places, spawns and starts one attempt's workers, in phases:
/// 1. the worker counts to try ([`worker_counts`]) and the checkpoint to
///    resume from, checked;
/// 2. local mode (no workers): the loop on a thread here, done;
/// 3. reserve a placement group of the most workers that fit
///    ([`reserve`]);
/// 4. spawn a `TrainerWorker` into each bundle ([`spawn_workers`]);
/// 5. number the ranks by bundle order ([`rank_layout`]), choose the
///    collective ([`choose_backend`]) and describe its group
///    ([`group_spec`]);
/// 6. `StartTraining` on every rank ([`start_ranks`]).
///
/// A failure after step 3 stops the workers started and frees the group.
pub(super) async fn launch(
    plan: Arc<RunPlan>,
    id: u64,
    (attempt, generation): (u32, u64),
    resume: Option<PathBuf>,
    faults: Vec<TrainingFault>,
) -> Result<Launched, TrainError> {
    let counts = worker_counts(plan.scaling.workers)?;
    if let Some(path) = &resume {
        checkpoint::verify(path).map_err(|source| TrainError::Resume {
            path: path.clone(),
            source,
        })?;
    }
    let mut assignment = first_assignment(&plan, resume, (attempt, generation));
    if counts == [0] {
        assignment.faults = faults_of(&faults, 0);
        return Ok(launch_local(&plan, assignment));
    }
    let seen_events = nimbus::library::last_event().await?;
    let group = reserve(&plan, &counts).await?;
    let (handles, spawn_error) = spawn_workers(&plan, &group).await;
    let links: Vec<WorkerLink> = handles.iter().cloned().map(WorkerLink::Remote).collect();
    if let Some(e) = spawn_error {
        stop_workers(links, Some(group), "could not start".into()).await;
        return Err(e);
    }
    let n = group.len();
    let nodes: Vec<String> = (0..n)
        .map(|i| group.node(i).unwrap_or_default().to_string())
        .collect();
    let hosts = group_hosts(&group);
    let gpus = plan
        .scaling
        .use_gpu
        .then(|| plan.scaling.bundle().amount(nimbus::cluster::GPU));
    let backend = match choose_backend(plan.scaling.collective, gpus, hosts, n) {
        Ok(backend) => backend,
        Err(e) => {
            stop_workers(links, Some(group), "unsupported".into()).await;
            return Err(e);
        }
    };
    if let (Some(gpus), false) = (gpus, backend == CollectiveBackend::Nccl) {
        tracing::info!(
            "the {n} GPU workers hold {gpus} GPU each and allreduce through the {backend:?} collective (gradients copied to the host and back){}",
            if plan.scaling.collective == CollectiveBackend::Auto {
                ": NCCL refuses two ranks on one device"
            } else {
                ""
            }
        );
    }
    let spec = group_spec(backend, &plan, id, &handles, &nodes, &assignment).await;
    assignment.group = match spec {
        Ok(spec) => Some(spec),
        Err(e) => {
            stop_workers(links, Some(group), "no collective group".into()).await;
            return Err(e);
        }
    };
    if let Err(e) = start_ranks(&handles, &assignment, &nodes, &faults).await {
        stop_workers(links, Some(group), "could not start".into()).await;
        return Err(e);
    }
    Ok(Launched {
        links,
        group: Some(group),
        world_size: n,
        seen_events,
        backend: Some(backend),
        nodes,
        assignment,
    })
}

/// The worker counts to try, largest first: the fixed count, or an elastic
/// range from `max` down to `min` (at least 1).
fn worker_counts(workers: WorkerCount) -> Result<Vec<usize>, TrainError> {
    match workers {
        WorkerCount::Fixed(n) => Ok(vec![n]),
        WorkerCount::Elastic { min, max } if min <= max && max > 0 => {
            Ok((min.max(1)..=max).rev().collect())
        }
        WorkerCount::Elastic { min, max } => Err(TrainError::Config(format!(
            "elastic worker range {min}..={max} is empty"
        ))),
    }
}

/// What every rank is told, before its rank, group and faults are known.
fn first_assignment(
    plan: &RunPlan,
    resume: Option<PathBuf>,
    (attempt, generation): (u32, u64),
) -> Assignment {
    Assignment {
        loop_name: plan.loop_name.to_string(),
        config: plan.config.clone(),
        ranks: Ranks {
            world_size: 1,
            world_rank: 0,
            local_rank: 0,
            node_rank: 0,
        },
        group: None,
        resume,
        run_dir: plan.run.run_dir(),
        use_gpu: plan.scaling.use_gpu,
        threads: plan
            .scaling
            .resources_per_worker
            .amount(nimbus::cluster::CPU)
            .floor()
            .max(1.0) as usize,
        attempt,
        generation,
        faults: Vec::new(),
        libtorch: Torch::loaded(),
        heal: None,
    }
}

/// The fault rules of rank `rank`.
pub(super) fn faults_of(faults: &[TrainingFault], rank: usize) -> Vec<TrainingFault> {
    faults.iter().filter(|f| f.rank == rank).cloned().collect()
}

/// A placement group for the most workers of `counts` that fit: each count
/// but the last gets [`ELASTIC_TRY`], the last the run's placement timeout.
async fn reserve(plan: &RunPlan, counts: &[usize]) -> Result<PlacementGroup, TrainError> {
    let bundle = plan.scaling.bundle();
    for (i, &n) in counts.iter().enumerate() {
        let last = i + 1 == counts.len();
        let deadline = if last {
            plan.run.placement_timeout
        } else {
            ELASTIC_TRY
        };
        match PlacementGroup::create(vec![bundle.clone(); n], plan.scaling.placement, deadline)
            .await
        {
            Ok(group) => return Ok(group),
            Err(e) if last => return Err(e.into()),
            Err(e) => tracing::info!(workers = n, "elastic run: {e}; trying fewer workers"),
        }
    }
    Err(TrainError::Config("no worker count to try".into()))
}

/// A `TrainerWorker` in each bundle of `group`, in bundle order: the
/// workers that started, and the first error if any did not (the caller
/// stops the others).
async fn spawn_workers(
    plan: &RunPlan,
    group: &PlacementGroup,
) -> (Vec<ActorHandle<TrainerWorker>>, Option<TrainError>) {
    let mut spawns = Vec::new();
    for index in 0..group.len() {
        match spawn_options(plan, group, index) {
            Ok(options) => spawns.push(actor::spawn::<TrainerWorker>((), options)),
            Err(e) => return (Vec::new(), Some(e)),
        }
    }
    let mut handles = Vec::new();
    let mut spawn_error = None;
    for result in join_all(spawns).await {
        match result {
            Ok(handle) => handles.push(handle),
            Err(e) => spawn_error = spawn_error.or(Some(e.into())),
        }
    }
    (handles, spawn_error)
}

/// How a `TrainerWorker` is spawned into bundle `index` of `group`: the
/// bundle's resources, no restart by its node (the supervisor restarts).
pub(super) fn spawn_options(
    plan: &RunPlan,
    group: &PlacementGroup,
    index: usize,
) -> Result<SpawnOptions, TrainError> {
    let mut options = SpawnOptions::default().max_restarts(0);
    for (name, amount) in plan.scaling.bundle().iter() {
        options = options.resource(name, amount);
    }
    Ok(options.in_bundle(group, index)?)
}

/// The ranks of workers on `nodes` (one entry per rank, in bundle order):
/// world ranks follow bundle order, nodes are numbered in order of first
/// appearance, and a rank's local rank counts the ranks before it on its
/// node.
pub(super) fn rank_layout(nodes: &[String]) -> Vec<Ranks> {
    let mut order: Vec<&str> = Vec::new();
    for node in nodes {
        if !order.contains(&node.as_str()) {
            order.push(node);
        }
    }
    (0..nodes.len())
        .map(|rank| Ranks {
            world_size: nodes.len(),
            world_rank: rank,
            local_rank: nodes[..rank].iter().filter(|m| **m == nodes[rank]).count(),
            node_rank: order.iter().position(|m| *m == nodes[rank]).unwrap_or(0),
        })
        .collect()
}

/// The collective for `n` workers on `hosts` hosts, each holding `gpus`
/// GPUs (`None`: CPU workers): `Auto` is NCCL for GPU workers that each
/// hold whole GPUs of their own, else shared memory on one host (up to
/// [`MAX_WORLD`] ranks), else the network. Workers sharing a GPU
/// (a fraction each) never get NCCL from `Auto`: it refuses two ranks on
/// one device ("Duplicate GPU detected"); they allreduce on the host
/// (device↔host copies). Shared memory asked for across hosts is refused.
fn choose_backend(
    requested: CollectiveBackend,
    gpus: Option<f64>,
    hosts: usize,
    n: usize,
) -> Result<CollectiveBackend, TrainError> {
    let one_host = hosts == 1 && n <= MAX_WORLD;
    let own_devices = gpus.is_some_and(|gpus| gpus >= 1.0);
    match requested {
        CollectiveBackend::Auto if own_devices => Ok(CollectiveBackend::Nccl),
        CollectiveBackend::Auto if one_host => Ok(CollectiveBackend::SharedMemory),
        CollectiveBackend::Auto => Ok(CollectiveBackend::Network),
        CollectiveBackend::SharedMemory if !one_host => Err(TrainError::Config(format!(
            "the shared-memory collective needs every worker on one host (and at most {MAX_WORLD}); these {n} landed on {hosts} hosts"
        ))),
        chosen => Ok(chosen),
    }
}

/// The group the ranks (on `nodes`) form for `backend`. NCCL asks rank 0
/// for the communicator's id: a program or machine without NCCL, or a
/// rank 0 that loaded another libtorch than the driver's, fails here,
/// clearly and for good.
async fn group_spec(
    backend: CollectiveBackend,
    plan: &RunPlan,
    id: u64,
    handles: &[ActorHandle<TrainerWorker>],
    nodes: &[String],
    assignment: &Assignment,
) -> Result<GroupSpec, TrainError> {
    let timeout_ms = plan.run.collective_timeout.as_millis() as u64;
    Ok(match backend {
        CollectiveBackend::Nccl => {
            let Some(rank_0) = handles.first() else {
                return Err(TrainError::Mismatch("an NCCL group needs a worker"));
            };
            let asked = NcclUniqueId {
                libtorch: assignment.libtorch.clone(),
                nccl: plan.scaling.nccl.clone(),
            };
            let id = rank_0
                .send_with_deadline(asked, super::WORKER_CALL_DEADLINE)
                .await?
                .map_err(|e| match e {
                    WorkerRefusal::OtherLibtorch { .. } => refused(0, nodes, e),
                    e => TrainError::Nccl(format!("rank 0 cannot make the group's id: {e}")),
                })?;
            GroupSpec::Nccl {
                id,
                timeout_ms,
                nccl: plan.scaling.nccl.clone(),
            }
        }
        CollectiveBackend::Network => GroupSpec::Network {
            peers: handles.to_vec(),
            timeout_ms,
        },
        CollectiveBackend::SharedMemory | CollectiveBackend::Auto => shared_memory_group(plan, id),
    })
}

/// A new shared-memory group for attempt `id`: a fresh segment name.
pub(super) fn shared_memory_group(plan: &RunPlan, id: u64) -> GroupSpec {
    GroupSpec::SharedMemory {
        path: nimbus::library::job_shared_memory().join(format!(
            "nimbus-train-{}-{id}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        )),
        capacity: BUCKET_BYTES,
        timeout_ms: plan.run.collective_timeout.as_millis() as u64,
    }
}

/// `StartTraining` on every rank (on `nodes`, in rank order), each with
/// its ranks and its faults; the first refusal, if any.
async fn start_ranks(
    handles: &[ActorHandle<TrainerWorker>],
    assignment: &Assignment,
    nodes: &[String],
    faults: &[TrainingFault],
) -> Result<(), TrainError> {
    let layout = rank_layout(nodes);
    let starts = handles.iter().zip(&layout).map(|(handle, ranks)| {
        let mut assignment = assignment.clone();
        assignment.ranks = *ranks;
        assignment.faults = faults_of(faults, ranks.world_rank);
        handle.send_with_deadline(StartTraining(assignment), super::WORKER_CALL_DEADLINE)
    });
    let started = join_all(starts).await;
    let failure = started
        .into_iter()
        .enumerate()
        .find_map(|(rank, r)| match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(refused(rank, nodes, e)),
            Err(e) => Some(TrainError::WorkerFailed {
                rank,
                reason: e.to_string(),
            }),
        });
    failure.map_or(Ok(()), Err)
}

/// The error of rank `rank`'s (on `nodes`) refusal: another libtorch than
/// the driver's stops the run; anything else fails the attempt.
fn refused(rank: usize, nodes: &[String], refusal: WorkerRefusal) -> TrainError {
    match refusal {
        WorkerRefusal::OtherLibtorch { worker, driver } => TrainError::OtherLibtorch {
            rank,
            node: nodes.get(rank).cloned().unwrap_or_default(),
            worker,
            driver,
        },
        e => TrainError::WorkerFailed {
            rank,
            reason: e.to_string(),
        },
    }
}

/// Local mode: the loop on a thread of this (the driver) process.
fn launch_local(plan: &RunPlan, assignment: Assignment) -> Launched {
    let progress = Arc::new(Progress::default());
    let run = plan.local.clone();
    let thread_progress = progress.clone();
    let template = assignment.clone();
    let runtime = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        let outcome = worker::run_loop(
            &run,
            &assignment,
            Box::new(SoloGroup),
            (thread_progress.clone(), None),
            runtime,
        );
        thread_progress.finish(outcome.map_err(|e| LoopFailed(e.to_string())));
    });
    Launched {
        links: vec![WorkerLink::Local(progress)],
        group: None,
        world_size: 0,
        seen_events: 0,
        backend: None,
        nodes: Vec::new(),
        assignment: template,
    }
}

/// Aborts, kills and waits for every worker, then releases the group.
pub(super) async fn stop_workers(
    links: Vec<WorkerLink>,
    group: Option<PlacementGroup>,
    reason: String,
) {
    let stops = links.into_iter().map(|link| {
        let reason = reason.clone();
        async move {
            match link {
                WorkerLink::Local(progress) => {
                    progress.abort(&reason);
                    // The loop stops at its next report; wait for it.
                    let end = Instant::now() + DEATH_WAIT;
                    let mut after = 0;
                    while Instant::now() < end {
                        let report = progress.poll(after, POLL_WAIT).await;
                        after += report.events.len() as u64;
                        if report.finished.is_some() {
                            break;
                        }
                    }
                }
                WorkerLink::Remote(handle) => {
                    let _ = handle.do_send(AbortTraining { reason });
                    // Returns once the death is recorded (or fails after a
                    // deadline), so the group's resources are free again.
                    if let Err(e) = handle.kill().await {
                        tracing::warn!(actor = %handle.id(), "cannot kill training worker: {e}");
                    }
                }
            }
        }
    });
    join_all(stops).await;
    if let Some(group) = group {
        if let Err(e) = group.remove().await {
            tracing::warn!("cannot remove the training placement group: {e}");
        }
    }
}

/// Number of distinct hosts (IP addresses) the group's nodes are on.
fn group_hosts(group: &PlacementGroup) -> usize {
    let mut ips: Vec<std::net::IpAddr> = (0..group.len())
        .filter_map(|i| group.address(i).ok().map(|a| a.ip()))
        .collect();
    ips.sort();
    ips.dedup();
    ips.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_bundle_order_and_nodes_their_first_appearance() {
        let nodes: Vec<String> = ["b", "a", "b", "c", "a"].map(String::from).to_vec();
        let layout: Vec<(usize, usize, usize)> = rank_layout(&nodes)
            .iter()
            .map(|r| (r.world_rank, r.local_rank, r.node_rank))
            .collect();
        assert_eq!(
            layout,
            [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 0, 2), (4, 1, 1)]
        );
        assert!(rank_layout(&nodes).iter().all(|r| r.world_size == 5));
    }

    #[test]
    fn auto_picks_nccl_for_whole_gpus_shared_memory_on_one_host_else_the_network() {
        use CollectiveBackend::*;
        let pick = |requested, gpus, hosts, n| choose_backend(requested, gpus, hosts, n).ok();
        assert_eq!(pick(Auto, Some(1.0), 1, 2), Some(Nccl));
        assert_eq!(pick(Auto, Some(2.0), 2, 2), Some(Nccl));
        // Two ranks may share a device: NCCL would refuse them.
        assert_eq!(pick(Auto, Some(0.5), 1, 2), Some(SharedMemory));
        assert_eq!(pick(Auto, Some(0.5), 2, 2), Some(Network));
        assert_eq!(pick(Nccl, Some(0.5), 1, 2), Some(Nccl), "asked for: kept");
        assert_eq!(pick(Auto, None, 1, 2), Some(SharedMemory));
        assert_eq!(pick(Auto, None, 1, MAX_WORLD + 1), Some(Network));
        assert_eq!(pick(Auto, None, 2, 2), Some(Network));
        assert_eq!(pick(Network, None, 1, 2), Some(Network));
        assert_eq!(pick(SharedMemory, None, 2, 2), None);
    }

    #[test]
    fn elastic_counts_go_from_max_down_to_min() {
        let counts = |workers| worker_counts(workers).ok();
        assert_eq!(counts(WorkerCount::Fixed(3)), Some(vec![3]));
        assert_eq!(
            counts(WorkerCount::Elastic { min: 0, max: 3 }),
            Some(vec![3, 2, 1])
        );
        assert_eq!(counts(WorkerCount::Elastic { min: 3, max: 2 }), None);
    }
}
