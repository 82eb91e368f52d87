//! User binaries uploaded to this node and read back from it, in
//! bounded chunks.

use std::time::Instant;

use actix::prelude::*;

use crate::cluster::BinaryReply;
use crate::wire::{RemoteError, RemoteErrorKind};

use super::NodeManager;
use crate::node::error::BinaryError;

/// Read a chunk of a cached program binary.
#[derive(Message)]
#[rtype(result = "Result<BinaryReply, RemoteError>")]
pub struct ReadBinary {
    /// Hex SHA-256 of the whole binary.
    pub hash: String,
    /// Where the chunk starts.
    pub offset: u64,
    /// At most this many bytes.
    pub len: u64,
}

impl Handler<ReadBinary> for NodeManager {
    type Result = ResponseFuture<Result<BinaryReply, RemoteError>>;

    /// The file is read on the blocking pool, off this actor's thread.
    fn handle(&mut self, msg: ReadBinary, _: &mut Self::Context) -> Self::Result {
        let refused = |e: BinaryError| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string());
        let len = msg.len.min(MAX_BINARY_CHUNK);
        let reader = self.binaries.reader(&msg.hash, msg.offset, len);
        Box::pin(async move {
            let reader = reader.map_err(refused)?;
            let (total, chunk) = tokio::task::spawn_blocking(move || reader.run())
                .await
                .map_err(|e| RemoteError::new(RemoteErrorKind::Internal, e.to_string()))?
                .map_err(refused)?;
            Ok(BinaryReply::Chunk { total, chunk })
        })
    }
}

/// A chunk of a program binary.
#[derive(Message)]
#[rtype(result = "Result<(), RemoteError>")]
pub struct UploadBinary {
    /// Who sends it (each uploader's upload is its own).
    pub uploader: String,
    /// Hex SHA-256 of the whole binary.
    pub hash: String,
    /// Offset of this chunk.
    pub offset: u64,
    /// Whole length.
    pub total: u64,
    /// The bytes.
    pub chunk: Vec<u8>,
}

/// The largest binary chunk a node reads for one request.
const MAX_BINARY_CHUNK: u64 = 16 << 20;

impl Handler<UploadBinary> for NodeManager {
    type Result = ResponseFuture<Result<(), RemoteError>>;

    /// Each chunk's write (and the last one's fsync, hash and publish) runs
    /// on the blocking pool, not on this actor's thread, which heartbeats
    /// and starts workers; a failed write ends the upload.
    fn handle(&mut self, msg: UploadBinary, ctx: &mut Self::Context) -> Self::Result {
        let refused = |e: BinaryError| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string());
        let UploadBinary {
            uploader,
            hash,
            offset,
            total,
            chunk,
        } = msg;
        let write = self
            .binaries
            .receive(&uploader, &hash, offset, total, chunk, Instant::now());
        let me = ctx.address();
        Box::pin(async move {
            let write = write.map_err(refused)?;
            let last = write.is_last();
            let written = tokio::task::spawn_blocking(move || write.run())
                .await
                .map_err(|e| RemoteError::new(RemoteErrorKind::Internal, e.to_string()))?;
            if written.is_err() && !last {
                me.do_send(AbortUpload { uploader, hash });
            }
            written.map_err(refused)
        })
    }
}

/// A chunk of this upload failed to be written: end it.
#[derive(Message)]
#[rtype(result = "()")]
struct AbortUpload {
    uploader: String,
    hash: String,
}

impl Handler<AbortUpload> for NodeManager {
    type Result = ();

    fn handle(&mut self, msg: AbortUpload, _: &mut Self::Context) {
        self.binaries.abort_upload(&msg.uploader, &msg.hash);
    }
}
