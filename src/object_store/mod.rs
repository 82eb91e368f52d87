//! The object store: immutable values put once and read anywhere in the
//! cluster by reference, counted across the cluster and freed when no
//! reference remains.
//!
//! A process puts into its *home* node's store (a worker's own node; the
//! head for a driver), which then *owns* the object: it keeps the primary
//! copy and counts the references to it (`process/refs.rs`). `get` asks the
//! home node to pull the object from its owner (once: the copy is cached there,
//! and concurrent pulls of one object share one transfer), then reads it
//! from the home node in chunks into a buffer allocated once. A node short
//! of memory spills its least recently used objects to disk and restores
//! them when read.
//!
//! A small object without references (64 KiB at most) is kept by the
//! process that put it and reaches its node in the background, ahead of
//! any message carrying its reference; [`flush`] waits for it (for tools
//! that look at the store itself).
//!
//! Objects of [`SHARED_MIN`] bytes or more live in shared-memory files
//! (`/dev/shm`) at their node: a process on the same host writes a put in
//! place and maps a get ([`ObjectBytes`]), with no copy through the
//! network stack; processes elsewhere use the chunked transfers.
//!
//! Invariants: objects are immutable once complete; a transfer that fails
//! leaves nothing behind; nothing still referenced is freed. The steps
//! and constants are in the module docs of `process/mod.rs` (put, get,
//! wait), `process/refs.rs` (the references a process holds),
//! `node/mod.rs` (pulls, spilling, frees), `node/refcount.rs` (the
//! counting) and `node/shard/` (memory, shared-memory files, disk).
//!
//! The code is in two halves: the process side (`process/`: what runs in
//! the calling process) and the node side (`node/`: the store inside each
//! node process, its shards on threads of their own), with the errors
//! (`error.rs`) and the chunked transfers (`transfer.rs`: the chunk size,
//! the host id, chunked reads) they share; the wire types are in
//! `crate::cluster`'s `objects.rs`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nimbus::object_store::ObjectStoreError> {
//! let weights = nimbus::object_store::put(&vec![0.5f32; 1024]).await?;
//! // Pass `weights` (a small handle) inside messages; read it anywhere:
//! let back: Vec<f32> = nimbus::object_store::get(&weights).await?;
//! // The object is freed once no process holds a reference any more.
//! drop(weights);
//! # Ok(()) }
//! ```

mod error;
mod node;
mod process;
mod transfer;

pub use error::{ObjectStoreError, ShardError};
pub use node::{
    Budget, HeadEvents, NodeObjectStore, ObjectStoreShard, ARRIVAL_TIMEOUT, BULK_RETRY_AFTER,
    SHARED_MIN,
};
pub(crate) use process::refs::start;
pub use process::refs::{flush, held_here};
pub(crate) use process::{fetch, refs, store};
pub use process::{
    get, get_bytes, get_timeout, put, put_bytes, put_bytes_with, wait, ObjectBytes, ObjectRef,
    RawBytes, DEFAULT_GET_TIMEOUT,
};
pub use transfer::{CHUNK_BYTES, MAX_OBJECT_WAIT};
