//! The cluster-wide directory on the head: where every actor runs, by id
//! and by unique name, and which actors died.
//!
//! Node managers report actor incarnations up (`ActorUp`, with the spec it
//! was started from) and down (`ActorDown`, with the cause and whether the
//! node restarts it); the directory publishes `ActorStarted` and
//! [`ClusterEventKind::ActorDied`] events (what monitors watch). Callers
//! ask it `ReserveName` (a unique name, before a spawn), `LookupName`,
//! `LocateActor` (live or dead, with `restarting`), `ListActors` and
//! `ListDeadActors` (the dead ones kept: `graveyard.rs`), and
//! keep it informed of spawns waiting for room (`Waiting`, `Placed`,
//! `ListDemands`: `demands.rs`).
//!
//! When a node is lost (a `NodeDead` event, to which it subscribes) or
//! leaves on purpose (`NodeLeft`: `nimbus stop`, SIGTERM; its workers die
//! with it), alike:
//! 1. every live actor of that node gets the cause `NodeLost`, carrying
//!    the fault that killed the node if a fault hook announced it first
//!    (`NodeDoomed`, from a `ReportFault` with `kills_node`);
//! 2. each with restarts left (`max_restarts`, counted across nodes) and
//!    not pinned to that node (`Strategy::Node`) or to a placement-group
//!    bundle on it is marked restarting, published as `ActorDied` with
//!    `restarting`, and handed to the head's
//!    [`ActorRescheduler`](super::ActorRescheduler) (`Reschedule`, its
//!    `restarts` counting this restart) to be started on another node;
//! 3. the others are declared dead for good, so a lookup never sends a
//!    caller to a dead incarnation, and their names are freed.
//!
//! Durable (`store.rs`): every change of an actor's record is written to
//! the head's store before the report that made it is answered. A
//! restarted head's directory starts from the store's records (names from
//! the live ones); the actors of the previous head's own node died with
//! it (their workers die with their node), and those of nodes the store
//! records dead may not have been handled before the crash, so at start
//! both are handled as a lost node's (restarted elsewhere if they may,
//! else dead), as are those whose restart elsewhere was under way. Members re-report what they run once the head answers
//! again (`crate::node::manager`): deaths it missed, and every live actor
//! (an unchanged record is not published again).

use std::collections::HashMap;

use actix::prelude::*;

use crate::wire::{Incarnation, NodeIdentity};

use super::demands::Demands;
use super::events::{ClusterEvents, Publish};
use super::graveyard::Graveyard;
use super::store::{HeadStore, StoredActor};
use crate::cluster::faults::FiredFault;
use crate::cluster::{ActorId, ActorRecord, ActorSpec, ClusterEvent, ClusterEventKind, DeathCause};

/// The cause given to the actors of a node that left on purpose.
const LEFT: &str = "it left the cluster";

/// The directory actor.
pub struct Directory {
    actors: HashMap<ActorId, ActorRecord>,
    /// What each live actor was started from.
    specs: HashMap<ActorId, ActorSpec>,
    names: HashMap<String, ActorId>,
    events: Addr<ClusterEvents>,
    /// Where actors lost with their node go to be started elsewhere
    /// (`None`: they die with it).
    rescheduler: Option<Recipient<Reschedule>>,
    /// The faults about to kill nodes, by node name: added to their
    /// actors' death causes.
    doomed: HashMap<String, FiredFault>,
    /// The spawns waiting for room (`demands.rs`).
    demands: Demands,
    /// Which dead actors are kept (`graveyard.rs`).
    graveyard: Graveyard,
    /// Where every change is written (`None`: kept in memory only).
    store: Option<HeadStore>,
    /// Nodes a restarted head knows lost (the previous head, nodes the
    /// store records dead), with why: their actors are handled as a lost
    /// node's once this actor starts.
    lost_at_start: Vec<(NodeIdentity, String)>,
}

