//! Answers written by the thread that has them, on same-host channels.
//!
//! A request of an ordered same-host channel (`local.rs`) whose handler
//! takes an [`Answer`] ([`RequestHandler::handle_answering`]) can be
//! answered from whichever thread produces the reply (a hosted actor's),
//! instead of being handed back to the stream's writer on the transport's
//! thread, which would have to be woken to write it:
//!
//! 1. **Now.** [`Answer::now`] with a reply body: when no other thread is
//!    writing to the channel's socket ([`Direct`]'s lock is free) and the
//!    socket takes the whole response frame without waiting (a
//!    non-blocking write), it is written there and then. The stream's
//!    writer looks only at the oldest request it has not written
//!    (`server/stream.rs`); when that is the only one, and the channel still
//!    takes requests, no one is woken: the writer finds it answered when
//!    the next request arrives, the channel ends, or its deadline passes.
//!    Otherwise the writer is woken, to move on to the requests behind.
//!    Responses written so may overtake earlier ones not ready yet: the
//!    caller matches them by id.
//! 2. **Partial.** A write the socket takes only part of is finished by a
//!    task on the transport's runtime, which holds the lock until then
//!    (nothing is written in between) and has `request_read_timeout` for
//!    it; past that the stream is ended, as for any response write cut
//!    off (`server/`, step 5).
//! 3. **Hand-over.** Otherwise (another thread writing, the socket full,
//!    a failed socket, a frame over the limit, an error to answer) the
//!    result goes to the stream's writer as a handler's future would, and
//!    the writer is woken.
//! 4. **Later.** [`Answer::later`] hands the writer a future to wait for.
//! 5. **Given up.** Past the request's deadline the writer stops waiting
//!    (`DeadlineExceeded`, unless the answer is out already); an answer
//!    after that is dropped, and a call not started yet is not run
//!    ([`Answer::wanted`]). The request's share of the connection's
//!    budget is held until the writer is done with it, as for any
//!    request, except that one written at once keeps only
//!    [`MIN_CHARGE`](super::server::MIN_CHARGE) of it: the writer may
//!    reach it only when the next request arrives.
//! 6. **Dropped.** An `Answer` dropped unanswered answers `Internal`.
//!
//! [`RequestHandler::handle_answering`]: super::RequestHandler::handle_answering

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::task::AtomicWaker;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::OwnedSemaphorePermit;

use crate::wire::{self, RemoteError, RemoteErrorKind, Response};

use super::server::{HandlerError, MIN_CHARGE};
use super::shm_ring::{RingWriter, SHARED_FRAME_MIN};

/// The reply to one request, or why there is none.
pub type Reply = Result<Vec<u8>, HandlerError>;

/// The writing half of a same-host socket, shared by its stream's writer
/// and the answers of its requests (step 1).
pub(super) struct Direct {
    socket: Arc<tokio::sync::Mutex<Socket>>,
    /// The transport's runtime, which finishes partial writes (step 2).
    runtime: tokio::runtime::Handle,
    max_frame_bytes: usize,
    write_timeout: Duration,
    /// The channel takes no more requests: nothing would wake its writer
    /// to look at the requests answered at once, so each answer wakes it.
    closing: AtomicBool,
    /// Requests the stream's writer has not written or passed yet.
    queued: AtomicUsize,
}

/// A request of the channel the stream's writer is not done with
/// ([`Direct::queue`]).
pub(super) struct Queued(Arc<Direct>);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A same-host socket's writing half, its ring for large frames
/// (`shm_ring.rs`), and whether it broke.
pub(super) struct Socket {
    half: OwnedWriteHalf,
    ring: RingWriter,
    /// A write failed or was cut off (a partial frame may be out), or the
    /// stream was ended: nothing more is written.
    broken: bool,
}

impl Direct {
    pub(super) fn new(
        half: OwnedWriteHalf,
        ring: RingWriter,
        max_frame_bytes: usize,
        write_timeout: Duration,
    ) -> Self {
        Direct {
            socket: Arc::new(tokio::sync::Mutex::new(Socket {
                half,
                ring,
                broken: false,
            })),
            runtime: tokio::runtime::Handle::current(),
            max_frame_bytes,
            write_timeout,
            closing: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
        }
    }

    /// A request is handed to the stream's writer: counted until the
    /// writer is done with it (the returned guard is dropped).
    pub(super) fn queue(self: &Arc<Self>) -> Queued {
        self.queued.fetch_add(1, Ordering::SeqCst);
        Queued(self.clone())
    }

