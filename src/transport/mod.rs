//! QUIC transport between nimbus processes: one [`Endpoint`] per process,
//! mutually authenticated connections on demand, one stream per request.
//!
//! This layer moves opaque request and response bodies; it knows nothing of
//! actors or the control plane. The node layer gives it a [`RequestHandler`]
//! for what arrives, and calls [`Connection::request`] for what leaves. The
//! frames and envelopes are [`crate::wire`]'s; this layer adds sockets, TLS
//! and clocks:
//!
//! 1. **Connection.** QUIC (quinn), TLS 1.3 only, ALPN `nimbus`, server
//!    name `nimbus`. Both sides present a certificate signed by the cluster
//!    CA derived from the join token (`credentials.rs`) and verify the
//!    other's; a process without a cluster certificate fails the TLS
//!    handshake. A
//!    dialer keeps one connection per peer address and reuses it while it
//!    is open (and, when it names the incarnation it expects, while that is
//!    the one at the other end).
//! 2. **Admission and handshake.** Past 16 handshakes in progress a client
//!    must prove its address (QUIC Retry) first, at 64 new ones are
//!    refused, and refusals are logged once per 10 s with a count
//!    (`admission.rs`). Then (`server/`) the preamble, `Hello` and `HelloReply`
//!    of the wire format, within `connect_timeout` (5 s by default; close
//!    code 5 past it). A version mismatch closes with code 1, an `expect`
//!    naming another incarnation with code 3.
//! 3. **Identity** (`tickets.rs`): the `Hello` carries a proof, a token
//!    holder's HMAC of its certificate or a node's or worker's ticket; a
//!    proof that fails closes the connection with code 6, and the handler
//!    is told the [`Caller`] as far as this process could check it.
//! 4. **Requests.** Each opens its own bidirectional stream, or rides an
//!    ordered [`Channel`] (`channel.rs`); between two processes of one
//!    host channels and requests run over a Unix-domain socket the
//!    connection's handshake admitted them to (`local.rs`). The caller enforces the request's
//!    deadline locally too ([`RequestOptions`]); the receiver answers a
//!    handler still running at the deadline with `DeadlineExceeded`, and a
//!    request for another incarnation of it with `StaleIncarnation`.
//! 5. **Bad input** closes that connection only, with close code 2 and the
//!    reason, and logs a warning: a frame over `max_frame_bytes` (16 MiB by
//!    default, refused from its length prefix), an undecodable, truncated or
//!    unknown frame, a body the handler calls malformed, or a first request
//!    frame not complete within `request_read_timeout` (30 s). Nothing a peer
//!    sends can panic a node.
//! 6. **Priorities.** Streams are independent (no head-of-line blocking);
//!    control traffic (heartbeats, membership) is sent at stream priority
//!    `RequestOptions::CONTROL_PRIORITY` (100, deadline 10 s by default),
//!    bulk at `BULK_PRIORITY` (0, deadline 60 s), so bulk transfers cannot
//!    starve heartbeats.
//! 7. **Dead peers.** A connection that receives nothing for `idle_timeout`
//!    (3 s by default; keep-alives go at a third of it) is lost, and every
//!    request waiting on it fails with `NodeLost`; every request also has
//!    its deadline (`Timeout`). Nobody waits forever on a dead node.
//! 8. **Shutdown.** [`Endpoint::shutdown`] closes every connection with
//!    close code 4 ("shutting down") and waits up to `connect_timeout` for
//!    peers to be told.
//!
//! 9. **Bulk streams.** Between nodes, large objects travel over TLS 1.3
//!    on TCP with the same certificates, each stream opened with a
//!    one-time ticket granted over QUIC (`bulk.rs`); QUIC carries them
//!    when that is off or fails.
//!
//! The defaults are [`TransportConfig`]'s (`config.rs`). Files:
//! `endpoint.rs` (with `local.rs` and `bulk.rs`, the only files that open sockets; connections cached
//! per peer address), `connection.rs` (the dialing side of a live
//! connection), `server/` (the accepting side), `channel.rs` (ordered
//! channels), `batch.rs` (frames written together, by both), `bulk.rs`
//! (TLS-over-TCP bulk streams), `bulk_grants.rs` (their tickets),
//! `bulk_sources.rs` (which of their connections get a handshake),
//! `records.rs` (their TLS records, sealed and opened in
//! place once rustls has done the handshake),
//! `credentials.rs` (the join token and certificates),
//! `tickets.rs` (proofs of identity), `ticket_keys.rs` (the head's keys and
//! their rotation), `local.rs` (same-host channels),
//! `shm_ring.rs` (their large frames in shared memory), `frames.rs`
//! (reading frames off a QUIC stream or a same-host socket),
//! `error.rs`, and `faults.rs` (an optional socket wrapper that injects
//! seeded packet faults below QUIC, for fault-injection tests).
//!
//! ```no_run
//! # async fn demo(token: nimbus::transport::JoinToken) -> anyhow::Result<()> {
//! use nimbus::transport::{Credentials, Endpoint, RequestOptions, TransportConfig};
//! use nimbus::wire::{Incarnation, NodeIdentity, PeerIdentity, PeerRole};
//!
//! let me = PeerIdentity {
//!     role: PeerRole::Client,
//!     identity: NodeIdentity { name: "my-tool".into(), incarnation: Incarnation::fresh() },
//! };
//! let credentials = Credentials::issue(&token, "my-tool")?;
//! let endpoint = Endpoint::client(me, &credentials, TransportConfig::default())?;
//! let head = endpoint.connect("127.0.0.1:6379".parse()?, None).await?;
//! let reply = head.request(b"raw body".to_vec(), RequestOptions::control()).await;
//! # Ok(()) }
//! ```

