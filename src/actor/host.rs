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
//!    call while the worker is dying (its node is being killed by a fault):
//!    `ShuttingDown`.
//! 3. The two names reserved for the chaos harness: `nimbus.chaos.PacketRule`
//!    adds a packet rule to the worker's socket; `nimbus.chaos.Panic` makes
//!    the worker panic with the payload as the message.
//! 4. The fault rules of this incarnation count the message
//!    (`faults.rs`); a rule that fires kills the process, panics, or kills
//!    the node (after reporting the fault to the head; never the head).
//! 5. Otherwise the message is dispatched to the actor's mailbox at once,
//!    so the channel's order is the actor's order. Errors: `BadRequest` for
//!    an undecodable or unknown message type; `Internal` for a reply that
//!    does not encode or a handler that panicked (with the panic's text);
//!    `ShuttingDown` if the actor stopped.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::cluster::ActorId;
use crate::transport::Caller;
use crate::transport::{HandlerError, RequestHandler};
use crate::wire::{self, RemoteError, RemoteErrorKind};

use super::faults::{ActorFault, ActorFaultAction, FaultTriggers, FiredFault};
use super::messages::ActorCall;
use crate::runtime::{DispatchError, HostedActor, Registry};

/// Serves calls to the one actor a worker process hosts.
pub struct ActorHost {
    registry: Arc<Registry>,
    actor: ActorId,
    type_name: String,
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
        hosted: HostedActor,
        panic: Arc<OnceLock<String>>,
        faults: HostedFaults,
    ) -> Self {
        ActorHost {
            registry,
            actor,
            type_name,
            hosted,
            panic,
            faults: FaultTriggers::new(faults.rules, faults.target),
            kill: faults.kill,
            kill_node: faults.kill_node,
        }
    }
}

impl RequestHandler for ActorHost {
    fn handle(
        &self,
        _from: Caller,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, HandlerError>> {
        let call: ActorCall = match wire::decode(&body) {
            Ok(call) => call,
            Err(e) => {
                return futures::future::ready(Err(HandlerError::Malformed(e.to_string()))).boxed()
            }
        };
        if call.actor != self.actor {
            let error = RemoteError::new(
                RemoteErrorKind::StaleIncarnation,
                format!("this worker hosts actor {}, not {}", self.actor, call.actor),
            );
            return futures::future::ready(Err(error.into())).boxed();
        }
        if let Some(death) = self.panic.get() {
            // Dying (its node is being killed): handle nothing more.
            let error = RemoteError::new(RemoteErrorKind::ShuttingDown, death.clone());
            return futures::future::ready(Err(error.into())).boxed();
        }
        if call.message == super::faults::PACKET_RULE_MESSAGE {
            return futures::future::ready(add_packet_rule(&call.payload)).boxed();
        }
        if call.message == super::faults::PANIC_MESSAGE {
            panic!("{}", String::from_utf8_lossy(&call.payload));
        }
        if let Some(fired) = self.faults.on_message(&call.message) {
            match fired.action {
                ActorFaultAction::Kill => (self.kill)(&fired.fault),
                ActorFaultAction::Panic => panic!("{}", fired.fault),
                ActorFaultAction::KillNode => {
                    if let Some(killing) = (self.kill_node)(&fired.fault) {
                        let _ = self.panic.set(fired.fault.to_string());
                        // No reply: the caller sees the node go.
                        return killing.map(|never| match never {}).boxed();
                    }
                }
            }
        }
        // Dispatching enqueues the message now, keeping the channel's order.
        let reply =
            self.registry
                .dispatch(&self.type_name, &self.hosted, &call.message, &call.payload);
        let panic = self.panic.clone();
        let message = call.message;
        async move {
            let failed = |e: DispatchError| {
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
                    DispatchError::ActorGone => match panic.get() {
                        Some(panic) => RemoteError::new(RemoteErrorKind::Internal, panic.clone()),
                        None => {
                            RemoteError::new(RemoteErrorKind::ShuttingDown, "the actor stopped")
                        }
                    },
                })
            };
            reply.map_err(&failed)?.await.map_err(&failed)
        }
        .boxed()
    }
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
