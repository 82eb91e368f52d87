//! The `TrainerWorker` actor: one per worker process, owning the user's
//! training loop, which runs on a thread of its own so the actor keeps
//! answering the supervisor (progress polls, abort) during a step.
//!
//! Its messages: `StartTraining(Assignment)` starts the loop (once) with
//! its ranks, group, checkpoint and faults, unless this process loaded
//! another libtorch release or CUDA build than the driver's (refused,
//! naming both); `PollTraining { after, wait_ms }`
//! answers, within the wait, the events after `after`, the progress counter
//! (reports plus collective operations: the liveness signal) and the
//! outcome once the loop returned and its checkpoints are written;
//! `AbortTraining` aborts the loop's group and its next report;
//! `NcclUniqueId` makes an NCCL group's id (rank 0); `CollectiveChunk`
//! carries a network group's chunk from a peer, buffered from the actor's
//! creation, since a peer may send before this worker's own `StartTraining`
//! arrives. A network group's outgoing chunks go to the peers'
//! `TrainerWorker`s, in order, as `CollectiveChunk` calls.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use super::checkpoint::Checkpoint;
use super::collective::LinkClosed;
use super::collective::{
    Chunk, Collective, Delivery, GroupAbort, NetworkGroup, SendChunk, SharedMemoryGroup, SoloGroup,
};
use super::config::NcclSettings;
use super::context::{Ranks, TrainContext};
use super::faults::TrainingFault;
use super::heal::{self, HealFrom, HealLink, HealNews, HealOrder};
use super::progress::{Progress, ProgressReport};
use super::{LoopFailed, LoopFn, TrainError, WorkerRefusal};
use nimbus::actor::{ActorHandle, RemoteActor, RemoteMessage};
use nimbus::cluster::Torch;
use nimbus::library::{self, LAST_PUSH_WAIT};

/// How a group's workers reach each other.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum GroupSpec {
    /// Through a shared-memory segment (every worker on one host).
    SharedMemory {
        /// The segment's path (under `/dev/shm`).
        path: PathBuf,
        /// Bytes per rank slot: the allreduce bucket size.
        capacity: usize,
        /// Deadline of each collective operation, in milliseconds.
        timeout_ms: u64,
    },
    /// Through NCCL (GPU workers, feature `cuda`).
    Nccl {
        /// The communicator's unique id, made by rank 0.
        #[serde(with = "serde_bytes")]
        id: Vec<u8>,
        /// Deadline of each collective operation, in milliseconds.
        timeout_ms: u64,
        /// The run's NCCL settings, applied before joining.
        nccl: NcclSettings,
    },
    /// Through actor messages to each other's `TrainerWorker` (QUIC).
    Network {
        /// Every rank's worker, by rank.
        peers: Vec<ActorHandle<TrainerWorker>>,
        /// Deadline of each wait for a peer, in milliseconds.
        timeout_ms: u64,
    },
}

/// What one worker is to do.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Assignment {
    /// The registered loop's name.
    pub loop_name: String,
    /// The loop's serialized config.
    #[serde(with = "serde_bytes")]
    pub config: Vec<u8>,
    /// Where it sits in the group.
    pub ranks: Ranks,
    /// The group, for more than one worker.
    pub group: Option<GroupSpec>,
    /// The checkpoint to resume from.
    pub resume: Option<PathBuf>,
    /// Where rank 0 writes checkpoints.
    pub run_dir: PathBuf,
    /// Train on this worker's GPU.
    pub use_gpu: bool,
    /// libtorch intra-op threads (the worker's CPUs).
    pub threads: usize,
    /// Which attempt of the run this is (0 first, then one per restart).
    pub attempt: u32,
    /// The attempt's generation, which fences its checkpoint writes
    /// (`checkpoint/fence.rs`).
    pub generation: u64,
    /// Faults to inject into this worker.
    pub faults: Vec<TrainingFault>,
    /// The libtorch the driver loaded: a worker that loaded another
    /// release or CUDA build refuses to train.
    pub libtorch: Option<Torch>,
    /// This worker replaces a dead one: it gets its state from a peer
    /// (`heal/mod.rs`) instead of `resume`.
    #[serde(default)]
    pub heal: Option<HealFrom>,
}

