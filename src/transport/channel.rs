//! Ordered channels: one long-lived stream carrying many requests, handled
//! by the peer in the order sent.
//!
//! A plain request takes a stream of its own, so two requests sent one
//! after the other may be handled in either order. Calls from one caller to
//! one actor must not be reordered, so they share a channel: the caller
//! writes request frames one after another on one stream, the peer hands
//! them to its handler in that order, and writes the responses back on the
//! same stream, each with its request's id (on a same-host socket one
//! written at once by the thread that has it may come before an earlier
//! one: `answer.rs`). Requests are pipelined: a caller need not wait for
//! one response before sending the next.
//!
//! A caller that knows more requests follow at once may
//! [`queue_request`](Channel::queue_request) them: they wait in the
//! channel's buffer and go out together, in one write (one system call on
//! a same-host socket), with the next request sent, at a
//! [`flush`](Channel::flush), or once the buffer holds `BATCH_BYTES`
//! (64 KiB, `batch.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use serde_bytes::ByteBuf;
use tokio::sync::oneshot;

use crate::wire::{self, RemoteError, Request, Response, WireError};

use super::batch::Batch;
use super::frames::{LocalFrames, Plain, ReadFrames};
use super::local::LocalSocket;
use super::shm_ring::{RingWriter, SHARED_FRAME_MIN};
use super::{Connection, RequestError, RequestOptions};

type Reply = Result<Vec<u8>, RemoteError>;

/// The caller's end of an ordered channel. Cheap to clone; clones share
/// the channel (and its ordering).
#[derive(Clone)]
pub struct Channel {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Connection,
    send: tokio::sync::Mutex<Outgoing>,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    max_frame_bytes: usize,
    /// Whether the peer keeps its requests' order (an ordered channel) or
    /// handles each on its own (a same-host socket's plain requests).
    ordered: bool,
    /// Whether it runs over a same-host socket.
    local: bool,
    /// A same-host socket's: its connection's flag that the route is not
    /// to be used again.
    route_lost: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Inner {
    /// The acceptor of this same-host socket is gone (the socket ended
    /// while its connection is open): its requests fail with `NodeLost`,
    /// and the connection drops the route, whose name is free for any
    /// process of the host to bind.
    fn mark_acceptor_gone(&self) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).lost = true;
        if let Some(route) = &self.route_lost {
            route.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A response deadline at least this far away (an actor call without
/// one: `actor::NO_DEADLINE`) starts no timer: tokio's timers reach only
/// about two years ahead anyway, and each armed timer costs a call two
/// updates of the runtime's timer wheel.
const UNARMED_DEADLINE: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// The response to a request sent on a [`Channel`].
pub struct PendingReply {
    channel: Channel,
    id: u64,
    reply: oneshot::Receiver<Reply>,
    deadline: tokio::time::Instant,
    after: std::time::Duration,
}

impl PendingReply {
    /// Waits for the response, until the request's deadline.
    pub async fn wait(self) -> Result<Vec<u8>, RequestError> {
        let channel = self.channel;
        let reply = if self.after >= UNARMED_DEADLINE {
            Ok(self.reply.await)
        } else {
            tokio::time::timeout_at(self.deadline, self.reply).await
        };
        match reply {
            Ok(Ok(Ok(body))) => Ok(body),
            Ok(Ok(Err(error))) => Err(RequestError::Remote {
                peer: channel.inner.connection.peer().clone(),
                error,
            }),
            Ok(Err(_)) => Err(channel.broken()),
            Err(_) => {
                channel.forget(self.id);
                Err(channel.timeout(self.after))
            }
        }
    }
}

/// Frames not yet written, and where they go.
struct Outgoing {
    writer: Writer,
    batch: Batch,
    /// A write was cancelled partway (its caller's deadline passed): the
    /// stream holds part of a frame, so nothing more may follow it.
    torn: bool,
}

/// Breaks the channel if dropped while armed: a write cancelled partway.
struct TornGuard<'a> {
    channel: &'a Channel,
    armed: bool,
}

impl Drop for TornGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let reason = "a write was cancelled partway (its deadline passed): the channel's stream is unusable";
            fail_waiting(&Arc::downgrade(&self.channel.inner), reason.into());
        }
    }
}

/// When a request leaves the channel's buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flush {
    Now,
    Later,
}

/// Where a channel's requests go: a QUIC stream, or a Unix-domain socket
/// to a process of this host (`local.rs`) with its ring for large frames
/// (`shm_ring.rs`).
enum Writer {
    Quic(quinn::SendStream),
    Local(tokio::net::unix::OwnedWriteHalf, RingWriter),
}

