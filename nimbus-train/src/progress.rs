//! What a training loop has done so far, shared between the loop's thread
//! and whoever watches it (the `TrainerWorker` actor answering the
//! supervisor's polls, or the supervisor itself in local mode).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

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
}

#[derive(Default)]
struct State {
    events: Vec<WorkerEvent>,
    finished: Option<Result<(), LoopFailed>>,
}

/// A loop's progress.
pub(crate) struct Progress {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    steps: AtomicU64,
    aborted: Mutex<Option<String>>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            state: Mutex::default(),
            changed: watch::channel(0).0,
            steps: AtomicU64::new(0),
            aborted: Mutex::default(),
        }
    }
}

impl Progress {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Records an event.
    pub(crate) fn push(&self, event: WorkerEvent) {
        self.lock().events.push(event);
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.bump();
    }

    /// Counts a collective step.
    pub(crate) fn step(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the loop's outcome.
    pub(crate) fn finish(&self, outcome: Result<(), LoopFailed>) {
        self.lock().finished = Some(outcome);
        self.bump();
    }

    /// Asks the loop to stop; its next report or collective fails.
    pub(crate) fn abort(&self, reason: &str) {
        let mut aborted = self.aborted.lock().unwrap_or_else(|e| e.into_inner());
        aborted.get_or_insert_with(|| reason.to_string());
    }

    /// Why the loop was asked to stop, if it was.
    pub(crate) fn aborted(&self) -> Option<String> {
        self.aborted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn snapshot(&self, after: u64) -> ProgressReport {
        let state = self.lock();
        ProgressReport {
            events: state
                .events
                .iter()
                .enumerate()
                .skip(after as usize)
                .map(|(i, e)| (i as u64 + 1, e.clone()))
                .collect(),
            steps: self.steps.load(Ordering::Relaxed),
            finished: state.finished.clone(),
        }
    }

    /// Events after `after`, waiting up to `wait` for one (or the end).
    pub(crate) async fn poll(&self, after: u64, wait: Duration) -> ProgressReport {
        let mut changed = self.changed.subscribe();
        changed.borrow_and_update();
        let report = self.snapshot(after);
        if !report.events.is_empty() || report.finished.is_some() {
            return report;
        }
        let _ = tokio::time::timeout(wait, changed.changed()).await;
        self.snapshot(after)
    }
}
