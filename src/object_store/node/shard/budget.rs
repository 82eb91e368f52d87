//! `Budget`: the bytes a node's store may hold in memory, shared by its
//! shards, where it spills, and its spare shared-memory files.
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
//!    an object that never completed (a writer may still hold it). The
//!    mapping a writer keeps of the file it wrote does not count: it is
//!    written through only while the file is granted to that writer, never
//!    read (`process/kept_maps.rs`).
//! 2. A new shared-memory object takes the smallest spare at least its
//!    size that held an object of the same job, renamed to the object's
//!    name and cut to its size: its pages are already in memory, so the
//!    write skips allocating them (on this host, half the time of a fresh
//!    100 MiB file). Never another job's: its writer may keep it mapped.
//! 3. When memory is short, or the tmpfs refuses a new file for want of
//!    space, the spares are removed before anything is spilled. A cached
//!    copy dropped to make room is removed, never kept as a spare.
//!
//! An object's file is in a directory of its job's (`job-JOB`), which is
//! all of the shared-memory directory a worker of that job sees in its
//! sandbox (`crate::node`'s `sandbox/`); an object of no known job (only
//! drivers, the CLI and nodes read it) and the spares are in the
//! directory itself.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::files::{remove_shared, remove_spare};
use crate::cluster::ObjectId;
use crate::host::shared_memory::job_dir_name;

/// Objects this large or larger live in shared-memory files.
pub const SHARED_MIN: u64 = 1 << 20;

/// The most spare shared-memory files a node keeps.
const MAX_SPARE_FILES: usize = 4;

/// Spare files hold at most this fraction (1/N) of the memory budget.
const SPARE_SHARE: u64 = 4;

/// A freed object's shared-memory file, kept for a later object of its
/// job.
#[derive(Debug)]
struct Spare {
    path: PathBuf,
    size: u64,
    job: Option<String>,
}

/// Bytes a node's store may hold in memory, shared by its shards, and
/// where it spills.
#[derive(Debug)]
pub struct Budget {
    capacity: u64,
    used: AtomicU64,
    pub(super) spilled: AtomicU64,
    spill_dir: PathBuf,
    shared_dir: Option<PathBuf>,
    /// An object that gets no bytes for this long while it arrives is
    /// abandoned (`expire_arrivals`).
    pub(super) arrival_timeout: Duration,
    /// Spare shared-memory files (counted in `used`).
    spares: std::sync::Mutex<Vec<Spare>>,
    /// Names the next spare file.
    spare_seq: AtomicU64,
    /// Bytes of the tmpfs that copies being received may still take
    /// (`create_copy_file`).
    pub(super) copy_claims: Arc<AtomicU64>,
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

    /// The shared-memory file of a large object of `job`, if objects
    /// that large are kept in shared memory.
    pub(in crate::object_store::node) fn shared_path(
        &self,
        id: ObjectId,
        size: u64,
        job: Option<&str>,
    ) -> Option<PathBuf> {
        let dir = self.shared_dir.as_ref().filter(|_| size >= SHARED_MIN)?;
        Some(match job.and_then(job_dir_name) {
            Some(name) => dir.join(name).join(id.to_string()),
            None => dir.join(id.to_string()),
        })
    }

    /// Makes the directory `path` (a [`Budget::shared_path`]) is in, if
    /// it is a job's.
    pub(super) fn make_job_dir(&self, path: &std::path::Path) -> std::io::Result<()> {
        match path.parent() {
            Some(dir) if Some(dir) != self.shared_dir.as_deref() => {
                crate::host::files::private_dir(dir)
            }
            _ => Ok(()),
        }
    }