    /// Whether an answer written at once must wake the writer (step 1).
    fn writer_must_look(&self) -> bool {
        self.closing.load(Ordering::SeqCst) || self.queued.load(Ordering::SeqCst) > 1
    }

    /// The channel takes no more requests (see `closing`).
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Writes `frames` whole (through the ring when they are large),
    /// waiting for the lock and the socket (the stream's writer). A write
    /// cut off (its future dropped) leaves the socket broken.
    pub(super) async fn write_all(&self, frames: &[u8]) -> std::io::Result<()> {
        let mut socket = self.socket.lock().await;
        if socket.broken {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        socket.broken = true;
        match socket.ring.write_large(frames) {
            Some(written) => socket.half.write_all(&written.marker).await?,
            None => socket.half.write_all(frames).await?,
        }
        socket.broken = false;
        Ok(())
    }

    /// Ends the stream: nothing more is written.
    pub(super) async fn shutdown(&self) {
        let mut socket = self.socket.lock().await;
        socket.broken = true;
        let _ = socket.half.shutdown().await;
    }

    /// Steps 1 and 2: `body` as the response to request `id`, written now
    /// if it can be; otherwise `body` back.
    fn try_send(&self, id: u64, body: Vec<u8>) -> Result<(), Vec<u8>> {
        let Ok(mut socket) = self.socket.clone().try_lock_owned() else {
            return Err(body);
        };
        if socket.broken {
            return Err(body);
        }
        let size = FRAME_OVERHEAD + body.len();
        let response = Response {
            id,
            result: Ok(serde_bytes::ByteBuf::from(body)),
        };
        let give_back = |response: Response| match response.result {
            Ok(body) => body.into_vec(),
            Err(_) => Vec::new(),
        };
        // A large response goes into the ring, and only its marker into
        // the socket (`shm_ring.rs`, step 2).
        let shared = (size >= SHARED_FRAME_MIN)
            .then(|| {
                socket
                    .ring
                    .write(&[], Some(&response), size, self.max_frame_bytes)
            })
            .flatten();
        let frame = match &shared {
            Some(written) => written.marker.to_vec(),
            None => {
                let mut frame = Vec::with_capacity(size);
                if wire::encode_into(&response, self.max_frame_bytes, &mut frame).is_err() {
                    return Err(give_back(response));
                }
                frame
            }
        };
        let written = match socket.half.try_write(&frame) {
            Ok(written) => written,
            Err(_) => {
                if let Some(shared) = shared {
                    socket.ring.undo(shared);
                }
                return Err(give_back(response));
            }
        };
        if written < frame.len() {
            socket.broken = true;
            let timeout = self.write_timeout;
            self.runtime.spawn(async move {
                let rest = socket.half.write_all(&frame[written..]);
                match tokio::time::timeout(timeout, rest).await {
                    Ok(Ok(())) => socket.broken = false,
                    _ => {
                        let _ = tokio::time::timeout(timeout, socket.half.shutdown()).await;
                    }
                }
            });
        }
        Ok(())
    }
}

/// Bytes a response frame takes beyond its body, about: the length prefix
/// and the MessagePack of the id and the `Ok`.
const FRAME_OVERHEAD: usize = 64;

/// Where one request stands (steps 1–6).
enum State {
    /// Not answered yet.
    Waiting,
    /// Written at once (step 1).
    Sent,
    /// For the writer to write (step 3).
    Ready(Reply),
    /// For the writer to wait for (step 4).
    Later(BoxFuture<'static, Reply>),
    /// The handler dropped its `Answer` (step 6).
    Dropped,
    /// The writer took what there was, or gave up (step 5).
    Closed,
}

struct Slot {
    inner: Mutex<Inner>,
    waker: AtomicWaker,
    direct: Weak<Direct>,
}

struct Inner {
    state: State,
    /// The request's share of the connection's budget (step 5).
    charge: Option<OwnedSemaphorePermit>,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How to answer one request of a same-host channel, from any thread
/// (steps 1–4); dropped unanswered, it answers `Internal` (step 6).
pub struct Answer {
    slot: Arc<Slot>,
    id: u64,
    answered: bool,
}

impl Answer {
    /// An answer to request `id` on `direct`'s socket, and what its
    /// stream's writer waits on.
    pub(super) fn new(
        id: u64,
        direct: &Arc<Direct>,
        charge: OwnedSemaphorePermit,
    ) -> (Self, Answered) {
        let slot = Arc::new(Slot {
            inner: Mutex::new(Inner {
                state: State::Waiting,
                charge: Some(charge),
            }),
            waker: AtomicWaker::new(),
            direct: Arc::downgrade(direct),
        });
        let answered = Answered {
            slot: slot.clone(),
            later: None,
        };
        (
            Answer {
                slot,
                id,
                answered: false,
            },
            answered,
        )
    }

