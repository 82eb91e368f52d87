//! Transport settings.

use std::time::Duration;

use crate::wire::{DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION};

use super::PacketFaults;

/// Settings of an [`Endpoint`](super::Endpoint).
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// Largest frame accepted from a peer; larger ones close the connection.
    pub max_frame_bytes: usize,
    /// A connection that receives nothing for this long is lost, and every
    /// request waiting on it fails with `NodeLost`. Keep-alives are sent at
    /// a third of it, so a live idle connection never times out.
    pub idle_timeout: Duration,
    /// How long dialing and the nimbus handshake may take.
    pub connect_timeout: Duration,
    /// How long a peer may take to send one whole request frame, so a peer
    /// that opens streams and stalls cannot hold a node's tasks forever.
    pub request_read_timeout: Duration,
    /// The protocol version announced in the preamble. Only tests change it,
    /// to check that a node of another version is refused.
    pub protocol_version: u32,
    /// Packet faults to inject in this endpoint's socket (fault-injection
    /// tests only; `None` in production).
    pub packet_faults: Option<PacketFaults>,
    /// The key of this endpoint's stateless resets (`None`: a random one).
    /// The head keeps its key in its store, so that a restarted head
    /// resets its members' connections to the head before it at their
    /// first packet, instead of leaving them to the idle timeout.
    pub reset_key: Option<ResetKey>,
    /// Whether ordered channels between two processes of one host run
    /// over a Unix-domain socket (`local.rs`), offered by an accepting
    /// endpoint and used by a dialing one. Never with packet faults (they
    /// need QUIC's packets). On by default.
    pub same_host_channels: bool,
    /// Whether bulk object transfers between nodes run over TLS on TCP
    /// (`bulk.rs`): an accepting endpoint listens on TCP too, and a
    /// dialing one tries it before QUIC. Never with packet faults. On by
    /// default.
    pub bulk_over_tcp: bool,
}

/// A QUIC stateless-reset key (HMAC-SHA256).
#[derive(Clone, PartialEq, Eq)]
pub struct ResetKey(pub [u8; 32]);

impl std::fmt::Debug for ResetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResetKey(<redacted>)")
    }
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            idle_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(5),
            request_read_timeout: Duration::from_secs(30),
            protocol_version: PROTOCOL_VERSION,
            packet_faults: None,
            reset_key: None,
            same_host_channels: true,
            bulk_over_tcp: true,
        }
    }
}

/// Per-request settings.
#[derive(Clone, Copy, Debug)]
pub struct RequestOptions {
    /// How long to wait for the response; sent along so the receiver stops
    /// working on it after that too.
    pub deadline: Duration,
    /// QUIC stream priority: higher goes first when the connection is
    /// congested. Control traffic (heartbeats, membership) uses
    /// [`RequestOptions::CONTROL_PRIORITY`], bulk data lower ones.
    pub priority: i32,
}

impl RequestOptions {
    /// Priority of heartbeats and membership traffic.
    pub const CONTROL_PRIORITY: i32 = 100;
    /// Priority of bulk data.
    pub const BULK_PRIORITY: i32 = 0;

    /// Control traffic with a 10 s deadline.
    pub fn control() -> Self {
        RequestOptions {
            deadline: Duration::from_secs(10),
            priority: Self::CONTROL_PRIORITY,
        }
    }

    /// Bulk data with a 60 s deadline.
    pub fn bulk() -> Self {
        RequestOptions {
            deadline: Duration::from_secs(60),
            priority: Self::BULK_PRIORITY,
        }
    }

    /// The same options with another deadline.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}
