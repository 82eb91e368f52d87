//! Monitoring: death notifications for actors anywhere in the cluster, the
//! primitive supervisors are built on.
//!
//! Deaths are cluster events (`ActorDied`) that the head publishes when a
//! node reports a worker process gone, or when it declares a node dead.
//! A monitor long-polls the head's event stream and forwards the deaths of
//! one actor to a recipient, until the actor is dead for good.

use std::time::Duration;

use actix::{Message, Recipient};
use serde::{Deserialize, Serialize};

use crate::cluster::{ActorId, ClusterEventKind};
use crate::wire::Incarnation;

use super::context::ProcessContext;
use super::handle::ActorHandle;
use super::registry::RemoteActor;
use super::CallError;

/// An actor incarnation died.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Message)]
#[rtype(result = "()")]
pub struct ActorDied {
    /// The actor.
    pub actor: ActorId,
    /// The incarnation that died.
    pub incarnation: Incarnation,
    /// Why: `exited with code N`, `panic: MESSAGE`, `killed by signal N`,
    /// `node lost: ...`.
    pub reason: String,
    /// Whether its node is starting a new incarnation; `false` means dead
    /// for good (no restarts left, or its node is lost).
    pub restarting: bool,
}

/// Delivers every death of `handle`'s actor to `watcher`, until it is dead
/// for good. Returns at once; the watch runs as a task of the current async
/// runtime.
pub fn monitor<A: RemoteActor>(
    handle: &ActorHandle<A>,
    watcher: Recipient<ActorDied>,
) -> Result<(), CallError> {
    let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
    let actor = handle.id();
    tokio::spawn(async move {
        let mut after = 0;
        loop {
            match next_deaths(context, actor, &mut after).await {
                Ok(deaths) => {
                    for death in deaths {
                        let last = !death.restarting;
                        watcher.do_send(death);
                        if last {
                            return;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(%actor, "monitor lost the head: {e}");
                    return;
                }
            }
        }
    });
    Ok(())
}

/// Waits for the next death of `handle`'s actor.
pub async fn next_death<A: RemoteActor>(
    handle: &ActorHandle<A>,
    after: &mut u64,
) -> Result<ActorDied, CallError> {
    let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
    loop {
        if let Some(death) = next_deaths(context, handle.id(), after)
            .await?
            .into_iter()
            .next()
        {
            return Ok(death);
        }
    }
}

/// Deaths of `actor` among the events after `after` (long-polled).
async fn next_deaths(
    context: &ProcessContext,
    actor: ActorId,
    after: &mut u64,
) -> Result<Vec<ActorDied>, CallError> {
    let events = context.events(*after, Duration::from_secs(30)).await?;
    *after = events.last().map_or(*after, |e| e.seq);
    Ok(events
        .into_iter()
        .filter_map(|event| match event.kind {
            ClusterEventKind::ActorDied {
                actor: died,
                incarnation,
                reason,
                restarting,
            } if died == actor => Some(ActorDied {
                actor,
                incarnation,
                reason,
                restarting,
            }),
            _ => None,
        })
        .collect())
}
