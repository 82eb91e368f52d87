//! Errors of the training layer.

use serde::{Deserialize, Serialize};

use super::checkpoint::{CheckpointError, NoSpace, NotShared};
use super::collective::CollectiveError;
use nimbus::actor::{CallError, SpawnError};
use nimbus::cluster::Torch;
use nimbus::placement::PlacementError;

/// Why training (or one attempt of it) failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The configuration cannot work.
    #[error("invalid training configuration: {0}")]
    Config(String),
    /// The run directory cannot be created.
    #[error("cannot create the run directory {path}: {source}")]
    RunDir {
        /// The directory (`RunConfig::storage_path` and the run's name).
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The checkpoint to resume from is unusable.
    #[error("cannot resume from {path}: {source}")]
    Resume {
        /// The checkpoint.
        path: std::path::PathBuf,
        /// What is wrong with it.
        source: CheckpointError,
    },
    /// A parameter's type cannot be averaged across workers.
    #[error(
        "parameter {name} is {kind}; data-parallel training averages f32, bf16 and f16 parameters"
    )]
    ParameterKind {
        /// The parameter.
        name: String,
        /// Its type.
        kind: String,
    },
    /// A parameter could not be copied for the allreduce.
    #[error("parameter {name}: {source}")]
    Parameter {
        /// The parameter.
        name: String,
        /// libtorch's error.
        source: tch::TchError,
    },
    /// A checkpoint's tensor does not fit the model it is loaded into.
    #[error("checkpoint {what} has shape {saved:?}, the model's {current:?}")]
    Shape {
        /// Which tensor.
        what: String,
        /// Its shape in the checkpoint.
        saved: Vec<i64>,
        /// The model's.
        current: Vec<i64>,
    },
    /// The supervisor and a worker disagree on the worker's group: a bug.
    #[error("the supervisor and a worker disagree: {0}")]
    Mismatch(&'static str),
    /// An NCCL group could not be formed (a program built without the
    /// `cuda` feature, or rank 0 could not make the group's id).
    #[error("cannot form an NCCL group: {0}")]
    Nccl(String),
    /// `use_gpu` is set and the worker's libtorch sees no CUDA device.
    #[error("use_gpu is set but libtorch sees no CUDA device in worker rank {rank}")]
    NoGpu {
        /// The worker's rank.
        rank: usize,
    },
    /// `NIMBUS_TRAINING_FAULTS` is malformed.
    #[error(transparent)]
    FaultPlan(#[from] nimbus::library::FaultPlanError),
    /// The runtime could not be asked (not connected, or the head did not
    /// answer).
    #[error("the nimbus runtime: {0}")]
    Runtime(#[from] nimbus::library::LibraryError),
    /// The workers' resources could not be reserved.
    #[error("cannot place the training workers: {0}")]
    Placement(#[from] PlacementError),
    /// A worker actor could not be started.
    #[error("cannot start a training worker: {0}")]
    Spawn(#[from] SpawnError),
    /// A worker could not be reached.
    #[error("training worker unreachable: {0}")]
    Call(#[from] CallError),
    /// A worker died, failed or hung.
    #[error("worker rank {rank} failed: {reason}")]
    WorkerFailed {
        /// Its rank.
        rank: usize,
        /// What happened.
        reason: String,
    },
    /// More failures than `max_failures`.
    #[error("training failed {failures} times (max_failures = {max_failures}); first failure: {first}; last failure: {last}")]
    FailuresExhausted {
        /// Failures seen.
        failures: u32,
        /// The limit.
        max_failures: u32,
        /// The first failure, the root cause.
        first: String,
        /// The last failure.
        last: String,
    },
    /// A collective operation failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A heal from a peer failed on this worker (`heal/mod.rs`).
    #[error(transparent)]
    Heal(#[from] crate::heal::HealError),
    /// The run's results files (`results.rs`) cannot be opened.
    #[error("the run's results files: {0}")]
    Results(#[from] crate::results::ResultsError),
    /// A checkpoint did not fit on its filesystem: the run stopped at once,
    /// keeping its last good checkpoint.
    #[error("training stopped: {0}")]
    StorageFull(NoSpace),
    /// A checkpoint rank 0 saved is not on the driver's filesystem: the run
    /// stopped at its first checkpoint.
    #[error("training stopped: {0}")]
    StorageNotShared(NotShared),
    /// The supervisor stopped this worker (a peer failed).
    #[error("training aborted: {0}")]
    Aborted(String),
    /// libtorch failed.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// The user's training loop returned an error.
    #[error("training loop error: {0}")]
    Loop(String),
    /// A worker loaded another libtorch than the driver: tensors,
    /// checkpoints and collectives are only known to agree within one
    /// release and CUDA build, so the run stops.
    #[error("worker rank {rank} on node {node} loaded {worker}, and the driver {driver}: run a training program against one libtorch release and CUDA build on every machine (the same torch install, or the container image's lib/)")]
    OtherLibtorch {
        /// The worker's rank.
        rank: usize,
        /// Its node.
        node: String,
        /// The worker's libtorch.
        worker: Box<Torch>,
        /// The driver's.
        driver: Box<Torch>,
    },
}

/// A training worker refused a request. It travels back to the
/// supervisor over the wire, so it is serializable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum WorkerRefusal {
    /// `StartTraining` came twice.
    #[error("this worker is already training")]
    AlreadyTraining,
    /// `PollTraining` before `StartTraining`.
    #[error("this worker has not started training")]
    NotTraining,
    /// The worker process has no nimbus runtime.
    #[error("nimbus is not initialised in the worker")]
    NotInitialized,
    /// The binary registers no loop of that name.
    #[error("training loop {0:?} is not registered in this binary (Registry::train_loop)")]
    UnknownLoop(String),
    /// The network collective's inbox was handed out already.
    #[error("this worker's collective inbox is taken")]
    InboxTaken,
    /// The loop's thread could not start.
    #[error("cannot start the training thread: {0}")]
    Thread(String),
    /// NCCL is unavailable: built without the `cuda` feature, or the
    /// library failed.
    #[error("no NCCL: {0}")]
    Nccl(String),
    /// The worker loaded another libtorch release or CUDA build than the
    /// driver's.
    #[error("this worker loaded {worker}, and the driver {driver}")]
    OtherLibtorch {
        /// The worker's.
        worker: Box<Torch>,
        /// The driver's.
        driver: Box<Torch>,
    },
}

/// How a training loop ended badly, as its worker reports it to the
/// supervisor: the loop's error, rendered where it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{0}")]
pub struct LoopFailed(pub String);
