//! Attempts: each launched, its failures recorded, ended, and the next
//! one started as `policy.rs` decides.

use std::time::Instant;

use actix::prelude::*;

use super::launch::{launch, stop_workers, Launched};
use super::policy::{Failure, Next, Unrecoverable};
use super::watch::{watch, watch_for_room};
use super::{fatal, Attempt, TrainEvent, TrainerSupervisor};
use crate::checkpoint::{self, Latest, Saved, SavedCheckpoint};
use crate::faults::TrainingFault;
use crate::{CollectiveBackend, TrainError};
use nimbus::actor::faults::FiredFault;

impl TrainerSupervisor {
    pub(super) fn start_attempt(&mut self, ctx: &mut Context<Self>) {
        let Some(id) = self.attempts.begin() else {
            return;
        };
        let faults = self.unfired_faults();
        // Fence the run directory off from workers of earlier attempts.
        let attempt = self.attempts.restarts();
        if attempt > 0 {
            metrics::counter!("nimbus_train_restarts_total").increment(1);
        }
        let generation = self.first_generation + u64::from(attempt);
        if let Err(e) = checkpoint::fence::claim(&self.plan.run.run_dir(), generation) {
            return self.complete(Some(e.into()), ctx);
        }
        let launch = launch(
            self.plan.clone(),
            id,
            (attempt, generation),
            self.resume.clone(),
            faults,
        );
        ctx.spawn(
            launch
                .into_actor(self)
                .map(move |launched, act, ctx| act.launched(id, launched, ctx)),
        );
    }

    pub(super) fn launched(
        &mut self,
        id: u64,
        launched: Result<Launched, TrainError>,
        ctx: &mut Context<Self>,
    ) {
        let now = Instant::now();
        let launched = match launched {
            Ok(launched) => launched,
            Err(e) if fatal(&e) => return self.complete(Some(e), ctx),
            Err(e) => {
                if let Some(failure) = self.attempts.launch_failed(id, e.to_string(), now) {
                    self.tell_failed(failure);
                    self.ended(ctx);
                }
                return;
            }
        };
        if !self.attempts.launched(id, launched.links.len(), now) {
            // Stopped while it launched: its workers never train.
            self.attempt = Some(Attempt {
                links: launched.links,
                group: launched.group,
                nodes: launched.nodes,
                assignment: launched.assignment,
                heals: false,
            });
            return self.end_attempt("the run was stopped", ctx);
        }
        self.workers = launched.world_size;
        self.tell(TrainEvent::Started {
            attempt: self.attempts.restarts(),
            workers: launched.world_size,
            resumed_from: self.resume.clone(),
            backend: launched.backend,
            nodes: launched.nodes.clone(),
        });
        let me = ctx.address();
        for (rank, link) in launched.links.iter().enumerate() {
            let worker = (id, rank, 0);
            tokio::spawn(watch(
                me.clone(),
                worker,
                link.clone(),
                launched.seen_events,
            ));
        }
        if self.attempts.room_wanted(id).is_some() {
            tokio::spawn(watch_for_room(me.clone(), id, launched.seen_events));
        }
        let heals =
            self.plan.run.peer_heal && launched.backend == Some(CollectiveBackend::SharedMemory);
        self.attempt = Some(Attempt {
            links: launched.links,
            group: launched.group,
            nodes: launched.nodes,
            assignment: launched.assignment,
            heals,
        });
    }

    /// The run's fault rules that have not fired.
    pub(super) fn unfired_faults(&self) -> Vec<TrainingFault> {
        self.plan
            .faults
            .iter()
            .filter(|f| !self.fired.contains(&f.fired()))
            .cloned()
            .collect()
    }

    /// A death by a fault rule: it has fired. Its announcement may have
    /// died with the process, so the death tells the observer (the head
    /// has the death reason already).
    pub(super) fn record_fired(&mut self, reason: &str) {
        if let Some(fired) = FiredFault::from_death(reason) {
            if !self.fired.contains(&fired) {
                self.tell(TrainEvent::FaultInjected {
                    fault: fired.kind.clone(),
                    target: fired.target.clone(),
                    trigger: fired.trigger.clone(),
                });
                self.fired.push(fired);
            }
        }
    }

    /// A worker of attempt `id` failed: if that is the attempt's first
    /// failure, tear it down, then restart or give up.
    pub(super) fn worker_failed(
        &mut self,
        id: u64,
        rank: usize,
        reason: String,
        ctx: &mut Context<Self>,
    ) {
        self.record_fired(&reason);
        let Some(failure) = self.attempts.rank_failed(id, rank, &reason, Instant::now()) else {
            return;
        };
        self.attempt_failed(id, failure, ctx);
    }

