//! Frames read off and written to async streams: the wire format's
//! frames (`crate::wire`'s `frame.rs`: a 4-byte big-endian length, then
//! the body) on a QUIC stream or a socket. A reader's buffer grows with
//! what arrives, never with what a length prefix claims.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::wire::frame::{body_len, LENGTH_PREFIX_BYTES};
use crate::wire::WireError;

/// Reads one frame body from `reader`, refusing bodies over `max` bytes.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Vec<u8>, WireError> {
    let len = read_prefix(reader, max).await?;
    read_body_exact(reader, len).await
}

/// Reads a frame's length prefix and checks it against `max`; returns the
/// body's length. [`WireError::Empty`]: the stream ended before it.
pub(super) async fn read_prefix<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<usize, WireError> {
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    let got = read_up_to(reader, &mut prefix).await?;
    match got {
        0 => Err(WireError::Empty),
        LENGTH_PREFIX_BYTES => body_len(prefix, max),
        _ => Err(WireError::Truncated {
            expected: LENGTH_PREFIX_BYTES,
            received: got,
        }),
    }
}

/// Reads a frame body of `len` bytes (after [`read_prefix`]).
pub(super) async fn read_body_exact<R: AsyncRead + Unpin>(
    reader: &mut R,
    len: usize,
) -> Result<Vec<u8>, WireError> {
    let body = read_body(reader, len).await?;
    if body.len() < len {
        return Err(WireError::Truncated {
            expected: len,
            received: body.len(),
        });
    }
    Ok(body)
}

/// The most a frame's buffer is given before its bytes arrive.
const PREALLOCATE_MAX: usize = 1 << 20;

/// Reads up to `len` bytes. The buffer grows with what arrives, not with
/// what the length prefix claims: a peer cannot make a node hold 16 MiB
/// per open stream by sending four bytes.
async fn read_body<R: AsyncRead + Unpin>(reader: &mut R, len: usize) -> Result<Vec<u8>, WireError> {
    let mut body = Vec::with_capacity(len.min(PREALLOCATE_MAX));
    reader.take(len as u64).read_to_end(&mut body).await?;
    Ok(body)
}

/// Writes an already encoded frame (see [`crate::wire::encode`]).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &[u8],
) -> Result<(), WireError> {
    writer.write_all(frame).await?;
    Ok(())
}

/// Fills `buf` unless the stream ends first; returns the bytes read.
async fn read_up_to<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut [u8],
) -> Result<usize, WireError> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = reader.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{decode, encode};

    #[tokio::test]
    async fn a_frame_claiming_more_than_it_sends_holds_only_what_arrived() {
        let mut stream: &[u8] = &[7u8; 10];
        let body = read_body(&mut stream, 16 << 20).await.unwrap();
        assert_eq!(body.len(), 10);
        assert!(body.capacity() <= PREALLOCATE_MAX, "{}", body.capacity());
        let mut frame = (16u32 << 20).to_be_bytes().to_vec();
        frame.extend([7u8; 10]);
        let refused = read_frame(&mut &frame[..], 16 << 20).await.unwrap_err();
        assert!(
            matches!(refused, WireError::Truncated { received: 10, .. }),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn frame_round_trips() {
        let frame = encode(&vec![1u32, 2, 3], 1024).unwrap();
        let body = read_frame(&mut &frame[..], 1024).await.unwrap();
        assert_eq!(decode::<Vec<u32>>(&body).unwrap(), vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_before_reading_its_body() {
        let prefix = (1u32 << 30).to_be_bytes();
        let err = read_frame(&mut &prefix[..], 1024).await.unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { len, max: 1024 } if len == 1 << 30));
    }

    #[tokio::test]
    async fn truncated_prefix_and_body_are_reported() {
        let err = read_frame(&mut &[0u8, 0][..], 1024).await.unwrap_err();
        assert!(matches!(
            err,
            WireError::Truncated {
                expected: 4,
                received: 2
            }
        ));
        let mut frame = encode(&"hello world", 1024).unwrap();
        frame.truncate(8);
        let err = read_frame(&mut &frame[..], 1024).await.unwrap_err();
        assert!(matches!(
            err,
            WireError::Truncated {
                expected: 12,
                received: 4
            }
        ));
    }

    #[tokio::test]
    async fn empty_stream_is_not_a_frame() {
        let err = read_frame(&mut &[][..], 1024).await.unwrap_err();
        assert!(matches!(err, WireError::Empty));
    }
}
