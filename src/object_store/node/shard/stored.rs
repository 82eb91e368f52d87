//! One object of a shard: where its bytes are, who owns and waits for
//! it, and when it was last used.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::files::TmpfsClaim;
use super::SmallReads;
use crate::cluster::{ContainedRef, ObjectId, ObjectLocation, ObjectState};

/// Where an object's bytes are.
pub(super) enum Data {
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
pub(super) struct Stored {
    pub(super) total: u64,
    pub(super) data: Data,
    /// Owned here (false: a cached copy of another node's object); its
    /// references are counted in the shard's [`RefCounts`].
    pub(super) primary: bool,
    /// The job whose workers may read it (`None`: not known; only drivers,
    /// the CLI and nodes read it).
    pub(super) job: Option<Arc<str>>,
    pub(super) contains: Vec<ContainedRef>,
    /// Nodes caching a copy of this primary.
    pub(super) copies: Vec<ObjectLocation>,
    /// Who waits for it to complete (or fail).
    pub(super) waiting: Vec<oneshot::Sender<()>>,
    pub(super) last_used: u64,
    /// When its last bytes arrived (or it began).
    pub(super) touched: Instant,
    /// It stopped arriving and failed: a put of it may begin again.
    pub(super) abandoned: bool,
    /// A process was given its shared-memory file to map (`Open`): the
    /// file is never reused.
    pub(super) mapped: bool,
    /// Shared with each bulk stream out reading its shared-memory file
    /// (`OpenStream`) until the stream ends: while one does, the file is
    /// not reused, nor cut when removed (the stream reads on from it).
    pub(super) streaming: Arc<()>,
}

impl Stored {
    pub(super) fn new(total: u64, data: Data, primary: bool) -> Self {
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
    pub(super) fn read_for(&mut self, tick: u64, copy_at: Option<ObjectLocation>) {
        self.last_used = tick;
        if let Some(copy) = copy_at.filter(|_| self.primary) {
            if !self.copies.contains(&copy) {
                self.copies.push(copy);
            }
        }
    }

    /// Whether a process maps its shared-memory file or a bulk stream
    /// reads it: the file may then be removed, never reused or cut.
    pub(super) fn held_open(&self) -> bool {
        self.mapped || Arc::strong_count(&self.streaming) > 1
    }

    pub(super) fn complete(&self) -> bool {
        matches!(self.data, Data::Memory(_) | Data::Shared(_) | Data::Spilled)
    }

    pub(super) fn in_memory(&self) -> u64 {
        match self.data {
            Data::Arriving(_) | Data::ArrivingShared { .. } | Data::Memory(_) | Data::Shared(_) => {
                self.total
            }
            _ => 0,
        }
    }

    pub(super) fn state(&self) -> ObjectState {
        match self.data {
            Data::Arriving(_) | Data::ArrivingShared { .. } => ObjectState::Arriving,
            Data::Memory(_) => ObjectState::InMemory,
            Data::Shared(_) => ObjectState::SharedMemory,
            Data::Spilled => ObjectState::Spilled,
            Data::Failed(_) => ObjectState::Failed,
        }
    }
}

/// Object `id`'s complete `bytes`, kept in memory and shared with the
/// node's small reads (which take them if small enough), for `job`'s
/// workers to read.
pub(super) fn in_memory(
    small: &SmallReads,
    id: ObjectId,
    bytes: Vec<u8>,
    job: &Option<Arc<str>>,
) -> Data {
    let bytes = Arc::new(bytes);
    small.share(id, &bytes, job.clone());
    Data::Memory(bytes)
}