impl Directory {
    /// A directory that publishes actor deaths to `events` and hands
    /// actors lost with their node to `rescheduler`.
    pub fn new(events: Addr<ClusterEvents>, rescheduler: Option<Recipient<Reschedule>>) -> Self {
        Directory {
            actors: HashMap::new(),
            specs: HashMap::new(),
            names: HashMap::new(),
            events,
            rescheduler,
            doomed: HashMap::new(),
            demands: Demands::default(),
            graveyard: Graveyard::default(),
            store: None,
            lost_at_start: Vec::new(),
        }
    }

    /// This directory, writing its changes to `store`, starting from the
    /// `actors` a previous head recorded there; the actors of the `lost`
    /// nodes (with why) are handled as a lost node's once it starts.
    pub fn stored(
        mut self,
        store: HeadStore,
        actors: Vec<StoredActor>,
        lost: Vec<(NodeIdentity, String)>,
    ) -> Self {
        let mut forgotten = Vec::new();
        for StoredActor { record, spec } in actors {
            if let (None, Some(name)) = (&record.dead, &record.name) {
                self.names.insert(name.clone(), record.actor);
            }
            if record.dead.is_some() {
                forgotten.extend(self.graveyard.buried(record.actor, &record.job));
            }
            if let Some(spec) = spec {
                self.specs.insert(record.actor, spec);
            }
            self.actors.insert(record.actor, record);
        }
        for actor in &forgotten {
            self.actors.remove(actor);
        }
        if let Err(e) = store.forget_actors(&forgotten) {
            tracing::warn!("{e}");
        }
        self.store = Some(store);
        self.lost_at_start = lost;
        self
    }

    /// Writes `actor`'s record to the store, if there is one, and forgets
    /// the dead actors in `forgotten` there.
    fn persist(&self, actor: ActorId, forgotten: &[ActorId]) {
        let (Some(store), Some(record)) = (&self.store, self.actors.get(&actor)) else {
            return;
        };
        let stored = StoredActor {
            record: record.clone(),
            spec: self.specs.get(&actor).cloned(),
        };
        if let Err(e) = store.put_actor(&stored, forgotten) {
            tracing::warn!(%actor, "{e}");
        }
    }

    /// Steps 1–3 for the actors of the lost `node` (by name).
    fn node_lost(&mut self, node: NodeIdentity, reason: String) {
        let lost: Vec<ActorId> = self
            .actors
            .values()
            .filter(|r| r.dead.is_none() && r.node.name == node.name)
            .map(|r| r.actor)
            .collect();
        let cause = DeathCause::NodeLost {
            node: node.to_string(),
            reason,
            fault: self.doomed.remove(&node.name),
        };
        for actor in lost {
            let reason = cause.clone();
            if !self.reschedule(actor, &reason) {
                self.bury(actor, reason);
            }
        }
    }

    /// Hands an actor of the lost `node` to the rescheduler, if it may
    /// restart elsewhere; `false` if it may not.
    fn reschedule(&mut self, actor: ActorId, reason: &DeathCause) -> bool {
        let (Some(record), Some(spec), Some(rescheduler)) = (
            self.actors.get_mut(&actor),
            self.specs.get(&actor),
            &self.rescheduler,
        ) else {
            return false;
        };
        if spec.node.is_some() || spec.bundle.is_some() || record.restarts >= spec.max_restarts {
            return false;
        }
        record.restarting = true;
        let spec = ActorSpec {
            restarts: record.restarts + 1,
            ..spec.clone()
        };
        let incarnation = record.incarnation;
        rescheduler.do_send(Reschedule {
            spec,
            lost: incarnation,
            reason: reason.clone(),
        });
        self.persist(actor, &[]);
        self.events.do_send(Publish(ClusterEventKind::ActorDied {
            actor,
            incarnation,
            reason: reason.clone(),
            restarting: true,
        }));
        true
    }

    fn live(&self, actor: ActorId) -> Option<&ActorRecord> {
        self.actors.get(&actor).filter(|r| r.dead.is_none())
    }

