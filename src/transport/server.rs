//! The accepting side: TLS, the nimbus handshake, then one task per
//! request stream.
//!
//! 1. TLS: a peer without this cluster's credentials fails here (logged as
//!    a refusal: wrong token?).
//! 2. The handshake, within `connect_timeout` (else close code 5): read the
//!    8-byte preamble (another version: code 1, naming both), then the
//!    `Hello` frame (unreadable: code 2); an `expect` naming another
//!    incarnation of this node: code 3; a proof of identity that does not
//!    hold for the certificate the peer connected with (`tickets.rs`): code
//!    6; otherwise answer with this node's preamble and `HelloReply`.
//! 3. Every later stream: read the first request frame within
//!    `request_read_timeout` (else code 2). A plain request is handed to
//!    the [`RequestHandler`] and answered on its stream; an ordered one
//!    keeps the stream as a channel, whose requests reach the handler one
//!    at a time in the order sent and are answered in that order (a channel
//!    may then sit idle as long as its connection lives); on a same-host
//!    socket a reply ready on another thread may go out from there, ahead
//!    of earlier ones (`answer.rs`).
//! 4. Each request: one meant for another incarnation is answered
//!    `StaleIncarnation`; a handler not done by the request's deadline,
//!    `DeadlineExceeded`; a body the handler calls malformed closes the
//!    connection (code 2). A one-way request gets no response; its failure
//!    is logged.
//! 5. Responses go out in batches (`ResponseWriter`). A write the peer
//!    does not take within `request_read_timeout`, or that fails, ends the
//!    stream there: nothing follows a partial frame.
//!
//! Bad input never takes the node down: whatever a peer sends, the worst
//! outcome is that its own connection is closed with a reason, and a
//! warning is logged.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::wire::{
    self, preamble, read_preamble, CloseCode, Hello, HelloReply, LocalRoute, RemoteError,
    RemoteErrorKind, Request, Response, WireError, PREAMBLE_LEN,
};

use super::admission::{self, Admission, HandshakeSlot};
use super::answer::{Answer, Direct, Reply};
use super::batch::Batch;
use super::connection::close;
use super::endpoint::version_mismatch;
use super::frames::{LocalFrames, Plain, ReadFrames};
use super::local;
use super::tickets::{Caller, CertificateHash};
use super::Endpoint;

/// What a node does with the requests that reach it.
pub trait RequestHandler: Send + Sync + 'static {
    /// Answers one request body from `from` (who it is, as far as this
    /// process could check: `tickets.rs`).
    ///
    /// Requests of one ordered channel are passed to `handle` one at a time,
    /// in the order sent; work that must keep that order has to start inside
    /// `handle` itself, not in the future it returns.
    fn handle(
        &self,
        from: Caller,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, HandlerError>>;

    /// [`handle`](Self::handle) for a request of a same-host channel,
    /// answered through `answer`, from whichever thread has the reply
    /// (`answer.rs`): one that is ready goes out from there. The default
    /// hands `handle`'s future over.
    fn handle_answering(&self, from: Caller, body: Vec<u8>, answer: Answer) {
        answer.later(self.handle(from, body));
    }
}

/// Why a handler produced no reply body.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Answer with this error; the connection stays open.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The body is not a message this node understands: the peer is broken
    /// or hostile, so its connection is closed.
    #[error("malformed request: {0}")]
    Malformed(String),
}

