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
//! Freed shared-memory files are kept for reuse (spare files, at most
//! `MAX_SPARE_FILES` holding at most a `SPARE_SHARE`th of the budget, the
//! oldest making way for the latest; a spare removed is also cut to
//! nothing, as the writers that keep it mapped would hold its memory):
//!
//! 1. A complete object's file that no process was given to map (`Open`)
//!    is renamed to a spare when the object is freed; its bytes stay
//!    counted as memory in use. A file that was mapped, or that a bulk
//!    stream out still reads (`OpenStream`), is removed, as is the file of
//!    an object that never completed (a writer may still hold it). The mapping a writer keeps of the file it wrote does not count:
//!    it is written through only while the file is granted to that writer,
//!    never read (`process/kept_maps.rs`).
//! 2. A new shared-memory object takes the smallest spare at least its
//!    size, renamed to the object's name and cut to its size: its pages
//!    are already in memory, so the write skips allocating them (on this
//!    host, half the time of a fresh 100 MiB file).
//! 3. When memory is short, or the tmpfs refuses a new file for want of
//!    space, the spares are removed before anything is spilled. A cached
//!    copy dropped to make room is removed, never kept as a spare.
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

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::may_read;
use super::refcount::{Collected, RefCounts};
use super::small_reads::SmallReads;
use crate::cluster::files::{free_bytes, private_dir, private_file, write_private};
use crate::cluster::{
    ContainedRef, ObjectId, ObjectLocation, ObjectState, ObjectSummary, RefChange, RefHolder,
};
use crate::object_store::error::ShardError;

/// Objects this large or larger live in shared-memory files.
pub const SHARED_MIN: u64 = 1 << 20;

/// The most spare shared-memory files a node keeps.
const MAX_SPARE_FILES: usize = 4;

/// Spare files hold at most this fraction (1/N) of the memory budget.
const SPARE_SHARE: u64 = 4;

/// A freed object's shared-memory file, kept for a later object.
#[derive(Debug)]
struct Spare {
    path: PathBuf,
    size: u64,
}

/// Bytes a node's store may hold in memory, shared by its shards, and
/// where it spills.
#[derive(Debug)]
pub struct Budget {
    capacity: u64,
    used: AtomicU64,
    spilled: AtomicU64,
    spill_dir: PathBuf,
    shared_dir: Option<PathBuf>,
    /// An object that gets no bytes for this long while it arrives is
    /// abandoned (`expire_arrivals`).
    arrival_timeout: Duration,
    /// Spare shared-memory files (counted in `used`).
    spares: std::sync::Mutex<Vec<Spare>>,
    /// Names the next spare file.
    spare_seq: AtomicU64,
    /// Bytes of the tmpfs that copies being received may still take
    /// (`create_copy_file`).
    copy_claims: Arc<AtomicU64>,
}

