//! The envelopes every connection carries; the bodies inside are opaque bytes
//! that the layer above (the control plane, later actors) encodes itself.

use serde::{Deserialize, Serialize};

use super::{frame::WireError, Incarnation, NodeIdentity, PeerIdentity};

/// Bytes of the connection preamble: `NMBS` and a big-endian version.
pub const PREAMBLE_LEN: usize = 8;

const MAGIC: [u8; 4] = *b"NMBS";

/// The preamble each side writes first on a connection's handshake stream.
pub fn preamble(version: u32) -> [u8; PREAMBLE_LEN] {
    let mut out = [0u8; PREAMBLE_LEN];
    out[..4].copy_from_slice(&MAGIC);
    out[4..].copy_from_slice(&version.to_be_bytes());
    out
}

/// Parses a preamble and returns the peer's protocol version.
pub fn read_preamble(bytes: [u8; PREAMBLE_LEN]) -> Result<u32, WireError> {
    let mut found = [0u8; 4];
    found.copy_from_slice(&bytes[..4]);
    if found != MAGIC {
        return Err(WireError::BadPreamble { found });
    }
    Ok(u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]))
}

/// The dialer's first frame, after the preamble.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// Who is calling.
    pub from: PeerIdentity,
    /// The node the dialer means to reach, if it knows it: the acceptor
    /// refuses the session when its own incarnation differs.
    pub expect: Option<NodeIdentity>,
    /// What backs `from` (checked by `crate::transport`'s `tickets.rs`).
    pub proof: Proof,
}

/// What a dialer offers to prove who it is, beyond the TLS certificate
/// every token holder can make.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Proof {
    /// Nothing: the peer can prove neither.
    None,
    /// A token holder: the HMAC of its certificate's SHA-256 keyed with
    /// the join token.
    Token(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A certified node or worker.
    Ticket(Ticket),
}

/// A signed statement of who holds one certificate: a node's, signed by
/// the head; a worker's, signed by its node, with the node's attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// The statement (MessagePack, decoded only once the signature holds).
    #[serde(with = "serde_bytes")]
    pub claims: Vec<u8>,
    /// Its Ed25519 signature.
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
    /// A worker's: the ticket of the node that signed it.
    pub issuer: Option<IssuerTicket>,
}

/// The head's public ticket keys, the one that signs first: what a node
/// or worker checks tickets with (`crate::transport`'s `tickets.rs`,
/// step 8).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadKeys(pub Vec<serde_bytes::ByteBuf>);

impl From<Vec<Vec<u8>>> for HeadKeys {
    fn from(keys: Vec<Vec<u8>>) -> Self {
        HeadKeys(keys.into_iter().map(serde_bytes::ByteBuf::from).collect())
    }
}

impl From<HeadKeys> for Vec<Vec<u8>> {
    fn from(keys: HeadKeys) -> Self {
        keys.0
            .into_iter()
            .map(serde_bytes::ByteBuf::into_vec)
            .collect()
    }
}

/// The node ticket attached to a worker's (one level: nothing nests).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuerTicket {
    /// The node's statement.
    #[serde(with = "serde_bytes")]
    pub claims: Vec<u8>,
    /// The head's signature of it.
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
}

/// The acceptor's answer to a [`Hello`] (refusals close the connection
/// instead, with a [`CloseCode`] and a reason both versions can read).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HelloReply {
    /// The acceptor's identity.
    pub node: NodeIdentity,
    /// What backs `node`: the acceptor's ticket (or token proof) for the
    /// certificate it served TLS with, checked by the dialer
    /// (`crate::transport`'s `tickets.rs`, step 5).
    pub proof: Proof,
    /// How a dialer on the acceptor's host may reach it without QUIC
    /// (`None`: it may not).
    pub local: Option<LocalRoute>,
}

/// The acceptor's same-host route (`transport/local.rs`): a Unix-domain
/// socket in the abstract namespace, and the key that admits this
/// connection's channels to it. Sent inside TLS only.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LocalRoute {
    /// The acceptor's host: the kernel's boot id.
    pub host: String,
    /// The socket's abstract name (no leading NUL).
    pub socket: String,
    /// The secret a channel presents first.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
}

impl std::fmt::Debug for LocalRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRoute")
            .field("host", &self.host)
            .field("socket", &self.socket)
            .field("key", &"<secret>")
            .finish()
    }
}

/// One request, alone on its own stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    /// Correlates the response; unique per connection and direction.
    pub id: u64,
    /// The incarnation the sender means to reach; a node refuses requests
    /// meant for another incarnation of itself.
    pub to: Option<Incarnation>,
    /// Milliseconds the sender will wait; the receiver gives up after that.
    pub deadline_ms: u64,
    /// No response is expected.
    pub one_way: bool,
    /// Part of an ordered channel: the stream stays open, and every request
    /// on it is handled in the order sent and answered in that order.
    pub ordered: bool,
    /// The message, encoded by the layer above.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    /// The [`Request::id`] answered.
    pub id: u64,
    /// The reply body, or why there is none.
    pub result: Result<serde_bytes::ByteBuf, RemoteError>,
}

/// An error the remote side reports for one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct RemoteError {
    /// Which kind of failure, for matching.
    pub kind: RemoteErrorKind,
    /// What happened, in words.
    pub message: String,
}

impl RemoteError {
    /// A new error of `kind`.
    pub fn new(kind: RemoteErrorKind, message: impl Into<String>) -> Self {
        RemoteError {
            kind,
            message: message.into(),
        }
    }
}

/// Kinds of [`RemoteError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RemoteErrorKind {
    /// The request could not be decoded or is not valid for this node.
    BadRequest,
    /// The request was meant for another incarnation, or comes from an
    /// incarnation that is no longer a member.
    StaleIncarnation,
    /// The receiver did not finish within the request's deadline.
    DeadlineExceeded,
    /// The receiver is shutting down.
    ShuttingDown,
    /// The handler failed.
    Internal,
    /// The caller may not ask this (a node speaks only for itself, a worker
    /// only for its own actor).
    Forbidden,
}

/// Application close codes a node uses when it closes a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum CloseCode {
    /// Orderly close.
    Done = 0,
    /// The peer speaks another protocol version.
    VersionMismatch = 1,
    /// The peer sent bytes that are not valid frames or messages.
    BadFrame = 2,
    /// The peer expected another incarnation of this node.
    StaleIncarnation = 3,
    /// This node is shutting down.
    ShuttingDown = 4,
    /// The handshake did not complete in time.
    HandshakeTimeout = 5,
    /// The peer's proof of identity (token or ticket) does not hold.
    Unauthenticated = 6,
}

impl CloseCode {
    /// The code for a raw value, if it is one of ours.
    pub fn from_u64(code: u64) -> Option<Self> {
        Some(match code {
            0 => CloseCode::Done,
            1 => CloseCode::VersionMismatch,
            2 => CloseCode::BadFrame,
            3 => CloseCode::StaleIncarnation,
            4 => CloseCode::ShuttingDown,
            5 => CloseCode::HandshakeTimeout,
            6 => CloseCode::Unauthenticated,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preamble_round_trips_and_rejects_strangers() {
        assert_eq!(read_preamble(preamble(7)).unwrap(), 7);
        let err = read_preamble(*b"GET / HT").unwrap_err();
        assert!(err.to_string().contains("not a nimbus peer"));
    }
}
