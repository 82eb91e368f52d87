//! `ObjectStoreShard`: a share of one node's objects.
//!
//! Objects arrive in chunks (from a put, a task's result or a pull) and are
//! readable once complete. Every shard of a node draws on one memory
//! budget; under pressure the node asks its shards to spill their least
//! recently used complete objects (primaries to disk, cached copies simply
//! dropped: they can be pulled again). A shard also counts the references
//! to the objects its node owns and frees an object when none remains:
//! the decisions are `refcount.rs`'s, the shard drops the bytes.
//!
//! Objects of [`SHARED_MIN`] bytes or more live in files on the node's
//! tmpfs (`/dev/shm`): still memory, but processes on the same host can map
//! them instead of copying them over the network (`OpenObject`), and write
//! new ones in place (`CreateObject`, then `SealObject`).
//!
//! Freed shared-memory files are kept for reuse as spares (`budget.rs`).
//!
//! Spilling and restoring: a spilled primary is a file in the spill
//! directory, out of the memory budget. A read from offset 0 restores it
//! (into its shared-memory file for a large object, else into memory)
//! when it fits the budget; otherwise chunks are served from disk. A read
//! of an object that is not here says whether it was freed (a tombstone
//! of `refcount.rs`) or is unknown.
//!
//! Each shard runs on a thread of its own (an arbiter), so a spill's disk
//! writes stall only its shard.
//!
//! The rooms: `budget.rs` counts the node's bytes and keeps its spare
//! files, `files.rs` makes and removes the shared-memory files,
//! `stored.rs` is one object's state, `arrive.rs` receives objects (and
//! abandons those that stop arriving), `read.rs` serves them; this file
//! holds the shard, its references, spilling and listing.

mod arrive;
mod budget;
mod files;
mod read;
mod stored;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::refcount::{Collected, RefCounts};
use super::small_reads::SmallReads;
use crate::cluster::{
    ContainedRef, ObjectId, ObjectLocation, ObjectState, ObjectSummary, RefChange, RefHolder,
};
use crate::host::files::{private_dir, write_private};
use crate::object_store::error::ShardError;

pub(super) use arrive::{Abort, Append, Begin, Begun, Fail, Seal};
pub use budget::{Budget, SHARED_MIN};
pub(super) use read::{Await, Awaited, Open, OpenStream, Read};

use arrive::{ARRIVAL_CHECK_MAX, ARRIVAL_CHECK_MIN};
use files::remove_shared;
use stored::{Data, Stored};

/// An object freed because no reference remained: who else must hear.
#[derive(Debug)]
pub struct Freed {
    /// The object.
    pub id: ObjectId,
    /// Nodes caching a copy: drop it.
    pub copies: Vec<ObjectLocation>,
    /// References it contained: release them on its behalf.
    pub contains: Vec<ContainedRef>,
}

/// A share of a node's objects.
pub struct ObjectStoreShard {
    objects: HashMap<ObjectId, Stored>,
    budget: Arc<Budget>,
    /// Its small complete objects' bytes, for the node's reads.
    small: Arc<SmallReads>,
    refs: RefCounts,
    /// Waiting for objects not here yet.
    arrivals: HashMap<ObjectId, Vec<oneshot::Sender<()>>>,
    clock: u64,
    /// A shared-memory file could not be made once already (warned).
    warned_shared: bool,
}

impl ObjectStoreShard {
    /// A shard drawing on `budget`, sharing its small objects with
    /// `small`.
    pub(super) fn new(budget: Arc<Budget>, small: Arc<SmallReads>) -> Self {
        ObjectStoreShard {
            objects: HashMap::new(),
            budget,
            small,
            refs: RefCounts::default(),
            arrivals: HashMap::new(),
            clock: 0,
            warned_shared: false,
        }
    }

    /// Takes object `id` out of the shard, withdrawing it from the small
    /// reads first (`small_reads.rs`, step 2).
    fn take(&mut self, id: ObjectId) -> Option<Stored> {
        self.small.withdraw(id);
        self.objects.remove(&id)
    }

