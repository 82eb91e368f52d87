//! The object store's requests (`ControlRequest::Objects`, to a node's
//! `NodeObjectStore`); the types they carry are in `cluster/objects.rs`.

use serde::{Deserialize, Serialize};

use crate::cluster::{
    ContainedRef, ObjectId, ObjectListing, ObjectLocation, RefHolder, RefUpdate, SharedObjectFile,
};

/// To a node: its object store (answered by its `NodeObjectStore`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ObjectRequest {
    /// To a node: the next chunk of an object put there (the first, at
    /// offset 0, reserves `total` bytes, spilling older objects to disk if
    /// needed). Answered with `Ack`.
    PutObjectChunk {
        /// The object.
        id: ObjectId,
        /// Where the chunk starts.
        offset: u64,
        /// The object's size.
        total: u64,
        /// Who holds the first reference (the putter, or a task's caller).
        holder: RefHolder,
        /// References inside the object, kept alive as long as it lives
        /// (read at offset 0).
        contains: Vec<ContainedRef>,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        chunk: Vec<u8>,
    },
    /// To a node: small objects one process put, whole and without
    /// references, in the order it put them (it keeps its own copies and
    /// sends them with its reference changes, ahead of them). Each begins
    /// as a first `PutObjectChunk` would; one here already (a batch sent
    /// again) is left as it is, one that cannot be stored fails with the
    /// reason for its readers. Answered with `Ack`.
    PutObjects {
        /// Who holds each object's first reference: the putter.
        holder: RefHolder,
        /// The objects.
        objects: Vec<crate::cluster::SmallObject>,
    },
    /// To a node: bytes of an object it holds. Answered with
    /// [`ObjectReply::Bytes`].
    ReadObject {
        /// The object.
        id: ObjectId,
        /// Where to start.
        offset: u64,
        /// How many bytes at most.
        len: u64,
        /// The node caching a copy, when a node pulls (recorded so the copy
        /// is dropped when the object is freed).
        copy_at: Option<ObjectLocation>,
    },
    /// To a node: fetch an object from the node that owns it, unless it is
    /// here already; concurrent pulls of one object share one transfer.
    /// Answered with [`ObjectReply::Ready`] once the object is here.
    PullObject {
        /// The object.
        id: ObjectId,
        /// The node owning it.
        owner: ObjectLocation,
        /// How long to wait for an object still being produced.
        wait_ms: u64,
    },
    /// To a node: wait up to `wait_ms` for an object it owns to be complete.
    /// Answered with [`ObjectReply::Ready`],
    /// [`ObjectReply::Failed`] or [`ObjectReply::NotReady`].
    AwaitObject {
        /// The object.
        id: ObjectId,
        /// How long to wait.
        wait_ms: u64,
    },
    /// To a node: the task that was to produce object `id` there failed;
    /// reads of the object report `message`. Answered with `Ack`.
    FailObject {
        /// The object.
        id: ObjectId,
        /// Who holds the reference to it.
        holder: RefHolder,
        /// The task's error.
        message: String,
    },
    /// To a node: reference changes of objects it owns, made by one holder,
    /// in the order they happened. Answered with `Ack`.
    UpdateRefs {
        /// Who made them.
        holder: RefHolder,
        /// The changes.
        updates: Vec<RefUpdate>,
    },
    /// To a node: drop the copy of an object its owner freed. Answered with
    /// `Ack`.
    FreeObject(ObjectId),
    /// To a node, from another node: a bulk stream (TLS over TCP,
    /// `transport/bulk.rs`) of an object it holds, `size` bytes.
    /// Answered with [`ObjectReply::Stream`], or an error when the
    /// node has no bulk listener (read in chunks then).
    StreamObject {
        /// The object.
        id: ObjectId,
        /// Its size, as `AwaitObject` answered.
        size: u64,
        /// The node caching a copy (as for `ReadObject`).
        copy_at: Option<ObjectLocation>,
    },
    /// To a node, from a process of its host: the shared-memory file of a
    /// complete object. Answered with [`ObjectReply::File`] (`None`:
    /// read it in chunks).
    OpenObject(ObjectId),
    /// To a node, from a process of its host: reserve an object to write in
    /// place (as the first chunk of a put does). Answered with
    /// [`ObjectReply::File`]: `None` if the node keeps no shared
    /// memory, and nothing was reserved.
    CreateObject {
        /// The object.
        id: ObjectId,
        /// Its size.
        total: u64,
        /// Who holds the first reference.
        holder: RefHolder,
        /// References inside it.
        contains: Vec<ContainedRef>,
    },
    /// To a node: an object created with `CreateObject` is written
    /// (`written`) or abandoned. Answered with `Ack`.
    SealObject {
        /// The object.
        id: ObjectId,
        /// Whether the bytes are all there.
        written: bool,
    },
    /// To a node: the objects it holds. Answered with [`ObjectReply::Listing`].
    ListObjects,
}

/// What answers an [`ObjectRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ObjectReply {
    /// Done.
    Ack,
    /// Bytes of an object.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The objects a node holds, and its store's use.
    Listing(ObjectListing),
    /// The object is complete.
    Ready {
        /// Its size in bytes.
        size: u64,
        /// The job whose workers may read it (`None`: not known; drivers
        /// and nodes only): a node keeping a copy keeps it too.
        job: Option<String>,
    },
    /// The object will never be: the task producing it failed, or it was
    /// freed.
    Failed {
        /// Why.
        reason: String,
        /// The job whose worker or driver recorded the failure (its reason
        /// is that job's to read); `None` for what a node found itself (a
        /// lost owner, a freed object), which any reader may see.
        job: Option<String>,
    },
    /// The object was not complete within the wait.
    NotReady,
    /// An object's shared-memory file, if it has one.
    File(Option<SharedObjectFile>),
    /// Where to read a bulk stream of an object: the node's bulk port (on
    /// its QUIC address's IP) and the one-time ticket to present there.
    Stream {
        /// The TCP port.
        port: u16,
        /// The ticket.
        ticket: crate::transport::BulkTicket,
    },
}
