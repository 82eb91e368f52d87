//! The node's heartbeat to the head (its step in `mod.rs`): each beat
//! reports the node's state and learns what the head wants of it.

use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;
use tracing::{info, warn};

use crate::client::ClientError;
use crate::cluster::{ActorRecord, ActorSpec};
use crate::cluster::{MembershipReply, MembershipRequest};
use crate::head::membership::{self, MembershipError};
use crate::transport::{unix_now, ConnectError, RequestError};
use crate::wire::{HeadKeys, RemoteErrorKind, Ticket};

use super::{call_head, HeadLink, NodeManager};
use crate::node::error::NodeError;

/// The longest wait between heartbeats the head does not answer.
const MAX_BEAT_BACKOFF: Duration = Duration::from_secs(2);

/// The outcome of one heartbeat.
pub(super) enum Beat {
    /// With this node's new ticket and the head's keys, when the beat
    /// asked for one.
    Acked(Option<(Ticket, HeadKeys)>),
    /// The head refused this incarnation: stop.
    Expelled(String),
    /// No answer; try again next tick.
    Missed(String),
    /// The process at the head's address does not take this cluster's
    /// token: a head started again as another cluster. Stop.
    OtherCluster(String),
}

impl NodeManager {
    pub(super) fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || Instant::now() < self.missed.1 {
            return;
        }
        self.in_flight = true;
        let beat = self.beat();
        ctx.spawn(beat.into_actor(self).map(|beat, manager, _| {
            manager.in_flight = false;
            manager.record(beat);
        }));
    }

    /// One heartbeat to the head, with the resources in use now and how
    /// busy the machine is; past half its ticket's life, asking for a new
    /// one (`tickets.rs`).
    pub(super) fn beat(&mut self) -> BoxFuture<'static, Beat> {
        let node = self.config.identity.clone();
        let used = self.resources.used().clone();
        let host = self.host.sample();
        let renew = self
            .ticket_due()
            .then(|| self.config.workers.signs_workers());
        match &self.config.head {
            HeadLink::Local {
                membership,
                tickets,
                ..
            } => {
                let beat = membership::Heartbeat {
                    node: node.clone(),
                    used,
                    host,
                };
                let sent = membership.send(beat);
                let (tickets, certificate) = (tickets.clone(), self.config.endpoint.certificate());
                async move {
                    match sent.await {
                        Ok(Ok(())) => Beat::Acked(renew.map(|signs_workers| {
                            let now = unix_now();
                            let ticket =
                                tickets.certify_node(&node, certificate, &signs_workers, now);
                            (ticket, tickets.public_keys(now).into())
                        })),
                        Ok(Err(
                            e @ (MembershipError::Stale { .. } | MembershipError::Dead { .. }),
                        )) => Beat::Expelled(e.to_string()),
                        Ok(Err(e)) => Beat::Missed(e.to_string()),
                        Err(e) => Beat::Missed(e.to_string()),
                    }
                }
                .boxed()
            }
            HeadLink::Remote { endpoint, head } => {
                let beat = MembershipRequest::Heartbeat {
                    node,
                    used,
                    host,
                    renew: renew.map(serde_bytes::ByteBuf::from),
                };
                let call = call_head(endpoint, *head, beat, self.config.interval * 2);
                async move {
                    match call.await {
                        Ok(MembershipReply::Renewed { ticket, head_keys }) => {
                            Beat::Acked(Some((ticket, head_keys)))
                        }
                        Ok(_) => Beat::Acked(None),
                        Err(ClientError::Request(RequestError::Remote { error, .. }))
                            if error.kind == RemoteErrorKind::StaleIncarnation =>
                        {
                            Beat::Expelled(error.message)
                        }
                        Err(ClientError::Connect(e @ ConnectError::Unauthenticated { .. })) => {
                            Beat::OtherCluster(e.to_string())
                        }
                        Err(e) => Beat::Missed(e.to_string()),
                    }
                }
                .boxed()
            }
        }
    }

    pub(super) fn record(&mut self, beat: Beat) {
        match beat {
            Beat::Acked(ticket) => {
                if let Some((ticket, head_keys)) = ticket {
                    self.renewed(ticket, head_keys);
                }
                // Also without a missed beat: a head that restarted between
                // two beats missed the reports made meanwhile.
                let due = self.reports.take_due();
                if self.missed.0 > 0 || due {
                    let silent = self.last_ack.elapsed();
                    info!(
                        "the head answers again after {silent:.1?}; telling it what this node runs"
                    );
                    self.report_again();
                }
                self.last_ack = Instant::now();
                self.missed = (0, self.last_ack);
            }
            Beat::Expelled(reason) => {
                let _ = self.config.fatal.send(NodeError::Expelled(reason));
            }
            Beat::OtherCluster(detail) => {
                let head = self.config.head_address;
                let _ = self
                    .config
                    .fatal
                    .send(NodeError::OtherCluster { head, detail });
            }
            Beat::Missed(reason) => {
                let silent = self.last_ack.elapsed();
                let grace = self.config.head_grace;
                let misses = self.missed.0.saturating_add(1);
                let backoff = (self.config.interval * 2u32.saturating_pow(misses.min(16) - 1))
                    .min(MAX_BEAT_BACKOFF);
                self.missed = (misses, Instant::now() + backoff);
                warn!(
                    "heartbeat to the head failed ({reason}); no acknowledgement for {silent:.1?}, giving up after {grace:?} (--head-grace-s); next try in {backoff:?}"
                );
                if silent > grace {
                    let _ = self.config.fatal.send(NodeError::HeadLost(silent));
                }
            }
        }
    }

    /// After the head was unreachable (it may have restarted): the deaths
    /// it was not told of, then every actor this node runs.
    pub(super) fn report_again(&mut self) {
        let live: Vec<(ActorRecord, ActorSpec)> = self
            .workers
            .values()
            .filter(|worker| !worker.relaunching)
            .map(|worker| (self.record_of(worker, worker.address), worker.spec.clone()))
            .collect();
        self.reports.again(live);
    }
}
