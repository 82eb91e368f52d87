//! The worker side of actor calls: decode, dispatch in arrival order, reply.

use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::cluster::ActorId;
use crate::transport::{HandlerError, RequestHandler};
use crate::wire::{self, PeerIdentity, RemoteError, RemoteErrorKind};

use super::faults::{ActorFault, ActorFaultAction, FaultTriggers};
use super::messages::ActorCall;
use super::registry::{DispatchError, HostedActor, Registry};

/// Serves calls to the one actor a worker process hosts.
pub struct ActorHost {
    registry: Arc<Registry>,
    actor: ActorId,
    type_name: String,
    hosted: HostedActor,
    /// Set when the actor died of a panic: calls then fail with it.
    panic: Arc<OnceLock<String>>,
    /// Injected faults (fault-injection tests).
    faults: FaultTriggers,
    /// Ends the process for a `Kill` fault, reporting the reason.
    kill: Box<dyn Fn(&str) + Send + Sync>,
}

/// What a worker hosts and how it dies of injected faults.
pub struct HostedFaults {
    /// The rules for this incarnation.
    pub rules: Vec<ActorFault>,
    /// The actor's stable name in fault reports: its unique name, or its
    /// type.
    pub target: String,
    /// Ends the process for a `Kill` fault, reporting the reason.
    pub kill: Box<dyn Fn(&str) + Send + Sync>,
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
        }
    }
}

impl RequestHandler for ActorHost {
    fn handle(
        &self,
        _from: PeerIdentity,
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
        if call.message == super::faults::PANIC_MESSAGE {
            panic!("{}", String::from_utf8_lossy(&call.payload));
        }
        if let Some(fired) = self.faults.on_message(&call.message) {
            match fired.action {
                ActorFaultAction::Kill => (self.kill)(&fired.reason),
                ActorFaultAction::Panic => panic!("{}", fired.reason),
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
