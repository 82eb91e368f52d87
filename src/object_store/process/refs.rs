//! The references this process holds, and how their owners learn of them.
//!
//! Ray's ownership model, per process: the node that owns an object (it
//! keeps the primary copy) counts *holders*, one entry per process however
//! many `ObjectRef`s it has, plus the objects that contain the reference,
//! plus references *in transit* inside messages. An object is freed when it
//! has no holder and nothing is in transit.
//!
//! - The first `ObjectRef` to an object in this process announces a holder
//!   (`Hold`); dropping the last one sends `Release`. (A put or a task
//!   submission registers its holder with the object itself.)
//! - Serializing a reference into a message sends `Transit`, and the
//!   message leaves only once the owner has answered it
//!   (`crate::runtime::transits`): a sender that dies right after its
//!   message cannot make the owner free the object. Deserializing it in
//!   the receiver sends `Hold { arrived: true }`, which consumes one
//!   transit. A count that dips below zero only delays the free, so a
//!   reference passed on and dropped at once is never lost.
//! - Serializing a reference into an object (a put, a task's result) does
//!   not count as transit: the store holds the contained references on the
//!   containing object's behalf until that object is freed, from its
//!   first chunk on; the serializing process keeps its own stakes until
//!   the object is stored, so no release can overtake that hold.
//!
//! - A small put (at most `LOCAL_COPY_MAX` bytes, no references inside)
//!   returns at once: the process keeps its copy and queues the object,
//!   and it reaches its owner in that same order, ahead of every change
//!   queued after it (`PutObjects`). A message carrying its reference
//!   waits for it as for a transit (the barrier), as does a put of an
//!   object that contains references ([`flushed`]).
//!
//! Changes go to their owners in order, from one background task, batched
//! (`UpdateRefs`, at most `BATCH`, 4096, changes or objects a request; an
//! owner's objects before its changes). A worker's
//! holds name its actor and incarnation, so its node's store drops them
//! when the head reports that incarnation dead. A hold or transit is not
//! given up on while the head lists its owner alive (up to `OWNER_WAIT`,
//! 60 s, then logged as an error); a release is, after three tries
//! (logged). Leaks rather than losses: a reference serialized into a
//! message that never arrives (the receiver died first) stays in transit,
//! and a driver killed outright never releases its holds (its objects stay
//! until their owner stops).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use dashmap::DashMap;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use crate::client;
use crate::cluster::ObjectRequest;
use crate::cluster::{
    ContainedRef, ObjectId, ObjectLocation, RefChange, RefHolder, RefUpdate, SmallObject,
};
use crate::runtime::ProcessContext;
use crate::transport::RequestOptions;
use crate::wire::RemoteErrorKind;

/// Changes sent to owners in one request at most.
const BATCH: usize = 4096;

/// Bytes of small objects sent in one request at most (a request's frame
/// must stay under the transport's cap, 16 MiB by default).
const STORE_BATCH_BYTES: usize = 256 << 10;

/// Bytes of small objects queued and not yet delivered at most: a put
/// waits for room (a loop of puts runs at the pace its node takes them,
/// in bounded memory). Each object counts at least `STORE_OVERHEAD`.
const QUEUED_STORE_BYTES: usize = 1 << 20;

/// What an object costs in the queue beyond its bytes, roughly.
const STORE_OVERHEAD: usize = 256;

/// What an object of `len` bytes counts against `QUEUED_STORE_BYTES`.
fn store_charge(len: usize) -> u32 {
    len.max(STORE_OVERHEAD) as u32
}

/// `objects`, in order, in runs of at most `max` bytes (a larger object
/// alone).
fn split_by_bytes(objects: Vec<SmallObject>, max: usize) -> Vec<Vec<SmallObject>> {
    let mut runs: Vec<Vec<SmallObject>> = Vec::new();
    let mut bytes = 0;
    for object in objects {
        let len = object.bytes.len();
        match runs.last_mut() {
            Some(run) if bytes + len <= max => run.push(object),
            _ => {
                bytes = 0;
                runs.push(vec![object]);
            }
        }
        bytes += len;
    }
    runs
}