    /// Keeps `stored` as object `id`, in place of any object of that id,
    /// which is withdrawn from the small reads first.
    fn put(&mut self, id: ObjectId, stored: Stored) {
        self.small.withdraw(id);
        self.objects.insert(id, stored);
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn notify(&mut self, id: ObjectId) {
        if let Some(stored) = self.objects.get_mut(&id) {
            for waiter in stored.waiting.drain(..) {
                let _ = waiter.send(());
            }
        }
        for waiter in self.arrivals.remove(&id).unwrap_or_default() {
            let _ = waiter.send(());
        }
    }

    /// Drops primary `id`, which no reference holds any more.
    fn free(&mut self, id: ObjectId) -> Option<Freed> {
        let stored = self.take(id)?;
        self.forget(id, &stored);
        self.notify(id);
        Some(Freed {
            id,
            copies: stored.copies,
            contains: stored.contains,
        })
    }

    /// Returns what `stored` held of memory and disk; its shared-memory
    /// file may be kept as a spare.
    fn forget(&self, id: ObjectId, stored: &Stored) {
        if let Data::Shared(path) = &stored.data {
            let job = stored.job.as_deref();
            if !stored.held_open() && self.budget.keep_spare(path, stored.total, job) {
                return;
            }
        }
        self.release(id, stored);
    }

    /// Returns what `stored` held of memory and disk, removing its files.
    fn release(&self, id: ObjectId, stored: &Stored) {
        self.budget.give_back(stored.in_memory());
        if matches!(stored.data, Data::Shared(_) | Data::ArrivingShared { .. }) {
            if let Some(path) = self
                .budget
                .shared_path(id, stored.total, stored.job.as_deref())
            {
                let unread = matches!(stored.data, Data::Shared(_)) && !stored.held_open();
                if let Err(e) = remove_shared(&path, unread) {
                    tracing::warn!(object = %id, "cannot remove {}: {e}", path.display());
                }
            }
        }
        if matches!(stored.data, Data::Spilled) {
            self.budget
                .spilled
                .fetch_sub(stored.total, Ordering::Relaxed);
            if let Err(e) = std::fs::remove_file(self.budget.spill_path(id)) {
                tracing::warn!(object = %id, "cannot remove a spilled object: {e}");
            }
        }
    }

    /// Moves object `id` to disk (a primary) or drops it (a copy).
    fn spill_one(&mut self, id: ObjectId) -> Result<u64, ShardError> {
        let Some(stored) = self.objects.get_mut(&id) else {
            return Ok(0);
        };
        if !matches!(stored.data, Data::Memory(_) | Data::Shared(_)) {
            return Ok(0);
        }
        let size = stored.total;
        if !stored.primary {
            // Memory is short: its file goes, not to the spares.
            if let Some(stored) = self.take(id) {
                self.release(id, &stored);
            }
            return Ok(size);
        }
        let path = self.budget.spill_path(id);
        let written = private_dir(self.budget.spill_dir()).and_then(|()| match &stored.data {
            Data::Memory(bytes) => write_private(&path, bytes),
            Data::Shared(shared) => std::fs::copy(shared, &path)
                .and_then(|_| remove_shared(shared, !stored.held_open())),
            _ => Ok(()),
        });
        if let Err(source) = written {
            let _ = std::fs::remove_file(&path);
            return Err(ShardError::Io {
                action: "spill",
                id,
                path,
                source,
            });
        }
        self.small.withdraw(id);
        stored.data = Data::Spilled;
        self.budget.give_back(size);
        self.budget.spilled.fetch_add(size, Ordering::Relaxed);
        metrics::counter!("nimbus_object_spills_total").increment(1);
        Ok(size)
    }
}

impl Actor for ObjectStoreShard {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let every = (self.budget.arrival_timeout / 4).clamp(ARRIVAL_CHECK_MIN, ARRIVAL_CHECK_MAX);
        ctx.run_interval(every, |shard, _| shard.expire_arrivals(Instant::now()));
    }
}

