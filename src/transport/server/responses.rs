//! Responses going out (step 5 of `mod.rs`): in batches, and a write the
//! peer does not take in time ends the stream, nothing following a
//! partial frame.

use std::time::Duration;

use tokio::sync::mpsc;
use tracing::debug;

use crate::wire::{RemoteError, RemoteErrorKind, Response};

use super::stream::{SendHalf, StreamTask};
use crate::transport::batch::Batch;

/// Writes a stream's responses, several at a time: they gather in a
/// buffer that goes out when the stream's task has no response ready
/// (`flush`), or once it holds `BATCH_BYTES` (64 KiB, `batch.rs`).
pub(super) struct ResponseWriter<S> {
    pub(super) task: StreamTask,
    pub(super) out: Outgoing<S>,
}

impl<S: SendHalf> ResponseWriter<S> {
    pub(super) fn new(task: StreamTask, send: S) -> Self {
        ResponseWriter {
            task,
            out: Outgoing {
                send,
                batch: Batch::default(),
                broken: false,
            },
        }
    }

    /// Adds `response` to the buffer (one the peer's limit refuses is
    /// answered with that error instead); nothing once the stream broke.
    pub(super) async fn push(&mut self, response: &Response) {
        if self.out.broken {
            return;
        }
        let max = self.task.endpoint.config().max_frame_bytes;
        let batch = &mut self.out.batch;
        if let Err(e) = batch.push(response, max) {
            let fallback = Response {
                id: response.id,
                result: Err(RemoteError::new(RemoteErrorKind::Internal, e.to_string())),
            };
            let _ = batch.push(&fallback, max);
        }
        if batch.full() {
            self.flush().await;
        }
    }

    /// The next item of `queue`; when none is waiting, the buffer is
    /// written before waiting for one.
    pub(super) async fn next<T>(&mut self, queue: &mut mpsc::UnboundedReceiver<T>) -> Option<T> {
        match queue.try_recv() {
            Ok(item) => Some(item),
            Err(_) => {
                self.flush().await;
                queue.recv().await
            }
        }
    }

    /// Writes the buffer, within `request_read_timeout`.
    pub(super) async fn flush(&mut self) {
        let timeout = self.task.endpoint.config().request_read_timeout;
        if let Err(e) = self.out.flush(timeout).await {
            debug!(peer = %self.task.peer, "{e}: the response stream is ended");
        }
    }

    /// Writes the buffer and ends the stream.
    pub(super) async fn finish(mut self) {
        self.flush().await;
        if !self.out.broken {
            self.out.send.end().await;
        }
    }
}

/// The bytes of a stream's responses on their way out.
pub(super) struct Outgoing<S> {
    pub(super) send: S,
    pub(super) batch: Batch,
    /// A write failed or was cut off: the stream is ended, and nothing
    /// more goes out on it (after a partial frame, the next one would be
    /// read as its rest).
    pub(super) broken: bool,
}

/// Why a response buffer could not be written.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteFailure {
    /// The stream failed.
    #[error("cannot send a response: {0}")]
    Failed(#[source] std::io::Error),
    /// The peer did not take it in time: it may have taken part of it.
    #[error("the peer did not take a response within {0:?}")]
    TimedOut(Duration),
}

impl<S: SendHalf> Outgoing<S> {
    /// Writes the buffer within `timeout`. A write that fails or is cut
    /// off breaks the stream: it is shut down at once (the peer reads the
    /// end of the stream, after a partial frame if any), and later
    /// buffers are dropped unwritten.
    pub(super) async fn flush(&mut self, timeout: Duration) -> Result<(), WriteFailure> {
        if self.broken || self.batch.is_empty() {
            self.batch.clear();
            return Ok(());
        }
        let write = self.send.write_whole(self.batch.bytes());
        let written = match tokio::time::timeout(timeout, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(WriteFailure::Failed(e)),
            Err(_) => Err(WriteFailure::TimedOut(timeout)),
        };
        self.batch.clear();
        if written.is_err() {
            self.broken = true;
            let _ = tokio::time::timeout(timeout, self.send.end()).await;
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::wire;

    #[tokio::test]
    async fn a_response_write_cut_off_ends_the_stream_after_the_partial_frame() {
        // A peer that reads nothing: 4 KiB fit in the pipe, 64 KiB do not.
        let (send, mut peer) = tokio::io::duplex(4 << 10);
        let mut out = Outgoing {
            send,
            batch: Batch::default(),
            broken: false,
        };
        let max = 1 << 20;
        let large = serde_bytes::ByteBuf::from(vec![1; 64 << 10]);
        out.batch.push(&large, max).unwrap();
        let frame = wire::encode(&large, max).unwrap();
        let timeout = Duration::from_millis(100);
        let cut = out.flush(timeout).await;
        assert!(matches!(cut, Err(WriteFailure::TimedOut(_))), "{cut:?}");
        // The next response must not follow the partial one.
        out.batch.push(&"next response", max).unwrap();
        out.flush(timeout).await.unwrap();
        assert!(out.batch.is_empty());
        // The peer reads the partial frame, then the end of the stream
        // (the writer is still alive: without the shutdown this would wait
        // for more).
        let mut read = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), peer.read_to_end(&mut read))
            .await
            .expect("the stream ended")
            .unwrap();
        assert!(
            !read.is_empty() && read.len() < frame.len(),
            "{}",
            read.len()
        );
        assert!(frame.starts_with(&read), "only the partial frame");
    }
}
