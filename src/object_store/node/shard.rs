//! `ObjectStoreShard`: a share of one node's objects.
//!
//! Objects arrive in chunks (from a put, a task's result or a pull) and are
//! readable once complete. Every shard of a node draws on one memory
//! budget; under pressure the node asks its shards to spill their least
//! recently used complete objects (primaries to disk, cached copies simply
//! dropped: they can be pulled again). A shard also counts the references
//! to the objects its node owns and frees an object when none remains
//! (see `refs.rs` for the protocol).
//!
//! Objects of [`SHARED_MIN`] bytes or more live in files on the node's
//! tmpfs (`/dev/shm`): still memory, but processes on the same host can map
//! them instead of copying them over the network (`OpenObject`), and write
//! new ones in place (`CreateObject`, then `SealObject`).
//!
//! Each shard runs on a thread of its own (an arbiter), so a spill's disk
//! writes stall only its shard.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::cluster::{
    ContainedRef, ObjectId, ObjectLocation, ObjectState, ObjectSummary, RefChange, RefHolder,
};

/// Freed ids remembered, so late readers learn the object was freed.
const TOMBSTONES: usize = 1 << 16;

/// Objects this large or larger live in shared-memory files.
pub const SHARED_MIN: u64 = 1 << 20;

/// Bytes a node's store may hold in memory, shared by its shards, and
/// where it spills.
#[derive(Debug)]
pub struct Budget {
    capacity: u64,
    used: AtomicU64,
    spilled: AtomicU64,
    spill_dir: PathBuf,
    shared_dir: Option<PathBuf>,
}

impl Budget {
    /// A budget of `capacity` bytes in memory, spilling into `spill_dir`
    /// (created on the first spill), keeping large objects as files in
    /// `shared_dir` (a tmpfs directory; `None`: all in process memory).
    pub fn new(capacity: u64, spill_dir: PathBuf, shared_dir: Option<PathBuf>) -> Arc<Self> {
        Arc::new(Budget {
            capacity,
            used: AtomicU64::new(0),
            spilled: AtomicU64::new(0),
            spill_dir,
            shared_dir,
        })
    }

    /// Where shared-memory objects live, if anywhere.
    pub fn shared_dir(&self) -> Option<&std::path::Path> {
        self.shared_dir.as_deref()
    }

    /// The shared-memory file of a large object, if objects that large
    /// are kept in shared memory.
    fn shared_path(&self, id: ObjectId, size: u64) -> Option<PathBuf> {
        let dir = self.shared_dir.as_ref().filter(|_| size >= SHARED_MIN)?;
        Some(dir.join(id.to_string()))
    }

    /// Bytes in memory.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes allowed in memory.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes spilled to disk.
    pub fn spilled(&self) -> u64 {
        self.spilled.load(Ordering::Relaxed)
    }

    /// Where spilled objects go.
    pub fn spill_dir(&self) -> &std::path::Path {
        &self.spill_dir
    }

    /// Bytes free in memory.
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.used())
    }

    fn take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + bytes <= self.capacity).then_some(used + bytes)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn spill_path(&self, id: ObjectId) -> PathBuf {
        self.spill_dir.join(id.to_string())
    }
}

/// Where an object's bytes are.
enum Data {
    /// Referenced before it arrived.
    Expected,
    /// Receiving; the bytes so far.
    Arriving(Vec<u8>),
    /// Receiving into its shared-memory file: by chunks (`received` so
    /// far), or written in place by a process of this host.
    ArrivingShared { file: std::fs::File, received: u64 },
    /// Complete, in memory.
    Memory(Vec<u8>),
    /// Complete, in its shared-memory file.
    Shared(PathBuf),
    /// Complete, in `Budget::spill_path`.
    Spilled,
    /// The task producing it failed with this message.
    Failed(String),
}