pub mod admission;
mod answer;
mod batch;
mod bulk;
mod bulk_grants;
mod bulk_sources;
mod channel;
mod config;
mod connection;
mod credentials;
mod endpoint;
mod error;
pub mod faults;
mod frame_io;
mod frames;
mod incarnation;
mod local;
mod records;
mod server;
mod shm_ring;
mod ticket_keys;
mod tickets;

pub use answer::{Answer, Reply};
pub use bulk::{BulkListener, BulkServer, BulkStream, MAX_STREAM_BYTES};
pub use bulk_grants::{BulkGrants, BulkTicket, MAX_GRANTS, TICKET_TTL};
pub use bulk_sources::{
    PER_SOURCE as BULK_HANDSHAKES_PER_SOURCE,
    PER_SOURCE_PER_SECOND as BULK_HANDSHAKES_PER_SOURCE_PER_SECOND,
};
pub use channel::{Channel, PendingReply};
pub use config::{RequestOptions, ResetKey, TransportConfig};
pub use connection::{Connection, StalledStream};
pub use credentials::{undumpable, CredentialError, Credentials, JoinToken, WorkerCredentials};
pub use endpoint::Endpoint;
pub use error::{
    BulkError, ConnectError, EndpointError, FaultPlanError, NoPacketFaults, RecordError,
    RequestError,
};
pub use faults::{FaultCounters, FaultCounts, PacketFaults, PacketRule};
pub use frame_io::{read_frame, write_frame};
pub use local::boot_id;
pub use server::{HandlerError, RequestHandler};
pub use ticket_keys::{
    generate_pkcs8, Rotation, RotationError, TicketAuthority, DEFAULT_TICKET_LIFETIME,
    SWITCH_MARGIN,
};
pub use tickets::{
    renewal_due_at, unix_now, Caller, CertificateHash, Standing, TicketError, Verifier,
    WorkerScope, WorkerSigner, MAX_CLOCK_SKEW, NODE_TICKET, TOKEN_PROOF, WORKER_TICKET,
};
