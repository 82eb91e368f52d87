//! What the head is told of an experiment's trials, for the dashboard's
//! training page: each trial that runs for [`SHOW_AFTER`] or more is a run
//! there (named `<experiment>/trial_<id>`), reported through
//! `crate::library::RunReporter`, as training runs are. Shorter trials
//! stay in the experiment's files only: the head keeps the last 100 runs,
//! and a thousand trials of milliseconds would push every training run
//! out of the page (and cost the experiment two head requests a trial).
//!
//! 1. A trial's run starts: `Started`, with the checkpoint it resumes from.
//! 2. Each result: `Reported` (index: the trial's iteration; attempt: its
//!    run), and `Checkpoint` when one was saved with it.
//! 3. A failure: `Failed`; a trial that ends (done, stopped, or failed for
//!    good): `Finished`, with the error that ended it.
//! 4. A trial's events are held from its first start until an event comes
//!    [`SHOW_AFTER`] or later (counted from that first start, waits for a
//!    retry included): then its reporter opens and sends them, and the
//!    later ones as they come. A trial that ends sooner is not shown.
//! 5. At the experiment's end, what is still open is finished, and the
//!    fit waits for every reporter to have sent what it queued (at most
//!    `FLUSH_WAIT`, all at once).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::experiment::{ResultLine, TrialRecord};
use crate::cluster::{RunCheckpoint, RunEvent, RunHeader, RunPoint};
use crate::library::{self, now_ms, RunReporter};

/// How long a trial runs before the dashboard shows it (step 4).
pub(super) const SHOW_AFTER: Duration = Duration::from_secs(1);

/// A trial the head is told of, or not yet.
enum Shown {
    /// Since its first start; its events so far.
    Held(Instant, Vec<RunEvent>),
    Open(RunReporter),
}

/// The trials' reporters.
pub(super) struct TrialReports {
    experiment: String,
    trials: HashMap<u64, Shown>,
    /// Ended trials' reporters sending what is queued.
    finishing: Vec<tokio::task::JoinHandle<()>>,
}

impl TrialReports {
    /// Reports for experiment `experiment` (its directory's name).
    pub(super) fn new(experiment: String) -> Self {
        TrialReports {
            experiment,
            trials: HashMap::new(),
            finishing: Vec::new(),
        }
    }

    /// Step 1.
    pub(super) fn started(&mut self, trial: &TrialRecord) {
        let event = RunEvent::Started {
            attempt: trial.runs.saturating_sub(1),
            workers: 0,
            resumed_from: trial
                .checkpoint
                .as_ref()
                .map(|c| c.path.display().to_string()),
            time_ms: now_ms(),
        };
        self.send(trial, event);
    }

    /// Step 2.
    pub(super) fn result(&mut self, trial: &TrialRecord, line: &ResultLine) {
        let point = RunEvent::Reported(RunPoint {
            index: line.iteration,
            attempt: u64::from(line.attempt),
            time_ms: line.time_ms,
            metrics: line.metrics.clone(),
        });
        self.send(trial, point);
        if let Some(path) = &line.checkpoint {
            let checkpoint = RunEvent::Checkpoint(RunCheckpoint {
                index: line.iteration,
                path: path.display().to_string(),
                metrics: line.metrics.clone(),
            });
            self.send(trial, checkpoint);
        }
    }

    /// Step 3: `trial`'s latest run failed.
    pub(super) fn failed(&mut self, trial: &TrialRecord, reason: &str) {
        let event = RunEvent::Failed {
            attempt: trial.runs.saturating_sub(1),
            reason: reason.to_string(),
            time_ms: now_ms(),
        };
        self.send(trial, event);
    }

    /// Step 3: `trial` ended.
    pub(super) fn finished(&mut self, trial: &TrialRecord, error: Option<String>) {
        let event = RunEvent::Finished {
            error,
            time_ms: now_ms(),
        };
        self.send(trial, event);
        if let Some(Shown::Open(reporter)) = self.trials.remove(&trial.id) {
            self.finishing.retain(|f| !f.is_finished());
            self.finishing.push(tokio::spawn(reporter.finish()));
        }
    }

    /// Step 5.
    pub(super) async fn finish_all(&mut self) {
        let open: Vec<RunReporter> = self
            .trials
            .drain()
            .filter_map(|(_, shown)| match shown {
                Shown::Open(reporter) => Some(reporter),
                Shown::Held(..) => None,
            })
            .collect();
        let finishing = open.into_iter().map(|reporter| {
            reporter.send(RunEvent::Finished {
                error: None,
                time_ms: now_ms(),
            });
            reporter.finish()
        });
        futures::future::join_all(finishing).await;
        futures::future::join_all(self.finishing.drain(..)).await;
    }

    /// Sends `event` of `trial`, or holds it (step 4).
    fn send(&mut self, trial: &TrialRecord, event: RunEvent) {
        let shown = self
            .trials
            .entry(trial.id)
            .or_insert_with(|| Shown::Held(Instant::now(), Vec::new()));
        let held = match shown {
            Shown::Open(reporter) => return reporter.send(event),
            Shown::Held(since, held) => {
                held.push(event);
                if since.elapsed() < SHOW_AFTER {
                    return;
                }
                std::mem::take(held)
            }
        };
        let header = RunHeader {
            id: format!("{:08x}", rand::random::<u32>()),
            name: format!("{}/trial_{:05}", self.experiment, trial.id),
            dir: trial.dir.display().to_string(),
            job: library::job().unwrap_or_default(),
        };
        match RunReporter::start(header) {
            Some(reporter) => {
                for event in held {
                    reporter.send(event);
                }
                *shown = Shown::Open(reporter);
            }
            // Outside a cluster: nobody to tell.
            None => {
                self.trials.remove(&trial.id);
            }
        }
    }
}