    fn bury(&mut self, actor: ActorId, reason: DeathCause) {
        let Some(record) = self.actors.get_mut(&actor) else {
            return;
        };
        record.dead = Some(reason.clone());
        record.restarting = false;
        self.specs.remove(&actor);
        if let Some(name) = &record.name {
            if self.names.get(name) == Some(&actor) {
                self.names.remove(name);
            }
        }
        let incarnation = record.incarnation;
        let job = record.job.clone();
        let forgotten = self.graveyard.buried(actor, &job);
        for gone in &forgotten {
            self.actors.remove(gone);
        }
        self.persist(actor, &forgotten);
        self.events.do_send(Publish(ClusterEventKind::ActorDied {
            actor,
            incarnation,
            reason,
            restarting: false,
        }));
    }
}

impl Actor for Directory {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        for (node, reason) in std::mem::take(&mut self.lost_at_start) {
            self.node_lost(node, reason);
        }
    }
}

/// Reserve a unique name for an actor about to start.
#[derive(Message)]
#[rtype(result = "Result<(), Box<ActorRecord>>")]
pub struct ReserveName {
    /// The name.
    pub name: String,
    /// The actor.
    pub actor: ActorId,
}

/// An actor incarnation runs.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ActorUp {
    /// Where, and which incarnation.
    pub record: ActorRecord,
    /// What it was started from.
    pub spec: ActorSpec,
}

/// Start this actor, lost with its node, on another node.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reschedule {
    /// What to start (its `restarts` already counts this restart).
    pub spec: ActorSpec,
    /// The incarnation lost with the node.
    pub lost: Incarnation,
    /// Why it was lost.
    pub reason: DeathCause,
}

/// An injected fault is about to kill this node: its actors' death
/// reasons will name it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NodeDoomed {
    /// The node's name.
    pub node: String,
    /// The fault.
    pub fault: FiredFault,
}

impl Handler<NodeDoomed> for Directory {
    type Result = ();

    fn handle(&mut self, msg: NodeDoomed, _: &mut Self::Context) {
        self.doomed.insert(msg.node, msg.fault);
    }
}

/// Every live actor's record.
#[derive(Message)]
#[rtype(result = "Vec<ActorRecord>")]
pub struct ListActors;

/// The dead actors kept (`graveyard.rs`), oldest first.
#[derive(Message)]
#[rtype(result = "Vec<ActorRecord>")]
pub struct ListDeadActors;

/// An actor incarnation died (or never started).
#[derive(Clone, Debug, Message)]
#[rtype(result = "()")]
pub struct ActorDown {
    /// The actor.
    pub actor: ActorId,
    /// The incarnation that died.
    pub incarnation: Incarnation,
    /// Why.
    pub reason: DeathCause,
    /// Whether its node starts a new incarnation.
    pub restarting: bool,
    /// The node that reports it (`None`: the head itself, or a spawner
    /// releasing a name); a report from another node than the actor's is
    /// ignored.
    pub node: Option<NodeIdentity>,
}

/// The live actor with this name.
#[derive(Message)]
#[rtype(result = "Option<ActorRecord>")]
pub struct LookupName(pub String);

/// The record of this actor, live or dead.
#[derive(Message)]
#[rtype(result = "Option<ActorRecord>")]
pub struct LocateActor(pub ActorId);

impl Handler<ReserveName> for Directory {
    type Result = Result<(), Box<ActorRecord>>;

    fn handle(&mut self, msg: ReserveName, _: &mut Self::Context) -> Self::Result {
        if let Some(holder) = self.names.get(&msg.name).copied() {
            if holder != msg.actor {
                if let Some(record) = self.live(holder) {
                    return Err(Box::new(record.clone()));
                }
            }
        }
        self.names.insert(msg.name, msg.actor);
        Ok(())
    }
}

impl Handler<ActorUp> for Directory {
    type Result = ();

    fn handle(&mut self, ActorUp { record, spec }: ActorUp, _: &mut Self::Context) {
        // A member re-reporting what it runs after the head's restart: an
        // unchanged record is not news, an older incarnation or a buried
        // one is stale.
        if let Some(known) = self.actors.get(&record.actor) {
            let unchanged = *known == record && self.specs.get(&record.actor) == Some(&spec);
            let stale = record.incarnation < known.incarnation
                || (record.incarnation == known.incarnation && known.dead.is_some());
            if unchanged || stale {
                return;
            }
        }
        let actor = record.actor;
        self.graveyard.revived(actor);
        self.specs.insert(actor, spec);
        if let Some(name) = &record.name {
            self.names.insert(name.clone(), actor);
        }
        let started = ClusterEventKind::ActorStarted {
            actor,
            incarnation: record.incarnation,
            name: record.name.clone(),
            node: record.node.name.clone(),
        };
        self.actors.insert(actor, record);
        self.persist(actor, &[]);
        self.events.do_send(Publish(started));
    }
}

