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
//!    `SHARED_MIN` (1 MiB) or more to `/dev/shm/nimbus-NODE-PID/`, their
//!    blocks allocated up front (a cached copy's as its bytes arrive, once
//!    the tmpfs has said it has room for them); one that does not fit there stays in the
//!    node's memory (a node whose `/dev/shm` is smaller than its store says
//!    so at start). Both are
//!    the node's own (`cluster/ownership.rs`: created by it, with an owner
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

mod refcount;
mod shard;
mod small_reads;

pub use shard::{Budget, ObjectStoreShard, SHARED_MIN};

/// How long an object may arrive without bytes before it is abandoned
/// (step 1), unless the node is told otherwise.
pub const ARRIVAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use crate::client;
use crate::cluster::ownership::{OwnedDir, OwnershipError};
use crate::cluster::ObjectRequest;
use crate::cluster::{
    ContainedRef, ControlReply, ControlRequest, ObjectId, ObjectListing, ObjectLocation, RefChange,
    RefHolder, RefUpdate, SmallObject,
};
use crate::transport::{
    BulkGrants, BulkListener, BulkStream, Connection, Endpoint, RequestOptions, MAX_STREAM_BYTES,
};
use crate::wire::{RemoteError, RemoteErrorKind};

use super::error::{ObjectStoreError, ShardError};
use super::transfer::{call, host_id, read_chunks, CHUNK_BYTES, MAX_OBJECT_WAIT};
use crate::cluster::SharedObjectFile;
use shard::{
    Abort, Append, Await, Awaited, Begin, Begun, DropCopy, DropDriver, DropWorker, Fail, Freed,
    Holders, List, ListHolders, OfOtherJobs, Open, OpenStream, Read, Seal, Spill, UpdateRefs,
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
}

/// How long after a failed bulk dial to an owner its objects come over
/// QUIC without trying TCP again (step 2).
pub const BULK_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The bytes of each shard read of a bulk stream out of an object not in
/// a shared-memory file (step 2).
pub(crate) const STREAM_CHUNK_BYTES: usize = 1 << 20;

/// What a bulk stream out of this node carries: an object's `size`
/// bytes, read for the node caching a copy (`copy_at`).
struct Streamed {
    id: ObjectId,
    size: u64,
    copy_at: Option<ObjectLocation>,
}

