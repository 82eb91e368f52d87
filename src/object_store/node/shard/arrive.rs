//! Receiving objects: a put, a task's result or a pull begins an object,
//! appends its chunks (or writes its shared-memory file in place) and
//! seals it; an object that gets no bytes for the arrival timeout is
//! abandoned; a failed task's object fails.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::files::{create_copy_file, reserve_shared};
use super::stored::{in_memory, Data, Stored};
use super::ObjectStoreShard;
use crate::cluster::{ContainedRef, ObjectId, RefHolder};
use crate::object_store::error::ShardError;

/// How often arriving objects are checked for abandonment: a quarter of
/// the arrival timeout, within these bounds.
pub(super) const ARRIVAL_CHECK_MIN: Duration = Duration::from_millis(100);
pub(super) const ARRIVAL_CHECK_MAX: Duration = Duration::from_secs(5);

impl ObjectStoreShard {
    /// Abandons the objects that got no bytes for the arrival timeout
    /// (their putter stopped or vanished half-way): a primary fails, with
    /// the reason, for whoever waits or reads it, and may be put again; a
    /// cached copy is dropped (a later pull starts over). Either way its
    /// memory and file are given back. An object a process of this host
    /// writes in place counts its file's modification time as bytes.
    pub(super) fn expire_arrivals(&mut self, now: Instant) {
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
        let job = msg.job.as_deref();
        let shared_path = self
            .budget
            .shared_path(msg.id, msg.total, job)
            .filter(|path| match self.budget.make_job_dir(path) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "cannot make {}'s directory: {e}; keeping the object in the node's memory",
                        path.display()
                    );
                    false
                }
            });
        let reused = shared_path
            .as_ref()
            .and_then(|path| self.budget.reuse_spare(path, msg.total, job));
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
                let path = self
                    .budget
                    .shared_path(msg.id, stored.total, job.as_deref());
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
        let (Data::ArrivingShared { file, .. }, Some(path)) = (
            &stored.data,
            self.budget
                .shared_path(id, stored.total, stored.job.as_deref()),
        ) else {
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
