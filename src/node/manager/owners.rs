//! Fate sharing with owners (Ray's): an actor spawned from another actor's
//! worker process names that incarnation as its `owner` (its spec's, set
//! by `crate::actor`'s `spawn.rs`) and dies with it. A detached actor has
//! no owner, nor has one spawned by a task or a driver: those end with
//! their job (`EndJob`).
//!
//! 1. Each node follows the head's events ([`follow_owners`]): in process
//!    on the head, over the network elsewhere.
//! 2. Every `ActorDied` (restarting or not: that incarnation is gone) is
//!    an [`OwnerDied`] to this node's manager, which kills for good every
//!    actor here that incarnation owns (their deaths read `OwnerDied` and
//!    are events in turn, so what they own goes next) and keeps the last
//!    [`REMEMBERED_DEATHS`] deaths: an actor whose owner died while it was
//!    being started here is killed as soon as it runs.
//! 3. After missed events (`Resync`: the head restarted), the owner of
//!    every actor here ([`ListOwners`]) is looked up in the head's
//!    directory: one dead, forgotten, or living on in a newer incarnation
//!    has died (step 2).

use std::time::Duration;

use actix::prelude::*;
use tracing::{info, warn};

use crate::cluster::{ActorOwner, ClusterEventKind};
use crate::host::processes::Signal;
use crate::object_store::HeadEvents;
use crate::transport::Endpoint;

use super::worker_processes::signal_worker;
use super::{Killed, NodeManager};

/// How many owner deaths a node remembers for the actors it is still
/// starting (step 2).
pub(super) const REMEMBERED_DEATHS: usize = 4096;

/// How long one poll of the head's events waits for a new one.
const POLL_WAIT: Duration = Duration::from_secs(30);

/// How long the follower waits after the head's events could not be read.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Step 2: an actor incarnation died.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct OwnerDied(pub ActorOwner);

impl Handler<OwnerDied> for NodeManager {
    type Result = ();

    fn handle(&mut self, OwnerDied(owner): OwnerDied, _: &mut Self::Context) {
        if self.dead_owners.len() == REMEMBERED_DEATHS {
            self.dead_owners.pop_front();
        }
        self.dead_owners.push_back(owner);
        self.kill_owned_by(owner);
    }
}

/// Step 3: the owners of the actors here.
#[derive(Message)]
#[rtype(result = "Vec<ActorOwner>")]
pub(super) struct ListOwners;

impl Handler<ListOwners> for NodeManager {
    type Result = MessageResult<ListOwners>;

    fn handle(&mut self, _: ListOwners, _: &mut Self::Context) -> Self::Result {
        let mut owners: Vec<ActorOwner> = self
            .workers
            .values()
            .filter(|worker| worker.killed.is_none())
            .filter_map(|worker| worker.spec.owner)
            .collect();
        owners.sort_by_key(|owner| (owner.actor, owner.incarnation));
        owners.dedup();
        MessageResult(owners)
    }
}

impl NodeManager {
    /// Kills for good every actor here that `owner` owns (step 2). One
    /// being restarted is marked only: its new process is killed once it
    /// runs (`restarted`).
    pub(super) fn kill_owned_by(&mut self, owner: ActorOwner) {
        let owned = self
            .workers
            .iter_mut()
            .filter(|(_, worker)| worker.spec.owner == Some(owner) && worker.killed.is_none());
        for (actor, worker) in owned {
            worker.killed = Some(Killed::WithOwner(owner));
            info!(%actor, %owner, "the actor that spawned it died: killing it");
            if !worker.relaunching {
                signal_worker(worker.pid, Signal::KILL);
            }
        }
    }

    /// Whether `owner` died lately (step 2).
    pub(super) fn owner_died(&self, owner: ActorOwner) -> bool {
        self.dead_owners.contains(&owner)
    }
}

/// Steps 1 and 3: follows `head`'s events for `manager` until it stops.
pub(crate) fn follow_owners(manager: Addr<NodeManager>, head: HeadEvents, endpoint: Endpoint) {
    tokio::spawn(async move {
        // Deaths before this node started owned nothing here.
        let mut after = match head.since(&endpoint, 0, Duration::ZERO).await {
            Ok(events) => events.last().map_or(0, |event| event.seq),
            Err(_) => 0,
        };
        let mut resync_due = false;
        while manager.connected() {
            let events = match head.since(&endpoint, after, POLL_WAIT).await {
                Ok(events) => events,
                Err(e) => {
                    warn!("owners: the head's events are unreachable ({e})");
                    tokio::time::sleep(RETRY_AFTER).await;
                    continue;
                }
            };
            after = events.last().map_or(after, |event| event.seq);
            for event in events {
                match event.kind {
                    ClusterEventKind::ActorDied {
                        actor, incarnation, ..
                    } => manager.do_send(OwnerDied(ActorOwner { actor, incarnation })),
                    ClusterEventKind::Resync { .. } => resync_due = true,
                    _ => {}
                }
            }
            if resync_due {
                resync_due = !resync(&manager, &head, &endpoint).await;
            }
        }
    });
}

/// Step 3; false if the head could not be asked about every owner (the
/// caller tries again after its next poll).
async fn resync(manager: &Addr<NodeManager>, head: &HeadEvents, endpoint: &Endpoint) -> bool {
    let Ok(owners) = manager.send(ListOwners).await else {
        return true; // the node is stopping
    };
    let mut complete = true;
    for owner in owners {
        match head.locate(endpoint, owner.actor).await {
            Ok(Some(record))
                if record.dead.is_none()
                    && !record.restarting
                    && record.incarnation <= owner.incarnation => {}
            Ok(_) => manager.do_send(OwnerDied(owner)),
            Err(e) => {
                warn!(%owner, "owners: cannot ask the head whether it lives ({e})");
                complete = false;
            }
        }
    }
    complete
}
