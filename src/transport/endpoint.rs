//! The QUIC endpoint: with `local.rs` and `bulk.rs`, the only places that touch sockets.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use tokio::io::AsyncReadExt;

use crate::wire::{
    self, preamble, read_preamble, CloseCode, HeadKeys, Hello, HelloReply, NodeIdentity,
    PeerIdentity, Proof, Ticket, PREAMBLE_LEN,
};

use super::admission::{self, Admission, Admit, HandshakeSlot, MAX_HANDSHAKES};
use super::bulk::{BulkListener, BulkStream, BulkTls};
use super::bulk_grants::BulkTicket;
use super::connection::{close, Connection};
use super::credentials::{SERVER_NAME, WORKER_SERVER_NAME};
use super::faults::{FaultCounters, FaultySocket, PacketRule};
use super::frame_io;
use super::local;
use super::server::{self, RequestHandler};
use super::tickets::{self, CertificateHash, Verifier};
use super::{BulkError, ConnectError, Credentials, EndpointError, ResetKey, TransportConfig};

/// One process's QUIC endpoint: it dials peers (keeping one connection per
/// peer address) and, when [`serve`](Endpoint::serve) is called, accepts
/// connections and hands their requests to a handler.
///
/// Cheap to clone; all clones share the endpoint.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
}

struct Inner {
    quic: quinn::Endpoint,
    me: PeerIdentity,
    config: TransportConfig,
    connections: DashMap<SocketAddr, Connection>,
    faults: Option<Arc<FaultySocket>>,
    /// Which incoming handshakes to take (`admission.rs`).
    admission: Arc<std::sync::Mutex<Admission>>,
    /// What this process offers in its `Hello` (`tickets.rs`, step 1).
    proof: std::sync::RwLock<Proof>,
    /// What it checks of its callers' (step 4).
    verifier: std::sync::RwLock<Verifier>,
    /// Its same-host socket, once it serves (`local.rs`).
    local: Option<LocalOffer>,
    /// The TLS of its bulk streams, unless they are off (`bulk.rs`).
    bulk: Option<BulkTls>,
    /// The SHA-256 of its certificate, which tickets name.
    certificate: CertificateHash,
}

/// An accepting endpoint's same-host socket (`local.rs`, step 1) and the
/// connections whose channels it admits.
pub(super) struct LocalOffer {
    /// The socket's abstract name.
    pub(super) name: String,
    /// The boot id of this host.
    pub(super) host: &'static str,
    /// Taken by the accept loop once the endpoint serves.
    pub(super) listener: std::sync::Mutex<Option<tokio::net::UnixListener>>,
    /// The live connections, by key.
    pub(super) admitted: DashMap<local::Key, server::LocalAdmission>,
}

impl Endpoint {
    /// Binds the UDP socket a node will listen on (port 0 picks a free
    /// one), so that the node can learn its port before it names itself.
    pub fn bind_socket(addr: SocketAddr) -> Result<UdpSocket, EndpointError> {
        UdpSocket::bind(addr).map_err(|source| match source.kind() {
            std::io::ErrorKind::AddrInUse => EndpointError::AddressInUse { addr },
            _ => EndpointError::Bind {
                addr,
                cause: source,
            },
        })
    }

