//! The node's request handler: decodes control requests and routes them to
//! the actors that answer them.

use std::time::Duration;

use actix::Addr;
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::cluster::directory::{self, Directory};
use crate::cluster::events::{EventsSince, Publish};
use crate::cluster::membership::{self, Membership};
use crate::cluster::{ClusterEventKind, ClusterEvents, ControlReply, ControlRequest};
use crate::transport::{Endpoint, HandlerError, RequestHandler};
use crate::wire::{self, PeerIdentity, PeerRole, RemoteError, RemoteErrorKind};

use crate::object_store::NodeObjectStore;

use super::manager::{
    KillActor, NodeManager, ReadBinary, ReleaseBundle, ReserveBundle, StartActor, UploadBinary,
};

/// Longest a client may long-poll for events in one request.
const MAX_EVENT_WAIT: Duration = Duration::from_secs(60);

/// Routes requests arriving at a node.
#[derive(Clone)]
pub struct NodeService {
    manager: Addr<NodeManager>,
    head: Option<HeadActors>,
    objects: NodeObjectStore,
    endpoint: Endpoint,
}

/// The control-plane actors, on the head only.
#[derive(Clone)]
pub struct HeadActors {
    /// Node membership.
    pub membership: Addr<Membership>,
    /// The event stream.
    pub events: Addr<ClusterEvents>,
    /// The actor directory.
    pub directory: Addr<Directory>,
    /// The heartbeat interval members are told to keep.
    pub heartbeat_interval: Duration,
}

impl NodeService {
    /// The service of a node; `head` is `Some` on the head.
    /// `endpoint` is the node's own (packet rules are added to its socket).
    pub fn new(
        manager: Addr<NodeManager>,
        head: Option<HeadActors>,
        objects: NodeObjectStore,
        endpoint: Endpoint,
    ) -> Self {
        NodeService {
            manager,
            head,
            objects,
            endpoint,
        }
    }

    async fn dispatch(
        &self,
        from: PeerIdentity,
        request: ControlRequest,
    ) -> Result<ControlReply, RemoteError> {
        let manager = self.manager.clone();
        let head = self.head.clone();
        let objects = self.objects.clone();
        let request = match objects.handle(request).await {
            Ok(reply) => return reply,
            Err(request) => request,
        };
        match request {
            ControlRequest::Echo(payload) => Ok(ControlReply::Echo(payload)),
            ControlRequest::StartActor(spec) => {
                manager.send(StartActor(spec)).await.map_err(internal)?
            }
            ControlRequest::ReserveBundle { bundle, resources } => {
                let reserve = ReserveBundle { bundle, resources };
                Ok(match manager.send(reserve).await.map_err(internal)? {
                    Ok(()) => ControlReply::Ack,
                    Err(short) => ControlReply::NoCapacity(short),
                })
            }
            ControlRequest::ReadBinary { hash, offset, len } => manager
                .send(ReadBinary { hash, offset, len })
                .await
                .map_err(internal)?,
            ControlRequest::AddPacketRule(rule) => {
                self.endpoint
                    .add_packet_rule(rule)
                    .map_err(|e| RemoteError::new(RemoteErrorKind::BadRequest, e))?;
                Ok(ControlReply::Ack)
            }
            ControlRequest::KillActor(actor) => {
                manager.send(KillActor(actor)).await.map_err(internal)?;
                Ok(ControlReply::Ack)
            }
            ControlRequest::ReleaseBundle(bundle) => {
                manager
                    .send(ReleaseBundle(bundle))
                    .await
                    .map_err(internal)?;
                Ok(ControlReply::Ack)
            }
            ControlRequest::UploadBinary {
                hash,
                offset,
                total,
                chunk,
            } => {
                let upload = UploadBinary {
                    hash,
                    offset,
                    total,
                    chunk,
                };
                manager.send(upload).await.map_err(internal)??;
                Ok(ControlReply::Ack)
            }
            request => match head {
                Some(head) => Self::head_request(head, from, request).await,
                None => Err(RemoteError::new(
                    RemoteErrorKind::BadRequest,
                    "this node is not the head; send membership and directory requests to the head",
                )),
            },
        }
    }

