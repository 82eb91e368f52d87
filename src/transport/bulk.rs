//! Bulk byte streams between nodes: TLS 1.3 over TCP, with the same
//! cluster certificates as QUIC (`credentials.rs`), for the object
//! transfers QUIC cannot carry near the hardware. quinn processes a
//! connection's packets on one core: about 0.9 GB/s on loopback here,
//! where a pull over a bulk stream moves 2.1–2.9 GB/s (ARCHITECTURE.md).
//!
//! What a stream carries is decided over QUIC, where the caller's identity
//! and rights are checked; the TCP side only honours what was granted
//! there:
//!
//! 1. **Listen.** An accepting endpoint binds a TCP listener
//!    ([`BulkListener`]) on its QUIC address's IP, on the same port number
//!    when that is free (one firewall rule for both), else on any.
//! 2. **Grant.** The server answers a QUIC request with its listener's
//!    port and a one-time [`BulkTicket`] (16 random bytes) naming what the
//!    stream will carry ([`BulkGrants::grant`]). A ticket not used within
//!    [`TICKET_TTL`] (10 s) lapses; at most [`MAX_GRANTS`] (1,024) wait at
//!    once, the oldest lapsing first.
//! 3. **Dial.** The caller connects within `connect_timeout`, does the TLS
//!    handshake (ALPN `nimbus-bulk`, both certificates checked against the
//!    cluster CA, as for QUIC) and sends the ticket
//!    ([`Endpoint::bulk_connect`](super::Endpoint::bulk_connect)).
//! 4. **Serve.** The listener reads the ticket within `connect_timeout` of
//!    the TCP accept (at most 64 handshakes at once) and hands the
//!    stream, with what the ticket granted, to its handler (at most 64
//!    streams at once); a connection without a valid ticket is closed
//!    unread.
//! 5. **Records.** Then rustls hands both ends its traffic secrets and
//!    the stream's TLS records are sealed and opened in place, in
//!    [`INCOMING_BYTES`] and [`OUTGOING_BYTES`] buffers (`records.rs`);
//!    a stream ends with a `close_notify` alert. The dialer sends nothing
//!    past its ticket before the hand-over: rustls would drop what it had
//!    received, so an end that holds any bytes then is refused. A stream
//!    carries at most [`MAX_STREAM_BYTES`] (its key's limit).
//! 6. **Stalls.** A read of a [`BulkStream`] that gets no bytes, or a
//!    write of [`OUTGOING_BYTES`] that does not finish, within
//!    `request_read_timeout` (30 s by default) fails.
//! 7. **Off.** An endpoint with packet faults (which need QUIC's packets),
//!    or with `bulk_over_tcp` off, neither listens nor dials: callers
//!    carry their bytes over QUIC instead, as they do when a dial fails.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::credentials::SERVER_NAME;
use super::error::{BulkError, RecordError};
use super::records::{self, Direction, ALERT, APPLICATION_DATA, CLOSE_NOTIFY};
use super::{CredentialError, Credentials, EndpointError};

/// The ALPN protocol of bulk streams.
pub(super) const BULK_ALPN: &[u8] = b"nimbus-bulk";
/// How long a granted ticket waits for its stream.
pub const TICKET_TTL: Duration = Duration::from_secs(10);
/// The most tickets waiting at once.
pub const MAX_GRANTS: usize = 1024;
/// Handshakes under way at once (step 4); further connections wait in
/// the kernel's backlog.
const MAX_HANDSHAKES: usize = 64;
/// Streams served at once; further ones with a valid ticket wait for one
/// to end.
const MAX_STREAMS: usize = 64;
/// The pause after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The buffer a stream receives records into and opens them in (step 5):
/// large reads, small enough to stay in a core's cache.
const INCOMING_BYTES: usize = 1 << 20;
/// The bytes a stream seals per socket write (step 5).
const OUTGOING_BYTES: usize = 256 << 10;
/// The most bytes one stream carries (step 5): its key seals at most
/// `MAX_RECORDS` records, one of them the `close_notify`.
pub const MAX_STREAM_BYTES: u64 = (records::MAX_RECORDS - 1) * records::MAX_PLAINTEXT as u64;