/// One object.
struct Stored {
    total: u64,
    data: Data,
    /// Owned here (false: a cached copy of another node's object).
    primary: bool,
    holders: BTreeSet<RefHolder>,
    transit: i64,
    contains: Vec<ContainedRef>,
    /// Nodes caching a copy of this primary.
    copies: Vec<ObjectLocation>,
    /// Who waits for it to complete (or fail).
    waiting: Vec<oneshot::Sender<()>>,
    last_used: u64,
}

impl Stored {
    fn new(total: u64, data: Data, primary: bool) -> Self {
        Stored {
            total,
            data,
            primary,
            holders: BTreeSet::new(),
            transit: 0,
            contains: Vec::new(),
            copies: Vec::new(),
            waiting: Vec::new(),
            last_used: 0,
        }
    }

    fn complete(&self) -> bool {
        matches!(self.data, Data::Memory(_) | Data::Shared(_) | Data::Spilled)
    }

    fn in_memory(&self) -> u64 {
        match self.data {
            Data::Arriving(_) | Data::ArrivingShared { .. } | Data::Memory(_) | Data::Shared(_) => {
                self.total
            }
            _ => 0,
        }
    }

    fn unreferenced(&self) -> bool {
        self.holders.is_empty() && self.transit == 0
    }

    fn state(&self) -> ObjectState {
        match self.data {
            Data::Expected => ObjectState::Expected,
            Data::Arriving(_) | Data::ArrivingShared { .. } => ObjectState::Arriving,
            Data::Memory(_) => ObjectState::InMemory,
            Data::Shared(_) => ObjectState::SharedMemory,
            Data::Spilled => ObjectState::Spilled,
            Data::Failed(_) => ObjectState::Failed,
        }
    }
}

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
    /// Waiting for objects not here yet.
    arrivals: HashMap<ObjectId, Vec<oneshot::Sender<()>>>,
    freed: HashSet<ObjectId>,
    freed_order: VecDeque<ObjectId>,
    clock: u64,
}