/// Hosts one worker of a training group.
pub struct TrainerWorker {
    progress: Option<Arc<Progress>>,
    group: Arc<Mutex<Option<GroupAbortHandle>>>,
    /// Where peers' collective chunks go, from the start: a peer may send
    /// before this worker's own `StartTraining` arrives.
    inbox: Sender<Delivery>,
    inbox_receiver: Option<Receiver<Delivery>>,
    /// Heal orders for the loop thread (`heal/mod.rs`).
    heal_news: Sender<HealNews>,
    heal_receiver: Option<Receiver<HealNews>>,
    /// The newest heal ordered: a group of an older one forming is called
    /// off.
    newest_heal: Arc<AtomicU64>,
}

impl Actor for TrainerWorker {
    type Context = Context<Self>;
}

impl RemoteActor for TrainerWorker {
    const NAME: &'static str = "nimbus.train.TrainerWorker";
    type Args = ();
    fn from_args(_: ()) -> Self {
        let (inbox, receiver) = std::sync::mpsc::channel();
        let (heal_news, heal_receiver) = std::sync::mpsc::channel();
        TrainerWorker {
            progress: None,
            group: Arc::default(),
            inbox,
            inbox_receiver: Some(receiver),
            heal_news,
            heal_receiver: Some(heal_receiver),
            newest_heal: Arc::default(),
        }
    }
}

/// A piece of a collective operation from a peer (network groups).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct CollectiveChunk(pub Chunk);

impl RemoteMessage for CollectiveChunk {
    const NAME: &'static str = "nimbus.train.CollectiveChunk";
}

impl Handler<CollectiveChunk> for TrainerWorker {
    type Result = ();

    fn handle(&mut self, CollectiveChunk(chunk): CollectiveChunk, _: &mut Context<Self>) {
        let _ = self.inbox.send(Delivery::Chunk(chunk));
    }
}

/// How the loop thread stops its group from outside.
#[derive(Clone)]
enum GroupAbortHandle {
    SharedMemory(GroupAbort),
    Network(Sender<Delivery>),
    /// NCCL: the communicator is aborted at its next wait.
    #[cfg(feature = "cuda")]
    Flag(Arc<std::sync::atomic::AtomicBool>),
}

impl GroupAbortHandle {
    fn abort(&self, reason: &str) {
        match self {
            GroupAbortHandle::SharedMemory(group) => group.abort(reason),
            GroupAbortHandle::Network(inbox) => NetworkGroup::abort(inbox, reason),
            #[cfg(feature = "cuda")]
            GroupAbortHandle::Flag(flag) => flag.store(true, std::sync::atomic::Ordering::Release),
        }
    }
}

/// A new NCCL unique id, made by rank 0 for its group, unless rank 0
/// loaded another libtorch than the driver's (`libtorch`).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Vec<u8>, WorkerRefusal>")]
pub struct NcclUniqueId {
    /// The driver's libtorch.
    pub libtorch: Option<Torch>,
    /// The run's NCCL settings, applied (as rank 0's) before NCCL is
    /// first called.
    pub nccl: NcclSettings,
}

impl RemoteMessage for NcclUniqueId {
    const NAME: &'static str = "nimbus.train.NcclUniqueId";
}

impl Handler<NcclUniqueId> for TrainerWorker {
    type Result = Result<Vec<u8>, WorkerRefusal>;

    fn handle(&mut self, asked: NcclUniqueId, _: &mut Context<Self>) -> Self::Result {
        same_libtorch(asked.libtorch.as_ref())?;
        #[cfg(feature = "cuda")]
        return super::collective::nccl::unique_id(&asked.nccl.for_rank(0))
            .map_err(|e| WorkerRefusal::Nccl(e.to_string()));
        #[cfg(not(feature = "cuda"))]
        Err(WorkerRefusal::Nccl(
            "this program was built without the `cuda` feature".into(),
        ))
    }
}

/// Refuses when this process loaded another libtorch release or CUDA
/// build than `driver`'s.
fn same_libtorch(driver: Option<&Torch>) -> Result<(), WorkerRefusal> {
    match (driver, Torch::loaded()) {
        (Some(driver), Some(mine)) if mine.differs(driver) => Err(WorkerRefusal::OtherLibtorch {
            worker: Box::new(mine),
            driver: Box::new(driver.clone()),
        }),
        _ => Ok(()),
    }
}

/// What the loop thread needs to form its group.
enum GroupLink {
    Solo,
    SharedMemory,
    Nccl,
    Network {
        send: SendChunk,
        incoming: Receiver<Delivery>,
    },
}

/// Start the loop; fails if it is unknown or already started.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), WorkerRefusal>")]
pub struct StartTraining(pub Assignment);

impl RemoteMessage for StartTraining {
    const NAME: &'static str = "nimbus.train.StartTraining";
}

