//! The half of the object store that runs in a node process: its shards
//! (`shard/`, each on a thread of its own), pulls from other nodes,
//! spilling under memory pressure, and the effects of frees on other nodes.
//!
//! Objects are spread by id over one shard per core, at most `MAX_SHARDS`
//! (4) (more shards than cores only add thread hops); every shard draws on
//! one memory budget (`--object-store-memory`). It answers the
//! `ObjectRequest`s of the control protocol:
//!
//! 1. **Puts.** A put arrives in `CHUNK_BYTES` (8 MiB) chunks
//!    (`PutObjectChunk`); the first reserves the whole size, spilling if
//!    needed, registers the putter as the object's first holder and holds
//!    the references the object contains on its behalf. Small objects
//!    without references come whole, in batches (`PutObjects`), each
//!    begun as such a first chunk. A process of this
//!    host writes a large object in place instead (`CreateObject`: the node
//!    reserves it and creates its file; the process writes; `SealObject`:
//!    the node checks the size). A transfer that fails is aborted: nothing
//!    is left behind, and the contained references are released. One that
//!    gets no bytes for the arrival timeout (`--object-arrival-timeout-s`,
//!    default [`ARRIVAL_TIMEOUT`], 60 s; for an object written in place,
//!    no change of its file) is abandoned: a primary fails with the reason
//!    (readers and waiters learn it; a put from offset 0 starts it over), a
//!    cached copy is dropped; its memory and file are given back.
//! 2. **Pulls.** `PullObject` makes another node's object present here: the
//!    home node long-polls the owner (`AwaitObject`, each wait at most
//!    `MAX_OBJECT_WAIT`, 30 s, for objects still being produced) and
//!    begins its copy. A copy in a shared-memory file comes over a bulk
//!    stream (`crate::transport`'s `bulk.rs`: TLS over TCP): the owner
//!    grants one (`StreamObject`) and, on a thread of its own, reads the
//!    object's shared-memory file straight into the stream's records (the
//!    file is pinned: freed meanwhile, it is removed, never reused as a
//!    spare nor cut, so the stream carries its bytes to the end; an object
//!    in memory or spilled is read by the shard in
//!    [`STREAM_CHUNK_BYTES`] chunks instead); opening it records this node
//!    as caching a copy. This node, on a thread of its own too, writes
//!    the records' bytes straight into its file, then seals that file (a
//!    seal names the file's inode: a file abandoned meanwhile and begun
//!    again by another pull is not sealed). A copy kept in memory, or one whose
//!    stream fails (no bulk listener, TCP refused, a stall, an early end),
//!    comes over QUIC from its start, in chunks, four in flight
//!    (`ReadObject`); after a failed dial, the owner's objects come over
//!    QUIC for [`BULK_RETRY_AFTER`] (60 s). Concurrent pulls of one
//!    object wait for the first.
//!    An owner that cannot be
//!    reached makes the object "lost: its owner, node N, cannot be reached"
//!    (there is no reconstruction; cached copies are not promoted).
//! 3. **Spilling.** When an object does not fit, each shard in turn is
//!    asked to spill its least recently used complete objects until it
//!    fits (`Spill`): cached copies are dropped (they can be pulled again),
//!    owned ones are written to the spill directory and leave memory.
//!    Objects being received are never spilled. A put larger than what
//!    remains after spilling everything fails with the numbers.
//! 4. **Frees.** Reference changes (`UpdateRefs`) go to the object's shard
//!    (`refcount.rs` decides). When an owned object is freed, the nodes
//!    caching a copy are told (`FreeObject`), and the references it
//!    contained are released on its behalf, wherever their owners are. A
//!    freed id is remembered (the last 64 Ki), so a late reader is told it
//!    was freed.
//! 5. **Worker deaths.** The store watches the head's events and drops the
//!    holds of each worker incarnation that died (`ActorDied`), so
//!    references die with a SIGKILLed worker too.
//! 6. **Files.** Spilled objects go to `--object-spill-dir`'s
//!    `nimbus-NODE-PID` (default `$NIMBUS_HOME/spill/NODE-PID`), objects of
//!    `SHARED_MIN` (1 MiB) or more to
//!    `/dev/shm/nimbus-objects-UID/nimbus-NODE-PID/job-JOB/`
//!    (`crate::host::shared_memory`; the directory a sandboxed worker of
//!    that job sees of it), their
//!    blocks allocated up front (a cached copy's as its bytes arrive, once
//!    the tmpfs has said it has room for them); one that does not fit there stays in the
//!    node's memory (a node whose `/dev/shm` is smaller than its store says
//!    so at start). Both are
//!    the node's own (`host/ownership.rs`: created by it, with an owner
//!    file it keeps locked); the node removes them when it stops, and at
//!    start those left by nodes of this host whose owner is provably gone.
//! 7. **Jobs.** Each object records its job when it begins: the job of the
//!    worker that puts it (its ticket's), or of the driver holding it; a
//!    copy takes the job the owner's `ObjectReady` names. A worker reads
//!    (`ReadObject`, `OpenObject`), waits for (`AwaitObject`) or pulls
//!    (`PullObject`) only its own job's objects, and appends to
//!    (`PutObjectChunk`), seals or abandons (`SealObject`), fails
//!    (`FailObject`) or takes references to (`UpdateRefs`) only those:
//!    another job's is refused (`Forbidden`, [`ShardError::OtherJob`]; a
//!    batch of reference changes is applied but for the refused holds,
//!    and its sender does not ask again).
//!    A failure's reason is the job's that recorded it (`ObjectFailed`
//!    names it); one this node found (lost, freed) any reader sees.
//!    Drivers, the CLI and nodes read and change any.
//!
//! The rooms: this file routes the requests and holds puts, spilling and
//! frees (steps 1, 3, 4, 6); `pull.rs` is step 2, `deaths.rs` step 5,
//! `access.rs` step 7; `refcount.rs` decides step 4, `shard/` keeps the
//! bytes, `small_reads.rs` serves small objects without a hop to a shard.

