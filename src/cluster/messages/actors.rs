//! Actors as the protocol names them: ids, specs, records, the binaries
//! they run from, and the lines of output they print.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::cluster::ResourceSet;
use crate::wire::{Incarnation, NodeIdentity};

/// A line a worker printed to its stdout, as its node keeps it for the
/// job's driver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputLine {
    /// Its number among the job's lines on that node (from 1).
    pub seq: u64,
    /// The actor that printed it.
    pub actor: ActorId,
    /// Its name, if it has one.
    pub name: Option<String>,
    /// The line, without its newline (at most 4 KiB of it).
    pub line: String,
}

/// A cluster-unique actor id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ActorId(pub u64);

impl ActorId {
    /// A new random id.
    pub fn random() -> Self {
        ActorId(rand::random())
    }
}

impl ActorId {
    /// The name of the worker process hosting this actor (its endpoint's
    /// identity), `worker-ACTOR`.
    pub fn worker_name(self) -> String {
        format!("{}{self}", crate::wire::WORKER_NAME_PREFIX)
    }
}

impl std::fmt::Display for ActorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A placement group: bundles of resources reserved together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PlacementGroupId(pub u64);

/// One bundle of a placement group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BundleId {
    /// The group.
    pub group: PlacementGroupId,
    /// The bundle's position in the group.
    pub index: u32,
}

impl std::fmt::Display for BundleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}/{}", self.group.0, self.index)
    }
}

/// The actor incarnation that spawned an actor from its worker process:
/// the spawned actor dies with that incarnation (Ray's fate sharing with
/// the owner; `crate::node`'s `manager/owners.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ActorOwner {
    /// The spawning actor.
    pub actor: ActorId,
    /// Its incarnation that spawned it.
    pub incarnation: Incarnation,
}

impl std::fmt::Display for ActorOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (incarnation {})", self.actor, self.incarnation.0)
    }
}

/// Everything a node needs to start (and restart) an actor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActorSpec {
    /// The actor's id.
    pub actor: ActorId,
    /// Its registered type name.
    pub type_name: String,
    /// Its unique name, if any.
    pub name: Option<String>,
    /// Serialized constructor arguments.
    #[serde(with = "serde_bytes")]
    pub args: Vec<u8>,
    /// Resources it holds while alive.
    pub resources: ResourceSet,
    /// How many times it is re-created after a death: by its node, or,
    /// when its node is lost, by the head on another node.
    pub max_restarts: u32,
    /// Restarts already used when this start was asked for (non-zero when
    /// the head restarts an actor whose node was lost).
    #[serde(default)]
    pub restarts: u32,
    /// The node it must run on (`Strategy::Node`), if any: such an actor
    /// is not restarted elsewhere when that node is lost.
    #[serde(default)]
    pub node: Option<String>,
    /// The job (driver program run) it belongs to.
    pub job: String,
    /// It outlives its job (Ray's `lifetime="detached"`): it is not killed
    /// when the job's driver is gone.
    #[serde(default)]
    pub detached: bool,
    /// Other jobs' workers may find it by name and call it
    /// (`SpawnOptions::shared`); else only its own job's workers (drivers
    /// and the CLI reach any actor).
    #[serde(default)]
    pub shared: bool,
    /// The program that hosts it.
    pub binary: BinaryId,
    /// The placement-group bundle whose resources it uses, if any.
    pub bundle: Option<BundleId>,
    /// The actor incarnation it dies with: the one whose worker process
    /// spawned it (not a task's worker), unless it is detached; `None`
    /// for actors of drivers, which end with their job.
    #[serde(default)]
    pub owner: Option<ActorOwner>,
}

/// A program binary, by content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinaryId {
    /// Hex SHA-256.
    pub hash: String,
    /// Length in bytes.
    pub len: u64,
}

/// Where an actor runs, and whether it still does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActorRecord {
    /// The actor.
    pub actor: ActorId,
    /// Its type name.
    pub type_name: String,
    /// Its unique name, if any.
    pub name: Option<String>,
    /// Its node.
    pub node: NodeIdentity,
    /// The worker process's address.
    pub address: SocketAddr,
    /// The worker process's incarnation: a restart is a new one.
    pub incarnation: Incarnation,
    /// Restarts so far.
    pub restarts: u32,
    /// Why it is dead, if it is (for good).
    pub dead: Option<crate::cluster::DeathCause>,
    /// Its last incarnation died and its node is starting the next one.
    pub restarting: bool,
    /// The job it belongs to.
    #[serde(default)]
    pub job: String,
    /// Other jobs' workers may find and call it (`ActorSpec::shared`).
    #[serde(default)]
    pub shared: bool,
    /// Its worker's process id on its node.
    #[serde(default)]
    pub pid: u32,
}
