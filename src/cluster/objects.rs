//! The object store's share of the control protocol: object ids, where an
//! object lives, who holds references to it, and what a node's store
//! reports.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::wire::NodeIdentity;

/// A cluster-unique object id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectId(pub u64);

impl ObjectId {
    /// A new random id.
    pub fn random() -> Self {
        ObjectId(rand::random())
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The node that owns an object: it keeps the primary copy and counts the
/// references.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjectLocation {
    /// The node.
    pub node: NodeIdentity,
    /// Its address.
    pub address: SocketAddr,
}

impl std::fmt::Display for ObjectLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.node, self.address)
    }
}

/// Who holds a reference to an object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RefHolder {
    /// A process (a driver or a worker): one entry however many
    /// `ObjectRef`s it has.
    Process {
        /// Random per process.
        id: u64,
        /// For people: `driver pid N` or `worker pid N`.
        label: String,
        /// A worker process: its actor and incarnation, whose death
        /// (`ActorDied`) releases its references.
        worker: Option<(super::ActorId, crate::wire::Incarnation)>,
        /// A driver process: its job, whose end (`JobEnded`) releases its
        /// references.
        #[serde(default)]
        job: Option<String>,
    },
    /// Another object that contains the reference.
    Object(ObjectId),
}

impl std::fmt::Display for RefHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefHolder::Process { label, .. } => f.write_str(label),
            RefHolder::Object(id) => write!(f, "object {id}"),
        }
    }
}

/// A small object put whole, in a batch (`ObjectRequest::PutObjects`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmallObject {
    /// The object.
    pub id: ObjectId,
    /// Its bytes.
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// A reference inside an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainedRef {
    /// The referenced object.
    pub id: ObjectId,
    /// Its owner.
    pub owner: ObjectLocation,
}

/// One change to an object's references.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefChange {
    /// The holder has a reference now. `arrived`: it came inside a message,
    /// so one reference in transit has landed.
    Hold {
        /// Whether it consumes a [`RefChange::Transit`].
        arrived: bool,
    },
    /// The holder dropped its last reference.
    Release,
    /// The holder serialized a reference into a message: it is in transit
    /// until the receiver's `Hold { arrived: true }`.
    Transit,
}

/// A change to one object's references.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefUpdate {
    /// The object.
    pub id: ObjectId,
    /// The change.
    pub change: RefChange,
}

/// Where an object's bytes are, on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectState {
    /// Referenced before its bytes arrived (a task still running).
    Expected,
    /// Chunks are arriving.
    Arriving,
    /// Complete, in the node's memory.
    InMemory,
    /// Complete, in a shared-memory file processes of the host can map.
    SharedMemory,
    /// Complete, spilled to the node's disk.
    Spilled,
    /// The task producing it failed.
    Failed,
}

impl std::fmt::Display for ObjectState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ObjectState::Expected => "expected",
            ObjectState::Arriving => "arriving",
            ObjectState::InMemory => "in memory",
            ObjectState::SharedMemory => "shared",
            ObjectState::Spilled => "spilled",
            ObjectState::Failed => "failed",
        })
    }
}

/// One object as a node's store sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObjectSummary {
    /// The object.
    pub id: ObjectId,
    /// Its size in bytes.
    pub size: u64,
    /// Where its bytes are.
    pub state: ObjectState,
    /// Whether this node owns it (false: a cached copy of another node's).
    pub primary: bool,
    /// Who holds references (owner only).
    pub holders: Vec<String>,
    /// References serialized into messages and not yet received.
    pub in_transit: i64,
}

/// What a node's object store holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectListing {
    /// Each object.
    pub objects: Vec<ObjectSummary>,
    /// Bytes in memory.
    pub used: u64,
    /// Of `used`, the bytes of freed objects' shared-memory files kept for
    /// reuse (spare files; given back first when memory is short).
    #[serde(default)]
    pub spare: u64,
    /// Bytes allowed in memory (`--object-store-memory`).
    pub capacity: u64,
    /// Bytes spilled to disk.
    pub spilled: u64,
}

/// A complete object's shared-memory file, for a process on the node's
/// host to map (or, from `CreateObject`, to write in place).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedObjectFile {
    /// The file.
    pub path: std::path::PathBuf,
    /// The object's size.
    pub size: u64,
    /// The node's host (its kernel boot id and the device of its
    /// `/dev/shm`): the path means something only to processes of that
    /// host.
    pub host: String,
}
