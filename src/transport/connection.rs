//! A live, authenticated connection to one peer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::wire::{self, CloseCode, LocalRoute, NodeIdentity, Request, Response, WireError};

use super::{frame_io, local, Channel, RequestError, RequestOptions};

/// A connection to a node, after the TLS and nimbus handshakes. Cheap to
/// clone; clones share the connection.
#[derive(Clone)]
pub struct Connection {
    quic: quinn::Connection,
    peer: NodeIdentity,
    next_id: Arc<AtomicU64>,
    max_frame_bytes: usize,
    /// The peer's same-host route, when its channels may use it.
    local: Option<Arc<LocalDial>>,
    /// How long opening a same-host socket may take.
    connect_timeout: std::time::Duration,
}

/// A route to the peer's Unix-domain socket (`local.rs`, step 2).
struct LocalDial {
    route: LocalRoute,
    /// The socket could not be reached once, or one of its channels ended
    /// while the connection was open (the acceptor is gone): QUIC from
    /// then on.
    unreachable: Arc<AtomicBool>,
    /// The socket plain requests share, opened at the first and again
    /// after it breaks. Its channel holds the connection without this
    /// route, so the two do not keep each other alive.
    requests: tokio::sync::Mutex<Option<Channel>>,
}

impl Connection {
    /// `local`: the peer's same-host route, already checked to be this
    /// host's.
    pub(super) fn new(
        quic: quinn::Connection,
        peer: NodeIdentity,
        config: &super::TransportConfig,
        local: Option<LocalRoute>,
    ) -> Self {
        Connection {
            quic,
            peer,
            next_id: Arc::new(AtomicU64::new(1)),
            max_frame_bytes: config.max_frame_bytes,
            connect_timeout: config.connect_timeout,
            local: local.map(|route| {
                Arc::new(LocalDial {
                    route,
                    unreachable: Arc::new(AtomicBool::new(false)),
                    requests: tokio::sync::Mutex::new(None),
                })
            }),
        }
    }

    /// The abstract name of the peer's Unix-domain socket that this
    /// connection's channels use (`None`: they use QUIC).
    pub fn local_socket(&self) -> Option<&str> {
        self.local
            .as_ref()
            .filter(|l| !l.unreachable.load(Ordering::Relaxed))
            .map(|l| l.route.socket.as_str())
    }

    /// The node at the other end, as it introduced itself.
    pub fn peer(&self) -> &NodeIdentity {
        &self.peer
    }

    /// Whether the connection is still open.
    pub fn is_open(&self) -> bool {
        self.quic.close_reason().is_none()
    }