impl ObjectStoreShard {
    /// A shard drawing on `budget`.
    pub fn new(budget: Arc<Budget>) -> Self {
        ObjectStoreShard {
            objects: HashMap::new(),
            budget,
            arrivals: HashMap::new(),
            freed: HashSet::new(),
            freed_order: VecDeque::new(),
            clock: 0,
        }
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

    /// Frees `id` if it is an unreferenced primary.
    fn collect(&mut self, id: ObjectId) -> Option<Freed> {
        let stored = self.objects.get(&id)?;
        if !stored.primary || !stored.unreferenced() {
            return None;
        }
        if matches!(stored.data, Data::Expected) {
            // A placeholder from a reference that came and went before the
            // object: the object may still arrive with its holder.
            self.objects.remove(&id);
            return None;
        }
        let stored = self.objects.remove(&id)?;
        self.forget(id, &stored);
        self.freed.insert(id);
        self.freed_order.push_back(id);
        if self.freed_order.len() > TOMBSTONES {
            if let Some(old) = self.freed_order.pop_front() {
                self.freed.remove(&old);
            }
        }
        self.notify(id);
        Some(Freed {
            id,
            copies: stored.copies,
            contains: stored.contains,
        })
    }

    /// Returns what `stored` held of memory and disk.
    fn forget(&self, id: ObjectId, stored: &Stored) {
        self.budget.give_back(stored.in_memory());
        if matches!(stored.data, Data::Shared(_) | Data::ArrivingShared { .. }) {
            if let Some(path) = self.budget.shared_path(id, stored.total) {
                if let Err(e) = std::fs::remove_file(&path) {
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
    fn spill_one(&mut self, id: ObjectId) -> Result<u64, String> {
        let Some(stored) = self.objects.get_mut(&id) else {
            return Ok(0);
        };
        if !matches!(stored.data, Data::Memory(_) | Data::Shared(_)) {
            return Ok(0);
        }
        let size = stored.total;
        if !stored.primary {
            if let Some(stored) = self.objects.remove(&id) {
                self.forget(id, &stored);
            }
            return Ok(size);
        }
        let path = self.budget.spill_path(id);
        let written =
            std::fs::create_dir_all(&self.budget.spill_dir).and_then(|()| match &stored.data {
                Data::Memory(bytes) => std::fs::write(&path, bytes),
                Data::Shared(shared) => {
                    std::fs::copy(shared, &path).and_then(|_| std::fs::remove_file(shared))
                }
                _ => Ok(()),
            });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&path);
            return Err(format!(
                "cannot spill object {id} ({size} bytes) to {}: {e}",
                path.display()
            ));
        }
        stored.data = Data::Spilled;
        self.budget.give_back(size);
        self.budget.spilled.fetch_add(size, Ordering::Relaxed);
        Ok(size)
    }
}

impl Actor for ObjectStoreShard {
    type Context = Context<Self>;
}

/// How a [`Begin`] went.
#[derive(Debug)]
pub enum Begun {
    /// The object is new here: send its chunks.
    Fresh,
    /// It is here already, complete.
    Present,
    /// Another transfer is filling it: wait for this.
    InProgress(oneshot::Receiver<()>),
    /// Memory is short by this many bytes: spill, then begin again.
    NoRoom(u64),
}

/// Start receiving an object of `total` bytes.
#[derive(Message)]
#[rtype(result = "Result<Begun, String>")]
pub struct Begin {
    /// The object.
    pub id: ObjectId,
    /// Its size.
    pub total: u64,
    /// `Some(first holder)` for an object owned here (a put, a task's
    /// result); `None` for a cached copy of another node's.
    pub holder: Option<RefHolder>,
    /// References it contains.
    pub contains: Vec<ContainedRef>,
}

/// The next chunk of an object being received.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct Append {
    /// The object.
    pub id: ObjectId,
    /// Where the chunk starts (must follow the bytes received).
    pub offset: u64,
    /// The bytes.
    pub chunk: Vec<u8>,
}

/// Drop an object whose transfer failed; its contained references, if it
/// was a primary, are returned to release.
#[derive(Message)]
#[rtype(result = "Vec<ContainedRef>")]
pub struct Abort(pub ObjectId);

/// Read part of a complete object.
#[derive(Message)]
#[rtype(result = "Result<Vec<u8>, String>")]
pub struct Read {
    /// The object.
    pub id: ObjectId,
    /// Where to start.
    pub offset: u64,
    /// How many bytes at most.
    pub len: u64,
    /// A node caching a copy of it.
    pub copy_at: Option<ObjectLocation>,
}

/// What an [`Await`] found.
#[derive(Debug)]
pub enum Awaited {
    /// Complete here: its size.
    Ready(u64),
    /// It will never be: why.
    Failed(String),
    /// Not yet: fires on a change worth looking again.
    Wait(oneshot::Receiver<()>),
}

/// How is object `id` here?
#[derive(Message)]
#[rtype(result = "Awaited")]
pub struct Await(pub ObjectId);

/// The task producing an object failed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Fail {
    /// The object.
    pub id: ObjectId,
    /// Who holds its reference.
    pub holder: RefHolder,
    /// The task's error.
    pub message: String,
}

/// Reference changes by one holder.
#[derive(Message)]
#[rtype(result = "Vec<Freed>")]
pub struct UpdateRefs {
    /// Who.
    pub holder: RefHolder,
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
        let held: Vec<ObjectId> = self
            .objects
            .iter_mut()
            .filter_map(|(id, stored)| {
                let before = stored.holders.len();
                stored.holders.retain(|h| !dead(h));
                (stored.holders.len() < before).then_some(*id)
            })
            .collect();
        MessageResult(held.into_iter().filter_map(|id| self.collect(id)).collect())
    }
}

/// Drop a cached copy (its owner freed the object).
#[derive(Message)]
#[rtype(result = "()")]
pub struct DropCopy(pub ObjectId);

/// Spill least recently used complete objects until `need` bytes of
/// memory are free (or nothing is left to spill). Returns bytes spilled.
#[derive(Message)]
#[rtype(result = "Result<u64, String>")]
pub struct Spill {
    /// Bytes wanted free.
    pub need: u64,
}

/// Every object of this shard.
#[derive(Message)]
#[rtype(result = "Vec<ObjectSummary>")]
pub struct List;