mod access;
mod deaths;
mod pull;
mod refcount;
mod shard;
mod small_reads;

pub use deaths::HeadEvents;
pub use pull::BULK_RETRY_AFTER;
pub use shard::{Budget, ObjectStoreShard, SHARED_MIN};

use access::{fail, job_of, may_read, readable};
use pull::Streamed;

/// How long an object may arrive without bytes before it is abandoned
/// (step 1), unless the node is told otherwise.
pub const ARRIVAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::client;
use crate::cluster::ObjectRequest;
use crate::cluster::{
    ContainedRef, ObjectId, ObjectListing, ObjectLocation, ObjectReply, RefChange, RefHolder,
    RefUpdate, SmallObject,
};
use crate::host::ownership::{OwnedDir, OwnershipError};
use crate::transport::{
    BulkGrants, BulkListener, BulkServer, CertificateHash, Endpoint, RequestOptions,
};
use crate::wire::{RemoteError, RemoteErrorKind};

use super::error::ShardError;
use super::transfer::{host_id, CHUNK_BYTES, MAX_OBJECT_WAIT};
use crate::cluster::SharedObjectFile;
use shard::{
    Abort, Append, Await, Awaited, Begin, Begun, DropCopy, Freed, List, Open, Read, Seal, Spill,
    UpdateRefs,
};
use small_reads::SmallReads;

/// The most shards a node runs: objects are spread over them by id.
const MAX_SHARDS: usize = 4;

/// The object store of one node.
#[derive(Clone)]
pub struct NodeObjectStore {
    shards: Vec<Addr<ObjectStoreShard>>,
    /// The shards' small complete objects, read without a hop to them.
    small: Arc<SmallReads>,
    budget: Arc<Budget>,
    /// Its spill and shared-memory directories.
    owned: Arc<Vec<OwnedDir>>,
    endpoint: Endpoint,
    me: ObjectLocation,
    /// The tickets of its bulk streams out (step 2), unless it has none.
    bulk: Option<BulkGrants<Streamed>>,
    /// When a bulk dial to each owner's address last failed (step 2).
    bulk_failed: Arc<dashmap::DashMap<std::net::IpAddr, std::time::Instant>>,
    /// Its bulk listener's thread, until the node stops (`stop`).
    bulk_server: Arc<std::sync::Mutex<Option<BulkServer>>>,
}

