//! The half of the object store that runs in the calling process (a driver
//! or a worker): [`ObjectRef`], `put`/`get`/`wait`, writing an object into
//! its node's shared memory in place and mapping it back, and the
//! references this process holds (`refs.rs`) and the shared-memory files
//! it keeps mapped to write into (`kept_maps.rs`).
//!
//! An `ObjectRef<T>` carries the id, the size (unknown for a pending task
//! result) and the owner node. A process's *home* node is its own node for
//! a worker, the head for a driver.
//!
//! 1. **Put**: serialize (capturing the references inside), then store at
//!    the home node, which owns the object: an object of `SHARED_MIN`
//!    (1 MiB) or more, on the home node's host (same kernel boot id and
//!    `/dev/shm`), is
//!    written in place into its shared-memory file (`CreateObject`, write
//!    through a mapping this process keeps for the file's next use,
//!    `kept_maps.rs`, then `SealObject`); a small one (at most 64 KiB) without references is
//!    kept here and queued for the home node, in order with this
//!    process's reference changes, and the put returns at once
//!    (`refs.rs`); anything else goes in `CHUNK_BYTES` (8 MiB) chunks
//!    (`PutObjectChunk`).
//! 2. **Get**: a copy this process keeps answers at once (objects of at
//!    most 64 KiB are kept by the processes that put, read or produced
//!    them while they hold a reference: `ObjectBytes::Local`). Otherwise
//!    the home node makes the object present: `AwaitObject` if it is the
//!    owner, else `PullObject` from the owner (long polls, up to
//!    [`DEFAULT_GET_TIMEOUT`], 600 s, for a task's result still being
//!    produced). Then a large object on this host is mapped
//!    (`OpenObject`; `ObjectBytes::Mapped`, no copy: files are immutable
//!    once sealed, and a file handed out for mapping is only ever
//!    unlinked, never reused, which leaves mappings intact); anything
//!    else is read from the home node in chunks, four in flight, into a
//!    buffer allocated once.
//! 3. **Errors**: a get of an object whose owner is gone fails with
//!    `Unavailable` ("lost: its owner, node N, cannot be reached"); of a
//!    failed task's result, with the task's name and error; of a freed
//!    object, with "freed".
//! 4. **Wait**: `wait(refs, n, timeout)` long-polls each object's owner
//!    (`AwaitObject`) until `n` are ready or failed.

mod kept_maps;
pub(crate) mod refs;

use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::{de::DeserializeOwned, Deserialize, Deserializer, Serialize, Serializer};
use tokio::time::Instant;

use crate::client::ClientError;
use crate::cluster::ObjectRequest;
use crate::cluster::{ContainedRef, ObjectId, ObjectLocation, ObjectReply, RefHolder};
use crate::runtime::ProcessContext;
use crate::transport::{Connection, RequestOptions};

use super::error::ObjectStoreError;
use super::transfer::{call, host_id, read_chunks, CHUNK_BYTES, MAX_OBJECT_WAIT};
use super::SHARED_MIN;

/// How long [`get`] waits for an object still being produced (a task's
/// result); [`get_timeout`] takes another limit.
pub const DEFAULT_GET_TIMEOUT: Duration = Duration::from_secs(600);

/// Marks references to raw bytes ([`put_bytes`]/[`get_bytes`]).
#[derive(Debug)]
pub enum RawBytes {}

/// A reference to an object of type `T`: small, serializable, valid
/// anywhere in the cluster. While any `ObjectRef` to an object exists in
/// any process (or inside another live object), the object is kept.
pub struct ObjectRef<T> {
    id: ObjectId,
    /// `None` until known: a task's result still being computed.
    size: Option<u64>,
    owner: ObjectLocation,
    tracked: Option<Arc<refs::Tracked>>,
    value: PhantomData<fn() -> T>,
}

/// The wire form of a reference.
#[derive(Serialize, Deserialize)]
struct RefWire {
    id: ObjectId,
    size: Option<u64>,
    owner: ObjectLocation,
}

