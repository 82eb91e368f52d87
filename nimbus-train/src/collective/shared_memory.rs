//! The shared-memory backend: every rank of a group on one host maps one
//! segment (a file under `/dev/shm`) holding a slot per rank and two result
//! areas, and synchronises through counters in the segment's header.
//!
//! Setup: rank 0 creates the segment under a temporary name and publishes
//! it by rename (the supervisor names it in the job's shared-memory
//! directory, `nimbus::library::job_shared_memory`, one per attempt); the others wait for it (up to the timeout) and map it; after
//! the first barrier rank 0 unlinks it, so a crash leaks nothing. A group
//! holds at most [`MAX_WORLD`] ranks (one arrival counter per cache line
//! of the 4 KiB header). Each rank slot holds one bucket (4 MiB from the
//! supervisor); longer buffers go through in chunks of that size.
//!
//! Allreduce of a chunk, for `n` ranks:
//! 1. each rank copies its chunk into its slot, then waits at a barrier;
//! 2. rank `r` reduces segment `r` of the chunk over all slots (in rank
//!    order, so every run adds in the same order) into the result area;
//!    barrier;
//! 3. each rank copies the whole result back.
//!
//! The result area alternates between two buffers chunk by chunk, so step 3
//! of one chunk never races step 2 of the next: two barriers per chunk.
//!
//! Waits spin (256 times), then yield (up to 4096 times), then sleep
//! 50 µs between looks, and fail at the group's timeout naming the ranks
//! that did not arrive, or at once when the abort word is set (with its
//! reason).
//!
//! Segment layout (offsets in bytes):
//! `0` magic, `8` world size, `16` slot capacity, `24` abort state,
//! `32..128` abort reason (UTF-8), `128 + 64·r` rank `r`'s arrival counter
//! (one cache line each), `4096` the slots, then the two result areas.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use super::{Collective, CollectiveError};

const MAGIC: u64 = 0x4e49_4d42_5553_5348; // "NIMBUSSH"
const HEADER: usize = 4096;
const ARRIVALS: usize = 128;
const LINE: usize = 64;
const REASON: std::ops::Range<usize> = 32..128;
/// The most ranks one segment's header has room for.
pub const MAX_WORLD: usize = (HEADER - ARRIVALS) / LINE;

/// Abort states.
const RUNNING: u64 = 0;
const ABORTING: u64 = 1;
const ABORTED: u64 = 2;

/// The mapped segment, shared between the group and its abort handles.
struct Segment {
    // Kept for its mapping; all access goes through `base`.
    _map: MmapMut,
    base: *mut u8,
    world: usize,
    capacity: usize,
}

// SAFETY: the segment is shared memory by design; every cross-rank access is
// ordered by the header's atomics (Release on arrival, Acquire on waiting).
unsafe impl Send for Segment {}
// SAFETY: as for Send: shared access is ordered by the header's atomics.
unsafe impl Sync for Segment {}

impl Segment {
    fn len(world: usize, capacity: usize) -> usize {
        HEADER + (world + 2) * capacity
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offsets are inside the header, 8-byte aligned (the mapping
        // is page-aligned).
        unsafe { &*(self.base.add(offset) as *const AtomicU64) }
    }

    fn arrival(&self, rank: usize) -> &AtomicU64 {
        self.word(ARRIVALS + rank * LINE)
    }

    fn area(&self, index: usize) -> *mut f32 {
        // SAFETY: index < world + 2, inside the mapping.
        unsafe { self.base.add(HEADER + index * self.capacity) as *mut f32 }
    }

    fn abort(&self, reason: &str) {
        if self
            .word(24)
            .compare_exchange(RUNNING, ABORTING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let bytes = reason.as_bytes();
            let n = bytes.len().min(REASON.len());
            // SAFETY: only the rank that won the exchange writes the reason,
            // before publishing it with the Release store below.
            unsafe {
                std::ptr::write_bytes(self.base.add(REASON.start), 0, REASON.len());
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(REASON.start), n);
            }
            self.word(24).store(ABORTED, Ordering::Release);
        }
    }

