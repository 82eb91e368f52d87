//! Training runs as the head keeps them for people to look at (the
//! dashboard's training page): what a run's supervisor reports as it goes
//! (`JobRequest::RunEvents`), applied by `crate::head`'s `runs.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which run a batch of events is about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunHeader {
    /// The run's id, drawn by its supervisor (8 hex digits).
    pub id: String,
    /// Its name (`RunConfig::name`).
    pub name: String,
    /// Its run directory, on the driver's machine.
    pub dir: String,
    /// The job whose driver runs it.
    pub job: String,
}

/// Something a run did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RunEvent {
    /// An attempt started.
    Started {
        /// The attempt (0 first).
        attempt: u32,
        /// Its workers.
        workers: usize,
        /// The checkpoint it resumed from.
        resumed_from: Option<String>,
        /// Unix milliseconds.
        time_ms: u64,
    },
    /// Rank 0 reported.
    Reported(RunPoint),
    /// A checkpoint is complete.
    Checkpoint(RunCheckpoint),
    /// An attempt failed.
    Failed {
        /// The attempt.
        attempt: u32,
        /// Why.
        reason: String,
        /// Unix milliseconds.
        time_ms: u64,
    },
    /// The first report after a restart: the run recovered.
    Recovered {
        /// The report.
        index: u64,
        /// From the failure to this report.
        took_ms: u64,
        /// Unix milliseconds.
        time_ms: u64,
    },
    /// The run ended.
    Finished {
        /// Why it failed, if it did.
        error: Option<String>,
        /// Unix milliseconds.
        time_ms: u64,
    },
}

/// One report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunPoint {
    /// The report's number.
    pub index: u64,
    /// The attempt's generation (as in `metrics.jsonl`).
    pub attempt: u64,
    /// Unix milliseconds.
    pub time_ms: u64,
    /// The metrics.
    pub metrics: BTreeMap<String, f64>,
}

/// One saved checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunCheckpoint {
    /// The report it was saved with.
    pub index: u64,
    /// Its directory.
    pub path: String,
    /// The metrics reported with it (its score among them).
    pub metrics: BTreeMap<String, f64>,
}

/// A line of a run's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunNote {
    /// Unix milliseconds.
    pub time_ms: u64,
    /// `started`, `failed`, `recovered` or `finished`.
    pub kind: String,
    /// What happened.
    pub text: String,
}

/// A run as the head knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Who it is.
    pub header: RunHeader,
    /// `RUNNING`, `FINISHED` or `FAILED`.
    pub state: String,
    /// When its first event came, Unix milliseconds.
    pub started_ms: u64,
    /// When it finished.
    pub ended_ms: Option<u64>,
    /// Attempts started.
    pub attempts: u32,
    /// Reports received (all of them, whether `points` keeps them or not).
    pub reports: u64,
    /// The last reports (listings leave them out).
    pub points: Vec<RunPoint>,
    /// Its checkpoints.
    pub checkpoints: Vec<RunCheckpoint>,
    /// Starts, failures, recoveries, the end.
    pub timeline: Vec<RunNote>,
    /// The last report's metrics.
    pub last: BTreeMap<String, f64>,
}