impl Budget {
    /// A budget of `capacity` bytes in memory, spilling into `spill_dir`
    /// (created on the first spill), keeping large objects as files in
    /// `shared_dir` (a tmpfs directory; `None`: all in process memory).
    /// An object arriving without bytes for `arrival_timeout` is abandoned.
    pub fn new(
        capacity: u64,
        spill_dir: PathBuf,
        shared_dir: Option<PathBuf>,
        arrival_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Budget {
            capacity,
            used: AtomicU64::new(0),
            spilled: AtomicU64::new(0),
            spill_dir,
            shared_dir,
            arrival_timeout,
            spares: std::sync::Mutex::new(Vec::new()),
            spare_seq: AtomicU64::new(0),
            copy_claims: Arc::default(),
        })
    }

    /// The shared-memory file of a large object, if objects that large
    /// are kept in shared memory.
    pub(super) fn shared_path(&self, id: ObjectId, size: u64) -> Option<PathBuf> {
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

    fn spares(&self) -> std::sync::MutexGuard<'_, Vec<Spare>> {
        self.spares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bytes of spare shared-memory files (part of [`Budget::used`]).
    pub fn spare(&self) -> u64 {
        self.spares().iter().map(|s| s.size).sum()
    }

    /// Keeps the file of a freed object (`size` bytes, at `path`) as a
    /// spare, its bytes still counted as used (step 1). False when there
    /// is no room among the spares: the caller removes it.
    fn keep_spare(&self, path: &std::path::Path, size: u64) -> bool {
        let Some(dir) = &self.shared_dir else {
            return false;
        };
        if size > self.capacity / SPARE_SHARE {
            return false;
        }
        let mut spares = self.spares();
        // The oldest spares make way: the sizes freed last are the likeliest
        // to be put next. They are removed once the lock is let go.
        let mut held: u64 = spares.iter().map(|s| s.size).sum();
        let mut evicted = Vec::new();
        while spares.len() >= MAX_SPARE_FILES || held + size > self.capacity / SPARE_SHARE {
            let oldest = spares.remove(0);
            held -= oldest.size;
            evicted.push(oldest);
        }
        let seq = self.spare_seq.fetch_add(1, Ordering::Relaxed);
        let spare = dir.join(format!("spare-{seq}"));
        let kept = match std::fs::rename(path, &spare) {
            Ok(()) => {
                spares.push(Spare { path: spare, size });
                true
            }
            Err(e) => {
                tracing::debug!("cannot keep {} as a spare: {e}", path.display());
                false
            }
        };
        drop(spares);
        for oldest in evicted {
            remove_spare(&oldest.path);
            self.give_back(oldest.size);
        }
        kept
    }

    /// The smallest spare of at least `size` bytes, renamed to `path` and
    /// cut to `size`; the bytes cut off are given back (step 2). `None`
    /// when no spare fits (or it could not be reused: it is removed).
    fn reuse_spare(&self, path: &std::path::Path, size: u64) -> Option<std::fs::File> {
        let spare = {
            let mut spares = self.spares();
            let best = (0..spares.len())
                .filter(|&i| spares[i].size >= size)
                .min_by_key(|&i| spares[i].size)?;
            spares.remove(best)
        };
        let reused = std::fs::rename(&spare.path, path).and_then(|()| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?;
            file.set_len(size)?;
            Ok(file)
        });
        match reused {
            Ok(file) => {
                self.give_back(spare.size - size);
                metrics::counter!("nimbus_object_store_spare_reuses_total").increment(1);
                Some(file)
            }
            Err(e) => {
                tracing::warn!("cannot reuse {}: {e}", spare.path.display());
                for stale in [&spare.path, &path.to_path_buf()] {
                    let _ = remove_shared(stale, true);
                }
                self.give_back(spare.size);
                None
            }
        }
    }

    /// Removes every spare file and gives its bytes back (step 3); how
    /// many bytes that freed.
    fn drop_spares(&self) -> u64 {
        let spares = std::mem::take(&mut *self.spares());
        let mut freed = 0;
        for spare in spares {
            remove_spare(&spare.path);
            self.give_back(spare.size);
            freed += spare.size;
        }
        freed
    }

    /// Runs `make`, which writes to shared memory; when it finds the
    /// file system full, removes the spares and runs it once more (step
    /// 3: /dev/shm may be smaller than the budget, shared by other users).
    fn making_room<T>(&self, mut make: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
        match make() {
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && self.drop_spares() > 0 => make(),
            made => made,
        }
    }

    fn spill_path(&self, id: ObjectId) -> PathBuf {
        self.spill_dir.join(id.to_string())
    }
}

/// Where an object's bytes are.
enum Data {
    /// Receiving; the bytes so far.
    Arriving(Vec<u8>),
    /// Receiving into its shared-memory file: by chunks (`received` so
    /// far), or written in place by a process of this host.
    /// A copy's file also holds its claim on the tmpfs until then (kept
    /// for its `Drop`).
    ArrivingShared {
        file: std::fs::File,
        received: u64,
        _claim: Option<TmpfsClaim>,
    },
    /// Complete, in memory (shared with the node's small reads when
    /// small: `small_reads.rs`).
    Memory(Arc<Vec<u8>>),
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
    /// Owned here (false: a cached copy of another node's object); its
    /// references are counted in the shard's [`RefCounts`].
    primary: bool,
    /// The job whose workers may read it (`None`: not known; only drivers,
    /// the CLI and nodes read it).
    job: Option<Arc<str>>,
    contains: Vec<ContainedRef>,
    /// Nodes caching a copy of this primary.
    copies: Vec<ObjectLocation>,
    /// Who waits for it to complete (or fail).
    waiting: Vec<oneshot::Sender<()>>,
    last_used: u64,
    /// When its last bytes arrived (or it began).
    touched: Instant,
    /// It stopped arriving and failed: a put of it may begin again.
    abandoned: bool,
    /// A process was given its shared-memory file to map (`Open`): the
    /// file is never reused.
    mapped: bool,
    /// Shared with each bulk stream out reading its shared-memory file
    /// (`OpenStream`) until the stream ends: while one does, the file is
    /// not reused, nor cut when removed (the stream reads on from it).
    streaming: Arc<()>,
}

