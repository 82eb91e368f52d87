//! The MNIST training loop: a small CNN trained data-parallel with SGD and
//! momentum. Shared by the `train_mnist` example and the training tests, so
//! the tests prove exactly what the example runs.

use std::path::PathBuf;
use std::rc::Rc;

use nimbus_data::{BlockingBatches, Dataset, Shard};
use nimbus_train::tch::{nn, nn::ModuleT, Device, Kind, Tensor};
use nimbus_train::{
    Checkpoint, DistributedSampler, LoopResult, Metrics, Sgd, TrainContext, TrainLoop,
};
use serde::{Deserialize, Serialize};

// Each program that includes this loop uses a different part of the
// datasets (the example prints their description, the benchmark does not).
#[allow(dead_code)]
#[path = "data/mod.rs"]
pub mod data;

use data::{embedded_digits, load_mnist, ImageData, ImageSet};
// The network is a file of its own: nimbus-serve's MNIST examples serve it.
#[path = "network.rs"]
pub mod network;
pub use network::network;
/// Where the images come from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DataSource {
    /// Generated digits: `train` and `test` samples.
    Embedded {
        /// Training samples.
        train: usize,
        /// Test samples.
        test: usize,
    },
    /// MNIST-format idx files in this directory.
    Dir(PathBuf),
    /// Parquet files in this directory's `train/` and `test/`
    /// (`data/parquet.rs`); each worker reads its shard of `train/`
    /// through nimbus Data, epoch by epoch.
    Parquet(PathBuf),
}

/// How the injected failure kills its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailMode {
    /// The worker process SIGKILLs itself (a crash).
    Kill,
    /// The training loop panics (a bug in the step).
    Panic,
    /// Corrupt the newest checkpoint on disk, then SIGKILL (a restart must
    /// skip it for the one before).
    CorruptLatestThenKill,
}

/// The loop's configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MnistConfig {
    /// Passes over the training data.
    pub epochs: u64,
    /// Batch size per worker.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// SGD momentum.
    pub momentum: f64,
    /// Seeds initial weights, the data and the shuffles.
    pub seed: u64,
    /// The data.
    pub data: DataSource,
    /// On the first attempt, the last rank dies before this global step.
    pub fail_at_step: Option<u64>,
    /// How it dies.
    pub fail_mode: FailMode,
    /// Also checkpoint every this many steps (always at each epoch's end).
    pub checkpoint_every: Option<u64>,
    /// Stop after this many global steps (for short tests).
    pub max_steps: Option<u64>,
    /// After every step, check that every replica holds rank 0's exact
    /// parameters (tests).
    pub check_replicas: bool,
    /// Train in bf16: parameters, images, activations and gradients (which
    /// NCCL averages in bf16 on GPUs).
    pub bf16: bool,
    /// Run the forward pass and the loss under libtorch's autocast (f16 on
    /// CUDA; parameters and gradients stay f32); nothing on a CPU.
    #[serde(default)]
    pub autocast: bool,
}

impl Default for MnistConfig {
    fn default() -> Self {
        MnistConfig {
            epochs: 2,
            batch_size: 64,
            lr: 0.01,
            momentum: 0.9,
            seed: 0,
            data: DataSource::Embedded {
                train: 6_000,
                test: 1_000,
            },
            fail_at_step: None,
            fail_mode: FailMode::Kill,
            checkpoint_every: None,
            max_steps: None,
            check_replicas: false,
            bf16: false,
            autocast: false,
        }
    }
}

impl MnistConfig {
    /// Loads the configured data (for parquet files, the test set only:
    /// the workers stream their shards of the training set).
    pub fn load(&self) -> Result<ImageData, Box<dyn std::error::Error + Send + Sync>> {
        Ok(match &self.data {
            DataSource::Embedded { train, test } => embedded_digits(*train, *test, self.seed),
            DataSource::Dir(dir) => load_mnist(dir)?,
            DataSource::Parquet(dir) => ImageData {
                train: ImageSet {
                    images: Tensor::zeros([0, 1, 28, 28], (Kind::Float, Device::Cpu)),
                    labels: Tensor::zeros([0], (Kind::Int64, Device::Cpu)),
                },
                test: data::parquet::read_set(&dir.join("test"))?,
                description: format!(
                    "parquet files in {}, read through nimbus Data",
                    dir.display()
                ),
            },
        })
    }

