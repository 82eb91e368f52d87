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
//!    stream will carry and the certificate of the caller it is for
//!    ([`BulkGrants::grant`]): presented over a TLS session of another
//!    certificate, a ticket is spent and honours nothing. A ticket not
//!    used within [`TICKET_TTL`](super::TICKET_TTL) (10 s) lapses; at most
//!    [`MAX_GRANTS`](super::MAX_GRANTS) (1,024) wait at once, the oldest
//!    lapsing first (`bulk_grants.rs`).
//! 3. **Dial.** The caller connects within `connect_timeout`, sends the
//!    ticket's 16-byte admission tag ([`BulkTicket::admission`], a hash of
//!    the ticket), does the TLS handshake (ALPN `nimbus-bulk`, both
//!    certificates checked against the cluster CA, as for QUIC) and sends
//!    the ticket ([`Endpoint::bulk_connect`](super::Endpoint::bulk_connect)).
//! 4. **Serve.** The listener, on a thread of its own (so that a flood of
//!    handshakes never delays the node's heartbeats), admits each TCP
//!    connection by its source address (`bulk_sources.rs`: at most 32
//!    handshakes in progress and 512 a second per address), reads the
//!    admission tag and begins a TLS handshake only for the tag of a
//!    waiting grant, once (a stranger costs a hash, never a signature),
//!    reads the ticket within `connect_timeout` of the TCP accept (at most
//!    64 handshakes at once) and hands the stream, with what the ticket
//!    granted, to its handler (at most 64 streams at once); a connection
//!    without a valid tag and ticket is closed unread.
//! 5. **Records.** Then rustls hands both ends its traffic secrets and
//!    the stream's TLS records are sealed and opened in place, in
//!    [`INCOMING_BYTES`] and [`OUTGOING_BYTES`] buffers (`records.rs`);
//!    a stream ends with a `close_notify` alert. The dialer sends nothing
//!    past its ticket before the hand-over: rustls would drop what it had
//!    received, so an end that holds any bytes then is refused. A stream
//!    carries at most [`MAX_STREAM_BYTES`] (its key's limit). A file's
//!    bytes are read straight into the records that carry them
//!    ([`BulkStream::write_from_file`], `preadv`), and received records'
//!    bytes written to a file from where they were opened
//!    ([`BulkStream::read_into_file`], `pwritev`, a buffer at a time).
//! 6. **Stalls.** From the hand-over the stream's socket blocks, with
//!    `request_read_timeout` (30 s by default) as its read and write
//!    timeouts: a read or a write that moves no byte for that long fails.
//!    Each end runs its side on a thread of its own
//!    ([`BulkStream::on_own_thread`]; dropping the wait for it shuts the
//!    socket down, which ends the thread's blocking call), where the whole
//!    stream goes through one thread (on the 2-core development machine,
//!    first pulls of 256 MiB on loopback went from 1.5 to 2.0 GB/s in
//!    median when both ends stopped handing chunks between threads).
//! 7. **Off.** An endpoint with packet faults (which need QUIC's packets),
//!    or with `bulk_over_tcp` off, neither listens nor dials: callers
//!    carry their bytes over QUIC instead, as they do when a dial fails.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::io::{Read as _, Write as _};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::bulk_grants::{BulkGrants, BulkTicket};
use super::bulk_sources::{SourceLimits, SourceSlot};
use super::credentials::SERVER_NAME;
use super::error::{BulkError, RecordError};
use super::records::{self, Direction, ALERT, APPLICATION_DATA, CLOSE_NOTIFY};
use super::tickets::CertificateHash;
use super::{CredentialError, Credentials, EndpointError};

/// The ALPN protocol of bulk streams.
pub(super) const BULK_ALPN: &[u8] = b"nimbus-bulk";
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
            let mut tcp = tcp;
            tcp.write_all(&ticket.admission())
                .await
                .map_err(|cause| BulkError::Io { addr, cause })?;
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

/// An endpoint's bulk listener (step 1), until it [serves](Self::serve).
pub struct BulkListener {
    /// Non-blocking; registered with the runtime that serves it.
    tcp: std::net::TcpListener,
    acceptor: TlsAcceptor,
    connect_timeout: Duration,
    stall: Duration,
}