impl<T> Serialize for ObjectRef<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        refs::serialized(self.id, &self.owner, self.tracked.as_ref());
        RefWire {
            id: self.id,
            size: self.size,
            owner: self.owner.clone(),
        }
        .serialize(serializer)
    }
}

impl<'de, T> Deserialize<'de> for ObjectRef<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = RefWire::deserialize(deserializer)?;
        let tracked = refs::deserialized(wire.id, &wire.owner);
        Ok(ObjectRef {
            id: wire.id,
            size: wire.size,
            owner: wire.owner,
            tracked,
            value: PhantomData,
        })
    }
}

impl<T> Clone for ObjectRef<T> {
    fn clone(&self) -> Self {
        self.retyped()
    }
}

impl<T> std::fmt::Debug for ObjectRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.size {
            Some(size) => write!(f, "ObjectRef({}, {size} bytes on {})", self.id, self.owner),
            None => write!(f, "ObjectRef({}, pending on {})", self.id, self.owner),
        }
    }
}

impl<T> ObjectRef<T> {
    /// A reference to an object that will appear at `owner` with this
    /// process as its holder (a task's result).
    pub(crate) fn expected(id: ObjectId, owner: ObjectLocation) -> Self {
        let tracked = refs::track(id, &owner, None);
        ObjectRef {
            id,
            size: None,
            owner,
            tracked,
            value: PhantomData,
        }
    }

    /// This process's stake in the object.
    pub(crate) fn tracked(&self) -> Option<&Arc<refs::Tracked>> {
        self.tracked.as_ref()
    }

    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// Its size in bytes (serialized), if known (a task's result is not,
    /// until read).
    pub fn size(&self) -> Option<u64> {
        self.size
    }

    /// The node that owns it.
    pub fn owner(&self) -> &ObjectLocation {
        &self.owner
    }

    /// The untyped form, for [`wait`] over references of several types.
    pub fn erase(&self) -> ObjectRef<()> {
        self.retyped()
    }

    /// Another reference to the same object, typed `U`.
    fn retyped<U>(&self) -> ObjectRef<U> {
        ObjectRef {
            id: self.id,
            size: self.size,
            owner: self.owner.clone(),
            tracked: self.tracked.clone(),
            value: PhantomData,
        }
    }
}

/// An object's bytes: mapped from the node's shared memory (no copy) or
/// received into this process.
pub enum ObjectBytes {
    /// Mapped from a shared-memory file of the node's host.
    Mapped(memmap2::Mmap),
    /// Copied into this process.
    Owned(Vec<u8>),
    /// This process's copy of a small object (kept while it holds a
    /// reference).
    Local(Arc<[u8]>),
}

impl std::ops::Deref for ObjectBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ObjectBytes::Mapped(map) => map,
            ObjectBytes::Owned(bytes) => bytes,
            ObjectBytes::Local(bytes) => bytes,
        }
    }
}

impl ObjectBytes {
    /// The bytes in a `Vec` of their own (a copy if mapped).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            ObjectBytes::Mapped(map) => map.to_vec(),
            ObjectBytes::Owned(bytes) => bytes,
            ObjectBytes::Local(bytes) => bytes.to_vec(),
        }
    }
}

impl std::fmt::Debug for ObjectBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self {
            ObjectBytes::Mapped(_) => "mapped",
            ObjectBytes::Owned(_) => "owned",
            ObjectBytes::Local(_) => "local copy",
        };
        write!(f, "ObjectBytes({} bytes, {how})", self.len())
    }
}

/// Puts `value` (MessagePack) into this process's home node's store.
/// `ObjectRef`s inside `value` stay alive as long as the new object.
pub async fn put<T: Serialize>(value: &T) -> Result<ObjectRef<T>, ObjectStoreError> {
    let (bytes, captured) = encode(value)?;
    let context = ProcessContext::current().ok_or(ObjectStoreError::NotInitialized)?;
    let home = home(context).await?;
    let holder = refs::holder().ok_or(ObjectStoreError::NotInitialized)?;
    let id = ObjectId::random();
    if captured.refs.is_empty() && bytes.len() <= refs::LOCAL_COPY_MAX {
        return put_small(id, bytes, home, holder).await;
    }
    store(&home.0, id, &bytes, holder, captured.refs.clone()).await?;
    drop(captured);
    Ok(stored_ref(id, &bytes, home.1))
}