impl NodeObjectStore {
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
        let shared = shared_dir.and_then(|dir| match OwnedDir::create_unique(&dir) {
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
        let listener = endpoint.bulk_listener().unwrap_or_else(|e| {
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
        };
        if let (Some(listener), Some(grants)) = (listener, bulk) {
            let server = store.clone();
            tokio::spawn(listener.serve(grants, move |what, stream| {
                server.clone().stream_out(what, stream)
            }));
        }
        Ok(store)
    }

    /// Writes the bytes a bulk stream was granted for (step 2) and ends
    /// it, on a thread of its own: straight from the object's
    /// shared-memory file (pinned against reuse until the stream ends),
    /// else by shard reads. A failed read ends it early.
    async fn stream_out(self, what: Streamed, stream: BulkStream) {
        let Streamed { id, size, copy_at } = what;
        let shard = self.shard(id).clone();
        let open = OpenStream {
            id,
            copy_at: copy_at.clone(),
        };
        let opened = shard.send(open).await.ok().flatten();
        let runtime = tokio::runtime::Handle::current();
        let peer = stream.peer();
        let sent = stream.on_own_thread(move |stream| {
            match opened {
                Some((file, _pin)) => stream.write_from_file(&file, 0, size)?,
                None => {
                    for offset in (0..size).step_by(STREAM_CHUNK_BYTES) {
                        let read = Read {
                            id,
                            offset,
                            len: STREAM_CHUNK_BYTES as u64,
                            copy_at: copy_at.clone(),
                            confined: None,
                        };
                        match flatten(runtime.block_on(shard.send(read))) {
                            Ok(chunk) => stream.write_all(&chunk)?,
                            Err(e) => return Ok(Err(e.message)),
                        }
                    }
                }
            }
            stream.finish().map(Ok)
        });
        match sent.await.and_then(|sent| sent) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("object {id}: bulk stream to {peer} ended early: {e}"),
            Err(e) => tracing::debug!("object {id}: {e}"),
        }
    }

    /// Watches the head's events and releases the references of worker
    /// processes that die (`ActorDied`) and of the drivers of jobs that
    /// end (`JobEnded`): a SIGKILLed process never releases them itself.
    /// When events were missed (`Resync`: the head restarted), it asks the
    /// head instead (`NodeObjectStore::resync`). Runs until the node
    /// stops.
    pub fn watch_worker_deaths(&self, head: HeadEvents) {
        let store = self.clone();
        tokio::spawn(async move {
            // Deaths before this node's store started held nothing of it.
            let mut after = None;
            // A resync that could not finish is tried again after each poll.
            let mut resync_due = false;
            loop {
                let wait = if after.is_some() {
                    MAX_OBJECT_WAIT
                } else {
                    Duration::ZERO
                };
                let events = match head.since(&store.endpoint, after.unwrap_or(0), wait).await {
                    Ok(events) => events,
                    Err(e) => {
                        tracing::warn!("object store: the head's events are unreachable ({e})");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let seen = after.replace(events.last().map_or(after.unwrap_or(0), |e| e.seq));
                if seen.is_none() {
                    continue;
                }
                for event in events {
                    match event.kind {
                        crate::cluster::ClusterEventKind::ActorDied {
                            actor, incarnation, ..
                        } => store.drop_worker(actor, incarnation).await,
                        crate::cluster::ClusterEventKind::JobEnded { job, .. } => {
                            store.drop_driver(job).await
                        }
                        crate::cluster::ClusterEventKind::Resync { .. } => resync_due = true,
                        _ => {}
                    }
                }
                if resync_due {
                    if let Err(e) = store.resync(&head).await {
                        tracing::warn!("object store: cannot resync with the head ({e}); trying again after the next poll");
                    } else {
                        resync_due = false;
                    }
                }
            }
        });
    }

    async fn drop_worker(
        &self,
        actor: crate::cluster::ActorId,
        incarnation: crate::wire::Incarnation,
    ) {
        for shard in &self.shards {
            if let Ok(freed) = shard.send(DropWorker { actor, incarnation }).await {
                for object in freed {
                    tokio::spawn(self.clone().after_free(object));
                }
            }
        }
    }

    /// The deaths and job ends this store missed: the worker incarnations
    /// holding references here that the directory records dead or
    /// replaced by a newer incarnation, and the drivers of jobs that ended,
    /// release their references. A worker the directory does not know yet
    /// (its start is being recorded), and a driver of a job the head does
    /// not list, keep them. Every holder is checked; the last error, if
    /// any, is returned (the caller tries again).
    async fn resync(&self, head: &HeadEvents) -> Result<(), ObjectStoreError> {
        let mut holders = Holders::default();
        for shard in &self.shards {
            if let Ok(listed) = shard.send(ListHolders).await {
                holders.workers.extend(listed.workers);
                holders.jobs.extend(listed.jobs);
            }
        }
        holders.workers.sort();
        holders.workers.dedup();
        holders.jobs.sort();
        holders.jobs.dedup();
        let mut failed = Ok(());
        for (actor, incarnation) in holders.workers {
            let record = match head.locate(&self.endpoint, actor).await {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(e) => {
                    failed = Err(e);
                    continue;
                }
            };
            let gone = incarnation < record.incarnation
                || (incarnation == record.incarnation && record.dead.is_some());
            if gone {
                self.drop_worker(actor, incarnation).await;
            }
        }
        if !holders.jobs.is_empty() {
            let jobs = head.jobs(&self.endpoint).await?;
            for job in holders.jobs {
                let ended = jobs.iter().any(|j| j.id == job && j.state.is_terminal());
                if ended {
                    self.drop_driver(job).await;
                }
            }
        }
        failed
    }

    async fn drop_driver(&self, job: String) {
        for shard in &self.shards {
            let drop = DropDriver { job: job.clone() };
            if let Ok(freed) = shard.send(drop).await {
                for object in freed {
                    tokio::spawn(self.clone().after_free(object));
                }
            }
        }
    }

    /// Removes the spilled objects' and shared-memory objects' files (at
    /// node shutdown): the directories this node created, nothing else.
    pub fn remove_files(&self) {
        for dir in self.owned.iter() {
            if let Err(e) = dir.remove() {
                tracing::warn!("cannot remove {}: {e}", dir.path().display());
            }
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
    /// job's. A driver's puts are its job's (its holder names it).
    pub async fn handle(
        &self,
        request: ObjectRequest,
        confined: Option<&str>,
    ) -> Result<ControlReply, RemoteError> {
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
                .map(|()| ControlReply::Ack),
            ObjectRequest::PutObjects { holder, objects } => {
                self.put_small(holder, objects, confined).await;
                Ok(ControlReply::Ack)
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
                        return Ok(ControlReply::ObjectBytes(bytes));
                    }
                }
                let read = Read {
                    id,
                    offset,
                    len,
                    copy_at,
                    confined: confined.map(str::to_string),
                };
                flatten(self.shard(id).send(read).await).map(ControlReply::ObjectBytes)
            }
            ObjectRequest::StreamObject { id, size, copy_at } => match &self.bulk {
                Some(grants) => Ok(ControlReply::ObjectStream {
                    port: grants.port(),
                    ticket: grants.grant(Streamed { id, size, copy_at }),
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
                failed.map(|()| ControlReply::Ack).map_err(unavailable)
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
                self.update_refs(holder, updates).await;
                match (refused.first(), confined) {
                    (Some(update), Some(job)) => Err(forbidden(ShardError::OtherJob {
                        id: update.id,
                        job: job.to_string(),
                    })),
                    _ => Ok(ControlReply::Ack),
                }
            }
            ObjectRequest::FreeObject(id) => {
                let dropped = self.shard(id).send(DropCopy(id)).await;
                dropped.map(|()| ControlReply::Ack).map_err(unavailable)
            }
            ObjectRequest::ListObjects => Ok(ControlReply::Objects(self.list().await)),
            ObjectRequest::OpenObject(id) => {
                let open = Open {
                    id,
                    confined: confined.map(str::to_string),
                };
                let opened = flatten(self.shard(id).send(open).await);
                opened.map(|file| {
                    ControlReply::ObjectFile(file.map(|(path, size)| shared(path, size)))
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
                    flatten(self.shard(id).send(seal).await).map(|()| ControlReply::Ack)
                } else {
                    self.abort(id).await;
                    Ok(ControlReply::Ack)
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
    ) -> Result<ControlReply, RemoteError> {
        let Some(path) = self.budget.shared_path(id, total) else {
            return Ok(ControlReply::ObjectFile(None));
        };
        if !self.begin_owned(id, total, owned, None, confined).await? {
            // No room in /dev/shm: the process sends it in chunks instead.
            self.abort(id).await;
            return Ok(ControlReply::ObjectFile(None));
        }
        Ok(ControlReply::ObjectFile(Some(shared(path, total))))
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
                store.update_refs(holder, updates).await;
                return;
            }
            let request = ControlRequest::Objects(ObjectRequest::UpdateRefs { holder, updates });
            let sent = match store
                .endpoint
                .connect(owner.address, Some(&owner.node))
                .await
            {
                Ok(connection) => client::call(&connection, &request, RequestOptions::control())
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

    /// Refuses a worker confined to `confined` changing objects of another
    /// job: appending to one, sealing or abandoning it, recording its
    /// failure, taking a reference to it (step 7). Drivers, the CLI and
    /// nodes (`None`) change any, without asking the shards.
    async fn may_change(
        &self,
        ids: impl IntoIterator<Item = ObjectId>,
        confined: Option<&str>,
    ) -> Result<(), RemoteError> {
        let others = self.of_other_jobs(ids, confined).await?;
        match (others.first(), confined) {
            (Some(&id), Some(job)) => Err(forbidden(ShardError::OtherJob {
                id,
                job: job.to_string(),
            })),
            _ => Ok(()),
        }
    }

    /// Those of `ids` here that are not of the job a worker is confined to
    /// (`None`: a driver, the CLI or a node, confined to none).
    async fn of_other_jobs(
        &self,
        ids: impl IntoIterator<Item = ObjectId>,
        confined: Option<&str>,
    ) -> Result<Vec<ObjectId>, RemoteError> {
        let Some(job) = confined else {
            return Ok(Vec::new());
        };
        let job: Arc<str> = Arc::from(job);
        let mut others = Vec::new();
        for (shard, ids) in self.shards.iter().zip(self.by_shard(ids, |&id| id)) {
            if !ids.is_empty() {
                let job = job.clone();
                let found = shard.send(OfOtherJobs { ids, job }).await;
                others.extend(found.map_err(unavailable)?);
            }
        }
        Ok(others)
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
    async fn update_refs(&self, holder: RefHolder, updates: Vec<RefUpdate>) {
        let changes = updates.into_iter().map(|u| (u.id, u.change));
        let mut freed = Vec::new();
        for (shard, updates) in self.shards.iter().zip(self.by_shard(changes, |c| c.0)) {
            if updates.is_empty() {
                continue;
            }
            let update = UpdateRefs {
                holder: holder.clone(),
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
            let request = ControlRequest::Objects(ObjectRequest::FreeObject(freed.id));
            if let Ok(connection) = self.endpoint.connect(copy.address, Some(&copy.node)).await {
                let _ = client::call(&connection, &request, RequestOptions::control()).await;
            }
        }
        self.hold_contained(freed.id, &freed.contains, RefChange::Release)
            .await;
    }

    /// Waits up to `wait` for object `id` to be complete here.
    async fn await_object(&self, id: ObjectId, wait: Duration) -> ControlReply {
        let end = tokio::time::Instant::now() + wait;
        loop {
            let awaited = match self.shard(id).send(Await(id)).await {
                Ok(awaited) => awaited,
                Err(e) => return lost_or_failed(e.to_string()),
            };
            match awaited {
                Awaited::Ready { size, job } => return ready(size, job.as_deref()),
                Awaited::Failed { reason, job } => {
                    return ControlReply::ObjectFailed {
                        reason,
                        job: job.as_deref().map(str::to_string),
                    }
                }
                Awaited::Wait(change) => {
                    if tokio::time::timeout_at(end, change).await.is_err() {
                        return ControlReply::ObjectNotReady;
                    }
                }
            }
        }
    }

    /// Makes the object present here, fetching it from `owner` in chunks
    /// unless it is here or on its way.
    async fn pull(&self, id: ObjectId, owner: ObjectLocation, wait: Duration) -> ControlReply {
        if owner.node == self.me.node {
            return self.await_object(id, wait).await;
        }
        if let Ok(Awaited::Ready { size, job }) = self.shard(id).send(Await(id)).await {
            return ready(size, job.as_deref());
        }
        let lost = |e: String| {
            lost_or_failed(format!(
                "object {id} is lost: its owner, node {owner}, cannot be reached: {e}"
            ))
        };
        let connection = match self
            .endpoint
            .connect(owner.address, Some(&owner.node))
            .await
        {
            Ok(connection) => connection,
            Err(e) => return lost(e.to_string()),
        };
        let ask = ControlRequest::Objects(ObjectRequest::AwaitObject {
            id,
            wait_ms: wait.as_millis() as u64,
        });
        let options = RequestOptions::control().with_deadline(wait + Duration::from_secs(10));
        let (size, job) = match client::call(&connection, &ask, options).await {
            Ok(ControlReply::ObjectReady { size, job }) => (size, job),
            Ok(ControlReply::ObjectNotReady) => return ControlReply::ObjectNotReady,
            Ok(failed @ ControlReply::ObjectFailed { .. }) => return failed,
            Ok(other) => return lost(format!("unexpected reply {other:?}")),
            Err(e) => return lost(e.to_string()),
        };
        let begin = Begin {
            id,
            total: size,
            holder: None,
            contains: Vec::new(),
            job: job.as_deref().map(Arc::from),
            first: None,
        };
        let began = std::time::Instant::now();
        let shared = match self.begin(begin).await {
            Ok(Begun::Present) => return ready(size, job.as_deref()),
            Ok(Begun::InProgress(done)) => {
                return match done.await {
                    Ok(()) => ready(size, job.as_deref()),
                    Err(_) => {
                        lost_or_failed(format!("the transfer of object {id} from {owner} failed"))
                    }
                }
            }
            Ok(Begun::Fresh { shared }) => shared,
            Ok(Begun::NoRoom { short, .. }) => {
                return lost_or_failed(format!(
                    "no room for a copy of object {id}: {short} bytes short"
                ))
            }
            Err(e) => return lost_or_failed(e.message),
        };
        let streamed = match self.budget.shared_path(id, size).filter(|_| shared) {
            Some(file) => self.pull_stream(&connection, &owner, id, size, file).await,
            None => Err("it is kept in memory, not in a shared-memory file".to_string()),
        };
        let (path, received) = match streamed {
            Ok(inode) => {
                let seal = Seal {
                    id,
                    inode: Some(inode),
                };
                let sealed = flatten(self.shard(id).send(seal).await);
                ("tcp", sealed.map_err(|e| e.message))
            }
            Err(e) => {
                tracing::debug!(
                    "object {id}: no bulk stream from {owner} ({e}); it comes over QUIC"
                );
                ("quic", self.pull_chunks(&connection, id, size).await)
            }
        };
        if let Err(e) = received {
            self.abort(id).await;
            // The owner answered: the copy failed on its way or here (a
            // full tmpfs, say), which the error names.
            return lost_or_failed(format!(
                "the copy of object {id} from node {owner} failed: {e}"
            ));
        }
        tracing::debug!(
            "object {id}: {size} bytes from {owner} over {path} in {:?}",
            began.elapsed()
        );
        metrics::counter!("nimbus_object_transfers_total", "path" => path).increment(1);
        metrics::counter!("nimbus_object_transfer_bytes_total", "path" => path).increment(size);
        ready(size, job.as_deref())
    }

    /// Step 2 over QUIC: object `id`, `size` bytes, from `node` in chunks.
    async fn pull_chunks(&self, node: &Connection, id: ObjectId, size: u64) -> Result<(), String> {
        let mut offset = 0;
        let mut chunks = std::pin::pin!(read_chunks(node, id, size, Some(self.me.clone())));
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            let len = chunk.len() as u64;
            let append = Append { id, offset, chunk };
            offset += len;
            flatten(self.shard(id).send(append).await).map_err(|e| e.message)?;
        }
        Ok(())
    }

    /// Step 2's bulk stream: object `id` from `owner` (reached over
    /// `node`), written straight into its shared-memory `file` here, on a
    /// thread of its own; the inode written, for the seal. A failure leaves the object to be received over QUIC, from
    /// its start: nothing was counted yet. An owner whose bulk listener
    /// could not be dialled is not dialled again for
    /// [`BULK_RETRY_AFTER`].
    async fn pull_stream(
        &self,
        node: &Connection,
        owner: &ObjectLocation,
        id: ObjectId,
        size: u64,
        file: std::path::PathBuf,
    ) -> Result<u64, String> {
        if size > MAX_STREAM_BYTES {
            return Err(format!(
                "it is larger than one bulk stream carries ({MAX_STREAM_BYTES} bytes)"
            ));
        }
        let ip = owner.address.ip();
        if let Some(failed) = self.bulk_failed.get(&ip) {
            if failed.elapsed() < BULK_RETRY_AFTER {
                return Err(format!(
                    "its bulk listener could not be dialled {:?} ago",
                    failed.elapsed()
                ));
            }
        }
        // Opened before the round trip: the file this pull began, even if
        // it is abandoned meanwhile and another pull begins a new one at
        // the same path (whose seal then refuses this inode).
        let opened = std::fs::OpenOptions::new().write(true).open(&file);
        let file = opened.map_err(|e| format!("cannot open {}: {e}", file.display()))?;
        let inode = {
            use std::os::unix::fs::MetadataExt;
            file.metadata().map_err(|e| e.to_string())?.ino()
        };
        let ask = ControlRequest::Objects(ObjectRequest::StreamObject {
            id,
            size,
            copy_at: Some(self.me.clone()),
        });
        let (port, ticket) = match call(node, &ask, RequestOptions::control()).await {
            Ok(ControlReply::ObjectStream { port, ticket }) => (port, ticket),
            Ok(other) => return Err(format!("unexpected reply {other:?}")),
            Err(e) => return Err(e.to_string()),
        };
        let addr = std::net::SocketAddr::new(ip, port);
        let stream = match self.endpoint.bulk_connect(addr, ticket).await {
            Ok(stream) => stream,
            Err(e) => {
                self.bulk_failed.insert(ip, std::time::Instant::now());
                return Err(e.to_string());
            }
        };
        self.bulk_failed.remove(&ip);
        let received = stream.on_own_thread(move |stream| stream.read_into_file(&file, 0, size));
        match received.await.and_then(|received| received) {
            Ok(()) => Ok(inode),
            Err(e) => Err(e.to_string()),
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

/// Where a node's store reads the head's events and, to resync, its
/// directory and jobs.
pub enum HeadEvents {
    /// On the head: its actors.
    Local {
        /// The event stream.
        events: Addr<crate::head::ClusterEvents>,
        /// The actor directory.
        directory: Addr<crate::head::Directory>,
        /// The job keeper.
        jobs: Addr<crate::head::jobs::Jobs>,
    },
    /// Elsewhere: the head's address.
    Remote(std::net::SocketAddr),
}

impl HeadEvents {
    async fn since(
        &self,
        endpoint: &Endpoint,
        after: u64,
        wait: Duration,
    ) -> Result<Vec<crate::cluster::ClusterEvent>, ObjectStoreError> {
        match self {
            HeadEvents::Local { events, .. } => {
                let since = crate::head::events::EventsSince { after, wait };
                events
                    .send(since)
                    .await
                    .map_err(|_| ObjectStoreError::EventsStopped)
            }
            HeadEvents::Remote(head) => {
                let connection = endpoint
                    .connect(*head, None)
                    .await
                    .map_err(client::ClientError::from)?;
                Ok(client::events(&connection, after, wait).await?)
            }
        }
    }

    /// The directory's record of `actor`, live or dead.
    async fn locate(
        &self,
        endpoint: &Endpoint,
        actor: crate::cluster::ActorId,
    ) -> Result<Option<crate::cluster::ActorRecord>, ObjectStoreError> {
        match self {
            HeadEvents::Local { directory, .. } => directory
                .send(crate::head::directory::LocateActor(actor))
                .await
                .map_err(|_| ObjectStoreError::EventsStopped),
            HeadEvents::Remote(head) => {
                let request =
                    ControlRequest::Directory(crate::cluster::DirectoryRequest::LocateActor(actor));
                match self.ask(endpoint, *head, &request).await? {
                    ControlReply::Actor(record) => Ok(record.map(|r| *r)),
                    reply => Err(unexpected("LocateActor", reply)),
                }
            }
        }
    }

    /// Every job the head knows.
    async fn jobs(
        &self,
        endpoint: &Endpoint,
    ) -> Result<Vec<crate::cluster::JobRecord>, ObjectStoreError> {
        match self {
            HeadEvents::Local { jobs, .. } => jobs
                .send(crate::head::jobs::List)
                .await
                .map_err(|_| ObjectStoreError::EventsStopped),
            HeadEvents::Remote(head) => {
                let request = ControlRequest::Jobs(crate::cluster::JobRequest::ListJobs);
                match self.ask(endpoint, *head, &request).await? {
                    ControlReply::Jobs(jobs) => Ok(jobs),
                    reply => Err(unexpected("ListJobs", reply)),
                }
            }
        }
    }

    /// Asks the head at `head` (again while it is unreachable).
    async fn ask(
        &self,
        endpoint: &Endpoint,
        head: std::net::SocketAddr,
        request: &ControlRequest,
    ) -> Result<ControlReply, ObjectStoreError> {
        let ask = |connection| async move {
            client::call(&connection, request, RequestOptions::control()).await
        };
        Ok(client::ask_head(endpoint, head, true, ask).await?)
    }
}

fn unexpected(request: &'static str, reply: ControlReply) -> ObjectStoreError {
    ObjectStoreError::Cluster(client::ClientError::UnexpectedReply {
        request,
        reply: Box::new(reply),
    })
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
fn lost_or_failed(reason: String) -> ControlReply {
    ControlReply::ObjectFailed { reason, job: None }
}

/// The reply for a complete object of `size` bytes, of `job`.
fn ready(size: u64, job: Option<&str>) -> ControlReply {
    ControlReply::ObjectReady {
        size,
        job: job.map(str::to_string),
    }
}

/// Whether a worker confined to job `confined` (`None`: a driver, the
/// CLI, a node: anyone may) may read object `id` of `job` (step 7).
fn may_read(id: ObjectId, job: Option<&str>, confined: Option<&str>) -> Result<(), ShardError> {
    match confined {
        Some(confined) if job != Some(confined) => Err(ShardError::OtherJob {
            id,
            job: confined.to_string(),
        }),
        _ => Ok(()),
    }
}

/// `reply` to a worker confined to `confined`: a complete object of
/// another job is refused, and so is the reason another job's task
/// recorded for its failure (step 7).
fn readable(
    id: ObjectId,
    reply: ControlReply,
    confined: Option<&str>,
) -> Result<ControlReply, RemoteError> {
    match &reply {
        ControlReply::ObjectReady { job, .. }
        | ControlReply::ObjectFailed {
            job: job @ Some(_), ..
        } => may_read(id, job.as_deref(), confined).map_err(forbidden)?,
        _ => {}
    }
    Ok(reply)
}

/// Object `id`, held by `holder`, failed with `message`, recorded as the
/// job of whoever sent it (`job_of`).
fn fail(id: ObjectId, holder: RefHolder, message: String, confined: Option<&str>) -> Fail {
    let job = job_of(&holder, confined).map(Arc::from);
    Fail {
        id,
        holder,
        message,
        job,
    }
}

/// The job of an object begun or failed by `holder`: the job of the
/// worker that sent it (`confined`), else the job of the driver holding
/// it.
fn job_of<'a>(holder: &'a RefHolder, confined: Option<&'a str>) -> Option<&'a str> {
    match (confined, holder) {
        (Some(job), _) => Some(job),
        (None, RefHolder::Process { job, .. }) => job.as_deref(),
        (None, RefHolder::Object(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker learns why its own job's object failed, and why any object
    /// was lost, but not the reason another job's task recorded.
    #[test]
    fn a_failure_is_told_to_its_own_job() {
        let failed = |job: Option<&str>| ControlReply::ObjectFailed {
            reason: "the task's secret".into(),
            job: job.map(str::to_string),
        };
        let id = ObjectId(7);
        assert!(readable(id, failed(Some("j")), Some("j")).is_ok());
        assert!(readable(id, failed(None), Some("j")).is_ok());
        assert!(readable(id, failed(Some("k")), None).is_ok());
        let refused = readable(id, failed(Some("k")), Some("j")).unwrap_err();
        assert_eq!(refused.kind, RemoteErrorKind::Forbidden);
        assert!(!refused.message.contains("secret"), "{refused:?}");
    }
}