/// A one-time permission to open one bulk stream (step 2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct BulkTicket(pub [u8; 16]);

impl std::fmt::Debug for BulkTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BulkTicket(<redacted>)")
    }
}

/// The TLS of an endpoint's bulk streams.
pub(super) struct BulkTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl BulkTls {
    pub(super) fn new(credentials: &Credentials) -> Result<Self, CredentialError> {
        let mut server = credentials.server_tls()?;
        server.alpn_protocols = vec![BULK_ALPN.to_vec()];
        // Step 5: the secrets are handed over, and no session ticket may
        // follow the handshake.
        server.enable_secret_extraction = true;
        server.send_tls13_tickets = 0;
        let mut client = credentials.client_tls()?;
        client.alpn_protocols = vec![BULK_ALPN.to_vec()];
        client.enable_secret_extraction = true;
        Ok(BulkTls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }

    /// Step 3.
    pub(super) async fn connect(
        &self,
        addr: SocketAddr,
        ticket: BulkTicket,
        connect_timeout: Duration,
        stall: Duration,
    ) -> Result<BulkStream, BulkError> {
        let dial = async {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|cause| BulkError::Io { addr, cause })?;
            let _ = tcp.set_nodelay(true);
            let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).map_err(|e| {
                BulkError::Tls {
                    addr,
                    detail: e.to_string(),
                }
            })?;
            let mut tls = self
                .connector
                .connect(name, tcp)
                .await
                .map_err(|e| BulkError::Tls {
                    addr,
                    detail: e.to_string(),
                })?;
            tls.write_all(&ticket.0)
                .await
                .map_err(|cause| BulkError::Io { addr, cause })?;
            tls.flush()
                .await
                .map_err(|cause| BulkError::Io { addr, cause })?;
            let (tcp, tls) = tls.into_inner();
            let secrets = hand_over(tls).map_err(|e| BulkError::Tls {
                addr,
                detail: e.to_string(),
            })?;
            BulkStream::new(tcp, secrets, addr, stall)
        };
        tokio::time::timeout(connect_timeout, dial)
            .await
            .map_err(|_| BulkError::Stalled {
                addr,
                after: connect_timeout,
            })?
    }
}

/// The tickets a server granted and not yet honoured, with what each
/// grants (`G`).
pub struct BulkGrants<G> {
    port: u16,
    waiting: Arc<Mutex<HashMap<BulkTicket, (G, Instant)>>>,
}

impl<G> Clone for BulkGrants<G> {
    fn clone(&self) -> Self {
        BulkGrants {
            port: self.port,
            waiting: self.waiting.clone(),
        }
    }
}

impl<G> BulkGrants<G> {
    /// The port of the listener the tickets are for.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A ticket for one stream carrying `what` (step 2).
    pub fn grant(&self, what: G) -> BulkTicket {
        let mut ticket = [0u8; 16];
        rand::fill(&mut ticket);
        let ticket = BulkTicket(ticket);
        let now = Instant::now();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(|_, (_, at)| now.duration_since(*at) < TICKET_TTL);
        if waiting.len() >= MAX_GRANTS {
            let oldest = waiting
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(t, _)| *t);
            if let Some(oldest) = oldest {
                waiting.remove(&oldest);
            }
        }
        waiting.insert(ticket, (what, now));
        ticket
    }

    fn redeem(&self, ticket: &BulkTicket) -> Option<G> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let (what, at) = waiting.remove(ticket)?;
        (at.elapsed() < TICKET_TTL).then_some(what)
    }
}

/// An endpoint's bulk listener (step 1), until it [serves](Self::serve).
pub struct BulkListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    connect_timeout: Duration,
    stall: Duration,
}

impl BulkListener {
    pub(super) fn bind(
        quic: SocketAddr,
        tls: &BulkTls,
        connect_timeout: Duration,
        stall: Duration,
    ) -> Result<Self, EndpointError> {
        let any = SocketAddr::new(quic.ip(), 0);
        let tcp = std::net::TcpListener::bind(quic)
            .or_else(|_| std::net::TcpListener::bind(any))
            .and_then(|tcp| {
                tcp.set_nonblocking(true)?;
                TcpListener::from_std(tcp)
            })
            .map_err(|cause| EndpointError::Bind { addr: any, cause })?;
        Ok(BulkListener {
            tcp,
            acceptor: tls.acceptor.clone(),
            connect_timeout,
            stall,
        })
    }