/// Makes this node's shared-memory directory `dir` (step 6) inside the
/// per-user one, which is made `0700` when missing and refused when it is
/// not this user's alone; tried twice, as a node that stops removes the
/// per-user directory when it leaves it empty.
fn own_shared_dir(dir: &std::path::Path) -> std::io::Result<OwnedDir> {
    let parent = dir.parent().unwrap_or(dir);
    let make = || {
        crate::host::files::private_dir_of_mine(parent)?;
        OwnedDir::create_unique(dir).map_err(std::io::Error::other)
    };
    make().or_else(|_| make())
}

impl NodeObjectStore {
    /// The directory of its shared-memory files, if it keeps any.
    pub fn shared_dir(&self) -> Option<&std::path::Path> {
        self.budget.shared_dir()
    }

    /// Sets the store's gauges (`crate::metrics`): bytes in memory and
    /// spilled, and the memory capacity. Called before each scrape.
    pub fn record_metrics(&self) {
        let bytes = |place| metrics::gauge!("nimbus_object_store_bytes", "where" => place);
        bytes("memory").set(self.budget.used() as f64);
        bytes("spilled").set(self.budget.spilled() as f64);
        bytes("spare").set(self.budget.spare() as f64);
        metrics::gauge!("nimbus_object_store_capacity_bytes").set(self.budget.capacity() as f64);
    }

    /// Starts the shards, each on a thread of its own, holding at most
    /// `capacity` bytes in memory, keeping large objects in files under
    /// `shared_dir` (a tmpfs directory, created here; `None`: none) and
    /// spilling into `spill_dir` (created here); `me` is this node; pulls
    /// go through `endpoint`. Both directories are this node's own
    /// ([`OwnedDir`]): when a path is taken, a fresh name next to it is
    /// used. Fails when the spill directory cannot be made (without shared
    /// memory, objects stay in process memory).
    pub fn start(
        capacity: u64,
        spill_dir: std::path::PathBuf,
        shared_dir: Option<std::path::PathBuf>,
        arrival_timeout: std::time::Duration,
        endpoint: Endpoint,
        me: ObjectLocation,
    ) -> Result<Self, OwnershipError> {
        let shared = shared_dir.and_then(|dir| match own_shared_dir(&dir) {
            Ok(owned) => Some(owned),
            Err(e) => {
                tracing::warn!("no shared memory for objects: {e}");
                None
            }
        });
        let spill = OwnedDir::create_unique(&spill_dir)?;
        let spill_dir = spill.path().to_path_buf();
        let shared_dir = shared.as_ref().map(|d| d.path().to_path_buf());
        let owned = Arc::new([Some(spill), shared].into_iter().flatten().collect());
        let budget = Budget::new(capacity, spill_dir, shared_dir, arrival_timeout);
        let small = Arc::new(SmallReads::default());
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let shards = (0..cores.clamp(1, MAX_SHARDS))
            .map(|_| {
                let shard = ObjectStoreShard::new(budget.clone(), small.clone());
                ObjectStoreShard::start_in_arbiter(&Arbiter::new().handle(), |_| shard)
            })
            .collect();
        let listener = endpoint.bulk_listener(me.address.ip()).unwrap_or_else(|e| {
            tracing::warn!("no bulk listener ({e}): objects leave this node over QUIC");
            None
        });
        let bulk = listener.as_ref().map(BulkListener::grants);
        let store = NodeObjectStore {
            shards,
            small,
            budget,
            owned,
            endpoint,
            me,
            bulk: bulk.clone(),
            bulk_failed: Arc::default(),
            bulk_server: Arc::default(),
        };
        if let (Some(listener), Some(grants)) = (listener, bulk) {
            let server = store.clone();
            let serving = listener.serve_on_own_thread(grants, move |what, stream| {
                server.clone().stream_out(what, stream)
            });
            match serving {
                Ok(serving) => *lock(&store.bulk_server) = Some(serving),
                Err(e) => {
                    tracing::warn!("no bulk listener ({e}): objects leave this node over QUIC")
                }
            }
        }
        Ok(store)
    }