/// Which of these objects here a worker confined to `job` may not change
/// (another job's, step 7)?
#[derive(Message)]
#[rtype(result = "Vec<ObjectId>")]
pub struct OfOtherJobs {
    /// The objects.
    pub ids: Vec<ObjectId>,
    /// The worker's job.
    pub job: Arc<str>,
}

impl Handler<OfOtherJobs> for ObjectStoreShard {
    type Result = MessageResult<OfOtherJobs>;

    fn handle(&mut self, msg: OfOtherJobs, _: &mut Self::Context) -> Self::Result {
        let of_another = |id: &ObjectId| match self.objects.get(id) {
            Some(stored) => stored.job.as_deref() != Some(&*msg.job),
            None => self
                .refs
                .placeholder_job(*id)
                .is_some_and(|job| job != &*msg.job),
        };
        MessageResult(msg.ids.into_iter().filter(of_another).collect())
    }
}

/// Reference changes by one holder.
#[derive(Message)]
#[rtype(result = "Vec<Freed>")]
pub struct UpdateRefs {
    /// Who.
    pub holder: RefHolder,
    /// Its job, which a placeholder its hold makes takes (`refcount.rs`).
    pub job: Option<Arc<str>>,
    /// The changes, in order.
    pub updates: Vec<(ObjectId, RefChange)>,
}

/// A worker process died: release every reference it held.
#[derive(Message)]
#[rtype(result = "Vec<Freed>")]
pub struct DropWorker {
    /// Its actor.
    pub actor: crate::cluster::ActorId,
    /// The incarnation that died.
    pub incarnation: crate::wire::Incarnation,
}

impl Handler<DropWorker> for ObjectStoreShard {
    type Result = MessageResult<DropWorker>;

    fn handle(&mut self, msg: DropWorker, _: &mut Self::Context) -> Self::Result {
        let dead = |holder: &RefHolder| {
            matches!(holder, RefHolder::Process { worker: Some((actor, incarnation)), .. }
                if *actor == msg.actor && *incarnation == msg.incarnation)
        };
        let freed = self.refs.drop_holders(dead);
        MessageResult(freed.into_iter().filter_map(|id| self.free(id)).collect())
    }
}

/// The processes that hold references in this shard: worker incarnations
/// and the jobs of driver processes (for a resync after missed events).
#[derive(Message)]
#[rtype(result = "Holders")]
pub struct ListHolders;

/// What [`ListHolders`] answers.
#[derive(Debug, Default)]
pub struct Holders {
    /// Worker processes: actor and incarnation.
    pub workers: Vec<(crate::cluster::ActorId, crate::wire::Incarnation)>,
    /// Driver processes: their jobs.
    pub jobs: Vec<String>,
}

impl Handler<ListHolders> for ObjectStoreShard {
    type Result = MessageResult<ListHolders>;

    fn handle(&mut self, _: ListHolders, _: &mut Self::Context) -> Self::Result {
        let mut holders = Holders::default();
        for holder in self.refs.processes() {
            match holder {
                RefHolder::Process {
                    worker: Some(worker),
                    ..
                } => holders.workers.push(*worker),
                RefHolder::Process {
                    worker: None,
                    job: Some(job),
                    ..
                } => holders.jobs.push(job.clone()),
                _ => {}
            }
        }
        MessageResult(holders)
    }
}

/// A job ended: release every reference its driver processes held
/// (its workers' go as they die, `DropWorker`).
#[derive(Message)]
#[rtype(result = "Vec<Freed>")]
pub struct DropDriver {
    /// The job.
    pub job: String,
}

impl Handler<DropDriver> for ObjectStoreShard {
    type Result = MessageResult<DropDriver>;

    fn handle(&mut self, msg: DropDriver, _: &mut Self::Context) -> Self::Result {
        let driver = |holder: &RefHolder| matches!(holder, RefHolder::Process { worker: None, job: Some(job), .. } if *job == msg.job);
        let freed = self.refs.drop_holders(driver);
        MessageResult(freed.into_iter().filter_map(|id| self.free(id)).collect())
    }
}

