//! `ObjectStoreShard`: a share of one node's objects, in memory.
//!
//! Objects arrive in chunks (from a put or a pull) and are readable once
//! complete. Every shard of a node draws on one memory budget; a new object
//! that does not fit is refused with the numbers, never half-stored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::cluster::ObjectId;

/// Bytes a node's store may hold, shared by its shards.
#[derive(Debug)]
pub struct Budget {
    capacity: u64,
    used: AtomicU64,
}

impl Budget {
    /// A budget of `capacity` bytes.
    pub fn new(capacity: u64) -> Arc<Self> {
        Arc::new(Budget {
            capacity,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes in use.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes allowed.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn take(&self, bytes: u64) -> Result<(), String> {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + bytes <= self.capacity).then_some(used + bytes)
            })
            .map(|_| ())
            .map_err(|used| {
                format!(
                    "the object store is full: an object of {bytes} bytes does not fit in the {} of {} bytes free (--object-store-memory)",
                    self.capacity - used,
                    self.capacity
                )
            })
    }
}

/// One object: its bytes so far, and who waits for it to complete.
struct Stored {
    bytes: Vec<u8>,
    total: u64,
    waiting: Vec<oneshot::Sender<()>>,
}

impl Stored {
    fn complete(&self) -> bool {
        self.bytes.len() as u64 == self.total
    }
}

/// A share of a node's objects.
pub struct ObjectStoreShard {
    objects: HashMap<ObjectId, Stored>,
    budget: Arc<Budget>,
}

impl ObjectStoreShard {
    /// A shard drawing on `budget`.
    pub fn new(budget: Arc<Budget>) -> Self {
        ObjectStoreShard {
            objects: HashMap::new(),
            budget,
        }
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
}

/// Start receiving an object of `total` bytes.
#[derive(Message)]
#[rtype(result = "Result<Begun, String>")]
pub struct Begin {
    /// The object.
    pub id: ObjectId,
    /// Its size.
    pub total: u64,
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

/// Drop an object whose transfer failed.
#[derive(Message)]
#[rtype(result = "()")]
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
}

/// Objects of this shard: (id, size, complete).
#[derive(Message)]
#[rtype(result = "Vec<(ObjectId, u64, bool)>")]
pub struct List;

impl Handler<Begin> for ObjectStoreShard {
    type Result = Result<Begun, String>;

    fn handle(&mut self, msg: Begin, _: &mut Self::Context) -> Self::Result {
        if let Some(stored) = self.objects.get_mut(&msg.id) {
            if stored.complete() {
                return Ok(Begun::Present);
            }
            let (tx, rx) = oneshot::channel();
            stored.waiting.push(tx);
            return Ok(Begun::InProgress(rx));
        }
        self.budget.take(msg.total)?;
        let stored = Stored {
            bytes: Vec::with_capacity(msg.total as usize),
            total: msg.total,
            waiting: Vec::new(),
        };
        self.objects.insert(msg.id, stored);
        Ok(Begun::Fresh)
    }
}

impl Handler<Append> for ObjectStoreShard {
    type Result = Result<(), String>;

    fn handle(&mut self, msg: Append, _: &mut Self::Context) -> Self::Result {
        let stored = self
            .objects
            .get_mut(&msg.id)
            .ok_or_else(|| format!("object {} is not being received", msg.id))?;
        let have = stored.bytes.len() as u64;
        if msg.offset != have || have + msg.chunk.len() as u64 > stored.total {
            return Err(format!(
                "chunk at {} does not follow the {have} bytes received of {}",
                msg.offset, stored.total
            ));
        }
        stored.bytes.extend_from_slice(&msg.chunk);
        if stored.complete() {
            for waiter in stored.waiting.drain(..) {
                let _ = waiter.send(());
            }
        }
        Ok(())
    }
}

impl Handler<Abort> for ObjectStoreShard {
    type Result = ();

    fn handle(&mut self, Abort(id): Abort, _: &mut Self::Context) {
        if let Some(stored) = self.objects.get(&id).filter(|s| !s.complete()) {
            self.budget.used.fetch_sub(stored.total, Ordering::Relaxed);
            self.objects.remove(&id);
        }
    }
}

impl Handler<Read> for ObjectStoreShard {
    type Result = Result<Vec<u8>, String>;

    fn handle(&mut self, msg: Read, _: &mut Self::Context) -> Self::Result {
        let stored = self
            .objects
            .get(&msg.id)
            .filter(|s| s.complete())
            .ok_or_else(|| format!("object {} is not here", msg.id))?;
        let start = (msg.offset as usize).min(stored.bytes.len());
        let end = (start + msg.len as usize).min(stored.bytes.len());
        Ok(stored.bytes[start..end].to_vec())
    }
}

impl Handler<List> for ObjectStoreShard {
    type Result = MessageResult<List>;

    fn handle(&mut self, _: List, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.objects
                .iter()
                .map(|(id, s)| (*id, s.total, s.complete()))
                .collect(),
        )
    }
}