impl Handler<Begin> for ObjectStoreShard {
    type Result = Result<Begun, String>;

    fn handle(&mut self, msg: Begin, _: &mut Self::Context) -> Self::Result {
        let primary = msg.holder.is_some();
        if let Some(stored) = self.objects.get_mut(&msg.id) {
            match &stored.data {
                Data::Memory(_) | Data::Shared(_) | Data::Spilled if !primary => {
                    return Ok(Begun::Present)
                }
                Data::Arriving(_) | Data::ArrivingShared { .. } if !primary => {
                    let (tx, rx) = oneshot::channel();
                    stored.waiting.push(tx);
                    return Ok(Begun::InProgress(rx));
                }
                Data::Failed(message) if !primary => return Err(message.clone()),
                Data::Expected if primary => {}
                _ => return Err(format!("object {} exists already", msg.id)),
            }
        }
        if !self.budget.take(msg.total) {
            return Ok(Begun::NoRoom(msg.total.saturating_sub(self.budget.free())));
        }
        let tick = self.tick();
        let data = match self.budget.shared_path(msg.id, msg.total) {
            Some(path) => match std::fs::File::create(&path) {
                Ok(file) => Data::ArrivingShared { file, received: 0 },
                Err(e) => {
                    tracing::warn!(
                        "cannot create {}: {e}; keeping the object in process memory",
                        path.display()
                    );
                    Data::Arriving(Vec::with_capacity(msg.total as usize))
                }
            },
            None => Data::Arriving(Vec::with_capacity(msg.total as usize)),
        };
        let stored = self
            .objects
            .entry(msg.id)
            .or_insert_with(|| Stored::new(msg.total, Data::Expected, primary));
        stored.total = msg.total;
        stored.data = data;
        stored.contains = msg.contains;
        stored.last_used = tick;
        if let Some(holder) = msg.holder {
            stored.holders.insert(holder);
        }
        Ok(Begun::Fresh)
    }
}

impl Handler<Append> for ObjectStoreShard {
    type Result = Result<(), String>;

    fn handle(&mut self, msg: Append, _: &mut Self::Context) -> Self::Result {
        let not_receiving = || format!("object {} is not being received", msg.id);
        let stored = self.objects.get_mut(&msg.id).ok_or_else(not_receiving)?;
        let have = match &stored.data {
            Data::Arriving(bytes) => bytes.len() as u64,
            Data::ArrivingShared { received, .. } => *received,
            _ => return Err(not_receiving()),
        };
        if msg.offset != have || have + msg.chunk.len() as u64 > stored.total {
            return Err(format!(
                "chunk at {} does not follow the {have} bytes received of {}",
                msg.offset, stored.total
            ));
        }
        let done = have + msg.chunk.len() as u64 == stored.total;
        match &mut stored.data {
            Data::Arriving(bytes) => {
                bytes.extend_from_slice(&msg.chunk);
                if done {
                    stored.data = Data::Memory(std::mem::take(bytes));
                }
            }
            Data::ArrivingShared { file, received } => {
                file.write_all_at(&msg.chunk, msg.offset)
                    .map_err(|e| format!("cannot write object {}: {e}", msg.id))?;
                *received += msg.chunk.len() as u64;
                if done {
                    let path = self.budget.shared_path(msg.id, stored.total);
                    stored.data = Data::Shared(path.ok_or_else(not_receiving)?);
                }
            }
            _ => return Err(not_receiving()),
        }
        if done {
            self.notify(msg.id);
        }
        Ok(())
    }
}

/// An object written in place by a process of this host is complete.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct Seal(pub ObjectId);

impl Handler<Seal> for ObjectStoreShard {
    type Result = Result<(), String>;

