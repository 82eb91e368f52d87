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
    /// NCCL's settings for this run's ranks (with the NCCL collective).
    #[serde(default)]
    pub nccl: NcclSettings,
}

/// NCCL's settings for one run, applied in every rank before it touches
/// NCCL. A rank's NCCL otherwise reads the environment its node was
/// started with (`nimbus start`, or the driver's for a local cluster);
/// these go over it, for this run only.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclSettings {
    /// `NCCL_*` variables (`NCCL_DEBUG`, `NCCL_SOCKET_IFNAME`, ...), in
    /// order.
    pub env: Vec<(String, String)>,
    /// A test knob for machines with one GPU: each rank gets an
    /// `NCCL_HOSTID` of its own, so NCCL takes ranks on one device for
    /// ranks on different hosts (it refuses two ranks on one device of one
    /// host) and connects them through its socket transport
    /// (`NCCL_NET=Socket`, unless [`env`](Self::env) sets it). Functional
    /// checking only: it measures nothing a real multi-GPU run would.
    pub host_id_per_rank: bool,
}

impl NcclSettings {
    /// Checks every variable: an `NCCL_` name of letters, digits and `_`,
    /// and a value without NUL bytes.
    pub fn validate(&self) -> Result<(), TrainError> {
        for (name, value) in &self.env {
            if !name.starts_with("NCCL_") {
                return Err(TrainError::Config(format!(
                    "`{name}` is not an NCCL setting: ScalingConfig::nccl_env takes NCCL_* variables only"
                )));
            }
            let name_ok = name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if !name_ok || value.contains('\0') {
                return Err(TrainError::Config(format!(
                    "NCCL setting `{}`: a name is NCCL_ and capitals, digits or `_`, and a value has no NUL byte",
                    name.escape_debug()
                )));
            }
        }
        Ok(())
    }

    /// The variables rank `rank` sets: [`env`](Self::env), then with
    /// [`host_id_per_rank`](Self::host_id_per_rank) its own `NCCL_HOSTID`
    /// (which wins).
    pub fn for_rank(&self, rank: usize) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.host_id_per_rank {
            // Ranks of "other hosts" on one machine: NCCL's socket
            // transport, never an InfiniBand loopback (unless `env` says).
            env.push((NET.to_string(), "Socket".to_string()));
        }
        env.extend(self.env.iter().cloned());
        if self.host_id_per_rank {
            env.push((HOST_ID.to_string(), format!("nimbus-rank{rank}")));
        }
        env
    }
}

/// The variable NCCL tells hosts apart by.
const HOST_ID: &str = "NCCL_HOSTID";
/// The variable that picks NCCL's network transport.
const NET: &str = "NCCL_NET";

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
            nccl: NcclSettings::default(),
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

    /// Sets NCCL variable `name` (an `NCCL_*` name) to `value` in every rank
    /// of the run, over its node's environment (checked when the run
    /// starts).
    pub fn nccl_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.nccl.env.push((name.into(), value.into()));
        self
    }

    /// Gives each rank its own `NCCL_HOSTID` ([`NcclSettings::host_id_per_rank`]):
    /// a test knob, so that ranks sharing one GPU can form an NCCL group.
    pub fn nccl_host_id_per_rank(mut self, on: bool) -> Self {
        self.nccl.host_id_per_rank = on;
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
    /// Heal a group whose worker died from a live peer instead of
    /// restarting it from the checkpoint, where the group and its loop can
    /// (default on; `nimbus_train::heal`). A heal counts as a failure.
    #[serde(default = "heal_by_default")]
    pub peer_heal: bool,
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
            peer_heal: true,
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

    /// Heal from a live peer where the group can (default `true`), or
    /// always restart from the checkpoint.
    pub fn peer_heal(mut self, on: bool) -> Self {
        self.peer_heal = on;
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

fn heal_by_default() -> bool {
    true
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_settings_take_nccl_variables_only_and_give_each_rank_its_host_id() {
        let scaling = ScalingConfig::workers(2)
            .nccl_env("NCCL_DEBUG", "INFO")
            .nccl_host_id_per_rank(true);
        assert!(scaling.nccl.validate().is_ok());
        assert_eq!(
            scaling.nccl.for_rank(1),
            [
                ("NCCL_NET".to_string(), "Socket".to_string()),
                ("NCCL_DEBUG".to_string(), "INFO".to_string()),
                ("NCCL_HOSTID".to_string(), "nimbus-rank1".to_string()),
            ]
        );
        assert_ne!(scaling.nccl.for_rank(0), scaling.nccl.for_rank(1));
        let without = ScalingConfig::workers(2).nccl_env("NCCL_DEBUG", "WARN");
        assert_eq!(without.nccl.for_rank(0), without.nccl.for_rank(1));

        let refused = |name: &str, value: &str| {
            let settings = ScalingConfig::workers(1).nccl_env(name, value).nccl;
            match settings.validate() {
                Err(TrainError::Config(message)) => message,
                other => panic!("{name}={value:?} was not refused: {other:?}"),
            }
        };
        assert!(refused("LD_PRELOAD", "/tmp/x.so").contains("`LD_PRELOAD` is not an NCCL setting"));
        assert!(refused("NCCL_A=B", "1").contains("NCCL_A=B"));
        assert!(refused("NCCL_DEBUG", "IN\0FO").contains("NUL"));
    }
}