impl Handler<ActorDown> for Directory {
    type Result = ();

    fn handle(&mut self, mut msg: ActorDown, _: &mut Self::Context) {
        msg.reason = msg.reason.bounded();
        let record = self.actors.get(&msg.actor);
        if let (Some(record), Some(node)) = (record, &msg.node) {
            if record.node != *node {
                tracing::warn!(actor = %msg.actor, "ignored a death report from {node}: the actor runs on {}", record.node);
                return;
            }
        }
        let current = record.map(|r| r.incarnation);
        match current {
            Some(incarnation) if incarnation != msg.incarnation => {}
            None => self.names.retain(|_, actor| *actor != msg.actor),
            // Reported again (after the head's restart): already buried.
            Some(_) if self.live(msg.actor).is_none() => {}
            Some(_) if msg.restarting => {
                if let Some(record) = self.actors.get_mut(&msg.actor) {
                    record.restarting = true;
                }
                self.persist(msg.actor, &[]);
                self.events.do_send(Publish(ClusterEventKind::ActorDied {
                    actor: msg.actor,
                    incarnation: msg.incarnation,
                    reason: msg.reason,
                    restarting: true,
                }));
            }
            Some(_) => self.bury(msg.actor, msg.reason),
        }
    }
}

impl Handler<LookupName> for Directory {
    type Result = Option<ActorRecord>;

    fn handle(&mut self, LookupName(name): LookupName, _: &mut Self::Context) -> Self::Result {
        self.names
            .get(&name)
            .and_then(|actor| self.live(*actor))
            .cloned()
    }
}

impl Handler<ListActors> for Directory {
    type Result = MessageResult<ListActors>;

    fn handle(&mut self, _: ListActors, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.actors
                .values()
                .filter(|r| r.dead.is_none())
                .cloned()
                .collect(),
        )
    }
}

impl Handler<ListDeadActors> for Directory {
    type Result = MessageResult<ListDeadActors>;

    fn handle(&mut self, _: ListDeadActors, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.graveyard
                .actors()
                .filter_map(|actor| self.actors.get(&actor))
                .filter(|r| r.dead.is_some())
                .cloned()
                .collect(),
        )
    }
}

impl Handler<LocateActor> for Directory {
    type Result = Option<ActorRecord>;

    fn handle(&mut self, LocateActor(actor): LocateActor, _: &mut Self::Context) -> Self::Result {
        self.actors.get(&actor).cloned()
    }
}

/// A spawn waits for room (`demands.rs`, step 1).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Waiting {
    /// The actor being spawned.
    pub actor: ActorId,
    /// Its class, resources, job, and the node it is pinned to.
    pub what: (String, crate::cluster::ResourceSet, String, Option<String>),
    /// How much longer it tries.
    pub for_at_most: std::time::Duration,
}

impl Handler<Waiting> for Directory {
    type Result = ();

    fn handle(&mut self, msg: Waiting, _: &mut Self::Context) {
        let now = std::time::Instant::now();
        self.demands.wait(msg.actor, msg.what, now, msg.for_at_most);
    }
}

/// A placement group waits for room (`demands.rs`, step 1).
#[derive(Message)]
#[rtype(result = "()")]
pub struct GroupWaiting {
    /// The group, its bundles and their spread.
    pub group: crate::cluster::GroupDemand,
    /// Its job.
    pub job: String,
    /// How much longer it tries.
    pub for_at_most: std::time::Duration,
}

impl Handler<GroupWaiting> for Directory {
    type Result = ();

    fn handle(&mut self, msg: GroupWaiting, _: &mut Self::Context) {
        let now = std::time::Instant::now();
        self.demands
            .group_waits(msg.group, msg.job, now, msg.for_at_most);
    }
}

