//! What a training loop sees: its rank, its device, its collective group,
//! the checkpoint to resume from, and `report`.
//!
//! The step protocol: the worker runs the loop on a thread of its own; a
//! step is the user's code plus the context's calls.
//! 1. `prepare_model` (once) broadcasts rank 0's parameters to every rank,
//!    so all start alike.
//! 2. `sync_gradients` copies every gradient into one flat `f32` buffer
//!    (parameters in name order; a missing gradient counts as zeros),
//!    allreduces it (mean) through the group, and copies it back (the
//!    NCCL backend averages CUDA tensors in place instead). The buffer goes
//!    through after the backward pass, in slot-sized buckets: tch has no
//!    backward hooks to overlap it.
//! 3. `report(metrics, checkpoint)` records a numbered event (the report
//!    index: the step); on rank 0 it hands the checkpoint to the writer
//!    thread, which saves it atomically off the training thread and records
//!    `CheckpointSaved` or `CheckpointFailed`; other ranks' checkpoints are
//!    dropped.
//! 4. Each collective operation and each report count as progress (the
//!    counter the supervisor's hang check watches); an abort (from
//!    `AbortTraining`) makes the next call fail.
//!
//! Fault rules (`faults.rs`) fire in the first of `sync_gradients` and
//! `report` of their step, and in rank 0's checkpoint writer.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::checkpoint::{Checkpoint, CheckpointError, SavedCheckpoint};
use super::collective::{Collective, CollectiveError};
use super::faults::{StorageError, TrainingFault, TrainingFaultAction};
use super::heal::HealLink;
use super::progress::{Progress, WorkerEvent};
use super::worker::Assignment;
use super::{DistributedSampler, Metrics, TrainError};

/// Where a worker sits in its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ranks {
    /// Number of workers.
    pub world_size: usize,
    /// This worker's rank, `0..world_size`.
    pub world_rank: usize,
    /// Its rank among the workers of its node.
    pub local_rank: usize,
    /// Its node's rank among the group's nodes.
    pub node_rank: usize,
}

/// A worker's view of the run, handed to the training loop.
///
/// ```no_run
/// use nimbus_train::tch::{nn, nn::Module, Tensor};
/// use nimbus_train::{Checkpoint, Metrics, Sgd, TrainContext};
/// fn train(ctx: &mut TrainContext) -> Result<(), nimbus_train::TrainError> {
///     let vs = nn::VarStore::new(ctx.device());
///     let net = nn::linear(vs.root(), 4, 1, Default::default());
///     let model = ctx.prepare_model(&vs)?; // rank 0's initial weights everywhere
///     let mut sgd = Sgd::new(&model, 0.1, 0.9);
///     for step in 0..10 {
///         let x = Tensor::ones([8, 4], (nimbus_train::tch::Kind::Float, ctx.device()));
///         let loss = net.forward(&x).pow_tensor_scalar(2).mean(None);
///         sgd.zero_grad();
///         loss.backward();
///         ctx.sync_gradients(&model)?; // averaged over all workers
///         sgd.step();
///         let metrics = Metrics::from([("loss".into(), loss.double_value(&[]))]);
///         ctx.report(metrics, None)?;
///     }
///     Ok(())
/// }
/// ```
pub struct TrainContext {
    ranks: Ranks,
    device: Device,
    collective: Box<dyn Collective>,
    checkpoint: Option<Checkpoint>,
    progress: Arc<Progress>,
    reports: u64,
    writer: Option<CheckpointWriter>,
    flat: Vec<f32>,
    attempt: u32,
    run_dir: PathBuf,
    /// Injected faults, and whether each has fired.
    faults: Vec<(TrainingFault, bool)>,
    /// The last step whose faults were checked.
    checked_step: u64,
    /// When the last report was made (`nimbus_train_step_seconds`).
    last_report: Option<std::time::Instant>,
    /// How this worker heals its group when a peer dies (`heal/mod.rs`).
    heal: Option<HealLink>,
    /// This worker replaced a dead one: its state came from a peer.
    healed: bool,
    /// The async runtime of the worker's process (the loop runs beside it).
    runtime: tokio::runtime::Handle,
}

/// What the checkpoint writer is to do wrong (fault injection).
#[derive(Clone, Copy, Debug)]
enum WriteFault {
    Fail(StorageError),
    Torn,
    Corrupt,
}

