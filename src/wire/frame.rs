//! Length-prefixed MessagePack frames.
//!
//! A frame is a 4-byte big-endian body length followed by the body. The
//! length is checked against a maximum before the body is read, so a peer
//! cannot make a node allocate more than that. Reading and writing them on
//! streams is `crate::transport`'s (`frame_io.rs`).

use serde::{de::DeserializeOwned, Serialize};

/// Bytes of the length prefix in front of every frame.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// What can go wrong reading or writing a frame.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The length prefix announces more than the receiver accepts
    /// (`max_frame_bytes` in the transport configuration).
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge {
        /// Announced body length.
        len: u64,
        /// Largest body length accepted.
        max: usize,
    },
    /// The stream ended inside a frame.
    #[error("truncated frame: expected {expected} bytes, the stream ended after {received}")]
    Truncated {
        /// Bytes the frame should have had (prefix included when it was cut).
        expected: usize,
        /// Bytes that arrived.
        received: usize,
    },
    /// The stream ended before any frame.
    #[error("the stream ended before a frame arrived")]
    Empty,
    /// The body is not a valid MessagePack encoding of the expected type
    /// (random bytes, an unknown message type, a field of the wrong type).
    #[error("undecodable {what}: {detail}")]
    Decode {
        /// The type that was expected.
        what: &'static str,
        /// The decoder's explanation.
        detail: String,
    },
    /// A value could not be encoded.
    #[error("cannot encode {what}: {detail}")]
    Encode {
        /// The type being encoded.
        what: &'static str,
        /// The encoder's explanation.
        detail: String,
    },
    /// The first bytes of a connection are not a nimbus preamble.
    #[error("not a nimbus peer: the connection began with {found:02x?} instead of \"NMBS\"")]
    BadPreamble {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// Reading or writing the stream failed.
    #[error("stream I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `value` as one frame (length prefix included).
///
/// ```
/// let frame = nimbus::wire::encode(&"hi", 1024).unwrap();
/// assert_eq!(&frame[..4], &[0, 0, 0, 3]);
/// assert_eq!(nimbus::wire::decode::<String>(&frame[4..]).unwrap(), "hi");
/// ```
pub fn encode<T: Serialize>(value: &T, max: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    encode_into(value, max, &mut out)?;
    Ok(out)
}

/// Appends `value` to `out` as one frame (length prefix included); on an
/// error `out` is left as it was. Several frames written in one go cost
/// one system call.
///
/// ```
/// let mut out = Vec::new();
/// nimbus::wire::encode_into(&"hi", 1024, &mut out).unwrap();
/// nimbus::wire::encode_into(&"there", 1024, &mut out).unwrap();
/// assert_eq!(out.len(), 4 + 3 + 4 + 6);
/// assert!(nimbus::wire::encode_into(&"too long", 4, &mut out).is_err());
/// assert_eq!(out.len(), 4 + 3 + 4 + 6);
/// ```
pub fn encode_into<T: Serialize>(
    value: &T,
    max: usize,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX_BYTES]);
    let encoded = rmp_serde::encode::write_named(out, value).map_err(|e| WireError::Encode {
        what: std::any::type_name::<T>(),
        detail: e.to_string(),
    });
    let len = out.len() - start - LENGTH_PREFIX_BYTES;
    let checked = encoded.and_then(|()| match u32::try_from(len) {
        Ok(prefix) if len <= max => Ok(prefix),
        _ => Err(WireError::FrameTooLarge {
            len: len as u64,
            max,
        }),
    });
    match checked {
        Ok(prefix) => {
            out[start..start + LENGTH_PREFIX_BYTES].copy_from_slice(&prefix.to_be_bytes());
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// What [`encode_body`] starts with: a small message (an actor call's
/// arguments or reply, its envelope) fits without the buffer growing.
/// Each growth is another allocation and copy: they were a fifth of a
/// caller's time in pipelined 64 B actor calls.
const SMALL_BODY_BYTES: usize = 256;

/// `value` as a frame body (MessagePack with named fields, no length
/// prefix), `reserve` bytes beyond a small message's room held from the
/// start (a body that wraps another passes the inner one's length).
///
/// ```
/// let body = nimbus::wire::encode_body(&"hi", 0).unwrap();
/// assert_eq!(nimbus::wire::decode::<String>(&body).unwrap(), "hi");
/// ```
pub fn encode_body<T: Serialize>(
    value: &T,
    reserve: usize,
) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    let mut out = Vec::with_capacity(SMALL_BODY_BYTES + reserve);
    rmp_serde::encode::write_named(&mut out, value)?;
    Ok(out)
}

/// Decodes a frame body (without its length prefix).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    rmp_serde::from_slice(body).map_err(|e| WireError::Decode {
        what: short_type_name::<T>(),
        detail: e.to_string(),
    })
}

/// Checks a length prefix against `max` and returns the body length.
pub fn body_len(prefix: [u8; LENGTH_PREFIX_BYTES], max: usize) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        return Err(WireError::FrameTooLarge {
            len: len as u64,
            max,
        });
    }
    Ok(len)
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_do_not_decode_and_do_not_panic() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..512 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            // Returning at all is the "no panic" half.
            let decoded = decode::<crate::wire::Request>(&bytes);
            assert!(decoded.is_err(), "{len} random bytes decoded as a request");
        }
    }

    #[test]
    fn encoding_over_the_maximum_fails() {
        let err = encode(&vec![0u8; 100], 10).unwrap_err();
        assert!(matches!(err, WireError::FrameTooLarge { max: 10, .. }));
    }
}