/// Drop a cached copy (its owner freed the object).
#[derive(Message)]
#[rtype(result = "()")]
pub struct DropCopy(pub ObjectId);

/// Spill least recently used complete objects until `need` bytes of
/// memory are free (or nothing is left to spill). Returns bytes spilled.
#[derive(Message)]
#[rtype(result = "Result<u64, ShardError>")]
pub struct Spill {
    /// Bytes wanted free.
    pub need: u64,
}

/// Every object of this shard.
#[derive(Message)]
#[rtype(result = "Vec<ObjectSummary>")]
pub struct List;

impl Handler<UpdateRefs> for ObjectStoreShard {
    type Result = MessageResult<UpdateRefs>;

    fn handle(&mut self, msg: UpdateRefs, _: &mut Self::Context) -> Self::Result {
        let mut freed = Vec::new();
        for (id, change) in msg.updates {
            if matches!(change, RefChange::Hold { .. }) {
                self.refs.claim(id, msg.job.as_ref());
            }
            match self.refs.change(id, &msg.holder, change) {
                Collected::Freed => freed.extend(self.free(id)),
                Collected::Late if matches!(change, RefChange::Hold { .. }) => {
                    tracing::warn!(object = %id, holder = %msg.holder, "a reference to a freed object was taken");
                }
                Collected::Late | Collected::Kept | Collected::Placeholder => {}
            }
        }
        MessageResult(freed)
    }
}

impl Handler<DropCopy> for ObjectStoreShard {
    type Result = ();

    fn handle(&mut self, DropCopy(id): DropCopy, _: &mut Self::Context) {
        if self
            .objects
            .get(&id)
            .is_some_and(|s| !s.primary && s.complete())
        {
            if let Some(stored) = self.take(id) {
                self.forget(id, &stored);
            }
        }
    }
}

impl Handler<Spill> for ObjectStoreShard {
    type Result = Result<u64, ShardError>;

    fn handle(&mut self, msg: Spill, _: &mut Self::Context) -> Self::Result {
        // Reads answered without the shard count as uses now
        // (`small_reads.rs`, step 4).
        let tick = self.tick();
        for (id, stored) in &mut self.objects {
            if matches!(stored.data, Data::Memory(_)) && self.small.was_read(*id) {
                stored.last_used = tick;
            }
        }
        let mut candidates: Vec<(u64, bool, ObjectId)> = self
            .objects
            .iter()
            .filter(|(_, s)| matches!(s.data, Data::Memory(_) | Data::Shared(_)))
            .map(|(id, s)| (s.last_used, s.primary, *id))
            .collect();
        // Cached copies go first (they cost no disk), then by age.
        candidates.sort_by_key(|(used, primary, _)| (*primary, *used));
        let mut spilled = 0;
        for (_, _, id) in candidates {
            if self.budget.free() >= msg.need {
                break;
            }
            spilled += self.spill_one(id)?;
        }
        Ok(spilled)
    }
}

impl Handler<List> for ObjectStoreShard {
    type Result = MessageResult<List>;

    fn handle(&mut self, _: List, _: &mut Self::Context) -> Self::Result {
        let summary = |id: ObjectId, size, state, primary| {
            let (holders, in_transit) = match self.refs.holders(id) {
                Some((holders, transit)) => {
                    (holders.iter().map(ToString::to_string).collect(), transit)
                }
                None => (Vec::new(), 0),
            };
            ObjectSummary {
                id,
                size,
                state,
                primary,
                holders,
                in_transit,
            }
        };
        let present = self
            .objects
            .iter()
            .map(|(id, s)| summary(*id, s.total, s.state(), s.primary));
        let expected = self
            .refs
            .placeholders()
            .map(|id| summary(id, 0, ObjectState::Expected, true));
        MessageResult(present.chain(expected).collect())
    }
}