    /// Whether the writer still waits for the answer (step 5).
    pub fn wanted(&self) -> bool {
        matches!(self.slot.lock().state, State::Waiting)
    }

    /// Answers with `reply`: written from this thread if it can be (steps
    /// 1 and 2), else handed to the stream's writer (step 3).
    pub fn now(mut self, reply: Reply) {
        self.answered = true;
        let mut inner = self.slot.lock();
        if !matches!(inner.state, State::Waiting) {
            return;
        }
        let direct = self.slot.direct.upgrade();
        let reply = match (reply, &direct) {
            (Ok(body), Some(direct)) => match direct.try_send(self.id, body) {
                Ok(()) => {
                    inner.state = State::Sent;
                    if let Some(charge) = &mut inner.charge {
                        let rest = charge.num_permits().saturating_sub(MIN_CHARGE);
                        drop(charge.split(rest));
                    }
                    drop(inner);
                    if direct.writer_must_look() {
                        self.slot.waker.wake();
                    }
                    return;
                }
                Err(body) => Ok(body),
            },
            (reply, _) => reply,
        };
        inner.state = State::Ready(reply);
        drop(inner);
        self.slot.waker.wake();
    }

    /// Answers with what `reply` resolves to, which the stream's writer
    /// waits for (step 4).
    pub fn later(mut self, reply: BoxFuture<'static, Reply>) {
        self.answered = true;
        let mut inner = self.slot.lock();
        if matches!(inner.state, State::Waiting) {
            inner.state = State::Later(reply);
        }
        drop(inner);
        self.slot.waker.wake();
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut inner = self.slot.lock();
        if matches!(inner.state, State::Waiting) {
            inner.state = State::Dropped;
        }
        drop(inner);
        self.slot.waker.wake();
    }
}

/// The stream writer's side of an [`Answer`]: the reply to write, or
/// `None` once it was written at once. Dropped before that (the deadline
/// passed), it gives the request up (step 5).
pub(super) struct Answered {
    slot: Arc<Slot>,
    later: Option<BoxFuture<'static, Reply>>,
}

impl Future for Answered {
    type Output = Option<Reply>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Reply>> {
        if let Some(later) = &mut self.later {
            return later.as_mut().poll(cx).map(Some);
        }
        let mut inner = self.slot.lock();
        match std::mem::replace(&mut inner.state, State::Closed) {
            State::Waiting => {
                self.slot.waker.register(cx.waker());
                inner.state = State::Waiting;
                Poll::Pending
            }
            State::Sent | State::Closed => Poll::Ready(None),
            State::Ready(reply) => Poll::Ready(Some(reply)),
            State::Dropped => Poll::Ready(Some(Err(dropped()))),
            State::Later(later) => {
                drop(inner);
                self.later = Some(later);
                self.poll(cx)
            }
        }
    }
}

impl Answered {
    /// The deadline passed (step 5): `None` if the request is still
    /// unanswered, and from now on it stays so; otherwise what there is
    /// to write, as [`poll`](Future::poll) would give it.
    pub(super) fn give_up(&mut self) -> Option<Option<Reply>> {
        if self.later.is_some() {
            return None;
        }
        let mut inner = self.slot.lock();
        match std::mem::replace(&mut inner.state, State::Closed) {
            State::Waiting | State::Later(_) | State::Closed => None,
            State::Sent => Some(None),
            State::Ready(reply) => Some(Some(reply)),
            State::Dropped => Some(Some(Err(dropped()))),
        }
    }
}

/// The error for a request whose handler dropped its `Answer`.
fn dropped() -> HandlerError {
    HandlerError::Remote(RemoteError::new(
        RemoteErrorKind::Internal,
        "the request's handler dropped it unanswered",
    ))
}

impl Drop for Answered {
    fn drop(&mut self) {
        let mut inner = self.slot.lock();
        if matches!(inner.state, State::Waiting) {
            inner.state = State::Closed;
        }
        inner.charge = None;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures::task::ArcWake;
    use tokio::net::UnixStream;

    use super::super::shm_ring;
    use tokio::sync::Semaphore;

    use super::*;

    const MAX: usize = 16 << 20;
    const WAIT: Duration = Duration::from_secs(10);

    /// A channel's shared writing half, once the runtime knows its socket
    /// is writable (a thread's write is tried only then), and the caller's
    /// end of the socket.
    async fn channel() -> (Arc<Direct>, UnixStream, tokio::net::unix::OwnedReadHalf) {
        let (ring, _) = shm_ring::create().unwrap();
        channel_with(ring).await
    }

    /// [`channel`], whose large frames find no room in its ring: they go
    /// through the socket.
    async fn channel_without_room() -> (Arc<Direct>, UnixStream, tokio::net::unix::OwnedReadHalf) {
        let (mut ring, _) = shm_ring::create().unwrap();
        let filler = vec![0u8; shm_ring::RING_BYTES - 1024];
        assert!(ring.write::<()>(&filler, None, 0, usize::MAX).is_some());
        channel_with(ring).await
    }

    async fn channel_with(
        ring: shm_ring::RingWriter,
    ) -> (Arc<Direct>, UnixStream, tokio::net::unix::OwnedReadHalf) {
        let (ours, caller) = UnixStream::pair().unwrap();
        let (read, write) = ours.into_split();
        write.writable().await.unwrap();
        (Arc::new(Direct::new(write, ring, MAX, WAIT)), caller, read)
    }

    /// Counts the wake-ups of the writer's task.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl ArcWake for Wakes {
        fn wake_by_ref(wakes: &Arc<Self>) {
            wakes.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll(answered: &mut Answered, wakes: &Arc<Wakes>) -> Poll<Option<Reply>> {
        let waker = futures::task::waker(wakes.clone());
        Pin::new(answered).poll(&mut Context::from_waker(&waker))
    }

    async fn read_response(caller: &mut UnixStream) -> Response {
        let frame = tokio::time::timeout(WAIT, crate::transport::read_frame(caller, MAX))
            .await
            .expect("a response within the wait")
            .unwrap();
        wire::decode(&frame).unwrap()
    }

    /// A request's share of a budget of its own.
    fn charge() -> OwnedSemaphorePermit {
        Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap()
    }

    fn frame(id: u64, body: Vec<u8>) -> Vec<u8> {
        let response = Response {
            id,
            result: Ok(serde_bytes::ByteBuf::from(body)),
        };
        wire::encode(&response, MAX).unwrap()
    }

    #[tokio::test]
    async fn a_ready_answer_is_written_by_its_thread_and_wakes_no_one() {
        let (direct, mut caller, _read) = channel().await;
        let budget = Arc::new(Semaphore::new(4 * MIN_CHARGE));
        let charge = budget
            .clone()
            .try_acquire_many_owned(4 * MIN_CHARGE as u32)
            .unwrap();
        let _queued = direct.queue();
        let (answer, mut answered) = Answer::new(7, &direct, charge);
        let wakes = Arc::new(Wakes::default());
        assert!(poll(&mut answered, &wakes).is_pending());
        std::thread::spawn(move || answer.now(Ok(b"reply".to_vec())))
            .join()
            .unwrap();
        let response = read_response(&mut caller).await;
        assert_eq!(response.id, 7);
        assert_eq!(response.result.unwrap().into_vec(), b"reply");
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "no one woken");
        assert_eq!(
            budget.available_permits(),
            3 * MIN_CHARGE,
            "all but MIN_CHARGE is back"
        );
        assert!(matches!(poll(&mut answered, &wakes), Poll::Ready(None)));
        drop(answered);
        assert_eq!(budget.available_permits(), 4 * MIN_CHARGE, "all is back");
    }

    #[tokio::test]
    async fn an_answer_with_requests_behind_it_wakes_the_writer() {
        let (direct, mut caller, _read) = channel().await;
        let _first_queued = direct.queue();
        let (first, mut first_answered) = Answer::new(1, &direct, charge());
        let _second_queued = direct.queue();
        let (second, _second_answered) = Answer::new(2, &direct, charge());
        let wakes = Arc::new(Wakes::default());
        assert!(poll(&mut first_answered, &wakes).is_pending());
        // The second is handed over, unseen: the writer waits on the first.
        second.now(Err(
            RemoteError::new(RemoteErrorKind::Internal, "panicked").into()
        ));
        first.now(Ok(b"first".to_vec()));
        assert_eq!(read_response(&mut caller).await.id, 1);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the writer moves on");
    }

    #[tokio::test]
    async fn an_answer_at_the_deadline_is_written_once() {
        let (direct, mut caller, _read) = channel().await;
        let (answer, mut answered) = Answer::new(4, &direct, charge());
        answer.now(Ok(b"in time".to_vec()));
        assert!(
            matches!(answered.give_up(), Some(None)),
            "written already: no DeadlineExceeded"
        );
        assert_eq!(read_response(&mut caller).await.id, 4);
        let (answer, mut answered) = Answer::new(5, &direct, charge());
        assert!(answered.give_up().is_none(), "DeadlineExceeded");
        assert!(!answer.wanted(), "the call need not run");
        answer.now(Ok(b"too late".to_vec()));
        direct.write_all(&frame(6, b"next".to_vec())).await.unwrap();
        assert_eq!(read_response(&mut caller).await.id, 6, "5 is not written");
    }

    #[tokio::test]
    async fn an_error_goes_to_the_writer_which_is_woken() {
        let (direct, _caller, _read) = channel().await;
        let (answer, mut answered) = Answer::new(1, &direct, charge());
        let wakes = Arc::new(Wakes::default());
        assert!(poll(&mut answered, &wakes).is_pending());
        let error = RemoteError::new(RemoteErrorKind::BadRequest, "no such message");
        answer.now(Err(error.into()));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        let Poll::Ready(Some(Err(HandlerError::Remote(error)))) = poll(&mut answered, &wakes)
        else {
            panic!("the error is the writer's to write");
        };
        assert_eq!(error.kind, RemoteErrorKind::BadRequest);
    }

    #[tokio::test]
    async fn once_the_channel_ends_a_ready_answer_wakes_the_writer() {
        let (direct, mut caller, _read) = channel().await;
        let (answer, mut answered) = Answer::new(3, &direct, charge());
        let wakes = Arc::new(Wakes::default());
        assert!(poll(&mut answered, &wakes).is_pending());
        direct.close();
        answer.now(Ok(b"last".to_vec()));
        assert_eq!(read_response(&mut caller).await.id, 3);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the writer must finish");
        assert!(matches!(poll(&mut answered, &wakes), Poll::Ready(None)));
    }

    #[tokio::test]
    async fn an_answer_after_the_writer_gave_up_is_dropped() {
        let (direct, mut caller, _read) = channel().await;
        let budget = Arc::new(Semaphore::new(1));
        let charge = budget.clone().try_acquire_owned().unwrap();
        let (answer, answered) = Answer::new(5, &direct, charge);
        drop(answered);
        assert_eq!(budget.available_permits(), 1, "the budget is back");
        answer.now(Ok(b"too late".to_vec()));
        direct.write_all(&frame(6, b"next".to_vec())).await.unwrap();
        assert_eq!(read_response(&mut caller).await.id, 6, "5 is not written");
    }

    #[tokio::test]
    async fn a_dropped_answer_is_an_internal_error() {
        let (direct, _caller, _read) = channel().await;
        let (answer, mut answered) = Answer::new(9, &direct, charge());
        drop(answer);
        let wakes = Arc::new(Wakes::default());
        let Poll::Ready(Some(Err(HandlerError::Remote(error)))) = poll(&mut answered, &wakes)
        else {
            panic!("a dropped answer must be answered");
        };
        assert_eq!(error.kind, RemoteErrorKind::Internal);
    }

    #[tokio::test]
    async fn a_partial_write_is_finished_before_the_writers_next_frame() {
        let (direct, mut caller, _read) = channel_without_room().await;
        // Far more than a socket's buffer: the thread's write is partial.
        let large: Vec<u8> = (0..(4 << 20)).map(|i| (i % 251) as u8).collect();
        let (answer, _answered) = Answer::new(1, &direct, charge());
        answer.now(Ok(large.clone()));
        let writer = direct.clone();
        let next = tokio::spawn(async move { writer.write_all(&frame(2, b"next".to_vec())).await });
        let first = read_response(&mut caller).await;
        assert_eq!(first.id, 1);
        assert_eq!(
            first.result.unwrap().into_vec(),
            large,
            "whole, not interleaved"
        );
        assert_eq!(read_response(&mut caller).await.id, 2);
        next.await.unwrap().unwrap();
    }
}