/// Objects up to this size are kept in the memory of the processes that
/// put, read or produced them, as long as they hold a reference: gets
/// there are local (Ray's in-process store of small objects).
pub(crate) const LOCAL_COPY_MAX: usize = 64 << 10;

/// One process's stake in one object, shared by all its `ObjectRef`s.
pub(crate) struct Tracked {
    id: ObjectId,
    owner: ObjectLocation,
    /// This process's copy of a small object.
    copy: OnceLock<Arc<[u8]>>,
    /// A task this process submitted is producing the object.
    producing: AtomicBool,
    settled: Notify,
}

impl Tracked {
    /// This process's copy of the object, if it keeps one.
    pub(crate) fn copy(&self) -> Option<Arc<[u8]>> {
        self.copy.get().cloned()
    }

    /// Keeps `bytes` as this process's copy, if the object is small.
    pub(crate) fn keep_copy(&self, bytes: &[u8]) -> Option<Arc<[u8]>> {
        (bytes.len() <= LOCAL_COPY_MAX).then(|| self.copy.get_or_init(|| bytes.into()).clone())
    }

    /// A task of this process is producing the object.
    pub(crate) fn producing(&self) {
        self.producing.store(true, Ordering::SeqCst);
    }

    /// The task producing the object has settled (its result stored or
    /// kept here, or its failure recorded).
    pub(crate) fn settle(&self) {
        self.producing.store(false, Ordering::SeqCst);
        self.settled.notify_waiters();
    }