/// Takes one incoming connection through TLS and the handshake, holding
/// `slot` until both are done, then serves its streams until it closes.
pub(super) async fn accept(
    endpoint: Endpoint,
    incoming: quinn::Incoming,
    handler: Arc<dyn RequestHandler>,
    slot: HandshakeSlot,
) {
    let remote = incoming.remote_address();
    let admission = endpoint.admission();
    let quic = match incoming.await {
        Ok(quic) => quic,
        Err(e) => {
            let reason = format!("TLS handshake failed ({e}); the peer lacks this cluster's credentials (wrong token?)");
            refused(&admission, remote, &reason);
            return;
        }
    };
    let timeout = endpoint.config().connect_timeout;
    let budget = Arc::new(Semaphore::new(buffer_budget(
        endpoint.config().max_frame_bytes,
    )));
    // Its same-host channels' key, admitted until the connection ends
    // (`local.rs`, steps 1 and 4).
    let key = endpoint.local().map(|_| LocalKey {
        endpoint: endpoint.clone(),
        key: local::key(),
    });
    let offer = |caller: &Caller| {
        let (offer, key) = (endpoint.local()?, key.as_ref()?);
        let admission = LocalAdmission {
            quic: quic.clone(),
            peer: caller.clone(),
            budget: budget.clone(),
            channels: Arc::new(Semaphore::new(local::MAX_CHANNELS)),
        };
        offer.admitted.insert(key.key, admission);
        Some(LocalRoute {
            host: offer.host.to_string(),
            socket: offer.name.clone(),
            key: key.key.to_vec(),
        })
    };
    let peer = match tokio::time::timeout(timeout, handshake(&endpoint, &quic, offer)).await {
        Ok(Ok(peer)) => peer,
        Ok(Err(refusal)) => {
            refused(&admission, remote, &refusal.reason);
            close(&quic, refusal.code, &refusal.reason);
            return;
        }
        Err(_) => {
            let reason = format!("no nimbus handshake within {timeout:?}");
            refused(&admission, remote, &reason);
            close(&quic, CloseCode::HandshakeTimeout, &reason);
            return;
        }
    };
    drop(slot);
    metrics::counter!("nimbus_connections_total", "direction" => "in").increment(1);
    debug!(%remote, %peer, "connection accepted");
    loop {
        let (send, recv) = match quic.accept_bi().await {
            Ok(streams) => streams,
            Err(e) => {
                debug!(%remote, %peer, "connection ended: {e}");
                return;
            }
        };
        let task = StreamTask {
            endpoint: endpoint.clone(),
            quic: quic.clone(),
            peer: peer.clone(),
            handler: handler.clone(),
            budget: budget.clone(),
        };
        tokio::spawn(task.run(send, Plain(recv)));
    }
}

/// A connection admitted to this endpoint's same-host socket
/// (`local.rs`): who it is, and what its channels there share with its
/// QUIC streams.
#[derive(Clone)]
pub(super) struct LocalAdmission {
    quic: quinn::Connection,
    peer: Caller,
    budget: Arc<Semaphore>,
    /// Its open same-host sockets ([`local::MAX_CHANNELS`]).
    channels: Arc<Semaphore>,
}

/// A connection's same-host key, forgotten when the connection ends.
struct LocalKey {
    endpoint: Endpoint,
    key: local::Key,
}

impl Drop for LocalKey {
    fn drop(&mut self) {
        if let Some(offer) = self.endpoint.local() {
            offer.admitted.remove(&self.key);
        }
    }
}

/// Admits channels to this endpoint's same-host socket (`local.rs`, step
/// 3) until aborted (when the endpoint closes): each is served as a stream of the
/// connection its key names, and ends with that connection.
pub(super) async fn accept_local(
    endpoint: Endpoint,
    listener: tokio::net::UnixListener,
    handler: Arc<dyn RequestHandler>,
) {
    let unadmitted = Arc::new(Semaphore::new(local::MAX_UNADMITTED));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: wait, as the error stays
                // until some are closed.
                debug!("cannot accept a same-host channel ({e}); trying again in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        backoff = ACCEPT_BACKOFF_MIN;
        let Ok(waiting) = unadmitted.clone().try_acquire_owned() else {
            local_refused(&local::Refused::TooMany);
            continue;
        };
        tokio::spawn(serve_local(
            endpoint.clone(),
            stream,
            handler.clone(),
            waiting,
        ));
    }
}