    /// Stops serving bulk streams and removes the spilled objects' and
    /// shared-memory objects' files (at node shutdown): the directories
    /// this node created, nothing else.
    pub fn stop(&self) {
        lock(&self.bulk_server).take();
        for dir in self.owned.iter() {
            if let Err(e) = dir.remove() {
                tracing::warn!("cannot remove {}: {e}", dir.path().display());
            }
        }
        // What is empty in the per-user directory, and the directory once
        // no node or job of this user keeps anything in it.
        if let Some(shm) = self.shared_dir().and_then(|d| d.parent()?.parent()) {
            crate::host::shared_memory::remove_empty(shm);
        }
    }

    fn shard_index(&self, id: ObjectId) -> usize {
        (id.0 % self.shards.len() as u64) as usize
    }

    fn shard(&self, id: ObjectId) -> &Addr<ObjectStoreShard> {
        &self.shards[self.shard_index(id)]
    }

    /// Answers an object-store request. `confined`: the job a worker
    /// caller is confined to (`None`: a driver, the CLI, a node); such a
    /// worker reads only that job's objects, and what it puts is that
    /// job's. A driver's puts are its job's (its holder names it). A bulk
    /// stream is granted to `caller`'s certificate alone.
    pub async fn handle(
        &self,
        request: ObjectRequest,
        confined: Option<&str>,
        caller: CertificateHash,
    ) -> Result<ObjectReply, RemoteError> {
        match request {
            ObjectRequest::PutObjectChunk {
                id,
                offset,
                total,
                holder,
                contains,
                chunk,
            } => self
                .put_chunk(id, offset, total, (holder, contains), chunk, confined)
                .await
                .map(|()| ObjectReply::Ack),
            ObjectRequest::PutObjects { holder, objects } => {
                self.put_small(holder, objects, confined).await;
                Ok(ObjectReply::Ack)
            }
            ObjectRequest::ReadObject {
                id,
                offset,
                len,
                copy_at,
            } => {
                let len = len.min(CHUNK_BYTES as u64);
                if copy_at.is_none() {
                    if let Some(bytes) = self.small.read(id, offset, len, confined) {
                        return Ok(ObjectReply::Bytes(bytes));
                    }
                }
                let read = Read {
                    id,
                    offset,
                    len,
                    copy_at,
                    confined: confined.map(str::to_string),
                };
                flatten(self.shard(id).send(read).await).map(ObjectReply::Bytes)
            }
            ObjectRequest::StreamObject { id, size, copy_at } => match &self.bulk {
                Some(grants) => Ok(ObjectReply::Stream {
                    port: grants.port(),
                    ticket: grants.grant(Streamed { id, size, copy_at }, caller),
                }),
                None => Err(bad(format!(
                    "object {id}: this node has no bulk listener (bulk streams are off); read it in chunks"
                ))),
            },
            ObjectRequest::PullObject { id, owner, wait_ms } => {
                readable(id, self.pull(id, owner, wait(wait_ms)).await, confined)
            }
            ObjectRequest::AwaitObject { id, wait_ms } => {
                readable(id, self.await_object(id, wait(wait_ms)).await, confined)
            }
            ObjectRequest::FailObject {
                id,
                holder,
                message,
            } => {
                self.may_change([id], confined).await?;
                let failed = self.shard(id).send(fail(id, holder, message, confined)).await;
                failed.map(|()| ObjectReply::Ack).map_err(unavailable)
            }
            ObjectRequest::UpdateRefs { holder, updates } => {
                // The holds a worker may not take are left out, the rest
                // applied (asking again would apply them twice).
                let held = updates.iter().filter(|u| matches!(u.change, RefChange::Hold { .. }));
                let others = self.of_other_jobs(held.map(|u| u.id), confined).await?;
                let (refused, updates): (Vec<RefUpdate>, Vec<RefUpdate>) =
                    updates.into_iter().partition(|u| {
                        matches!(u.change, RefChange::Hold { .. }) && others.contains(&u.id)
                    });
                let job = job_of(&holder, confined).map(Arc::from);
                self.update_refs(holder, job, updates).await;
                match (refused.first(), confined) {
                    (Some(update), Some(job)) => Err(forbidden(ShardError::OtherJob {
                        id: update.id,
                        job: job.to_string(),
                    })),
                    _ => Ok(ObjectReply::Ack),
                }
            }
            ObjectRequest::FreeObject(id) => {
                let dropped = self.shard(id).send(DropCopy(id)).await;
                dropped.map(|()| ObjectReply::Ack).map_err(unavailable)
            }
            ObjectRequest::ListObjects => Ok(ObjectReply::Listing(self.list().await)),
            ObjectRequest::OpenObject(id) => {
                let open = Open {
                    id,
                    confined: confined.map(str::to_string),
                };
                let opened = flatten(self.shard(id).send(open).await);
                opened.map(|file| {
                    ObjectReply::File(file.map(|(path, size)| shared(path, size)))
                })
            }
            ObjectRequest::CreateObject {
                id,
                total,
                holder,
                contains,
            } => {
                let owned = (holder, contains);
                self.create(id, total, owned, confined).await
            }
            ObjectRequest::SealObject { id, written } => {
                self.may_change([id], confined).await?;
                if written {
                    let seal = Seal { id, inode: None };
                    flatten(self.shard(id).send(seal).await).map(|()| ObjectReply::Ack)
                } else {
                    self.abort(id).await;
                    Ok(ObjectReply::Ack)
                }
            }
        }
    }

