//! How a training run is scaled, named, stored and kept alive, and what it
//! returns: Ray Train's `ScalingConfig`, `RunConfig` and `Result`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::checkpoint::SavedCheckpoint;
use super::faults::TrainingFault;
use super::TrainError;
use nimbus::cluster::ResourceSet;
use nimbus::placement::PlacementStrategy;

/// Reported metrics: name → value.
pub type Metrics = BTreeMap<String, f64>;

/// How many workers a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerCount {
    /// Exactly this many; 0 runs the loop in the driver process (for
    /// debugging).
    Fixed(usize),
    /// As many as fit, between `min` and `max`: after a failure the run
    /// restarts with fewer workers when resources are gone.
    Elastic {
        /// The fewest workers to train with.
        min: usize,
        /// The most.
        max: usize,
    },
}

/// How the run is spread over the cluster.
///
/// ```
/// use nimbus_train::ScalingConfig;
/// let scaling = ScalingConfig::workers(2).cpus_per_worker(1.0);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalingConfig {
    /// Number of workers.
    pub workers: WorkerCount,
    /// One GPU per worker (adds `GPU: 1` to each worker's resources).
    pub use_gpu: bool,
    /// Resources each worker reserves (default `CPU: 1`).
    pub resources_per_worker: ResourceSet,
    /// How the workers' bundles are placed (default PACK).
    pub placement: PlacementStrategy,
    /// How the workers exchange gradients.
    pub collective: CollectiveBackend,
}

/// The collective backend of a training group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CollectiveBackend {
    /// NCCL for GPU workers (`use_gpu`) that each hold whole GPUs; else
    /// (CPU workers, or GPU workers sharing devices, which NCCL refuses)
    /// shared memory when every worker is on one host, else the network.
    #[default]
    Auto,
    /// NCCL (feature `cuda`; GPU workers).
    Nccl,
    /// Shared memory (every worker must be on one host).
    SharedMemory,
    /// Ring collectives over actor messages (QUIC), on any hosts.
    Network,
}

impl ScalingConfig {
    /// `n` workers of one CPU each, packed.
    pub fn workers(n: usize) -> Self {
        ScalingConfig {
            workers: WorkerCount::Fixed(n),
            use_gpu: false,
            resources_per_worker: ResourceSet::of(nimbus::cluster::CPU, 1.0),
            placement: PlacementStrategy::Pack,
            collective: CollectiveBackend::Auto,
        }
    }

    /// Between `min` and `max` workers.
    pub fn elastic(min: usize, max: usize) -> Self {
        ScalingConfig {
            workers: WorkerCount::Elastic { min, max },
            ..Self::workers(max)
        }
    }

    /// One GPU per worker (unless [`gpus_per_worker`](Self::gpus_per_worker)
    /// says otherwise).
    pub fn use_gpu(mut self, use_gpu: bool) -> Self {
        self.use_gpu = use_gpu;
        self
    }

    /// GPUs per worker: a fraction puts several workers on one GPU.
    pub fn gpus_per_worker(mut self, gpus: f64) -> Self {
        self.resources_per_worker.set(nimbus::cluster::GPU, gpus);
        self
    }

    /// CPUs per worker.
    pub fn cpus_per_worker(mut self, cpus: f64) -> Self {
        self.resources_per_worker.set(nimbus::cluster::CPU, cpus);
        self
    }

    /// The placement strategy of the workers' bundles.
    pub fn placement(mut self, strategy: PlacementStrategy) -> Self {
        self.placement = strategy;
        self
    }

    /// The collective backend.
    pub fn collective(mut self, backend: CollectiveBackend) -> Self {
        self.collective = backend;
        self
    }

    /// What one worker's bundle reserves.
    pub fn bundle(&self) -> ResourceSet {
        let mut bundle = self.resources_per_worker.clone();
        if self.use_gpu && bundle.amount(nimbus::cluster::GPU) <= 0.0 {
            bundle.set(nimbus::cluster::GPU, 1.0);
        }
        bundle
    }
}

/// Whether a higher or lower score is better.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScoreOrder {
    /// Higher is better (accuracy).
    #[default]
    Max,
    /// Lower is better (loss).
    Min,
}

/// Which checkpoints to keep.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointConfig {
    /// How many to keep (the latest is always kept too); `None` keeps all.
    pub num_to_keep: Option<usize>,
    /// The metric that ranks checkpoints; without one the newest are best.
    pub score_attribute: Option<String>,
    /// Whether higher or lower scores are better.
    pub score_order: ScoreOrder,
}

