//! The directory (`ControlRequest::Directory`, to the head): actor names
//! and records, and what waits for room (the demands the autoscaler
//! reads).

use serde::{Deserialize, Serialize};

use crate::cluster::{ActorId, ActorRecord, ActorSpec, PlacementGroupId, ResourceSet};
use crate::wire::Incarnation;

/// To the head: actor names and records (answered by `Directory`).
// Built once per request and encoded at once: boxing the large variant
// would save no memory and cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DirectoryRequest {
    /// To the head: reserve a unique actor name. Answered with `Ack` or
    /// [`DirectoryReply::NameTaken`].
    ReserveName {
        /// The name.
        name: String,
        /// The actor that will carry it.
        actor: ActorId,
    },
    /// To the head: the actor with this name. Answered with [`DirectoryReply::Actor`].
    LookupName(String),
    /// To the head: where this actor is. Answered with [`DirectoryReply::Actor`].
    LocateActor(ActorId),
    /// From a node to the head: an actor (incarnation) runs, and how to
    /// start it again elsewhere should its node be lost.
    ActorUp {
        /// Where and which incarnation.
        record: ActorRecord,
        /// What it was started from.
        spec: ActorSpec,
    },
    /// From a node to the head: an actor incarnation died.
    ActorDown {
        /// The actor.
        actor: ActorId,
        /// Its dead incarnation.
        incarnation: Incarnation,
        /// Why it died.
        reason: crate::cluster::DeathCause,
        /// Whether its node is starting a new incarnation.
        restarting: bool,
    },
    /// To the head: every live actor's record. Answered with
    /// [`DirectoryReply::Actors`].
    ListActors,
    /// To the head: the records of the dead actors it keeps (the last
    /// 1,000 per job, 10,000 in all), oldest first. Answered with
    /// [`DirectoryReply::Actors`].
    ListDeadActors,
    /// To the head: a spawn found no node with room and keeps trying for
    /// `for_ms` (`crate::head`'s `demands.rs`). Answered with `Ack`.
    Waiting {
        /// The actor being spawned.
        actor: ActorId,
        /// Its type.
        class: String,
        /// What it asks for.
        resources: ResourceSet,
        /// Its job.
        job: String,
        /// How much longer the spawn tries, in milliseconds.
        for_ms: u64,
        /// The node it is pinned to, if any (no new node can take it).
        #[serde(default)]
        node: Option<String>,
    },
    /// To the head: a spawn that was waiting ended (placed or failed).
    /// Answered with `Ack`.
    Placed(ActorId),
    /// To the head: the spawns waiting for room. Answered with
    /// [`DirectoryReply::Demands`].
    ListDemands,
    /// To the head: a placement group found no nodes with room for its
    /// bundles and keeps trying for `for_ms`. Answered with `Ack`.
    GroupWaiting {
        /// The group, its bundles and how they must be spread.
        group: GroupDemand,
        /// Its job.
        job: String,
        /// How much longer the creation tries, in milliseconds.
        for_ms: u64,
    },
    /// To the head: a placement group that was waiting was reserved or
    /// failed. Answered with `Ack`.
    GroupPlaced(PlacementGroupId),
    /// To the head: `count` tasks of one placement in one process (its
    /// queue, `queue`) wait to run, and the last worker start for them
    /// found no node with room; said again every second while they wait,
    /// with `count` 0 once none do (`crate::task`'s pool). Answered with
    /// `Ack`.
    TasksWaiting {
        /// The process's queue for this placement (a random number).
        queue: u64,
        /// What each task asks for.
        resources: ResourceSet,
        /// How many wait.
        count: u32,
        /// Their job.
        job: String,
    },
}

/// What answers a [`DirectoryRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DirectoryReply {
    /// Done.
    Ack,
    /// The name belongs to another live actor.
    NameTaken(Box<ActorRecord>),
    /// An actor's record, if known.
    Actor(Option<Box<ActorRecord>>),
    /// Actors' records.
    Actors(Vec<ActorRecord>),
    /// The spawns waiting for room.
    Demands(Vec<Demand>),
}

/// A placement group's demand: its bundles and how they must be spread
/// over nodes (what an autoscaler must launch for it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupDemand {
    /// The group.
    pub id: PlacementGroupId,
    /// Its bundles.
    pub bundles: Vec<ResourceSet>,
    /// Where they may go together.
    pub together: Together,
}

/// How a placement group's bundles must share nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Together {
    /// Anywhere (`Pack` and `Spread` prefer, but do not require).
    #[default]
    Loose,
    /// Each on a node of its own (`StrictSpread`).
    DistinctNodes,
    /// All on one node (`StrictPack`).
    OneNode,
}

/// A spawn or placement group waiting for room (`nimbus status`'s
/// pending demands).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    /// The actor being spawned (0 for a placement group).
    pub actor: ActorId,
    /// Its type (`placement group` for a group).
    pub class: String,
    /// What it asks for (a group's bundles together).
    pub resources: ResourceSet,
    /// Its job.
    pub job: String,
    /// How long it has waited, in milliseconds.
    pub waited_ms: u64,
    /// The placement group's bundles and spread, for a group.
    #[serde(default)]
    pub group: Option<GroupDemand>,
    /// For tasks waiting to run: how many, each asking for `resources`
    /// (0 for a spawn or a group).
    #[serde(default)]
    pub tasks: u32,
    /// The node a spawn is pinned to, if any: only that node can take it,
    /// so an autoscaler launches nothing for it.
    #[serde(default)]
    pub node: Option<String>,
}

impl Demand {
    /// Its bundles (one for a spawn, one per task) and how they must
    /// share nodes.
    pub fn bundles(&self) -> (Vec<ResourceSet>, Together) {
        match &self.group {
            Some(group) => (group.bundles.clone(), group.together),
            None => (
                vec![self.resources.clone(); self.tasks.max(1) as usize],
                Together::Loose,
            ),
        }
    }
}
