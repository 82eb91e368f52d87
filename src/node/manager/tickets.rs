//! This node's ticket and its workers' (`crate::transport`'s `tickets.rs`,
//! step 7): renewed half-way through their life.

use actix::prelude::*;

use crate::transport::{renewal_due_at, unix_now, CertificateHash, WorkerScope};
use crate::wire::{HeadKeys, NodeIdentity, Ticket};

use super::NodeManager;
use crate::node::error::RenewalRefused;

impl NodeManager {
    /// Whether this node's ticket is half-way through its life (or cannot
    /// be read): the next heartbeat asks for a new one.
    pub(super) fn ticket_due(&self) -> bool {
        self.config
            .workers
            .node_ticket()
            .and_then(renewal_due_at)
            .is_none_or(|due| unix_now() >= due)
    }

    /// Presents `ticket`, this node's new one, from now on, attaches it
    /// to the workers' tickets signed after, and checks tickets with
    /// `head_keys` (given to the workers too).
    pub(super) fn renewed(&mut self, ticket: Ticket, head_keys: HeadKeys) {
        self.config
            .endpoint
            .renew(ticket.clone(), head_keys.clone());
        self.config.workers.renewed(ticket, head_keys);
        tracing::debug!("this node's ticket was renewed");
    }
}

/// One of this node's workers asks for a new ticket.
#[derive(Message)]
#[rtype(result = "Result<(Ticket, HeadKeys), RenewalRefused>")]
pub struct RenewWorkerTicket {
    /// The worker, as its ticket names it.
    pub worker: NodeIdentity,
    /// The certificate it asked with.
    pub certificate: CertificateHash,
    /// Its job and program, from its ticket.
    pub scope: WorkerScope,
}

impl Handler<RenewWorkerTicket> for NodeManager {
    type Result = Result<(Ticket, HeadKeys), RenewalRefused>;

    fn handle(&mut self, msg: RenewWorkerTicket, _: &mut Context<Self>) -> Self::Result {
        let live = self.workers.values().any(|worker| {
            worker.spec.actor.worker_name() == msg.worker.name
                && worker.incarnation == msg.worker.incarnation
                && !worker.relaunching
        });
        if !live {
            return Err(RenewalRefused::NotAWorker(msg.worker));
        }
        let workers = &self.config.workers;
        let ticket = workers.renew(&msg.worker, msg.certificate, msg.scope);
        let ticket = ticket.ok_or(RenewalRefused::Uncertified)?;
        Ok((ticket, workers.head_keys().clone()))
    }
}