/// How long the same-host accept loop waits after a failed accept: from
/// this, doubling up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Admits one same-host socket (`local.rs`, step 3), holding `waiting`
/// until it is, then serves it until it or its connection ends.
async fn serve_local(
    endpoint: Endpoint,
    mut stream: tokio::net::UnixStream,
    handler: Arc<dyn RequestHandler>,
    waiting: OwnedSemaphorePermit,
) {
    let timeout = endpoint.config().connect_timeout;
    let admitted = match tokio::time::timeout(timeout, local::read_key(&mut stream)).await {
        Ok(Ok(key)) => endpoint
            .local()
            .and_then(|offer| offer.admitted.get(&key).map(|a| a.clone()))
            .ok_or(local::Refused::UnknownKey),
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err(local::Refused::NoKey(std::io::ErrorKind::TimedOut.into())),
    };
    drop(waiting);
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(refusal) => return local_refused(&refusal),
    };
    let Ok(_open) = admitted.channels.clone().try_acquire_owned() else {
        let _ = stream.write_all(&[local::BUSY]).await;
        return;
    };
    if stream.write_all(&[local::ADMITTED]).await.is_err() {
        return;
    }
    let rings = local::exchange_rings(stream, local::Side::Acceptor);
    let socket = match tokio::time::timeout(timeout, rings).await {
        Ok(Ok(socket)) => socket,
        Ok(Err(e)) => return debug!("a same-host channel's rings failed: {e}"),
        Err(_) => return debug!("a same-host channel's rings did not come within {timeout:?}"),
    };
    let quic = admitted.quic.clone();
    let task = StreamTask {
        endpoint,
        quic: admitted.quic,
        peer: admitted.peer,
        handler,
        budget: admitted.budget,
    };
    let (recv, send) = socket.stream.into_split();
    let recv = LocalFrames::new(recv, socket.from_peer);
    let config = task.endpoint.config();
    let direct = Arc::new(Direct::new(
        send,
        socket.out,
        config.max_frame_bytes,
        config.request_read_timeout,
    ));
    tokio::select! {
        () = task.run_local(direct, recv) => {}
        _ = quic.closed() => {}
    }
}

/// A same-host socket not admitted: counted, and logged at debug only
/// (any process of the host can knock on the socket).
fn local_refused(refusal: &local::Refused) {
    metrics::counter!("nimbus_same_host_refused_total").increment(1);
    debug!("refused a same-host channel: {refusal}");
}

/// Logs a refused connection, at most once per `LOG_INTERVAL`
/// (`admission.rs`, step 5).
pub(super) fn refused(
    admission: &std::sync::Mutex<Admission>,
    remote: impl std::fmt::Display,
    reason: &str,
) {
    metrics::counter!("nimbus_handshakes_refused_total").increment(1);
    if let Some(not_logged) = admission::lock(admission).refusal(std::time::Instant::now()) {
        let since = match not_logged {
            0 => String::new(),
            n => format!(" ({n} more refused since the last such line)"),
        };
        warn!(%remote, "refused a connection: {reason}{since}");
    }
}

struct Refusal {
    code: CloseCode,
    reason: String,
}

impl Refusal {
    fn bad_frame(e: impl std::fmt::Display) -> Self {
        Refusal {
            code: CloseCode::BadFrame,
            reason: format!("bad handshake: {e}"),
        }
    }
}

