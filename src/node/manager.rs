//! The `NodeManager` actor: owns this node's resources and keeps the head
//! informed of them by heartbeat. Later layers add worker processes and
//! placement here.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::client::{self, ClientError};
use crate::cluster::membership::{self, Membership, MembershipError};
use crate::cluster::{ControlRequest, ResourceSet};
use crate::transport::{Endpoint, RequestError, RequestOptions};
use crate::wire::{NodeIdentity, RemoteErrorKind};

use super::NodeError;

/// How the node manager reaches the membership.
pub enum HeadLink {
    /// On the head: the actor itself, no serialization.
    Local(Addr<Membership>),
    /// Elsewhere: the head's address, dialed again whenever the connection
    /// was lost.
    Remote {
        /// This node's endpoint.
        endpoint: Endpoint,
        /// The head's address.
        head: SocketAddr,
    },
}

/// Owns the node's resources; heartbeats them to the head.
pub struct NodeManager {
    identity: NodeIdentity,
    total: ResourceSet,
    used: ResourceSet,
    head: HeadLink,
    interval: Duration,
    head_lost_timeout: Duration,
    last_ack: Instant,
    in_flight: bool,
    fatal: mpsc::UnboundedSender<NodeError>,
}

/// The outcome of one heartbeat.
enum Beat {
    Acked,
    /// The head refused this incarnation: stop.
    Expelled(String),
    /// No answer; try again next tick.
    Missed(String),
}

impl NodeManager {
    /// A manager for `identity` offering `total`, heartbeating every
    /// `interval`; fatal errors go to `fatal`.
    pub fn new(
        identity: NodeIdentity,
        total: ResourceSet,
        head: HeadLink,
        interval: Duration,
        head_lost_timeout: Duration,
        fatal: mpsc::UnboundedSender<NodeError>,
    ) -> Self {
        NodeManager {
            identity,
            total,
            used: ResourceSet::default(),
            head,
            interval,
            head_lost_timeout,
            last_ack: Instant::now(),
            in_flight: false,
            fatal,
        }
    }

    fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight {
            return;
        }
        self.in_flight = true;
        let node = self.identity.clone();
        let used = self.used.clone();
        let beat: std::pin::Pin<Box<dyn std::future::Future<Output = Beat>>> = match &self.head {
            HeadLink::Local(membership) => {
                let sent = membership.send(membership::Heartbeat { node, used });
                Box::pin(async move {
                    match sent.await {
                        Ok(Ok(())) => Beat::Acked,
                        Ok(Err(
                            e @ (MembershipError::Stale { .. } | MembershipError::Dead { .. }),
                        )) => Beat::Expelled(e.to_string()),
                        Ok(Err(e)) => Beat::Missed(e.to_string()),
                        Err(e) => Beat::Missed(e.to_string()),
                    }
                })
            }
            HeadLink::Remote { endpoint, head } => {
                let (endpoint, head) = (endpoint.clone(), *head);
                let options = RequestOptions::control().with_deadline(self.interval * 2);
                Box::pin(async move {
                    let head = match endpoint.connect(head, None).await {
                        Ok(connection) => connection,
                        Err(e) => return Beat::Missed(e.to_string()),
                    };
                    let request = ControlRequest::Heartbeat { node, used };
                    match client::call(&head, &request, options).await {
                        Ok(_) => Beat::Acked,
                        Err(ClientError::Request(RequestError::Remote { error, .. }))
                            if error.kind == RemoteErrorKind::StaleIncarnation =>
                        {
                            Beat::Expelled(error.message)
                        }
                        Err(e) => Beat::Missed(e.to_string()),
                    }
                })
            }
        };
        ctx.spawn(beat.into_actor(self).map(|beat, manager, _| {
            manager.in_flight = false;
            manager.record(beat);
        }));
    }

    fn record(&mut self, beat: Beat) {
        match beat {
            Beat::Acked => self.last_ack = Instant::now(),
            Beat::Expelled(reason) => {
                let _ = self.fatal.send(NodeError::Expelled(reason));
            }
            Beat::Missed(reason) => {
                let silent = self.last_ack.elapsed();
                warn!(
                    "heartbeat to the head failed ({reason}); no acknowledgement for {silent:.1?}"
                );
                if silent > self.head_lost_timeout {
                    let _ = self.fatal.send(NodeError::HeadLost(silent));
                }
            }
        }
    }
}

impl Actor for NodeManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        debug!(node = %self.identity, resources = %self.total, "node manager started");
        self.heartbeat(ctx);
        ctx.run_interval(self.interval, Self::heartbeat);
    }
}