    /// Waits until no task of this process is producing the object, or
    /// `end`; false on the deadline.
    pub(crate) async fn settled(&self, end: tokio::time::Instant) -> bool {
        loop {
            let notified = self.settled.notified();
            if !self.producing.load(Ordering::SeqCst) {
                return true;
            }
            if tokio::time::timeout_at(end, notified).await.is_err() {
                return false;
            }
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let Some(process) = PROCESS.get() else { return };
        // Released under the table's lock, so a `Hold` from a new reference
        // racing with this drop is queued after the `Release`, or this
        // entry is still live and nothing is released.
        process.table.remove_if(&self.id, |_, tracked| {
            let gone = tracked.strong_count() == 0;
            if gone {
                process.send(&self.owner, self.id, RefChange::Release);
            }
            gone
        });
    }
}

struct Process {
    holder: RefHolder,
    table: DashMap<ObjectId, Weak<Tracked>>,
    queue: mpsc::UnboundedSender<Queued>,
    /// Room for small objects in the queue (`QUEUED_STORE_BYTES`).
    store_room: Arc<Semaphore>,
}

/// What the delivery task is asked.
enum Queued {
    /// Send this change to that owner.
    Change(ObjectLocation, RefUpdate),
    /// Store this small object, put by this process, at that owner.
    Store(ObjectLocation, SmallObject),
    /// Say when every change queued before is delivered (or given up on:
    /// its owner is gone), the barrier of `crate::runtime::transits`.
    Barrier(oneshot::Sender<()>),
}

impl Process {
    fn send(&self, owner: &ObjectLocation, id: ObjectId, change: RefChange) {
        // The queue only closes when the runtime is gone, at exit.
        let _ = self
            .queue
            .send(Queued::Change(owner.clone(), RefUpdate { id, change }));
    }
}

static PROCESS: OnceLock<Process> = OnceLock::new();

/// Starts reference tracking for this process (once; inside its runtime).
/// Before it, references are not tracked and never freed.
pub(crate) fn start(context: &'static ProcessContext) {
    let role = crate::runtime::ProcessRole::current().label();
    // A worker's references die with it: its actor and incarnation are
    // its identity's name and incarnation (`worker-<actor id>`).
    let identity = &context.endpoint.identity().identity;
    let worker = identity
        .name
        .strip_prefix(crate::wire::WORKER_NAME_PREFIX)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .map(|actor| (crate::cluster::ActorId(actor), identity.incarnation));
    // A driver's references die with its job.
    let job = worker.is_none().then(|| context.job.clone());
    let holder = RefHolder::Process {
        id: rand::random(),
        label: format!("{role} pid {}", std::process::id()),
        worker,
        job,
    };
    let (queue, updates) = mpsc::unbounded_channel();
    let store_room = Arc::new(Semaphore::new(QUEUED_STORE_BYTES));
    let process = Process {
        holder: holder.clone(),
        table: DashMap::new(),
        queue,
        store_room: store_room.clone(),
    };
    if PROCESS.set(process).is_ok() {
        tokio::spawn(deliver(context, holder, updates, store_room));
        crate::runtime::transits::install(Box::new(|| {
            let (done, delivered) = oneshot::channel();
            if let Some(process) = PROCESS.get() {
                let _ = process.queue.send(Queued::Barrier(done));
            }
            async move {
                let _ = delivered.await;
            }
            .boxed()
        }));
    }
}

/// Queues small object `id` (whole, with no references inside) for its
/// owner, after every change queued so far and before any queued later.
/// Waits while the queue holds `QUEUED_STORE_BYTES` of objects. The
/// bytes back when references are not tracked here (before [`start`], or
/// at exit): the caller stores the object itself.
pub(crate) async fn queue_store(
    owner: &ObjectLocation,
    id: ObjectId,
    bytes: Vec<u8>,
) -> Result<(), Vec<u8>> {
    let Some(process) = PROCESS.get() else {
        return Err(bytes);
    };
    match process
        .store_room
        .acquire_many(store_charge(bytes.len()))
        .await
    {
        // Given back by the delivery task once the object is sent.
        Ok(permit) => permit.forget(),
        Err(_) => return Err(bytes),
    }
    let store = Queued::Store(owner.clone(), SmallObject { id, bytes });
    process.queue.send(store).map_err(|unsent| match unsent.0 {
        Queued::Store(_, object) => object.bytes,
        _ => Vec::new(),
    })
}

/// Waits until the small objects this process put, and its reference
/// changes, queued so far, reached their owners (or were given up on:
/// their owner is gone). Messages carrying references wait for this on
/// their own; call it before looking at a node's store from outside
/// (`nimbus memory`, [`crate::client::ClusterClient::objects`]).
pub async fn flush() {
    let Some(process) = PROCESS.get() else {
        return;
    };
    let (done, delivered) = oneshot::channel();
    if process.queue.send(Queued::Barrier(done)).is_ok() {
        let _ = delivered.await;
    }
}

/// The objects this process holds references to (and keeps small copies
/// of), in its own tables: 0 once it dropped them all.
pub fn held_here() -> usize {
    PROCESS.get().map_or(0, |p| p.table.len())
}

/// This process as a reference holder (`None` before [`start`]).
pub(crate) fn holder() -> Option<RefHolder> {
    PROCESS.get().map(|p| p.holder.clone())
}

/// This process's stake in object `id`, announcing `announce` to the owner
/// (a new stake always announces a `Hold` unless `announce` is `None`: the
/// holder was registered with the object itself).
pub(crate) fn track(
    id: ObjectId,
    owner: &ObjectLocation,
    announce: Option<RefChange>,
) -> Option<Arc<Tracked>> {
    let process = PROCESS.get()?;
    let mut entry = process.table.entry(id).or_default();
    if let Some(live) = entry.upgrade() {
        if let Some(change @ RefChange::Hold { arrived: true }) = announce {
            process.send(owner, id, change);
        }
        return Some(live);
    }
    if let Some(change) = announce {
        process.send(owner, id, change);
    }
    let tracked = Arc::new(Tracked {
        id,
        owner: owner.clone(),
        copy: OnceLock::new(),
        producing: AtomicBool::new(false),
        settled: Notify::new(),
    });
    *entry = Arc::downgrade(&tracked);
    Some(tracked)
}

/// The references serialized into an object, and this process's stakes
/// in them, kept until the object is stored (and holds them itself).
#[derive(Default)]
pub(crate) struct Captured {
    /// The references.
    pub(crate) refs: Vec<ContainedRef>,
    stakes: Vec<Arc<Tracked>>,
}

/// How references are being (de)serialized on this thread.
enum Mode {
    /// Into or out of a message.
    Message,
    /// Into an object: collect them.
    Capture(Captured),
    /// Out of an object.
    ReadingObject,
}

thread_local! {
    static MODE: RefCell<Mode> = const { RefCell::new(Mode::Message) };
}

/// Runs `f` (which serializes an object's value) and returns the references
/// it serialized.
pub(crate) fn capturing<R>(f: impl FnOnce() -> R) -> (R, Captured) {
    MODE.with(|mode| *mode.borrow_mut() = Mode::Capture(Captured::default()));
    let result = f();
    let captured = MODE.with(|mode| std::mem::replace(&mut *mode.borrow_mut(), Mode::Message));
    match captured {
        Mode::Capture(captured) => (result, captured),
        _ => (result, Captured::default()),
    }
}

/// Runs `f` (which deserializes an object's value): the references in it
/// are held, not arrivals from a message.
pub(crate) fn reading_object<R>(f: impl FnOnce() -> R) -> R {
    MODE.with(|mode| *mode.borrow_mut() = Mode::ReadingObject);
    let result = f();
    MODE.with(|mode| *mode.borrow_mut() = Mode::Message);
    result
}

/// A reference to `id` (this process's stake in it: `stake`) is being
/// serialized.
pub(crate) fn serialized(id: ObjectId, owner: &ObjectLocation, stake: Option<&Arc<Tracked>>) {
    let captured = MODE.with(|mode| match &mut *mode.borrow_mut() {
        Mode::Capture(captured) => {
            captured.refs.push(ContainedRef {
                id,
                owner: owner.clone(),
            });
            captured.stakes.extend(stake.cloned());
            true
        }
        _ => false,
    });
    if !captured {
        if let Some(process) = PROCESS.get() {
            process.send(owner, id, RefChange::Transit);
            crate::runtime::transits::serialized();
        }
    }
}

/// A reference to `id` was deserialized here.
pub(crate) fn deserialized(id: ObjectId, owner: &ObjectLocation) -> Option<Arc<Tracked>> {
    let arrived = MODE.with(|mode| !matches!(*mode.borrow(), Mode::ReadingObject));
    track(id, owner, Some(RefChange::Hold { arrived }))
}

/// Sends queued changes to their owners, in order, batching what queued up
/// meanwhile.
async fn deliver(
    context: &'static ProcessContext,
    holder: RefHolder,
    mut updates: mpsc::UnboundedReceiver<Queued>,
    store_room: Arc<Semaphore>,
) {
    while let Some(first) = updates.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match updates.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let mut by_owner: Vec<(ObjectLocation, Vec<SmallObject>, Vec<RefUpdate>)> = Vec::new();
        let mut barriers = Vec::new();
        for queued in batch {
            let (owner, object, update) = match queued {
                Queued::Change(owner, update) => (owner, None, Some(update)),
                Queued::Store(owner, object) => (owner, Some(object), None),
                Queued::Barrier(done) => {
                    barriers.push(done);
                    continue;
                }
            };
            let at = match by_owner.iter().position(|(o, _, _)| *o == owner) {
                Some(at) => at,
                None => {
                    by_owner.push((owner, Vec::new(), Vec::new()));
                    by_owner.len() - 1
                }
            };
            by_owner[at].1.extend(object);
            by_owner[at].2.extend(update);
        }
        // An object is queued before any change to it: an owner's objects
        // go first.
        for (owner, objects, updates) in by_owner {
            for objects in split_by_bytes(objects, STORE_BATCH_BYTES) {
                let charge: u32 = objects.iter().map(|o| store_charge(o.bytes.len())).sum();
                let request = ObjectRequest::PutObjects {
                    holder: holder.clone(),
                    objects,
                };
                send(context, &owner, request, true).await;
                store_room.add_permits(charge as usize);
            }
            if !updates.is_empty() {
                let keeps_alive = updates
                    .iter()
                    .any(|u| !matches!(u.change, RefChange::Release));
                let request = ObjectRequest::UpdateRefs {
                    holder: holder.clone(),
                    updates,
                };
                send(context, &owner, request, keeps_alive).await;
            }
        }
        // Everything queued before each barrier was in this batch.
        for done in barriers {
            let _ = done.send(());
        }
    }
}