    fn aborted(&self) -> Option<String> {
        let mut state = self.word(24).load(Ordering::Acquire);
        // The aborting rank is writing the reason: a few stores away.
        let mut spins = 0;
        while state == ABORTING && spins < 1_000_000 {
            std::hint::spin_loop();
            spins += 1;
            state = self.word(24).load(Ordering::Acquire);
        }
        match state {
            RUNNING => None,
            ABORTED => {
                // SAFETY: published by the Release store in `abort`.
                let raw = unsafe {
                    std::slice::from_raw_parts(self.base.add(REASON.start), REASON.len())
                };
                let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                Some(String::from_utf8_lossy(&raw[..end]).into_owned())
            }
            _ => Some("aborting".to_string()),
        }
    }
}

/// Aborts a [`SharedMemoryGroup`] from another thread or process: every
/// rank's current and next operation fails with
/// [`CollectiveError::Aborted`].
#[derive(Clone)]
pub struct GroupAbort(Arc<Segment>);

impl GroupAbort {
    /// Aborts the group, with a reason the ranks will report.
    pub fn abort(&self, reason: &str) {
        self.0.abort(reason);
    }
}

/// One rank's membership of a shared-memory group.
///
/// ```
/// use std::time::Duration;
/// use nimbus_train::collective::{Collective, SharedMemoryGroup};
/// let dir = tempfile::tempdir().unwrap();
/// let segment = dir.path().join("group");
/// // Each rank joins from its own process (rank 0 and rank 1 of 2, say);
/// // a group of one is its own mean.
/// let mut group = SharedMemoryGroup::join(&segment, 0, 1, 1 << 20, Duration::from_secs(10)).unwrap();
/// let mut grads = vec![1.5_f32; 1000];
/// group.allreduce_mean(&mut grads).unwrap();
/// assert!(grads.iter().all(|g| *g == 1.5));
/// ```
pub struct SharedMemoryGroup {
    segment: Arc<Segment>,
    rank: usize,
    generation: u64,
    chunk: u64,
    timeout: Duration,
    path: Option<PathBuf>,
}

impl SharedMemoryGroup {
    /// Joins the group whose segment is `path`: rank 0 creates it, the
    /// others wait for it (up to `timeout`). `capacity` is the bytes each
    /// rank's slot holds (longer buffers go through in chunks); `timeout`
    /// also bounds every operation.
    pub fn join(
        path: &Path,
        rank: usize,
        world: usize,
        capacity: usize,
        timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        Self::join_with(path, (rank, world, capacity), timeout, &|| false, |_| {})
    }

    /// [`join`](Self::join) (`shape`: rank, world, capacity) that can be
    /// called off while it forms: it fails as aborted once `cancelled()`
    /// says so while it waits for the segment, and hands `mapped` the
    /// group's abort handle before the first barrier, so an abort reaches
    /// the group while its ranks gather.
    pub fn join_with(
        path: &Path,
        (rank, world, capacity): (usize, usize, usize),
        timeout: Duration,
        cancelled: &dyn Fn() -> bool,
        mapped: impl FnOnce(GroupAbort),
    ) -> Result<Self, CollectiveError> {
        if world == 0 || world > MAX_WORLD {
            return Err(CollectiveError::Setup(format!(
                "a shared-memory group holds 1 to {MAX_WORLD} ranks, not {world}"
            )));
        }
        if rank >= world {
            return Err(CollectiveError::Setup(format!(
                "rank {rank} in a group of {world}"
            )));
        }
        // Slots hold whole f32s and keep the next slot 64-byte aligned.
        let capacity = capacity.max(LINE).div_ceil(LINE) * LINE;
        let len = Segment::len(world, capacity);
        let segment = if rank == 0 {
            create(path, world, capacity, len)?
        } else {
            attach(path, (world, capacity, len), timeout, cancelled)?
        };
        let mut group = SharedMemoryGroup {
            segment: Arc::new(segment),
            rank,
            generation: 0,
            chunk: 0,
            timeout,
            path: (rank == 0).then(|| path.to_path_buf()),
        };
        mapped(group.abort_handle());
        group.barrier()?;
        // Every rank has mapped the segment: its name is no longer needed,
        // and unlinking now means a crash cannot leak it.
        if let Some(path) = group.path.take() {
            let _ = std::fs::remove_file(path);
        }
        Ok(group)
    }

    /// A handle that aborts this group from elsewhere.
    pub fn abort_handle(&self) -> GroupAbort {
        GroupAbort(self.segment.clone())
    }

