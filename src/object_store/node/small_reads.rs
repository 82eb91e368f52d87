//! Small objects read without a hop to their shard's thread.
//!
//! A read of a small object by another process of the host (its first
//! `get`) is a round trip to the node; served by the object's shard, it
//! also crosses to the shard's thread and back, two wake-ups that cost as
//! much as the rest of the request on a virtual machine. The shards share
//! the bytes of their small complete objects with the node's request
//! handler instead:
//!
//! 1. When an object of at most [`SMALL_READ_BYTES`] becomes complete in
//!    memory (its last chunk, or restored from disk), its shard shares its
//!    bytes here ([`SmallReads::share`]): the same allocation, not a copy.
//! 2. Before an object leaves memory (freed, dropped, spilled, abandoned,
//!    replaced), its shard withdraws it ([`SmallReads::withdraw`]), on the
//!    shard's thread, before the change is seen by anyone else.
//! 3. A `ReadObject` that records no copy (`copy_at` unset) is answered
//!    from here when the object is shared ([`SmallReads::read`]) and the
//!    reader may read it (a worker, its own job's objects only); anything
//!    else (not here, freed, large, on disk, a read that records a copy,
//!    another job's object) goes to the shard, which says why it cannot be
//!    read.
//! 4. A read answered here marks the object read. Before it chooses what
//!    to spill under memory pressure (least recently used first), the
//!    shard counts each marked object as used then and clears the mark
//!    ([`SmallReads::was_read`]), as its own reads count.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

use crate::cluster::ObjectId;

/// The largest object shared (step 1): its copy into a reply (64 KiB,
/// a few microseconds) runs on the request's thread.
pub(super) const SMALL_READ_BYTES: usize = 64 << 10;

/// The bytes of the node's small complete objects kept in memory.
#[derive(Debug, Default)]
pub(super) struct SmallReads(DashMap<ObjectId, Shared>);

/// One shared object.
#[derive(Debug)]
struct Shared {
    bytes: Arc<Vec<u8>>,
    /// The job whose workers may read it (`None`: not known).
    job: Option<Arc<str>>,
    /// Read here since its shard last looked (step 4).
    read: AtomicBool,
}

impl SmallReads {
    /// Step 1: shares the bytes of complete object `id` of `job`, if
    /// small enough.
    pub(super) fn share(&self, id: ObjectId, bytes: &Arc<Vec<u8>>, job: Option<Arc<str>>) {
        if bytes.len() <= SMALL_READ_BYTES {
            let bytes = bytes.clone();
            let read = AtomicBool::new(false);
            self.0.insert(id, Shared { bytes, job, read });
        }
    }

    /// Step 2: object `id` is about to leave memory.
    pub(super) fn withdraw(&self, id: ObjectId) {
        self.0.remove(&id);
    }

    /// Step 3: `len` bytes of object `id` from `offset` (cut at its end),
    /// if it is shared and the reader may read it: a worker confined to
    /// job `confined` reads only that job's objects (its shard says why
    /// not).
    pub(super) fn read(
        &self,
        id: ObjectId,
        offset: u64,
        len: u64,
        confined: Option<&str>,
    ) -> Option<Vec<u8>> {
        let shared = self
            .0
            .get(&id)
            .filter(|shared| super::may_read(id, shared.job.as_deref(), confined).is_ok())?;
        shared.read.store(true, Ordering::Relaxed);
        let bytes = &shared.bytes;
        let total = bytes.len();
        let start = usize::try_from(offset).map_or(total, |o| o.min(total));
        let end = usize::try_from(len).map_or(total, |l| start.saturating_add(l).min(total));
        Some(bytes[start..end].to_vec())
    }

    /// Step 4: whether object `id` was read here since the last time its
    /// shard asked.
    pub(super) fn was_read(&self, id: ObjectId) -> bool {
        self.0
            .get(&id)
            .is_some_and(|shared| shared.read.swap(false, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_object_is_read_in_its_bounds_until_withdrawn() {
        let reads = SmallReads::default();
        let id = ObjectId(7);
        assert_eq!(reads.read(id, 0, 8, None), None);
        reads.share(id, &Arc::new(vec![1, 2, 3, 4]), Some(Arc::from("j1")));
        assert!(!reads.was_read(id));
        assert_eq!(reads.read(id, 0, 8, None), Some(vec![1, 2, 3, 4]));
        assert!(reads.was_read(id), "a read marks it");
        assert!(!reads.was_read(id), "asking clears the mark");
        assert_eq!(reads.read(id, 1, 2, None), Some(vec![2, 3]));
        assert_eq!(reads.read(id, 9, 2, None), Some(vec![]));
        assert_eq!(reads.read(id, 2, u64::MAX, None), Some(vec![3, 4]));
        assert_eq!(reads.read(id, 0, 8, Some("j1")), Some(vec![1, 2, 3, 4]));
        assert_eq!(reads.read(id, 0, 8, Some("j2")), None, "another job's");
        reads.withdraw(id);
        assert_eq!(reads.read(id, 0, 8, None), None);
    }

    #[test]
    fn a_larger_object_is_left_to_its_shard() {
        let reads = SmallReads::default();
        reads.share(ObjectId(1), &Arc::new(vec![0; SMALL_READ_BYTES + 1]), None);
        assert_eq!(reads.read(ObjectId(1), 0, 1, None), None);
    }
}