/// Sends one owner its objects or changes, retrying a few times: an owner
/// that stays unreachable has died with its objects. Objects and changes
/// that keep an object alive (a hold, a transit) — `keeps_alive` — are
/// not given up on while the head still lists the owner alive, for up to
/// [`OWNER_WAIT`]: dropping one could free an object early. Releases are
/// given up on after the retries (the objects then stay until their owner
/// stops: a delayed free).
async fn send(
    context: &ProcessContext,
    owner: &ObjectLocation,
    request: ObjectRequest,
    keeps_alive: bool,
) {
    let give_up = tokio::time::Instant::now() + OWNER_WAIT;
    let mut attempt = 0u32;
    let last = loop {
        let last = match try_send(context, owner, &request).await {
            Ok(()) => return,
            Err(Unsent::Refused(why)) => {
                // The owner applied what it allowed; asking again changes
                // nothing (a worker's hold on another job's object).
                tracing::warn!(%owner, "reference changes refused in part: {why}");
                return;
            }
            Err(Unsent::Failed(last)) => last,
        };
        attempt += 1;
        if attempt < 3 {
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            continue;
        }
        if !keeps_alive || tokio::time::Instant::now() >= give_up {
            break last;
        }
        match owner_alive(context, owner).await {
            Some(true) | None => tokio::time::sleep(Duration::from_secs(1)).await,
            Some(false) => {
                tracing::debug!(%owner, "reference changes dropped: the owner is gone, and its objects with it ({last})");
                return;
            }
        }
    };
    match keeps_alive {
        true => {
            tracing::error!(%owner, "reference holds or small objects not delivered within {OWNER_WAIT:?} while the owner is still listed alive ({last}): it may free those objects while this process still refers to them")
        }
        false => {
            tracing::warn!(%owner, "reference releases not delivered ({last}): the objects stay until their owner stops")
        }
    }
}

