//! Pulls (step 2 of the node store's protocol, `mod.rs`): this node
//! copying another node's object, over a bulk stream into its
//! shared-memory file or over QUIC in chunks, and the other side, a bulk
//! stream out of this node's object.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::shard::{Append, Await, Awaited, Begin, Begun, OpenStream, Read, Seal};
use super::{flatten, lost_or_failed, ready, NodeObjectStore};
use crate::client;
use crate::cluster::{ObjectId, ObjectLocation, ObjectReply, ObjectRequest};
use crate::object_store::transfer::{call, read_chunks};
use crate::transport::{BulkStream, Connection, RequestOptions, MAX_STREAM_BYTES};

/// How long after a failed bulk dial to an owner its objects come over
/// QUIC without trying TCP again (step 2).
pub const BULK_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The bytes of each shard read of a bulk stream out of an object not in
/// a shared-memory file (step 2).
pub(crate) const STREAM_CHUNK_BYTES: usize = 1 << 20;

/// What a bulk stream out of this node carries: an object's `size`
/// bytes, read for the node caching a copy (`copy_at`).
pub(super) struct Streamed {
    pub(super) id: ObjectId,
    pub(super) size: u64,
    pub(super) copy_at: Option<ObjectLocation>,
}

impl NodeObjectStore {
    /// Writes the bytes a bulk stream was granted for (step 2) and ends
    /// it, on a thread of its own: straight from the object's
    /// shared-memory file (pinned against reuse until the stream ends),
    /// else by shard reads. A failed read ends it early.
    pub(super) async fn stream_out(self, what: Streamed, stream: BulkStream) {
        let Streamed { id, size, copy_at } = what;
        let shard = self.shard(id).clone();
        let open = OpenStream {
            id,
            copy_at: copy_at.clone(),
        };
        let opened = shard.send(open).await.ok().flatten();
        let runtime = tokio::runtime::Handle::current();
        let peer = stream.peer();
        let sent = stream.on_own_thread(move |stream| {
            match opened {
                Some((file, _pin)) => stream.write_from_file(&file, 0, size)?,
                None => {
                    for offset in (0..size).step_by(STREAM_CHUNK_BYTES) {
                        let read = Read {
                            id,
                            offset,
                            len: STREAM_CHUNK_BYTES as u64,
                            copy_at: copy_at.clone(),
                            confined: None,
                        };
                        match flatten(runtime.block_on(shard.send(read))) {
                            Ok(chunk) => stream.write_all(&chunk)?,
                            Err(e) => return Ok(Err(e.message)),
                        }
                    }
                }
            }
            stream.finish().map(Ok)
        });
        match sent.await.and_then(|sent| sent) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("object {id}: bulk stream to {peer} ended early: {e}"),
            Err(e) => tracing::debug!("object {id}: {e}"),
        }
    }

    /// Makes the object present here, fetching it from `owner` in chunks
    /// unless it is here or on its way.
    pub(super) async fn pull(
        &self,
        id: ObjectId,
        owner: ObjectLocation,
        wait: Duration,
    ) -> ObjectReply {
        if owner.node == self.me.node {
            return self.await_object(id, wait).await;
        }
        if let Ok(Awaited::Ready { size, job }) = self.shard(id).send(Await(id)).await {
            return ready(size, job.as_deref());
        }
        let lost = |e: String| {
            lost_or_failed(format!(
                "object {id} is lost: its owner, node {owner}, cannot be reached: {e}"
            ))
        };
        let connection = match self
            .endpoint
            .connect(owner.address, Some(&owner.node))
            .await
        {
            Ok(connection) => connection,
            Err(e) => return lost(e.to_string()),
        };
        let ask = ObjectRequest::AwaitObject {
            id,
            wait_ms: wait.as_millis() as u64,
        };
        let options = RequestOptions::control().with_deadline(wait + Duration::from_secs(10));
        let (size, job) = match client::call(&connection, ask, options).await {
            Ok(ObjectReply::Ready { size, job }) => (size, job),
            Ok(ObjectReply::NotReady) => return ObjectReply::NotReady,
            Ok(failed @ ObjectReply::Failed { .. }) => return failed,
            Ok(other) => return lost(format!("unexpected reply {other:?}")),
            Err(e) => return lost(e.to_string()),
        };
        let begin = Begin {
            id,
            total: size,
            holder: None,
            contains: Vec::new(),
            job: job.as_deref().map(Arc::from),
            first: None,
        };
        let began = std::time::Instant::now();
        let shared = match self.begin(begin).await {
            Ok(Begun::Present) => return ready(size, job.as_deref()),
            Ok(Begun::InProgress(done)) => {
                return match done.await {
                    Ok(()) => ready(size, job.as_deref()),
                    Err(_) => {
                        lost_or_failed(format!("the transfer of object {id} from {owner} failed"))
                    }
                }
            }
            Ok(Begun::Fresh { shared }) => shared,
            Ok(Begun::NoRoom { short, .. }) => {
                return lost_or_failed(format!(
                    "no room for a copy of object {id}: {short} bytes short"
                ))
            }
            Err(e) => return lost_or_failed(e.message),
        };
        let file = self.budget.shared_path(id, size, job.as_deref());
        let streamed = match file.filter(|_| shared) {
            Some(file) => self.pull_stream(&connection, &owner, id, size, file).await,
            None => Err("it is kept in memory, not in a shared-memory file".to_string()),
        };
        let (path, received) = match streamed {
            Ok(inode) => {
                let seal = Seal {
                    id,
                    inode: Some(inode),
                };
                let sealed = flatten(self.shard(id).send(seal).await);
                ("tcp", sealed.map_err(|e| e.message))
            }
            Err(e) => {
                tracing::debug!(
                    "object {id}: no bulk stream from {owner} ({e}); it comes over QUIC"
                );
                ("quic", self.pull_chunks(&connection, id, size).await)
            }
        };
        if let Err(e) = received {
            self.abort(id).await;
            // The owner answered: the copy failed on its way or here (a
            // full tmpfs, say), which the error names.
            return lost_or_failed(format!(
                "the copy of object {id} from node {owner} failed: {e}"
            ));
        }
        tracing::debug!(
            "object {id}: {size} bytes from {owner} over {path} in {:?}",
            began.elapsed()
        );
        metrics::counter!("nimbus_object_transfers_total", "path" => path).increment(1);
        metrics::counter!("nimbus_object_transfer_bytes_total", "path" => path).increment(size);
        ready(size, job.as_deref())
    }

    /// Step 2 over QUIC: object `id`, `size` bytes, from `node` in chunks.
    pub(super) async fn pull_chunks(
        &self,
        node: &Connection,
        id: ObjectId,
        size: u64,
    ) -> Result<(), String> {
        let mut offset = 0;
        let mut chunks = std::pin::pin!(read_chunks(node, id, size, Some(self.me.clone())));
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            let len = chunk.len() as u64;
            let append = Append { id, offset, chunk };
            offset += len;
            flatten(self.shard(id).send(append).await).map_err(|e| e.message)?;
        }
        Ok(())
    }

    /// Step 2's bulk stream: object `id` from `owner` (reached over
    /// `node`), written straight into its shared-memory `file` here, on a
    /// thread of its own; the inode written, for the seal. A failure leaves the object to be received over QUIC, from
    /// its start: nothing was counted yet. An owner whose bulk listener
    /// could not be dialled is not dialled again for
    /// [`BULK_RETRY_AFTER`].
    pub(super) async fn pull_stream(
        &self,
        node: &Connection,
        owner: &ObjectLocation,
        id: ObjectId,
        size: u64,
        file: std::path::PathBuf,
    ) -> Result<u64, String> {
        if size > MAX_STREAM_BYTES {
            return Err(format!(
                "it is larger than one bulk stream carries ({MAX_STREAM_BYTES} bytes)"
            ));
        }
        let ip = owner.address.ip();
        if let Some(failed) = self.bulk_failed.get(&ip) {
            if failed.elapsed() < BULK_RETRY_AFTER {
                return Err(format!(
                    "its bulk listener could not be dialled {:?} ago",
                    failed.elapsed()
                ));
            }
        }
        // Opened before the round trip: the file this pull began, even if
        // it is abandoned meanwhile and another pull begins a new one at
        // the same path (whose seal then refuses this inode).
        let opened = std::fs::OpenOptions::new().write(true).open(&file);
        let file = opened.map_err(|e| format!("cannot open {}: {e}", file.display()))?;
        let inode = {
            use std::os::unix::fs::MetadataExt;
            file.metadata().map_err(|e| e.to_string())?.ino()
        };
        let ask = ObjectRequest::StreamObject {
            id,
            size,
            copy_at: Some(self.me.clone()),
        };
        let (port, ticket) = match call(node, ask, RequestOptions::control()).await {
            Ok(ObjectReply::Stream { port, ticket }) => (port, ticket),
            Ok(other) => return Err(format!("unexpected reply {other:?}")),
            Err(e) => return Err(e.to_string()),
        };
        let addr = std::net::SocketAddr::new(ip, port);
        let stream = match self.endpoint.bulk_connect(addr, ticket).await {
            Ok(stream) => stream,
            Err(e) => {
                self.bulk_failed.insert(ip, std::time::Instant::now());
                return Err(e.to_string());
            }
        };
        self.bulk_failed.remove(&ip);
        let received = stream.on_own_thread(move |stream| stream.read_into_file(&file, 0, size));
        match received.await.and_then(|received| received) {
            Ok(()) => Ok(inode),
            Err(e) => Err(e.to_string()),
        }
    }
}