    /// The training set's parquet files, as a dataset (parquet data only).
    /// Each worker's shard is read by one block worker of half a CPU: a
    /// block worker waits for its CPUs like any actor, so the training
    /// workers must leave them free (the local cluster's 2 × 2 CPUs hold 2
    /// training workers and their 2 block workers).
    pub fn train_dataset(&self) -> Option<Dataset> {
        match &self.data {
            DataSource::Parquet(dir) => Some(
                Dataset::read_parquet([dir.join("train")])
                    .columns(["image", "label"])
                    .concurrency(1)
                    .num_cpus(0.5),
            ),
            _ => None,
        }
    }
}

/// This worker's shard of epoch `epoch`.
fn shard_of(ctx: &TrainContext, seed: u64, epoch: u64) -> Shard {
    Shard {
        index: ctx.world_rank(),
        count: ctx.world_size().max(1),
        seed,
        epoch,
    }
}

/// A worker's batches of one epoch: how many there are in all, and
/// those from `skip` on (images, labels).
struct EpochBatches {
    len: usize,
    batches: Box<dyn Iterator<Item = Result<(Tensor, Tensor), String>>>,
}

impl EpochBatches {
    /// Epoch `epoch` of `data`'s training set through `sampler`.
    fn in_memory(
        data: &Rc<ImageData>,
        sampler: &DistributedSampler,
        epoch: u64,
        size: usize,
        skip: usize,
    ) -> Self {
        let batches = sampler.batches(epoch, size);
        let data = data.clone();
        EpochBatches {
            len: batches.len(),
            batches: Box::new(
                batches
                    .into_iter()
                    .skip(skip)
                    .map(move |indices| Ok(data.train.batch(&indices))),
            ),
        }
    }

    /// This worker's shard of `dataset` in epoch `epoch`, read through
    /// the worker's runtime.
    fn shard(
        dataset: &Dataset,
        ctx: &TrainContext,
        (seed, epoch): (u64, u64),
        size: usize,
        skip: usize,
    ) -> Result<Self, String> {
        let shard = shard_of(ctx, seed, epoch);
        let rows = dataset.shard_rows(shard).map_err(|e| e.to_string())?;
        let dataset = dataset.clone();
        let start = async move { dataset.iter_shard_from(shard, size, skip as u64).await };
        let batches = BlockingBatches::spawn(ctx.runtime(), 4, start);
        Ok(EpochBatches {
            len: (rows as usize).div_ceil(size),
            batches: Box::new(
                batches.map(|batch| data::parquet::to_tensors(&batch.map_err(|e| e.to_string())?)),
            ),
        })
    }
}

/// Fraction of `data`'s test set `net` classifies right, run on `device`
/// with images of `kind` (the test tensors are moved there, batch by
/// batch).
pub fn accuracy(net: &impl ModuleT, data: &ImageData, device: Device, kind: Kind) -> f64 {
    nimbus_train::tch::no_grad(|| {
        let mut right = 0i64;
        let n = data.test.len();
        for start in (0..n).step_by(1000) {
            let end = (start + 1000).min(n);
            let batch = data.test.slice(start, end);
            let predicted = net
                .forward_t(&batch.images.to_device(device).to_kind(kind), false)
                .argmax(-1, false);
            right += predicted
                .eq_tensor(&batch.labels.to_device(device))
                .sum(Kind::Int64)
                .int64_value(&[]);
        }
        right as f64 / n.max(1) as f64
    })
}

/// The loop registered with the cluster.
pub struct MnistLoop;

impl TrainLoop for MnistLoop {
    const NAME: &'static str = "examples.MnistLoop";
    type Config = MnistConfig;