/// Tasks wait to run (`demands.rs`, step 3).
#[derive(Message)]
#[rtype(result = "()")]
pub struct TasksWaiting {
    /// The process's queue for their placement.
    pub queue: u64,
    /// What each asks for, and their job.
    pub what: (crate::cluster::ResourceSet, String),
    /// How many wait (0: none any more).
    pub count: u32,
}

impl Handler<TasksWaiting> for Directory {
    type Result = ();

    fn handle(&mut self, msg: TasksWaiting, _: &mut Self::Context) {
        let now = std::time::Instant::now();
        self.demands.tasks_wait(msg.queue, msg.what, msg.count, now);
    }
}

/// A waiting spawn or group ended (`demands.rs`, step 2).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Placed(pub super::demands::Waiter);

impl Handler<Placed> for Directory {
    type Result = ();

    fn handle(&mut self, Placed(waiter): Placed, _: &mut Self::Context) {
        self.demands.placed(waiter);
    }
}

/// The spawns waiting for room (`demands.rs`, step 3).
#[derive(Message)]
#[rtype(result = "Vec<crate::cluster::Demand>")]
pub struct ListDemands;

impl Handler<ListDemands> for Directory {
    type Result = MessageResult<ListDemands>;

    fn handle(&mut self, _: ListDemands, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.demands.list(std::time::Instant::now()))
    }
}

impl Handler<ClusterEvent> for Directory {
    type Result = ();

