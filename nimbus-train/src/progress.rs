//! What a training loop has done so far, shared between the loop's thread
//! and whoever watches it (the `TrainerWorker` actor answering the
//! supervisor's polls, or the supervisor itself in local mode).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nimbus::library::LoopProgress;
use serde::{Deserialize, Serialize};

use super::checkpoint::{NoSpace, SavedCheckpoint};
use super::{LoopFailed, Metrics};

/// Something a worker's loop did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WorkerEvent {
    /// `report(metrics, checkpoint)`; `checkpoint` says whether a
    /// checkpoint is being written for it.
    Report {
        /// The report's index (1-based, continuing across restarts).
        index: u64,
        /// The metrics.
        metrics: Metrics,
        /// Whether a checkpoint is being written.
        checkpoint: bool,
    },
    /// A checkpoint is complete on disk.
    CheckpointSaved(SavedCheckpoint),
    /// A fault-injection rule fired in this worker.
    FaultInjected {
        /// The fault's kind.
        fault: String,
        /// What it hit (`rank-N`).
        target: String,
        /// What fired it (`step N`).
        trigger: String,
    },
    /// A checkpoint could not be written.
    CheckpointFailed {
        /// The report index.
        index: u64,
        /// Why.
        error: String,
    },
    /// A checkpoint did not fit on its filesystem: the run cannot go on.
    StorageFull(NoSpace),
}

/// A poll's answer: events after the asked sequence number, the step
/// counter, and the outcome once the loop is over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgressReport {
    /// Events, numbered from 1.
    pub events: Vec<(u64, WorkerEvent)>,
    /// Reports plus collective operations so far: the liveness signal.
    pub steps: u64,
    /// `Some` once the loop returned (and its checkpoints are written).
    pub finished: Option<Result<(), LoopFailed>>,
    /// The loop heals from a peer (`heal/mod.rs`): it has called
    /// `TrainContext::sync_gradients_or_heal`.
    #[serde(default)]
    pub healable: bool,
}

/// A loop's progress: its events and outcome (`nimbus::library`'s loop
/// protocol), and a step counter for liveness.
#[derive(Default)]
pub(crate) struct Progress {
    log: LoopProgress<WorkerEvent, Result<(), LoopFailed>>,
    steps: AtomicU64,
    healable: AtomicBool,
}

impl Progress {
    /// Records an event.
    pub(crate) fn push(&self, event: WorkerEvent) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.log.push(event);
    }

    /// Counts a collective step.
    pub(crate) fn step(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }

    /// The loop heals from a peer.
    pub(crate) fn set_healable(&self) {
        self.healable.store(true, Ordering::Relaxed);
    }

    /// Records the loop's outcome.
    pub(crate) fn finish(&self, outcome: Result<(), LoopFailed>) {
        self.log.finish(outcome);
    }

    /// Asks the loop to stop; its next report or collective fails.
    pub(crate) fn abort(&self, reason: &str) {
        self.log.stop(reason);
    }

    /// Why the loop was asked to stop, if it was.
    pub(crate) fn aborted(&self) -> Option<String> {
        self.log.stop_reason()
    }

    /// Events after `after`, waiting up to `wait` for one (or the end).
    pub(crate) async fn poll(&self, after: u64, wait: Duration) -> ProgressReport {
        let polled = self.log.poll(after, wait).await;
        ProgressReport {
            events: polled.events,
            steps: self.steps.load(Ordering::Relaxed),
            finished: polled.end,
            healable: self.healable.load(Ordering::Relaxed),
        }
    }
}