impl Handler<StartTraining> for TrainerWorker {
    type Result = Result<(), WorkerRefusal>;

    fn handle(
        &mut self,
        StartTraining(assignment): StartTraining,
        _: &mut Context<Self>,
    ) -> Self::Result {
        if self.progress.is_some() {
            return Err(WorkerRefusal::AlreadyTraining);
        }
        same_libtorch(assignment.libtorch.as_ref())?;
        let registry = library::registry().ok_or(WorkerRefusal::NotInitialized)?;
        let run = super::LoopTable::lookup(&registry, &assignment.loop_name)
            .ok_or_else(|| WorkerRefusal::UnknownLoop(assignment.loop_name.clone()))?;
        let link = match &assignment.group {
            None => GroupLink::Solo,
            Some(GroupSpec::SharedMemory { .. }) => GroupLink::SharedMemory,
            Some(GroupSpec::Nccl { .. }) => GroupLink::Nccl,
            Some(GroupSpec::Network { peers, .. }) => {
                let incoming = self
                    .inbox_receiver
                    .take()
                    .ok_or(WorkerRefusal::InboxTaken)?;
                *self.group.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(GroupAbortHandle::Network(self.inbox.clone()));
                GroupLink::Network {
                    send: forward_chunks(peers.clone()),
                    incoming,
                }
            }
        };
        let progress = Arc::new(Progress::default());
        self.progress = Some(progress.clone());
        let group = self.group.clone();
        let runtime = tokio::runtime::Handle::current();
        let heal_news = self
            .heal_receiver
            .take()
            .map(|news| (news, self.newest_heal.clone()));
        std::thread::Builder::new()
            .name("nimbus-train-loop".into())
            .spawn(move || {
                let group = (link, group, heal_news);
                run_worker(run, assignment, group, progress, runtime)
            })
            .map_err(|e| WorkerRefusal::Thread(e.to_string()))?;
        Ok(())
    }
}

/// Progress after event `after`, waiting up to `wait_ms` for some.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<ProgressReport, WorkerRefusal>")]
pub struct PollTraining {
    /// The last event seen.
    pub after: u64,
    /// How long to wait for news, in milliseconds.
    pub wait_ms: u64,
}

impl RemoteMessage for PollTraining {
    const NAME: &'static str = "nimbus.train.PollTraining";
}

impl Handler<PollTraining> for TrainerWorker {
    type Result = ResponseFuture<Result<ProgressReport, WorkerRefusal>>;

    fn handle(&mut self, poll: PollTraining, _: &mut Context<Self>) -> Self::Result {
        let progress = self.progress.clone();
        Box::pin(async move {
            let progress = progress.ok_or(WorkerRefusal::NotTraining)?;
            Ok(progress
                .poll(poll.after, Duration::from_millis(poll.wait_ms))
                .await)
        })
    }
}

/// Stop the loop: its current collective and its next report fail.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct AbortTraining {
    /// Why, as the loop will report it.
    pub reason: String,
}

impl RemoteMessage for AbortTraining {
    const NAME: &'static str = "nimbus.train.AbortTraining";
}

impl Handler<AbortTraining> for TrainerWorker {
    type Result = ();

    fn handle(&mut self, AbortTraining { reason }: AbortTraining, _: &mut Context<Self>) {
        if let Some(progress) = &self.progress {
            progress.abort(&reason);
        }
        let _ = self.heal_news.send(HealNews::Abort);
        if let Some(group) = &*self.group.lock().unwrap_or_else(|e| e.into_inner()) {
            group.abort(&reason);
        }
    }
}

/// Heal into another group: a peer died (`heal/mod.rs`, step 3). The
/// order is queued for the loop thread, then the group it was in aborted,
/// so a survivor blocked in it turns to the order.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct HealGroup(pub HealOrder);

impl RemoteMessage for HealGroup {
    const NAME: &'static str = "nimbus.train.HealGroup";
}

impl Handler<HealGroup> for TrainerWorker {
    type Result = ();

    fn handle(&mut self, HealGroup(order): HealGroup, _: &mut Context<Self>) {
        let heal = order.heal;
        // The group the loop is in before it can see the order: once it
        // has the order it may join the new group at once, which this
        // abort must not reach.
        let current = self.group.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.newest_heal.fetch_max(heal, Ordering::AcqRel);
        let _ = self.heal_news.send(HealNews::Order(order));
        if let Some(group) = current {
            group.abort(&format!("healing the group (heal {heal}): a peer died"));
        }
    }
}