/// Step 2. `offer` admits the caller to the same-host socket, if there is
/// one, before the reply names it.
async fn handshake(
    endpoint: &Endpoint,
    quic: &quinn::Connection,
    offer: impl FnOnce(&Caller) -> Option<LocalRoute>,
) -> Result<Caller, Refusal> {
    let config = endpoint.config();
    let (mut send, mut recv) = quic.accept_bi().await.map_err(Refusal::bad_frame)?;
    let mut theirs = [0u8; PREAMBLE_LEN];
    AsyncReadExt::read_exact(&mut recv, &mut theirs)
        .await
        .map_err(Refusal::bad_frame)?;
    let version = read_preamble(theirs).map_err(Refusal::bad_frame)?;
    if version != config.protocol_version {
        return Err(Refusal {
            code: CloseCode::VersionMismatch,
            reason: version_mismatch(config.protocol_version, version),
        });
    }
    let hello: Hello = wire::decode(
        &wire::read_frame(&mut recv, config.max_frame_bytes)
            .await
            .map_err(Refusal::bad_frame)?,
    )
    .map_err(Refusal::bad_frame)?;
    let me = &endpoint.identity().identity;
    let caller = endpoint
        .verifier()
        .check(&hello.from, &hello.proof, peer_certificate(quic)?)
        .map_err(|e| Refusal {
            code: CloseCode::Unauthenticated,
            reason: format!("{} is not who it says: {e}", hello.from),
        })?;
    if let Some(expected) = hello.expect.as_ref().filter(|e| *e != me) {
        return Err(Refusal {
            code: CloseCode::StaleIncarnation,
            reason: format!(
                "stale incarnation: {} expected {expected}, but this is {me}",
                hello.from
            ),
        });
    }
    let reply = HelloReply {
        node: me.clone(),
        local: offer(&caller),
    };
    let mut out = preamble(config.protocol_version).to_vec();
    out.extend(wire::encode(&reply, config.max_frame_bytes).map_err(Refusal::bad_frame)?);
    wire::write_frame(&mut send, &out)
        .await
        .map_err(Refusal::bad_frame)?;
    let _ = send.finish();
    Ok(caller)
}

/// The SHA-256 of the certificate the peer proved in TLS that it holds.
fn peer_certificate(quic: &quinn::Connection) -> Result<CertificateHash, Refusal> {
    let chain = quic
        .peer_identity()
        .and_then(|any| {
            any.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .ok_or_else(|| Refusal {
            code: CloseCode::Unauthenticated,
            reason: "the peer presented no certificate".into(),
        })?;
    chain
        .first()
        .map(|leaf| CertificateHash::of(leaf))
        .ok_or_else(|| Refusal {
            code: CloseCode::Unauthenticated,
            reason: "the peer presented an empty certificate chain".into(),
        })
}

/// The bytes of requests one connection may have received but not yet
/// answered: four maximal frames (64 MiB by default).
fn buffer_budget(max_frame_bytes: usize) -> usize {
    max_frame_bytes.saturating_mul(4).min(u32::MAX as usize)
}

/// What the smallest request counts for against the budget, so that the
/// number of requests waiting for a handler is bounded too.
pub(super) const MIN_CHARGE: usize = 4 << 10;

/// Serves one request stream: a single request, or an ordered channel.
#[derive(Clone)]
struct StreamTask {
    endpoint: Endpoint,
    quic: quinn::Connection,
    peer: Caller,
    handler: Arc<dyn RequestHandler>,
    /// The connection's [`buffer_budget`], shared by its streams.
    budget: Arc<Semaphore>,
}

/// A stream's response writer, stopped when the stream's task is dropped
/// (a same-host socket whose connection closed writes nothing more).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request and its share of the connection's budget, given back once it
/// is answered.
struct Admitted {
    request: Request,
    _charge: OwnedSemaphorePermit,
}

/// The response to one request, once the handler is done (`None` for a
/// one-way request).
type PendingResponse = BoxFuture<'static, Option<Response>>;

/// The writing half of a request stream: QUIC's, or a same-host socket's
/// ([`LocalSend`]).
trait SendHalf: Send + 'static {
    /// Writes `bytes` whole.
    fn write_whole<'a>(
        &'a mut self,
        bytes: &'a [u8],
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'a;

    /// Ends the stream.
    fn end(&mut self) -> impl Future<Output = ()> + Send + '_;
}

impl<T: AsyncWrite + Unpin + Send + 'static> SendHalf for T {
    fn write_whole<'a>(
        &'a mut self,
        bytes: &'a [u8],
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'a {
        self.write_all(bytes)
    }

    async fn end(&mut self) {
        let _ = self.shutdown().await;
    }
}

/// A same-host socket's writing half, shared with the answers of its
/// requests (`answer.rs`): the stream's writer takes its turn.
struct LocalSend(Arc<Direct>);

