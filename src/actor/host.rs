//! The worker side of actor calls: decode, dispatch in arrival order, reply.
//!
//! Callers reach a worker on ordered channels; each request body is an
//! `ActorCall { actor, message, payload }` (`messages.rs`: the message's
//! registered name and its MessagePack), and the response body is the
//! MessagePack of the handler's result, or a `RemoteError`. Per call:
//!
//! 1. A body that is not an `ActorCall` closes the caller's connection
//!    (close code 2).
//! 2. A call for another actor than the one hosted: `StaleIncarnation`. A
//!    call from a worker of another job, unless the actor is shared
//!    (`SpawnOptions::shared`): `Forbidden` (drivers, the CLI and nodes
//!    call any). A call while the worker is dying (its node is being killed
//!    by a fault): `ShuttingDown`.
//! 3. The two names reserved for the chaos harness: `nimbus.chaos.PacketRule`
//!    adds a packet rule to the worker's socket; `nimbus.chaos.Panic` makes
//!    the worker panic with the payload as the message.
//! 4. The fault rules of this incarnation count the message
//!    (`faults.rs`); a rule that fires kills the process, panics, or kills
//!    the node (after reporting the fault to the head; never the head).
//! 5. Otherwise the message is queued for the actor at once
//!    (`runtime/registry.rs`), so the channel's order is the actor's
//!    order; on a same-host channel a reply ready when its handler
//!    returns goes out from the actor's thread (`transport/answer.rs`). Errors: `BadRequest` for
//!    an undecodable or unknown message type; `Internal` for a reply that
//!    does not encode or a handler that panicked (with the panic's text);
//!    `ShuttingDown` if the actor stopped.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::cluster::ActorId;
use crate::transport::{Answer, Caller, HandlerError, RequestHandler};
use crate::wire::{self, RemoteError, RemoteErrorKind};

use super::faults::{ActorFault, ActorFaultAction, FaultTriggers, FiredFault};
use super::messages::ActorCallIn;
use crate::runtime::{DispatchError, HostedActor, Registry, Replied, ReplySink, ReplyTo};

/// Serves calls to the one actor a worker process hosts.
pub struct ActorHost {
    registry: Arc<Registry>,
    actor: ActorId,
    type_name: String,
    /// Which workers may call it (step 2).
    access: ActorAccess,
    hosted: HostedActor,
    /// Set when the actor died of a panic, or is dying with its node: calls
    /// then fail with it.
    panic: Arc<OnceLock<String>>,
    /// Injected faults (fault-injection tests).
    faults: FaultTriggers,
    /// Ends the process for a `Kill` fault, reporting the fault.
    kill: Box<dyn Fn(&FiredFault) + Send + Sync>,
    /// Kills the node for a `KillNode` fault, once it is reported.
    kill_node: KillNode,
}

/// Kills the worker's node for a `KillNode` fault (the fault given): a
/// future that reports the fault, then kills, and never completes; `None`
/// if this node may not be killed (the head), and the message is handled
/// as if no rule had fired.
pub type KillNode =
    Box<dyn Fn(&FiredFault) -> Option<BoxFuture<'static, Infallible>> + Send + Sync>;

/// Which workers may call a hosted actor: its own job's, and every job's
/// when it is shared.
pub struct ActorAccess {
    /// The actor's job.
    pub job: String,
    /// Other jobs' workers may call it too.
    pub shared: bool,
}

