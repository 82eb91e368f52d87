//! Starting and stopping an attempt's workers: placement, spawning, ranks,
//! the collective group, and teardown.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;

use super::{RunPlan, WorkerLink, POLL_WAIT};
use crate::actor::{self, ProcessContext, SpawnOptions};
use crate::placement::{InBundle, PlacementGroup};
use crate::train::checkpoint;
use crate::train::collective::{SoloGroup, MAX_WORLD};
use crate::train::context::Ranks;
use crate::train::faults::TrainingFault;
use crate::train::progress::Progress;
use crate::train::worker::{
    self, AbortTraining, Assignment, GroupSpec, NcclUniqueId, StartTraining, TrainerWorker,
};
use crate::train::{CollectiveBackend, LoopFailed, TrainError, WorkerCount};

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
}

/// Places, spawns and starts one attempt's workers.
pub(super) async fn launch(
    plan: Arc<RunPlan>,
    id: u64,
    attempt: u32,
    resume: Option<PathBuf>,
    faults: Vec<TrainingFault>,
) -> Result<Launched, TrainError> {
    let counts: Vec<usize> = match plan.scaling.workers {
        WorkerCount::Fixed(n) => vec![n],
        WorkerCount::Elastic { min, max } if min <= max && max > 0 => {
            (min.max(1)..=max).rev().collect()
        }
        WorkerCount::Elastic { min, max } => {
            return Err(TrainError::Config(format!(
                "elastic worker range {min}..={max} is empty"
            )))
        }
    };
    if let Some(path) = &resume {
        checkpoint::verify(path).map_err(|e| TrainError::Config(format!("cannot resume: {e}")))?;
    }
    let mut assignment = Assignment {
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
            .amount(crate::cluster::CPU)
            .floor()
            .max(1.0) as usize,
        attempt,
        faults: Vec::new(),
    };
    let faults_of = |rank: usize| -> Vec<TrainingFault> {
        faults.iter().filter(|f| f.rank == rank).cloned().collect()
    };
    if counts == [0] {
        assignment.faults = faults_of(0);
        return Ok(launch_local(&plan, assignment));
    }
    let context = ProcessContext::current()
        .ok_or_else(|| TrainError::Config("nimbus is not initialised in this process".into()))?;
    let seen_events = context
        .last_event()
        .await
        .map_err(|e| TrainError::Call(e.into()))?;
    let bundle = plan.scaling.bundle();
    let mut group = None;
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
            Ok(placed) => {
                group = Some(placed);
                break;
            }
            Err(e) if last => return Err(e.into()),
            Err(e) => tracing::info!(workers = n, "elastic run: {e}; trying fewer workers"),
        }
    }
    let group = group.ok_or_else(|| TrainError::Config("no worker count to try".into()))?;
    let n = group.len();
    let mut spawns = Vec::new();
    for index in 0..n {
        let mut options = SpawnOptions::default().max_restarts(0);
        for (name, amount) in bundle.iter() {
            options = options.resource(name, amount);
        }
        let options = options.in_bundle(&group, index)?;
        spawns.push(actor::spawn::<TrainerWorker>((), options));
    }
    let spawned = join_all(spawns).await;
    let mut handles = Vec::new();
    let mut spawn_error = None;
    for result in spawned {
        match result {
            Ok(handle) => handles.push(handle),
            Err(e) => spawn_error = spawn_error.or(Some(e)),
        }
    }
    let links: Vec<WorkerLink> = handles.iter().cloned().map(WorkerLink::Remote).collect();
    if let Some(e) = spawn_error {
        stop_workers(links, Some(group), "could not start".into()).await;
        return Err(e.into());
    }
    // Ranks follow bundle order; nodes are numbered in order of appearance.
    let nodes: Vec<String> = (0..n)
        .map(|i| group.node(i).unwrap_or_default().to_string())
        .collect();
    let mut order: Vec<&str> = Vec::new();
    for node in &nodes {
        if !order.contains(&node.as_str()) {
            order.push(node);
        }
    }
    let hosts = group_hosts(&group);
    let timeout_ms = plan.run.collective_timeout.as_millis() as u64;
    let shared_memory = GroupSpec::SharedMemory {
        path: shm_dir().join(format!(
            "nimbus-train-{}-{id}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        )),
        capacity: BUCKET_BYTES,
        timeout_ms,
    };
    let network = GroupSpec::Network {
        peers: handles.clone(),
        timeout_ms,
    };
    let backend = match plan.scaling.collective {
        CollectiveBackend::Auto if plan.scaling.use_gpu => CollectiveBackend::Nccl,
        CollectiveBackend::Auto if hosts == 1 && n <= MAX_WORLD => CollectiveBackend::SharedMemory,
        CollectiveBackend::Auto => CollectiveBackend::Network,
        chosen => chosen,
    };
    assignment.group = Some(match backend {
        CollectiveBackend::Nccl => {
            // Rank 0 makes the communicator's id; a program or machine
            // without NCCL fails here, clearly and for good.
            let id = match handles[0].send(NcclUniqueId).await {
                Ok(Ok(id)) => id,
                Ok(Err(e)) => {
                    stop_workers(links, Some(group), "no NCCL".into()).await;
                    return Err(TrainError::Config(format!(
                        "cannot form an NCCL group: {e}"
                    )));
                }
                Err(e) => {
                    stop_workers(links, Some(group), "unreachable".into()).await;
                    return Err(e.into());
                }
            };
            GroupSpec::Nccl { id, timeout_ms }
        }
        CollectiveBackend::Network => network,
        _ if hosts == 1 && n <= MAX_WORLD => shared_memory,
        _ => {
            stop_workers(links, Some(group), "unsupported".into()).await;
            return Err(TrainError::Config(format!(
                "the shared-memory collective needs every worker on one host (and at most {MAX_WORLD}); these {n} landed on {hosts} hosts"
            )));
        }
    });
    let starts = handles.iter().enumerate().map(|(rank, handle)| {
        let mut assignment = assignment.clone();
        assignment.ranks = Ranks {
            world_size: n,
            world_rank: rank,
            local_rank: nodes[..rank].iter().filter(|m| **m == nodes[rank]).count(),
            node_rank: order.iter().position(|m| *m == nodes[rank]).unwrap_or(0),
        };
        assignment.faults = faults_of(rank);
        handle.send(StartTraining(assignment))
    });
    let started = join_all(starts).await;
    let failure = started
        .into_iter()
        .enumerate()
        .find_map(|(rank, r)| match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(TrainError::WorkerFailed {
                rank,
                reason: e.to_string(),
            }),
            Err(e) => Some(TrainError::WorkerFailed {
                rank,
                reason: e.to_string(),
            }),
        });
    if let Some(e) = failure {
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
    })
}

/// Local mode: the loop on a thread of this (the driver) process.
fn launch_local(plan: &RunPlan, assignment: Assignment) -> Launched {
    let progress = Arc::new(Progress::default());
    let run = plan.local.clone();
    let thread_progress = progress.clone();
    std::thread::spawn(move || {
        let outcome = worker::run_loop(
            &run,
            &assignment,
            Box::new(SoloGroup),
            thread_progress.clone(),
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

/// Where shared-memory segments go.
fn shm_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}
