//! Reading frames off a stream: a QUIC stream's ([`Plain`]), or a
//! same-host socket's, whose large frames arrive in shared memory
//! ([`LocalFrames`], `shm_ring.rs`). Readers ask for a frame's length
//! first (to charge it to their budget before taking its bytes), then for
//! its body.

use std::future::Future;
use std::ops::Deref;

use tokio::io::{AsyncRead, AsyncReadExt, BufReader};
use tokio::net::unix::OwnedReadHalf;

use crate::wire::frame::{body_len, LENGTH_PREFIX_BYTES};
use crate::wire::WireError;

use super::frame_io;
use super::shm_ring::{Region, RingReader, MARKER, MARKER_BYTES};

/// A source of frames.
pub(super) trait ReadFrames: Send {
    /// The next frame's body length, checked against `max`;
    /// [`WireError::Empty`] when the stream ended cleanly before it.
    fn read_len(&mut self, max: usize) -> impl Future<Output = Result<usize, WireError>> + Send;

    /// The body of the frame whose length [`read_len`](Self::read_len)
    /// gave.
    fn read_body(
        &mut self,
        len: usize,
    ) -> impl Future<Output = Result<Frame<'_>, WireError>> + Send;
}

/// A frame's body: received into this process, or read in place from a
/// ring, whose region is released once its last frame is dropped.
pub(super) enum Frame<'a> {
    Owned(Vec<u8>),
    Shared {
        bytes: &'a [u8],
        /// The ring and region to release when this is dropped, if it is
        /// the region's last frame.
        last_of: Option<(&'a RingReader, &'a Region)>,
    },
}

impl Deref for Frame<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Frame::Owned(bytes) => bytes,
            Frame::Shared { bytes, .. } => bytes,
        }
    }
}

impl Drop for Frame<'_> {
    fn drop(&mut self) {
        if let Frame::Shared {
            last_of: Some((ring, region)),
            ..
        } = self
        {
            ring.release(region);
        }
    }
}

/// Frames off a byte stream, each received into this process.
pub(super) struct Plain<R>(pub(super) R);

impl<R: AsyncRead + Unpin + Send> ReadFrames for Plain<R> {
    async fn read_len(&mut self, max: usize) -> Result<usize, WireError> {
        frame_io::read_prefix(&mut self.0, max).await
    }

    async fn read_body(&mut self, len: usize) -> Result<Frame<'_>, WireError> {
        frame_io::read_body_exact(&mut self.0, len)
            .await
            .map(Frame::Owned)
    }
}

/// What a same-host socket reads ahead: a small frame is one system call.
const READ_BUFFER: usize = 64 << 10;

/// The frames of a same-host socket (`shm_ring.rs`, step 3).
pub(super) struct LocalFrames {
    socket: BufReader<OwnedReadHalf>,
    ring: RingReader,
    /// The region being read, while it has frames left or its last one is
    /// out.
    region: Option<Region>,
}

impl LocalFrames {
    pub(super) fn new(socket: OwnedReadHalf, ring: RingReader) -> Self {
        LocalFrames {
            socket: BufReader::with_capacity(READ_BUFFER, socket),
            ring,
            region: None,
        }
    }
}

impl ReadFrames for LocalFrames {
    async fn read_len(&mut self, max: usize) -> Result<usize, WireError> {
        if self.region.as_ref().is_some_and(Region::done) {
            self.region = None;
        }
        if self.region.is_none() {
            let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
            match self.socket.read_exact(&mut prefix).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(WireError::Empty)
                }
                Err(e) => return Err(e.into()),
            }
            if u32::from_be_bytes(prefix) != MARKER {
                return body_len(prefix, max);
            }
            let mut rest = [0u8; MARKER_BYTES - LENGTH_PREFIX_BYTES];
            self.socket
                .read_exact(&mut rest)
                .await
                .map_err(|_| WireError::Truncated {
                    expected: MARKER_BYTES,
                    received: LENGTH_PREFIX_BYTES,
                })?;
            self.region = Some(self.ring.region(rest)?);
        }
        // The frame is read here only to learn its length: `read_body`
        // takes it.
        let Some(mut peek) = self.region else {
            return Err(WireError::Empty);
        };
        self.ring.next_frame(&mut peek, max).map(<[u8]>::len)
    }

    async fn read_body(&mut self, len: usize) -> Result<Frame<'_>, WireError> {
        let Some(region) = self.region.as_mut() else {
            return frame_io::read_body_exact(&mut self.socket, len)
                .await
                .map(Frame::Owned);
        };
        let bytes = self.ring.next_frame(region, usize::MAX)?;
        debug_assert_eq!(bytes.len(), len);
        let region = &*region;
        Ok(Frame::Shared {
            bytes,
            last_of: region.done().then_some((&self.ring, region)),
        })
    }
}