impl SendHalf for LocalSend {
    fn write_whole<'a>(
        &'a mut self,
        bytes: &'a [u8],
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'a {
        self.0.write_all(bytes)
    }

    fn end(&mut self) -> impl Future<Output = ()> + Send + '_ {
        self.0.shutdown()
    }
}

impl StreamTask {
    async fn run(self, send: impl SendHalf, mut recv: impl ReadFrames) {
        let Ok(Some(first)) = self.read_request(&mut recv, true).await else {
            return;
        };
        if first.request.ordered {
            return self.serve_channel(first, send, recv, None).await;
        }
        let response = self.start(first, None).await;
        let mut writer = ResponseWriter::new(self, send);
        if let Some(response) = response {
            writer.push(&response).await;
        }
        writer.finish().await;
    }

    /// Serves a same-host socket (`local.rs`): an ordered channel, whose
    /// requests may be answered from the thread that has the reply
    /// (`answer.rs`), or the plain requests of its connection, each
    /// handled on its own.
    async fn run_local(self, direct: Arc<Direct>, mut recv: impl ReadFrames) {
        let Ok(Some(first)) = self.read_request(&mut recv, true).await else {
            return;
        };
        if first.request.ordered {
            return self
                .serve_channel(first, LocalSend(direct.clone()), recv, Some(direct))
                .await;
        }
        self.serve_requests(first, LocalSend(direct), recv).await
    }

    /// Hands each plain request to the handler as it arrives and writes
    /// each response as soon as it is ready, in whatever order they
    /// finish (the caller matches them by id). The connection's budget
    /// bounds how many wait at once, as for QUIC streams.
    async fn serve_requests(self, first: Admitted, send: impl SendHalf, mut recv: impl ReadFrames) {
        let (responses_tx, mut responses) = mpsc::unbounded_channel::<Response>();
        let mut writer = ResponseWriter::new(self.clone(), send);
        let mut writing = AbortOnDrop(tokio::spawn(async move {
            while let Some(response) = writer.next(&mut responses).await {
                writer.push(&response).await;
            }
            writer.finish().await;
        }));
        let mut next = Some(first);
        while let Some(request) = next.take() {
            let pending = self.start(request, None);
            let responses_tx = responses_tx.clone();
            tokio::spawn(async move {
                if let Some(response) = pending.await {
                    let _ = responses_tx.send(response);
                }
            });
            next = self.read_request(&mut recv, false).await.ok().flatten();
        }
        drop(responses_tx);
        let _ = (&mut writing.0).await;
    }