    fn handle(&mut self, Seal(id): Seal, _: &mut Self::Context) -> Self::Result {
        let stored = self
            .objects
            .get_mut(&id)
            .ok_or_else(|| format!("object {id} is not being received"))?;
        let Data::ArrivingShared { file, .. } = &stored.data else {
            return Err(format!("object {id} is not being written in place"));
        };
        let written = file.metadata().map_err(|e| e.to_string())?.len();
        if written != stored.total {
            return Err(format!(
                "object {id}: {written} bytes were written in place, not {}",
                stored.total
            ));
        }
        let path = self
            .budget
            .shared_path(id, stored.total)
            .ok_or_else(|| format!("object {id} has no shared-memory file"))?;
        stored.data = Data::Shared(path);
        self.notify(id);
        Ok(())
    }
}

/// The shared-memory file of a complete object, for a process of this
/// host to map.
#[derive(Message)]
#[rtype(result = "Option<(PathBuf, u64)>")]
pub struct Open(pub ObjectId);

impl Handler<Open> for ObjectStoreShard {
    type Result = Option<(PathBuf, u64)>;

    fn handle(&mut self, Open(id): Open, _: &mut Self::Context) -> Self::Result {
        let tick = self.tick();
        let stored = self.objects.get_mut(&id)?;
        let Data::Shared(path) = &stored.data else {
            return None;
        };
        stored.last_used = tick;
        Some((path.clone(), stored.total))
    }
}

impl Handler<Abort> for ObjectStoreShard {
    type Result = MessageResult<Abort>;

    fn handle(&mut self, Abort(id): Abort, _: &mut Self::Context) -> Self::Result {
        let arriving = self
            .objects
            .get(&id)
            .is_some_and(|s| matches!(s.data, Data::Arriving(_) | Data::ArrivingShared { .. }));
        if !arriving {
            return MessageResult(Vec::new());
        }
        let stored = self.objects.remove(&id).expect("present");
        self.forget(id, &stored);
        self.notify(id);
        MessageResult(if stored.primary {
            stored.contains
        } else {
            Vec::new()
        })
    }
}

impl Handler<Read> for ObjectStoreShard {
    type Result = Result<Vec<u8>, String>;

    fn handle(&mut self, msg: Read, _: &mut Self::Context) -> Self::Result {
        let tick = self.tick();
        let freed = self.freed.contains(&msg.id);
        let stored = self
            .objects
            .get_mut(&msg.id)
            .filter(|s| s.complete())
            .ok_or_else(|| {
                if freed {
                    format!("object {} was freed: no reference to it remained", msg.id)
                } else {
                    format!("object {} is not here", msg.id)
                }
            })?;
        stored.last_used = tick;
        if let Some(copy) = msg.copy_at.filter(|_| msg.offset == 0 && stored.primary) {
            if !stored.copies.contains(&copy) {
                stored.copies.push(copy);
            }
        }
        let total = stored.total;
        let start = msg.offset.min(total);
        let end = (start + msg.len).min(total);
        if matches!(stored.data, Data::Spilled) {
            let path = self.budget.spill_path(msg.id);
            // Restored on a read from the start when it fits; otherwise
            // served from disk.
            if msg.offset == 0 && self.budget.take(total) {
                if let Some(shared) = self.budget.shared_path(msg.id, total) {
                    return match std::fs::copy(&path, &shared) {
                        Ok(_) => {
                            let _ = std::fs::remove_file(&path);
                            self.budget.spilled.fetch_sub(total, Ordering::Relaxed);
                            stored.data = Data::Shared(shared.clone());
                            read_file(&shared, msg.id, start, end)
                        }
                        Err(e) => {
                            self.budget.give_back(total);
                            let _ = std::fs::remove_file(&shared);
                            Err(format!(
                                "cannot restore spilled object {} from {}: {e}",
                                msg.id,
                                path.display()
                            ))
                        }
                    };
                }
                match std::fs::read(&path) {
                    Ok(bytes) if bytes.len() as u64 == total => {
                        let _ = std::fs::remove_file(&path);
                        self.budget.spilled.fetch_sub(total, Ordering::Relaxed);
                        stored.data = Data::Memory(bytes);
                    }
                    Ok(bytes) => {
                        self.budget.give_back(total);
                        return Err(format!(
                            "spilled object {} is {} bytes on disk, not {total}",
                            msg.id,
                            bytes.len()
                        ));
                    }
                    Err(e) => {
                        self.budget.give_back(total);
                        return Err(format!(
                            "cannot restore spilled object {} from {}: {e}",
                            msg.id,
                            path.display()
                        ));
                    }
                }
            } else {
                return read_file(&path, msg.id, start, end);
            }
        }
        match &stored.data {
            Data::Memory(bytes) => Ok(bytes[start as usize..end as usize].to_vec()),
            Data::Shared(path) => read_file(path, msg.id, start, end),
            _ => Err(format!("object {} is not here", msg.id)),
        }
    }
}

