//! Starting, replacing, scaling and stopping an application's replicas.
//!
//! A deploy waits for its replicas (`Deploy`'s answer says whether they
//! came up). What the health round decides instead goes on in the
//! background, so that a replica waiting for room (a scale-up on a full
//! cluster, up to the spawn's deadline) holds up neither the next round's
//! health checks nor the other applications:
//! 1. **Replace**: a replica dead for good is marked `replacing` and one
//!    replica is started; it takes the dead one's slot once healthy (the
//!    mark is cleared if it could not be started: the next round tries
//!    again).
//! 2. **Grow**: the replicas to add are counted in `starting` until they
//!    are healthy, then join the routes; the autoscaler's target is
//!    compared with the replicas running plus those starting.
//! 3. **Shrink** (only while none are starting): the replicas holding the
//!    fewest requests leave the routes first, then are drained and
//!    stopped.
//! 4. **Reconfigure** (a deploy that changed only the user config): each
//!    live replica takes the new config ([`Reconfigure`], within
//!    [`HEALTH_TIMEOUT`]); if one refuses or cannot be reached, those that
//!    took it get the old one back and the deploy fails naming it.
//!
//! Replicas started in the background for a deploy that was replaced or
//! deleted meanwhile are stopped at once; so are those started with a
//! user config changed meanwhile (the next round starts them again).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use futures::future::join_all;
use nimbus::actor::{self, ActorHandle, RemoteActor, SpawnOptions};
use nimbus::cluster::{ActorId, Demand};

use super::{publish, ReplicaEntry, State, DRAIN_TIMEOUT, HEALTH_PERIOD, HEALTH_TIMEOUT};
use super::{REPLICA_RESTARTS, STARTUP_TIMEOUT};
use crate::config::Application;
use crate::error::ControllerError;
use crate::replica::{Drain, Health, HealthError, Reconfigure, Replica, ReplicaArgs};

/// Spawns `count` replicas of `app` and waits until each is healthy; stops
/// them all if one cannot be built or the startup timeout passes.
pub(super) async fn start_replicas(
    state: &Rc<RefCell<State>>,
    app: &Application,
    count: u32,
) -> Result<Vec<ReplicaEntry>, ControllerError> {
    let args = ReplicaArgs {
        controller: state.borrow().me.clone(),
        kind: app.kind.clone(),
        init: app.init.clone(),
        max_ongoing: app.max_ongoing,
        batching: app.batching,
        user_config: app.user_config.clone(),
    };
    let options = app
        .replica_resources()
        .iter()
        .fold(SpawnOptions::default(), |options, (name, amount)| {
            options.resource(name, amount)
        })
        .max_restarts(REPLICA_RESTARTS)
        .survives_spawner()
        .max_in_flight(app.max_ongoing.saturating_mul(64).max(1_024));
    let spawned =
        join_all((0..count).map(|_| actor::spawn::<Replica>(args.clone(), options.clone()))).await;
    let mut handles = Vec::new();
    let mut failure = None;
    for spawned in spawned {
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                failure.get_or_insert(ControllerError::Spawn {
                    what: format!("a replica of {}", app.name),
                    detail: e.to_string(),
                });
            }
        }
    }
    if failure.is_none() {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let checks = join_all(handles.iter().map(|handle| wait_healthy(handle, deadline))).await;
        if let Some(Err(detail)) = checks.into_iter().find(Result::is_err) {
            failure = Some(ControllerError::Deploy {
                deployment: app.name.clone(),
                detail,
            });
        }
    }
    if let Some(failure) = failure {
        join_all(handles.iter().map(ActorHandle::kill)).await;
        return Err(failure);
    }
    Ok(handles
        .into_iter()
        .map(|handle| ReplicaEntry {
            handle,
            healthy: true,
            error: None,
            ongoing: 0.0,
            replacing: false,
        })
        .collect())
}

/// Asks `replica` for its health until it passes, says it cannot be
/// built, or `deadline` passes.
async fn wait_healthy(replica: &ActorHandle<Replica>, deadline: Instant) -> Result<(), String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let last = match replica
            .send_with_deadline(Health, left.min(HEALTH_TIMEOUT))
            .await
        {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(HealthError::NotBuilt(e))) => return Err(e),
            Ok(Err(HealthError::Unhealthy(e))) => format!("its health check failed: {e}"),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "replica {} was not healthy within {STARTUP_TIMEOUT:?}: {last}",
                replica.id()
            ));
        }
        tokio::time::sleep(HEALTH_PERIOD.min(deadline.saturating_duration_since(Instant::now())))
            .await;
    }
}