    fn wait_all(&mut self) -> Result<(), CollectiveError> {
        self.generation += 1;
        let generation = self.generation;
        let segment = &*self.segment;
        segment
            .arrival(self.rank)
            .store(generation, Ordering::Release);
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(reason) = segment.aborted() {
                return Err(CollectiveError::Aborted(reason));
            }
            if (0..segment.world).all(|r| segment.arrival(r).load(Ordering::Acquire) >= generation)
            {
                return Ok(());
            }
            spins += 1;
            if spins < 256 {
                std::hint::spin_loop();
            } else if spins < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
                if start.elapsed() > self.timeout {
                    let missing = (0..segment.world)
                        .filter(|&r| segment.arrival(r).load(Ordering::Acquire) < generation)
                        .collect();
                    return Err(CollectiveError::Timeout {
                        after: self.timeout,
                        missing,
                    });
                }
            }
        }
    }

    fn allreduce(&mut self, values: &mut [f32], scale: Option<f32>) -> Result<(), CollectiveError> {
        let world = self.segment.world;
        let per_chunk = self.segment.capacity / 4;
        for chunk in values.chunks_mut(per_chunk) {
            let len = chunk.len();
            let result = self.segment.area(world + (self.chunk % 2) as usize);
            self.chunk += 1;
            // SAFETY: each rank writes only its own slot until the barrier.
            unsafe {
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), self.segment.area(self.rank), len);
            }
            self.wait_all()?;
            let start = len * self.rank / world;
            let end = len * (self.rank + 1) / world;
            // SAFETY: after the barrier the slots are read-only until the
            // next chunk; this rank alone writes result[start..end].
            unsafe {
                let out = std::slice::from_raw_parts_mut(result.add(start), end - start);
                out.copy_from_slice(std::slice::from_raw_parts(
                    self.segment.area(0).add(start),
                    end - start,
                ));
                for r in 1..world {
                    let slot =
                        std::slice::from_raw_parts(self.segment.area(r).add(start), end - start);
                    for (o, s) in out.iter_mut().zip(slot) {
                        *o += *s;
                    }
                }
                if let Some(scale) = scale {
                    for o in out.iter_mut() {
                        *o *= scale;
                    }
                }
            }
            self.wait_all()?;
            // SAFETY: the result area is complete and not written again
            // before the next-but-one chunk, which needs this rank's arrival.
            unsafe {
                std::ptr::copy_nonoverlapping(result, chunk.as_mut_ptr(), len);
            }
        }
        Ok(())
    }
}

impl Collective for SharedMemoryGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.segment.world
    }

    fn allreduce_mean(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        let scale = 1.0 / self.segment.world as f32;
        self.allreduce(values, Some(scale))
    }

    fn allreduce_sum(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        self.allreduce(values, None)
    }

    fn broadcast(&mut self, values: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        let world = self.segment.world;
        if root >= world {
            return Err(CollectiveError::Invalid(format!(
                "broadcast root {root} in a group of {world}"
            )));
        }
        let per_chunk = self.segment.capacity / 4;
        for chunk in values.chunks_mut(per_chunk) {
            let area = self.segment.area(world + (self.chunk % 2) as usize);
            self.chunk += 1;
            if self.rank == root {
                // SAFETY: only the root writes the area before the barrier.
                unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), area, chunk.len()) };
            }
            self.wait_all()?;
            if self.rank != root {
                // SAFETY: the area is complete after the barrier.
                unsafe { std::ptr::copy_nonoverlapping(area, chunk.as_mut_ptr(), chunk.len()) };
            }
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.wait_all()
    }
}