    /// Hands every request of the channel to the handler in arrival order,
    /// and writes the responses back in that same order; on a same-host
    /// socket (`direct`), those answered at once from another thread
    /// (`answer.rs`) are out already, maybe before earlier ones.
    async fn serve_channel(
        self,
        first: Admitted,
        send: impl SendHalf,
        mut recv: impl ReadFrames,
        direct: Option<Arc<Direct>>,
    ) {
        let (responses_tx, mut responses) = mpsc::unbounded_channel::<PendingResponse>();
        let mut writer = ResponseWriter::new(self.clone(), send);
        let mut writing = AbortOnDrop(tokio::spawn(async move {
            let mut waiting = VecDeque::new();
            let mut open = true;
            loop {
                loop {
                    match responses.try_recv() {
                        Ok(pending) => waiting.push_back(pending),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            open = false;
                            break;
                        }
                    }
                }
                let Some(head) = waiting.front_mut() else {
                    if !open {
                        break;
                    }
                    writer.flush().await;
                    match responses.recv().await {
                        Some(pending) => waiting.push_back(pending),
                        None => open = false,
                    }
                    continue;
                };
                // The responses ready go out together; before waiting for
                // one that is not, those before it go out. A request
                // answered at once wakes no one (`answer.rs`): the head is
                // looked at again when a request arrives or the channel
                // ends.
                let response = match futures::poll!(&mut *head) {
                    std::task::Poll::Ready(response) => response,
                    std::task::Poll::Pending => {
                        writer.flush().await;
                        tokio::select! {
                            response = &mut *head => response,
                            more = responses.recv(), if open => {
                                match more {
                                    Some(pending) => waiting.push_back(pending),
                                    None => open = false,
                                }
                                continue;
                            }
                        }
                    }
                };
                waiting.pop_front();
                if let Some(response) = response {
                    writer.push(&response).await;
                }
            }
            writer.finish().await;
        }));
        let _ = responses_tx.send(self.start(first, direct.as_ref()));
        while let Ok(Some(request)) = self.read_request(&mut recv, false).await {
            if responses_tx
                .send(self.start(request, direct.as_ref()))
                .is_err()
            {
                break;
            }
        }
        if let Some(direct) = &direct {
            direct.close();
        }
        drop(responses_tx);
        let _ = (&mut writing.0).await;
    }

    /// Reads one request. `Ok(None)`: the peer finished the stream cleanly.
    /// `Err`: the stream failed, or the connection was closed for bad input.
    ///
    /// 1. The length prefix: the first request of a stream within
    ///    `request_read_timeout`; a channel may then sit idle between
    ///    requests for as long as its connection lives (QUIC keep-alives
    ///    and the idle timeout tell a live caller from a dead one).
    /// 2. Room in the connection's budget for the body (at least
    ///    `MIN_CHARGE`): what a peer can make a node hold is bounded per
    ///    connection, not per stream. While other requests of the
    ///    connection hold it, this one waits unread (QUIC flow control
    ///    holds the sender back); every holder lets go once answered or
    ///    past its deadline, or once its body times out in step 3, so the
    ///    wait ends.
    /// 3. The body, within `request_read_timeout` of its prefix.
    async fn read_request(
        &self,
        recv: &mut impl ReadFrames,
        first: bool,
    ) -> Result<Option<Admitted>, ()> {
        let max = self.endpoint.config().max_frame_bytes;
        let read_timeout = self.endpoint.config().request_read_timeout;
        let prefix = recv.read_len(max);
        // Only a stream's first request races a timer: later ones would
        // arm (and cancel) one per request on a channel that may idle.
        let len = if first {
            match tokio::time::timeout(read_timeout, prefix).await {
                Ok(len) => len,
                Err(_) => return self.too_slow("no request frame", read_timeout),
            }
        } else {
            prefix.await
        };
        let len = match len {
            Ok(len) => len,
            Err(e) => return self.failed(e).map(|()| None),
        };
        let charge = len.max(MIN_CHARGE).min(buffer_budget(max)) as u32;
        let Ok(charge) = self.budget.clone().acquire_many_owned(charge).await else {
            return Err(());
        };
        let body = match tokio::time::timeout(read_timeout, recv.read_body(len)).await {
            Ok(body) => body,
            Err(_) => return self.too_slow("no complete request frame", read_timeout),
        };
        match body.and_then(|body| wire::decode::<Request>(&body)) {
            Ok(request) => Ok(Some(Admitted {
                request,
                _charge: charge,
            })),
            Err(e) => self.failed(e).map(|()| None),
        }
    }

    /// A request not read in time: closes the connection.
    fn too_slow<T>(&self, what: &str, timeout: Duration) -> Result<T, ()> {
        self.refuse(&format!("{what} within {timeout:?} (request_read_timeout)"));
        Err(())
    }

    /// A read that failed: `Ok` for a stream the peer ended cleanly,
    /// otherwise the stream failed (`Err`) or the input was bad (the
    /// connection is closed).
    fn failed(&self, error: WireError) -> Result<(), ()> {
        match error {
            WireError::Empty => Ok(()),
            WireError::Io(e) => {
                debug!(peer = %self.peer, "request stream failed: {e}");
                Err(())
            }
            e => {
                self.refuse(&e.to_string());
                Err(())
            }
        }
    }

    /// Calls the handler now (so requests of a channel reach it in order)
    /// and returns the response to come. On a same-host channel
    /// (`direct`), a request that expects a response is handed to the
    /// handler with an [`Answer`], which may write it at once.
    fn start(&self, admitted: Admitted, direct: Option<&Arc<Direct>>) -> PendingResponse {
        let Admitted {
            request:
                Request {
                    id,
                    to,
                    deadline_ms,
                    one_way,
                    body,
                    ..
                },
            _charge: charge,
        } = admitted;
        // Counted before the handler can answer, until the writer is done
        // with it (`answer.rs`, step 1).
        let queued = direct.map(|direct| direct.queue());
        let me = &self.endpoint.identity().identity;
        let deadline = Duration::from_millis(deadline_ms);
        let peer = self.peer.clone();
        // What the request comes to: `None` past its deadline, else the
        // handler's reply, or `Some(None)` if it was written already.
        let handled: BoxFuture<'static, Option<Option<Reply>>> = match (to, direct) {
            (Some(to), _) if to != me.incarnation => {
                let error = RemoteError::new(
                    RemoteErrorKind::StaleIncarnation,
                    format!(
                        "request meant for incarnation {to} of {}, but this is {me}",
                        me.name
                    ),
                );
                drop(charge);
                futures::future::ready(Some(Some(Err(HandlerError::Remote(error))))).boxed()
            }
            (_, Some(direct)) if !one_way => {
                let (answer, mut answered) = Answer::new(id, direct, charge);
                self.handler.handle_answering(peer.clone(), body, answer);
                async move {
                    match tokio::time::timeout(deadline, &mut answered).await {
                        Ok(outcome) => Some(outcome),
                        Err(_) => answered.give_up(),
                    }
                }
                .boxed()
            }
            _ => {
                let handled = self.handler.handle(peer.clone(), body);
                async move {
                    let result = tokio::time::timeout(deadline, handled).await;
                    drop(charge);
                    result.ok().map(Some)
                }
                .boxed()
            }
        };
        let quic = self.quic.clone();
        async move {
            let _queued = queued;
            let result = match handled.await {
                Some(None) => return None,
                Some(Some(Ok(body))) => Ok(body),
                Some(Some(Err(HandlerError::Remote(error)))) => Err(error),
                Some(Some(Err(HandlerError::Malformed(reason)))) => {
                    warn!(%peer, "closing the connection: {reason}");
                    close(&quic, CloseCode::BadFrame, &reason);
                    return None;
                }
                None => Err(RemoteError::new(
                    RemoteErrorKind::DeadlineExceeded,
                    format!("not answered within the request's deadline of {deadline:?}"),
                )),
            };
            if one_way {
                if let Err(error) = result {
                    warn!(%peer, "one-way request failed: {error}");
                }
                return None;
            }
            Some(Response {
                id,
                result: result.map(serde_bytes::ByteBuf::from),
            })
        }
        .boxed()
    }

    fn refuse(&self, reason: &str) {
        warn!(peer = %self.peer, "closing the connection: {reason}");
        close(&self.quic, CloseCode::BadFrame, reason);
    }
}