/// The trainable parameters of a model prepared for data-parallel
/// training: their gradients are averaged by
/// [`TrainContext::sync_gradients`].
pub struct DistributedModel {
    params: Vec<(String, Tensor)>,
    numel: usize,
}

impl DistributedModel {
    /// The trainable parameters of `vs` in a process of its own, with no
    /// group to agree with: what [`TrainContext::prepare_model`] returns to
    /// a single worker (for plain loops compared with nimbus's, and tests).
    pub fn single(vs: &VarStore) -> Result<Self, TrainError> {
        TrainContext::trainable(vs)
    }

    /// The parameters, sorted by name.
    pub fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Total number of parameter values.
    pub fn numel(&self) -> usize {
        self.numel
    }
}

impl TrainContext {
    /// A context for `assignment` (rank 0 writes checkpoints to its run
    /// directory).
    pub(crate) fn new(
        assignment: &Assignment,
        device: Device,
        collective: Box<dyn Collective>,
        checkpoint: Option<Checkpoint>,
        progress: Arc<Progress>,
        heal: Option<HealLink>,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        let ranks = assignment.ranks;
        let run_dir = assignment.run_dir.clone();
        let (attempt, faults) = (assignment.attempt, assignment.faults.clone());
        let generation = assignment.generation;
        let reports = checkpoint.as_ref().map_or(0, Checkpoint::index);
        if ranks.world_rank == 0 {
            remove_torn_checkpoints(&run_dir, generation);
        }
        let writer = (ranks.world_rank == 0).then(|| {
            CheckpointWriter::start(run_dir.clone(), (attempt, generation), progress.clone())
        });
        TrainContext {
            ranks,
            device,
            collective,
            checkpoint,
            progress,
            reports,
            writer,
            flat: Vec::new(),
            attempt,
            run_dir,
            faults: faults.into_iter().map(|f| (f, false)).collect(),
            checked_step: 0,
            last_report: None,
            heal,
            healed: assignment.heal.is_some(),
            runtime,
        }
    }

    /// The async runtime of this worker's process, which the loop runs
    /// beside on a thread of its own: where a library's async work for the
    /// loop runs (a dataset's shard: `nimbus_data::BlockingBatches`).
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// Which attempt this is: 0 first, then one more per restart of the
    /// group.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether this worker replaced one that died: its state came from a
    /// live peer (`checkpoint()`), the others are mid-run.
    pub fn is_replacement(&self) -> bool {
        self.healed
    }

    /// The run's directory (`storage_path/<run name>`).
    pub fn run_dir(&self) -> &std::path::Path {
        &self.run_dir
    }

    /// Number of workers.
    pub fn world_size(&self) -> usize {
        self.ranks.world_size
    }

    /// This worker's rank.
    pub fn world_rank(&self) -> usize {
        self.ranks.world_rank
    }

    /// This worker's rank on its node.
    pub fn local_rank(&self) -> usize {
        self.ranks.local_rank
    }

    /// The rank of this worker's node.
    pub fn node_rank(&self) -> usize {
        self.ranks.node_rank
    }

    /// The device to train on: the worker's GPU with `use_gpu`, else the
    /// CPU.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The checkpoint this attempt resumes from (the latest valid one after
    /// a restart, or `resume_from_checkpoint`), or, in a worker that
    /// replaced a dead one, the state a live peer sent (what its
    /// `sync_gradients_or_heal` made, at the step the group is at).
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// The collective group, for operations of the loop's own.
    pub fn collective(&mut self) -> &mut dyn Collective {
        self.collective.as_mut()
    }

    /// A sampler giving this worker its shard of a dataset of `len`.
    pub fn sampler(&self, len: usize) -> DistributedSampler {
        DistributedSampler::new(len, self.ranks.world_size, self.ranks.world_rank)
    }

    fn check_abort(&self) -> Result<(), TrainError> {
        match self.progress.aborted() {
            Some(reason) => Err(TrainError::Aborted(reason)),
            None => Ok(()),
        }
    }

