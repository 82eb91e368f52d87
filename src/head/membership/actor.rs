//! The `Membership` actor: the node table plus a clock.

use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{info, warn};

use crate::cluster::{ClusterEventKind, ClusterStatus, HostLoad, NodeRegistration, ResourceSet};
use crate::head::events::{ClusterEvents, Publish};
use crate::wire::NodeIdentity;

use super::{MembershipError, NodeTable};

/// Owns the node table on the head; checks for silent nodes every tenth of
/// the heartbeat timeout.
pub struct Membership {
    table: NodeTable,
    events: Addr<ClusterEvents>,
    check_every: Duration,
}

impl Membership {
    /// A membership that declares nodes dead after `timeout` without a
    /// heartbeat and publishes changes to `events`.
    pub fn new(timeout: Duration, events: Addr<ClusterEvents>) -> Self {
        Membership {
            table: NodeTable::new(timeout),
            events,
            check_every: timeout / 10,
        }
    }

    fn publish(&self, events: Vec<ClusterEventKind>) {
        if !events.is_empty() {
            let (alive, dead) = self.table.counts();
            metrics::gauge!("nimbus_members", "state" => "alive").set(alive as f64);
            metrics::gauge!("nimbus_members", "state" => "dead").set(dead as f64);
        }
        for kind in events {
            match &kind {
                ClusterEventKind::NodeJoined { node, address } => {
                    info!(%node, %address, "node joined")
                }
                ClusterEventKind::NodeLeft { node } => info!(%node, "node left"),
                ClusterEventKind::NodeDead { node, reason } => {
                    metrics::counter!("nimbus_node_deaths_total").increment(1);
                    warn!(%node, "node dead: {reason}")
                }
                ClusterEventKind::ResourcesChanged { .. }
                | ClusterEventKind::ActorStarted { .. }
                | ClusterEventKind::ActorDied { .. }
                | ClusterEventKind::Recovered { .. }
                | ClusterEventKind::FaultInjected { .. }
                | ClusterEventKind::JobEnded { .. }
                | ClusterEventKind::PacketFaults { .. } => {}
            }
            self.events.do_send(Publish(kind));
        }
    }
}

impl Actor for Membership {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.check_every, |membership, _| {
            let events = membership.table.poll_failures(Instant::now());
            membership.publish(events);
        });
    }
}

/// Admit a node (see [`NodeTable::handle_join`]).
#[derive(Message)]
#[rtype(result = "Result<(), MembershipError>")]
pub struct Join {
    /// The node.
    pub registration: NodeRegistration,
    /// Whether it is the head itself.
    pub head: bool,
}

/// A heartbeat from a member.
#[derive(Message)]
#[rtype(result = "Result<(), MembershipError>")]
pub struct Heartbeat {
    /// The node.
    pub node: NodeIdentity,
    /// Its resources in use.
    pub used: ResourceSet,
    /// How busy its machine is.
    pub host: Option<HostLoad>,
}

/// A member stopping on purpose.
#[derive(Message)]
#[rtype(result = "Result<(), MembershipError>")]
pub struct Leave {
    /// The node.
    pub node: NodeIdentity,
}

/// Ask for the current view.
#[derive(Message)]
#[rtype(result = "ClusterStatus")]
pub struct Status;

impl Handler<Join> for Membership {
    type Result = Result<(), MembershipError>;

    fn handle(&mut self, msg: Join, _: &mut Self::Context) -> Self::Result {
        if let Some(differs) = self.table.versions_differ(&msg.registration) {
            warn!(node = %msg.registration.node.name, "{differs}");
        }
        let events = self
            .table
            .handle_join(msg.registration, msg.head, Instant::now())?;
        self.publish(events);
        Ok(())
    }
}

impl Handler<Heartbeat> for Membership {
    type Result = Result<(), MembershipError>;

    fn handle(&mut self, msg: Heartbeat, _: &mut Self::Context) -> Self::Result {
        let now = Instant::now();
        if let Some(silent) = self.table.silent_for(&msg.node.name, now) {
            metrics::histogram!("nimbus_heartbeat_delay_seconds").record(silent.as_secs_f64());
        }
        let events = self.table.handle_heartbeat(&msg.node, msg.used, now)?;
        if let Some(host) = msg.host {
            self.table.record_host(&msg.node, host);
        }
        self.publish(events);
        Ok(())
    }
}

impl Handler<Leave> for Membership {
    type Result = Result<(), MembershipError>;

    fn handle(&mut self, msg: Leave, _: &mut Self::Context) -> Self::Result {
        let events = self.table.handle_leave(&msg.node)?;
        self.publish(events);
        Ok(())
    }
}

impl Handler<Status> for Membership {
    type Result = MessageResult<Status>;

    fn handle(&mut self, _: Status, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.table.status(Instant::now()))
    }
}