    /// An endpoint listening on `socket` (see [`Endpoint::bind_socket`])
    /// that can also dial.
    pub fn listen(
        socket: UdpSocket,
        me: PeerIdentity,
        credentials: &Credentials,
        config: TransportConfig,
    ) -> Result<Self, EndpointError> {
        let tls = QuicServerConfig::try_from(credentials.server_tls()?)
            .map_err(|e| EndpointError::Quic(e.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(tls));
        server.transport_config(quic_transport(&config)?);
        // Connections not yet seen by the accept loop: a bound on memory.
        server.max_incoming(4 * MAX_HANDSHAKES);
        Self::from_socket(socket, Some(server), me, credentials, config)
    }

    /// An endpoint that only dials (the CLI, drivers, benchmarks).
    pub fn client(
        me: PeerIdentity,
        credentials: &Credentials,
        config: TransportConfig,
    ) -> Result<Self, EndpointError> {
        let addr: SocketAddr = ([0, 0, 0, 0], 0).into();
        let socket = UdpSocket::bind(addr).map_err(|cause| EndpointError::Bind { addr, cause })?;
        Self::from_socket(socket, None, me, credentials, config)
    }

    fn from_socket(
        socket: UdpSocket,
        server: Option<quinn::ServerConfig>,
        me: PeerIdentity,
        credentials: &Credentials,
        config: TransportConfig,
    ) -> Result<Self, EndpointError> {
        let accepts = server.is_some();
        let runtime = quinn::default_runtime()
            .ok_or_else(|| EndpointError::Quic("no async runtime is running".into()))?;
        let quic_error = |e: std::io::Error| EndpointError::Quic(e.to_string());
        size_buffers(&socket);
        let socket = runtime.wrap_udp_socket(socket).map_err(quic_error)?;
        let (socket, faults): (Arc<dyn quinn::AsyncUdpSocket>, _) = match &config.packet_faults {
            Some(plan) => {
                tracing::warn!("PACKET FAULT INJECTION IS ON for this endpoint: {plan:?}");
                let faulty = Arc::new(FaultySocket::new(socket, plan.clone()));
                (faulty.clone(), Some(faulty))
            }
            None => (socket, None),
        };
        let endpoint_config = match &config.reset_key {
            Some(key) => keyed_endpoint(key),
            None => quinn::EndpointConfig::default(),
        };
        let mut quic =
            quinn::Endpoint::new_with_abstract_socket(endpoint_config, server, socket, runtime)
                .map_err(quic_error)?;
        let tls = QuicClientConfig::try_from(credentials.client_tls()?)
            .map_err(|e| EndpointError::Quic(e.to_string()))?;
        let mut client = quinn::ClientConfig::new(Arc::new(tls));
        client.transport_config(quic_transport(&config)?);
        quic.set_default_client_config(client);
        let local = match (accepts, local_channels(&config)) {
            (true, Some(host)) => match local::listen() {
                Ok((name, listener)) => Some(LocalOffer {
                    name,
                    host,
                    listener: std::sync::Mutex::new(Some(listener)),
                    admitted: DashMap::new(),
                }),
                Err(e) => {
                    tracing::debug!("no same-host socket ({e}): channels use QUIC");
                    None
                }
            },
            _ => None,
        };
        let bulk = match config.bulk_over_tcp && config.packet_faults.is_none() {
            true => Some(BulkTls::new(credentials)?),
            false => None,
        };
        Ok(Endpoint {
            inner: Arc::new(Inner {
                quic,
                me,
                config,
                connections: DashMap::new(),
                faults,
                admission: Default::default(),
                proof: std::sync::RwLock::new(credentials.proof()),
                verifier: std::sync::RwLock::new(credentials.verifier()),
                local,
                bulk,
                certificate: credentials.certificate_hash(),
            }),
        })
    }

    /// From now on presents `ticket` (this process's, from the head or its
    /// node) instead of its token proof, and checks callers' tickets with
    /// `head_keys` (the head's public ticket keys). Connections made before
    /// are closed: the next request dials again, with the ticket.
    pub fn certify(&self, ticket: Ticket, head_keys: HeadKeys) {
        self.renew(ticket, head_keys);
        let addresses: Vec<SocketAddr> = self.inner.connections.iter().map(|c| *c.key()).collect();
        for addr in addresses {
            self.disconnect(addr, "reconnecting with this process's ticket");
        }
    }

    /// From now on presents `ticket`, a renewal of the one it presents,
    /// and checks callers' tickets with `head_keys` (`tickets.rs`, steps 7
    /// and 8); connections made before keep the ticket they were made
    /// with.
    pub fn renew(&self, ticket: Ticket, head_keys: HeadKeys) {
        *self.inner.proof.write().unwrap_or_else(|e| e.into_inner()) = Proof::Ticket(ticket);
        self.inner
            .verifier
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .set_head_keys(head_keys.into());
    }

    /// The SHA-256 of this endpoint's certificate (what tickets and bulk
    /// grants name).
    pub fn certificate(&self) -> CertificateHash {
        self.inner.certificate
    }

    /// What this endpoint offers to prove who it is: its ticket once
    /// certified, else its token proof.
    pub(super) fn proof(&self) -> Proof {
        self.inner
            .proof
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What this endpoint checks of its callers' proofs.
    pub(super) fn verifier(&self) -> Verifier {
        self.inner
            .verifier
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The address this endpoint listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner
            .quic
            .local_addr()
            .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into())
    }

    /// A TCP listener for bulk streams on `advertised`, the IP this
    /// endpoint's node tells others to reach it at (`bulk.rs`, step 1);
    /// `None` when bulk streams are off.
    pub fn bulk_listener(
        &self,
        advertised: std::net::IpAddr,
    ) -> Result<Option<BulkListener>, EndpointError> {
        let Some(tls) = &self.inner.bulk else {
            return Ok(None);
        };
        let config = &self.inner.config;
        let listener = BulkListener::bind(
            advertised,
            self.local_addr(),
            tls,
            config.connect_timeout,
            config.request_read_timeout,
        )?;
        Ok(Some(listener))
    }

    /// Opens the bulk stream `ticket` was granted for, at the listener on
    /// `addr` (`bulk.rs`, step 3).
    pub async fn bulk_connect(
        &self,
        addr: SocketAddr,
        ticket: BulkTicket,
    ) -> Result<BulkStream, BulkError> {
        let tls = self.inner.bulk.as_ref().ok_or(BulkError::Off)?;
        let config = &self.inner.config;
        tls.connect(
            addr,
            ticket,
            config.connect_timeout,
            config.request_read_timeout,
        )
        .await
    }

    /// This process's identity.
    pub fn identity(&self) -> &PeerIdentity {
        &self.inner.me
    }

    /// What the packet fault plan did so far, if one is active.
    pub fn fault_counters(&self) -> Option<&FaultCounters> {
        self.inner.faults.as_deref().map(FaultySocket::counters)
    }

    /// Adds `rule` in front of the packet fault plan's rules; its window
    /// counts from now. Fails when the endpoint has no plan (its socket
    /// does not inject faults).
    pub fn add_packet_rule(&self, rule: PacketRule) -> Result<(), super::NoPacketFaults> {
        match &self.inner.faults {
            Some(socket) => {
                socket.add_rule(rule);
                Ok(())
            }
            None => Err(super::NoPacketFaults {
                endpoint: self.inner.me.clone(),
            }),
        }
    }

    /// Its same-host socket, if it offers one.
    pub(super) fn local(&self) -> Option<&LocalOffer> {
        self.inner.local.as_ref()
    }

    /// Which incoming handshakes this endpoint takes.
    pub(super) fn admission(&self) -> Arc<std::sync::Mutex<Admission>> {
        self.inner.admission.clone()
    }

    /// The settings this endpoint was made with.
    pub fn config(&self) -> &TransportConfig {
        &self.inner.config
    }

    /// A connection to the node at `addr`, reusing a live one.
    ///
    /// With `expect`, the node must be that incarnation: a restarted node
    /// refuses the session with [`CloseCode::StaleIncarnation`].
    pub async fn connect(
        &self,
        addr: SocketAddr,
        expect: Option<&NodeIdentity>,
    ) -> Result<Connection, ConnectError> {
        if let Some(existing) = self.inner.connections.get(&addr) {
            let reusable = existing.is_open() && expect.is_none_or(|e| e == existing.peer());
            if reusable {
                return Ok(existing.clone());
            }
        }
        let after = self.inner.config.connect_timeout;
        let connection = tokio::time::timeout(after, self.dial(addr, expect))
            .await
            .map_err(|_| ConnectError::Unreachable { addr, after })??;
        self.inner.connections.insert(addr, connection.clone());
        Ok(connection)
    }

    /// Closes the connection to `addr`, if there is one: requests waiting on
    /// it fail at once with [`RequestError::Closed`](super::RequestError::Closed).
    /// For when the process there is known to be dead.
    pub fn disconnect(&self, addr: SocketAddr, reason: &str) {
        if let Some((_, connection)) = self.inner.connections.remove(&addr) {
            connection.close(reason);
        }
    }

    /// Accepts connections until the endpoint closes, handing every request
    /// to `handler`, and channels on its same-host socket (`local.rs`).
    /// Returns at once; the accept loops run as tasks.
    pub fn serve(&self, handler: Arc<dyn RequestHandler>) {
        let listener = self.local().and_then(|offer| {
            offer
                .listener
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
        });
        let local = listener.map(|listener| {
            tokio::spawn(server::accept_local(
                self.clone(),
                listener,
                handler.clone(),
            ))
        });
        let endpoint = self.clone();
        tokio::spawn(async move {
            let admission = &endpoint.inner.admission;
            while let Some(incoming) = endpoint.inner.quic.accept().await {
                let validated = incoming.remote_address_validated() || !incoming.may_retry();
                let admit = admission::lock(admission).decide(validated);
                match admit {
                    Admit::Accept => {
                        let slot = HandshakeSlot::new(admission.clone());
                        let accept =
                            server::accept(endpoint.clone(), incoming, handler.clone(), slot);
                        tokio::spawn(accept);
                    }
                    Admit::Retry => {
                        if incoming.retry().is_err() {
                            // Only an already validated address cannot be retried.
                            tracing::debug!("a connection could not be retried");
                        }
                    }
                    Admit::Refuse => {
                        let remote = incoming.remote_address();
                        incoming.refuse();
                        server::refused(
                            admission,
                            remote,
                            &format!("{MAX_HANDSHAKES} handshakes are in progress already"),
                        );
                    }
                }
            }
            // Closed: no more channels on this host either.
            if let Some(local) = local {
                local.abort();
            }
        });
    }

    /// Closes every connection, telling peers this node is shutting down,
    /// and waits (at most `connect_timeout`) for them to be told.
    pub async fn shutdown(&self) {
        self.inner.quic.close(
            quinn::VarInt::from_u32(CloseCode::ShuttingDown as u32),
            b"node shutting down",
        );
        let _ = tokio::time::timeout(
            self.inner.config.connect_timeout,
            self.inner.quic.wait_idle(),
        )
        .await;
    }

    async fn dial(
        &self,
        addr: SocketAddr,
        expect: Option<&NodeIdentity>,
    ) -> Result<Connection, ConnectError> {
        // The server's certificate must be valid for the kind of peer meant:
        // a worker's holds only `WORKER_SERVER_NAME` (`credentials.rs`).
        let name = match expect {
            Some(peer) if peer.names_a_worker() => WORKER_SERVER_NAME,
            _ => SERVER_NAME,
        };
        let connecting = self
            .inner
            .quic
            .connect(addr, name)
            .map_err(|e| ConnectError::Lost {
                addr,
                detail: e.to_string(),
            })?;
        let after = self.inner.config.connect_timeout;
        let quic = connecting
            .await
            .map_err(|e| connect_error(addr, after, e))?;
        match self.client_handshake(&quic, expect).await {
            Ok(reply) => {
                if let Err(reason) =
                    tickets::check_acceptor(&self.verifier(), &quic, expect, &reply)
                {
                    close(&quic, CloseCode::Unauthenticated, &reason);
                    return Err(ConnectError::NotThePeer { addr, reason });
                }
                metrics::counter!("nimbus_connections_total", "direction" => "out").increment(1);
                let here = local_channels(&self.inner.config);
                let local = reply
                    .local
                    .filter(|route| Some(route.host.as_str()) == here);
                Ok(Connection::new(quic, reply.node, &self.inner.config, local))
            }
            Err(e) => Err(match quic.close_reason() {
                Some(reason) => connect_error(addr, after, reason),
                None => ConnectError::Handshake { addr, cause: e },
            }),
        }
    }

    async fn client_handshake(
        &self,
        quic: &quinn::Connection,
        expect: Option<&NodeIdentity>,
    ) -> Result<HelloReply, wire::WireError> {
        let (mut send, mut recv) = quic.open_bi().await.map_err(io_error)?;
        let hello = Hello {
            from: self.inner.me.clone(),
            expect: expect.cloned(),
            proof: self.proof(),
        };
        let mut out = preamble(self.inner.config.protocol_version).to_vec();
        out.extend(wire::encode(&hello, self.inner.config.max_frame_bytes)?);
        frame_io::write_frame(&mut send, &out).await?;
        let _ = send.finish();
        let mut theirs = [0u8; PREAMBLE_LEN];
        AsyncReadExt::read_exact(&mut recv, &mut theirs).await?;
        let version = read_preamble(theirs)?;
        if version != self.inner.config.protocol_version {
            let reason = version_mismatch(self.inner.config.protocol_version, version);
            close(quic, CloseCode::VersionMismatch, &reason);
            return Err(wire::WireError::Decode {
                what: "HelloReply",
                detail: reason,
            });
        }
        wire::decode(&frame_io::read_frame(&mut recv, self.inner.config.max_frame_bytes).await?)
    }
}

/// This host's boot id when `config` allows same-host channels (`local.rs`,
/// steps 1 and 2): on, and no packet faults.
fn local_channels(config: &TransportConfig) -> Option<&'static str> {
    let allowed = config.same_host_channels && config.packet_faults.is_none();
    allowed.then(local::boot_id).flatten()
}