impl ActorAccess {
    /// Whether `from` may call the actor: a worker of its job, or of any
    /// job when it is shared; anyone else (a driver, the CLI, a node).
    fn admits(&self, actor: ActorId, from: &Caller) -> Result<(), RemoteError> {
        match from.worker_scope() {
            Some(scope) if !self.shared && scope.job != self.job => Err(RemoteError::new(
                RemoteErrorKind::Forbidden,
                format!(
                    "actor {actor} is job {}'s and not shared: a worker of job {} calls only its own job's actors and shared ones (spawn it with SpawnOptions::shared)",
                    self.job, scope.job
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// What a worker hosts and how it dies of injected faults.
pub struct HostedFaults {
    /// The rules for this incarnation.
    pub rules: Vec<ActorFault>,
    /// The actor's stable name in fault reports: its unique name, or its
    /// type.
    pub target: String,
    /// Ends the process for a `Kill` fault, reporting the fault.
    pub kill: Box<dyn Fn(&FiredFault) + Send + Sync>,
    /// Kills the node for a `KillNode` fault.
    pub kill_node: KillNode,
}

impl ActorHost {
    /// A host for `hosted`, an actor of type `type_name`.
    pub fn new(
        registry: Arc<Registry>,
        actor: ActorId,
        type_name: String,
        access: ActorAccess,
        hosted: HostedActor,
        panic: Arc<OnceLock<String>>,
        faults: HostedFaults,
    ) -> Self {
        ActorHost {
            registry,
            actor,
            type_name,
            access,
            hosted,
            panic,
            faults: FaultTriggers::new(faults.rules, faults.target),
            kill: faults.kill,
            kill_node: faults.kill_node,
        }
    }
}

/// What steps 1–4 leave of a call.
enum Admitted<'a> {
    /// Answered already.
    Now(Result<Vec<u8>, HandlerError>),
    /// To be answered by this future (the node being killed).
    Later(BoxFuture<'static, Result<Vec<u8>, HandlerError>>),
    /// For the actor (step 5).
    Dispatch(ActorCallIn<'a>),
}

impl ActorHost {
    /// Steps 1–4.
    fn admit<'a>(&self, from: &Caller, body: &'a [u8]) -> Admitted<'a> {
        let call: ActorCallIn<'a> = match decode_call(body) {
            Ok(call) => call,
            Err(e) => return Admitted::Now(Err(HandlerError::Malformed(e.to_string()))),
        };
        if call.actor != self.actor {
            let error = RemoteError::new(
                RemoteErrorKind::StaleIncarnation,
                format!("this worker hosts actor {}, not {}", self.actor, call.actor),
            );
            return Admitted::Now(Err(error.into()));
        }
        if let Err(refused) = self.access.admits(self.actor, from) {
            return Admitted::Now(Err(refused.into()));
        }
        if let Some(death) = self.panic.get() {
            // Dying (its node is being killed): handle nothing more.
            let error = RemoteError::new(RemoteErrorKind::ShuttingDown, death.clone());
            return Admitted::Now(Err(error.into()));
        }
        if call.message == super::faults::PACKET_RULE_MESSAGE {
            return Admitted::Now(add_packet_rule(call.payload));
        }
        if call.message == super::faults::PANIC_MESSAGE {
            panic!("{}", String::from_utf8_lossy(call.payload));
        }
        if let Some(fired) = self.faults.on_message(call.message) {
            match fired.action {
                ActorFaultAction::Kill => (self.kill)(&fired.fault),
                ActorFaultAction::Panic => panic!("{}", fired.fault),
                ActorFaultAction::KillNode => {
                    if let Some(killing) = (self.kill_node)(&fired.fault) {
                        let _ = self.panic.set(fired.fault.to_string());
                        // No reply: the caller sees the node go.
                        return Admitted::Later(killing.map(|never| match never {}).boxed());
                    }
                }
            }
        }
        Admitted::Dispatch(call)
    }

    /// Step 5: queues `call` for the actor now, keeping the channel's
    /// order; its reply, or why there is none, goes to the sink `to`
    /// makes.
    fn dispatch<S: ReplySink + 'static>(
        &self,
        call: &ActorCallIn<'_>,
        to: impl FnOnce(Failed) -> S,
    ) {
        let failed = Failed {
            message: call.message.to_string(),
            panic: self.panic.clone(),
        };
        self.registry.dispatch(
            &self.type_name,
            &self.hosted,
            call.message,
            call.payload,
            ReplyTo::new(to(failed)),
        );
    }
}

/// A reply for the future [`ActorHost::handle`] returned.
struct ToFuture {
    tx: tokio::sync::oneshot::Sender<(Replied, Failed)>,
    failed: Failed,
}

impl ReplySink for ToFuture {
    fn send(self: Box<Self>, replied: Replied) {
        let _ = self.tx.send((replied, self.failed));
    }

    fn wanted(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// A reply for a same-host channel's [`Answer`].
struct ToAnswer {
    answer: Answer,
    failed: Failed,
}

impl ReplySink for ToAnswer {
    fn send(self: Box<Self>, replied: Replied) {
        let ToAnswer { answer, failed } = *self;
        match replied {
            Replied::Now(reply) => answer.now(reply.map_err(|e| failed.explain(e))),
            Replied::Later(reply) => {
                answer.later(async move { reply.await.map_err(|e| failed.explain(e)) }.boxed())
            }
        }
    }

    fn wanted(&self) -> bool {
        self.answer.wanted()
    }
}

/// Explains why a dispatched call has no reply (step 5's errors).
struct Failed {
    message: String,
    panic: Arc<OnceLock<String>>,
}

impl Failed {
    fn explain(&self, e: DispatchError) -> HandlerError {
        let message = &self.message;
        HandlerError::Remote(match e {
            DispatchError::Decode(detail) => RemoteError::new(
                RemoteErrorKind::BadRequest,
                format!("cannot decode message {message}: {detail}"),
            ),
            DispatchError::UnknownMessage(detail) => {
                RemoteError::new(RemoteErrorKind::BadRequest, detail)
            }
            DispatchError::Encode(detail) => RemoteError::new(
                RemoteErrorKind::Internal,
                format!("cannot encode the reply to {message}: {detail}"),
            ),
            DispatchError::ActorGone => match self.panic.get() {
                Some(panic) => RemoteError::new(RemoteErrorKind::Internal, panic.clone()),
                None => RemoteError::new(RemoteErrorKind::ShuttingDown, "the actor stopped"),
            },
        })
    }
}

impl RequestHandler for ActorHost {
    fn handle(
        &self,
        from: Caller,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, HandlerError>> {
        let call = match self.admit(&from, &body) {
            Admitted::Now(reply) => return futures::future::ready(reply).boxed(),
            Admitted::Later(reply) => return reply,
            Admitted::Dispatch(call) => call,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.dispatch(&call, |failed| ToFuture { tx, failed });
        async move {
            let Ok((replied, failed)) = rx.await else {
                return Err(
                    RemoteError::new(RemoteErrorKind::ShuttingDown, "the actor stopped").into(),
                );
            };
            let reply = match replied {
                Replied::Now(reply) => reply,
                Replied::Later(reply) => reply.await,
            };
            reply.map_err(|e| failed.explain(e))
        }
        .boxed()
    }

    /// The reply of a call that is ready when its handler returns goes out
    /// from the actor's thread (`transport`'s `answer.rs`).
    fn handle_answering(&self, from: Caller, body: Vec<u8>, answer: Answer) {
        let call = match self.admit(&from, &body) {
            Admitted::Now(reply) => return answer.now(reply),
            Admitted::Later(reply) => return answer.later(reply),
            Admitted::Dispatch(call) => call,
        };
        self.dispatch(&call, |failed| ToAnswer { answer, failed });
    }
}

/// Step 1: the call a request body holds, borrowed from it.
fn decode_call(body: &[u8]) -> Result<ActorCallIn<'_>, wire::WireError> {
    rmp_serde::from_slice(body).map_err(|e| wire::WireError::Decode {
        what: "ActorCall",
        detail: e.to_string(),
    })
}

/// Adds a chaos partition's packet rule to this worker's socket.
fn add_packet_rule(payload: &[u8]) -> Result<Vec<u8>, HandlerError> {
    let rule: crate::transport::PacketRule = wire::decode(payload)
        .map_err(|e| HandlerError::Malformed(format!("not a packet rule: {e}")))?;
    let context = super::ProcessContext::current().ok_or_else(|| {
        RemoteError::new(
            RemoteErrorKind::Internal,
            "the worker has no process context",
        )
    })?;
    context
        .endpoint
        .add_packet_rule(rule)
        .map_err(|e| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string()))?;
    Ok(Vec::new())
}