    fn handle(&mut self, event: ClusterEvent, _: &mut Self::Context) {
        let (node, reason) = match event.kind {
            ClusterEventKind::NodeDead { node, reason } => (node, reason),
            ClusterEventKind::NodeLeft { node } => (node, LEFT.to_string()),
            _ => return,
        };
        self.node_lost(node, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::events::EventsSince;
    use crate::wire::NodeIdentity;

    /// Every event published so far.
    async fn published(events: &Addr<ClusterEvents>) -> Vec<ClusterEvent> {
        let all = EventsSince {
            after: 0,
            wait: std::time::Duration::ZERO,
        };
        events.send(all).await.unwrap()
    }

    fn record(actor: u64, name: &str, node: &str) -> ActorRecord {
        ActorRecord {
            actor: ActorId(actor),
            type_name: "T".into(),
            name: Some(name.into()),
            node: NodeIdentity {
                name: node.into(),
                incarnation: Incarnation(1),
            },
            address: "127.0.0.1:1".parse().unwrap(),
            incarnation: Incarnation(actor),
            restarts: 0,
            dead: None,
            restarting: false,
            job: "j".into(),
            shared: false,
            pid: 1,
        }
    }

    fn spec(actor: u64, name: &str) -> ActorSpec {
        ActorSpec {
            actor: ActorId(actor),
            type_name: "T".into(),
            name: Some(name.into()),
            args: Vec::new(),
            resources: Default::default(),
            max_restarts: 0,
            restarts: 0,
            node: None,
            job: "job".into(),
            detached: false,
            shared: false,
            binary: crate::cluster::BinaryId {
                hash: "00".into(),
                len: 0,
            },
            bundle: None,
            owner: None,
        }
    }

    /// A restarted head's directory (`store.rs`): the stored actors come
    /// back with their names; those of nodes lost before or with the
    /// previous head are handled at start; a re-reported unchanged actor
    /// is not news, a stale incarnation is ignored; every change reaches
    /// the store, which the next head reads.
    #[actix_rt::test]
    async fn a_restarted_heads_directory_starts_from_its_store() {
        let dir_path = tempfile::tempdir().unwrap();
        let (_, start) = HeadStore::start(dir_path.path(), None).unwrap();
        let store = start.store;
        let stored = |actor, name: &str, node: &str| StoredActor {
            record: record(actor, name, node),
            spec: Some(spec(actor, name)),
        };
        let actors = vec![stored(1, "kept", "member"), stored(2, "lost", "old-head")];
        let lost = vec![(
            record(2, "lost", "old-head").node,
            "the head restarted".into(),
        )];
        let events = ClusterEvents::default().start();
        let dir = Directory::new(events.clone(), None)
            .stored(store.clone(), actors, lost)
            .start();
        let kept = dir.send(LookupName("kept".into())).await.unwrap();
        assert_eq!(kept.map(|r| r.incarnation), Some(Incarnation(1)));
        assert_eq!(dir.send(LookupName("lost".into())).await.unwrap(), None);
        let lost = dir.send(LocateActor(ActorId(2))).await.unwrap().unwrap();
        assert!(lost
            .dead
            .unwrap()
            .to_string()
            .contains("the head restarted"));

        // Re-reported as it was: nothing published. An older incarnation:
        // ignored.
        dir.send(ActorUp {
            record: record(1, "kept", "member"),
            spec: spec(1, "kept"),
        })
        .await
        .unwrap();
        let mut stale = record(1, "kept", "member");
        stale.incarnation = Incarnation(0);
        stale.address = "127.0.0.1:9".parse().unwrap();
        dir.send(ActorUp {
            record: stale,
            spec: spec(1, "kept"),
        })
        .await
        .unwrap();
        let published = published(&events).await;
        assert!(
            published
                .iter()
                .all(|e| !matches!(e.kind, ClusterEventKind::ActorStarted { .. })),
            "{published:?}"
        );
        let kept = dir.send(LocateActor(ActorId(1))).await.unwrap().unwrap();
        assert_eq!(kept.incarnation, Incarnation(1));
        let loaded = store.load().unwrap();
        let lost = loaded.actors.iter().find(|a| a.record.actor == ActorId(2));
        assert!(
            lost.unwrap().record.dead.is_some(),
            "the burial was written"
        );
    }

    #[actix_rt::test]
    async fn names_are_unique_while_alive_and_die_with_their_node() {
        let events = ClusterEvents::default().start();
        let dir = Directory::new(events.clone(), None).start();
        let reserve = |actor, name: &str| ReserveName {
            name: name.into(),
            actor: ActorId(actor),
        };
        dir.send(reserve(1, "bank")).await.unwrap().unwrap();
        dir.send(ActorUp {
            record: record(1, "bank", "a"),
            spec: spec(1, "bank"),
        })
        .await
        .unwrap();
        assert!(dir.send(reserve(2, "bank")).await.unwrap().is_err());
        let found = dir.send(LookupName("bank".into())).await.unwrap();
        assert_eq!(found.map(|r| r.actor), Some(ActorId(1)));

        dir.send(ClusterEvent {
            seq: 1,
            time_ms: 0,
            kind: ClusterEventKind::NodeDead {
                node: record(1, "bank", "a").node,
                reason: "test".into(),
            },
        })
        .await
        .unwrap();
        assert_eq!(dir.send(LookupName("bank".into())).await.unwrap(), None);
        let dead = dir.send(LocateActor(ActorId(1))).await.unwrap().unwrap();
        assert!(dead.dead.unwrap().is_node_lost());
        let published = published(&events).await;
        assert!(
            matches!(&published[1].kind, ClusterEventKind::ActorDied { actor, restarting: false, .. } if *actor == ActorId(1))
        );
        dir.send(reserve(2, "bank")).await.unwrap().unwrap();
    }

    /// A node that leaves on purpose takes its actors with it, as a lost
    /// node does: dead (or restarting elsewhere), names freed.
    #[actix_rt::test]
    async fn the_actors_of_a_node_that_left_are_dead_and_their_names_free() {
        let events = ClusterEvents::default().start();
        let dir = Directory::new(events.clone(), None).start();
        dir.send(ActorUp {
            record: record(1, "bank", "a"),
            spec: spec(1, "bank"),
        })
        .await
        .unwrap();
        dir.send(ClusterEvent {
            seq: 1,
            time_ms: 0,
            kind: ClusterEventKind::NodeLeft {
                node: record(1, "bank", "a").node,
            },
        })
        .await
        .unwrap();
        assert_eq!(dir.send(LookupName("bank".into())).await.unwrap(), None);
        let dead = dir.send(LocateActor(ActorId(1))).await.unwrap().unwrap();
        let cause = dead.dead.unwrap();
        assert!(cause.is_node_lost(), "{cause}");
        assert!(cause.to_string().contains(LEFT), "{cause}");
    }
}
