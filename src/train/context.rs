//! What a training loop sees: its rank, its device, its collective group,
//! the checkpoint to resume from, and `report`.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::checkpoint::{Checkpoint, SavedCheckpoint};
use super::collective::{Collective, CollectiveError};
use super::progress::{Progress, WorkerEvent};
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
/// use nimbus::tch::{nn, nn::Module, Tensor};
/// use nimbus::train::{Checkpoint, Metrics, Sgd, TrainContext};
/// fn train(ctx: &mut TrainContext) -> Result<(), nimbus::train::TrainError> {
///     let vs = nn::VarStore::new(ctx.device());
///     let net = nn::linear(vs.root(), 4, 1, Default::default());
///     let model = ctx.prepare_model(&vs)?; // rank 0's initial weights everywhere
///     let mut sgd = Sgd::new(&model, 0.1, 0.9);
///     for step in 0..10 {
///         let x = Tensor::ones([8, 4], (nimbus::tch::Kind::Float, ctx.device()));
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
}

/// The trainable parameters of a model prepared for data-parallel
/// training: their gradients are averaged by
/// [`TrainContext::sync_gradients`].
pub struct DistributedModel {
    params: Vec<(String, Tensor)>,
    numel: usize,
}

impl DistributedModel {
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
    /// A context; `run_dir` is where rank 0 writes checkpoints.
    pub(crate) fn new(
        ranks: Ranks,
        device: Device,
        collective: Box<dyn Collective>,
        checkpoint: Option<Checkpoint>,
        progress: Arc<Progress>,
        run_dir: PathBuf,
        attempt: u32,
    ) -> Self {
        let reports = checkpoint.as_ref().map_or(0, Checkpoint::index);
        let writer = (ranks.world_rank == 0)
            .then(|| CheckpointWriter::start(run_dir.clone(), progress.clone()));
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
        }
    }

    /// Which attempt this is: 0 first, then one more per restart of the
    /// group.
    pub fn attempt(&self) -> u32 {
        self.attempt
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
    /// a restart, or `resume_from_checkpoint`).
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
        self.reports += 1;
        let index = self.reports;
        let writer = self.writer.as_ref().filter(|_| checkpoint.is_some());
        self.progress.push(WorkerEvent::Report {
            index,
            metrics: metrics.clone(),
            checkpoint: writer.is_some(),
        });
        if let (Some(writer), Some(checkpoint)) = (writer, checkpoint) {
            writer.save(index, checkpoint, metrics)?;
        }
        Ok(())
    }

    fn trainable(vs: &VarStore) -> Result<DistributedModel, TrainError> {
        let mut params: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, tensor) in &params {
            if tensor.kind() != Kind::Float {
                return Err(TrainError::Config(format!(
                    "parameter {name} is {:?}; data-parallel training averages f32 parameters",
                    tensor.kind()
                )));
            }
        }
        let numel = params.iter().map(|(_, t)| t.numel()).sum();
        Ok(DistributedModel { params, numel })
    }

    /// Prepares `vs`'s model for data-parallel training: rank 0's
    /// parameters are copied to every worker, so all start alike.
    pub fn prepare_model(&mut self, vs: &VarStore) -> Result<DistributedModel, TrainError> {
        let model = Self::trainable(vs)?;
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
        if self.ranks.world_size == 1 {
            return self.check_abort();
        }
        self.flatten(model, Tensor::grad)?;
        self.collective_op(|c, flat| c.allreduce_mean(flat))?;
        self.unflatten(model, Tensor::grad)
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
        result.map_err(|e| match e {
            CollectiveError::Aborted(reason) => TrainError::Aborted(reason),
            e => TrainError::Collective(e),
        })
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
                let source = source.to_device(Device::Cpu).contiguous();
                source
                    .f_copy_data(&mut self.flat[offset..offset + n], n)
                    .map_err(|e| TrainError::Config(format!("parameter {name}: {e}")))?;
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

/// Rank 0's checkpoint writer thread.
struct CheckpointWriter {
    queue: mpsc::Sender<(u64, Checkpoint, Metrics)>,
    thread: JoinHandle<()>,
}

impl CheckpointWriter {
    fn start(run_dir: PathBuf, progress: Arc<Progress>) -> Self {
        let (queue, jobs) = mpsc::channel::<(u64, Checkpoint, Metrics)>();
        let thread = std::thread::spawn(move || {
            for (index, checkpoint, metrics) in jobs {
                match checkpoint.save(&run_dir, index, &metrics) {
                    Ok(path) => progress.push(WorkerEvent::CheckpointSaved(SavedCheckpoint {
                        path,
                        index,
                        metrics,
                    })),
                    Err(e) => progress.push(WorkerEvent::CheckpointFailed {
                        index,
                        error: e.to_string(),
                    }),
                }
            }
        });
        CheckpointWriter { queue, thread }
    }

    fn save(&self, index: u64, checkpoint: Checkpoint, metrics: Metrics) -> Result<(), TrainError> {
        self.queue
            .send((index, checkpoint, metrics))
            .map_err(|_| TrainError::Aborted("the checkpoint writer stopped".into()))
    }

    fn finish(self) -> Result<(), TrainError> {
        drop(self.queue);
        self.thread
            .join()
            .map_err(|_| TrainError::Aborted("the checkpoint writer panicked".into()))
    }
}
