//! The node's request handler: decodes control requests and routes them to
//! the actors that answer them.

use std::time::Duration;

use actix::Addr;
use futures::future::BoxFuture;
use futures::FutureExt;

use crate::cluster::events::EventsSince;
use crate::cluster::membership::{self, Membership};
use crate::cluster::{ClusterEvents, ControlReply, ControlRequest};
use crate::transport::{HandlerError, RequestHandler};
use crate::wire::{self, PeerIdentity, PeerRole, RemoteError, RemoteErrorKind};

/// Longest a client may long-poll for events in one request.
const MAX_EVENT_WAIT: Duration = Duration::from_secs(60);

/// Routes requests arriving at a node.
pub struct NodeService {
    head: Option<HeadActors>,
    heartbeat_interval: Duration,
}

struct HeadActors {
    membership: Addr<Membership>,
    events: Addr<ClusterEvents>,
}

impl NodeService {
    /// The service of the head, which answers membership requests.
    pub fn head(
        membership: Addr<Membership>,
        events: Addr<ClusterEvents>,
        heartbeat_interval: Duration,
    ) -> Self {
        NodeService {
            head: Some(HeadActors { membership, events }),
            heartbeat_interval,
        }
    }

    /// The service of any other node.
    pub fn member() -> Self {
        NodeService {
            head: None,
            heartbeat_interval: Duration::ZERO,
        }
    }

    fn dispatch(
        &self,
        from: PeerIdentity,
        request: ControlRequest,
    ) -> BoxFuture<'static, Result<ControlReply, RemoteError>> {
        if let ControlRequest::Echo(payload) = request {
            return futures::future::ready(Ok(ControlReply::Echo(payload))).boxed();
        }
        let Some(head) = &self.head else {
            let error = RemoteError::new(
                RemoteErrorKind::BadRequest,
                "this node is not the head; send membership requests to the head",
            );
            return futures::future::ready(Err(error)).boxed();
        };
        let interval = self.heartbeat_interval;
        let membership = head.membership.clone();
        let events = head.events.clone();
        async move {
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
                    let beat = membership::Heartbeat { node, used };
                    membership.send(beat).await.map_err(internal)??;
                    Ok(ControlReply::Ack)
                }
                ControlRequest::Leave { node } => {
                    membership
                        .send(membership::Leave { node })
                        .await
                        .map_err(internal)??;
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
                ControlRequest::Echo(payload) => Ok(ControlReply::Echo(payload)),
            }
        }
        .boxed()
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
        let reply = self.dispatch(from, request);
        async move {
            let reply = reply.await?;
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
        format!("control-plane actor unavailable: {e}"),
    )
}
