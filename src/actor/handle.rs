//! Typed handles to actors anywhere in the cluster.
//!
//! A handle is an actor id plus a lazily opened ordered channel to the
//! worker that hosts the actor's current incarnation. It serializes as the
//! id (and its in-flight limit), so handles can be passed inside messages
//! to actors on other nodes and keep working there: the receiving process
//! asks the head where the actor runs on first use.
//!
//! Ordering: every call made through one handle (and its clones) travels on
//! one channel, so the actor receives them in the order they were made.
//! Restarts: a call in flight when the actor dies fails; the next call asks
//! the head again and reaches the new incarnation.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use actix::Handler;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Semaphore};

use crate::client::ClientError;
use crate::cluster::{ActorId, ActorRecord, ControlReply, ControlRequest, NodeState};
use crate::transport::{Channel, RequestError, RequestOptions};
use crate::wire::{self, NodeIdentity, RemoteErrorKind};

use super::context::ProcessContext;
use super::messages::ActorCall;
use super::registry::{RemoteActor, RemoteMessage, Wire};
use super::CallError;

/// How long a call waits for its reply by default.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(30);
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

/// The live part of a handle, shared by its clones.
struct Link {
    channel: Mutex<Option<(Channel, ActorRecord)>>,
    in_flight: Semaphore,
}

impl Link {
    fn new(limit: u32) -> Self {
        Link {
            channel: Mutex::new(None),
            in_flight: Semaphore::new(limit as usize),
        }
    }
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

    /// Sends `message` and waits (up to 30 s) for the reply.
    pub async fn send<M>(&self, message: M) -> Result<M::Result, CallError>
    where
        A: Handler<M>,
        M: RemoteMessage,
        M::Result: Wire,
    {
        self.send_with_deadline(message, DEFAULT_CALL_DEADLINE).await
    }

    /// Sends `message` and waits up to `deadline` for the reply.
    pub async fn send_with_deadline<M>(&self, message: M, deadline: Duration) -> Result<M::Result, CallError>
    where
        A: Handler<M>,
        M: RemoteMessage,
        M::Result: Wire,
    {
        let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
        let _permit = self.permit()?;
        if let Some(addr) = context.local::<A>(self.id) {
            return addr.send(message).await.map_err(|e| CallError::ActorDead {
                actor: self.id,
                reason: e.to_string(),
            });
        }
        let body = self.encode(&message)?;
        let (channel, record) = self.channel(context).await?;
        let options = RequestOptions::control().with_deadline(deadline);
        match channel.request(body, options).await {
            Ok(reply) => wire::decode(&reply).map_err(|e| CallError::Decode {
                actor: self.id,
                detail: format!("cannot decode the reply to {}: {e}", M::NAME),
            }),
            Err(e) => Err(self.failed(context, e, &record).await),
        }
    }

