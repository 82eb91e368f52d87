//! The head's `ActorRescheduler`: starts actors lost with their node on
//! another node.
//!
//! The directory decides which actors may move (restarts left, not pinned
//! to the lost node or to a bundle on it) and sends each one here as a
//! [`Reschedule`]. For each, until [`RESCHEDULE_DEADLINE`] (60 s):
//! 1. read the membership's view and place it as a spawn would
//!    (`crate::launch::candidates`: alive nodes whose totals fit, the one
//!    with the most free CPU first); none could ever hold it: give up;
//! 2. ask each candidate to start it (`StartActor`), shipping the program
//!    from a node that has it (the head first: spawners of such actors
//!    make sure the head has it) when the new node answers `NeedBinary`;
//!    no node can supply the binary: give up;
//! 3. every candidate full: wait for a cluster event (an actor died, a
//!    node joined) and try again.
//!
//! The new node reports the new incarnation to the directory (`ActorUp`),
//! which ends the restart for callers waiting on it; callers' waits are
//! theirs (60 s, as for a restart on the same node), and the actor starts
//! again from its constructor arguments (state is not migrated). An actor
//! no node takes is declared dead with the reason why (`ActorDown` with
//! `NotRescheduled`).

use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{info, warn};

use crate::cluster::{ActorSpec, DeathCause, NodeState};

use super::directory::{ActorDown, Directory, Reschedule};
use super::events::{ClusterEvents, EventsSince};
use super::membership::{self, Membership};
use crate::cluster::ResourceSet;
use crate::launch::{self, BinarySource, LaunchError, Started, Strategy};
use crate::transport::Endpoint;

/// How long the rescheduler looks for a node that can take a lost actor.
pub const RESCHEDULE_DEADLINE: Duration = Duration::from_secs(60);

/// Why a lost actor could not be started on another node.
#[derive(Debug, thiserror::Error)]
pub enum NotPlaced {
    /// No alive node could ever hold it.
    #[error("no alive node offers {0}")]
    NoNodeOffers(ResourceSet),
    /// No node could supply the program's binary.
    #[error(transparent)]
    Binary(LaunchError),
    /// Every node that could hold it was full until the deadline.
    #[error("every node refused it for {RESCHEDULE_DEADLINE:?}; last: {last}")]
    Refused {
        /// The last refusal.
        last: String,
    },
    /// The head's own actors are stopping.
    #[error("the head is stopping")]
    HeadStopping,
}

/// Restarts actors lost with their node elsewhere (head only).
pub struct ActorRescheduler {
    endpoint: Endpoint,
    membership: Addr<Membership>,
    events: Addr<ClusterEvents>,
    directory: Addr<Directory>,
}

impl ActorRescheduler {
    /// A rescheduler that reads the membership, waits on `events` when
    /// every node is full, reaches nodes through `endpoint` (the head's),
    /// and tells `directory` of actors it could not place.
    pub fn new(
        endpoint: Endpoint,
        membership: Addr<Membership>,
        events: Addr<ClusterEvents>,
        directory: Addr<Directory>,
    ) -> Self {
        ActorRescheduler {
            endpoint,
            membership,
            events,
            directory,
        }
    }
}

impl Actor for ActorRescheduler {
    type Context = Context<Self>;
}

impl Handler<Reschedule> for ActorRescheduler {
    type Result = ();

    fn handle(&mut self, msg: Reschedule, ctx: &mut Self::Context) {
        let placing = place(
            self.endpoint.clone(),
            self.membership.clone(),
            self.events.clone(),
            msg.spec.clone(),
        );
        ctx.spawn(placing.into_actor(self).map(move |placed, me, _| {
            let actor = msg.spec.actor;
            match placed {
                Ok(node) => info!(%actor, node, "actor lost with its node restarted elsewhere"),
                Err(e) => {
                    warn!(%actor, "actor lost with its node cannot restart elsewhere: {e}");
                    me.directory.do_send(ActorDown {
                        actor,
                        incarnation: msg.lost,
                        reason: DeathCause::NotRescheduled {
                            death: Box::new(msg.reason),
                            error: e.to_string(),
                        },
                        restarting: false,
                        node: None,
                    });
                }
            }
        }));
    }
}

/// Starts `spec` on some alive node; returns the node's name.
async fn place(
    endpoint: Endpoint,
    membership: Addr<Membership>,
    events: Addr<ClusterEvents>,
    spec: ActorSpec,
) -> Result<String, NotPlaced> {
    let end = Instant::now() + RESCHEDULE_DEADLINE;
    let mut last = String::from("no node was asked");
    loop {
        let status = membership
            .send(membership::Status)
            .await
            .map_err(|_| NotPlaced::HeadStopping)?;
        let candidates = launch::candidates(&status.nodes, &spec, &Strategy::Any);
        if candidates.is_empty() {
            return Err(NotPlaced::NoNodeOffers(spec.resources.clone()));
        }
        // Spawners of movable actors ship the program to the head; other
        // nodes that ran it have it too.
        let mut sources: Vec<_> = status
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Alive)
            .cloned()
            .collect();
        sources.sort_by_key(|n| !n.head);
        let binary = BinarySource::Nodes(sources);
        for node in candidates {
            match launch::start_on(&endpoint, node, &spec, &binary).await {
                Ok(Started::Running) => return Ok(node.id.clone()),
                Ok(Started::Full(refusal)) => last = refusal,
                // No node has the program: waiting will not help.
                Err(e @ LaunchError::Binary(_)) => return Err(NotPlaced::Binary(e)),
                Err(e) => last = format!("node {}: {e}", node.id),
            }
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NotPlaced::Refused { last });
        }
        // Wait for the cluster to change (an actor died, a node joined):
        // no event is after u64::MAX, so the next one published ends the
        // wait.
        let change = EventsSince {
            after: u64::MAX,
            wait: left,
        };
        events
            .send(change)
            .await
            .map_err(|_| NotPlaced::HeadStopping)?;
    }
}
