//! The wire format: what crosses a QUIC stream between two nimbus processes.
//!
//! Everything here is pure (no sockets, no files, no async runtime, no
//! clocks: the architecture test `wire_names_no_file_system_async_runtime_or_clock`
//! keeps it so), so it can be tested and fuzzed on its own; frames are read
//! and written on streams by `crate::transport` (`frame_io.rs`). A
//! connection goes through these steps:
//!
//! 1. The dialer opens a bidirectional stream and writes the [`preamble`]
//!    (8 bytes: `NMBS` + the `u32` protocol version, [`PROTOCOL_VERSION`],
//!    now 15), then a [`Hello`] frame naming itself (`from`: role, name,
//!    incarnation) and, optionally, the identity of the node it expects to
//!    reach (`expect`).
//! 2. The acceptor checks the preamble first, so that a peer of another
//!    version is refused with both versions named, whatever else changed in
//!    the format (the preamble never changes). It answers with its own
//!    preamble and a [`HelloReply`] (its identity, its proof of it, and,
//!    optionally, its same-host [`LocalRoute`]), or closes the connection
//!    with a [`CloseCode`] and a readable reason: 1 for another version, 3
//!    when `expect` names another incarnation of it, 5 when the handshake
//!    does not complete in time.
//! 3. Every later request opens a stream of its own: one [`Request`] frame
//!    in (`id`, `to` incarnation, `deadline_ms`, `one_way`, `ordered`, the
//!    opaque `body`), one [`Response`] frame out (`id`, then the reply body
//!    or a [`RemoteError`] `{ kind, message }`; none for a one-way request).
//!    A request meant for another incarnation is answered `StaleIncarnation`,
//!    one whose handler is still running at its deadline `DeadlineExceeded`.
//!    Streams are independent, so a large transfer never blocks a heartbeat
//!    behind it. An ordered channel (requests marked [`Request::ordered`])
//!    keeps its stream open instead: its requests are handled in the order
//!    sent and answered in that order, which is how calls to one actor stay
//!    ordered.
//!
//! Frames are a 4-byte big-endian length followed by a MessagePack body with
//! named fields, so fields can be added ([`frame`]); a frame longer than the
//! configured maximum ([`DEFAULT_MAX_FRAME_BYTES`], 16 MiB, by default) is
//! refused from the length prefix alone, before any byte of its body is read.
//!
//! Close codes ([`CloseCode`]): 0 done, 1 version mismatch, 2 bad frame (an
//! undecodable, truncated, oversized or unknown frame, or a request frame not
//! complete in time: that connection only is closed), 3 stale incarnation,
//! 4 shutting down, 5 handshake timeout. The timeouts themselves belong to
//! the transport (`crate::transport::TransportConfig`).
//!
//! Files: `frame.rs` (frames), `message.rs` (the preamble, envelopes and
//! close codes), `identity.rs` (`NodeIdentity`, `Incarnation`,
//! `PeerIdentity`).

pub mod frame;
mod identity;
mod message;

pub use frame::{decode, encode, encode_body, encode_into, WireError};
pub use identity::{
    BadNodeName, Incarnation, NodeIdentity, PeerIdentity, PeerRole, MAX_NODE_NAME,
    WORKER_NAME_PREFIX,
};
pub use message::{
    preamble, read_preamble, CloseCode, HeadKeys, Hello, HelloReply, IssuerTicket, LocalRoute,
    Proof, RemoteError, RemoteErrorKind, Request, Response, Ticket, PREAMBLE_LEN,
};

/// The protocol version this build speaks. Peers must match exactly.
/// 2: control requests grouped by subsystem; 3: `NodeNameTaken`; 4: a
/// `Hello` carries a [`Proof`] (token or ticket), a join is answered with a
/// node ticket; 5: the event stream's `ClusterEventKind::Resync` marker
/// (a peer of 4 could not decode it); 6: `PutObjects` (small puts); 7:
/// `StreamObject` (bulk streams over TCP); 8: `EventRequest::LastSeq`
/// (the latest event's number, which the first page of the history is
/// not once more than a page is kept); 9: `DirectoryRequest::ListDeadActors`
/// (the dead actors the head keeps); 10: same-host sockets trade
/// shared-memory rings once admitted, and carry large frames through them
/// (`transport/shm_ring.rs`); 11: `ObjectReady` names the object's job
/// (whose workers alone may read it); 12: `ObjectFailed` names the job
/// that recorded the failure; 13: `MembershipRequest::Autoscaler` (the
/// autoscaler's report, shown in `Status`); 14:
/// `MembershipRequest::RequestResources` (capacity asked for ahead of
/// use); 15: a [`HelloReply`] carries the acceptor's proof, which the
/// dialer checks; 16: each subsystem answers with a reply type of its
/// own (`crate::cluster::Subsystem`); 17: actors are confined to their job
/// unless shared (`ActorSpec::shared`), and a bulk stream's dialer sends
/// its ticket's admission tag before TLS; 18: tickets expire and are
/// renewed (a heartbeat's `renew`, `WorkerRequest::RenewTicket`). A
/// [`HelloReply`]'s `local` route is optional: peers of 6 without it
/// simply use QUIC.
pub const PROTOCOL_VERSION: u32 = 18;

/// Default largest frame accepted from a peer (16 MiB); see
/// [`TransportConfig::max_frame_bytes`](crate::transport::TransportConfig::max_frame_bytes).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;