    /// Sends `message` without waiting for a reply; it still arrives after
    /// every call made before it through this handle. Returns once the
    /// message is handed to the transport.
    pub async fn do_send<M>(&self, message: M) -> Result<(), CallError>
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
        let body = self.encode(&message)?;
        let (channel, record) = self.channel(context).await?;
        match channel.notify(body, RequestOptions::control()).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failed(context, e, &record).await),
        }
    }

    /// Where the actor runs now, as the head knows it.
    pub async fn record(&self) -> Result<ActorRecord, CallError> {
        let context = ProcessContext::current().ok_or(CallError::NotInitialized)?;
        locate(context, self.id).await
    }

    fn permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, CallError> {
        self.link.in_flight.try_acquire().map_err(|_| CallError::MailboxFull {
            actor: self.id,
            limit: self.max_in_flight,
        })
    }

    fn encode<M: RemoteMessage>(&self, message: &M) -> Result<Vec<u8>, CallError> {
        let encode_error = |e: rmp_serde::encode::Error| CallError::Decode {
            actor: self.id,
            detail: format!("cannot encode {}: {e}", M::NAME),
        };
        let call = ActorCall {
            actor: self.id,
            message: M::NAME.to_string(),
            payload: rmp_serde::to_vec_named(message).map_err(encode_error)?,
        };
        rmp_serde::to_vec_named(&call).map_err(encode_error)
    }

    /// The channel to the current incarnation, opened on first use and
    /// after the previous one broke.
    async fn channel(&self, context: &ProcessContext) -> Result<(Channel, ActorRecord), CallError> {
        let mut slot = self.link.channel.lock().await;
        if let Some((channel, record)) = slot.as_ref() {
            if channel.is_open() {
                return Ok((channel.clone(), record.clone()));
            }
        }
        let record = locate(context, self.id).await?;
        let worker = NodeIdentity {
            name: worker_name(self.id),
            incarnation: record.incarnation,
        };
        let lost = |e: String| CallError::ActorDead {
            actor: self.id,
            reason: format!("its worker at {} is unreachable: {e}", record.address),
        };
        let connection = context
            .endpoint
            .connect(record.address, Some(&worker))
            .await
            .map_err(|e| lost(e.to_string()))?;
        let channel = connection.open_channel().await.map_err(|e| lost(e.to_string()))?;
        context.talking_to(self.id, record.address, record.incarnation);
        *slot = Some((channel.clone(), record.clone()));
        Ok((channel, record))
    }

    /// Turns a transport failure into the call error callers can act on.
    async fn failed(&self, context: &ProcessContext, error: RequestError, used: &ActorRecord) -> CallError {
        let actor = self.id;
        match error {
            RequestError::Remote { error, .. } => match error.kind {
                RemoteErrorKind::BadRequest => CallError::Decode {
                    actor,
                    detail: error.message,
                },
                RemoteErrorKind::Internal => CallError::Handler {
                    actor,
                    message: error.message,
                },
                RemoteErrorKind::DeadlineExceeded => CallError::Timeout {
                    actor,
                    after: DEFAULT_CALL_DEADLINE,
                },
                RemoteErrorKind::StaleIncarnation | RemoteErrorKind::ShuttingDown => CallError::ActorDead {
                    actor,
                    reason: error.message,
                },
            },
            RequestError::Timeout { after, .. } => CallError::Timeout { actor, after },
            RequestError::Wire { cause, .. } => CallError::Decode {
                actor,
                detail: cause.to_string(),
            },
            lost => {
                *self.link.channel.lock().await = None;
                self.diagnose(context, used, lost.to_string()).await
            }
        }
    }

    /// The worker's connection broke: was it the actor or its node?
    async fn diagnose(&self, context: &ProcessContext, used: &ActorRecord, detail: String) -> CallError {
        let actor = self.id;
        if let Ok(record) = locate_any(context, actor).await {
            if let Some(reason) = record.dead.filter(|r| r.starts_with("node lost")) {
                return CallError::NodeLost { actor, reason };
            }
        }
        let node_dead = match context.call_head(&ControlRequest::Status).await {
            Ok(ControlReply::Status(status)) => status
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
}

/// The name a worker hosting `actor` gives itself.
pub(crate) fn worker_name(actor: ActorId) -> String {
    format!("worker-{actor}")
}

/// The actor's record, which must be alive.
async fn locate(context: &ProcessContext, actor: ActorId) -> Result<ActorRecord, CallError> {
    let record = locate_any(context, actor).await?;
    match record.dead {
        Some(reason) if reason.starts_with("node lost") => Err(CallError::NodeLost { actor, reason }),
        Some(reason) => Err(CallError::ActorDead { actor, reason }),
        None => Ok(record),
    }
}

async fn locate_any(context: &ProcessContext, actor: ActorId) -> Result<ActorRecord, CallError> {
    match context.call_head(&ControlRequest::LocateActor(actor)).await? {
        ControlReply::Actor(Some(record)) => Ok(*record),
        ControlReply::Actor(None) => Err(CallError::ActorDead {
            actor,
            reason: "the head knows no such actor".into(),
        }),
        reply => Err(CallError::Cluster(ClientError::UnexpectedReply {
            request: "LocateActor",
            reply: Box::new(reply),
        })),
    }
}
