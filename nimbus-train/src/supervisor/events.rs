//! What a training run tells its observer, as it happens.

use std::path::PathBuf;
use std::time::Duration;

use crate::checkpoint;
use crate::{CollectiveBackend, Metrics};

/// What happens during a run, as it happens (for progress displays).
#[derive(Clone, Debug, PartialEq)]
pub enum TrainEvent {
    /// An attempt's workers are training.
    Started {
        /// 0 first, then one per restart.
        attempt: u32,
        /// Its workers (0: local mode).
        workers: usize,
        /// The checkpoint it resumed from.
        resumed_from: Option<PathBuf>,
        /// The collective its workers average gradients with (`None`: local
        /// mode, no collective).
        backend: Option<CollectiveBackend>,
        /// The node each rank runs on, by rank (empty in local mode).
        nodes: Vec<String>,
    },
    /// Rank 0 reported.
    Reported {
        /// The report's index.
        index: u64,
        /// Its metrics.
        metrics: Metrics,
        /// Whether a checkpoint was saved with it (its `CheckpointSaved`
        /// follows once complete, unless the attempt fails first).
        checkpoint: bool,
    },
    /// A checkpoint is complete on disk.
    CheckpointSaved(checkpoint::SavedCheckpoint),
    /// A fault-injection rule fired in a worker.
    FaultInjected {
        /// The fault's kind.
        fault: String,
        /// What it hit (`rank-N`).
        target: String,
        /// What fired it (`step N`).
        trigger: String,
    },
    /// An elastic run is restarting with a different number of workers
    /// (resources came back).
    Rescaling {
        /// Workers now.
        from: usize,
        /// Workers it restarts with.
        to: usize,
    },
    /// Workers died and are being replaced, healed from a live peer
    /// (`heal/mod.rs`): the attempt goes on.
    Healing {
        /// The ranks being replaced.
        ranks: Vec<usize>,
        /// The survivor that sends its state.
        source: usize,
        /// Why (the death).
        reason: String,
    },
    /// Every replaced rank reported: the heal is over.
    Healed {
        /// The ranks it replaced.
        ranks: Vec<usize>,
        /// From the first death it mended to the last replacement's first
        /// report.
        took: Duration,
    },
    /// An attempt failed; the group is being torn down.
    Failed {
        /// The attempt.
        attempt: u32,
        /// Why.
        reason: String,
    },
}

/// Called with every [`TrainEvent`], on the driver's actix thread.
pub type TrainObserver = Box<dyn FnMut(&TrainEvent)>;
