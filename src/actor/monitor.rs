//! Monitoring: death notifications for actors anywhere in the cluster, the
//! primitive supervisors are built on.
//!
//! Deaths are cluster events (`ActorDied`) that the head publishes when a
//! node reports a worker process gone, or when it declares a node dead.
//! A monitor long-polls the head's event stream and forwards the deaths of
//! one actor to a recipient, until the actor is dead for good. When the
//! stream says events were missed (`Resync`: the head restarted), the
//! monitor asks the directory, and reports the death for good it missed.

use std::time::Duration;

use actix::{Message, Recipient};
use serde::{Deserialize, Serialize};

use crate::client::ClientError;
use crate::cluster::{ActorId, ClusterEventKind, DeathCause, DirectoryReply, DirectoryRequest};
use crate::wire::Incarnation;

use super::handle::ActorHandle;
use super::CallError;
use crate::runtime::ProcessContext;
use crate::runtime::RemoteActor;

/// An actor incarnation died.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Message)]
#[rtype(result = "()")]
pub struct ActorDied {
    /// The actor.
    pub actor: ActorId,
    /// The incarnation that died.
    pub incarnation: Incarnation,
    /// Why (its `Display` reads `exited with code N`, `panic: MESSAGE`,
    /// `killed by signal N`, `node lost: ...`).
    pub reason: DeathCause,
    /// Whether a new incarnation is coming (from its node, or from the head
    /// on another node when its node was lost); `false`: dead for good.
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
            match next_deaths(context, actor, after).await {
                Ok((deaths, last_seen)) => {
                    after = last_seen;
                    for (_, death) in deaths {
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

/// Waits for the next death of `handle`'s actor after event `after`, and
/// moves `after` to it: call it again for the death after that.
pub async fn next_death<A: RemoteActor>(
    handle: &ActorHandle<A>,
    after: &mut u64,
) -> Result<ActorDied, CallError> {
    let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
    loop {
        let (deaths, last_seen) = next_deaths(context, handle.id(), *after).await?;
        // Deaths after the one returned stay for the next call.
        match deaths.into_iter().next() {
            Some((seq, death)) => {
                *after = seq;
                return Ok(death);
            }
            None => *after = last_seen,
        }
    }
}

/// Deaths of `actor` among the events after `after` (long-polled), with
/// their sequence numbers, and the last sequence number seen.
async fn next_deaths(
    context: &ProcessContext,
    actor: ActorId,
    after: u64,
) -> Result<(Vec<(u64, ActorDied)>, u64), CallError> {
    let events = context.events(after, Duration::from_secs(30)).await?;
    let last_seen = events.last().map_or(after, |e| e.seq);
    let resync = events.iter().find_map(|event| match event.kind {
        ClusterEventKind::Resync { .. } => Some(event.seq),
        _ => None,
    });
    let mut deaths: Vec<(u64, ActorDied)> = events
        .into_iter()
        .filter_map(|event| match event.kind {
            ClusterEventKind::ActorDied {
                actor: died,
                incarnation,
                reason,
                restarting,
            } if died == actor => Some((
                event.seq,
                ActorDied {
                    actor,
                    incarnation,
                    reason,
                    restarting,
                },
            )),
            _ => None,
        })
        .collect();
    let for_good = deaths.iter().any(|(_, death)| !death.restarting);
    if let (Some(seq), false) = (resync, for_good) {
        if let Some(death) = missed_death(context, actor).await? {
            deaths.insert(0, (seq, death));
        }
    }
    Ok((deaths, last_seen))
}

/// The watch missed events (`head/events.rs`, step 2): the actor's death
/// for good, if the directory records it dead now. An actor the directory
/// does not know (yet: its start may not be recorded after a head restart)
/// is not taken for dead. (A restart within the missed events is not
/// reported: only its end shows.)
async fn missed_death(
    context: &ProcessContext,
    actor: ActorId,
) -> Result<Option<ActorDied>, CallError> {
    let request = DirectoryRequest::LocateActor(actor);
    let record = match context.call_head(request).await? {
        DirectoryReply::Actor(record) => record,
        reply => {
            return Err(CallError::Cluster(ClientError::from(
                crate::cluster::UnexpectedReply::new("LocateActor", reply),
            )))
        }
    };
    Ok(record.and_then(|record| {
        record.dead.map(|reason| ActorDied {
            actor,
            incarnation: record.incarnation,
            reason,
            restarting: false,
        })
    }))
}
