//! The `Membership` actor: the node table plus a clock.

use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{info, warn};

use crate::cluster::{
    AutoscalerReport, ClusterEventKind, ClusterStatus, HostLoad, NodeRegistration, ResourceSet,
    MAX_REPORTED, MAX_REQUESTED_BUNDLES,
};
use crate::head::events::{ClusterEvents, Publish};
use crate::head::store::{HeadStore, StoredNode};
use crate::wire::NodeIdentity;

use super::{MembershipError, NodeTable};

/// Owns the node table on the head; checks for silent nodes every tenth of
/// the heartbeat timeout.
pub struct Membership {
    table: NodeTable,
    events: Addr<ClusterEvents>,
    check_every: Duration,
    store: HeadStore,
    /// When this head started, while members it restored are unconfirmed.
    restored_at: Option<Instant>,
    /// The autoscaler's latest report and when it came.
    autoscaler: Option<(AutoscalerReport, Instant)>,
    /// The decisions counted in the autoscaler's latest report.
    decided: u64,
    /// The capacity requested ahead of use, latest request.
    requested: Vec<ResourceSet>,
}

/// How long an autoscaler's report is shown and waited on: an autoscaler
/// reports every second (`crate::autoscaler::POLL_INTERVAL`); one silent
/// for this long is gone, and spawns no node fits fail again at once.
pub const REPORT_FRESH_FOR: Duration = Duration::from_secs(15);

impl Membership {
    /// A membership that declares nodes dead after `timeout` without a
    /// heartbeat, records joins and deaths in `store` and publishes changes
    /// to `events`. `restored`: the nodes a previous head recorded, whose
    /// members have `grace` to come back (step 7).
    pub fn new(
        timeout: Duration,
        events: Addr<ClusterEvents>,
        store: HeadStore,
        (restored, grace): (Vec<StoredNode>, Duration),
    ) -> Self {
        let now = Instant::now();
        let mut table = NodeTable::new(timeout);
        table.restore(restored, grace, now);
        let unconfirmed = table.unconfirmed();
        if unconfirmed > 0 {
            info!("the head restarted: {unconfirmed} members have {grace:?} to come back (--head-grace-s)");
        }
        Membership {
            table,
            events,
            check_every: timeout / 10,
            store,
            restored_at: (unconfirmed > 0).then_some(now),
            autoscaler: None,
            decided: 0,
            requested: Vec::new(),
        }
    }

    /// Writes `node`'s record to the store (step 6).
    fn record(&self, node: &NodeIdentity) -> Result<(), MembershipError> {
        let Some(stored) = self.table.stored(&node.name) else {
            return Ok(());
        };
        self.store
            .put_node(&stored)
            .map_err(|e| MembershipError::NotRecorded {
                node: node.clone(),
                detail: e.to_string(),
            })
    }

    /// Says, once, when every restored member is back or declared dead.
    fn note_rejoins(&mut self) {
        if let Some(started) = self.restored_at {
            if self.table.unconfirmed() == 0 {
                self.restored_at = None;
                let (alive, dead) = self.table.counts();
                info!(
                    "every member is back or declared dead {:.1?} after the head started ({alive} alive, {dead} dead)",
                    started.elapsed()
                );
            }
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
                | ClusterEventKind::PacketFaults { .. }
                | ClusterEventKind::Autoscaler { .. }
                | ClusterEventKind::Resync { .. } => {}
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
            for event in &events {
                if let ClusterEventKind::NodeDead { node, .. } = event {
                    if let Err(e) = membership.record(node) {
                        warn!("{e}");
                    }
                }
            }
            membership.publish(events);
            membership.note_rejoins();
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
        let node = msg.registration.node.clone();
        // Write-ahead: a join the store does not take leaves no trace.
        let before = self.table.clone();
        let events = self
            .table
            .handle_join(msg.registration, msg.head, Instant::now())?;
        if !events.is_empty() {
            if let Err(e) = self.record(&node) {
                self.table = before;
                return Err(e);
            }
        }
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
        self.note_rejoins();
        Ok(())
    }
}

impl Handler<Leave> for Membership {
    type Result = Result<(), MembershipError>;

    fn handle(&mut self, msg: Leave, _: &mut Self::Context) -> Self::Result {
        let before = self.table.clone();
        let events = self.table.handle_leave(&msg.node)?;
        if let Err(e) = self.record(&msg.node) {
            self.table = before;
            return Err(e);
        }
        self.publish(events);
        Ok(())
    }
}

impl Handler<Status> for Membership {
    type Result = MessageResult<Status>;

    fn handle(&mut self, _: Status, _: &mut Self::Context) -> Self::Result {
        let now = Instant::now();
        let mut status = self.table.status(now);
        status.autoscaler = self
            .autoscaler
            .as_ref()
            .filter(|(_, at)| now.saturating_duration_since(*at) < REPORT_FRESH_FOR)
            .map(|(report, _)| report.clone());
        status.requested = self.requested.clone();
        MessageResult(status)
    }
}

/// The autoscaler's view after a decision round.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Report(pub AutoscalerReport);

impl Handler<Report> for Membership {
    type Result = ();

    fn handle(&mut self, Report(mut report): Report, _: &mut Self::Context) {
        report.node_types.truncate(MAX_REPORTED);
        let newest = report.decisions.len().saturating_sub(MAX_REPORTED);
        report.decisions.drain(..newest);
        let mut events = Vec::new();
        for decision in report.new_decisions(self.decided) {
            let kind = match decision.split(' ').next() {
                Some("launching") => "launch",
                Some("terminating") => "terminate",
                _ => "launch failed",
            };
            metrics::counter!("nimbus_autoscaler_decisions_total", "kind" => kind).increment(1);
            events.push(ClusterEventKind::Autoscaler {
                decision: decision.clone(),
            });
        }
        for t in &report.node_types {
            for (state, count) in [("running", t.running), ("launching", t.launching)] {
                metrics::gauge!("nimbus_autoscaler_nodes", "type" => t.name.clone(), "state" => state)
                    .set(count as f64);
            }
        }
        self.decided = report.decided;
        self.autoscaler = Some((report, Instant::now()));
        self.publish(events);
    }
}

/// Capacity requested ahead of use (replacing the previous request).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Request(pub Vec<ResourceSet>);

impl Handler<Request> for Membership {
    type Result = ();

    fn handle(&mut self, Request(mut bundles): Request, _: &mut Self::Context) {
        bundles.truncate(MAX_REQUESTED_BUNDLES);
        self.requested = bundles;
    }
}
