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
//!
//! The rooms: this file accepts connections and runs the handshake
//! (steps 1 and 2); `stream.rs` serves each stream (steps 3 and 4),
//! `responses.rs` writes the responses (step 5), `same_host.rs` accepts
//! and serves the peers of the node's local socket.

mod responses;
mod same_host;
mod stream;

pub(super) use same_host::{accept_local, LocalAdmission};

use same_host::LocalKey;
use stream::StreamTask;

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::wire::{
    self, preamble, read_preamble, CloseCode, Hello, HelloReply, LocalRoute, RemoteError,
    PREAMBLE_LEN,
};

use super::admission::{self, Admission, HandshakeSlot};
use super::answer::Answer;
use super::connection::close;
use super::endpoint::version_mismatch;
use super::frame_io;
use super::frames::Plain;
use super::local;
use super::tickets::{self, Caller, CertificateHash};
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
        &frame_io::read_frame(&mut recv, config.max_frame_bytes)
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
        proof: endpoint.proof(),
        local: offer(&caller),
    };
    let mut out = preamble(config.protocol_version).to_vec();
    out.extend(wire::encode(&reply, config.max_frame_bytes).map_err(Refusal::bad_frame)?);
    frame_io::write_frame(&mut send, &out)
        .await
        .map_err(Refusal::bad_frame)?;
    let _ = send.finish();
    Ok(caller)
}

/// The SHA-256 of the certificate the peer proved in TLS that it holds.
fn peer_certificate(quic: &quinn::Connection) -> Result<CertificateHash, Refusal> {
    tickets::peer_certificate(quic).ok_or_else(|| Refusal {
        code: CloseCode::Unauthenticated,
        reason: "the peer presented no certificate".into(),
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