/// Sends a network group's outgoing chunks to the peers' workers, in order,
/// from a task of the actor's runtime (the loop thread has none).
fn forward_chunks(peers: Vec<ActorHandle<TrainerWorker>>) -> SendChunk {
    let (queue, mut chunks) = tokio::sync::mpsc::unbounded_channel::<(usize, Chunk)>();
    actix::spawn(async move {
        while let Some((to, chunk)) = chunks.recv().await {
            let Some(peer) = peers.get(to) else {
                tracing::warn!("collective chunk for rank {to} of {}", peers.len());
                continue;
            };
            if let Err(e) = peer.do_send(CollectiveChunk(chunk)) {
                tracing::warn!("cannot send a collective chunk to rank {to}: {e}");
            }
        }
    });
    Box::new(move |to, chunk| queue.send((to, chunk)).map_err(|_| LinkClosed(to)))
}

/// Where an abort of this worker's group goes: the group it is in.
type GroupSlot = Arc<Mutex<Option<GroupAbortHandle>>>;

/// Heal orders, and the newest ordered.
type HealInbox = (Receiver<HealNews>, Arc<AtomicU64>);

/// The loop thread of a worker process: `link`, `group_slot` and
/// `heal_news` say how it forms its group, who aborts it and how it
/// heals; `runtime` is the worker's.
fn run_worker(
    run: LoopFn,
    assignment: Assignment,
    (link, group_slot, heal_news): (GroupLink, GroupSlot, Option<HealInbox>),
    progress: Arc<Progress>,
    runtime: tokio::runtime::Handle,
) {
    let outcome = (|| -> Result<(), TrainError> {
        let ranks = assignment.ranks;
        let collective: Box<dyn Collective> = match (link, &assignment.group) {
            (
                GroupLink::Network { send, incoming },
                Some(GroupSpec::Network { timeout_ms, .. }),
            ) => Box::new(NetworkGroup::new(
                ranks.world_rank,
                ranks.world_size,
                send,
                incoming,
                Duration::from_millis(*timeout_ms),
            )?),
            (GroupLink::SharedMemory, Some(spec)) => {
                join_shared_memory(spec, ranks, (&progress, &group_slot), &|| false)?
            }
            (
                GroupLink::Nccl,
                Some(GroupSpec::Nccl {
                    id,
                    timeout_ms,
                    nccl,
                }),
            ) => join_nccl(id, &assignment, *timeout_ms, nccl, &progress, &group_slot)?,
            (GroupLink::Solo, None) => Box::new(SoloGroup),
            _ => {
                return Err(TrainError::Mismatch(
                    "the worker's group link does not match its assignment",
                ))
            }
        };
        // Groups on one host heal when a peer dies (`heal/mod.rs`).
        let heal = match (&assignment.group, heal_news) {
            (Some(GroupSpec::SharedMemory { .. }), Some((news, newest))) => {
                let (joining, slot) = (progress.clone(), group_slot.clone());
                let join = Box::new(move |spec: &GroupSpec, heal: u64| {
                    let called_off = || newest.load(Ordering::Acquire) > heal;
                    join_shared_memory(spec, ranks, (&joining, &slot), &called_off)
                });
                let joined = assignment.heal.as_ref().map_or(0, |h| h.heal);
                Some(HealLink::new(news, join, progress.clone(), joined))
            }
            _ => None,
        };
        run_loop(
            &run,
            &assignment,
            collective,
            (progress.clone(), heal),
            runtime.clone(),
        )
    })();
    // The supervisor stops this process once it sees the loop finish: the
    // metrics the loop recorded since the last push go to the node first.
    push_last_metrics(&runtime);
    progress.finish(outcome.map_err(|e| LoopFailed(e.to_string())));
}

/// Joins the shared-memory group `spec` as `ranks` say, making it the
/// one an abort reaches as soon as it is mapped; it is called off (as
/// aborted) once `called_off()` says so.
fn join_shared_memory(
    spec: &GroupSpec,
    ranks: Ranks,
    (progress, group_slot): (&Progress, &GroupSlot),
    called_off: &dyn Fn() -> bool,
) -> Result<Box<dyn Collective>, TrainError> {
    let GroupSpec::SharedMemory {
        path,
        capacity,
        timeout_ms,
    } = spec
    else {
        return Err(TrainError::Mismatch(
            "a shared-memory worker was given another kind of group",
        ));
    };
    let mapped = |abort: GroupAbort| {
        let abort = GroupAbortHandle::SharedMemory(abort);
        *group_slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(abort.clone());
        // An abort or a newer order that came while it was being mapped.
        if let Some(reason) = progress.aborted() {
            abort.abort(&reason);
        } else if called_off() {
            abort.abort("a newer heal was ordered");
        }
    };
    let group = SharedMemoryGroup::join_with(
        path,
        (ranks.world_rank, ranks.world_size, *capacity),
        Duration::from_millis(*timeout_ms),
        called_off,
        mapped,
    )?;
    Ok(Box::new(group))
}