/// Naming, storage and fault tolerance of a run.
///
/// ```
/// use nimbus_train::RunConfig;
/// let run = RunConfig::new("mnist", "/data/runs").max_failures(3).num_to_keep(2);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// The run's name: its directory under `storage_path`.
    pub name: String,
    /// Where checkpoints go (a filesystem every worker's node can write).
    pub storage_path: PathBuf,
    /// How many failures to recover from before giving up (default 0).
    pub max_failures: u32,
    /// Checkpoint retention.
    pub checkpoint: CheckpointConfig,
    /// A worker that makes no progress (no report, no collective step) for
    /// this long is declared hung and the group is restarted.
    pub progress_timeout: Duration,
    /// How long a collective operation waits for its peers.
    pub collective_timeout: Duration,
    /// How long to wait for the workers' resources on each attempt.
    pub placement_timeout: Duration,
    /// Faults to inject into the first attempt (fault-injection tests);
    /// those in `NIMBUS_TRAINING_FAULTS` are added.
    pub faults: Vec<TrainingFault>,
}

impl RunConfig {
    /// A run named `name` stored under `storage_path`.
    pub fn new(name: impl Into<String>, storage_path: impl Into<PathBuf>) -> Self {
        RunConfig {
            name: name.into(),
            storage_path: storage_path.into(),
            max_failures: 0,
            checkpoint: CheckpointConfig::default(),
            progress_timeout: Duration::from_secs(120),
            collective_timeout: Duration::from_secs(60),
            placement_timeout: Duration::from_secs(30),
            faults: Vec::new(),
        }
    }

    /// Injects `fault` into the first attempt.
    pub fn inject(mut self, fault: TrainingFault) -> Self {
        self.faults.push(fault);
        self
    }

    /// Failures to recover from.
    pub fn max_failures(mut self, failures: u32) -> Self {
        self.max_failures = failures;
        self
    }

    /// Checkpoints to keep.
    pub fn num_to_keep(mut self, keep: usize) -> Self {
        self.checkpoint.num_to_keep = Some(keep);
        self
    }

    /// Rank checkpoints by `attribute`, higher or lower better.
    pub fn score(mut self, attribute: impl Into<String>, order: ScoreOrder) -> Self {
        self.checkpoint.score_attribute = Some(attribute.into());
        self.checkpoint.score_order = order;
        self
    }

    /// The per-worker progress deadline.
    pub fn progress_timeout(mut self, timeout: Duration) -> Self {
        self.progress_timeout = timeout;
        self
    }

    /// The collective deadline.
    pub fn collective_timeout(mut self, timeout: Duration) -> Self {
        self.collective_timeout = timeout;
        self
    }

    /// The placement deadline.
    pub fn placement_timeout(mut self, timeout: Duration) -> Self {
        self.placement_timeout = timeout;
        self
    }

    /// `storage_path/name`.
    pub fn run_dir(&self) -> PathBuf {
        self.storage_path.join(&self.name)
    }
}

/// What [`Trainer::fit`](super::Trainer::fit) returns.
#[derive(Debug)]
pub struct TrainResult {
    /// The last metrics reported (by rank 0).
    pub metrics: Option<Metrics>,
    /// Every report of rank 0, in order, as an uninterrupted run would have
    /// made them: reports of an attempt that failed after its last
    /// checkpoint are replaced by those of the resumed attempt.
    pub metrics_history: Vec<Metrics>,
    /// The latest complete checkpoint.
    pub checkpoint: Option<SavedCheckpoint>,
    /// The kept checkpoints, best first.
    pub best_checkpoints: Vec<SavedCheckpoint>,
    /// The run's directory.
    pub path: PathBuf,
    /// Restarts of the worker group.
    pub restarts: u32,
    /// Workers in the final attempt.
    pub workers: usize,
    /// Why the run failed, if it did: the first failure's cause first.
    pub error: Option<TrainError>,
}

impl TrainResult {
    /// SHA-256 of the final checkpoint's model parameters (see
    /// [`Checkpoint::model_sha256`](super::Checkpoint::model_sha256)):
    /// equal for two runs that ended with the same parameters, such as a
    /// run under faults and the fault-free run.
    pub fn final_parameters_sha256(&self) -> Result<Option<String>, super::CheckpointError> {
        match &self.checkpoint {
            Some(saved) => Ok(Some(super::Checkpoint::load(&saved.path)?.model_sha256()?)),
            None => Ok(None),
        }
    }
}