/// The reason both sides give for a version mismatch.
pub(super) fn version_mismatch(ours: u32, theirs: u32) -> String {
    format!("protocol version mismatch: this side speaks nimbus protocol v{ours}, the peer speaks v{theirs}; run the same nimbus version on every node")
}

/// What one stream may have sent and a node not yet read.
const STREAM_WINDOW: u32 = 2 << 20;

/// The UDP send and receive buffers an endpoint asks for. The kernel's
/// default (208 KiB on Linux) overflows under a bulk transfer even on
/// loopback: `benches/calibration.rs` counted 0.8% of the packets lost and
/// a congestion window collapsed to ~140 KB. The kernel grants at most
/// `net.core.rmem_max`/`wmem_max`; what was granted is logged.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Asks for [`SOCKET_BUFFER_BYTES`] of send and receive buffer on
/// `socket`; smaller grants are logged, not errors (the transport works
/// with any, only slower).
fn size_buffers(socket: &UdpSocket) {
    let socket = socket2::SockRef::from(socket);
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    // Linux reports twice what it grants (the doubling covers its
    // bookkeeping).
    let granted = |size: std::io::Result<usize>| size.map_or(0, |s| s / 2);
    let (recv, send) = (
        granted(socket.recv_buffer_size()),
        granted(socket.send_buffer_size()),
    );
    if recv < SOCKET_BUFFER_BYTES || send < SOCKET_BUFFER_BYTES {
        tracing::debug!(
            "UDP buffers: asked for {SOCKET_BUFFER_BYTES} bytes, granted {recv} (receive) and {send} (send); raise net.core.rmem_max and wmem_max for faster bulk transfers"
        );
    }
}