    /// Attempt `id` failed: tear it down, then restart or give up.
    pub(super) fn attempt_failed(&mut self, id: u64, failure: Failure, ctx: &mut Context<Self>) {
        tracing::warn!(attempt = id, "training attempt failed: {}", failure.reason);
        let why = failure.reason.clone();
        self.tell_failed(failure);
        self.end_attempt(&why, ctx);
    }

    pub(super) fn tell_failed(&mut self, failure: Failure) {
        self.tell(TrainEvent::Failed {
            attempt: failure.attempt,
            reason: failure.reason,
        });
    }

    /// Tears the ending attempt down (for `why`), then acts on what follows.
    pub(super) fn end_attempt(&mut self, why: &str, ctx: &mut Context<Self>) {
        let teardown = self.teardown(why);
        ctx.spawn(teardown.into_actor(self).map(|_, act, ctx| act.ended(ctx)));
    }

    /// The ending attempt is gone: restart, finish or give up.
    pub(super) fn ended(&mut self, ctx: &mut Context<Self>) {
        self.attempt = None;
        match self.attempts.ended() {
            Some(Next::Restart) => self.restart(ctx),
            Some(Next::Done | Next::Stopped) => self.complete(None, ctx),
            Some(Next::Stop(Unrecoverable::StorageFull(full))) => {
                self.complete(Some(TrainError::StorageFull(full)), ctx)
            }
            Some(Next::Stop(Unrecoverable::StorageNotShared(unshared))) => {
                self.complete(Some(TrainError::StorageNotShared(unshared)), ctx)
            }
            Some(Next::GiveUp(exhausted)) => {
                let error = TrainError::FailuresExhausted {
                    failures: exhausted.failures,
                    max_failures: exhausted.max_failures,
                    first: exhausted.first,
                    last: exhausted.last,
                };
                self.complete(Some(error), ctx);
            }
            None => {}
        }
    }

    /// Starts the next attempt from the newest checkpoint that verifies.
    pub(super) fn restart(&mut self, ctx: &mut Context<Self>) {
        let latest = self.reporter.send(Latest);
        ctx.spawn(latest.into_actor(self).map(|latest, act, ctx| {
            let reported = latest.ok().and_then(|l| l.checkpoint);
            let ended = act.attempts.restarts() - 1;
            let unreported = checkpoint::unreported(
                &act.plan.run.run_dir(),
                ended,
                reported.as_ref().map(|c| c.index),
            );
            if let Some(saved) = &unreported {
                act.adopt(ended, saved);
            }
            match unreported.or(reported) {
                Some(checkpoint) => {
                    tracing::info!(path = %checkpoint.path.display(), "restarting from checkpoint");
                    act.history.retain(|(i, _)| *i <= checkpoint.index);
                    act.resume = Some(checkpoint.path);
                }
                None => {
                    tracing::info!("restarting from the start: no checkpoint yet");
                    let start = act
                        .plan
                        .resume_from
                        .as_deref()
                        .and_then(|p| checkpoint::verify(p).ok())
                        .map_or(0, |m| m.index);
                    act.history.retain(|(i, _)| *i <= start);
                    act.resume = act.plan.resume_from.clone();
                }
            }
            act.start_attempt(ctx);
        }));
    }

    /// Takes a checkpoint the ended attempt `ended` saved but whose
    /// report had not arrived as if it had: kept by the reporter, told to
    /// the observer, and its report in the history (under its attempt).
    pub(super) fn adopt(&mut self, ended: u32, saved: &SavedCheckpoint) {
        tracing::info!(path = %saved.path.display(), "found a checkpoint saved before the failure but not yet reported");
        self.reporter.do_send(Saved(saved.clone()));
        self.tell(TrainEvent::CheckpointSaved(saved.clone()));
        if !self.history.iter().any(|(i, _)| *i == saved.index) {
            self.history.retain(|(i, _)| *i < saved.index);
            self.history.push((saved.index, saved.metrics.clone()));
            self.record(ended, saved.index, &saved.metrics);
            self.tell(TrainEvent::Reported {
                index: saved.index,
                metrics: saved.metrics.clone(),
                checkpoint: true,
            });
        }
    }

    /// Stops every worker of the current attempt and frees its resources.
    pub(super) fn teardown(&mut self, reason: &str) -> impl std::future::Future<Output = ()> {
        let attempt = self.attempt.as_mut();
        let (links, group) = match attempt {
            Some(a) => (a.links.clone(), a.group.take()),
            None => (Vec::new(), None),
        };
        stop_workers(links, group, reason.to_string())
    }
}
