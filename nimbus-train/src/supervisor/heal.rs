//! The supervisor's side of a heal: a lost worker goes to the policy
//! (`worker_lost`), and a heal it decides is carried out (`heal/mod.rs`,
//! step 2; `replace`):
//! 1. kill each replaced rank's current worker (dead already, or a
//!    replacement of a heal that failed), so its bundle's resources are
//!    free again;
//! 2. spawn a new `TrainerWorker` into the rank's bundle;
//! 3. name a new shared-memory group and send `HealGroup` to every
//!    survivor;
//! 4. `StartTraining` on each new worker: the attempt's assignment with
//!    the rank's ranks, its faults that have not fired, the new group and
//!    `HealFrom` (its state comes from the source, not a checkpoint).

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use futures::future::join_all;

use super::launch::{faults_of, rank_layout, shared_memory_group, spawn_options};
use super::policy::{Death, Heal, Healed};
use super::watch::watch;
use super::{RunPlan, TrainEvent, TrainerSupervisor, WorkerId, WorkerLink, WORKER_CALL_DEADLINE};
use crate::faults::TrainingFault;
use crate::heal::{HealFrom, HealOrder};
use crate::worker::{Assignment, HealGroup, StartTraining, TrainerWorker};
use crate::TrainError;
use nimbus::actor::{self, ActorHandle};
use nimbus::placement::PlacementGroup;

/// What a heal's replacement is, once started.
pub(super) struct Replacement {
    pub(super) rank: usize,
    pub(super) worker: u32,
    pub(super) handle: ActorHandle<TrainerWorker>,
    /// The head's last event before it was spawned (its death comes after).
    pub(super) seen_events: u64,
}

/// What the running attempt has that a heal needs.
pub(super) struct Group {
    pub(super) links: Vec<WorkerLink>,
    pub(super) placement: PlacementGroup,
    pub(super) nodes: Vec<String>,
    pub(super) assignment: Assignment,
}

/// Steps 1 to 4 of the module docs for `heal` in attempt `id`; `faults`
/// are the run's rules that have not fired.
pub(super) async fn replace(
    plan: Arc<RunPlan>,
    id: u64,
    heal: Heal,
    group: Group,
    faults: Vec<TrainingFault>,
) -> Result<Vec<Replacement>, TrainError> {
    let kills = heal
        .ranks
        .iter()
        .filter_map(|&(rank, _)| match group.links.get(rank) {
            Some(WorkerLink::Remote(handle)) => Some(handle.clone()),
            _ => None,
        });
    join_all(kills.map(|handle| async move {
        if let Err(e) = handle.kill().await {
            tracing::debug!(actor = %handle.id(), "replaced worker: {e}");
        }
    }))
    .await;
    let seen_events = nimbus::library::last_event().await?;
    let mut spawns = Vec::new();
    for &(rank, _) in &heal.ranks {
        let options = spawn_options(&plan, &group.placement, rank)?;
        spawns.push(actor::spawn::<TrainerWorker>((), options));
    }
    let (mut handles, mut failed) = (Vec::new(), None);
    for spawned in join_all(spawns).await {
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => failed = failed.or(Some(e.into())),
        }
    }
    if let Some(e) = failed {
        stop(&handles).await;
        return Err(e);
    }
    match start(&plan, id, &heal, &group, &faults, &handles).await {
        Ok(()) => Ok(heal
            .ranks
            .iter()
            .zip(handles)
            .map(|(&(rank, worker), handle)| Replacement {
                rank,
                worker,
                handle,
                seen_events,
            })
            .collect()),
        Err(e) => {
            stop(&handles).await;
            Err(e)
        }
    }
}

/// Kills the replacements of a heal that could not start.
async fn stop(handles: &[ActorHandle<TrainerWorker>]) {
    join_all(handles.iter().map(|h| h.kill())).await;
}

/// Steps 3 and 4: the order to the survivors, the replacements started.
async fn start(
    plan: &RunPlan,
    id: u64,
    heal: &Heal,
    group: &Group,
    faults: &[TrainingFault],
    handles: &[ActorHandle<TrainerWorker>],
) -> Result<(), TrainError> {
    let spec = shared_memory_group(plan, id);
    let order = HealOrder {
        heal: heal.number,
        group: spec.clone(),
        source: heal.source,
    };
    let replaced: Vec<usize> = heal.ranks.iter().map(|(rank, _)| *rank).collect();
    for (rank, link) in group.links.iter().enumerate() {
        if let (false, WorkerLink::Remote(survivor)) = (replaced.contains(&rank), link) {
            // One that cannot be told has died too: its death heals again.
            if let Err(e) = survivor.do_send(HealGroup(order.clone())) {
                tracing::warn!("cannot send the heal order to rank {rank}: {e}");
            }
        }
    }
    let layout = rank_layout(&group.nodes);
    let starts = heal.ranks.iter().zip(handles).map(|(&(rank, _), handle)| {
        let mut assignment = group.assignment.clone();
        assignment.ranks = layout.get(rank).copied().unwrap_or(assignment.ranks);
        assignment.faults = faults_of(faults, rank);
        assignment.group = Some(spec.clone());
        assignment.resume = None;
        assignment.heal = Some(HealFrom {
            heal: heal.number,
            source: heal.source,
        });
        handle.send_with_deadline(StartTraining(assignment), WORKER_CALL_DEADLINE)
    });
    for (started, &(rank, _)) in join_all(starts).await.into_iter().zip(&heal.ranks) {
        if let Err(reason) = started
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            return Err(TrainError::WorkerFailed { rank, reason });
        }
    }
    Ok(())
}