/// Bytes `start..end` of object `id`'s file at `path`.
fn read_file(
    path: &std::path::Path,
    id: ObjectId,
    start: u64,
    end: u64,
) -> Result<Vec<u8>, String> {
    let mut chunk = vec![0; (end - start) as usize];
    std::fs::File::open(path)
        .and_then(|file| file.read_exact_at(&mut chunk, start))
        .map_err(|e| format!("cannot read object {id} from {}: {e}", path.display()))?;
    Ok(chunk)
}

impl Handler<Await> for ObjectStoreShard {
    type Result = MessageResult<Await>;

    fn handle(&mut self, Await(id): Await, _: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        MessageResult(match self.objects.get_mut(&id) {
            Some(stored) if stored.complete() => Awaited::Ready(stored.total),
            Some(Stored {
                data: Data::Failed(message),
                ..
            }) => Awaited::Failed(message.clone()),
            Some(stored) => {
                stored.waiting.push(tx);
                Awaited::Wait(rx)
            }
            None if self.freed.contains(&id) => Awaited::Failed(format!(
                "object {id} was freed: no reference to it remained"
            )),
            None => {
                self.arrivals.entry(id).or_default().push(tx);
                Awaited::Wait(rx)
            }
        })
    }
}

impl Handler<Fail> for ObjectStoreShard {
    type Result = ();

    fn handle(&mut self, msg: Fail, _: &mut Self::Context) {
        let stored = self
            .objects
            .entry(msg.id)
            .or_insert_with(|| Stored::new(0, Data::Expected, true));
        if !matches!(stored.data, Data::Expected) {
            return;
        }
        stored.data = Data::Failed(msg.message);
        stored.holders.insert(msg.holder);
        self.notify(msg.id);
    }
}

impl Handler<UpdateRefs> for ObjectStoreShard {
    type Result = MessageResult<UpdateRefs>;

    fn handle(&mut self, msg: UpdateRefs, _: &mut Self::Context) -> Self::Result {
        let mut freed = Vec::new();
        for (id, change) in msg.updates {
            if self.freed.contains(&id) {
                if matches!(change, RefChange::Hold { .. }) {
                    tracing::warn!(object = %id, holder = %msg.holder, "a reference to a freed object was taken");
                }
                continue;
            }
            let stored = self
                .objects
                .entry(id)
                .or_insert_with(|| Stored::new(0, Data::Expected, true));
            match change {
                RefChange::Hold { arrived } => {
                    stored.holders.insert(msg.holder.clone());
                    if arrived {
                        stored.transit -= 1;
                    }
                }
                RefChange::Release => {
                    stored.holders.remove(&msg.holder);
                }
                RefChange::Transit => stored.transit += 1,
            }
            freed.extend(self.collect(id));
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
            let stored = self.objects.remove(&id).expect("present");
            self.forget(id, &stored);
        }
    }
}

impl Handler<Spill> for ObjectStoreShard {
    type Result = Result<u64, String>;

    fn handle(&mut self, msg: Spill, _: &mut Self::Context) -> Self::Result {
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
        MessageResult(
            self.objects
                .iter()
                .map(|(id, s)| ObjectSummary {
                    id: *id,
                    size: s.total,
                    state: s.state(),
                    primary: s.primary,
                    holders: s.holders.iter().map(ToString::to_string).collect(),
                    in_transit: s.transit,
                })
                .collect(),
        )
    }
}