impl Drop for SharedMemoryGroup {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn create(
    path: &Path,
    world: usize,
    capacity: usize,
    len: usize,
) -> Result<Segment, CollectiveError> {
    let setup = |what: &str, e: std::io::Error| {
        CollectiveError::Setup(format!("{what} {}: {e}", path.display()))
    };
    let temporary = path.with_extension(format!("creating-{}", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(nimbus::library::files::PRIVATE_FILE)
        .open(&temporary)
        .map_err(|e| setup("cannot create", e))?;
    file.set_len(len as u64)
        .map_err(|e| setup("cannot size", e))?;
    // SAFETY: the file is ours until renamed; nobody truncates it while
    // mapped.
    let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| setup("cannot map", e))?;
    let base = map.as_mut_ptr();
    let segment = Segment {
        _map: map,
        base,
        world,
        capacity,
    };
    segment.word(8).store(world as u64, Ordering::Relaxed);
    segment.word(16).store(capacity as u64, Ordering::Relaxed);
    segment.word(0).store(MAGIC, Ordering::Release);
    std::fs::rename(&temporary, path).map_err(|e| setup("cannot publish", e))?;
    Ok(segment)
}

fn attach(
    path: &Path,
    (world, capacity, len): (usize, usize, usize),
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<Segment, CollectiveError> {
    let start = Instant::now();
    loop {
        if cancelled() {
            return Err(CollectiveError::Aborted(format!(
                "called off while waiting for {}",
                path.display()
            )));
        }
        // Rank 0 publishes the segment by renaming it into place, fully
        // initialised, so a file found here is complete.
        if let Ok(file) = OpenOptions::new().read(true).write(true).open(path) {
            let found = file.metadata().map(|m| m.len()).unwrap_or(0);
            if found != len as u64 {
                return Err(CollectiveError::Setup(format!(
                    "{} is {found} bytes, expected {len}: ranks disagree on the group's shape",
                    path.display()
                )));
            }
            // SAFETY: see `create`.
            let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| {
                CollectiveError::Setup(format!("cannot map {}: {e}", path.display()))
            })?;
            let base = map.as_mut_ptr();
            let segment = Segment {
                _map: map,
                base,
                world,
                capacity,
            };
            let header = (
                segment.word(0).load(Ordering::Acquire),
                segment.word(8).load(Ordering::Relaxed),
                segment.word(16).load(Ordering::Relaxed),
            );
            if header != (MAGIC, world as u64, capacity as u64) {
                return Err(CollectiveError::Setup(format!(
                    "{} is not a segment for {world} ranks of {capacity} bytes",
                    path.display()
                )));
            }
            return Ok(segment);
        }
        if start.elapsed() > timeout {
            return Err(CollectiveError::Setup(format!(
                "rank 0 did not create {} within {timeout:?}",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_group(world: usize, capacity: usize, len: usize) -> Vec<Vec<f32>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("group");
        let threads: Vec<_> = (0..world)
            .map(|rank| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut group = SharedMemoryGroup::join(
                        &path,
                        rank,
                        world,
                        capacity,
                        Duration::from_secs(10),
                    )
                    .unwrap();
                    let mut values: Vec<f32> = (0..len).map(|i| (i * (rank + 1)) as f32).collect();
                    group.allreduce_mean(&mut values).unwrap();
                    let mut root = vec![rank as f32; 7];
                    group.broadcast(&mut root, world - 1).unwrap();
                    assert_eq!(root, vec![(world - 1) as f32; 7]);
                    values
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn allreduce_mean_is_identical_on_every_rank_across_chunks() {
        // 1000 values through 256-byte slots: 16 chunks, the last partial.
        let results = run_group(3, 256, 1000);
        let expected: Vec<f32> = (0..1000).map(|i| (i * 6) as f32 / 3.0).collect();
        for values in &results {
            assert_eq!(values, &expected);
        }
    }

    #[test]
    fn a_missing_rank_times_out_naming_it_and_abort_interrupts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("group");
        // Rank 1 never joins: rank 0's join barrier names it.
        let err = SharedMemoryGroup::join(&path, 0, 2, 64, Duration::from_millis(200))
            .err()
            .unwrap();
        assert_eq!(
            err,
            CollectiveError::Timeout {
                after: Duration::from_millis(200),
                missing: vec![1]
            }
        );
        let err = SharedMemoryGroup::join(
            &dir.path().join("other"),
            1,
            2,
            64,
            Duration::from_millis(50),
        )
        .err()
        .unwrap();
        assert!(
            matches!(err, CollectiveError::Setup(ref m) if m.contains("did not create")),
            "{err}"
        );
    }

    #[test]
    fn abort_wakes_a_waiting_rank_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("group");
        let other = {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut group =
                    SharedMemoryGroup::join(&path, 1, 2, 64, Duration::from_secs(10)).unwrap();
                // Rank 1 waits for a barrier rank 0 never enters.
                group.barrier()
            })
        };
        let group = SharedMemoryGroup::join(&path, 0, 2, 64, Duration::from_secs(10)).unwrap();
        group.abort_handle().abort("worker 0 died");
        assert_eq!(
            other.join().unwrap(),
            Err(CollectiveError::Aborted("worker 0 died".into()))
        );
    }
}