    fn run(config: MnistConfig, ctx: &mut TrainContext) -> LoopResult {
        let data = Rc::new(config.load()?);
        let dataset = config.train_dataset();
        nimbus_train::tch::manual_seed(config.seed as i64);
        let mut vs = nn::VarStore::new(ctx.device());
        let net = network(&vs.root());
        let kind = if config.bf16 {
            vs.bfloat16();
            Kind::BFloat16
        } else {
            Kind::Float
        };
        let (mut epoch, mut skip) = (0u64, 0usize);
        if let Some(checkpoint) = ctx.checkpoint() {
            checkpoint.restore_var_store(&vs)?;
            epoch = checkpoint.value("epoch")?;
            skip = checkpoint.value("batch")?;
        }
        let model = ctx.prepare_model(&vs)?;
        let mut sgd = Sgd::new(&model, config.lr, config.momentum);
        if let Some(checkpoint) = ctx.checkpoint() {
            sgd.load_from(checkpoint)?;
        }
        let sampler = ctx.sampler(data.train.len()).seed(config.seed);
        let epoch_batches = |ctx: &TrainContext, epoch: u64, skip: usize| match &dataset {
            None => Ok(EpochBatches::in_memory(
                &data,
                &sampler,
                epoch,
                config.batch_size,
                skip,
            )),
            Some(dataset) => {
                EpochBatches::shard(dataset, ctx, (config.seed, epoch), config.batch_size, skip)
            }
        };
        // The global step: every earlier epoch's batches, then this one's.
        let mut step = skip as u64;
        for earlier in 0..epoch {
            step += match &dataset {
                None => sampler.num_samples().div_ceil(config.batch_size),
                Some(dataset) => {
                    let shard = shard_of(ctx, config.seed, earlier);
                    (dataset.shard_rows(shard)? as usize).div_ceil(config.batch_size)
                }
            } as u64;
        }
        let save = |vs: &nn::VarStore,
                    sgd: &Sgd,
                    epoch: u64,
                    batch: usize|
         -> Result<Checkpoint, nimbus_train::CheckpointError> {
            sgd.save_to(Checkpoint::new().with_var_store(vs))
                .with_value("epoch", epoch)?
                .with_value("batch", batch)
        };
        while epoch < config.epochs {
            let EpochBatches { len, batches } = epoch_batches(ctx, epoch, skip)?;
            for (b, batch) in (skip..).zip(batches) {
                let (images, labels) = batch?;
                if config.max_steps.is_some_and(|max| step >= max) {
                    return Ok(());
                }
                if Some(step) == config.fail_at_step
                    && ctx.attempt() == 0
                    && !ctx.is_replacement()
                    && ctx.world_rank() + 1 == ctx.world_size()
                {
                    // The newest checkpoint rank 0 saves before this step.
                    let saved = config
                        .checkpoint_every
                        .map(|k| step / k * k)
                        .filter(|&n| n > 0);
                    die(ctx, config.fail_mode, step, saved);
                }
                let forward = || {
                    net.forward_t(&images.to_device(ctx.device()).to_kind(kind), true)
                        .cross_entropy_for_logits(&labels.to_device(ctx.device()))
                };
                // Only when asked: tch's autocast calls libtorch functions
                // that print a deprecation warning at every call (3 lines a
                // step), even to turn it off.
                let loss = if config.autocast {
                    nimbus_train::tch::autocast(true, forward)
                } else {
                    forward()
                };
                sgd.zero_grad();
                loss.backward();
                // A peer dying here is healed: its replacement resumes
                // this very batch from this worker's state.
                ctx.sync_gradients_or_heal(&model, || save(&vs, &sgd, epoch, b))?;
                sgd.step();
                step += 1;
                if config.check_replicas {
                    check_replicas(ctx, &save(&vs, &sgd, epoch, b + 1)?, step)?;
                }
                let mut metrics = Metrics::from([
                    ("loss".to_string(), loss.double_value(&[])),
                    ("epoch".to_string(), epoch as f64),
                    ("step".to_string(), step as f64),
                    (
                        "samples".to_string(),
                        (labels.size()[0] as usize * ctx.world_size().max(1)) as f64,
                    ),
                ]);
                let end_of_epoch = b + 1 == len;
                let checkpoint = if end_of_epoch {
                    metrics.insert(
                        "test_accuracy".into(),
                        accuracy(&net, &data, ctx.device(), kind),
                    );
                    Some(save(&vs, &sgd, epoch + 1, 0)?)
                } else if config.checkpoint_every.is_some_and(|k| step % k == 0) {
                    Some(save(&vs, &sgd, epoch, b + 1)?)
                } else {
                    None
                };
                ctx.report(metrics, checkpoint)?;
            }
            skip = 0;
            epoch += 1;
        }
        Ok(())
    }
}

