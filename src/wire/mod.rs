//! The wire format: what crosses a QUIC stream between two nimbus processes.
//!
//! Everything here is pure (no sockets, no clocks), so it can be tested and
//! fuzzed on its own. A connection goes through these steps:
//!
//! 1. The dialer opens a bidirectional stream and writes the [`preamble`]
//!    (`NMBS` + protocol version), then a [`Hello`] frame naming itself and,
//!    optionally, the incarnation of the node it expects to reach.
//! 2. The acceptor checks the preamble first, so that a peer of another
//!    version is refused with both versions named, whatever else changed in
//!    the format. It answers with its own preamble and a [`HelloReply`], or
//!    closes the connection with a [`CloseCode`] and a readable reason.
//! 3. Every later request opens a stream of its own: one [`Request`] frame
//!    in, one [`Response`] frame out (none for fire-and-forget). Streams are
//!    independent, so a large transfer never blocks a heartbeat behind it.
//!    An ordered channel (requests marked [`Request::ordered`]) keeps its
//!    stream open instead: its requests are handled in the order sent and
//!    answered in that order, which is how calls to one actor stay ordered.
//!
//! Frames are a 4-byte big-endian length followed by a MessagePack body
//! ([`frame`]); a frame longer than the configured maximum is refused before
//! any byte of its body is read.

pub mod frame;
mod identity;
mod message;

pub use frame::{decode, encode, read_frame, write_frame, WireError};
pub use identity::{Incarnation, NodeIdentity, PeerIdentity, PeerRole};
pub use message::{
    preamble, read_preamble, CloseCode, Hello, HelloReply, RemoteError, RemoteErrorKind, Request,
    Response, PREAMBLE_LEN,
};

/// The protocol version this build speaks. Peers must match exactly.
/// 2: control requests grouped by subsystem.
pub const PROTOCOL_VERSION: u32 = 2;

/// Default largest frame accepted from a peer (16 MiB); see
/// [`TransportConfig::max_frame_bytes`](crate::transport::TransportConfig::max_frame_bytes).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;