/// An endpoint whose stateless resets and connection ids are keyed by
/// `key`: a later process with the same key (a restarted head) takes the
/// connection ids of the one before as its own kind (the generator
/// validates them) and answers their packets with resets the peers
/// accept, so their connections close at once instead of idling out.
fn keyed_endpoint(key: &ResetKey) -> quinn::EndpointConfig {
    let hmac = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key.0);
    let tag = ring::hmac::sign(&hmac, b"nimbus connection ids");
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&tag.as_ref()[..8]);
    let cid_key = u64::from_le_bytes(cid_key);
    let mut config = quinn::EndpointConfig::new(Arc::new(hmac));
    config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    config
}

fn quic_transport(config: &TransportConfig) -> Result<Arc<quinn::TransportConfig>, EndpointError> {
    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(config.idle_timeout)
        .map_err(|e| EndpointError::Quic(format!("idle_timeout: {e}")))?;
    transport.max_idle_timeout(Some(idle));
    transport.keep_alive_interval(Some(config.idle_timeout / 3));
    transport.max_concurrent_bidi_streams(1024u32.into());
    // nimbus uses bidirectional streams only.
    transport.max_concurrent_uni_streams(0u32.into());
    // Memory a peer can make a node hold (`server/` reads a request only
    // once the connection's budget of four frames has room for it):
    // - a stream's window, what one stream may have sent unread: enough
    //   for loopback and LAN round trips at full speed, small enough that
    //   streams waiting for the budget leave the connection's window to
    //   the requests being read (they would need 32 such streams to fill
    //   it);
    // - the connection's window, what all its streams together may have
    //   sent unread: four frames.
    let frame_window = (config.max_frame_bytes as u64).max(1 << 20);
    transport.stream_receive_window(quinn::VarInt::from_u32(STREAM_WINDOW));
    transport
        .receive_window(quinn::VarInt::from_u64(4 * frame_window).unwrap_or(quinn::VarInt::MAX));
    transport.send_window(4 * frame_window);
    transport.initial_rtt(Duration::from_millis(10));
    Ok(Arc::new(transport))
}

fn io_error(e: quinn::ConnectionError) -> wire::WireError {
    wire::WireError::Io(std::io::Error::other(e))
}

fn connect_error(addr: SocketAddr, after: Duration, e: quinn::ConnectionError) -> ConnectError {
    use quinn::ConnectionError as E;
    match e {
        E::ApplicationClosed(close) => ConnectError::Refused {
            addr,
            code: CloseCode::from_u64(close.error_code.into_inner()),
            reason: String::from_utf8_lossy(&close.reason).into_owned(),
        },
        E::TransportError(t) if is_crypto(t.code) => ConnectError::Unauthenticated {
            addr,
            detail: t.to_string(),
        },
        E::ConnectionClosed(c) if is_crypto(c.error_code) => ConnectError::Unauthenticated {
            addr,
            detail: c.to_string(),
        },
        E::TimedOut => ConnectError::Unreachable { addr, after },
        other => ConnectError::Lost {
            addr,
            detail: other.to_string(),
        },
    }
}

/// TLS alerts travel as QUIC CRYPTO_ERROR codes 0x100..=0x1ff.
fn is_crypto(code: quinn::TransportErrorCode) -> bool {
    (0x100..0x200).contains(&u64::from(code))
}