impl Writer {
    async fn write(&mut self, frames: &[u8], priority: i32) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match self {
            Writer::Quic(send) => {
                let _ = send.set_priority(priority);
                send.write_all(frames).await.map_err(Into::into)
            }
            Writer::Local(send, ring) => match ring.write_large(frames) {
                Some(written) => send.write_all(&written.marker).await,
                None => send.write_all(frames).await,
            },
        }
    }

    /// Writes `frames` and then `request` straight into the ring, if this
    /// is a same-host socket whose ring has room: `Some` once the marker
    /// is written.
    async fn write_shared(
        &mut self,
        frames: &[u8],
        request: &Request,
        max: usize,
    ) -> Option<std::io::Result<()>> {
        use tokio::io::AsyncWriteExt;
        let Writer::Local(send, ring) = self else {
            return None;
        };
        let written = ring.write(
            frames,
            Some(request),
            request.body.len() + ENVELOPE_BYTES,
            max,
        )?;
        Some(send.write_all(&written.marker).await)
    }
}

/// Room for a request's envelope around its body, when it is encoded
/// straight into a ring: its id, incarnation, deadline and flags.
const ENVELOPE_BYTES: usize = 256;

/// Requests waiting for their response, or why none will come.
#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Reply>>,
    broken: Option<String>,
    /// The same-host socket ended while the connection was open: only the
    /// peer's death does that (`local.rs`, step 4).
    lost: bool,
}

impl Channel {
    pub(super) fn start(
        connection: Connection,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
        max_frame_bytes: usize,
    ) -> Self {
        let inner = Self::inner(connection, Writer::Quic(send), None, max_frame_bytes, true);
        tokio::spawn(read_responses(
            Arc::downgrade(&inner),
            max_frame_bytes,
            Plain(recv),
        ));
        Channel { inner }
    }

    /// A channel over `stream`, a Unix-domain socket admitted for
    /// `connection` (`local.rs`): it ends when the connection closes.
    /// Unless `ordered`, the peer handles its requests each on its own and
    /// answers them as they finish (plain requests, `local.rs` step 2).
    /// When the socket ends while the connection is open, the acceptor is
    /// gone: `route_lost` is set, and the connection's later channels use
    /// QUIC (the socket's name is free for another process to bind:
    /// [`Inner::mark_acceptor_gone`]).
    pub(super) fn start_local(
        connection: Connection,
        socket: LocalSocket,
        route_lost: Arc<std::sync::atomic::AtomicBool>,
        max_frame_bytes: usize,
        ordered: bool,
    ) -> Self {
        let (recv, send) = socket.stream.into_split();
        let inner = Self::inner(
            connection.clone(),
            Writer::Local(send, socket.out),
            Some(route_lost),
            max_frame_bytes,
            ordered,
        );
        let reading = Arc::downgrade(&inner);
        let recv = LocalFrames::new(recv, socket.from_peer);
        tokio::spawn(async move {
            tokio::select! {
                () = read_responses(reading.clone(), max_frame_bytes, recv) => {}
                lost = connection.closed() => fail_waiting(&reading, lost.to_string()),
            }
        });
        Channel { inner }
    }

    fn inner(
        connection: Connection,
        send: Writer,
        route_lost: Option<Arc<std::sync::atomic::AtomicBool>>,
        max_frame_bytes: usize,
        ordered: bool,
    ) -> Arc<Inner> {
        Arc::new(Inner {
            connection,
            local: matches!(send, Writer::Local(..)),
            route_lost,
            send: tokio::sync::Mutex::new(Outgoing {
                writer: send,
                batch: Batch::default(),
                torn: false,
            }),
            pending: Mutex::new(Pending::default()),
            next_id: AtomicU64::new(1),
            max_frame_bytes,
            ordered,
        })
    }

    /// Sends `body` after every request sent before it on this channel and
    /// waits for its response.
    pub async fn request(
        &self,
        body: Vec<u8>,
        options: RequestOptions,
    ) -> Result<Vec<u8>, RequestError> {
        self.send_request(body, options).await?.wait().await
    }

    /// Sends `body` after every request sent before it on this channel;
    /// returns once it is written, with the response to wait for. Sending
    /// the next request need not wait for this one's response.
    pub async fn send_request(
        &self,
        body: Vec<u8>,
        options: RequestOptions,
    ) -> Result<PendingReply, RequestError> {
        self.send_with(body, options, Flush::Now).await
    }