    /// Reports metrics, and a checkpoint to save. Rank 0's metrics are the
    /// run's; rank 0's checkpoint is written (atomically, on a background
    /// thread, so the step is not stalled) under the run's directory; other
    /// ranks' checkpoints are dropped.
    pub fn report(
        &mut self,
        metrics: Metrics,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), TrainError> {
        self.check_abort()?;
        self.step_faults()?;
        self.reports += 1;
        let index = self.reports;
        let now = std::time::Instant::now();
        if let Some(last) = self.last_report.replace(now) {
            metrics::histogram!("nimbus_train_step_seconds")
                .record(now.duration_since(last).as_secs_f64());
        }
        if let Some(samples) = metrics
            .get("samples")
            .filter(|s| s.is_finite() && **s > 0.0)
        {
            metrics::counter!("nimbus_train_samples_total").increment(*samples as u64);
        }
        let write_fault = self.write_fault(index);
        let writer = self.writer.as_ref().filter(|_| checkpoint.is_some());
        self.progress.push(WorkerEvent::Report {
            index,
            metrics: metrics.clone(),
            checkpoint: writer.is_some(),
        });
        if let (Some(writer), Some(checkpoint)) = (writer, checkpoint) {
            writer.save(index, checkpoint, metrics, write_fault)?;
        }
        Ok(())
    }

    fn announce(progress: &Progress, fault: &TrainingFault) {
        tracing::warn!("{}", fault.reason());
        progress.push(WorkerEvent::FaultInjected {
            fault: fault.kind(),
            target: fault.target(),
            trigger: format!("step {}", fault.at_step),
        });
    }