/// A small object without references (step 1): kept here, queued for the
/// home node, returned at once; stored here and now when references are
/// not tracked.
async fn put_small<T>(
    id: ObjectId,
    bytes: Vec<u8>,
    (node, owner): (Connection, ObjectLocation),
    holder: RefHolder,
) -> Result<ObjectRef<T>, ObjectStoreError> {
    let object = stored_ref(id, &bytes, owner.clone());
    metrics::counter!("nimbus_objects_put_bytes_total").increment(bytes.len() as u64);
    let unqueued = match object.tracked {
        Some(_) => refs::queue_store(&owner, id, bytes).await.err(),
        None => Some(bytes),
    };
    if let Some(bytes) = unqueued {
        store_chunks(&node, id, &bytes, holder, Vec::new()).await?;
    }
    Ok(object)
}

/// Puts raw bytes (a tensor, a file) into this process's home node's store.
pub async fn put_bytes(bytes: &[u8]) -> Result<ObjectRef<RawBytes>, ObjectStoreError> {
    let context = ProcessContext::current().ok_or(ObjectStoreError::NotInitialized)?;
    let home = home(context).await?;
    let holder = refs::holder().ok_or(ObjectStoreError::NotInitialized)?;
    let id = ObjectId::random();
    if bytes.len() <= refs::LOCAL_COPY_MAX {
        return put_small(id, bytes.to_vec(), home, holder).await;
    }
    store(&home.0, id, bytes, holder, Vec::new()).await?;
    Ok(stored_ref(id, bytes, home.1))
}

/// Puts `len` raw bytes that `fill` writes: in place into the home node's
/// shared memory when the object is large ([`SHARED_MIN`]) and the node on
/// this host, so the bytes are never copied before (an encoder writing its
/// output straight into the object); anywhere else `fill` writes into a
/// buffer that is then sent. `fill` is given exactly `len` bytes, and may
/// be called again if a write in place fails.
pub async fn put_bytes_with(
    len: usize,
    fill: impl Fn(&mut [u8]) + Sync,
) -> Result<ObjectRef<RawBytes>, ObjectStoreError> {
    if (len as u64) < SHARED_MIN {
        let mut bytes = vec![0; len];
        fill(&mut bytes);
        return put_bytes(&bytes).await;
    }
    let context = ProcessContext::current().ok_or(ObjectStoreError::NotInitialized)?;
    let (node, owner) = home(context).await?;
    let holder = refs::holder().ok_or(ObjectStoreError::NotInitialized)?;
    let id = ObjectId::random();
    metrics::counter!("nimbus_objects_put_bytes_total").increment(len as u64);
    if !store_shared(&node, id, len, &fill, holder.clone(), Vec::new()).await? {
        let mut bytes = vec![0; len];
        fill(&mut bytes);
        store_chunks(&node, id, &bytes, holder, Vec::new()).await?;
    }
    Ok(ObjectRef {
        id,
        size: Some(len as u64),
        owner: owner.clone(),
        tracked: refs::track(id, &owner, None),
        value: PhantomData,
    })
}

/// Reads an object put with [`put`] (or a task's result), waiting up to
/// [`DEFAULT_GET_TIMEOUT`] for it to be produced.
pub async fn get<T: DeserializeOwned>(object: &ObjectRef<T>) -> Result<T, ObjectStoreError> {
    get_timeout(object, DEFAULT_GET_TIMEOUT).await
}

/// [`get`], waiting at most `timeout`.
pub async fn get_timeout<T: DeserializeOwned>(
    object: &ObjectRef<T>,
    timeout: Duration,
) -> Result<T, ObjectStoreError> {
    let bytes = fetch(object, timeout).await?;
    decode(&bytes)
}

