//! Typed handles to actors anywhere in the cluster.
//!
//! A handle is an actor id plus a lazily opened ordered channel to the
//! worker that hosts the actor's current incarnation. Its wire form is
//! `{ id, max_in_flight }`, so handles can be passed inside messages to
//! actors on other nodes and keep working there: the receiving process
//! asks the head where the actor runs (`LocateActor`) on first use.
//!
//! 1. **Ordering.** Every call through one handle (and its clones) is
//!    queued when `send`/`do_send` is called, and one delivery task per
//!    handle writes the queue in order on one ordered channel (a single
//!    QUIC stream) to the worker, which hands requests to the actor's
//!    mailbox in arrival order. So calls from one caller to one actor are
//!    delivered in order; they are pipelined (the next is written before
//!    the previous is answered). Calls to an actor hosted in the same
//!    process go to its actix `Addr` without serialization.
//! 2. **Limits.** A call has no deadline (as in Ray): it waits for its
//!    reply until the actor answers, dies, or its node is lost (the
//!    worker's connection breaks: at once when it closes, within the QUIC
//!    idle timeout when it is cut off); `send_with_deadline` gives one a
//!    deadline, `Timeout` past it. At most `max_in_flight` calls
//!    ([`DEFAULT_MAX_IN_FLIGHT`], 10 000) are in flight per handle, beyond
//!    that `MailboxFull`.
//! 3. **Delivery is at most once.** A call in flight when its worker dies
//!    fails and is not retried; the error says why: `NodeLost` (the head
//!    recorded the actor lost with its node, or the node is dead),
//!    `ActorDead` (the incarnation died), `Handler` (the handler panicked,
//!    with the panic text), `Timeout`, `Decode`.
//! 4. **Restarts.** The next call asks the head again; while the actor
//!    restarts (on its node, or on another after its node was lost), it
//!    waits up to 60 s for the new incarnation and reaches it. An
//!    incarnation whose process the handle saw go (its same-host socket
//!    closed) counts as restarting until the head records its death, so
//!    the call after a failed one reaches the next incarnation too. An actor
//!    dead for good fails the call with its death cause.
//! 5. **Kill.** `kill` sends `KillActor` to the actor's node (SIGKILL, no
//!    restart) and returns once the head has recorded the death (its name
//!    and resources are free again), or fails after [`KILL_WAIT`] (10 s).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::sync::OnceLock;

use actix::Handler;
use futures::future::{self, BoxFuture, Either};
use futures::FutureExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::client::ClientError;
use crate::cluster::{
    ActorId, ActorRecord, DeathCause, DirectoryReply, MembershipReply, NodeState,
};
use crate::cluster::{DirectoryRequest, MembershipRequest, WorkerRequest};
use crate::transport::{Channel, PendingReply, RequestError, RequestOptions};
use crate::wire::{self, Incarnation, NodeIdentity, RemoteErrorKind};

use super::messages::encode_call;
use super::CallError;
use crate::runtime::transits::{self, Transits};
use crate::runtime::ProcessContext;
use crate::runtime::{RemoteActor, RemoteMessage, Wire};

/// The deadline of a call without one ([`ActorHandle::send`],
/// [`ActorHandle::do_send`]): a century, so in effect none.
pub const NO_DEADLINE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long [`ActorHandle::kill`] waits for the death to be recorded.
pub const KILL_WAIT: Duration = Duration::from_secs(10);
/// Default limit of calls in flight through one handle.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 10_000;

/// A typed reference to a [`RemoteActor`] that may run in any process.
#[derive(Serialize, Deserialize)]
#[serde(bound = "", from = "HandleWire")]
pub struct ActorHandle<A: RemoteActor> {
    id: ActorId,
    max_in_flight: u32,
    #[serde(skip_serializing)]
    link: Arc<Link>,
    #[serde(skip_serializing)]
    actor: PhantomData<fn() -> A>,
}

/// The wire form of a handle: the id and the in-flight limit.
#[derive(Deserialize)]
struct HandleWire {
    id: ActorId,
    max_in_flight: u32,
}