/// Writes a stream's responses, several at a time: they gather in a
/// buffer that goes out when the stream's task has no response ready
/// (`flush`), or once it holds `BATCH_BYTES` (64 KiB, `batch.rs`).
struct ResponseWriter<S> {
    task: StreamTask,
    out: Outgoing<S>,
}

impl<S: SendHalf> ResponseWriter<S> {
    fn new(task: StreamTask, send: S) -> Self {
        ResponseWriter {
            task,
            out: Outgoing {
                send,
                batch: Batch::default(),
                broken: false,
            },
        }
    }

    /// Adds `response` to the buffer (one the peer's limit refuses is
    /// answered with that error instead); nothing once the stream broke.
    async fn push(&mut self, response: &Response) {
        if self.out.broken {
            return;
        }
        let max = self.task.endpoint.config().max_frame_bytes;
        let batch = &mut self.out.batch;
        if let Err(e) = batch.push(response, max) {
            let fallback = Response {
                id: response.id,
                result: Err(RemoteError::new(RemoteErrorKind::Internal, e.to_string())),
            };
            let _ = batch.push(&fallback, max);
        }
        if batch.full() {
            self.flush().await;
        }
    }

    /// The next item of `queue`; when none is waiting, the buffer is
    /// written before waiting for one.
    async fn next<T>(&mut self, queue: &mut mpsc::UnboundedReceiver<T>) -> Option<T> {
        match queue.try_recv() {
            Ok(item) => Some(item),
            Err(_) => {
                self.flush().await;
                queue.recv().await
            }
        }
    }