impl Stored {
    fn new(total: u64, data: Data, primary: bool) -> Self {
        Stored {
            total,
            data,
            primary,
            job: None,
            contains: Vec::new(),
            copies: Vec::new(),
            waiting: Vec::new(),
            last_used: 0,
            touched: Instant::now(),
            abandoned: false,
            mapped: false,
            streaming: Arc::default(),
        }
    }

    /// A read at `tick`, from its start for a node caching a copy
    /// (`copy_at`): it was used then, and a primary notes the copy.
    fn read_for(&mut self, tick: u64, copy_at: Option<ObjectLocation>) {
        self.last_used = tick;
        if let Some(copy) = copy_at.filter(|_| self.primary) {
            if !self.copies.contains(&copy) {
                self.copies.push(copy);
            }
        }
    }

    /// Whether a process maps its shared-memory file or a bulk stream
    /// reads it: the file may then be removed, never reused or cut.
    fn held_open(&self) -> bool {
        self.mapped || Arc::strong_count(&self.streaming) > 1
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

    fn state(&self) -> ObjectState {
        match self.data {
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
            if !stored.held_open() && self.budget.keep_spare(path, stored.total) {
                return;
            }
        }
        self.release(id, stored);
    }

    /// Returns what `stored` held of memory and disk, removing its files.
    fn release(&self, id: ObjectId, stored: &Stored) {
        self.budget.give_back(stored.in_memory());
        if matches!(stored.data, Data::Shared(_) | Data::ArrivingShared { .. }) {
            if let Some(path) = self.budget.shared_path(id, stored.total) {
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
        let written = private_dir(&self.budget.spill_dir).and_then(|()| match &stored.data {
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

/// How often arriving objects are checked for abandonment: a quarter of
/// the arrival timeout, within these bounds.
const ARRIVAL_CHECK_MIN: Duration = Duration::from_millis(100);
const ARRIVAL_CHECK_MAX: Duration = Duration::from_secs(5);

impl ObjectStoreShard {
    /// Abandons the objects that got no bytes for the arrival timeout
    /// (their putter stopped or vanished half-way): a primary fails, with
    /// the reason, for whoever waits or reads it, and may be put again; a
    /// cached copy is dropped (a later pull starts over). Either way its
    /// memory and file are given back. An object a process of this host
    /// writes in place counts its file's modification time as bytes.
    fn expire_arrivals(&mut self, now: Instant) {
        let timeout = self.budget.arrival_timeout;
        let abandoned: Vec<ObjectId> = self
            .objects
            .iter()
            .filter(|(_, stored)| {
                let written = match &stored.data {
                    Data::Arriving(_) => None,
                    Data::ArrivingShared { file, .. } => file
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|modified| modified.elapsed().ok()),
                    _ => return false,
                };
                let idle = now.saturating_duration_since(stored.touched);
                written.map_or(idle, |since| since.min(idle)) > timeout
            })
            .map(|(id, _)| *id)
            .collect();
        for id in abandoned {
            let Some(stored) = self.take(id) else {
                continue;
            };
            self.forget(id, &stored);
            tracing::warn!(
                object = %id,
                "abandoned an object that got no bytes for {timeout:?} while it arrived"
            );
            if stored.primary {
                let reason = format!(
                    "its upload stopped: no bytes arrived for {timeout:?} (--object-arrival-timeout-s on the node)"
                );
                let mut failed = Stored::new(stored.total, Data::Failed(reason), true);
                failed.job = stored.job;
                failed.contains = stored.contains;
                failed.waiting = stored.waiting;
                failed.abandoned = true;
                self.put(id, failed);
            } else {
                for waiter in stored.waiting {
                    let _ = waiter.send(());
                }
            }
            self.notify(id);
        }
    }
}

/// How a [`Begin`] went.
#[derive(Debug)]
pub enum Begun {
    /// The object is new here: send its chunks. `shared`: it is received
    /// into its shared-memory file (else into the node's memory, also when
    /// `/dev/shm` has no room for it).
    Fresh {
        /// Whether its bytes go to its shared-memory file.
        shared: bool,
    },
    /// It is here already, complete.
    Present,
    /// Another transfer is filling it: wait for this.
    InProgress(oneshot::Receiver<()>),
    /// Memory is short by `short` bytes: spill, then begin again (with
    /// `first`, the begin's first chunk, given back).
    NoRoom {
        /// Bytes missing.
        short: u64,
        /// The [`Begin::first`] it was sent.
        first: Option<Vec<u8>>,
    },
}

/// Removes a shared-memory file. One that is `unread` (a complete
/// object's that no process was given to read, a spare, say) is also cut
/// to nothing through a handle opened before: the mapping its writer
/// keeps to write into it again (`process/kept_maps.rs`) would otherwise
/// hold its memory until dropped. Never cut a file still being written,
/// nor one a reader may map: it would fault them.
fn remove_shared(path: &std::path::Path, unread: bool) -> std::io::Result<()> {
    let opened = unread.then(|| std::fs::OpenOptions::new().write(true).open(path));
    std::fs::remove_file(path)?;
    // Unlinked, the file is this node's alone: a failed cut costs only
    // the memory the mappings hold until dropped.
    if let Some(Ok(file)) = opened {
        let _ = file.set_len(0);
    }
    Ok(())
}

/// Object `id`'s complete `bytes`, kept in memory and shared with the
/// node's small reads (which take them if small enough), for `job`'s
/// workers to read.
fn in_memory(small: &SmallReads, id: ObjectId, bytes: Vec<u8>, job: &Option<Arc<str>>) -> Data {
    let bytes = Arc::new(bytes);
    small.share(id, &bytes, job.clone());
    Data::Memory(bytes)
}

/// Removes a spare file ([`remove_shared`]), saying so if it cannot.
fn remove_spare(path: &std::path::Path) {
    if let Err(e) = remove_shared(path, true) {
        tracing::warn!("cannot remove {}: {e}", path.display());
    }
}

/// Creates the shared-memory file at `path` and gives it its size with
/// `size`; a file that cannot be sized is removed.
fn create_shared(
    path: &std::path::Path,
    size: impl FnOnce(&std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<std::fs::File> {
    let file = private_file(path)?;
    if let Err(e) = size(&file) {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

/// Creates the shared-memory file of an object of `total` bytes with its
/// blocks allocated, so that a full tmpfs refuses it now (ENOSPC) rather
/// than failing a write later, or killing a process that writes it in place
/// through a mapping (SIGBUS).
fn reserve_shared(path: &std::path::Path, total: u64) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    create_shared(path, |file| {
        let length = libc::off_t::try_from(total).map_err(std::io::Error::other)?;
        // SAFETY: a plain system call on a file descriptor open for the call.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, length) } {
            0 => Ok(()),
            error => Err(std::io::Error::from_raw_os_error(error)),
        }
    })
}

/// Room on the tmpfs that a copy being received may still take: its size,
/// given back when the copy is complete or dropped.
#[derive(Debug)]
struct TmpfsClaim {
    claims: Arc<AtomicU64>,
    bytes: u64,
}

impl Drop for TmpfsClaim {
    fn drop(&mut self) {
        self.claims.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Creates the shared-memory file of a cached copy of `total` bytes,
/// which only this node writes (by `pwrite`, never through a mapping):
/// its blocks are allocated as the copy's bytes arrive, alongside the
/// transfer, instead of all of them before it (a first 256 MiB pull on
/// loopback went from 1.21–1.40 to 1.14–1.47 GB/s, median 1.26 to 1.45).
/// The tmpfs must have room for it beside what the copies under way
/// (`claims`) may still take, or it is refused now (ENOSPC), as
/// [`reserve_shared`] refuses a file it cannot allocate; only something
/// else filling the tmpfs meanwhile fails a copy's write (with ENOSPC,
/// which fails the pull with that error).
fn create_copy_file(
    path: &std::path::Path,
    total: u64,
    claims: &Arc<AtomicU64>,
) -> std::io::Result<(std::fs::File, TmpfsClaim)> {
    let claimed_before = claims.fetch_add(total, Ordering::Relaxed);
    let claim = TmpfsClaim {
        claims: claims.clone(),
        bytes: total,
    };
    let free = path.parent().and_then(free_bytes);
    if free.is_some_and(|free| free < claimed_before.saturating_add(total)) {
        return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
    }
    let file = create_shared(path, |file| file.set_len(total))?;
    Ok((file, claim))
}

/// Start receiving an object of `total` bytes.
#[derive(Message)]
#[rtype(result = "Result<Begun, ShardError>")]
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
    /// The job whose workers may read it.
    pub job: Option<Arc<str>>,
    /// Its first chunk, when it comes with the begin (a put: one shard
    /// message instead of two, and an object that is one chunk is kept
    /// without a copy); `None` for chunks that follow.
    pub first: Option<Vec<u8>>,
}

/// The next chunk of an object being received.
#[derive(Message)]
#[rtype(result = "Result<(), ShardError>")]
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
#[rtype(result = "Result<Vec<u8>, ShardError>")]
pub struct Read {
    /// The object.
    pub id: ObjectId,
    /// Where to start.
    pub offset: u64,
    /// How many bytes at most.
    pub len: u64,
    /// A node caching a copy of it.
    pub copy_at: Option<ObjectLocation>,
    /// The job the reader is confined to (a worker's).
    pub confined: Option<String>,
}

/// What an [`Await`] found.
#[derive(Debug)]
pub enum Awaited {
    /// Complete here.
    Ready {
        /// Its size.
        size: u64,
        /// The job whose workers may read it.
        job: Option<Arc<str>>,
    },
    /// It will never be.
    Failed {
        /// Why.
        reason: String,
        /// The job that recorded the failure (`None`: this node's own
        /// finding, such as a freed object).
        job: Option<Arc<str>>,
    },
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
    /// The job that records it (whose workers alone may read it).
    pub job: Option<Arc<str>>,
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
        let of_another = |id: &ObjectId| {
            let stored = self.objects.get(id);
            stored.is_some_and(|stored| stored.job.as_deref() != Some(&*msg.job))
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

impl Handler<Begin> for ObjectStoreShard {
    type Result = Result<Begun, ShardError>;

    fn handle(&mut self, msg: Begin, _: &mut Self::Context) -> Self::Result {
        let primary = msg.holder.is_some();
        if primary && self.refs.was_freed(msg.id) {
            // A late or repeated put of an object every reference let go
            // of: storing it again would keep it for no one.
            return Err(ShardError::Freed(msg.id));
        }
        if primary && self.objects.get(&msg.id).is_some_and(|s| s.abandoned) {
            // Its put stopped half-way: this one starts it over.
            self.take(msg.id);
        }
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
                Data::Failed(message) if !primary => {
                    return Err(ShardError::Failed(message.clone()))
                }
                _ => return Err(ShardError::Exists(msg.id)),
            }
        }
        let shared_path = self.budget.shared_path(msg.id, msg.total);
        let reused = shared_path
            .as_ref()
            .and_then(|path| self.budget.reuse_spare(path, msg.total));
        let room = reused.is_some()
            || self.budget.take(msg.total)
            || (self.budget.drop_spares() > 0 && self.budget.take(msg.total));
        if !room {
            return Ok(Begun::NoRoom {
                short: msg.total.saturating_sub(self.budget.free()),
                first: msg.first,
            });
        }
        let tick = self.tick();
        let data = match (shared_path, reused) {
            (Some(_), Some(file)) => Data::ArrivingShared {
                file,
                received: 0,
                _claim: None,
            },
            (Some(path), None) => {
                let create = || {
                    if primary {
                        reserve_shared(&path, msg.total).map(|file| (file, None))
                    } else {
                        create_copy_file(&path, msg.total, &self.budget.copy_claims)
                            .map(|(file, claim)| (file, Some(claim)))
                    }
                };
                match self.budget.making_room(create) {
                    Ok((file, claim)) => Data::ArrivingShared {
                        file,
                        received: 0,
                        _claim: claim,
                    },
                    Err(e) => {
                        let warning = format!(
                        "cannot make {} ({} bytes): {e}; keeping such objects in the node's memory (a larger /dev/shm lets processes of this host map them)",
                        path.display(),
                        msg.total
                    );
                        if std::mem::replace(&mut self.warned_shared, true) {
                            tracing::debug!("{warning}");
                        } else {
                            tracing::warn!("{warning}");
                        }
                        Data::Arriving(Vec::new())
                    }
                }
            }
            (None, _) => Data::Arriving(Vec::new()),
        };
        let shared = matches!(data, Data::ArrivingShared { .. });
        let mut stored = Stored::new(msg.total, data, primary);
        stored.contains = msg.contains;
        stored.job = msg.job;
        stored.last_used = tick;
        self.put(msg.id, stored);
        if let Some(holder) = msg.holder {
            self.refs.arrived(msg.id, holder);
        }
        if let Some(chunk) = msg.first {
            if let Err(e) = self.append(Append {
                id: msg.id,
                offset: 0,
                chunk,
            }) {
                // Undone as an abort would, before anyone saw it; its
                // contained references are not held yet.
                if let Some(stored) = self.take(msg.id) {
                    self.forget(msg.id, &stored);
                    if stored.primary {
                        self.refs.forget(msg.id);
                    }
                }
                return Err(e);
            }
        }
        Ok(Begun::Fresh { shared })
    }
}

impl Handler<Append> for ObjectStoreShard {
    type Result = Result<(), ShardError>;

    fn handle(&mut self, msg: Append, _: &mut Self::Context) -> Self::Result {
        self.append(msg)
    }
}

impl ObjectStoreShard {
    /// Adds a chunk to an object being received; the object is complete
    /// once its last byte arrives.
    fn append(&mut self, msg: Append) -> Result<(), ShardError> {
        let not_receiving = || ShardError::NotReceiving(msg.id);
        let stored = self.objects.get_mut(&msg.id).ok_or_else(not_receiving)?;
        let have = match &stored.data {
            Data::Arriving(bytes) => bytes.len() as u64,
            Data::ArrivingShared { received, .. } => *received,
            _ => return Err(not_receiving()),
        };
        if msg.offset != have || have + msg.chunk.len() as u64 > stored.total {
            return Err(ShardError::OutOfOrder {
                id: msg.id,
                offset: msg.offset,
                have,
                total: stored.total,
            });
        }
        let done = have + msg.chunk.len() as u64 == stored.total;
        stored.touched = Instant::now();
        let job = stored.job.clone();
        match &mut stored.data {
            Data::Arriving(bytes) if bytes.is_empty() && done => {
                // The whole object in one chunk: kept as it came.
                stored.data = in_memory(&self.small, msg.id, msg.chunk, &job);
            }
            Data::Arriving(bytes) => {
                if bytes.capacity() == 0 {
                    bytes.reserve_exact(stored.total as usize);
                }
                bytes.extend_from_slice(&msg.chunk);
                if done {
                    stored.data = in_memory(&self.small, msg.id, std::mem::take(bytes), &job);
                }
            }
            Data::ArrivingShared { file, received, .. } => {
                let path = self.budget.shared_path(msg.id, stored.total);
                let path = path.ok_or_else(not_receiving)?;
                file.write_all_at(&msg.chunk, msg.offset)
                    .map_err(|source| ShardError::Io {
                        action: "write",
                        id: msg.id,
                        path: path.clone(),
                        source,
                    })?;
                *received += msg.chunk.len() as u64;
                if done {
                    stored.data = Data::Shared(path);
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

/// An object written in place (by a process of this host, or by a pull's
/// bulk stream) is complete.
#[derive(Message)]
#[rtype(result = "Result<(), ShardError>")]
pub struct Seal {
    /// The object.
    pub id: ObjectId,
    /// The inode its writer wrote, when it opened the file itself: a seal
    /// of a file since abandoned and begun again (another pull's) is
    /// refused.
    pub inode: Option<u64>,
}

impl Handler<Seal> for ObjectStoreShard {
    type Result = Result<(), ShardError>;

    fn handle(&mut self, Seal { id, inode }: Seal, _: &mut Self::Context) -> Self::Result {
        use std::os::unix::fs::MetadataExt;
        let stored = self
            .objects
            .get_mut(&id)
            .ok_or(ShardError::NotReceiving(id))?;
        let (Data::ArrivingShared { file, .. }, Some(path)) =
            (&stored.data, self.budget.shared_path(id, stored.total))
        else {
            return Err(ShardError::NotWrittenInPlace(id));
        };
        let same = |expected| file.metadata().is_ok_and(|m| m.ino() == expected);
        if !inode.is_none_or(same) {
            return Err(ShardError::NotWrittenInPlace(id));
        }
        let written = match file.metadata() {
            Ok(metadata) => metadata.len(),
            Err(source) => {
                let action = "seal";
                return Err(ShardError::Io {
                    action,
                    id,
                    path,
                    source,
                });
            }
        };
        if written != stored.total {
            let total = stored.total;
            return Err(ShardError::WrongSize { id, written, total });
        }
        stored.data = Data::Shared(path);
        self.notify(id);
        Ok(())
    }
}

/// The shared-memory file of a complete object, opened for a bulk stream
/// out that reads it straight (`None`: it is not in one, the stream reads
/// it by [`Read`]s), with its pin ([`Stored::held_open`]) to hold until the
/// stream ends; a read for a node caching a copy (`copy_at`).
#[derive(Message)]
#[rtype(result = "Option<(std::fs::File, Arc<()>)>")]
pub struct OpenStream {
    /// The object.
    pub id: ObjectId,
    /// The node caching a copy of it.
    pub copy_at: Option<ObjectLocation>,
}

impl Handler<OpenStream> for ObjectStoreShard {
    type Result = Option<(std::fs::File, Arc<()>)>;

    fn handle(&mut self, msg: OpenStream, _: &mut Self::Context) -> Self::Result {
        let tick = self.tick();
        let stored = self.objects.get_mut(&msg.id)?;
        let Data::Shared(path) = &stored.data else {
            return None;
        };
        let file = std::fs::File::open(path)
            .inspect_err(|e| {
                tracing::warn!(object = %msg.id, "cannot open {} to stream it: {e}", path.display())
            })
            .ok()?;
        stored.read_for(tick, msg.copy_at);
        Some((file, stored.streaming.clone()))
    }
}

/// The shared-memory file of a complete object, for a process of this
/// host to map (`None`: it has none, read it in chunks).
#[derive(Message)]
#[rtype(result = "Result<Option<(PathBuf, u64)>, ShardError>")]
pub struct Open {
    /// The object.
    pub id: ObjectId,
    /// The job the process is confined to (a worker's).
    pub confined: Option<String>,
}

impl Handler<Open> for ObjectStoreShard {
    type Result = Result<Option<(PathBuf, u64)>, ShardError>;

    fn handle(&mut self, msg: Open, _: &mut Self::Context) -> Self::Result {
        let tick = self.tick();
        let Some(stored) = self.objects.get_mut(&msg.id) else {
            return Ok(None);
        };
        may_read(msg.id, stored.job.as_deref(), msg.confined.as_deref())?;
        let Data::Shared(path) = &stored.data else {
            return Ok(None);
        };
        stored.last_used = tick;
        stored.mapped = true;
        Ok(Some((path.clone(), stored.total)))
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
        let Some(stored) = self.take(id) else {
            return MessageResult(Vec::new());
        };
        self.forget(id, &stored);
        self.notify(id);
        if !stored.primary {
            return MessageResult(Vec::new());
        }
        self.refs.forget(id);
        MessageResult(stored.contains)
    }
}

impl Handler<Read> for ObjectStoreShard {
    type Result = Result<Vec<u8>, ShardError>;

    fn handle(&mut self, msg: Read, _: &mut Self::Context) -> Self::Result {
        let tick = self.tick();
        let freed = self.refs.was_freed(msg.id);
        let stored = self
            .objects
            .get_mut(&msg.id)
            .filter(|s| s.complete())
            .ok_or(if freed {
                ShardError::Freed(msg.id)
            } else {
                ShardError::NotHere(msg.id)
            })?;
        may_read(msg.id, stored.job.as_deref(), msg.confined.as_deref())?;
        stored.read_for(tick, msg.copy_at.filter(|_| msg.offset == 0));
        let total = stored.total;
        let start = msg.offset.min(total);
        let end = (start + msg.len).min(total);
        if matches!(stored.data, Data::Spilled) {
            let path = self.budget.spill_path(msg.id);
            // Restored on a read from the start when it fits; otherwise
            // served from disk.
            if msg.offset == 0 && self.budget.take(total) {
                if let Some(shared) = self.budget.shared_path(msg.id, total) {
                    return match self.budget.making_room(|| std::fs::copy(&path, &shared)) {
                        Ok(_) => {
                            let _ = std::fs::remove_file(&path);
                            self.budget.spilled.fetch_sub(total, Ordering::Relaxed);
                            metrics::counter!("nimbus_object_restores_total").increment(1);
                            stored.data = Data::Shared(shared.clone());
                            read_file(&shared, msg.id, start, end)
                        }
                        Err(source) => {
                            self.budget.give_back(total);
                            let _ = std::fs::remove_file(&shared);
                            Err(ShardError::Io {
                                action: "restore",
                                id: msg.id,
                                path,
                                source,
                            })
                        }
                    };
                }
                match std::fs::read(&path) {
                    Ok(bytes) if bytes.len() as u64 == total => {
                        let _ = std::fs::remove_file(&path);
                        self.budget.spilled.fetch_sub(total, Ordering::Relaxed);
                        metrics::counter!("nimbus_object_restores_total").increment(1);
                        stored.data = in_memory(&self.small, msg.id, bytes, &stored.job);
                    }
                    Ok(bytes) => {
                        self.budget.give_back(total);
                        return Err(ShardError::SpillTruncated {
                            id: msg.id,
                            found: bytes.len() as u64,
                            total,
                        });
                    }
                    Err(source) => {
                        self.budget.give_back(total);
                        return Err(ShardError::Io {
                            action: "restore",
                            id: msg.id,
                            path,
                            source,
                        });
                    }
                }
            } else {
                return read_file(&path, msg.id, start, end);
            }
        }
        match &stored.data {
            Data::Memory(bytes) => Ok(bytes[start as usize..end as usize].to_vec()),
            Data::Shared(path) => read_file(path, msg.id, start, end),
            _ => Err(ShardError::NotHere(msg.id)),
        }
    }
}

/// Bytes `start..end` of object `id`'s file at `path`.
fn read_file(
    path: &std::path::Path,
    id: ObjectId,
    start: u64,
    end: u64,
) -> Result<Vec<u8>, ShardError> {
    use std::io::{Read as _, Seek as _};
    let len = (end - start) as usize;
    // Read into spare capacity: `read_to_end` fills it without zeroing it
    // first (a zero-filled chunk costs a pass over it per read).
    let mut chunk = Vec::with_capacity(len);
    let read = std::fs::File::open(path).and_then(|mut file| {
        file.seek(std::io::SeekFrom::Start(start))?;
        file.take(len as u64).read_to_end(&mut chunk)
    });
    let io_error = |source| ShardError::Io {
        action: "read",
        id,
        path: path.to_path_buf(),
        source,
    };
    match read {
        Ok(n) if n == len => Ok(chunk),
        Ok(_) => Err(io_error(std::io::ErrorKind::UnexpectedEof.into())),
        Err(source) => Err(io_error(source)),
    }
}

impl Handler<Await> for ObjectStoreShard {
    type Result = MessageResult<Await>;

    fn handle(&mut self, Await(id): Await, _: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        MessageResult(match self.objects.get_mut(&id) {
            Some(stored) if stored.complete() => Awaited::Ready {
                size: stored.total,
                job: stored.job.clone(),
            },
            Some(Stored {
                data: Data::Failed(message),
                job,
                ..
            }) => Awaited::Failed {
                reason: message.clone(),
                job: job.clone(),
            },
            Some(stored) => {
                stored.waiting.push(tx);
                Awaited::Wait(rx)
            }
            None if self.refs.was_freed(id) => Awaited::Failed {
                reason: ShardError::Freed(id).to_string(),
                job: None,
            },
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
        if self.objects.contains_key(&msg.id) || self.refs.was_freed(msg.id) {
            return;
        }
        let mut failed = Stored::new(0, Data::Failed(msg.message), true);
        failed.job = msg.job;
        self.put(msg.id, failed);
        self.refs.arrived(msg.id, msg.holder);
        self.notify(msg.id);
    }
}

impl Handler<UpdateRefs> for ObjectStoreShard {
    type Result = MessageResult<UpdateRefs>;

    fn handle(&mut self, msg: UpdateRefs, _: &mut Self::Context) -> Self::Result {
        let mut freed = Vec::new();
        for (id, change) in msg.updates {
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