    async fn put_chunk(
        &self,
        id: ObjectId,
        offset: u64,
        total: u64,
        (holder, contains): (RefHolder, Vec<ContainedRef>),
        chunk: Vec<u8>,
        confined: Option<&str>,
    ) -> Result<(), RemoteError> {
        if offset == 0 {
            // The first chunk comes with the begin; a failed begin leaves
            // nothing behind.
            return self
                .begin_owned(id, total, (holder, contains), Some(chunk), confined)
                .await
                .map(drop);
        }
        self.may_change([id], confined).await?;
        let appended = flatten(self.shard(id).send(Append { id, offset, chunk }).await);
        if appended.is_err() {
            self.abort(id).await;
        }
        appended
    }

    /// Begins each small object whole, in one shard message each, all at
    /// once. One that is here already (a batch sent again) is left as it
    /// is (`Fail` changes no object it finds); one that cannot be stored
    /// fails with the reason, for its readers.
    async fn put_small(
        &self,
        holder: RefHolder,
        objects: Vec<SmallObject>,
        confined: Option<&str>,
    ) {
        let begins = objects.into_iter().map(|object| {
            let holder = holder.clone();
            async move {
                let (id, total) = (object.id, object.bytes.len() as u64);
                let owned = (holder.clone(), Vec::new());
                let begun = self.begin_owned(id, total, owned, Some(object.bytes), confined);
                let Err(e) = begun.await else {
                    return;
                };
                let message = format!("its put failed: {}", e.message);
                let failed = fail(id, holder, message, confined);
                if let Err(e) = self.shard(id).send(failed).await {
                    tracing::warn!(object = %id, "object store shard unavailable: {e}");
                }
            }
        });
        futures::future::join_all(begins).await;
    }

    /// Reserves an object for a process of this host to write in place.
    async fn create(
        &self,
        id: ObjectId,
        total: u64,
        owned: (RefHolder, Vec<ContainedRef>),
        confined: Option<&str>,
    ) -> Result<ObjectReply, RemoteError> {
        let job = job_of(&owned.0, confined);
        let Some(path) = self.budget.shared_path(id, total, job) else {
            return Ok(ObjectReply::File(None));
        };
        if !self.begin_owned(id, total, owned, None, confined).await? {
            // No room in /dev/shm: the process sends it in chunks instead.
            self.abort(id).await;
            return Ok(ObjectReply::File(None));
        }
        Ok(ObjectReply::File(Some(shared(path, total))))
    }