    /// The grants this listener will honour.
    pub fn grants<G>(&self) -> BulkGrants<G> {
        BulkGrants {
            port: self.tcp.local_addr().map_or(0, |a| a.port()),
            waiting: Arc::default(),
        }
    }

    /// Accepts streams for `grants`' tickets and hands each to `handle`
    /// with what its ticket grants (step 4). Runs until dropped.
    pub async fn serve<G, F, Fut>(self, grants: BulkGrants<G>, handle: F)
    where
        G: Send + 'static,
        F: Fn(G, BulkStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let handle = Arc::new(handle);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        let serving = Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS));
        let mut streams = tokio::task::JoinSet::new();
        loop {
            let Ok(handshake) = handshakes.clone().acquire_owned().await else {
                return;
            };
            let (tcp, peer) = tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, say: wait a little
                        // rather than spin.
                        tracing::debug!("bulk listener: accept failed: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
                Some(_) = streams.join_next(), if !streams.is_empty() => continue,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, grants, handle, serving) = (
                self.acceptor.clone(),
                grants.clone(),
                handle.clone(),
                serving.clone(),
            );
            let (connect_timeout, stall) = (self.connect_timeout, self.stall);
            streams.spawn(async move {
                let opened = async {
                    let mut tls = acceptor.accept(tcp).await.ok()?;
                    let mut ticket = [0u8; 16];
                    tls.read_exact(&mut ticket).await.ok()?;
                    let (tcp, tls) = tls.into_inner();
                    let secrets = hand_over(tls).ok()?;
                    Some((tcp, secrets, BulkTicket(ticket)))
                };
                let opened = tokio::time::timeout(connect_timeout, opened).await;
                drop(handshake);
                let Ok(Some((tcp, secrets, ticket))) = opened else {
                    tracing::debug!("bulk stream from {peer}: no handshake, ticket and hand-over within {connect_timeout:?}");
                    return;
                };
                let Some(what) = grants.redeem(&ticket) else {
                    tracing::warn!("bulk stream from {peer}: its ticket was never granted or has lapsed; closed unread");
                    return;
                };
                let Ok(_serving) = serving.acquire_owned().await else {
                    return;
                };
                match BulkStream::new(tcp, secrets, peer, stall) {
                    Ok(stream) => handle(what, stream).await,
                    Err(e) => tracing::warn!("bulk stream from {peer}: {e}"),
                }
            });
        }
    }
}

/// One bulk stream, either end: its socket and the records of both
/// directions (step 5).
pub struct BulkStream {
    tcp: TcpStream,
    peer: SocketAddr,
    stall: Duration,
    seal: Direction,
    open: Direction,
    /// Bytes received: opened up to `opened`, filled up to `filled`.
    incoming: Vec<u8>,
    opened: usize,
    filled: usize,
    /// Where the bytes of the record last opened not yet read are.
    plain: std::ops::Range<usize>,
    /// Whether the other end said it has ended (`close_notify`).
    closed: bool,
    outgoing: Vec<u8>,
}

impl BulkStream {
    fn new(
        tcp: TcpStream,
        secrets: rustls::ExtractedSecrets,
        peer: SocketAddr,
        stall: Duration,
    ) -> Result<Self, BulkError> {
        let record = |cause| BulkError::Record { addr: peer, cause };
        Ok(BulkStream {
            tcp,
            peer,
            stall,
            seal: Direction::new(secrets.tx).map_err(record)?,
            open: Direction::new(secrets.rx).map_err(record)?,
            incoming: Vec::new(),
            opened: 0,
            filled: 0,
            plain: 0..0,
            closed: false,
            outgoing: Vec::new(),
        })
    }