/// Reads an object put with [`put_bytes`]: mapped, without a copy, when
/// this process runs on the host of its home node and the object is large
/// ([`SHARED_MIN`]).
pub async fn get_bytes(object: &ObjectRef<RawBytes>) -> Result<ObjectBytes, ObjectStoreError> {
    fetch(object, DEFAULT_GET_TIMEOUT).await
}

/// Waits until `num_ready` of `objects` are ready (complete at their
/// owner, or failed: a get of those returns at once) or `timeout` passes;
/// returns the ready ones and the others, each in the given order.
///
/// ```no_run
/// # async fn demo(refs: Vec<nimbus::object_store::ObjectRef<u64>>) -> Result<(), nimbus::object_store::ObjectStoreError> {
/// use std::time::Duration;
/// let (ready, pending) = nimbus::object_store::wait(&refs, 1, Duration::from_secs(5)).await?;
/// # Ok(()) }
/// ```
pub async fn wait<T>(
    objects: &[ObjectRef<T>],
    num_ready: usize,
    timeout: Duration,
) -> Result<(Vec<ObjectRef<T>>, Vec<ObjectRef<T>>), ObjectStoreError> {
    let context = ProcessContext::current().ok_or(ObjectStoreError::NotInitialized)?;
    let end = Instant::now() + timeout;
    let mut waits: futures::stream::FuturesUnordered<_> = objects
        .iter()
        .enumerate()
        .map(|(index, object)| async move { (index, ready(context, object, end).await) })
        .collect();
    let mut done = vec![false; objects.len()];
    let mut count = 0;
    while count < num_ready.min(objects.len()) {
        match tokio::time::timeout_at(end, waits.next()).await {
            Ok(Some((index, outcome))) => {
                if outcome? {
                    done[index] = true;
                    count += 1;
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    let (ready, pending): (Vec<_>, Vec<_>) = objects.iter().zip(done).partition(|(_, d)| *d);
    Ok((
        ready.into_iter().map(|(o, _)| o.clone()).collect(),
        pending.into_iter().map(|(o, _)| o.clone()).collect(),
    ))
}

/// Whether `object` becomes ready (or fails) before `end`.
async fn ready<T>(
    context: &ProcessContext,
    object: &ObjectRef<T>,
    end: Instant,
) -> Result<bool, ObjectStoreError> {
    let owner = context
        .endpoint
        .connect(object.owner.address, Some(&object.owner.node))
        .await
        .map_err(ClientError::from)?;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let ask = ObjectRequest::AwaitObject {
            id: object.id,
            wait_ms: left.min(MAX_OBJECT_WAIT).as_millis() as u64,
        };
        match call(&owner, ask, long_poll(left)).await? {
            ObjectReply::Ready { .. } | ObjectReply::Failed { .. } => return Ok(true),
            _ if left.is_zero() => return Ok(false),
            _ => {}
        }
    }
}

/// Request options for a long poll of up to `wait`.
fn long_poll(wait: Duration) -> RequestOptions {
    RequestOptions::control().with_deadline(wait.min(MAX_OBJECT_WAIT) + Duration::from_secs(10))
}

/// Request options for a pull: a long poll, then a whole transfer.
fn pull_options(wait: Duration) -> RequestOptions {
    RequestOptions::bulk().with_deadline(wait.min(MAX_OBJECT_WAIT) + Duration::from_secs(120))
}

fn encode<T: Serialize>(value: &T) -> Result<(Vec<u8>, refs::Captured), ObjectStoreError> {
    let (bytes, captured) = refs::capturing(|| rmp_serde::to_vec_named(value));
    let bytes = bytes.map_err(|e| ObjectStoreError::Codec {
        what: "encoding",
        detail: e.to_string(),
    })?;
    Ok((bytes, captured))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ObjectStoreError> {
    refs::reading_object(|| rmp_serde::from_slice(bytes)).map_err(|e| ObjectStoreError::Codec {
        what: "decoding",
        detail: e.to_string(),
    })
}

fn stored_ref<T>(id: ObjectId, bytes: &[u8], owner: ObjectLocation) -> ObjectRef<T> {
    // The put registered this process as a holder with the object itself.
    let tracked = refs::track(id, &owner, None);
    if let Some(tracked) = &tracked {
        tracked.keep_copy(bytes);
    }
    ObjectRef {
        id,
        size: Some(bytes.len() as u64),
        owner,
        tracked,
        value: PhantomData,
    }
}

/// A connection to this process's home node, and the node.
async fn home(context: &ProcessContext) -> Result<(Connection, ObjectLocation), ObjectStoreError> {
    let connection = context
        .endpoint
        .connect(context.home, None)
        .await
        .map_err(ClientError::from)?;
    let location = ObjectLocation {
        node: connection.peer().clone(),
        address: context.home,
    };
    Ok((connection, location))
}

/// Stores `bytes` as object `id` on `node`, held by `holder`: written in
/// place in shared memory when `node` is on this host and the object is
/// large, else in chunks.
pub(crate) async fn store(
    node: &Connection,
    id: ObjectId,
    bytes: &[u8],
    holder: RefHolder,
    contains: Vec<ContainedRef>,
) -> Result<(), ObjectStoreError> {
    metrics::counter!("nimbus_objects_put_bytes_total").increment(bytes.len() as u64);
    if !contains.is_empty() {
        // The small objects it refers to reach their owners first.
        refs::flush().await;
    }
    let copy = |map: &mut [u8]| map.copy_from_slice(bytes);
    if bytes.len() as u64 >= SHARED_MIN
        && store_shared(
            node,
            id,
            bytes.len(),
            &copy,
            holder.clone(),
            contains.clone(),
        )
        .await?
    {
        return Ok(());
    }
    store_chunks(node, id, bytes, holder, contains).await
}

/// How long a large put waits for the reference changes queued before it
/// to reach their owners (a round trip, unless an owner is slow or gone).
const RELEASES_FIRST_FOR: Duration = Duration::from_millis(5);

/// Writes object `id`, `len` bytes written by `fill`, in place into
/// `node`'s shared memory; false if the node is on another host or keeps
/// no shared memory (nothing is left reserved then).
async fn store_shared(
    node: &Connection,
    id: ObjectId,
    len: usize,
    fill: &(dyn Fn(&mut [u8]) + Sync),
    holder: RefHolder,
    contains: Vec<ContainedRef>,
) -> Result<bool, ObjectStoreError> {
    // The releases queued here go first, for a while, so that the files of
    // objects freed just before are the node's spares for this one (a put
    // in a loop whose result is dropped then writes one file over and over).
    let _ = tokio::time::timeout(RELEASES_FIRST_FOR, refs::flush()).await;
    kept_maps::sweep_now();
    let create = ObjectRequest::CreateObject {
        id,
        total: len as u64,
        holder,
        contains,
    };
    let file = match call(node, create, RequestOptions::bulk()).await? {
        ObjectReply::File(Some(file)) => file,
        ObjectReply::File(None) => return Ok(false),
        other => {
            return Err(ObjectStoreError::Store(format!(
                "object {id}: unexpected reply {other:?}"
            )))
        }
    };
    // The write blocks this thread for about a memory copy's time.
    let written = file.host == host_id() && write_shared(&file.path, len, fill);
    let seal = ObjectRequest::SealObject { id, written };
    call(node, seal, RequestOptions::bulk()).await?;
    Ok(written)
}

/// Writes the `len` bytes of `fill` into the shared-memory file at `path`:
/// through a kept mapping (`kept_maps.rs`), or by `pwrite` where it cannot
/// be mapped.
fn write_shared(path: &std::path::Path, len: usize, fill: &(dyn Fn(&mut [u8]) + Sync)) -> bool {
    let mapped = kept_maps::write_with(path, len, fill);
    if let Err(e) = &mapped {
        tracing::debug!("cannot write {} through a mapping: {e}", path.display());
    }
    mapped.is_ok() || {
        let mut bytes = vec![0; len];
        fill(&mut bytes);
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|out| out.write_all_at(&bytes, 0))
            .is_ok()
    }
}

/// Maps object `id` from `node`'s shared memory, if `node` is on this host
/// and keeps it there.
async fn open_shared(node: &Connection, id: ObjectId, size: u64) -> Option<memmap2::Mmap> {
    let file = match call(
        node,
        ObjectRequest::OpenObject(id),
        RequestOptions::control(),
    )
    .await
    {
        Ok(ObjectReply::File(Some(file))) if file.host == host_id() => file,
        _ => return None,
    };
    let opened = std::fs::File::open(&file.path).ok()?;
    // SAFETY: object files are immutable once sealed: the node only ever
    // unlinks a file it handed out for mapping (spilling, freeing), never
    // reuses it, which leaves a mapping intact.
    let map = unsafe { memmap2::Mmap::map(&opened) }.ok()?;
    (map.len() as u64 == size).then_some(map)
}

/// Stores `bytes` as object `id` on `node` in chunks.
async fn store_chunks(
    node: &Connection,
    id: ObjectId,
    bytes: &[u8],
    holder: RefHolder,
    contains: Vec<ContainedRef>,
) -> Result<(), ObjectStoreError> {
    let total = bytes.len() as u64;
    let mut offset = 0;
    // An empty object still needs its first (empty) chunk to exist.
    let chunks: Vec<&[u8]> = if bytes.is_empty() {
        vec![&[]]
    } else {
        bytes.chunks(CHUNK_BYTES).collect()
    };
    for chunk in chunks {
        let request = ObjectRequest::PutObjectChunk {
            id,
            offset,
            total,
            holder: holder.clone(),
            contains: if offset == 0 {
                contains.clone()
            } else {
                Vec::new()
            },
            chunk: chunk.to_vec(),
        };
        call(node, request, RequestOptions::bulk()).await?;
        offset += chunk.len() as u64;
    }
    Ok(())
}

/// The bytes of `object`, through this process's home node.
pub(crate) async fn fetch<T>(
    object: &ObjectRef<T>,
    timeout: Duration,
) -> Result<ObjectBytes, ObjectStoreError> {
    let context = ProcessContext::current().ok_or(ObjectStoreError::NotInitialized)?;
    let id = object.id;
    if let Some(tracked) = &object.tracked {
        if !tracked.settled(Instant::now() + timeout).await {
            return Err(ObjectStoreError::Timeout { id, after: timeout });
        }
        if let Some(copy) = tracked.copy() {
            return Ok(ObjectBytes::Local(copy));
        }
    }
    let (home, here) = home(context).await?;
    let size = match object.size {
        Some(size) if here == object.owner => size,
        _ => {
            let end = Instant::now() + timeout;
            loop {
                let left = end.saturating_duration_since(Instant::now());
                let wait_ms = left.min(MAX_OBJECT_WAIT).as_millis() as u64;
                let request = if here == object.owner {
                    ObjectRequest::AwaitObject { id, wait_ms }
                } else {
                    ObjectRequest::PullObject {
                        id,
                        owner: object.owner.clone(),
                        wait_ms,
                    }
                };
                match call(&home, request, pull_options(left)).await? {
                    ObjectReply::Ready { size, .. } => break size,
                    ObjectReply::Failed { reason, .. } => {
                        return Err(ObjectStoreError::Unavailable { id, reason })
                    }
                    _ if left.is_zero() => {
                        return Err(ObjectStoreError::Timeout { id, after: timeout })
                    }
                    _ => {}
                }
            }
        }
    };
    if size >= SHARED_MIN {
        if let Some(map) = open_shared(&home, id, size).await {
            return Ok(ObjectBytes::Mapped(map));
        }
    }
    let mut bytes = Vec::with_capacity(size as usize);
    let mut chunks = std::pin::pin!(read_chunks(&home, id, size, None));
    while let Some(chunk) = chunks.next().await {
        bytes.extend_from_slice(&chunk?);
    }
    let copy = object.tracked.as_ref().and_then(|t| t.keep_copy(&bytes));
    Ok(copy.map_or(ObjectBytes::Owned(bytes), ObjectBytes::Local))
}