    /// As [`send_request`](Self::send_request), but the request may wait
    /// in the channel's buffer until the next request sent without
    /// queueing, the next [`flush`](Self::flush), or until the buffer
    /// holds `BATCH_BYTES`: for a caller with more requests to send at
    /// once, which must flush when it has none left.
    pub async fn queue_request(
        &self,
        body: Vec<u8>,
        options: RequestOptions,
    ) -> Result<PendingReply, RequestError> {
        self.send_with(body, options, Flush::Later).await
    }

    /// Writes the requests waiting in the channel's buffer.
    pub async fn flush(&self, options: RequestOptions) -> Result<(), RequestError> {
        let flushed = async {
            let mut outgoing = self.inner.send.lock().await;
            if outgoing.batch.is_empty() {
                return Ok(());
            }
            self.write_batch(&mut outgoing, options.priority).await
        };
        tokio::time::timeout(options.deadline, flushed)
            .await
            .map_err(|_| self.timeout(options.deadline))?
    }

    async fn send_with(
        &self,
        body: Vec<u8>,
        options: RequestOptions,
        flush: Flush,
    ) -> Result<PendingReply, RequestError> {
        let (id, reply) = self.register()?;
        let written = tokio::time::timeout(
            options.deadline,
            self.write(id, body, options, false, flush),
        )
        .await;
        match written {
            Ok(Ok(())) => Ok(PendingReply {
                channel: self.clone(),
                id,
                reply,
                deadline: tokio::time::Instant::now() + options.deadline,
                after: options.deadline,
            }),
            Ok(Err(e)) => {
                self.forget(id);
                Err(e)
            }
            Err(_) => {
                self.forget(id);
                Err(self.timeout(options.deadline))
            }
        }
    }

    fn timeout(&self, after: std::time::Duration) -> RequestError {
        RequestError::Timeout {
            peer: self.inner.connection.peer().clone(),
            after,
        }
    }

