//! Transport errors, one enum per operation.

use std::net::SocketAddr;
use std::time::Duration;

use crate::wire::{CloseCode, NodeIdentity, RemoteError, WireError};

use super::CredentialError;

/// Creating an endpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Another process holds the UDP port (choose another with `--port`).
    #[error("cannot listen on {addr}: the port is already in use (another nimbus node? try `nimbus stop`, or choose another --port)")]
    AddressInUse {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// Binding the UDP socket failed otherwise.
    #[error("cannot listen on {addr}: {cause}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The credentials cannot be turned into a TLS configuration.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// quinn refused the configuration.
    #[error("cannot start the QUIC endpoint: {0}")]
    Quic(String),
}

/// Dialing a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nothing answered in time (`connect_timeout`).
    #[error("no nimbus node answered at {addr} within {after:?} (is it running, and is the address right?)")]
    Unreachable {
        /// The address dialed.
        addr: SocketAddr,
        /// How long we waited.
        after: Duration,
    },
    /// The TLS handshake failed: one side lacks this cluster's credentials.
    #[error("{addr} refused our credentials or presented foreign ones ({detail}): is the join token right?")]
    Unauthenticated {
        /// The address dialed.
        addr: SocketAddr,
        /// What TLS reported.
        detail: String,
    },
    /// The peer closed the connection during the nimbus handshake.
    #[error("{addr} refused the connection: {reason}")]
    Refused {
        /// The address dialed.
        addr: SocketAddr,
        /// Why, as a code for matching.
        code: Option<CloseCode>,
        /// Why, in the peer's words.
        reason: String,
    },
    /// The acceptor could not prove it is the peer meant (`tickets.rs`,
    /// step 5): another node or worker, or one whose ticket fails.
    #[error("{addr} is not the peer meant: {reason}")]
    NotThePeer {
        /// The address dialed.
        addr: SocketAddr,
        /// What failed.
        reason: String,
    },
    /// The handshake exchanged bytes that made no sense.
    #[error("handshake with {addr} failed: {cause}")]
    Handshake {
        /// The address dialed.
        addr: SocketAddr,
        /// What was wrong.
        cause: WireError,
    },
    /// The connection failed for another reason.
    #[error("connection to {addr} failed: {detail}")]
    Lost {
        /// The address dialed.
        addr: SocketAddr,
        /// What quinn reported.
        detail: String,
    },
}

/// A request failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The peer is gone: its connection timed out (`idle_timeout`), was
    /// reset, or was closed by its shutdown. The request may or may not have
    /// been carried out.
    #[error("node {peer} lost: {reason}")]
    NodeLost {
        /// The node that was being called.
        peer: NodeIdentity,
        /// How it was lost.
        reason: String,
    },
    /// No response within the request's deadline.
    #[error("no response from {peer} within {after:?}")]
    Timeout {
        /// The node that was being called.
        peer: NodeIdentity,
        /// The deadline.
        after: Duration,
    },
    /// The peer answered with an error.
    #[error("{peer} answered with an error: {error}")]
    Remote {
        /// The node that answered.
        peer: NodeIdentity,
        /// Its error.
        error: RemoteError,
    },
    /// The peer closed the connection because of something we sent.
    #[error("{peer} closed the connection: {reason}")]
    Rejected {
        /// The node that closed it.
        peer: NodeIdentity,
        /// Its reason.
        reason: String,
    },
    /// This endpoint closed the connection.
    #[error("the connection to {peer} was closed locally")]
    Closed {
        /// The node that was being called.
        peer: NodeIdentity,
    },
    /// The request or its response could not be framed or decoded.
    #[error("exchange with {peer} failed: {cause}")]
    Wire {
        /// The node that was being called.
        peer: NodeIdentity,
        /// What was wrong.
        cause: WireError,
    },
}