    /// Fires the current step's process faults, once per step (the first
    /// of `sync_gradients` and `report` to run in a step).
    fn step_faults(&mut self) -> Result<(), TrainError> {
        let step = self.reports + 1;
        if self.checked_step == step {
            return Ok(());
        }
        self.checked_step = step;
        for i in 0..self.faults.len() {
            let (fault, fired) = self.faults[i].clone();
            let first = !fired;
            match fault.action {
                TrainingFaultAction::Straggle { delay_ms, steps }
                    if (fault.at_step..fault.at_step + steps).contains(&step) =>
                {
                    if first {
                        Self::announce(&self.progress, &fault);
                        self.faults[i].1 = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(delay_ms));
                }
                _ if fault.at_step != step || fired => {}
                TrainingFaultAction::Kill => {
                    self.faults[i].1 = true;
                    return Err(die(&fault));
                }
                TrainingFaultAction::Panic => {
                    self.faults[i].1 = true;
                    panic!("{}", fault.reason());
                }
                TrainingFaultAction::KillNode => {
                    self.faults[i].1 = true;
                    let trigger = format!("step {}", fault.at_step);
                    let why =
                        match nimbus::library::kill_own_node(fault.kind(), fault.target(), trigger)
                        {
                            Ok(never) => match never {},
                            Err(why) => why,
                        };
                    tracing::error!("{}: not injected: {why}", fault.reason());
                }
                TrainingFaultAction::KillHead { .. } => {
                    // The chaos harness kills and restarts the head when
                    // the report reaches it; training goes on meanwhile.
                    self.faults[i].1 = true;
                    Self::announce(&self.progress, &fault);
                }
                TrainingFaultAction::HangInCollective => {
                    self.faults[i].1 = true;
                    Self::announce(&self.progress, &fault);
                    // Never arrive: the peers time out (or the supervisor
                    // aborts the group), then this worker is released.
                    loop {
                        if let Some(reason) = self.progress.aborted() {
                            return Err(TrainError::Aborted(reason));
                        }
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The storage fault, if any, for the checkpoint of report `index`.
    fn write_fault(&mut self, index: u64) -> Option<(WriteFault, TrainingFault)> {
        let (fault, fired) = self
            .faults
            .iter_mut()
            .find(|(f, fired)| f.at_step == index && !*fired && is_storage_fault(f))?;
        *fired = true;
        let action = match fault.action {
            TrainingFaultAction::FailCheckpointWrite { error } => WriteFault::Fail(error),
            TrainingFaultAction::TornCheckpointWrite => WriteFault::Torn,
            _ => WriteFault::Corrupt,
        };
        Some((action, fault.clone()))
    }

    fn trainable(vs: &VarStore) -> Result<DistributedModel, TrainError> {
        let mut params: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, tensor) in &params {
            if !matches!(tensor.kind(), Kind::Float | Kind::BFloat16 | Kind::Half) {
                return Err(TrainError::ParameterKind {
                    name: name.clone(),
                    kind: format!("{:?}", tensor.kind()),
                });
            }
        }
        let numel = params.iter().map(|(_, t)| t.numel()).sum();
        Ok(DistributedModel { params, numel })
    }

    /// Prepares `vs`'s model for data-parallel training: rank 0's
    /// parameters are copied to every worker, so all start alike (on the
    /// device where the backend can: NCCL on GPU tensors). In a worker that
    /// replaced a dead one nothing is copied: its state, restored from
    /// `checkpoint()`, is the group's already (the others are mid-run).
    pub fn prepare_model(&mut self, vs: &VarStore) -> Result<DistributedModel, TrainError> {
        let model = Self::trainable(vs)?;
        if self.healed {
            return Ok(model);
        }
        if self.ranks.world_size > 1 {
            self.check_abort()?;
            let params: Vec<Tensor> = model
                .params
                .iter()
                .map(|(_, p)| p.shallow_clone())
                .collect();
            let collective = self.collective.as_mut();
            if let Some(result) = on_contiguous(&params, |ts| collective.broadcast_tensors(ts, 0)) {
                self.progress.step();
                return result.map(|()| model).map_err(train_error);
            }
        }
        self.flatten(&model, |t| t.shallow_clone())?;
        self.collective_op(|c, flat| c.broadcast(flat, 0))?;
        self.unflatten(&model, |t| t.shallow_clone())?;
        Ok(model)
    }

    /// Replaces every gradient of `model` with its mean over all workers.
    /// Call it after `backward` and before the optimizer step. (The
    /// gradients go through as one buffer, in slot-sized buckets, after
    /// the backward pass: tch has no backward hooks to overlap them.)
    pub fn sync_gradients(&mut self, model: &DistributedModel) -> Result<(), TrainError> {
        self.step_faults()?;
        if self.ranks.world_size == 1 {
            return self.check_abort();
        }
        define_missing_gradients(model);
        // On the device, where the backend can (NCCL on GPU tensors).
        // (Frozen parameters have none on any rank.)
        let gradients: Vec<Tensor> = model
            .params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .collect();
        self.check_abort()?;
        let started = std::time::Instant::now();
        let record = |backend: &'static str, bytes: usize| {
            metrics::histogram!("nimbus_allreduce_seconds", "backend" => backend)
                .record(started.elapsed().as_secs_f64());
            metrics::counter!("nimbus_allreduce_bytes_total", "backend" => backend)
                .increment(bytes as u64);
        };
        let collective = self.collective.as_mut();
        if let Some(result) = on_contiguous(&gradients, |ts| collective.allreduce_mean_tensors(ts))
        {
            self.progress.step();
            let bytes = gradients
                .iter()
                .map(|g| g.numel() * g.kind().elt_size_in_bytes())
                .sum();
            record("device", bytes);
            return result.map_err(train_error);
        }
        self.flatten(model, Tensor::grad)?;
        self.collective_op(|c, flat| c.allreduce_mean(flat))?;
        record("host", model.numel * std::mem::size_of::<f32>());
        self.unflatten(model, Tensor::grad)
    }

    /// [`sync_gradients`](Self::sync_gradients), and if a peer dies
    /// meanwhile, heals the group instead of failing: this worker keeps its
    /// state, a replacement gets it from a live peer, and the step's
    /// allreduce runs again with every rank (no step is redone; the result
    /// is the fault-free run's). `state` makes this worker's state as a
    /// checkpoint to resume the current step from (parameters, optimizer,
    /// the position of this step's batch, anything else the loop restores
    /// from `checkpoint()`); it is called only on the peer that sends it.
    ///
    /// ```no_run
    /// # use nimbus_train::{tch::nn::VarStore, Checkpoint, DistributedModel, Sgd, TrainContext};
    /// # fn step(ctx: &mut TrainContext, vs: &VarStore, model: &DistributedModel, sgd: &Sgd, batch: usize)
    /// #     -> Result<(), nimbus_train::TrainError> {
    /// // After `backward`, before the optimizer step of batch `batch`:
    /// ctx.sync_gradients_or_heal(model, || {
    ///     sgd.save_to(Checkpoint::new().with_var_store(vs)).with_value("batch", batch)
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Groups on one host (the shared-memory collective) heal; others, and
    /// loops that use `sync_gradients`, restart from the latest checkpoint.
    pub fn sync_gradients_or_heal(
        &mut self,
        model: &DistributedModel,
        state: impl Fn() -> Result<Checkpoint, CheckpointError>,
    ) -> Result<(), TrainError> {
        if let Some(heal) = &self.heal {
            heal.offer();
        }
        loop {
            let failed = match self.sync_gradients(model) {
                Ok(()) => return Ok(()),
                Err(e @ (TrainError::Collective(_) | TrainError::Aborted(_))) => e,
                Err(e) => return Err(e),
            };
            let Some(heal) = self.heal.as_mut() else {
                return Err(failed);
            };
            let (rank, reports) = (self.ranks.world_rank, self.reports);
            self.collective = heal.survive(rank, reports, &state, failed)?;
        }
    }

    fn collective_op(
        &mut self,
        op: impl FnOnce(&mut dyn Collective, &mut [f32]) -> Result<(), CollectiveError>,
    ) -> Result<(), TrainError> {
        self.check_abort()?;
        let mut flat = std::mem::take(&mut self.flat);
        let result = op(self.collective.as_mut(), &mut flat);
        self.flat = flat;
        self.progress.step();
        result.map_err(train_error)
    }

    fn flatten(
        &mut self,
        model: &DistributedModel,
        pick: impl Fn(&Tensor) -> Tensor,
    ) -> Result<(), TrainError> {
        self.flat.resize(model.numel, 0.0);
        let mut offset = 0;
        for (name, param) in &model.params {
            let source = pick(param);
            let n = param.numel();
            if !source.defined() {
                // No gradient (unused parameter): contributes zeros.
                self.flat[offset..offset + n].fill(0.0);
            } else {
                let source = source
                    .to_device(Device::Cpu)
                    .to_kind(Kind::Float)
                    .contiguous();
                source
                    .f_copy_data(&mut self.flat[offset..offset + n], n)
                    .map_err(|source| TrainError::Parameter {
                        name: name.clone(),
                        source,
                    })?;
            }
            offset += n;
        }
        Ok(())
    }

    fn unflatten(
        &self,
        model: &DistributedModel,
        pick: impl Fn(&Tensor) -> Tensor,
    ) -> Result<(), TrainError> {
        let mut offset = 0;
        tch::no_grad(|| -> Result<(), TrainError> {
            for (_, param) in &model.params {
                let n = param.numel();
                let mut target = pick(param);
                if target.defined() {
                    let values = Tensor::from_slice(&self.flat[offset..offset + n])
                        .view(param.size().as_slice())
                        .to_kind(target.kind())
                        .to_device(param.device());
                    target.f_copy_(&values)?;
                }
                offset += n;
            }
            Ok(())
        })
    }

    /// Waits until every checkpoint written so far is on disk.
    pub(crate) fn finish(mut self) -> Result<(), TrainError> {
        match self.writer.take() {
            Some(writer) => writer.finish(),
            None => Ok(()),
        }
    }
}

/// A collective's error as the training loop's.
fn train_error(error: CollectiveError) -> TrainError {
    match error {
        CollectiveError::Aborted(reason) => TrainError::Aborted(reason),
        e => TrainError::Collective(e),
    }
}

/// Runs the in-place device collective `op` on `tensors`, giving it a
/// contiguous copy (on the same device) of each one that is not
/// contiguous and copying the result back; `None` when the backend cannot
/// run `op` on these tensors.
fn on_contiguous(
    tensors: &[Tensor],
    op: impl FnOnce(&[Tensor]) -> Option<Result<(), CollectiveError>>,
) -> Option<Result<(), CollectiveError>> {
    let work: Vec<Tensor> = tensors
        .iter()
        .map(|t| {
            if t.is_contiguous() {
                t.shallow_clone()
            } else {
                t.contiguous()
            }
        })
        .collect();
    let result = op(&work)?;
    if result.is_ok() {
        tch::no_grad(|| {
            for (tensor, work) in tensors.iter().zip(&work) {
                if !tensor.is_contiguous() {
                    tensor.shallow_clone().copy_(work);
                }
            }
        });
    }
    Some(result)
}

/// Gives every parameter that backward left without a gradient (one this
/// rank did not use) a zero gradient, on its device: every rank then
/// averages the same tensors in the same order (NCCL needs the same calls
/// on every rank), and every rank receives the mean of the others'
/// gradients for it, so replicas stay identical. (A parameter no rank
/// used thus gets a zero gradient too, where a single worker's optimizer
/// would see none: with momentum, it keeps moving.)
fn define_missing_gradients(model: &DistributedModel) {
    tch::with_grad(|| {
        for (_, param) in &model.params {
            if param.requires_grad() && !param.grad().defined() {
                (param.sum(param.kind()) * 0.0).backward();
            }
        }
    });
}

fn is_storage_fault(fault: &TrainingFault) -> bool {
    matches!(
        fault.action,
        TrainingFaultAction::FailCheckpointWrite { .. }
            | TrainingFaultAction::TornCheckpointWrite
            | TrainingFaultAction::CorruptCheckpoint
    )
}

/// Ends this worker process for an injected fault: reports the reason to
/// its node (the death line), then SIGKILLs itself. In the driver (local
/// mode) it returns the reason as an error instead.
fn die(fault: &TrainingFault) -> TrainError {
    let reason = fault.reason();
    // In a worker process this does not return.
    let nimbus::library::NotAWorker =
        nimbus::library::die(&nimbus::cluster::DeathCause::ChaosFault(fault.fired()));
    TrainError::Loop(format!(
        "{reason} (local mode: an error instead of SIGKILL)"
    ))
}

/// Removes the temporary directories of checkpoint writes of earlier
/// generations, which never finished (a torn write leaves one behind; it
/// was never a checkpoint). `.checkpoint_<index>.tmp-<generation>-<pid>`;
/// one without a generation is from a build before fencing.
fn remove_torn_checkpoints(run_dir: &std::path::Path, generation: u64) {
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((_, tail)) = name
            .strip_prefix(".checkpoint_")
            .and_then(|rest| rest.split_once(".tmp-"))
        else {
            continue;
        };
        let earlier = match tail.split_once('-') {
            Some((written_in, _)) => written_in.parse::<u64>().map_or(true, |g| g < generation),
            None => true,
        };
        if earlier {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// One checkpoint for the writer thread.
struct WriteJob {
    index: u64,
    checkpoint: Checkpoint,
    metrics: Metrics,
    fault: Option<(WriteFault, TrainingFault)>,
}

/// Rank 0's checkpoint writer thread.
struct CheckpointWriter {
    queue: mpsc::Sender<WriteJob>,
    thread: JoinHandle<()>,
}

impl CheckpointWriter {
    fn start(run_dir: PathBuf, (attempt, generation): (u32, u64), progress: Arc<Progress>) -> Self {
        let (queue, jobs) = mpsc::channel::<WriteJob>();
        let thread = std::thread::spawn(move || {
            for job in jobs {
                let WriteJob {
                    index,
                    checkpoint,
                    metrics,
                    fault,
                } = job;
                if let Some((_, rule)) = &fault {
                    TrainContext::announce(&progress, rule);
                }
                let saved = match fault {
                    Some((WriteFault::Fail(error), _)) => Err(format!(
                        "cannot write checkpoint {index} under {}: {} (injected)",
                        run_dir.display(),
                        error.io_error()
                    )),
                    Some((WriteFault::Torn, rule)) => {
                        checkpoint.save_torn(&run_dir, index, generation);
                        Err(die(&rule).to_string())
                    }
                    Some((WriteFault::Corrupt, _)) => checkpoint
                        .save(&run_dir, index, (attempt, generation), &metrics)
                        .inspect(|path| flip_a_byte(&path.join(super::checkpoint::TENSORS_FILE)))
                        .map_err(|e| e.to_string()),
                    None => match checkpoint.save(&run_dir, index, (attempt, generation), &metrics)
                    {
                        Err(CheckpointError::NoSpace(full)) => {
                            progress.push(WorkerEvent::StorageFull(full));
                            continue;
                        }
                        saved => saved.map_err(|e| e.to_string()),
                    },
                };
                match saved {
                    Ok(path) => progress.push(WorkerEvent::CheckpointSaved(SavedCheckpoint {
                        path,
                        index,
                        metrics,
                    })),
                    Err(error) => progress.push(WorkerEvent::CheckpointFailed { index, error }),
                }
            }
        });
        CheckpointWriter { queue, thread }
    }

    fn save(
        &self,
        index: u64,
        checkpoint: Checkpoint,
        metrics: Metrics,
        fault: Option<(WriteFault, TrainingFault)>,
    ) -> Result<(), TrainError> {
        let job = WriteJob {
            index,
            checkpoint,
            metrics,
            fault,
        };
        self.queue
            .send(job)
            .map_err(|_| TrainError::Aborted("the checkpoint writer stopped".into()))
    }

    fn finish(self) -> Result<(), TrainError> {
        drop(self.queue);
        self.thread
            .join()
            .map_err(|_| TrainError::Aborted("the checkpoint writer panicked".into()))
    }
}

/// Flips the last byte of `file` (bit rot, for fault injection).
fn flip_a_byte(file: &std::path::Path) {
    if let Ok(mut bytes) = std::fs::read(file) {
        if let Some(last) = bytes.last_mut() {
            *last ^= 0xff;
        }
        let _ = std::fs::write(file, bytes);
    }
}