/// Fails unless this worker's state (parameters, momentum, position: its
/// checkpoint `state`) equals rank 0's, bit for bit.
fn check_replicas(ctx: &mut TrainContext, state: &Checkpoint, step: u64) -> LoopResult {
    let mut mine = Vec::new();
    for (_, tensor) in state.tensors() {
        mine.extend(Vec::<f32>::try_from(
            tensor.to_kind(Kind::Float).flatten(0, -1),
        )?);
    }
    for key in ["epoch", "batch"] {
        mine.push(state.value::<u64>(key)? as f32);
    }
    let mut rank0 = mine.clone();
    ctx.collective().broadcast(&mut rank0, 0)?;
    let same = mine.len() == rank0.len()
        && mine
            .iter()
            .zip(&rank0)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    if !same {
        return Err(format!(
            "rank {} diverged from rank 0 after step {step}",
            ctx.world_rank()
        )
        .into());
    }
    Ok(())
}

/// The injected failure: record when, then die.
/// `saved`: the newest checkpoint rank 0 has saved (or is saving, on its
/// writer thread) by this step, if any.
fn die(ctx: &TrainContext, mode: FailMode, step: u64, saved: Option<u64>) {
    // When it dies, for recovery times (`injected-failure`).
    let mark = || {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let _ = std::fs::write(ctx.run_dir().join("injected-failure"), format!("{at}\n"));
    };
    match mode {
        FailMode::Kill => {
            // Deterministic for the tests: the failure comes after the
            // checkpoint it should resume from is complete.
            wait_for_checkpoint(ctx, saved);
            eprintln!(
                "injected failure: rank {} SIGKILLs itself at step {step}",
                ctx.world_rank()
            );
            mark();
            // SAFETY: plain syscall on this process.
            unsafe {
                libc::raise(libc::SIGKILL);
            }
        }
        FailMode::Panic => {
            mark();
            panic!("injected failure at step {step}")
        }
        FailMode::CorruptLatestThenKill => {
            // The newest one is the one corrupted.
            wait_for_checkpoint(ctx, saved);
            let newest = std::fs::read_dir(ctx.run_dir())
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("checkpoint_"))
                })
                .max();
            if let Some(dir) = newest {
                let file = dir.join(nimbus_train::checkpoint::TENSORS_FILE);
                if let Ok(mut bytes) = std::fs::read(&file) {
                    if let Some(last) = bytes.last_mut() {
                        *last ^= 0xff;
                    }
                    let _ = std::fs::write(&file, bytes);
                    let _ = std::fs::write(
                        ctx.run_dir().join("corrupted"),
                        dir.to_string_lossy().as_bytes(),
                    );
                }
            }
            die(ctx, FailMode::Kill, step, None)
        }
    }
}

/// Rank 0 writes checkpoints off its training thread: waits (at most 30 s)
/// until checkpoint `saved` is in place.
fn wait_for_checkpoint(ctx: &TrainContext, saved: Option<u64>) {
    let Some(index) = saved else {
        return;
    };
    let dir = ctx
        .run_dir()
        .join(nimbus_train::checkpoint::directory_name(index));
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !dir.join(nimbus_train::checkpoint::MANIFEST_FILE).exists()
        && std::time::Instant::now() < end
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
