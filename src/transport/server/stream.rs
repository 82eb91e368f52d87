//! One request stream (steps 3 and 4 of `mod.rs`): its first request
//! read within the timeout, then plain requests answered on it, or an
//! ordered channel served in order.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::wire::{self, CloseCode, RemoteError, RemoteErrorKind, Request, Response, WireError};

use super::responses::ResponseWriter;
use super::{buffer_budget, HandlerError, RequestHandler, MIN_CHARGE};
use crate::transport::answer::{Answer, Direct, Reply};
use crate::transport::connection::close;
use crate::transport::frames::ReadFrames;
use crate::transport::tickets::Caller;
use crate::transport::Endpoint;

/// Serves one request stream: a single request, or an ordered channel.
#[derive(Clone)]
pub(super) struct StreamTask {
    pub(super) endpoint: Endpoint,
    pub(super) quic: quinn::Connection,
    pub(super) peer: Caller,
    pub(super) handler: Arc<dyn RequestHandler>,
    /// The connection's [`buffer_budget`], shared by its streams.
    pub(super) budget: Arc<Semaphore>,
}

/// A stream's response writer, stopped when the stream's task is dropped
/// (a same-host socket whose connection closed writes nothing more).
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request and its share of the connection's budget, given back once it
/// is answered.
pub(super) struct Admitted {
    pub(super) request: Request,
    pub(super) _charge: OwnedSemaphorePermit,
}

/// The response to one request, once the handler is done (`None` for a
/// one-way request).
pub(super) type PendingResponse = BoxFuture<'static, Option<Response>>;

/// The writing half of a request stream: QUIC's, or a same-host socket's
/// ([`LocalSend`]).
pub(super) trait SendHalf: Send + 'static {
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
pub(super) struct LocalSend(pub(super) Arc<Direct>);

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
    pub(super) async fn run(self, send: impl SendHalf, mut recv: impl ReadFrames) {
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
    pub(super) async fn run_local(self, direct: Arc<Direct>, mut recv: impl ReadFrames) {
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
    pub(super) async fn serve_requests(
        self,
        first: Admitted,
        send: impl SendHalf,
        mut recv: impl ReadFrames,
    ) {
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
    pub(super) async fn serve_channel(
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
    pub(super) async fn read_request(
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
    pub(super) fn too_slow<T>(&self, what: &str, timeout: Duration) -> Result<T, ()> {
        self.refuse(&format!("{what} within {timeout:?} (request_read_timeout)"));
        Err(())
    }

    /// A read that failed: `Ok` for a stream the peer ended cleanly,
    /// otherwise the stream failed (`Err`) or the input was bad (the
    /// connection is closed).
    pub(super) fn failed(&self, error: WireError) -> Result<(), ()> {
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
    pub(super) fn start(
        &self,
        admitted: Admitted,
        direct: Option<&Arc<Direct>>,
    ) -> PendingResponse {
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

    pub(super) fn refuse(&self, reason: &str) {
        warn!(peer = %self.peer, "closing the connection: {reason}");
        close(&self.quic, CloseCode::BadFrame, reason);
    }
}
