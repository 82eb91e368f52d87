//! Serving objects: reads by chunks (restoring a spilled object when it
//! fits), shared-memory files to map or to stream out, and waits for an
//! object to complete.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::stored::{in_memory, Data, Stored};
use super::ObjectStoreShard;
use crate::cluster::{ObjectId, ObjectLocation};
use crate::object_store::error::ShardError;
use crate::object_store::node::access::may_read;

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
                let job = stored.job.as_deref();
                if let Some(shared) = self.budget.shared_path(msg.id, total, job) {
                    let restore = || {
                        self.budget.make_job_dir(&shared)?;
                        std::fs::copy(&path, &shared)
                    };
                    return match self.budget.making_room(restore) {
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