    /// The directory of the shared-memory files, if any.
    pub fn shared_dir(&self) -> Option<&std::path::Path> {
        self.shared_dir.as_deref()
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

    pub(super) fn take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + bytes <= self.capacity).then_some(used + bytes)
            })
            .is_ok()
    }

    pub(super) fn give_back(&self, bytes: u64) {
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

    /// Keeps the file of a freed object of `job` (`size` bytes, at
    /// `path`) as a spare, its bytes still counted as used (step 1). False
    /// when there is no room among the spares: the caller removes it.
    pub(super) fn keep_spare(&self, path: &std::path::Path, size: u64, job: Option<&str>) -> bool {
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
                spares.push(Spare {
                    path: spare,
                    size,
                    job: job.map(str::to_string),
                });
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

    /// The smallest spare of `job`'s of at least `size` bytes, renamed to
    /// `path` and cut to `size`; the bytes cut off are given back (step
    /// 2). `None` when no spare fits (or it could not be reused: it is
    /// removed).
    pub(super) fn reuse_spare(
        &self,
        path: &std::path::Path,
        size: u64,
        job: Option<&str>,
    ) -> Option<std::fs::File> {
        let spare = {
            let mut spares = self.spares();
            let best = (0..spares.len())
                .filter(|&i| spares[i].size >= size && spares[i].job.as_deref() == job)
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
    pub(super) fn drop_spares(&self) -> u64 {
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
    pub(super) fn making_room<T>(
        &self,
        mut make: impl FnMut() -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        match make() {
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && self.drop_spares() > 0 => make(),
            made => made,
        }
    }

    pub(super) fn spill_path(&self, id: ObjectId) -> PathBuf {
        self.spill_dir.join(id.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A budget of `capacity` bytes with its shared-memory files in a
    /// directory of its own.
    fn budget(capacity: u64) -> (tempfile::TempDir, Arc<Budget>) {
        let dir = tempfile::tempdir().unwrap();
        let budget = Budget::new(
            capacity,
            dir.path().join("spill"),
            Some(dir.path().to_path_buf()),
            Duration::from_secs(1),
        );
        (dir, budget)
    }

    /// A freed object's shared-memory file of `size` bytes, its bytes
    /// counted as used, as a shard holds it before `keep_spare`.
    fn freed_file(dir: &tempfile::TempDir, budget: &Budget, name: &str, size: u64) -> PathBuf {
        assert!(budget.take(size));
        let path = dir.path().join(name);
        std::fs::File::create(&path).unwrap().set_len(size).unwrap();
        path
    }

    fn files_in(dir: &tempfile::TempDir) -> usize {
        std::fs::read_dir(dir.path()).unwrap().count()
    }

    #[test]
    fn takes_never_exceed_the_capacity() {
        let (_dir, budget) = budget(10);
        assert!(budget.take(6));
        assert!(!budget.take(5), "6 + 5 bytes do not fit 10");
        assert_eq!((budget.used(), budget.free()), (6, 4));
        assert!(budget.take(4));
        budget.give_back(6);
        assert_eq!((budget.used(), budget.free()), (4, 6));
    }

    #[test]
    fn a_freed_file_becomes_a_spare_still_counted_as_used() {
        let (dir, budget) = budget(16 * MIB);
        let path = freed_file(&dir, &budget, "object", 2 * MIB);
        assert!(budget.keep_spare(&path, 2 * MIB, None));
        assert!(!path.exists(), "renamed to a spare");
        assert_eq!((budget.spare(), budget.used()), (2 * MIB, 2 * MIB));
        assert_eq!(files_in(&dir), 1);
    }

    #[test]
    fn a_file_over_the_spare_share_is_not_kept() {
        let (dir, budget) = budget(16 * MIB);
        let path = freed_file(&dir, &budget, "object", 4 * MIB + 1);
        assert!(!budget.keep_spare(&path, 4 * MIB + 1, None));
        assert!(path.exists(), "the caller removes it");
        assert_eq!(budget.spare(), 0);
    }

    #[test]
    fn the_oldest_spares_make_way_and_give_their_bytes_back() {
        let (dir, budget) = budget(64 * MIB);
        for i in 0..MAX_SPARE_FILES + 1 {
            let path = freed_file(&dir, &budget, &format!("object-{i}"), MIB);
            assert!(budget.keep_spare(&path, MIB, None));
        }
        let kept = MAX_SPARE_FILES as u64 * MIB;
        assert_eq!((budget.spare(), budget.used()), (kept, kept));
        assert_eq!(files_in(&dir), MAX_SPARE_FILES);
        // A spare of a quarter of the budget evicts the others.
        let path = freed_file(&dir, &budget, "large", 16 * MIB);
        assert!(budget.keep_spare(&path, 16 * MIB, None));
        assert_eq!((budget.spare(), budget.used()), (16 * MIB, 16 * MIB));
        assert_eq!(files_in(&dir), 1);
    }

    #[test]
    fn reuse_takes_the_smallest_spare_that_fits_and_cuts_it() {
        let (dir, budget) = budget(64 * MIB);
        for (name, size) in [("a", 8 * MIB), ("b", 3 * MIB), ("c", 2 * MIB)] {
            let path = freed_file(&dir, &budget, name, size);
            assert!(budget.keep_spare(&path, size, None));
        }
        let target = dir.path().join("new");
        let file = budget.reuse_spare(&target, 2 * MIB + 1, None).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 2 * MIB + 1);
        // The 3 MiB spare was taken; the bytes cut off went back.
        assert_eq!(budget.spare(), 10 * MIB);
        assert_eq!(budget.used(), 12 * MIB + 1);
        assert!(budget
            .reuse_spare(&dir.path().join("none"), 9 * MIB, None)
            .is_none());
    }

    #[test]
    fn dropping_the_spares_removes_their_files_and_frees_their_bytes() {
        let (dir, budget) = budget(64 * MIB);
        for name in ["a", "b"] {
            let path = freed_file(&dir, &budget, name, MIB);
            assert!(budget.keep_spare(&path, MIB, None));
        }
        assert_eq!(budget.drop_spares(), 2 * MIB);
        assert_eq!((budget.spare(), budget.used(), files_in(&dir)), (0, 0, 0));
    }

    #[test]
    fn a_full_tmpfs_is_retried_once_after_dropping_the_spares() {
        let (dir, budget) = budget(64 * MIB);
        let full = || std::io::Error::from_raw_os_error(libc::ENOSPC);
        let mut tries = 0;
        let without_spares = budget.making_room(|| {
            tries += 1;
            Err::<(), _>(full())
        });
        assert!(without_spares.is_err());
        assert_eq!(tries, 1, "no spare to drop: no second try");
        let path = freed_file(&dir, &budget, "a", MIB);
        assert!(budget.keep_spare(&path, MIB, None));
        let mut tries = 0;
        let made = budget.making_room(|| {
            tries += 1;
            if tries == 1 {
                Err(full())
            } else {
                Ok(())
            }
        });
        assert!(made.is_ok());
        assert_eq!((tries, budget.spare()), (2, 0));
    }

    #[test]
    fn without_a_shared_directory_nothing_is_shared_or_kept() {
        let dir = tempfile::tempdir().unwrap();
        let budget = Budget::new(64 * MIB, dir.path().join("spill"), None, Duration::ZERO);
        assert!(budget
            .shared_path(ObjectId::random(), SHARED_MIN, None)
            .is_none());
        let path = freed_file(&dir, &budget, "a", MIB);
        assert!(!budget.keep_spare(&path, MIB, None));
    }

    #[test]
    fn a_spare_is_reused_for_its_own_jobs_objects_only_in_that_jobs_directory() {
        let (dir, budget) = budget(64 * MIB);
        let id = ObjectId::random();
        let of_j1 = budget.shared_path(id, 2 * MIB, Some("j1")).unwrap();
        assert_eq!(of_j1, dir.path().join("job-j1").join(id.to_string()));
        let unnamed = budget.shared_path(id, 2 * MIB, Some("../j1")).unwrap();
        assert_eq!(unnamed, dir.path().join(id.to_string()), "not a plain name");
        let path = freed_file(&dir, &budget, "freed", 2 * MIB);
        assert!(budget.keep_spare(&path, 2 * MIB, Some("j1")));
        let of_j2 = budget
            .shared_path(ObjectId::random(), MIB, Some("j2"))
            .unwrap();
        budget.make_job_dir(&of_j2).unwrap();
        assert!(budget.reuse_spare(&of_j2, MIB, Some("j2")).is_none());
        assert!(budget.reuse_spare(&of_j2, MIB, None).is_none());
        budget.make_job_dir(&of_j1).unwrap();
        assert!(budget.reuse_spare(&of_j1, MIB, Some("j1")).is_some());
        assert!(of_j1.is_file());
    }
}