    /// The other end.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Reads `len` bytes, appended to `into` without zero-filling it
    /// first; fails on an early end or a stall (step 6).
    pub async fn read_exact_into(
        &mut self,
        into: &mut Vec<u8>,
        len: usize,
    ) -> Result<(), BulkError> {
        let end = into.len() + len;
        into.reserve(len);
        while into.len() < end {
            if self.plain.is_empty() {
                self.next_record().await.map_err(|e| match e {
                    BulkError::Ended { addr, .. } => BulkError::Ended {
                        addr,
                        missing: (end - into.len()) as u64,
                    },
                    other => other,
                })?;
            }
            let take = self.plain.len().min(end - into.len());
            let from = self.plain.start;
            into.extend_from_slice(&self.incoming[from..from + take]);
            self.plain.start += take;
        }
        Ok(())
    }

    /// Opens the next record of application data, receiving more bytes
    /// while none is whole (step 5).
    async fn next_record(&mut self) -> Result<(), BulkError> {
        let record = |cause| BulkError::Record {
            addr: self.peer,
            cause,
        };
        loop {
            let ended = BulkError::Ended {
                addr: self.peer,
                missing: 0,
            };
            if self.closed {
                return Err(ended);
            }
            let at = self.opened;
            match self
                .open
                .open(&mut self.incoming[at..self.filled])
                .map_err(record)?
            {
                Some(opened) => {
                    self.opened += opened.len;
                    let plain = at + opened.plain.start..at + opened.plain.end;
                    match opened.content_type {
                        APPLICATION_DATA => {
                            self.plain = plain;
                            if !self.plain.is_empty() {
                                return Ok(());
                            }
                        }
                        ALERT if self.incoming[plain.clone()] == CLOSE_NOTIFY => self.closed = true,
                        ALERT => {
                            let description = self.incoming[plain].last().copied();
                            return Err(record(RecordError::Alert(description.unwrap_or(0))));
                        }
                        other => return Err(record(RecordError::Unexpected(other))),
                    }
                }
                None => {
                    // What is left is the start of a record: moved to the
                    // front, to receive the rest behind it.
                    self.incoming.copy_within(self.opened..self.filled, 0);
                    self.filled -= self.opened;
                    self.opened = 0;
                    if self.incoming.len() < INCOMING_BYTES {
                        self.incoming.resize(INCOMING_BYTES, 0);
                    }
                    let free = &mut self.incoming[self.filled..];
                    let read = within(self.peer, self.stall, self.tcp.read(free)).await?;
                    // A sender that drops the connection (a refused
                    // ticket, a failed read) sends no close_notify.
                    let read = read.map_err(|cause| BulkError::Io {
                        addr: self.peer,
                        cause,
                    })?;
                    if read == 0 {
                        return Err(ended);
                    }
                    self.filled += read;
                }
            }
        }
    }

    /// Writes all of `bytes`; fails on a stall (step 6).
    pub async fn write_all(&mut self, bytes: &[u8]) -> Result<(), BulkError> {
        for piece in bytes.chunks(OUTGOING_BYTES) {
            self.send(APPLICATION_DATA, piece).await?;
        }
        Ok(())
    }

    /// Seals `bytes` of `content_type` and writes them.
    async fn send(&mut self, content_type: u8, bytes: &[u8]) -> Result<(), BulkError> {
        self.outgoing.clear();
        self.seal
            .seal(content_type, bytes, &mut self.outgoing)
            .map_err(|cause| BulkError::Record {
                addr: self.peer,
                cause,
            })?;
        let written = within(self.peer, self.stall, self.tcp.write_all(&self.outgoing)).await?;
        written.map_err(|cause| BulkError::Io {
            addr: self.peer,
            cause,
        })
    }

    /// Ends the stream: the other end reads its end.
    pub async fn finish(mut self) -> Result<(), BulkError> {
        self.send(ALERT, &CLOSE_NOTIFY).await?;
        let ended = within(self.peer, self.stall, self.tcp.shutdown()).await?;
        ended.map_err(|cause| BulkError::Io {
            addr: self.peer,
            cause,
        })
    }
}