/// The supervisor's side of a heal: the policy's decision on a lost
/// worker, carried out.
impl TrainerSupervisor {
    /// Worker `worker` of rank `rank` of attempt `id` died (`died`) or
    /// failed: heal the group if the policy says so, else fail the
    /// attempt.
    pub(super) fn worker_lost(
        &mut self,
        (id, rank, worker): WorkerId,
        reason: String,
        died: bool,
        ctx: &mut Context<Self>,
    ) {
        self.record_fired(&reason);
        let heals = self.attempt.as_ref().is_some_and(|a| a.heals);
        let now = Instant::now();
        match self
            .attempts
            .worker_lost((id, rank, worker), (&reason, died), heals, now)
        {
            Some(Death::Heal(heal)) => self.heal(id, heal, ctx),
            Some(Death::Failed(failure)) => self.attempt_failed(id, failure, ctx),
            None => {}
        }
    }

    /// Replaces the workers `heal` names and heals the group (`heal.rs`).
    fn heal(&mut self, id: u64, heal: Heal, ctx: &mut Context<Self>) {
        // The heal's first replaced rank and its new worker: who a heal
        // that fails is charged to (while the heal is the latest).
        let (rank, worker) = heal.ranks.first().copied().unwrap_or_default();
        let first = (id, rank, worker);
        let Some(group) = self.attempt.as_ref().and_then(|attempt| {
            Some(Group {
                links: attempt.links.clone(),
                placement: attempt.group.clone()?,
                nodes: attempt.nodes.clone(),
                assignment: attempt.assignment.clone(),
            })
        }) else {
            let reason = "no placement group to replace it in";
            if let Some(failure) = self.attempts.heal_failed(first, reason, Instant::now()) {
                self.attempt_failed(id, failure, ctx);
            }
            return;
        };
        metrics::counter!("nimbus_train_heals_total").increment(1);
        tracing::warn!(
            attempt = id,
            source = heal.source,
            "healing the group from a live peer: {}",
            heal.reason
        );
        self.tell(TrainEvent::Healing {
            ranks: heal.ranks.iter().map(|(rank, _)| *rank).collect(),
            source: heal.source,
            reason: heal.reason.clone(),
        });
        let replacing = replace(self.plan.clone(), id, heal, group, self.unfired_faults());
        ctx.spawn(
            replacing
                .into_actor(self)
                .map(move |replaced, act, ctx| act.replaced(first, replaced, ctx)),
        );
    }

    /// A heal's replacements started (or could not).
    fn replaced(
        &mut self,
        first: WorkerId,
        replaced: Result<Vec<Replacement>, TrainError>,
        ctx: &mut Context<Self>,
    ) {
        let id = first.0;
        let replacements = match replaced {
            Ok(replacements) => replacements,
            Err(e) => {
                let reason = format!("cannot replace it: {e}");
                if let Some(failure) = self.attempts.heal_failed(first, &reason, Instant::now()) {
                    self.attempt_failed(id, failure, ctx);
                }
                return;
            }
        };
        let me = ctx.address();
        for r in replacements {
            if !self.attempts.current(id, r.rank, r.worker) {
                // A later heal replaces it again, or the attempt ended.
                let handle = r.handle;
                tokio::spawn(async move { handle.kill().await });
                continue;
            }
            let link = WorkerLink::Remote(r.handle);
            if let Some(slot) = self.attempt.as_mut().and_then(|a| a.links.get_mut(r.rank)) {
                *slot = link.clone();
            }
            tokio::spawn(watch(
                me.clone(),
                (id, r.rank, r.worker),
                link,
                r.seen_events,
            ));
        }
    }

    pub(super) fn tell_healed(&mut self, Healed { ranks, took }: Healed) {
        metrics::histogram!("nimbus_train_heal_seconds").record(took.as_secs_f64());
        tracing::info!(
            took_ms = took.as_millis() as u64,
            "group healed: ranks {ranks:?} replaced and training"
        );
        self.tell(TrainEvent::Healed { ranks, took });
    }
}