/// Longest a hold or transit is retried for an owner the head lists alive.
const OWNER_WAIT: Duration = Duration::from_secs(60);

/// Why an attempt at a request did not go through.
enum Unsent {
    /// The owner could not be asked, or could not answer: try again.
    Failed(String),
    /// The owner refused (`Forbidden`): final.
    Refused(String),
}

/// One attempt at `request` to `owner`.
async fn try_send(
    context: &ProcessContext,
    owner: &ObjectLocation,
    request: &ObjectRequest,
) -> Result<(), Unsent> {
    let connection = context
        .endpoint
        .connect(owner.address, Some(&owner.node))
        .await
        .map_err(|e| Unsent::Failed(e.to_string()))?;
    match client::call(&connection, request.clone(), RequestOptions::control()).await {
        Ok(_) => Ok(()),
        Err(client::ClientError::Request(e))
            if e.remote()
                .is_some_and(|r| r.kind == RemoteErrorKind::Forbidden) =>
        {
            Err(Unsent::Refused(e.to_string()))
        }
        Err(e) => Err(Unsent::Failed(e.to_string())),
    }
}

/// Whether the head lists `owner`'s incarnation as alive (`None`: the head
/// did not say).
async fn owner_alive(context: &ProcessContext, owner: &ObjectLocation) -> Option<bool> {
    let status = crate::cluster::MembershipRequest::Status;
    match context.call_head(status).await {
        Ok(crate::cluster::MembershipReply::Status(status)) => Some(status.alive().any(|node| {
            node.id == owner.node.name && node.incarnation == owner.node.incarnation.0
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{split_by_bytes, SmallObject};
    use crate::cluster::ObjectId;

    #[test]
    fn small_objects_go_in_order_in_runs_under_the_byte_cap() {
        let object = |len| SmallObject {
            id: ObjectId::random(),
            bytes: vec![0; len],
        };
        let objects: Vec<SmallObject> = [3, 4, 2, 9, 0, 1].into_iter().map(object).collect();
        let ids: Vec<ObjectId> = objects.iter().map(|o| o.id).collect();
        let runs = split_by_bytes(objects, 8);
        let lens: Vec<Vec<usize>> = runs
            .iter()
            .map(|run| run.iter().map(|o| o.bytes.len()).collect())
            .collect();
        // A run takes what fits; a larger object goes alone.
        assert_eq!(lens, vec![vec![3, 4], vec![2], vec![9], vec![0, 1]]);
        let order: Vec<ObjectId> = runs.into_iter().flatten().map(|o| o.id).collect();
        assert_eq!(order, ids);
    }
}