/// The traffic secrets of `tls` (step 5); refused if it holds records
/// received past the handshake and ticket, which the hand-over would drop.
fn hand_over(
    tls: impl Into<rustls::Connection>,
) -> Result<rustls::ExtractedSecrets, rustls::Error> {
    let mut tls = tls.into();
    match tls.process_new_packets()?.plaintext_bytes_to_read() {
        0 => tls.dangerous_extract_secrets(),
        early => Err(rustls::Error::General(format!(
            "{early} bytes came before the hand-over"
        ))),
    }
}

/// What `io` gave, unless it took longer than `stall` (step 6).
async fn within<T>(
    peer: SocketAddr,
    stall: Duration,
    io: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<std::io::Result<T>, BulkError> {
    tokio::time::timeout(stall, io)
        .await
        .map_err(|_| BulkError::Stalled {
            addr: peer,
            after: stall,
        })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::transport::{Endpoint, JoinToken, PacketFaults, TransportConfig};
    use crate::wire::{Incarnation, NodeIdentity, PeerIdentity, PeerRole};

    fn endpoint(token: &JoinToken, listen: bool, config: TransportConfig) -> Endpoint {
        let me = PeerIdentity {
            role: PeerRole::Node,
            identity: NodeIdentity {
                name: "bulk-test".into(),
                incarnation: Incarnation::fresh(),
            },
        };
        let credentials = Credentials::issue(token, "bulk-test").unwrap();
        match listen {
            true => {
                let socket = Endpoint::bind_socket(([127, 0, 0, 1], 0).into()).unwrap();
                Endpoint::listen(socket, me, &credentials, config).unwrap()
            }
            false => Endpoint::client(me, &credentials, config).unwrap(),
        }
    }

    /// A server whose handler writes what each ticket grants, counting
    /// the streams it was handed.
    fn serving(token: &JoinToken) -> (Endpoint, BulkGrants<Vec<u8>>, Arc<AtomicUsize>) {
        let server = endpoint(token, true, TransportConfig::default());
        let listener = server
            .bulk_listener()
            .unwrap()
            .expect("bulk streams are on");
        let grants = listener.grants();
        let handed = Arc::new(AtomicUsize::new(0));
        let count = handed.clone();
        tokio::spawn(
            listener.serve(grants.clone(), move |bytes: Vec<u8>, mut stream| {
                count.fetch_add(1, Ordering::SeqCst);
                async move {
                    stream.write_all(&bytes).await.unwrap();
                    stream.finish().await.unwrap();
                }
            }),
        );
        (server, grants, handed)
    }

    fn bulk_addr(server: &Endpoint, grants: &BulkGrants<Vec<u8>>) -> SocketAddr {
        SocketAddr::new(server.local_addr().ip(), grants.port())
    }

    #[tokio::test]
    async fn a_granted_ticket_carries_its_bytes_once() {
        let token = JoinToken::generate();
        let (server, grants, handed) = serving(&token);
        let client = endpoint(&token, false, TransportConfig::default());
        let bytes: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        let ticket = grants.grant(bytes.clone());
        let mut stream = client
            .bulk_connect(bulk_addr(&server, &grants), ticket)
            .await
            .unwrap();
        let mut got = Vec::new();
        stream.read_exact_into(&mut got, bytes.len()).await.unwrap();
        assert!(got == bytes, "the stream carried other bytes");
        // The end, and nothing more.
        let past = stream.read_exact_into(&mut got, 1).await;
        assert!(
            matches!(past, Err(BulkError::Ended { missing: 1, .. })),
            "{past:?}"
        );

        // The same ticket again, and one never granted: closed unread.
        for ticket in [ticket, BulkTicket([7; 16])] {
            let mut stream = client
                .bulk_connect(bulk_addr(&server, &grants), ticket)
                .await
                .unwrap();
            let read = stream.read_exact_into(&mut Vec::new(), 1).await;
            assert!(matches!(read, Err(BulkError::Ended { .. })), "{read:?}");
        }
        assert_eq!(handed.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn another_clusters_process_gets_no_stream() {
        let token = JoinToken::generate();
        let (server, grants, handed) = serving(&token);
        let stranger = endpoint(&JoinToken::generate(), false, TransportConfig::default());
        let ticket = grants.grant(b"secret".to_vec());
        let opened = stranger
            .bulk_connect(bulk_addr(&server, &grants), ticket)
            .await;
        // TLS 1.3: the client may finish its side before the server has
        // checked the client's certificate; then the read fails.
        if let Ok(mut stream) = opened {
            let mut got = Vec::new();
            let read = stream.read_exact_into(&mut got, 6).await;
            assert!(read.is_err() && got.is_empty(), "{read:?}: {got:?}");
        }
        assert_eq!(handed.load(Ordering::SeqCst), 0);
    }

    /// Step 5 puts on the wire what rustls itself would: a stream read by
    /// plain rustls after the hand-over, and one written by plain rustls,
    /// carry their bytes and end cleanly.
    #[tokio::test]
    async fn handed_over_records_are_the_records_rustls_reads_and_writes() {
        let token = JoinToken::generate();
        let bytes: Vec<u8> = (0..(3 << 20) + 5).map(|i| (i % 253) as u8).collect();
        let credentials = Credentials::issue(&token, "plain-rustls").unwrap();

        // Sealed here, read by rustls.
        let (server, grants, _) = serving(&token);
        let ticket = grants.grant(bytes.clone());
        let mut client = credentials.client_tls().unwrap();
        client.alpn_protocols = vec![BULK_ALPN.to_vec()];
        let tcp = TcpStream::connect(bulk_addr(&server, &grants))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        let mut tls = TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(&ticket.0).await.unwrap();
        tls.flush().await.unwrap();
        let mut got = Vec::new();
        tls.read_to_end(&mut got)
            .await
            .expect("rustls reads the records and the close_notify");
        assert!(got == bytes, "rustls read other bytes");

        // Written by rustls, opened here.
        let mut plain = credentials.server_tls().unwrap();
        plain.alpn_protocols = vec![BULK_ALPN.to_vec()];
        plain.send_tls13_tickets = 0;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = bytes.clone();
        let serve = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = TlsAcceptor::from(Arc::new(plain))
                .accept(tcp)
                .await
                .unwrap();
            let mut ticket = [0u8; 16];
            tls.read_exact(&mut ticket).await.unwrap();
            tls.write_all(&sent).await.unwrap();
            tls.shutdown().await.unwrap();
        });
        let client = endpoint(&token, false, TransportConfig::default());
        let mut stream = client
            .bulk_connect(addr, BulkTicket([1; 16]))
            .await
            .unwrap();
        let mut got = Vec::new();
        stream.read_exact_into(&mut got, bytes.len()).await.unwrap();
        assert!(
            got == bytes,
            "the records rustls wrote opened to other bytes"
        );
        let past = stream.read_exact_into(&mut got, 1).await;
        assert!(
            matches!(past, Err(BulkError::Ended { missing: 1, .. })),
            "{past:?}"
        );
        serve.await.unwrap();
    }

    #[tokio::test]
    async fn packet_faults_turn_bulk_streams_off() {
        let token = JoinToken::generate();
        let faults = TransportConfig {
            packet_faults: Some(PacketFaults::default()),
            ..TransportConfig::default()
        };
        let server = endpoint(&token, true, faults.clone());
        assert!(server.bulk_listener().unwrap().is_none());
        let client = endpoint(&token, false, faults);
        let addr = ([127, 0, 0, 1], 9).into();
        let dialed = client.bulk_connect(addr, BulkTicket([0; 16])).await;
        assert!(matches!(dialed, Err(BulkError::Off)), "{:?}", dialed.err());
    }

    #[test]
    fn tickets_lapse_and_are_bounded() {
        let grants: BulkGrants<usize> = BulkGrants {
            port: 1,
            waiting: Arc::default(),
        };
        let first = grants.grant(0);
        for i in 1..=MAX_GRANTS {
            grants.grant(i);
        }
        assert_eq!(grants.waiting.lock().unwrap().len(), MAX_GRANTS);
        assert_eq!(grants.redeem(&first), None, "the oldest lapsed first");
        let late = grants.grant(99);
        grants.waiting.lock().unwrap().get_mut(&late).unwrap().1 = Instant::now() - TICKET_TTL;
        assert_eq!(grants.redeem(&late), None, "a ticket past its time");
    }
}