impl<A: RemoteActor> From<HandleWire> for ActorHandle<A> {
    fn from(wire: HandleWire) -> Self {
        ActorHandle::new(wire.id, wire.max_in_flight)
    }
}

/// The live part of a handle, shared by its clones: the outbox every call
/// goes through, in order, and the in-flight limit.
struct Link {
    outbox: OnceLock<mpsc::UnboundedSender<Outgoing>>,
    in_flight: Arc<Semaphore>,
}

impl Link {
    fn new(limit: u32) -> Self {
        Link {
            outbox: OnceLock::new(),
            in_flight: Arc::new(Semaphore::new(limit as usize)),
        }
    }
}

/// A call waiting in the outbox.
struct Outgoing {
    body: Vec<u8>,
    /// The object references it carries, which their owners must know of
    /// before it is written (`crate::runtime::transits`).
    transits: Transits,
    deadline: Duration,
    waiter: Waiter,
}

/// Who learns how a queued call went.
enum Waiter {
    /// The caller, waiting for its reply: told once the call is written.
    TwoWay(oneshot::Sender<Result<Written, Failure>>),
    /// Nobody (`do_send`): failures are logged.
    OneWay,
}

/// A two-way call on the wire: its reply to come, and the incarnation it
/// went to.
type Written = (PendingReply, Box<ActorRecord>);

/// Why a call never made it onto the wire.
enum Failure {
    Call(CallError),
    Transport(RequestError, Box<ActorRecord>),
}

impl<A: RemoteActor> Clone for ActorHandle<A> {
    fn clone(&self) -> Self {
        ActorHandle {
            id: self.id,
            max_in_flight: self.max_in_flight,
            link: self.link.clone(),
            actor: PhantomData,
        }
    }
}

impl<A: RemoteActor> fmt::Debug for ActorHandle<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ActorHandle<{}>({})", A::NAME, self.id)
    }
}

impl<A: RemoteActor> ActorHandle<A> {
    pub(crate) fn new(id: ActorId, max_in_flight: u32) -> Self {
        ActorHandle {
            id,
            max_in_flight,
            link: Arc::new(Link::new(max_in_flight)),
            actor: PhantomData,
        }
    }

    /// The actor's id.
    pub fn id(&self) -> ActorId {
        self.id
    }

    /// Sends `message` and waits for the reply, with no deadline: the call
    /// fails when the actor dies or its node is lost, not because it is
    /// slow (use [`send_with_deadline`](Self::send_with_deadline) for that).
    ///
    /// The message is queued when `send` is called, not when the future is
    /// first polled, so calls through one handle reach the actor in the
    /// order `send` (and [`do_send`](Self::do_send)) were called.
    pub fn send<M>(
        &self,
        message: M,
    ) -> impl Future<Output = Result<M::Result, CallError>> + 'static
    where
        A: Handler<M>,
        M: RemoteMessage,
        M::Result: Wire,
    {
        self.send_with_deadline(message, NO_DEADLINE)
    }

    /// [`send`](Self::send) with a deadline: past it the call fails with
    /// `Timeout` (the actor may still handle the message).
    pub fn send_with_deadline<M>(
        &self,
        message: M,
        deadline: Duration,
    ) -> impl Future<Output = Result<M::Result, CallError>> + 'static
    where
        A: Handler<M>,
        M: RemoteMessage,
        M::Result: Wire,
    {
        let actor = self.id;
        let started = std::time::Instant::now();
        // Each arm is its own future, and the metrics are recorded by a
        // `map` rather than an enclosing `async` block: a caller keeps one
        // of these per call in flight, and an `async` block that awaits
        // another future holds it twice (680 bytes became 1,384).
        let call = match self.queue(message, deadline) {
            Err(e) => Either::Left(Either::Left(future::ready(Err(e)))),
            Ok(Queued::Local(reply)) => Either::Left(Either::Right(reply.map(move |reply| {
                reply.map_err(|e| CallError::ActorDead {
                    actor,
                    reason: e.to_string(),
                })
            }))),
            Ok(Queued::Remote(written, permit)) => {
                Either::Right(remote_reply::<M>(actor, written, permit, deadline))
            }
        };
        call.map(move |result| {
            let seconds = started.elapsed().as_secs_f64();
            match (call_metrics(), &result) {
                (Some(handles), Ok(_)) => {
                    handles.ok.increment(1);
                    handles.seconds.record(seconds);
                }
                (_, result) => {
                    let outcome = result.as_ref().err().map_or("ok", CallError::kind);
                    metrics::counter!("nimbus_actor_calls_total", "outcome" => outcome)
                        .increment(1);
                    metrics::histogram!("nimbus_actor_call_seconds").record(seconds);
                }
            }
            result
        })
    }