    /// Requests only the head answers.
    async fn head_request(
        head: HeadActors,
        from: PeerIdentity,
        request: ControlRequest,
    ) -> Result<ControlReply, RemoteError> {
        let HeadActors {
            membership,
            events,
            directory,
            heartbeat_interval: interval,
        } = head;
        match request {
            ControlRequest::Join(registration) => {
                if from.role != PeerRole::Node || from.identity != registration.node {
                    return Err(RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        format!("{from} cannot join as {}", registration.node),
                    ));
                }
                let join = membership::Join {
                    registration,
                    head: false,
                };
                membership.send(join).await.map_err(internal)??;
                Ok(ControlReply::Joined {
                    heartbeat_interval_ms: interval.as_millis() as u64,
                })
            }
            ControlRequest::Heartbeat { node, used } => {
                membership
                    .send(membership::Heartbeat { node, used })
                    .await
                    .map_err(internal)??;
                Ok(ControlReply::Ack)
            }
            ControlRequest::Leave { node } => {
                membership
                    .send(membership::Leave { node })
                    .await
                    .map_err(internal)??;
                Ok(ControlReply::Ack)
            }
            ControlRequest::ReportFault {
                fault,
                target,
                trigger,
                kills_node,
            } => {
                if let Some(node) = kills_node {
                    let reason = format!("chaos: {fault} at {trigger} of {target}");
                    directory
                        .send(directory::NodeDoomed { node, reason })
                        .await
                        .map_err(internal)?;
                }
                let kind = ClusterEventKind::FaultInjected {
                    fault,
                    target,
                    trigger,
                };
                events.send(Publish(kind)).await.map_err(internal)?;
                Ok(ControlReply::Ack)
            }
            ControlRequest::ReportRecovery {
                what,
                target,
                took_ms,
            } => {
                let kind = ClusterEventKind::Recovered {
                    what,
                    target,
                    took_ms,
                };
                events.send(Publish(kind)).await.map_err(internal)?;
                Ok(ControlReply::Ack)
            }
            ControlRequest::Status => {
                let status = membership
                    .send(membership::Status)
                    .await
                    .map_err(internal)?;
                Ok(ControlReply::Status(status))
            }
            ControlRequest::Events { after, wait_ms } => {
                let wait = Duration::from_millis(wait_ms).min(MAX_EVENT_WAIT);
                let since = events
                    .send(EventsSince { after, wait })
                    .await
                    .map_err(internal)?;
                Ok(ControlReply::Events(since))
            }
            ControlRequest::ReserveName { name, actor } => {
                let reserved = directory
                    .send(directory::ReserveName { name, actor })
                    .await
                    .map_err(internal)?;
                Ok(match reserved {
                    Ok(()) => ControlReply::Ack,
                    Err(holder) => ControlReply::NameTaken(holder),
                })
            }
            ControlRequest::LookupName(name) => {
                let found = directory
                    .send(directory::LookupName(name))
                    .await
                    .map_err(internal)?;
                Ok(ControlReply::Actor(found.map(Box::new)))
            }
            ControlRequest::LocateActor(actor) => {
                let found = directory
                    .send(directory::LocateActor(actor))
                    .await
                    .map_err(internal)?;
                Ok(ControlReply::Actor(found.map(Box::new)))
            }
            ControlRequest::ActorUp { record, spec } => {
                directory
                    .send(directory::ActorUp { record, spec })
                    .await
                    .map_err(internal)?;
                Ok(ControlReply::Ack)
            }
            ControlRequest::ListActors => {
                let actors = directory
                    .send(directory::ListActors)
                    .await
                    .map_err(internal)?;
                Ok(ControlReply::Actors(actors))
            }
            ControlRequest::ActorDown {
                actor,
                incarnation,
                reason,
                restarting,
            } => {
                let down = directory::ActorDown {
                    actor,
                    incarnation,
                    reason,
                    restarting,
                };
                directory.send(down).await.map_err(internal)?;
                Ok(ControlReply::Ack)
            }
            ControlRequest::Echo(_)
            | ControlRequest::PutObjectChunk { .. }
            | ControlRequest::ReadObject { .. }
            | ControlRequest::PullObject { .. }
            | ControlRequest::AwaitObject { .. }
            | ControlRequest::FailObject { .. }
            | ControlRequest::UpdateRefs { .. }
            | ControlRequest::FreeObject(_)
            | ControlRequest::OpenObject(_)
            | ControlRequest::CreateObject { .. }
            | ControlRequest::SealObject { .. }
            | ControlRequest::ListObjects
            | ControlRequest::StartActor(_)
            | ControlRequest::ReserveBundle { .. }
            | ControlRequest::ReleaseBundle(_)
            | ControlRequest::KillActor(_)
            | ControlRequest::ReadBinary { .. }
            | ControlRequest::AddPacketRule(_)
            | ControlRequest::UploadBinary { .. } => Err(RemoteError::new(
                RemoteErrorKind::BadRequest,
                "a node request reached the head's dispatcher",
            )),
        }
    }
}

impl RequestHandler for NodeService {
    fn handle(
        &self,
        from: PeerIdentity,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, HandlerError>> {
        let request: ControlRequest = match wire::decode(&body) {
            Ok(request) => request,
            Err(e) => {
                return futures::future::ready(Err(HandlerError::Malformed(e.to_string()))).boxed()
            }
        };
        let service = self.clone();
        async move {
            let reply = service.dispatch(from, request).await?;
            rmp_serde::to_vec_named(&reply).map_err(|e| {
                HandlerError::Remote(RemoteError::new(RemoteErrorKind::Internal, e.to_string()))
            })
        }
        .boxed()
    }
}

fn internal(e: actix::MailboxError) -> RemoteError {
    RemoteError::new(
        RemoteErrorKind::Internal,
        format!("node actor unavailable: {e}"),
    )
}