/// Stops replicas, draining them first if `drain`.
pub(super) async fn stop_replicas(replicas: Vec<ReplicaEntry>, drain: bool) {
    join_all(replicas.into_iter().map(|replica| async move {
        if drain {
            if let Err(e) = replica
                .handle
                .send_with_deadline(Drain, DRAIN_TIMEOUT)
                .await
            {
                tracing::warn!(replica = %replica.handle.id(), "not drained: {e}");
            }
        }
        if let Err(e) = replica.handle.kill().await {
            tracing::warn!(replica = %replica.handle.id(), "not stopped: {e}");
        }
    }))
    .await;
}

/// Step 1: replaces replica `id`, dead for good, in the background.
pub(super) fn replace(state: &Rc<RefCell<State>>, id: ActorId) {
    let Some((app, generation)) = state
        .borrow_mut()
        .applications
        .iter_mut()
        .find_map(|running| {
            let slot = running
                .replicas
                .iter_mut()
                .find(|entry| entry.handle.id() == id && !entry.replacing)?;
            slot.replacing = true;
            Some((running.app.clone(), running.generation))
        })
    else {
        return;
    };
    let state = state.clone();
    actix::spawn(async move {
        let started = start_replicas(&state, &app, 1).await;
        let unplaced: Vec<ReplicaEntry> = {
            let mut state = state.borrow_mut();
            let running = state
                .applications
                .iter_mut()
                .find(|running| running.generation == generation);
            let current = running.as_ref().is_some_and(|running| running.app == app);
            let slot = running.and_then(|running| {
                running
                    .replicas
                    .iter_mut()
                    .find(|entry| entry.handle.id() == id)
            });
            match (slot, started) {
                (Some(slot), Ok(mut started)) if current && !started.is_empty() => {
                    let new = started.remove(0);
                    tracing::info!(application = %app.name, old = %id, new = %new.handle.id(), "replica replaced");
                    *slot = new;
                    started
                }
                (slot, started) => {
                    if let (Some(slot), Err(e)) = (&slot, &started) {
                        tracing::warn!(application = %app.name, replica = %slot.handle.id(), "a dead replica could not be replaced: {e}");
                    }
                    // Tried again next round (a new one for a changed config).
                    if let Some(slot) = slot {
                        slot.replacing = false;
                    }
                    started.unwrap_or_default()
                }
            }
        };
        stop_replicas(unplaced, false).await;
        publish(&state).await;
    });
}

/// Lets each autoscaled application's policy decide on the requests its
/// healthy replicas hold; starts or stops replicas to its target.
pub(super) async fn autoscale(state: &Rc<RefCell<State>>) {
    let autoscaled = state
        .borrow()
        .applications
        .iter()
        .any(|running| running.autoscaler.is_some());
    if !autoscaled {
        return;
    }
    let demands = match nimbus::library::pending_demands().await {
        Ok(demands) => demands,
        Err(e) => {
            tracing::debug!("the pending demands could not be read: {e}");
            Vec::new()
        }
    };
    let now = Instant::now();
    let changes: Vec<(String, u32)> = state
        .borrow_mut()
        .applications
        .iter_mut()
        .filter_map(|running| {
            let ongoing = running
                .replicas
                .iter()
                .filter(|replica| replica.healthy)
                .map(|replica| replica.ongoing)
                .sum::<f64>()
                + f64::from(running.queued);
            let others_waiting = demands
                .iter()
                .any(|demand| waits_for_room_of(demand, &running.app));
            let autoscaler = running.autoscaler.as_mut()?;
            autoscaler.decide(ongoing, others_waiting, now);
            // Also a scale-up that failed in an earlier round: tried again.
            let target = autoscaler.target();
            let have = running.replicas.len() as u32 + running.starting;
            (have != target).then(|| (running.app.name.clone(), target))
        })
        .collect();
    for (application, target) in changes {
        scale(state, &application, target).await;
    }
}

/// Whether `demand`, of something other than serving, waits for what
/// `app`'s replicas hold (CPUs, GPUs or a custom resource): giving
/// replicas back may let it in.
fn waits_for_room_of(demand: &Demand, app: &Application) -> bool {
    demand.class != <Replica as RemoteActor>::NAME
        && app
            .replica_resources()
            .iter()
            .any(|(name, amount)| amount > 0.0 && demand.resources.amount(name) > 0.0)
}

