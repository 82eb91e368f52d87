//! Following the workers of an attempt: their progress polled, saved
//! checkpoints adopted, metrics recorded, and a run that stops making
//! progress noticed.

use std::time::{Duration, Instant};

use actix::prelude::*;

use super::policy::Unrecoverable;
use super::{TrainEvent, TrainerSupervisor, WorkerId};
use crate::checkpoint::{self, NotShared, Saved, SavedCheckpoint};
use crate::progress::{ProgressReport, WorkerEvent};
use crate::results::ReportLine;
use crate::Metrics;
use nimbus::actor::faults::FiredFault;
use nimbus::cluster::{RunEvent, RunPoint};
use nimbus::library;

impl TrainerSupervisor {
    pub(super) fn polled(
        &mut self,
        (id, rank, worker): WorkerId,
        report: ProgressReport,
        ctx: &mut Context<Self>,
    ) {
        let now = Instant::now();
        if !self.attempts.current(id, rank, worker)
            || !self.attempts.progress(id, rank, report.steps, now)
        {
            return;
        }
        self.attempts.healable(id, rank, report.healable);
        let mut failure = None;
        let mut unrecoverable = None;
        for (_, event) in report.events {
            if matches!(event, WorkerEvent::Report { .. }) {
                if let Some(healed) = self.attempts.healed((id, rank, worker), now) {
                    self.tell_healed(healed);
                }
            }
            match event {
                WorkerEvent::Report {
                    index,
                    metrics,
                    checkpoint,
                } if rank == 0 => {
                    if let Some(took) = self.attempts.report(id, rank, Instant::now()) {
                        self.report_recovery(index, took);
                    }
                    self.history.retain(|(i, _)| *i < index);
                    self.history.push((index, metrics.clone()));
                    self.record(self.attempts.restarts(), index, &metrics);
                    self.tell(TrainEvent::Reported {
                        index,
                        metrics,
                        checkpoint,
                    });
                }
                WorkerEvent::Report { .. } => {}
                WorkerEvent::CheckpointSaved(saved) if !self.sees(&saved) => {
                    let node = self
                        .attempt
                        .as_ref()
                        .and_then(|a| a.nodes.get(rank).cloned());
                    let unshared = NotShared {
                        path: saved.path,
                        node: node.unwrap_or_default(),
                    };
                    unrecoverable = Some(Unrecoverable::StorageNotShared(unshared));
                }
                WorkerEvent::CheckpointSaved(saved) => {
                    self.tell(TrainEvent::CheckpointSaved(saved.clone()));
                    self.reporter.do_send(Saved(saved));
                }
                WorkerEvent::FaultInjected {
                    fault,
                    target,
                    trigger,
                } => {
                    let fired = FiredFault::new(&fault, &trigger, &target);
                    self.fired.push(fired.clone());
                    self.tell(TrainEvent::FaultInjected {
                        fault,
                        target,
                        trigger,
                    });
                    // On the cluster's event stream, for chaos timelines.
                    tokio::spawn(async move {
                        if let Err(e) = library::report_fault(&fired).await {
                            tracing::warn!("cannot report an injected fault: {e}");
                        }
                    });
                }
                WorkerEvent::CheckpointFailed { index, error } => {
                    failure = Some(format!("checkpoint {index} could not be written: {error}"));
                }
                WorkerEvent::StorageFull(full) => {
                    unrecoverable = Some(Unrecoverable::StorageFull(full));
                }
            }
        }
        if let Some(stop) = unrecoverable {
            if let Some(failure) = self.attempts.unrecoverable(id, rank, stop, Instant::now()) {
                tracing::error!(attempt = id, "training stops: {}", failure.reason);
                let why = failure.reason.clone();
                self.tell_failed(failure);
                self.end_attempt(&why, ctx);
            }
            return;
        }
        if let Some(reason) = failure {
            return self.worker_failed(id, rank, reason, ctx);
        }
        match report.finished {
            None => {}
            Some(Err(e)) => self.worker_lost((id, rank, worker), e.0, false, ctx),
            Some(Ok(())) if self.attempts.rank_finished(id, rank) => {
                self.end_attempt("training finished", ctx);
            }
            Some(Ok(())) => {}
        }
    }

    /// Whether the checkpoint rank 0 saved is where this driver reads it:
    /// without storage shared by every host, a restart would find no
    /// checkpoint and start over.
    pub(super) fn sees(&self, saved: &SavedCheckpoint) -> bool {
        saved.path.join(checkpoint::MANIFEST_FILE).is_file()
    }

    /// Tells the cluster (for chaos timelines) that the group trains again.
    pub(super) fn report_recovery(&self, index: u64, took: Duration) {
        metrics::histogram!("nimbus_train_recovery_seconds").record(took.as_secs_f64());
        if let Some(to_head) = &self.to_head {
            to_head.send(RunEvent::Recovered {
                index,
                took_ms: took.as_millis() as u64,
                time_ms: library::now_ms(),
            });
        }
        let took_ms = took.as_millis() as u64;
        tracing::info!(took_ms, "training restored: step {index} done");
        let what = format!(
            "training restored (attempt {}, first step {index} done)",
            self.attempts.restarts()
        );
        let target = format!("run {}", self.plan.run.name);
        tokio::spawn(async move {
            if let Err(e) = library::report_recovery(what, target, took).await {
                tracing::warn!("cannot report a recovery: {e}");
            }
        });
    }

    pub(super) fn check_progress(&mut self, ctx: &mut Context<Self>) {
        let timeout = self.plan.run.progress_timeout;
        if let Some((id, rank)) = self.attempts.hung(Instant::now()) {
            let reason = format!("no progress (report or collective step) for {timeout:?}: hung");
            self.worker_failed(id, rank, reason, ctx);
        }
    }

    /// Appends rank 0's report `index`, made in `attempt`, to the run's
    /// results files.
    pub(super) fn record(&mut self, attempt: u32, index: u64, metrics: &Metrics) {
        let attempt = self.first_generation + u64::from(attempt);
        let line = ReportLine::now(index, attempt, metrics.clone());
        if let Some(to_head) = &self.to_head {
            to_head.send(RunEvent::Reported(RunPoint {
                index,
                attempt,
                time_ms: line.time_ms,
                metrics: metrics.clone(),
            }));
        }
        let Some(results) = &mut self.results else {
            return;
        };
        if let Err(e) = results.append(&line) {
            if !std::mem::replace(&mut self.results_failed, true) {
                tracing::warn!(
                    "report {index} (and any later) is missing from the run's results files: {e}"
                );
            }
        }
    }
}