    /// Writes the buffer, within `request_read_timeout`.
    async fn flush(&mut self) {
        let timeout = self.task.endpoint.config().request_read_timeout;
        if let Err(e) = self.out.flush(timeout).await {
            debug!(peer = %self.task.peer, "{e}: the response stream is ended");
        }
    }

    /// Writes the buffer and ends the stream.
    async fn finish(mut self) {
        self.flush().await;
        if !self.out.broken {
            self.out.send.end().await;
        }
    }
}

/// The bytes of a stream's responses on their way out.
struct Outgoing<S> {
    send: S,
    batch: Batch,
    /// A write failed or was cut off: the stream is ended, and nothing
    /// more goes out on it (after a partial frame, the next one would be
    /// read as its rest).
    broken: bool,
}

/// Why a response buffer could not be written.
#[derive(Debug, thiserror::Error)]
enum WriteFailure {
    /// The stream failed.
    #[error("cannot send a response: {0}")]
    Failed(#[source] std::io::Error),
    /// The peer did not take it in time: it may have taken part of it.
    #[error("the peer did not take a response within {0:?}")]
    TimedOut(Duration),
}

impl<S: SendHalf> Outgoing<S> {
    /// Writes the buffer within `timeout`. A write that fails or is cut
    /// off breaks the stream: it is shut down at once (the peer reads the
    /// end of the stream, after a partial frame if any), and later
    /// buffers are dropped unwritten.
    async fn flush(&mut self, timeout: Duration) -> Result<(), WriteFailure> {
        if self.broken || self.batch.is_empty() {
            self.batch.clear();
            return Ok(());
        }
        let write = self.send.write_whole(self.batch.bytes());
        let written = match tokio::time::timeout(timeout, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(WriteFailure::Failed(e)),
            Err(_) => Err(WriteFailure::TimedOut(timeout)),
        };
        self.batch.clear();
        if written.is_err() {
            self.broken = true;
            let _ = tokio::time::timeout(timeout, self.send.end()).await;
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_response_write_cut_off_ends_the_stream_after_the_partial_frame() {
        // A peer that reads nothing: 4 KiB fit in the pipe, 64 KiB do not.
        let (send, mut peer) = tokio::io::duplex(4 << 10);
        let mut out = Outgoing {
            send,
            batch: Batch::default(),
            broken: false,
        };
        let max = 1 << 20;
        let large = serde_bytes::ByteBuf::from(vec![1; 64 << 10]);
        out.batch.push(&large, max).unwrap();
        let frame = wire::encode(&large, max).unwrap();
        let timeout = Duration::from_millis(100);
        let cut = out.flush(timeout).await;
        assert!(matches!(cut, Err(WriteFailure::TimedOut(_))), "{cut:?}");
        // The next response must not follow the partial one.
        out.batch.push(&"next response", max).unwrap();
        out.flush(timeout).await.unwrap();
        assert!(out.batch.is_empty());
        // The peer reads the partial frame, then the end of the stream
        // (the writer is still alive: without the shutdown this would wait
        // for more).
        let mut read = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), peer.read_to_end(&mut read))
            .await
            .expect("the stream ended")
            .unwrap();
        assert!(
            !read.is_empty() && read.len() < frame.len(),
            "{}",
            read.len()
        );
        assert!(frame.starts_with(&read), "only the partial frame");
    }
}