/// Starts (step 2) or stops (step 3) replicas of `application` until it
/// has `target`.
async fn scale(state: &Rc<RefCell<State>>, application: &str, target: u32) {
    let leaving = {
        let mut borrowed = state.borrow_mut();
        let Some(running) = borrowed
            .applications
            .iter_mut()
            .find(|running| running.app.name == application)
        else {
            return;
        };
        let count = running.replicas.len() as u32;
        let have = count + running.starting;
        if target > have {
            tracing::info!(%application, from = have, to = target, "scaling up");
            running.starting += target - have;
            let (app, generation) = (running.app.clone(), running.generation);
            actix::spawn(grow(state.clone(), app, generation, target - have));
            return;
        }
        if running.starting > 0 || target >= count {
            return;
        }
        tracing::info!(%application, from = count, to = target, "scaling down");
        running
            .replicas
            .sort_by(|a, b| b.ongoing.total_cmp(&a.ongoing));
        running.replicas.split_off(target as usize)
    };
    publish(state).await;
    actix::spawn(stop_replicas(leaving, true));
}

/// Step 2 in the background: starts `count` replicas of `app` (of deploy
/// `generation`); once healthy they join its routes.
async fn grow(state: Rc<RefCell<State>>, app: Application, generation: u64, count: u32) {
    let started = start_replicas(&state, &app, count).await;
    let unplaced = {
        let mut state = state.borrow_mut();
        let running = state
            .applications
            .iter_mut()
            .find(|running| running.generation == generation);
        if let Some(running) = running {
            running.starting = running.starting.saturating_sub(count);
            match started {
                Ok(started) if running.app == app => {
                    running.replicas.extend(started);
                    Vec::new()
                }
                // Its user config changed meanwhile.
                Ok(started) => started,
                Err(e) => {
                    tracing::warn!(application = %app.name, "could not scale up: {e}");
                    Vec::new()
                }
            }
        } else {
            // Deleted or redeployed meanwhile.
            started.unwrap_or_default()
        }
    };
    stop_replicas(unplaced, false).await;
    publish(&state).await;
}

/// Step 4: the live replicas of deploy `generation` take `app`'s user
/// config, all or none.
pub(super) async fn reconfigure(
    state: &Rc<RefCell<State>>,
    generation: u64,
    app: Application,
) -> Result<(), ControllerError> {
    let (old, handles): (Application, Vec<ActorHandle<Replica>>) = {
        let state = state.borrow();
        let Some(running) = state
            .applications
            .iter()
            .find(|running| running.generation == generation)
        else {
            return Err(ControllerError::NoApplication(app.name.clone()));
        };
        let handles = running.replicas.iter().map(|r| r.handle.clone()).collect();
        (running.app.clone(), handles)
    };
    let send = |config: &Option<String>, replica: &ActorHandle<Replica>| {
        let config = Reconfigure(config.clone().unwrap_or_else(|| "null".into()));
        let replica = replica.clone();
        async move {
            match replica.send_with_deadline(config, HEALTH_TIMEOUT).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("replica {}: {e}", replica.id())),
                Err(e) => Err(format!("replica {}: {e}", replica.id())),
            }
        }
    };
    let answers = join_all(
        handles
            .iter()
            .map(|replica| send(&app.user_config, replica)),
    )
    .await;
    if let Some(Err(detail)) = answers.iter().find(|answer| answer.is_err()) {
        let took = handles
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_ok());
        let back = &old.user_config;
        let backs =
            took.map(|(replica, _)| async move { (replica.id(), send(back, replica).await) });
        for (replica, back) in join_all(backs).await {
            if let Err(e) = back {
                tracing::warn!(application = %app.name, %replica, "did not take its old user config back: {e}");
            }
        }
        return Err(ControllerError::Deploy {
            deployment: app.name.clone(),
            detail: detail.clone(),
        });
    }
    tracing::info!(application = %app.name, replicas = handles.len(), "user config taken");
    if let Some(running) = state
        .borrow_mut()
        .applications
        .iter_mut()
        .find(|running| running.generation == generation)
    {
        running.app = app;
    }
    super::saved::save(state).await;
    Ok(())
}