impl BulkListener {
    /// Binds the advertised IP (the QUIC port if free, else any port), so
    /// the port is not open on the host's other addresses; an advertised
    /// IP that is not this host's (behind NAT) falls back to the QUIC
    /// socket's IP, saying so.
    pub(super) fn bind(
        advertised: IpAddr,
        quic: SocketAddr,
        tls: &BulkTls,
        connect_timeout: Duration,
        stall: Duration,
    ) -> Result<Self, EndpointError> {
        let tries = [
            SocketAddr::new(advertised, quic.port()),
            SocketAddr::new(advertised, 0),
            quic,
            SocketAddr::new(quic.ip(), 0),
        ];
        let mut failed = None;
        let mut bound = None;
        for addr in tries {
            match std::net::TcpListener::bind(addr) {
                Ok(tcp) => {
                    bound = Some(tcp);
                    break;
                }
                Err(cause) => failed = Some(EndpointError::Bind { addr, cause }),
            }
        }
        let Some(tcp) = bound else {
            return Err(failed.unwrap_or(EndpointError::Bind {
                addr: quic,
                cause: std::io::ErrorKind::AddrNotAvailable.into(),
            }));
        };
        tcp.set_nonblocking(true)
            .map_err(|cause| EndpointError::Bind { addr: quic, cause })?;
        if tcp.local_addr().is_ok_and(|a| a.ip() != advertised) {
            tracing::warn!(
                "the bulk listener cannot bind the advertised IP {advertised} (not this host's?): it listens on {} instead",
                quic.ip()
            );
        }
        Ok(BulkListener {
            tcp,
            acceptor: tls.acceptor.clone(),
            connect_timeout,
            stall,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The grants this listener will honour.
    pub fn grants<G>(&self) -> BulkGrants<G> {
        BulkGrants {
            port: self.tcp.local_addr().map_or(0, |a| a.port()),
            waiting: Arc::default(),
        }
    }

    /// [`serve`](Self::serve)s on a thread of its own, with a runtime of
    /// its own (step 4), until the returned server is dropped.
    pub fn serve_on_own_thread<G, F, Fut>(
        self,
        grants: BulkGrants<G>,
        handle: F,
    ) -> std::io::Result<BulkServer>
    where
        G: Send + 'static,
        F: Fn(G, BulkStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("nimbus-bulk".into())
            .spawn(move || {
                runtime.block_on(async {
                    tokio::select! {
                        () = self.serve(grants, handle) => {}
                        _ = stopped => {}
                    }
                });
                // Streams still under way run on blocking threads: they
                // end at their stall timeout at the latest; do not wait.
                runtime.shutdown_background();
            })?;
        Ok(BulkServer { _stop: stop })
    }

    /// Accepts streams for `grants`' tickets and hands each to `handle`
    /// with what its ticket grants (step 4). Runs until dropped; a
    /// listener that cannot be registered with the runtime ends at once,
    /// saying so.
    pub async fn serve<G, F, Fut>(self, grants: BulkGrants<G>, handle: F)
    where
        G: Send + 'static,
        F: Fn(G, BulkStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let tcp = match TcpListener::from_std(self.tcp) {
            Ok(tcp) => tcp,
            Err(e) => {
                tracing::warn!(
                    "bulk listener: cannot serve ({e}): objects leave this node over QUIC"
                );
                return;
            }
        };
        let sources = Arc::new(Mutex::new(SourceLimits::default()));
        let handle = Arc::new(handle);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        let serving = Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS));
        let mut streams = tokio::task::JoinSet::new();
        loop {
            let Ok(handshake) = handshakes.clone().acquire_owned().await else {
                return;
            };
            let (tcp, peer) = tokio::select! {
                accepted = tcp.accept() => match accepted {
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
            let Some(source) = SourceSlot::admit(&sources, peer.ip(), Instant::now()) else {
                continue;
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
                    let mut tcp = tcp;
                    let mut tag = [0u8; 16];
                    tcp.read_exact(&mut tag).await.ok()?;
                    if !grants.admit(&tag) {
                        tracing::debug!("bulk stream from {peer}: no admission tag of a waiting grant; closed before its handshake");
                        return None;
                    }
                    let mut tls = acceptor.accept(tcp).await.ok()?;
                    let presented = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .map(|leaf| CertificateHash::of(leaf))?;
                    let mut ticket = [0u8; 16];
                    tls.read_exact(&mut ticket).await.ok()?;
                    let (tcp, tls) = tls.into_inner();
                    let secrets = hand_over(tls).ok()?;
                    Some((tcp, secrets, BulkTicket(ticket), presented))
                };
                let opened = tokio::time::timeout(connect_timeout, opened).await;
                drop((handshake, source));
                let Ok(Some((tcp, secrets, ticket, presented))) = opened else {
                    tracing::debug!("bulk stream from {peer}: no handshake, ticket and hand-over within {connect_timeout:?}");
                    return;
                };
                let Some(what) = grants.redeem(&ticket, presented) else {
                    tracing::warn!("bulk stream from {peer}: its ticket was never granted, has lapsed or is another certificate's; closed unread");
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

/// A bulk listener serving on its own thread
/// ([`BulkListener::serve_on_own_thread`]): dropped, it stops accepting.
#[derive(Debug)]
pub struct BulkServer {
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// One bulk stream, either end, once handed over: its socket and the
/// records of both directions (step 5). Its reads and writes block, with
/// the stall as the socket's timeouts (step 6): an async caller runs them
/// on a thread of their own (`spawn_blocking`), where a whole object goes
/// through one thread, with no hand-over between threads per chunk.
pub struct BulkStream {
    tcp: std::net::TcpStream,
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
        let io = |cause| BulkError::Io { addr: peer, cause };
        let tcp = tcp.into_std().map_err(io)?;
        // Step 6: a read or write that moves nothing for `stall` fails
        // (a zero timeout is refused by the socket: at least 1 ms).
        let timeout = Some(stall.max(Duration::from_millis(1)));
        tcp.set_nonblocking(false)
            .and_then(|()| tcp.set_read_timeout(timeout))
            .and_then(|()| tcp.set_write_timeout(timeout))
            .map_err(io)?;
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

    /// Runs `work` on this stream on a blocking thread of its own (step
    /// 6) and gives its result once the thread is done. Dropping the
    /// future first (a cancelled caller, a node stopping) shuts the
    /// socket down, which ends the thread's blocking call at once.
    pub async fn on_own_thread<T: Send + 'static>(
        mut self,
        work: impl FnOnce(&mut BulkStream) -> T + Send + 'static,
    ) -> Result<T, BulkError> {
        let peer = self.peer;
        let socket = self.tcp.try_clone().map_err(|cause| self.io(cause))?;
        let mut interrupt = ShutDownOnDrop(Some(socket));
        let done = tokio::task::spawn_blocking(move || work(&mut self)).await;
        // Done: nothing to interrupt (the clone's descriptor just closes).
        interrupt.0 = None;
        done.map_err(|e| BulkError::Thread {
            addr: peer,
            detail: e.to_string(),
        })
    }

    /// Reads `len` bytes, appended to `into` without zero-filling it
    /// first; fails on an early end or a stall (step 6).
    pub fn read_exact_into(&mut self, into: &mut Vec<u8>, len: usize) -> Result<(), BulkError> {
        let end = into.len() + len;
        into.reserve(len);
        while into.len() < end {
            if self.plain.is_empty() {
                let missing = (end - into.len()) as u64;
                if !self.open_received(missing)? {
                    self.receive(missing, 1)?;
                    continue;
                }
            }
            let take = self.plain.len().min(end - into.len());
            let from = self.plain.start;
            into.extend_from_slice(&self.incoming[from..from + take]);
            self.plain.start += take;
        }
        Ok(())
    }

    /// Reads `len` bytes into `file` from offset `at`: the records are
    /// opened where they were received, and the bytes of as many as the
    /// buffer holds go to the file in one `pwritev`, with no copy between.
    /// Fails on an early end, a stall (step 6) or a failed write.
    pub fn read_into_file(
        &mut self,
        file: &std::fs::File,
        mut at: u64,
        len: u64,
    ) -> Result<(), BulkError> {
        let mut left = len;
        let mut ranges = Vec::new();
        while left > 0 {
            if self.plain.is_empty() && !self.open_received(left)? {
                // The records opened go to the file before the buffer is
                // reused; then the bytes the rest needs at least (each
                // record carries at most `MAX_PLAINTEXT`), up to a full
                // buffer, are received.
                at += self.write_ranges(file, &mut ranges, at)?;
                let records = left.div_ceil(records::MAX_PLAINTEXT as u64);
                let wire = left + records * records::OVERHEAD as u64;
                self.receive(left, wire.min(INCOMING_BYTES as u64) as usize)?;
                continue;
            }
            let take = (self.plain.len() as u64).min(left) as usize;
            ranges.push(self.plain.start..self.plain.start + take);
            self.plain.start += take;
            left -= take as u64;
        }
        self.write_ranges(file, &mut ranges, at)?;
        Ok(())
    }

    /// Writes the received bytes at `ranges` to `file` at `at`, and
    /// forgets them; how many there were.
    fn write_ranges(
        &self,
        file: &std::fs::File,
        ranges: &mut Vec<std::ops::Range<usize>>,
        at: u64,
    ) -> Result<u64, BulkError> {
        let slices: Vec<_> = ranges
            .drain(..)
            .map(|range| &self.incoming[range])
            .collect();
        let failed = |cause| BulkError::File {
            addr: self.peer,
            action: "write",
            cause,
        };
        write_all_vectored_at(file, &slices, at).map_err(failed)
    }

    /// Opens the next record received, if all of it was: `Ok(true)`
    /// with its bytes in `plain` (step 5). `missing` bytes are still
    /// expected, for the error of a stream that ended.
    fn open_received(&mut self, missing: u64) -> Result<bool, BulkError> {
        let record = |cause| BulkError::Record {
            addr: self.peer,
            cause,
        };
        loop {
            if self.closed {
                return Err(BulkError::Ended {
                    addr: self.peer,
                    missing,
                });
            }
            let at = self.opened;
            let Some(opened) = self
                .open
                .open(&mut self.incoming[at..self.filled])
                .map_err(record)?
            else {
                return Ok(false);
            };
            self.opened += opened.len;
            let plain = at + opened.plain.start..at + opened.plain.end;
            match opened.content_type {
                APPLICATION_DATA => {
                    self.plain = plain;
                    if !self.plain.is_empty() {
                        return Ok(true);
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
    }

    /// Moves what is left of the buffer (the start of a record) to its
    /// front and receives behind it until it holds `want` bytes (at
    /// least one read); `missing` bytes are still expected, for the error
    /// of a stream that ends.
    fn receive(&mut self, missing: u64, want: usize) -> Result<(), BulkError> {
        self.incoming.copy_within(self.opened..self.filled, 0);
        self.filled -= self.opened;
        self.opened = 0;
        if self.incoming.len() < INCOMING_BYTES {
            self.incoming.resize(INCOMING_BYTES, 0);
        }
        let want = want.clamp(self.filled + 1, INCOMING_BYTES);
        while self.filled < want {
            match self.tcp.read(&mut self.incoming[self.filled..]) {
                // A sender that drops the connection (a refused ticket, a
                // failed read) sends no close_notify.
                Ok(0) => {
                    return Err(BulkError::Ended {
                        addr: self.peer,
                        missing,
                    })
                }
                Ok(read) => self.filled += read,
                Err(cause) if cause.kind() == std::io::ErrorKind::Interrupted => {}
                Err(cause) => return Err(self.io(cause)),
            }
        }
        Ok(())
    }

    /// The error of a failed socket call: a stall when its timeout ran
    /// out (step 6).
    fn io(&self, cause: std::io::Error) -> BulkError {
        match cause.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => BulkError::Stalled {
                addr: self.peer,
                after: self.stall,
            },
            _ => BulkError::Io {
                addr: self.peer,
                cause,
            },
        }
    }

    /// Writes all of `bytes`; fails on a stall (step 6).
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), BulkError> {
        for piece in bytes.chunks(OUTGOING_BYTES) {
            self.outgoing.clear();
            self.seal
                .seal(APPLICATION_DATA, piece, &mut self.outgoing)
                .map_err(|cause| BulkError::Record {
                    addr: self.peer,
                    cause,
                })?;
            self.send()?;
        }
        Ok(())
    }

    /// Writes `len` bytes of `file` from offset `at`: each piece is read
    /// straight into the records it is sealed in (`preadv`), with no copy
    /// between. Fails on a stall (step 6), or when the file cannot be read
    /// or ends early.
    pub fn write_from_file(
        &mut self,
        file: &std::fs::File,
        mut at: u64,
        len: u64,
    ) -> Result<(), BulkError> {
        let end = at + len;
        while at < end {
            let piece = ((end - at) as usize).min(OUTGOING_BYTES);
            let mut bodies = records::lay_out(piece, &mut self.outgoing);
            read_exact_vectored_at(file, &mut bodies, at).map_err(|cause| BulkError::File {
                addr: self.peer,
                action: "read",
                cause,
            })?;
            self.seal
                .seal_laid_out(APPLICATION_DATA, &mut self.outgoing)
                .map_err(|cause| BulkError::Record {
                    addr: self.peer,
                    cause,
                })?;
            self.send()?;
            at += piece as u64;
        }
        Ok(())
    }

    /// Writes the records sealed in `outgoing`.
    fn send(&mut self) -> Result<(), BulkError> {
        self.tcp
            .write_all(&self.outgoing)
            .map_err(|cause| self.io(cause))
    }

    /// Ends the stream: the other end reads its end.
    pub fn finish(&mut self) -> Result<(), BulkError> {
        self.outgoing.clear();
        self.seal
            .seal(ALERT, &CLOSE_NOTIFY, &mut self.outgoing)
            .map_err(|cause| BulkError::Record {
                addr: self.peer,
                cause,
            })?;
        self.send()?;
        self.tcp
            .shutdown(std::net::Shutdown::Write)
            .map_err(|cause| self.io(cause))
    }
}

/// A stream's socket, shut down when dropped unless taken out first
/// ([`BulkStream::on_own_thread`]).
struct ShutDownOnDrop(Option<std::net::TcpStream>);

impl Drop for ShutDownOnDrop {
    fn drop(&mut self) {
        if let Some(socket) = self.0.take() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Slices a vectored file call takes at most (under Linux's `IOV_MAX`,
/// 1,024).
const MAX_SLICES: usize = 512;

/// Writes all of `slices` to `file` from offset `at` (`pwritev`, again
/// from where a short write stopped); how many bytes that was.
fn write_all_vectored_at(file: &std::fs::File, slices: &[&[u8]], at: u64) -> std::io::Result<u64> {
    let total: usize = slices.iter().map(|s| s.len()).sum();
    let mut done = 0;
    while done < total {
        let mut skip = done;
        let rest: Vec<_> = slices
            .iter()
            .filter_map(|slice| match skip.checked_sub(slice.len()) {
                Some(past) => {
                    skip = past;
                    None
                }
                None => Some(std::io::IoSlice::new(&slice[std::mem::take(&mut skip)..])),
            })
            .take(MAX_SLICES)
            .collect();
        match rustix::io::pwritev(file, &rest, at + done as u64) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(written) => done += written,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(total as u64)
}

/// Fills `slots` from `file` from offset `at` (`preadv`, again from where
/// a short read stopped); fails if the file ends first.
fn read_exact_vectored_at(
    file: &std::fs::File,
    slots: &mut [&mut [u8]],
    at: u64,
) -> std::io::Result<()> {
    let total: usize = slots.iter().map(|s| s.len()).sum();
    let mut done = 0;
    while done < total {
        let mut skip = done;
        let mut rest: Vec<_> = slots
            .iter_mut()
            .filter_map(|slot| match skip.checked_sub(slot.len()) {
                Some(past) => {
                    skip = past;
                    None
                }
                None => Some(std::io::IoSliceMut::new(
                    &mut slot[std::mem::take(&mut skip)..],
                )),
            })
            .take(MAX_SLICES)
            .collect();
        match rustix::io::preadv(file, &mut rest, at + done as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the file ends {} bytes early", total - done),
                ))
            }
            Ok(read) => done += read,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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
    /// the streams it was handed: its first third from memory
    /// (`write_all`), the rest from a file (`write_from_file`).
    fn serving(token: &JoinToken) -> (Endpoint, BulkGrants<Vec<u8>>, Arc<AtomicUsize>) {
        let server = endpoint(token, true, TransportConfig::default());
        let listener = server
            .bulk_listener(server.local_addr().ip())
            .unwrap()
            .expect("bulk streams are on");
        let grants = listener.grants();
        let handed = Arc::new(AtomicUsize::new(0));
        let count = handed.clone();
        tokio::spawn(
            listener.serve(grants.clone(), move |bytes: Vec<u8>, stream| {
                count.fetch_add(1, Ordering::SeqCst);
                let write = move |stream: &mut BulkStream| {
                    let third = bytes.len() / 3;
                    let mut file = tempfile::tempfile().unwrap();
                    std::io::Write::write_all(&mut file, &bytes).unwrap();
                    stream.write_all(&bytes[..third]).unwrap();
                    let rest = (bytes.len() - third) as u64;
                    stream.write_from_file(&file, third as u64, rest).unwrap();
                    stream.finish().unwrap();
                };
                async move { stream.on_own_thread(write).await.unwrap() }
            }),
        );
        (server, grants, handed)
    }

    /// `read` of `stream`, on its own thread (the runtime's thread serves
    /// the other end).
    async fn blocking<T: Send + 'static>(
        stream: BulkStream,
        read: impl FnOnce(&mut BulkStream) -> T + Send + 'static,
    ) -> T {
        stream.on_own_thread(read).await.unwrap()
    }

    /// The first `head` bytes of `len` read from `stream` into memory, the
    /// rest into a file: all of them, and what a read of one byte more
    /// gave.
    async fn read_both_ways(
        stream: BulkStream,
        len: usize,
        head: usize,
    ) -> (Result<Vec<u8>, BulkError>, Result<(), BulkError>) {
        blocking(stream, move |stream| {
            let mut got = Vec::new();
            let read = stream.read_exact_into(&mut got, head).and_then(|()| {
                let file = tempfile::tempfile().unwrap();
                stream.read_into_file(&file, head as u64, (len - head) as u64)?;
                got.resize(len, 0);
                std::os::unix::fs::FileExt::read_exact_at(&file, &mut got[head..], head as u64)
                    .unwrap();
                Ok(got)
            });
            (read, stream.read_exact_into(&mut Vec::new(), 1))
        })
        .await
    }

    fn bulk_addr<G>(server: &Endpoint, grants: &BulkGrants<G>) -> SocketAddr {
        SocketAddr::new(server.local_addr().ip(), grants.port())
    }

    #[tokio::test]
    async fn a_granted_ticket_carries_its_bytes_once() {
        let token = JoinToken::generate();
        let (server, grants, handed) = serving(&token);
        let client = endpoint(&token, false, TransportConfig::default());
        let bytes: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        let ticket = grants.grant(bytes.clone(), client.certificate());
        let stream = client
            .bulk_connect(bulk_addr(&server, &grants), ticket)
            .await
            .unwrap();
        let (got, past) = read_both_ways(stream, bytes.len(), 1 << 20).await;
        assert!(got.unwrap() == bytes, "the stream carried other bytes");
        // The end, and nothing more.
        assert!(
            matches!(past, Err(BulkError::Ended { missing: 1, .. })),
            "{past:?}"
        );

        // The same ticket again, and one never granted: closed before
        // the handshake (their admission tags are spent or unknown).
        for ticket in [ticket, BulkTicket([7; 16])] {
            let refused = client
                .bulk_connect(bulk_addr(&server, &grants), ticket)
                .await;
            assert!(
                matches!(refused, Err(BulkError::Tls { .. })),
                "{:?}",
                refused.err()
            );
        }
        assert_eq!(handed.load(Ordering::SeqCst), 1);
    }

    /// A ticket is for the certificate it was granted to: another process
    /// of the cluster that presents it (one that saw it, say) gets nothing,
    /// and spends it: the grantee is then closed before its handshake.
    #[tokio::test]
    async fn a_ticket_holds_only_for_the_certificate_it_was_granted_to() {
        let token = JoinToken::generate();
        let (server, grants, handed) = serving(&token);
        let grantee = endpoint(&token, false, TransportConfig::default());
        let other = endpoint(&token, false, TransportConfig::default());
        let ticket = grants.grant(b"secret".to_vec(), grantee.certificate());
        let stream = other
            .bulk_connect(bulk_addr(&server, &grants), ticket)
            .await
            .unwrap();
        let read = blocking(stream, |s| s.read_exact_into(&mut Vec::new(), 1)).await;
        assert!(matches!(read, Err(BulkError::Ended { .. })), "{read:?}");
        let spent = grantee
            .bulk_connect(bulk_addr(&server, &grants), ticket)
            .await;
        assert!(
            matches!(spent, Err(BulkError::Tls { .. })),
            "{:?}",
            spent.err()
        );
        assert_eq!(handed.load(Ordering::SeqCst), 0);
    }

    /// Accepts any server certificate: a stranger that trusts the server,
    /// so that what ends its stream is the server's check of it.
    #[derive(Debug)]
    struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

    impl rustls::client::danger::ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Err(rustls::Error::General("TLS 1.3 only".into()))
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.0.signature_verification_algorithms;
            rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// A process of another cluster that trusts any server gets past its
    /// own check of the server; the server then refuses its certificate
    /// and hands it nothing, though it sent a granted ticket. (Every
    /// cluster's CA has the same name; another's signature does not verify
    /// against this one's key: TLS alert decrypt_error, from the server.)
    #[tokio::test]
    async fn the_server_refuses_another_clusters_process() {
        let token = JoinToken::generate();
        let (server, grants, handed) = serving(&token);
        let stranger = Credentials::issue(&JoinToken::generate(), "stranger").unwrap();
        let ticket = grants.grant(b"secret".to_vec(), stranger.certificate_hash());
        let mut client = stranger.client_tls().unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        client
            .dangerous()
            .set_certificate_verifier(Arc::new(AnyServer(provider)));
        client.alpn_protocols = vec![BULK_ALPN.to_vec()];
        let mut tcp = TcpStream::connect(bulk_addr(&server, &grants))
            .await
            .unwrap();
        tcp.write_all(&ticket.admission()).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap();
        // TLS 1.3: the client finishes its side of the handshake before the
        // server has checked its certificate; the refusal comes as an alert.
        let read = async {
            let mut tls = TlsConnector::from(Arc::new(client))
                .connect(name, tcp)
                .await?;
            tls.write_all(&ticket.0).await?;
            tls.flush().await?;
            let mut got = Vec::new();
            tls.read_to_end(&mut got).await.map(|_| got)
        }
        .await;
        let refused = read.expect_err("the server refuses a foreign certificate");
        assert!(
            refused
                .to_string()
                .contains("received fatal alert: DecryptError"),
            "{refused}"
        );
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
        let ticket = grants.grant(bytes.clone(), credentials.certificate_hash());
        let mut client = credentials.client_tls().unwrap();
        client.alpn_protocols = vec![BULK_ALPN.to_vec()];
        let mut tcp = TcpStream::connect(bulk_addr(&server, &grants))
            .await
            .unwrap();
        tcp.write_all(&ticket.admission()).await.unwrap();
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
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut tag = [0u8; 16];
            tcp.read_exact(&mut tag).await.unwrap();
            assert_eq!(tag, BulkTicket([1; 16]).admission());
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
        let stream = client
            .bulk_connect(addr, BulkTicket([1; 16]))
            .await
            .unwrap();
        let (got, past) = read_both_ways(stream, bytes.len(), 5).await;
        assert!(
            got.unwrap() == bytes,
            "the records rustls wrote opened to other bytes"
        );
        assert!(
            matches!(past, Err(BulkError::Ended { missing: 1, .. })),
            "{past:?}"
        );
        serve.await.unwrap();
    }

    /// A node listening for QUIC on every address opens its bulk port on
    /// the address it advertises only (#51, medium 6); an advertised
    /// address that is not this host's falls back to the QUIC socket's.
    #[tokio::test]
    async fn the_bulk_port_listens_on_the_advertised_address_only() {
        let token = JoinToken::generate();
        let me = PeerIdentity {
            role: PeerRole::Node,
            identity: NodeIdentity {
                name: "bulk-test".into(),
                incarnation: Incarnation::fresh(),
            },
        };
        let credentials = Credentials::issue(&token, "bulk-test").unwrap();
        let socket = Endpoint::bind_socket(([0, 0, 0, 0], 0).into()).unwrap();
        let config = TransportConfig::default();
        let server = Endpoint::listen(socket, me, &credentials, config).unwrap();
        let loopback: IpAddr = [127, 0, 0, 1].into();
        let listener = server.bulk_listener(loopback).unwrap().unwrap();
        assert_eq!(listener.local_addr().unwrap().ip(), loopback);
        drop(listener);
        // TEST-NET-3: no host has it.
        let elsewhere: IpAddr = [203, 0, 113, 7].into();
        let listener = server.bulk_listener(elsewhere).unwrap().unwrap();
        assert_eq!(
            listener.local_addr().unwrap().ip(),
            server.local_addr().ip()
        );
    }

    /// More records than one `pwritev` takes slices (a record per byte)
    /// reach the file whole.
    #[tokio::test]
    async fn a_stream_of_tiny_records_reaches_its_file() {
        let token = JoinToken::generate();
        let server = endpoint(&token, true, TransportConfig::default());
        let listener = server
            .bulk_listener(server.local_addr().ip())
            .unwrap()
            .unwrap();
        let grants: BulkGrants<Vec<u8>> = listener.grants();
        tokio::spawn(
            listener.serve(grants.clone(), |bytes: Vec<u8>, stream| async move {
                let write = move |stream: &mut BulkStream| {
                    for byte in bytes.chunks(1) {
                        stream.write_all(byte).unwrap();
                    }
                    stream.finish().unwrap();
                };
                stream.on_own_thread(write).await.unwrap()
            }),
        );
        let bytes: Vec<u8> = (0..20 * MAX_SLICES).map(|i| (i % 249) as u8).collect();
        let client = endpoint(&token, false, TransportConfig::default());
        let stream = client
            .bulk_connect(
                bulk_addr(&server, &grants),
                grants.grant(bytes.clone(), client.certificate()),
            )
            .await
            .unwrap();
        let (got, _) = read_both_ways(stream, bytes.len(), 0).await;
        assert!(got.unwrap() == bytes, "the file holds other bytes");
    }

    /// A stream's thread blocked in a read ends as soon as the future
    /// waiting for it is dropped, long before the stall timeout (30 s).
    #[tokio::test]
    async fn dropping_the_wait_ends_the_streams_thread() {
        let token = JoinToken::generate();
        let server = endpoint(&token, true, TransportConfig::default());
        let listener = server
            .bulk_listener(server.local_addr().ip())
            .unwrap()
            .unwrap();
        let grants: BulkGrants<()> = listener.grants();
        // The handler holds its stream and never writes.
        let (held, mut handed) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(listener.serve(grants.clone(), move |(), stream| {
            let _ = held.send(stream);
            async {}
        }));
        let client = endpoint(&token, false, TransportConfig::default());
        let stream = client
            .bulk_connect(
                bulk_addr(&server, &grants),
                grants.grant((), client.certificate()),
            )
            .await
            .unwrap();
        let (ended, end) = std::sync::mpsc::channel();
        let read = stream.on_own_thread(move |s| {
            let _ = ended.send(s.read_exact_into(&mut Vec::new(), 1));
        });
        let _server_side = handed.recv().await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(100), read).await;
        assert!(waited.is_err(), "nothing was written: the read waits");
        let read = end.recv_timeout(Duration::from_secs(10));
        assert!(
            matches!(read, Ok(Err(BulkError::Ended { missing: 1, .. }))),
            "{read:?}"
        );
    }

    #[tokio::test]
    async fn packet_faults_turn_bulk_streams_off() {
        let token = JoinToken::generate();
        let faults = TransportConfig {
            packet_faults: Some(PacketFaults::default()),
            ..TransportConfig::default()
        };
        let server = endpoint(&token, true, faults.clone());
        assert!(server
            .bulk_listener(server.local_addr().ip())
            .unwrap()
            .is_none());
        let client = endpoint(&token, false, faults);
        let addr = ([127, 0, 0, 1], 9).into();
        let dialed = client.bulk_connect(addr, BulkTicket([0; 16])).await;
        assert!(matches!(dialed, Err(BulkError::Off)), "{:?}", dialed.err());
    }
}