impl RequestError {
    /// The remote error, if the peer answered with one.
    pub fn remote(&self) -> Option<&RemoteError> {
        match self {
            RequestError::Remote { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// A fault plan in the environment is malformed.
#[derive(Debug, thiserror::Error)]
#[error("{variable} is not {expected}: {source}")]
pub struct FaultPlanError {
    /// The environment variable.
    pub variable: &'static str,
    /// What it should hold.
    pub expected: &'static str,
    /// Why it does not.
    #[source]
    pub source: serde_json::Error,
}

impl FaultPlanError {
    /// Reads `variable` as JSON, if set.
    pub fn read<T: serde::de::DeserializeOwned>(
        variable: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, FaultPlanError> {
        match std::env::var(variable) {
            Ok(json) => serde_json::from_str(&json)
                .map(Some)
                .map_err(|source| FaultPlanError {
                    variable,
                    expected,
                    source,
                }),
            Err(_) => Ok(None),
        }
    }
}

/// A packet rule was sent to an endpoint that injects no packet faults.
#[derive(Debug, thiserror::Error)]
#[error(
    "{endpoint} injects no packet faults: start it with a packet fault plan ({})",
    super::faults::PACKET_FAULTS_ENV
)]
pub struct NoPacketFaults {
    /// The endpoint.
    pub endpoint: crate::wire::PeerIdentity,
}

/// A bulk stream (`bulk.rs`) failed; the caller carries its bytes over
/// QUIC instead.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    /// This endpoint does not use bulk streams: it injects packet faults,
    /// or `TransportConfig::bulk_over_tcp` is off.
    #[error("bulk streams are off for this endpoint (packet faults, or TransportConfig::bulk_over_tcp is false)")]
    Off,
    /// The socket failed.
    #[error("bulk stream with {addr}: {cause} (is TCP to this port allowed between the nodes?)")]
    Io {
        /// The other end.
        addr: SocketAddr,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The TLS handshake failed: one side lacks this cluster's credentials.
    #[error("bulk stream with {addr}: TLS failed ({detail}): is the join token right?")]
    Tls {
        /// The other end.
        addr: SocketAddr,
        /// What TLS reported.
        detail: String,
    },
    /// Nothing moved in time (`connect_timeout` to open, else
    /// `request_read_timeout`).
    #[error("bulk stream with {addr}: no progress within {after:?}")]
    Stalled {
        /// The other end.
        addr: SocketAddr,
        /// How long we waited.
        after: Duration,
    },
    /// The other end closed the stream early.
    #[error("bulk stream with {addr} ended {missing} bytes early (the sender failed or refused the ticket)")]
    Ended {
        /// The other end.
        addr: SocketAddr,
        /// Bytes that never came.
        missing: u64,
    },
    /// The file a stream's bytes come from or go to failed.
    #[error("bulk stream with {addr}: cannot {action} the file: {cause}")]
    File {
        /// The other end.
        addr: SocketAddr,
        /// "read" or "write".
        action: &'static str,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The thread a stream ran on failed (it panicked).
    #[error("bulk stream with {addr}: its thread failed ({detail})")]
    Thread {
        /// The other end.
        addr: SocketAddr,
        /// What the thread's end reported.
        detail: String,
    },
    /// A record could not be sealed or opened (`records.rs`).
    #[error("bulk stream with {addr}: {cause}")]
    Record {
        /// The other end.
        addr: SocketAddr,
        /// What was wrong.
        cause: RecordError,
    },
}

/// What was wrong with a bulk stream's TLS record (`records.rs`).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The handshake agreed on a cipher suite this side cannot seal with.
    #[error("the TLS cipher suite agreed on cannot be handed over from rustls")]
    Cipher,
    /// A record's tag did not match: changed on the way, forged, replayed
    /// or out of order.
    #[error("a record failed its authentication (changed on the way, forged or replayed)")]
    Forged,
    /// A record broke the format.
    #[error("a malformed record: {0}")]
    Malformed(&'static str),
    /// A record of a type bulk streams do not carry (a key update, say).
    #[error("a record of type {0}, which bulk streams do not carry")]
    Unexpected(u8),
    /// The other end sent an alert other than `close_notify` (RFC 8446
    /// §6: its description).
    #[error("the other end sent TLS alert {0}")]
    Alert(u8),
    /// The stream's key protected as many records as it safely can.
    #[error(
        "the stream's key has protected its {} records (256 GiB); larger objects go over QUIC",
        super::records::MAX_RECORDS
    )]
    KeyWornOut,
}
