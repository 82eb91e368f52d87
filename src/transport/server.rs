//! The accepting side: TLS, the nimbus handshake, then one task per
//! request stream.
//!
//! Bad input never takes the node down: whatever a peer sends, the worst
//! outcome is that its own connection is closed with a reason, and a
//! warning is logged.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::AsyncReadExt;
use tracing::{debug, warn};

use crate::wire::{
    self, preamble, read_preamble, CloseCode, Hello, HelloReply, PeerIdentity, RemoteError,
    RemoteErrorKind, Request, Response, WireError, PREAMBLE_LEN,
};

use super::connection::close;
use super::endpoint::version_mismatch;
use super::Endpoint;

/// What a node does with the requests that reach it.
pub trait RequestHandler: Send + Sync + 'static {
    /// Answers one request body from `from`.
    fn handle(
        &self,
        from: PeerIdentity,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, HandlerError>>;
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

/// Takes one incoming connection through TLS and the handshake, then serves
/// its streams until it closes.
pub(super) async fn accept(
    endpoint: Endpoint,
    incoming: quinn::Incoming,
    handler: Arc<dyn RequestHandler>,
) {
    let remote = incoming.remote_address();
    let quic = match incoming.await {
        Ok(quic) => quic,
        Err(e) => {
            warn!(%remote, "refused a connection: TLS handshake failed ({e}); the peer lacks this cluster's credentials (wrong token?)");
            return;
        }
    };
    let timeout = endpoint.config().connect_timeout;
    let peer = match tokio::time::timeout(timeout, handshake(&endpoint, &quic)).await {
        Ok(Ok(peer)) => peer,
        Ok(Err(refusal)) => {
            warn!(%remote, "refused a connection: {}", refusal.reason);
            close(&quic, refusal.code, &refusal.reason);
            return;
        }
        Err(_) => {
            let reason = format!("no nimbus handshake within {timeout:?}");
            warn!(%remote, "refused a connection: {reason}");
            close(&quic, CloseCode::HandshakeTimeout, &reason);
            return;
        }
    };
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
        };
        tokio::spawn(task.run(send, recv));
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

async fn handshake(endpoint: &Endpoint, quic: &quinn::Connection) -> Result<PeerIdentity, Refusal> {
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
    if let Some(expected) = hello.expect.as_ref().filter(|e| *e != me) {
        return Err(Refusal {
            code: CloseCode::StaleIncarnation,
            reason: format!(
                "stale incarnation: {} expected {expected}, but this is {me}",
                hello.from
            ),
        });
    }
    let mut out = preamble(config.protocol_version).to_vec();
    out.extend(
        wire::encode(&HelloReply { node: me.clone() }, config.max_frame_bytes)
            .map_err(Refusal::bad_frame)?,
    );
    wire::write_frame(&mut send, &out)
        .await
        .map_err(Refusal::bad_frame)?;
    let _ = send.finish();
    Ok(hello.from)
}

/// Serves one request stream.
struct StreamTask {
    endpoint: Endpoint,
    quic: quinn::Connection,
    peer: PeerIdentity,
    handler: Arc<dyn RequestHandler>,
}

impl StreamTask {
    async fn run(self, mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
        let max = self.endpoint.config().max_frame_bytes;
        let read_timeout = self.endpoint.config().request_read_timeout;
        let request =
            match tokio::time::timeout(read_timeout, wire::read_frame(&mut recv, max)).await {
                Ok(Ok(frame)) => wire::decode::<Request>(&frame),
                Ok(Err(e)) => Err(e),
                Err(_) => {
                    return self.refuse(&format!(
                        "no complete request frame within {read_timeout:?} (request_read_timeout)"
                    ))
                }
            };
        let request = match request {
            Ok(request) => request,
            Err(WireError::Io(e)) => {
                debug!(peer = %self.peer, "request stream failed: {e}");
                return;
            }
            Err(e) => return self.refuse(&e.to_string()),
        };
        let Request {
            id,
            to,
            deadline_ms,
            one_way,
            body,
        } = request;
        let me = &self.endpoint.identity().identity;
        let result = match to {
            Some(to) if to != me.incarnation => Err(RemoteError::new(
                RemoteErrorKind::StaleIncarnation,
                format!(
                    "request meant for incarnation {to} of {}, but this is {me}",
                    me.name
                ),
            )),
            _ => match self
                .call_handler(body, Duration::from_millis(deadline_ms))
                .await
            {
                Ok(result) => result,
                Err(reason) => return self.refuse(&reason),
            },
        };
        if one_way {
            if let Err(error) = result {
                warn!(peer = %self.peer, "one-way request failed: {error}");
            }
            let _ = send.finish();
            return;
        }
        let response = Response {
            id,
            result: result.map(serde_bytes::ByteBuf::from),
        };
        let frame = wire::encode(&response, max).unwrap_or_else(|e| {
            let error = RemoteError::new(RemoteErrorKind::Internal, e.to_string());
            let fallback = Response {
                id,
                result: Err(error),
            };
            wire::encode(&fallback, max).unwrap_or_default()
        });
        let deadline = Duration::from_millis(deadline_ms);
        match tokio::time::timeout(deadline, send.write_all(&frame)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => debug!(peer = %self.peer, "cannot send a response: {e}"),
            Err(_) => {
                debug!(peer = %self.peer, "the peer did not take the response within {deadline:?}")
            }
        }
        let _ = send.finish();
    }

    /// Runs the handler within the request's deadline. `Err` means the
    /// connection must be closed with that reason.
    async fn call_handler(
        &self,
        body: Vec<u8>,
        deadline: Duration,
    ) -> Result<Result<Vec<u8>, RemoteError>, String> {
        let handled = self.handler.handle(self.peer.clone(), body);
        match tokio::time::timeout(deadline, handled).await {
            Ok(Ok(body)) => Ok(Ok(body)),
            Ok(Err(HandlerError::Remote(error))) => Ok(Err(error)),
            Ok(Err(HandlerError::Malformed(reason))) => Err(reason),
            Err(_) => Ok(Err(RemoteError::new(
                RemoteErrorKind::DeadlineExceeded,
                format!("not answered within the request's deadline of {deadline:?}"),
            ))),
        }
    }

    fn refuse(&self, reason: &str) {
        warn!(peer = %self.peer, "closing the connection: {reason}");
        close(&self.quic, CloseCode::BadFrame, reason);
    }
}