/// Pushes this process's metrics to its node from the loop thread, waiting
/// at most [`LAST_PUSH_WAIT`] (and a little) for the worker's runtime to
/// send them.
fn push_last_metrics(runtime: &tokio::runtime::Handle) {
    let (done, pushed) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let _ = done.send(library::push_metrics_now().await);
    });
    match pushed.recv_timeout(LAST_PUSH_WAIT + Duration::from_millis(500)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("last metrics push failed: {e}"),
        Err(_) => tracing::debug!("last metrics push: no answer from the worker's runtime"),
    }
}

/// Joins an NCCL group on this thread (its device is the worker's GPU).
#[cfg(feature = "cuda")]
fn join_nccl(
    id: &[u8],
    assignment: &Assignment,
    timeout_ms: u64,
    nccl: &NcclSettings,
    progress: &Progress,
    group_slot: &Mutex<Option<GroupAbortHandle>>,
) -> Result<Box<dyn Collective>, TrainError> {
    let rank = assignment.ranks.world_rank;
    let group = super::collective::nccl::NcclGroup::join(
        id,
        rank,
        assignment.ranks.world_size,
        Duration::from_millis(timeout_ms),
        &nccl.for_rank(rank),
    )?;
    let abort = GroupAbortHandle::Flag(group.abort_flag());
    if let Some(reason) = progress.aborted() {
        abort.abort(&reason);
    }
    *group_slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(abort);
    Ok(Box::new(group))
}

/// Without the `cuda` feature there is no NCCL.
#[cfg(not(feature = "cuda"))]
fn join_nccl(
    _: &[u8],
    _: &Assignment,
    _: u64,
    _: &NcclSettings,
    _: &Progress,
    _: &Mutex<Option<GroupAbortHandle>>,
) -> Result<Box<dyn Collective>, TrainError> {
    Err(TrainError::Nccl(
        "this program was built without the `cuda` feature".into(),
    ))
}

/// Runs the loop of `assignment` with `collective`, on the calling thread:
/// in a worker process, or in the driver for a run of 0 workers. A worker
/// that replaces a dead one first receives its state from a peer.
pub(crate) fn run_loop(
    run: &LoopFn,
    assignment: &Assignment,
    mut collective: Box<dyn Collective>,
    (progress, heal): (Arc<Progress>, Option<HealLink>),
    runtime: tokio::runtime::Handle,
) -> Result<(), TrainError> {
    tch::set_num_threads(assignment.threads.max(1) as i32);
    let device = if assignment.use_gpu {
        match tch::Device::cuda_if_available() {
            tch::Device::Cpu => {
                return Err(TrainError::NoGpu {
                    rank: assignment.ranks.world_rank,
                })
            }
            gpu => gpu,
        }
    } else {
        tch::Device::Cpu
    };
    let checkpoint = match &assignment.heal {
        Some(from) => {
            let peer = heal::state::exchange(collective.as_mut(), from.source, None)?;
            progress.step();
            tracing::info!(
                heal = from.heal,
                "rank {} has its state from rank {} at report {}",
                assignment.ranks.world_rank,
                from.source,
                peer.reports
            );
            Some(peer.checkpoint)
        }
        None => assignment
            .resume
            .as_deref()
            .map(Checkpoint::load)
            .transpose()?,
    };
    let mut context = TrainContext::new(
        assignment, device, collective, checkpoint, progress, heal, runtime,
    );
    // In a worker process a panic also ends the process (its panic hook
    // reports it as the actor's death); in local mode this catches it.
    let result =
        std::panic::catch_unwind(AssertUnwindSafe(|| run(&assignment.config, &mut context)));
    // Checkpoints reported before a failure still count: wait for them.
    let written = context.finish();
    match result {
        Ok(Ok(())) => written,
        Ok(Err(e)) => Err(e),
        Err(panic) => Err(TrainError::Loop(format!(
            "panic: {}",
            library::panic_text(&*panic)
        ))),
    }
}