    /// Begins a new object owned here, held by `holder`, with its `first`
    /// chunk if given; from now until it is freed it holds the references
    /// it contains. It is the job of the worker that put it (`confined`),
    /// or of the driver holding it. Whether it is received into its
    /// shared-memory file.
    async fn begin_owned(
        &self,
        id: ObjectId,
        total: u64,
        (holder, contains): (RefHolder, Vec<ContainedRef>),
        first: Option<Vec<u8>>,
        confined: Option<&str>,
    ) -> Result<bool, RemoteError> {
        let job = job_of(&holder, confined);
        let begin = Begin {
            id,
            total,
            job: job.map(Arc::from),
            holder: Some(holder),
            contains: contains.clone(),
            first,
        };
        let shared = match self.begin(begin).await? {
            Begun::Fresh { shared } => shared,
            _ => return Err(bad(ShardError::Exists(id).to_string())),
        };
        self.hold_contained(id, &contains, RefChange::Hold { arrived: false })
            .await;
        Ok(shared)
    }

    /// Begins an object, spilling older ones first if memory is short.
    async fn begin(&self, begin: Begin) -> Result<Begun, RemoteError> {
        let (id, total) = (begin.id, begin.total);
        let mut retry = Begin {
            contains: begin.contains.clone(),
            holder: begin.holder.clone(),
            job: begin.job.clone(),
            first: None,
            ..begin
        };
        let need = match flatten(self.shard(id).send(begin).await)? {
            Begun::NoRoom { first, .. } => {
                retry.first = first;
                total
            }
            begun => return Ok(begun),
        };
        let mut spilled = 0;
        for shard in &self.shards {
            if self.budget.free() >= need {
                break;
            }
            spilled += flatten(shard.send(Spill { need }).await)?;
        }
        match flatten(self.shard(id).send(retry).await)? {
            Begun::NoRoom { .. } => Err(RemoteError::new(
                RemoteErrorKind::BadRequest,
                format!(
                    "the object store is full: object {id} of {total} bytes does not fit in memory ({} of {} bytes in use by objects that cannot be spilled: being transferred) even after spilling {spilled} bytes to disk (--object-store-memory)",
                    self.budget.used(),
                    self.budget.capacity()
                ),
            )),
            begun => Ok(begun),
        }
    }

    async fn abort(&self, id: ObjectId) {
        if let Ok(contains) = self.shard(id).send(Abort(id)).await {
            self.hold_contained(id, &contains, RefChange::Release).await;
        }
    }

    /// Sends `change` on behalf of object `id` for each contained reference.
    async fn hold_contained(&self, id: ObjectId, contains: &[ContainedRef], change: RefChange) {
        for inner in contains {
            let update = RefUpdate {
                id: inner.id,
                change,
            };
            self.send_refs(&inner.owner, RefHolder::Object(id), vec![update])
                .await;
        }
    }

    /// Reference changes, here or at another owner.
    fn send_refs(
        &self,
        owner: &ObjectLocation,
        holder: RefHolder,
        updates: Vec<RefUpdate>,
    ) -> BoxFuture<'static, ()> {
        let store = self.clone();
        let owner = owner.clone();
        async move {
            if owner.node == store.me.node {
                let job = job_of(&holder, None).map(Arc::from);
                store.update_refs(holder, job, updates).await;
                return;
            }
            let request = ObjectRequest::UpdateRefs { holder, updates };
            let sent = match store
                .endpoint
                .connect(owner.address, Some(&owner.node))
                .await
            {
                Ok(connection) => client::call(&connection, request, RequestOptions::control())
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = sent {
                tracing::warn!(%owner, "reference changes not delivered: {e}");
            }
        }
        .boxed()
    }