    /// Sends `message` without waiting for any reply; it reaches the actor
    /// after every call made before it through this handle. Failures to
    /// deliver are logged.
    pub fn do_send<M>(&self, message: M) -> Result<(), CallError>
    where
        A: Handler<M>,
        M: RemoteMessage,
        M::Result: Wire,
    {
        let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
        if let Some(addr) = context.local::<A>(self.id) {
            addr.do_send(message);
            return Ok(());
        }
        let (body, transits) = self.encode(&message)?;
        let call = Outgoing {
            body,
            transits,
            deadline: NO_DEADLINE,
            waiter: Waiter::OneWay,
        };
        self.outbox(context)
            .send(call)
            .map_err(|_| dispatcher_gone(self.id))
    }

    /// Queues `message` now: to the local actor, or into the outbox.
    fn queue<M>(&self, message: M, deadline: Duration) -> Result<Queued<M::Result>, CallError>
    where
        A: Handler<M>,
        M: RemoteMessage,
        M::Result: Wire,
    {
        let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
        let permit = self
            .link
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| CallError::MailboxFull {
                actor: self.id,
                limit: self.max_in_flight,
            })?;
        if let Some(addr) = context.local::<A>(self.id) {
            return Ok(Queued::Local(addr.send(message).boxed()));
        }
        let (written, receipt) = oneshot::channel();
        let (body, transits) = self.encode(&message)?;
        let call = Outgoing {
            body,
            transits,
            deadline,
            waiter: Waiter::TwoWay(written),
        };
        self.outbox(context)
            .send(call)
            .map_err(|_| dispatcher_gone(self.id))?;
        Ok(Queued::Remote(receipt, permit))
    }

    /// The outbox, with its delivery task started on first use.
    fn outbox(&self, context: &'static ProcessContext) -> &mpsc::UnboundedSender<Outgoing> {
        self.link.outbox.get_or_init(|| {
            let (outbox, queue) = mpsc::unbounded_channel();
            tokio::spawn(deliver(context, self.id, queue));
            outbox
        })
    }

    /// Kills the actor's worker process (SIGKILL) and keeps it dead,
    /// whatever its restart policy: Ray's `ray.kill`. Returns once the head
    /// has recorded the death (its name is then free; fails with `Timeout`
    /// after [`KILL_WAIT`]); monitors see the death as usual. Killing a dead
    /// actor is not an error.
    pub async fn kill(&self) -> Result<(), CallError> {
        let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
        let mut seen = context.last_event().await?;
        let record = match locate_any(context, self.id).await {
            Ok(record) if record.dead.is_none() && !record.restarting => record,
            // Restarting (on its node, or on another after its node was
            // lost): the new incarnation is the one to kill.
            Ok(record) if record.dead.is_none() => match locate(context, self.id, None).await {
                Ok(record) => record,
                Err(CallError::ActorDead { .. } | CallError::NodeLost { .. }) => return Ok(()),
                Err(e) => return Err(e),
            },
            Ok(_) | Err(CallError::ActorDead { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let status = match context.call_head(MembershipRequest::Status).await? {
            MembershipReply::Status(status) => status,
            reply => {
                return Err(CallError::Cluster(ClientError::from(
                    crate::cluster::UnexpectedReply::new("Status", reply),
                )))
            }
        };
        let Some(node) = status.alive().find(|n| n.id == record.node.name) else {
            // Its node is gone, and the actor with it.
            return Ok(());
        };
        let connection = context
            .endpoint
            .connect(node.address, None)
            .await
            .map_err(ClientError::from)?;
        crate::client::call(
            &connection,
            WorkerRequest::KillActor(self.id),
            RequestOptions::control(),
        )
        .await?;
        // Done once the head has recorded the death: its name is free again
        // and its resources are back.
        match tokio::time::timeout(KILL_WAIT, super::next_death(self, &mut seen)).await {
            Ok(died) => died.map(drop),
            Err(_) => Err(CallError::Timeout {
                actor: self.id,
                after: KILL_WAIT,
            }),
        }
    }

    /// Where the actor runs now, as the head knows it.
    pub async fn record(&self) -> Result<ActorRecord, CallError> {
        let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
        locate(context, self.id, None).await
    }

    /// Why the actor is dead for good, as the head recorded it; `None`
    /// while it lives (or is being restarted).
    pub async fn death(&self) -> Result<Option<DeathCause>, CallError> {
        let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
        Ok(locate_any(context, self.id).await?.dead)
    }

    fn encode<M: RemoteMessage>(&self, message: &M) -> Result<(Vec<u8>, Transits), CallError> {
        let encode_error = |e: rmp_serde::encode::Error| CallError::Encode {
            actor: self.id,
            detail: format!("cannot encode {}: {e}", M::NAME),
        };
        let (body, transits) =
            transits::encoding(|| encode_call(self.id, M::NAME, message, CALL_BYTES));
        Ok((body.map_err(encode_error)?, transits))
    }
}

/// What an encoded call's buffer starts with: room for a small message
/// and its envelope (a larger one grows it).
const CALL_BYTES: usize = 256;

/// A call queued by [`ActorHandle::queue`].
enum Queued<R> {
    /// To an actor in this process: its reply.
    Local(BoxFuture<'static, Result<R, actix::MailboxError>>),
    /// Into the outbox: when it is written, and the in-flight permit held
    /// until the reply.
    Remote(
        oneshot::Receiver<Result<Written, Failure>>,
        OwnedSemaphorePermit,
    ),
}

/// This process's handles on the metrics a successful call records,
/// looked up once rather than per call (two registry lookups and a key
/// copy each).
struct CallMetrics {
    ok: metrics::Counter,
    seconds: metrics::Histogram,
}

/// The handles, once this process has a `ProcessContext`: installing it
/// installed the recorder (`crate::metrics::install`), which stays, so
/// they are never taken from a recorder that is replaced later.
fn call_metrics() -> Option<&'static CallMetrics> {
    static HANDLES: OnceLock<CallMetrics> = OnceLock::new();
    ProcessContext::current()?;
    Some(HANDLES.get_or_init(|| CallMetrics {
        ok: metrics::counter!("nimbus_actor_calls_total", "outcome" => "ok"),
        seconds: metrics::histogram!("nimbus_actor_call_seconds"),
    }))
}

/// The reply to a call queued into the outbox: waits until it is written,
/// then for the response, and decodes it. `_permit` keeps the call's place
/// among the handle's calls in flight until the reply. `explain` (failures
/// only) is boxed: its future is large, and every call in flight holds
/// this one.
async fn remote_reply<M: RemoteMessage>(
    actor: ActorId,
    written: oneshot::Receiver<Result<Written, Failure>>,
    _permit: OwnedSemaphorePermit,
    deadline: Duration,
) -> Result<M::Result, CallError>
where
    M::Result: Wire,
{
    let written = written.await.map_err(|_| dispatcher_gone(actor))?;
    let (pending, record) = match written {
        Ok(written) => written,
        Err(failure) => return Err(Box::pin(explain(actor, failure, deadline)).await),
    };
    match pending.wait().await {
        Ok(reply) => wire::decode(&reply).map_err(|e| CallError::Decode {
            actor,
            detail: format!("cannot decode the reply to {}: {e}", M::NAME),
        }),
        Err(e) => Err(Box::pin(explain(actor, Failure::Transport(e, record), deadline)).await),
    }
}

fn dispatcher_gone(actor: ActorId) -> CallError {
    CallError::ActorDead {
        actor,
        reason: "the handle's delivery task stopped (its runtime shut down)".into(),
    }
}

/// Writes queued calls in order on a channel to the actor's current
/// incarnation, opening it on first use and again after it broke.
async fn deliver(
    context: &'static ProcessContext,
    actor: ActorId,
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
) {
    let mut current: Option<(Channel, ActorRecord)> = None;
    // The incarnation whose process this task saw go: the next channel
    // goes to a later one, even while the head still records it alive.
    let mut gone: Option<Incarnation> = None;
    loop {
        // Calls queued on the channel go out before this task waits.
        let call = match queue.try_recv() {
            Ok(call) => call,
            Err(_) => {
                flush(&current).await;
                match queue.recv().await {
                    Some(call) => call,
                    None => return,
                }
            }
        };
        if let Some(delivered) = call.transits.delivered() {
            flush(&current).await;
            if tokio::time::timeout(call.deadline, delivered)
                .await
                .is_err()
            {
                let why = "the owners of the object references it carries did not answer";
                match call.waiter {
                    Waiter::TwoWay(written) => {
                        let timeout = CallError::Timeout {
                            actor,
                            after: call.deadline,
                        };
                        let _ = written.send(Err(Failure::Call(timeout)));
                    }
                    Waiter::OneWay => {
                        tracing::warn!(%actor, "a one-way message was not sent: {why}")
                    }
                }
                continue;
            }
        }
        if let Some((channel, record)) = &current {
            if channel.peer_is_gone() {
                gone = Some(record.incarnation);
            }
        }
        let live = current
            .as_ref()
            .filter(|(channel, _)| channel.is_open())
            .cloned();
        let (channel, record) = match live {
            Some(live) => live,
            None => match open(context, actor, gone).await {
                Ok(opened) => {
                    current = Some(opened.clone());
                    opened
                }
                Err(e) => {
                    match call.waiter {
                        Waiter::TwoWay(written) => {
                            let _ = written.send(Err(Failure::Call(e)));
                        }
                        Waiter::OneWay => {
                            tracing::warn!(%actor, "a one-way message was not delivered: {e}")
                        }
                    }
                    continue;
                }
            },
        };
        let options = RequestOptions::control().with_deadline(call.deadline);
        match call.waiter {
            Waiter::OneWay => {
                if let Err(e) = channel.notify(call.body, options).await {
                    current = None;
                    tracing::warn!(%actor, "a one-way message was not delivered: {e}");
                }
            }
            Waiter::TwoWay(written) => {
                // More calls waiting: this one goes out with them.
                let sent = if queue.is_empty() {
                    channel.send_request(call.body, options).await
                } else {
                    channel.queue_request(call.body, options).await
                };
                let sent = match sent {
                    Ok(pending) => Ok((pending, Box::new(record))),
                    Err(e) => {
                        current = None;
                        Err(Failure::Transport(e, Box::new(record)))
                    }
                };
                let _ = written.send(sent);
            }
        }
    }
}

/// Writes the calls queued on the current channel. A failed write breaks
/// the channel, which fails their replies and is replaced at the next call.
async fn flush(current: &Option<(Channel, ActorRecord)>) {
    if let Some((channel, _)) = current {
        let _ = channel.flush(RequestOptions::control()).await;
    }
}

/// A channel to the actor's current incarnation, which is not `gone`.
async fn open(
    context: &ProcessContext,
    actor: ActorId,
    gone: Option<Incarnation>,
) -> Result<(Channel, ActorRecord), CallError> {
    let record = locate(context, actor, gone).await?;
    let worker = NodeIdentity {
        name: worker_name(actor),
        incarnation: record.incarnation,
    };
    let lost = |e: String| CallError::ActorDead {
        actor,
        reason: format!("its worker at {} is unreachable: {e}", record.address),
    };
    let connection = context
        .endpoint
        .connect(record.address, Some(&worker))
        .await
        .map_err(|e| lost(e.to_string()))?;
    let channel = connection
        .open_channel()
        .await
        .map_err(|e| lost(e.to_string()))?;
    context.talking_to(actor, record.address, record.incarnation);
    Ok((channel, record))
}

/// Turns a failure into the call error callers can act on.
/// `deadline` is the call's own (a remote `DeadlineExceeded` reports it).
async fn explain(actor: ActorId, failure: Failure, deadline: Duration) -> CallError {
    let (error, used) = match failure {
        Failure::Call(e) => return e,
        Failure::Transport(error, used) => (error, used),
    };
    match error {
        RequestError::Remote { error, .. } => match error.kind {
            RemoteErrorKind::BadRequest => CallError::Decode {
                actor,
                detail: error.message,
            },
            RemoteErrorKind::Internal | RemoteErrorKind::Forbidden => CallError::Handler {
                actor,
                message: error.message,
            },
            RemoteErrorKind::DeadlineExceeded => CallError::Timeout {
                actor,
                after: deadline,
            },
            RemoteErrorKind::StaleIncarnation | RemoteErrorKind::ShuttingDown => {
                CallError::ActorDead {
                    actor,
                    reason: error.message,
                }
            }
        },
        RequestError::Timeout { after, .. } => CallError::Timeout { actor, after },
        RequestError::Wire { cause, .. } => CallError::Decode {
            actor,
            detail: cause.to_string(),
        },
        lost => match ProcessContext::current() {
            Some(context) => diagnose(context, actor, &used, lost.to_string()).await,
            None => CallError::NotInitialized,
        },
    }
}

/// The worker's connection broke: was it the actor or its node?
async fn diagnose(
    context: &ProcessContext,
    actor: ActorId,
    used: &ActorRecord,
    detail: String,
) -> CallError {
    if let Ok(record) = locate_any(context, actor).await {
        if let Some(death) = record.dead.filter(DeathCause::is_node_lost) {
            return CallError::NodeLost {
                actor,
                reason: death.to_string(),
            };
        }
    }
    let node_dead = match context.call_head(MembershipRequest::Status).await {
        Ok(MembershipReply::Status(status)) => status
            .node(&used.node.name)
            .is_none_or(|n| n.state == NodeState::Dead || n.incarnation != used.node.incarnation.0),
        _ => false,
    };
    if node_dead {
        return CallError::NodeLost {
            actor,
            reason: format!("node {} is dead ({detail})", used.node),
        };
    }
    CallError::ActorDead {
        actor,
        reason: format!("incarnation {} died: {detail}", used.incarnation),
    }
}

/// The name a worker hosting `actor` gives itself.
pub(crate) fn worker_name(actor: ActorId) -> String {
    actor.worker_name()
}

/// How long a caller waits for a restarting actor's next incarnation.
const RESTART_WAIT: Duration = Duration::from_secs(60);

/// The actor's record, which must be alive; while it restarts, or while
/// the head still records the incarnation the caller saw go (`gone`: the
/// head learns of a death from its node a moment after the caller may
/// see the worker's socket close), waits for the new incarnation.
async fn locate(
    context: &ProcessContext,
    actor: ActorId,
    gone: Option<Incarnation>,
) -> Result<ActorRecord, CallError> {
    let end = tokio::time::Instant::now() + RESTART_WAIT;
    loop {
        let seen = context.last_event().await?;
        let record = locate_any(context, actor).await?;
        match record.dead {
            Some(death) if death.is_node_lost() => {
                return Err(CallError::NodeLost {
                    actor,
                    reason: death.to_string(),
                })
            }
            Some(death) => {
                return Err(CallError::ActorDead {
                    actor,
                    reason: death.to_string(),
                })
            }
            None if !record.restarting && Some(record.incarnation) != gone => return Ok(record),
            None => {}
        }
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(CallError::ActorDead {
                actor,
                reason: format!("it did not come back from a restart within {RESTART_WAIT:?}"),
            });
        }
        context.events(seen, left).await?;
    }
}

async fn locate_any(context: &ProcessContext, actor: ActorId) -> Result<ActorRecord, CallError> {
    match context
        .call_head(DirectoryRequest::LocateActor(actor))
        .await?
    {
        DirectoryReply::Actor(Some(record)) => Ok(*record),
        DirectoryReply::Actor(None) => Err(CallError::ActorDead {
            actor,
            reason: "the head knows no such actor".into(),
        }),
        reply => Err(CallError::Cluster(ClientError::from(
            crate::cluster::UnexpectedReply::new("LocateActor", reply),
        ))),
    }
}