    /// Sends `body` on a stream of its own (on one host, on the peer's
    /// Unix-domain socket: `local.rs`) and waits for the response body.
    ///
    /// Fails with [`RequestError::Timeout`] after `options.deadline`, and
    /// with [`RequestError::NodeLost`] as soon as the connection is lost.
    pub async fn request(
        &self,
        body: Vec<u8>,
        options: RequestOptions,
    ) -> Result<Vec<u8>, RequestError> {
        if self.local.is_some() {
            // The deadline covers opening the socket too (a stopped peer
            // takes the key and never answers it).
            let deadline = tokio::time::Instant::now() + options.deadline;
            let timed_out = || RequestError::Timeout {
                peer: self.peer.clone(),
                after: options.deadline,
            };
            let opened = tokio::time::timeout_at(deadline, self.local_requests(options.deadline))
                .await
                .map_err(|_| timed_out())?;
            if let Some(requests) = opened {
                return tokio::time::timeout_at(deadline, requests.request(body, options))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()));
            }
        }
        let exchange = self.exchange(body, options, false);
        match tokio::time::timeout(options.deadline, exchange).await {
            Ok(result) => result.map(|reply| reply.unwrap_or_default()),
            Err(_) => Err(RequestError::Timeout {
                peer: self.peer.clone(),
                after: options.deadline,
            }),
        }
    }

    /// Sends `body` without waiting for any answer. Succeeds once the
    /// message is handed to QUIC, which delivers it unless the connection
    /// is lost.
    pub async fn notify(&self, body: Vec<u8>, options: RequestOptions) -> Result<(), RequestError> {
        let local = tokio::time::timeout(options.deadline, self.local_requests(options.deadline));
        if let Ok(Some(requests)) = local.await {
            return requests.notify(body, options).await;
        }
        let exchange = self.exchange(body, options, true);
        match tokio::time::timeout(options.deadline, exchange).await {
            Ok(result) => result.map(|_| ()),
            Err(_) => Err(RequestError::Timeout {
                peer: self.peer.clone(),
                after: options.deadline,
            }),
        }
    }

    /// Sends raw bytes on a new stream and returns whatever comes back, up
    /// to `max_frame_bytes`. For tests of how nodes treat bad input.
    pub async fn send_raw(&self, bytes: &[u8]) -> Result<Vec<u8>, RequestError> {
        let (mut send, mut recv) = self.quic.open_bi().await.map_err(|e| self.lost(e))?;
        send.write_all(bytes)
            .await
            .map_err(|e| self.io_failure(e.into()))?;
        let _ = send.finish();
        recv.read_to_end(self.max_frame_bytes)
            .await
            .map_err(|e| self.io_failure(std::io::Error::other(e)))
    }

    /// Writes raw bytes on a new stream until the peer stops taking them
    /// for `stall` (flow control holding the rest back), and keeps the
    /// stream open while the returned value lives. For tests of what a
    /// peer that stalls mid-frame can make a node hold.
    pub async fn send_raw_and_stall(
        &self,
        bytes: &[u8],
        stall: std::time::Duration,
    ) -> Result<StalledStream, RequestError> {
        let (mut send, _recv) = self.quic.open_bi().await.map_err(|e| self.lost(e))?;
        let mut sent = 0;
        while sent < bytes.len() {
            let end = (sent + (64 << 10)).min(bytes.len());
            match tokio::time::timeout(stall, send.write(&bytes[sent..end])).await {
                Ok(Ok(n)) => sent += n,
                Ok(Err(e)) => return Err(self.io_failure(e.into())),
                Err(_) => break,
            }
        }
        Ok(StalledStream { sent, send })
    }

    /// QUIC's counters for this connection (bytes and packets sent and
    /// received, frames, round-trip time).
    pub fn stats(&self) -> quinn::ConnectionStats {
        self.quic.stats()
    }

    /// The same-host socket plain requests share, if this connection has
    /// one (opened now if need be, within `deadline`).
    async fn local_requests(&self, deadline: std::time::Duration) -> Option<Channel> {
        let dial = self.local.as_ref()?;
        let mut shared = tokio::time::timeout(deadline, dial.requests.lock())
            .await
            .ok()?;
        // One whose acceptor is gone fails its requests at once (`NodeLost`)
        // rather than leave them to QUIC's idle timeout.
        if let Some(open) = shared.as_ref().filter(|c| c.is_open() || c.peer_is_gone()) {
            return Some(open.clone());
        }
        if dial.unreachable.load(Ordering::Relaxed) {
            return None;
        }
        let stream = self.local_stream(dial, deadline).await?;
        let bare = Connection {
            local: None,
            ..self.clone()
        };
        let route = dial.unreachable.clone();
        let channel = Channel::start_local(bare, stream, route, self.max_frame_bytes, false);
        *shared = Some(channel.clone());
        Some(channel)
    }

    /// A socket to the peer's same-host route; `None` (and QUIC from now
    /// on) when it cannot be reached.
    /// Within `deadline` at most (and `connect_timeout`).
    async fn local_stream(
        &self,
        dial: &LocalDial,
        deadline: std::time::Duration,
    ) -> Option<local::LocalSocket> {
        let timeout = deadline.min(self.connect_timeout);
        match local::connect(&dial.route, timeout).await {
            Ok(stream) => Some(stream),
            Err(local::Unusable::ForNow(e)) => {
                tracing::debug!(peer = %self.peer, "no same-host socket this time ({e}); using QUIC");
                None
            }
            Err(local::Unusable::ForGood(e)) => {
                tracing::debug!(peer = %self.peer, "no same-host socket ({e}); using QUIC from now on");
                dial.unreachable.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// Opens an ordered channel: requests sent on it are handled by the peer
    /// in the order they were sent (see [`Channel`]). On one host it runs
    /// over a Unix-domain socket where it can (`local.rs`).
    pub async fn open_channel(&self) -> Result<Channel, RequestError> {
        let local = self
            .local
            .as_ref()
            .filter(|dial| !dial.unreachable.load(Ordering::Relaxed));
        if let Some(dial) = local {
            if let Some(stream) = self.local_stream(dial, self.connect_timeout).await {
                return Ok(Channel::start_local(
                    self.clone(),
                    stream,
                    dial.unreachable.clone(),
                    self.max_frame_bytes,
                    true,
                ));
            }
        }
        let (send, recv) = self.quic.open_bi().await.map_err(|e| self.lost(e))?;
        Ok(Channel::start(
            self.clone(),
            send,
            recv,
            self.max_frame_bytes,
        ))
    }

    /// Closes the connection from this side.
    pub fn close(&self, reason: &str) {
        close(&self.quic, CloseCode::Done, reason);
    }

    /// Waits until the connection is closed and returns why.
    pub async fn closed(&self) -> RequestError {
        self.lost(self.quic.closed().await)
    }

    async fn exchange(
        &self,
        body: Vec<u8>,
        options: RequestOptions,
        one_way: bool,
    ) -> Result<Option<Vec<u8>>, RequestError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = Request {
            id,
            to: Some(self.peer.incarnation),
            deadline_ms: options.deadline.as_millis() as u64,
            one_way,
            ordered: false,
            body,
        };
        let frame = wire::encode(&request, self.max_frame_bytes).map_err(|e| self.wire(e))?;
        let (mut send, mut recv) = self.quic.open_bi().await.map_err(|e| self.lost(e))?;
        let _ = send.set_priority(options.priority);
        send.write_all(&frame)
            .await
            .map_err(|e| self.io_failure(e.into()))?;
        let _ = send.finish();
        if one_way {
            return Ok(None);
        }
        let reply = match frame_io::read_frame(&mut recv, self.max_frame_bytes).await {
            Ok(reply) => reply,
            Err(WireError::Io(e)) => return Err(self.io_failure(e)),
            Err(WireError::Empty) => {
                return Err(self.io_failure(std::io::ErrorKind::UnexpectedEof.into()))
            }
            Err(e) => return Err(self.wire(e)),
        };
        let response: Response = wire::decode(&reply).map_err(|e| self.wire(e))?;
        if response.id != id {
            return Err(self.wire(WireError::Decode {
                what: "Response",
                detail: format!("answers request {} instead of {id}", response.id),
            }));
        }
        match response.result {
            Ok(body) => Ok(Some(body.into_vec())),
            Err(error) => Err(RequestError::Remote {
                peer: self.peer.clone(),
                error,
            }),
        }
    }

    /// A stream failed: if the connection is gone, say why; otherwise it
    /// is a plain I/O failure of this stream.
    pub(super) fn io_failure(&self, e: std::io::Error) -> RequestError {
        match self.quic.close_reason() {
            Some(reason) => self.lost(reason),
            None => self.wire(WireError::Io(e)),
        }
    }

    pub(super) fn wire(&self, cause: WireError) -> RequestError {
        RequestError::Wire {
            peer: self.peer.clone(),
            cause,
        }
    }

    pub(super) fn lost(&self, e: quinn::ConnectionError) -> RequestError {
        use quinn::ConnectionError as E;
        let peer = self.peer.clone();
        match e {
            E::LocallyClosed => RequestError::Closed { peer },
            E::ApplicationClosed(close)
                if close.error_code.into_inner() != CloseCode::ShuttingDown as u64 =>
            {
                RequestError::Rejected {
                    peer,
                    reason: String::from_utf8_lossy(&close.reason).into_owned(),
                }
            }
            E::TimedOut => RequestError::NodeLost {
                peer,
                reason: "no packets arrived within the idle timeout".into(),
            },
            other => RequestError::NodeLost {
                peer,
                reason: other.to_string(),
            },
        }
    }
}

/// Closes `quic` with a nimbus close code and a reason the peer can read.
pub(super) fn close(quic: &quinn::Connection, code: CloseCode, reason: &str) {
    quic.close(quinn::VarInt::from_u32(code as u32), reason.as_bytes());
}

/// A stream left open mid-write by [`Connection::send_raw_and_stall`];
/// reset when dropped.
#[derive(Debug)]
pub struct StalledStream {
    /// Bytes the peer took.
    pub sent: usize,
    send: quinn::SendStream,
}

impl Drop for StalledStream {
    fn drop(&mut self) {
        let _ = self.send.reset(0u32.into());
    }
}