    /// `items` split by the shard of each one's object (`id_of`), in shard
    /// order.
    fn by_shard<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        id_of: impl Fn(&T) -> ObjectId,
    ) -> Vec<Vec<T>> {
        let mut split: Vec<Vec<T>> = (0..self.shards.len()).map(|_| Vec::new()).collect();
        for item in items {
            split[self.shard_index(id_of(&item))].push(item);
        }
        split
    }

    /// Applies reference changes to objects owned here, then tells other
    /// nodes about the objects that were freed.
    async fn update_refs(&self, holder: RefHolder, job: Option<Arc<str>>, updates: Vec<RefUpdate>) {
        let changes = updates.into_iter().map(|u| (u.id, u.change));
        let mut freed = Vec::new();
        for (shard, updates) in self.shards.iter().zip(self.by_shard(changes, |c| c.0)) {
            if updates.is_empty() {
                continue;
            }
            let update = UpdateRefs {
                holder: holder.clone(),
                job: job.clone(),
                updates,
            };
            match shard.send(update).await {
                Ok(list) => freed.extend(list),
                Err(e) => tracing::warn!("object store shard unavailable: {e}"),
            }
        }
        for object in freed {
            tokio::spawn(self.clone().after_free(object));
        }
    }

    /// Drops the copies of a freed object and releases what it contained.
    async fn after_free(self, freed: Freed) {
        for copy in freed.copies {
            let request = ObjectRequest::FreeObject(freed.id);
            if let Ok(connection) = self.endpoint.connect(copy.address, Some(&copy.node)).await {
                let _ = client::call(&connection, request, RequestOptions::control()).await;
            }
        }
        self.hold_contained(freed.id, &freed.contains, RefChange::Release)
            .await;
    }

    /// Waits up to `wait` for object `id` to be complete here.
    async fn await_object(&self, id: ObjectId, wait: Duration) -> ObjectReply {
        let end = tokio::time::Instant::now() + wait;
        loop {
            let awaited = match self.shard(id).send(Await(id)).await {
                Ok(awaited) => awaited,
                Err(e) => return lost_or_failed(e.to_string()),
            };
            match awaited {
                Awaited::Ready { size, job } => return ready(size, job.as_deref()),
                Awaited::Failed { reason, job } => {
                    return ObjectReply::Failed {
                        reason,
                        job: job.as_deref().map(str::to_string),
                    }
                }
                Awaited::Wait(change) => {
                    if tokio::time::timeout_at(end, change).await.is_err() {
                        return ObjectReply::NotReady;
                    }
                }
            }
        }
    }

    async fn list(&self) -> ObjectListing {
        let mut objects = Vec::new();
        for shard in &self.shards {
            if let Ok(listed) = shard.send(List).await {
                objects.extend(listed);
            }
        }
        objects.sort_by_key(|o| o.id);
        ObjectListing {
            objects,
            used: self.budget.used(),
            spare: self.budget.spare(),
            capacity: self.budget.capacity(),
            spilled: self.budget.spilled(),
        }
    }
}

fn shared(path: std::path::PathBuf, size: u64) -> SharedObjectFile {
    SharedObjectFile {
        path,
        size,
        host: host_id().to_string(),
    }
}

fn wait(wait_ms: u64) -> Duration {
    Duration::from_millis(wait_ms).min(MAX_OBJECT_WAIT)
}

fn bad(message: String) -> RemoteError {
    RemoteError::new(RemoteErrorKind::BadRequest, message)
}

fn unavailable(e: MailboxError) -> RemoteError {
    RemoteError::new(
        RemoteErrorKind::Internal,
        format!("object store shard unavailable: {e}"),
    )
}

fn flatten<T>(sent: Result<Result<T, ShardError>, MailboxError>) -> Result<T, RemoteError> {
    match sent {
        Ok(Err(e @ ShardError::OtherJob { .. })) => Err(forbidden(e)),
        Ok(result) => result.map_err(|e| bad(e.to_string())),
        Err(e) => Err(unavailable(e)),
    }
}

fn forbidden(e: ShardError) -> RemoteError {
    RemoteError::new(RemoteErrorKind::Forbidden, e.to_string())
}

/// The reply for an object that will never be here, for a `reason` this
/// node found (no job's: any reader may see it).
fn lost_or_failed(reason: String) -> ObjectReply {
    ObjectReply::Failed { reason, job: None }
}

/// The reply for a complete object of `size` bytes, of `job`.
fn ready(size: u64, job: Option<&str>) -> ObjectReply {
    ObjectReply::Ready {
        size,
        job: job.map(str::to_string),
    }
}

/// The bulk server's slot, also after a panic elsewhere poisoned its lock.
fn lock<T>(slot: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