    /// Sends `body` after every request sent before it, expecting no
    /// response. Returns once it is written (handed to QUIC, or to the
    /// same-host socket).
    pub async fn notify(&self, body: Vec<u8>, options: RequestOptions) -> Result<(), RequestError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let write = self.write(id, body, options, true, Flush::Now);
        tokio::time::timeout(options.deadline, write)
            .await
            .map_err(|_| self.timeout(options.deadline))?
    }

    /// How many times this channel has written its requests through the
    /// shared-memory ring of a same-host socket (`shm_ring.rs`) rather
    /// than the socket: 0 on QUIC.
    pub async fn shared_regions(&self) -> u64 {
        match &self.inner.send.lock().await.writer {
            Writer::Local(_, ring) => ring.regions(),
            Writer::Quic(_) => 0,
        }
    }

    /// Whether the channel can still carry requests.
    pub fn is_open(&self) -> bool {
        self.inner.connection.is_open() && self.lock().broken.is_none()
    }

    /// Whether the process at the other end is known to be gone: this is a
    /// same-host socket that ended while its connection was open (its
    /// requests fail at once with `NodeLost`).
    pub fn peer_is_gone(&self) -> bool {
        self.lock().lost
    }

    fn register(&self) -> Result<(u64, oneshot::Receiver<Reply>), RequestError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut pending = self.lock();
        if pending.broken.is_some() {
            drop(pending);
            return Err(self.broken());
        }
        pending.waiting.insert(id, tx);
        Ok((id, rx))
    }

    async fn write(
        &self,
        id: u64,
        body: Vec<u8>,
        options: RequestOptions,
        one_way: bool,
        flush: Flush,
    ) -> Result<(), RequestError> {
        let request = Request {
            id,
            to: Some(self.inner.connection.peer().incarnation),
            deadline_ms: options.deadline.as_millis() as u64,
            one_way,
            ordered: self.inner.ordered,
            body,
        };
        let mut outgoing = self.inner.send.lock().await;
        if outgoing.torn {
            return Err(self.broken());
        }
        if outgoing.batch.len() + request.body.len() >= SHARED_FRAME_MIN {
            if let Some(written) = self.write_shared(&mut outgoing, &request).await {
                return written;
            }
        }
        (outgoing.batch)
            .push(&request, self.inner.max_frame_bytes)
            .map_err(|e| self.inner.connection.wire(e))?;
        if flush == Flush::Later && !outgoing.batch.full() {
            return Ok(());
        }
        self.write_batch(&mut outgoing, options.priority).await
    }

    /// Writes the buffer. A failed write, or one cancelled partway,
    /// breaks the channel: the requests it held (and any partly written
    /// frame) are lost, so every request waiting fails.
    async fn write_batch(
        &self,
        outgoing: &mut Outgoing,
        priority: i32,
    ) -> Result<(), RequestError> {
        if outgoing.torn {
            return Err(self.broken());
        }
        outgoing.torn = true;
        let mut guard = TornGuard {
            channel: self,
            armed: true,
        };
        let written = outgoing
            .writer
            .write(outgoing.batch.bytes(), priority)
            .await;
        guard.armed = false;
        outgoing.torn = false;
        outgoing.batch.clear();
        written.map_err(|e| self.write_failed(e))
    }

    /// Writes the buffer and then `request` through the ring of a
    /// same-host socket (`shm_ring.rs`, step 2), in one region; `None`
    /// when there is no ring or no room in it.
    async fn write_shared(
        &self,
        outgoing: &mut Outgoing,
        request: &Request,
    ) -> Option<Result<(), RequestError>> {
        if outgoing.torn {
            return Some(Err(self.broken()));
        }
        outgoing.torn = true;
        let mut guard = TornGuard {
            channel: self,
            armed: true,
        };
        let max = self.inner.max_frame_bytes;
        let mut frames = std::mem::take(&mut outgoing.batch);
        let written = outgoing
            .writer
            .write_shared(frames.bytes(), request, max)
            .await;
        guard.armed = false;
        outgoing.torn = false;
        if written.is_some() {
            frames.clear();
        }
        outgoing.batch = frames;
        written.map(|written| written.map_err(|e| self.write_failed(e)))
    }

    /// A write failed: the channel is broken, and every request waiting
    /// fails (with `NodeLost` when the acceptor of a same-host socket is
    /// gone).
    fn write_failed(&self, e: std::io::Error) -> RequestError {
        let gone = self.inner.local && self.inner.connection.is_open();
        let error = if gone {
            self.inner.mark_acceptor_gone();
            self.lost()
        } else {
            self.inner.connection.io_failure(e)
        };
        fail_waiting(&Arc::downgrade(&self.inner), error.to_string());
        error
    }

    /// The peer of a same-host socket that ended is gone.
    fn lost(&self) -> RequestError {
        RequestError::NodeLost {
            peer: self.inner.connection.peer().clone(),
            reason: "its same-host socket closed: the process is gone".into(),
        }
    }

    fn forget(&self, id: u64) {
        self.lock().waiting.remove(&id);
    }

    /// The error for a request on a channel that broke.
    fn broken(&self) -> RequestError {
        let connection = &self.inner.connection;
        if !connection.is_open() {
            return connection.io_failure(std::io::ErrorKind::ConnectionAborted.into());
        }
        let pending = self.lock();
        if pending.lost {
            drop(pending);
            return self.lost();
        }
        let reason = pending.broken.clone().unwrap_or_default();
        RequestError::Rejected {
            peer: connection.peer().clone(),
            reason,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.inner.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Hands each response to its waiting request; when the stream ends, fails
/// every request still waiting. Holds the channel weakly: once every
/// handle to it is gone (and with them every waiting request), its writer
/// is dropped, which ends the stream, and this task with it. A same-host
/// socket that ends while the channel is held and its connection open
/// means its acceptor is gone ([`Inner::mark_acceptor_gone`]).
async fn read_responses(inner: Weak<Inner>, max_frame_bytes: usize, mut recv: impl ReadFrames) {
    let (reason, ended) = loop {
        let frame = match read_frame(&mut recv, max_frame_bytes).await {
            Ok(frame) => frame,
            Err(WireError::Empty) => break ("the peer closed the channel".to_string(), true),
            Err(WireError::Io(e)) => break (e.to_string(), true),
            Err(e) => break (e.to_string(), false),
        };
        let response: Response = match wire::decode(&frame) {
            Ok(response) => response,
            Err(e) => break (e.to_string(), false),
        };
        drop(frame);
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let waiting = inner
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiting
            .remove(&response.id);
        if let Some(waiting) = waiting {
            let _ = waiting.send(response.result.map(ByteBuf::into_vec));
        }
    };
    if let Some(inner) = inner.upgrade() {
        if ended && inner.local && inner.connection.is_open() {
            inner.mark_acceptor_gone();
        }
        fail_waiting(&Arc::downgrade(&inner), reason);
    }
}

/// The next frame of `recv`.
async fn read_frame(
    recv: &mut impl ReadFrames,
    max_frame_bytes: usize,
) -> Result<super::frames::Frame<'_>, WireError> {
    let len = recv.read_len(max_frame_bytes).await?;
    recv.read_body(len).await
}

/// The channel broke (`reason`): every request waiting fails.
fn fail_waiting(inner: &Weak<Inner>, reason: String) {
    let Some(inner) = inner.upgrade() else {
        return;
    };
    let mut pending = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
    pending.broken = Some(reason);
    pending.waiting.clear();
}
