//! Running a plan against a local cluster.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;

use crate::actor::faults::FiredFault;
use crate::client::{ClientError, ClusterClient};
use crate::cluster::{
    ActorId, ActorRecord, ClusterEvent, ClusterEventKind, DirectoryReply, NodeState,
    UnexpectedReply,
};
use crate::cluster::{DirectoryRequest, ProcessClass};
use crate::host::processes::{signal_process, Signal};
use crate::local::{LocalCluster, LocalClusterError};
use crate::train::faults::TrainingFaultAction;
use crate::transport::{ConnectError, FaultCounts, RequestError, RequestOptions};

use super::links::{links, Cut};
use super::{ChaosPlan, Clock, FaultAction, PlanError, ResolvedFault, Timeline, TimelineEntry};

/// One fault could not be injected: the timeline records it, the run goes
/// on.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotInjected {
    /// The head or a process could not be asked.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A peer answered with a reply of the wrong kind.
    #[error(transparent)]
    Unexpected(#[from] crate::cluster::UnexpectedReply),
    /// A process could not be reached.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A process did not answer.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The call to a worker could not be encoded.
    #[error("cannot encode the call: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// A `type:TYPE` target matches no live actor.
    #[error("no live actor is of type {0}")]
    NoActorOfType(String),
    /// A name target matches no live actor.
    #[error("no live actor has that name")]
    NoActorNamed,
}

/// A chaos run could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// The plan does not fit the cluster.
    #[error("bad chaos plan: {0}")]
    Plan(#[from] PlanError),
    /// An actor or link fault was routed to the node faults (a bug).
    #[error("an actor or link fault reached the node faults")]
    Misrouted,
    /// A node process could not be signalled or restarted.
    #[error(transparent)]
    Cluster(#[from] LocalClusterError),
    /// The head could not be asked what it saw.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Injects `plan`'s timed faults into `cluster`, observes the recoveries,
/// and returns the timeline once every fault is injected and observed.
/// Nodes stopped by the plan are resumed before it returns, whatever
/// happens.
pub async fn run(cluster: &mut LocalCluster, plan: &ChaosPlan) -> Result<Timeline, ChaosError> {
    run_while(cluster, plan, async {})
        .await
        .map(|((), timeline)| timeline)
}

/// [`run`], while `workload` (a program using the cluster) runs; the run
/// also ends no earlier than the workload. Actor faults (triggered by
/// message counts inside workers) are recorded when their deaths are
/// reported, with the restarts that follow.
pub async fn run_while<T>(
    cluster: &mut LocalCluster,
    plan: &ChaosPlan,
    workload: impl Future<Output = T>,
) -> Result<(T, Timeline), ChaosError> {
    let names: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.name().to_string())
        .collect();
    let faults = plan.resolve(&names)?;
    let client = cluster.client().await?;
    let mut run = Run {
        start: Instant::now(),
        clock: plan.clock,
        first_actor: None,
        held: Vec::new(),
        deadline: 3 * cluster.heartbeat_timeout() + Duration::from_secs(10),
        timeline: Timeline {
            seed: plan.seed,
            entries: Vec::new(),
        },
        stopped: Vec::new(),
        dying: HashMap::new(),
        node_killed: None,
        packets: HashMap::new(),
        head_kills: plan
            .training_faults
            .iter()
            .filter_map(|fault| match fault.action {
                TrainingFaultAction::KillHead { down_ms } => {
                    Some((fault.fired(), Duration::from_millis(down_ms)))
                }
                _ => None,
            })
            .collect(),
        head_due: Vec::new(),
    };
    run.record_packet_faults(plan);
    let result = run.schedule(cluster, &client, faults, workload).await;
    for node in run.stopped.drain(..) {
        let _ = cluster.resume(node);
    }
    let output = result?;
    run.check_effects(plan, &names);
    Ok((output, run.timeline))
}

/// Something the schedule does at a time.
enum Step {
    Fault(ResolvedFault),
    /// The head killed by a `kill_head` training fault starts again.
    HeadBack {
        killed_at: Instant,
        trigger: String,
    },
    Resume {
        node: usize,
        stopped_at: Instant,
    },
    Healed {
        sides: String,
        cut_at: Instant,
    },
}

/// What a fault should lead to.
enum Expect {
    Dead,
    Rejoined {
        before: u64,
    },
    /// The head is back (a new incarnation) and every member with it.
    HeadBack {
        before: u64,
    },
}

/// The state of one run.
struct Run {
    /// What the timed faults count from: the run's start, then (with
    /// [`Clock::FirstActor`]) when the first actor started.
    start: Instant,
    clock: Clock,
    /// When the first actor of the run started (with [`Clock::FirstActor`]).
    first_actor: Option<Instant>,
    /// Timed faults waiting for the first actor (with [`Clock::FirstActor`]).
    held: Vec<(Duration, Step)>,
    deadline: Duration,
    timeline: Timeline,
    /// Nodes stopped and not yet resumed.
    stopped: Vec<usize>,
    /// Actors killed by a fault, waiting for their restart.
    dying: HashMap<ActorId, Instant>,
    /// When a worker's `kill_node` fault was reported, until the head
    /// declares a node dead.
    node_killed: Option<Instant>,
    /// The latest packet-fault counters each process reported, with the
    /// hits of each rule of its plan.
    packets: HashMap<String, (ProcessClass, FaultCounts, Vec<u64>)>,
    /// The plan's `kill_head` training faults not fired yet, and how long
    /// each keeps the head down.
    head_kills: Vec<(FiredFault, Duration)>,
    /// `kill_head` faults reported (by their triggers): the head is to be
    /// killed now and started again after this long.
    head_due: Vec<(Duration, String)>,
}

impl Run {
    async fn schedule<T>(
        &mut self,
        cluster: &mut LocalCluster,
        client: &ClusterClient,
        faults: Vec<ResolvedFault>,
        workload: impl Future<Output = T>,
    ) -> Result<T, ChaosError> {
        let mut steps: Vec<(Duration, Step)> =
            faults.into_iter().map(|f| (f.at, Step::Fault(f))).collect();
        if self.clock == Clock::FirstActor {
            self.held = std::mem::take(&mut steps);
        }
        let mut observations: FuturesUnordered<BoxFuture<'_, Vec<TimelineEntry>>> =
            FuturesUnordered::new();
        let mut cutting: FuturesUnordered<BoxFuture<'_, Cut>> = FuturesUnordered::new();
        let mut seen = client.last_event_seq().await?;
        let mut watch = client.events(seen, Duration::from_millis(500)).boxed();
        let workload = workload.fuse();
        futures::pin_mut!(workload);
        let mut output = None;
        loop {
            if steps.is_empty() && observations.is_empty() && cutting.is_empty() {
                if let Some(output) = output {
                    // The rest of the events, a page at a time.
                    loop {
                        let last = client.events(seen, Duration::ZERO).await?;
                        let Some(newest) = last.last() else { break };
                        seen = newest.seq;
                        self.record_events(&last);
                    }
                    self.record_packet_counts();
                    return Ok(output);
                }
            }
            steps.sort_by_key(|(at, _)| *at);
            let next_at = steps.first().map(|(at, _)| self.start + *at);
            tokio::select! {
                _ = sleep_until(next_at), if next_at.is_some() => {
                    let (at, step) = steps.remove(0);
                    if let Step::Fault(ResolvedFault { action: FaultAction::KillActor { actor }, at, .. }) = &step {
                        self.kill_actor(client, actor, *at).await;
                        continue;
                    }
                    if let Step::Fault(ResolvedFault { action: FaultAction::PanicActor { actor }, at, .. }) = &step {
                        self.panic_actor(client, actor, *at).await;
                        continue;
                    }
                    if let Step::Fault(ResolvedFault { action, at, .. }) = &step {
                        if let Some((nodes, from, for_ms, rule)) = action.link_rule() {
                            // Installed concurrently: a node that does not
                            // answer (stopped) must not hold up the schedule.
                            let label = action.label();
                            cutting.push(links(client, label, nodes, from, for_ms, rule, *at));
                            continue;
                        }
                    }
                    if let Some(observe) = self.apply(cluster, at, step, &mut steps)? {
                        let observe = observe_recovery(client, observe.0, observe.1, Instant::now(), self.deadline);
                        observations.push(observe.map(|entry| vec![entry]).boxed());
                    }
                }
                Some(entries) = observations.next(), if !observations.is_empty() => self.timeline.entries.extend(entries),
                Some(cut) = cutting.next(), if !cutting.is_empty() => self.cut(cut, &mut steps),
                out = &mut workload, if output.is_none() => output = Some(out),
                events = &mut watch => {
                    let events = events?;
                    seen = events.last().map_or(seen, |e| e.seq);
                    self.record_events(&events);
                    if let Some(first) = self.first_actor.filter(|_| !self.held.is_empty()) {
                        tracing::info!("chaos: the first actor started; the timed faults' clock starts");
                        self.start = first;
                        steps.append(&mut self.held);
                    }
                    for (down, trigger) in std::mem::take(&mut self.head_due) {
                        steps.push(self.kill_head(cluster, down, trigger)?);
                    }
                    watch = client.events(seen, Duration::from_millis(500)).boxed();
                }
            }
        }
    }

    /// Carries out one step; returns what to observe afterwards.
    fn apply(
        &mut self,
        cluster: &mut LocalCluster,
        at: Duration,
        step: Step,
        steps: &mut Vec<(Duration, Step)>,
    ) -> Result<Option<(String, Expect)>, ChaosError> {
        let now = Instant::now();
        match step {
            Step::Fault(fault) => {
                let node = name_of(cluster, fault.node);
                let label = fault.action.label();
                let expect = match &fault.action {
                    FaultAction::KillNode { .. } => {
                        cluster.kill(fault.node)?;
                        Some(Expect::Dead)
                    }
                    FaultAction::StopNode { for_ms, .. } => {
                        cluster.suspend(fault.node)?;
                        self.stopped.push(fault.node);
                        let resume = Step::Resume {
                            node: fault.node,
                            stopped_at: now,
                        };
                        steps.push((at + Duration::from_millis(*for_ms), resume));
                        None
                    }
                    FaultAction::RestartNode { .. } => {
                        let before = cluster.node(fault.node)?.incarnation().0;
                        cluster.restart(fault.node)?;
                        Some(Expect::Rejoined { before })
                    }
                    FaultAction::KillActor { .. }
                    | FaultAction::PanicActor { .. }
                    | FaultAction::Partition { .. }
                    | FaultAction::DegradeLinks { .. } => return Err(ChaosError::Misrouted),
                };
                self.timeline.entries.push(TimelineEntry::Injected {
                    fault: label,
                    target: node.clone(),
                    trigger: format!("after={}ms", fault.at.as_millis()),
                    at_ms: (now - self.start).as_millis() as u64,
                });
                Ok(expect.map(|expect| (node, expect)))
            }
            Step::Healed { sides, cut_at } => {
                self.timeline.entries.push(TimelineEntry::Recovered {
                    what: "links healed".into(),
                    node: sides,
                    took_ms: cut_at.elapsed().as_millis() as u64,
                });
                Ok(None)
            }
            Step::HeadBack { killed_at, trigger } => {
                let before = cluster.node(0)?.incarnation().0;
                cluster.restart(0)?;
                let head = name_of(cluster, 0);
                tracing::info!(
                    "chaos: the head starts again after {:?} down",
                    killed_at.elapsed()
                );
                self.timeline.entries.push(TimelineEntry::Injected {
                    fault: "restart_node".into(),
                    target: head.clone(),
                    trigger,
                    at_ms: (now - self.start).as_millis() as u64,
                });
                Ok(Some((head, Expect::HeadBack { before })))
            }
            Step::Resume { node, stopped_at } => {
                cluster.resume(node)?;
                self.stopped.retain(|n| *n != node);
                self.timeline.entries.push(TimelineEntry::Recovered {
                    what: "resumed (SIGCONT)".into(),
                    node: name_of(cluster, node),
                    took_ms: stopped_at.elapsed().as_millis() as u64,
                });
                Ok(None)
            }
        }
    }

    /// Carries out a reported `kill_head` training fault (fired by
    /// `trigger`): SIGKILLs the head now; the step returned starts it
    /// again `down` later (from its store: the same cluster). Both are in
    /// the timeline under the fault's trigger (`step N`, then `step N +
    /// Dms`), so they sort after the fault itself and replay the same.
    fn kill_head(
        &mut self,
        cluster: &mut LocalCluster,
        down: Duration,
        trigger: String,
    ) -> Result<(Duration, Step), ChaosError> {
        let now = Instant::now();
        cluster.kill(0)?;
        self.timeline.entries.push(TimelineEntry::Injected {
            fault: "kill_node".into(),
            target: name_of(cluster, 0),
            trigger: trigger.clone(),
            at_ms: (now - self.start).as_millis() as u64,
        });
        let back = (now - self.start) + down;
        let trigger = format!("{trigger} + {}ms", down.as_millis());
        Ok((
            back,
            Step::HeadBack {
                killed_at: now,
                trigger,
            },
        ))
    }

    /// SIGKILLs the worker process of each actor `target` names (found
    /// through the head; local clusters run every worker on this machine).
    async fn kill_actor(&mut self, client: &ClusterClient, target: &str, planned: Duration) {
        let what = format!("kill_actor at after={}ms", planned.as_millis());
        for record in self.targets(client, target, &what).await {
            let label = stable_name(&record);
            let Some(pid) = crate::local::worker_pid(record.actor) else {
                let detail = "its worker process is not on this machine".to_string();
                self.timeline.entries.push(not_done(&what, &label, detail));
                continue;
            };
            let now = Instant::now();
            if let Err(e) = signal_process(pid as u32, Signal::KILL) {
                self.timeline.entries.push(not_done(&what, &label, e));
                continue;
            }
            self.dying.insert(record.actor, now);
            self.timeline.entries.push(TimelineEntry::Injected {
                fault: "kill_actor".into(),
                target: label,
                trigger: format!("after={}ms", planned.as_millis()),
                at_ms: (now - self.start).as_millis() as u64,
            });
        }
    }

    /// Makes each actor `target` names panic in its worker process; the
    /// death reason (`chaos: panic at after=Tms of NAME`) puts the fault in
    /// the timeline when the head reports the death.
    async fn panic_actor(&mut self, client: &ClusterClient, target: &str, planned: Duration) {
        let what = format!("panic_actor at after={}ms", planned.as_millis());
        for record in self.targets(client, target, &what).await {
            let label = stable_name(&record);
            let trigger = format!("after={}ms", planned.as_millis());
            let reason = FiredFault::new("panic", trigger, &label).to_string();
            let worker = crate::wire::NodeIdentity {
                name: crate::actor::worker_name(record.actor),
                incarnation: record.incarnation,
            };
            let call = crate::actor::ActorCall {
                actor: record.actor,
                message: crate::actor::faults::PANIC_MESSAGE.to_string(),
                payload: reason.into_bytes(),
            };
            let sent = match (
                client
                    .endpoint()
                    .connect(record.address, Some(&worker))
                    .await,
                rmp_serde::to_vec_named(&call),
            ) {
                (Ok(connection), Ok(body)) => {
                    self.dying.insert(record.actor, Instant::now());
                    // The worker dies instead of answering.
                    let options = RequestOptions::control().with_deadline(Duration::from_secs(2));
                    let _ = connection.request(body, options).await;
                    Ok(())
                }
                (Err(e), _) => Err(NotInjected::from(e)),
                (_, Err(e)) => Err(NotInjected::from(e)),
            };
            if let Err(e) = sent {
                self.timeline.entries.push(not_done(&what, &label, e));
            }
        }
    }

    /// The live actors `target` names ([`live_actors`]); none, recorded as
    /// `what` not done, if it names none.
    async fn targets(
        &mut self,
        client: &ClusterClient,
        target: &str,
        what: &str,
    ) -> Vec<ActorRecord> {
        match live_actors(client, target).await {
            Ok(records) => records,
            Err(e) => {
                self.timeline.entries.push(not_done(what, target, e));
                Vec::new()
            }
        }
    }

    /// Records a link fault's installation: injected (and healed when its
    /// rules expire) if every process added its rule, not done otherwise.
    fn cut(&mut self, cut: Cut, steps: &mut Vec<(Duration, Step)>) {
        if !cut.failures.is_empty() {
            self.timeline.entries.push(not_done(
                &format!("{} on every process", cut.fault),
                &cut.sides,
                cut.failures.join("; "),
            ));
            return;
        }
        tracing::info!("chaos: {} between {} installed", cut.fault, cut.sides);
        let since_start = cut.installed_at.saturating_duration_since(self.start);
        self.timeline.entries.push(TimelineEntry::Injected {
            fault: cut.fault,
            target: cut.sides.clone(),
            trigger: cut.trigger,
            at_ms: since_start.as_millis() as u64,
        });
        // Each process's rule expires `for_ms` after it arrived: all of
        // them by `for_ms` after the last answer.
        let healed = Step::Healed {
            sides: cut.sides,
            cut_at: cut.installed_at,
        };
        steps.push((since_start + Duration::from_millis(cut.for_ms), healed));
    }

    /// The plan's packet rules, as faults injected into the workload's
    /// socket from its start.
    fn record_packet_faults(&mut self, plan: &ChaosPlan) {
        let workload = plan.packet_faults.iter().map(|p| (p, "workload"));
        let nodes = plan.node_packet_faults.iter().map(|p| {
            let target = if p.workers { "nodes+workers" } else { "nodes" };
            (p, target)
        });
        for (packets, target) in workload.chain(nodes).collect::<Vec<_>>() {
            self.record_packet_rules(packets, target);
        }
    }

    fn record_packet_rules(&mut self, packets: &crate::transport::PacketFaults, target: &str) {
        for rule in &packets.rules {
            let until = rule
                .until_ms
                .map_or("end".to_string(), |ms| format!("{ms}ms"));
            self.timeline.entries.push(TimelineEntry::Planned {
                fault: format!("packets({})", rule.kinds().join(",")),
                target: target.into(),
                trigger: format!("window={}ms..{until}", rule.from_ms),
            });
        }
    }

    /// Records a fault reported through the head, once: a fault that
    /// killed a node is reported by its injector and again in the death
    /// reason of each actor the node took with it.
    fn injected(&mut self, fault: String, target: String, trigger: String) {
        let seen = self.timeline.entries.iter().any(|e| {
            matches!(e, TimelineEntry::Injected { fault: f, target: t, trigger: g, .. }
                if *f == fault && *t == target && *g == trigger)
        });
        if !seen {
            self.timeline.entries.push(TimelineEntry::Injected {
                fault,
                target,
                trigger,
                at_ms: self.start.elapsed().as_millis() as u64,
            });
        }
    }

    /// Adds a `NoEffect` entry for each planned fault that never took
    /// effect (`effects.rs`); `names` are the cluster's node names.
    fn check_effects(&mut self, plan: &ChaosPlan, names: &[String]) {
        let held: Vec<ResolvedFault> = self
            .held
            .drain(..)
            .filter_map(|(_, step)| match step {
                Step::Fault(fault) => Some(fault),
                _ => None,
            })
            .collect();
        let packets: Vec<(ProcessClass, &[u64])> = self
            .packets
            .values()
            .map(|(class, _, hits)| (*class, hits.as_slice()))
            .collect();
        let fired = self.timeline.injected();
        let missed = super::effects::missed(plan, names, &held, &fired, &packets);
        self.timeline.entries.extend(missed);
    }

    /// One timeline entry per kind of process whose sockets reported
    /// packet faults: what the plan's rules actually did.
    fn record_packet_counts(&mut self) {
        let mut by_class: std::collections::BTreeMap<ProcessClass, (usize, FaultCounts)> =
            Default::default();
        for (class, counts, _) in self.packets.values() {
            let (processes, total) = by_class.entry(*class).or_default();
            *processes += 1;
            *total += *counts;
        }
        for (class, (processes, counts)) in by_class {
            self.timeline.entries.push(TimelineEntry::PacketsInjected {
                class: class.to_string(),
                processes,
                counts,
            });
        }
    }

    fn record_events(&mut self, events: &[ClusterEvent]) {
        for event in events {
            match &event.kind {
                ClusterEventKind::Recovered {
                    what,
                    target,
                    took_ms,
                } => self.timeline.entries.push(TimelineEntry::Recovered {
                    what: what.clone(),
                    node: target.clone(),
                    took_ms: *took_ms,
                }),
                ClusterEventKind::FaultInjected {
                    fault,
                    target,
                    trigger,
                } => {
                    if fault == "kill_node" {
                        self.node_killed = Some(Instant::now());
                    }
                    let fired = FiredFault::new(fault.clone(), trigger.clone(), target.clone());
                    if let Some(at) = self.head_kills.iter().position(|(f, _)| *f == fired) {
                        let (fired, down) = self.head_kills.remove(at);
                        self.head_due.push((down, fired.trigger));
                    }
                    self.injected(fault.clone(), target.clone(), trigger.clone());
                }
                ClusterEventKind::PacketFaults {
                    process,
                    class,
                    counts,
                    rule_hits,
                } => {
                    let report = (*class, *counts, rule_hits.clone());
                    self.packets.insert(process.clone(), report);
                }
                ClusterEventKind::NodeDead { node, .. } => {
                    if let Some(killed) = self.node_killed.take() {
                        self.timeline.entries.push(TimelineEntry::Recovered {
                            what: "declared dead".into(),
                            node: node.name.clone(),
                            took_ms: killed.elapsed().as_millis() as u64,
                        });
                    }
                }
                ClusterEventKind::ActorDied {
                    actor,
                    reason,
                    restarting,
                    ..
                } => {
                    if let Some(fired) = reason.fault() {
                        self.injected(fired.kind, fired.target, fired.trigger);
                    }
                    if *restarting {
                        self.dying.insert(*actor, Instant::now());
                    }
                }
                ClusterEventKind::ActorStarted {
                    actor, name, node, ..
                } => {
                    if self.clock == Clock::FirstActor && self.first_actor.is_none() {
                        self.first_actor = Some(Instant::now());
                    }
                    if let Some(died) = self.dying.remove(actor) {
                        self.timeline.entries.push(TimelineEntry::Recovered {
                            what: format!("actor restarted on {node}"),
                            node: name.clone().unwrap_or_else(|| format!("actor {actor}")),
                            took_ms: died.elapsed().as_millis() as u64,
                        });
                    }
                }
                _ => {}
            }
        }
    }
}

/// The live actors a plan's actor target names: `NAME` (the actor with
/// that unique name) or `type:TYPE` (every actor of that registered type,
/// in name order).
async fn live_actors(
    client: &ClusterClient,
    target: &str,
) -> Result<Vec<ActorRecord>, NotInjected> {
    if let Some(type_name) = target.strip_prefix("type:") {
        let mut records: Vec<ActorRecord> = match client.call(DirectoryRequest::ListActors).await {
            Ok(DirectoryReply::Actors(actors)) => actors
                .into_iter()
                .filter(|r| r.type_name == type_name && !r.restarting)
                .collect(),
            Ok(reply) => return Err(UnexpectedReply::new("ListActors", reply).into()),
            Err(e) => return Err(e.into()),
        };
        records.sort_by(|a, b| (&a.name, a.actor).cmp(&(&b.name, b.actor)));
        if records.is_empty() {
            return Err(NotInjected::NoActorOfType(type_name.to_string()));
        }
        return Ok(records);
    }
    match client
        .call(DirectoryRequest::LookupName(target.to_string()))
        .await
    {
        Ok(DirectoryReply::Actor(Some(record))) if record.dead.is_none() => Ok(vec![*record]),
        Ok(_) => Err(NotInjected::NoActorNamed),
        Err(e) => Err(e.into()),
    }
}

/// A planned fault that could not be injected.
fn not_done(what: &str, target: &str, detail: impl ToString) -> TimelineEntry {
    TimelineEntry::NotRecovered {
        what: what.to_string(),
        node: target.to_string(),
        detail: detail.to_string(),
    }
}

/// An actor's name in the timeline: its unique name, or its type.
fn stable_name(record: &ActorRecord) -> String {
    record
        .name
        .clone()
        .unwrap_or_else(|| record.type_name.clone())
}

async fn observe_recovery(
    client: &ClusterClient,
    node: String,
    expect: Expect,
    since: Instant,
    deadline: Duration,
) -> TimelineEntry {
    let (what, seen) = match expect {
        Expect::Dead => {
            let dead = client
                .wait_for_status("the node declared dead", deadline, |s| {
                    s.node(&node).is_some_and(|n| n.state == NodeState::Dead)
                })
                .await;
            ("declared dead", dead)
        }
        Expect::Rejoined { before } => {
            let back = client
                .wait_for_status("the node rejoined", deadline, |s| {
                    s.node(&node)
                        .is_some_and(|n| n.state == NodeState::Alive && n.incarnation != before)
                })
                .await;
            ("rejoined as a new incarnation", back)
        }
        Expect::HeadBack { before } => {
            let back = client
                .wait_for_status("the head and its members back", deadline, |s| {
                    let head = s.node(&node).is_some_and(|n| n.incarnation != before);
                    head && s.nodes.iter().all(|n| !n.rejoining)
                })
                .await;
            ("back with its members", back)
        }
    };
    match seen {
        Ok(_) => TimelineEntry::Recovered {
            what: what.into(),
            node,
            took_ms: since.elapsed().as_millis() as u64,
        },
        Err(e) => TimelineEntry::NotRecovered {
            what: what.into(),
            node,
            detail: e.to_string(),
        },
    }
}

fn name_of(cluster: &LocalCluster, node: usize) -> String {
    cluster
        .node(node)
        .map(|n| n.name().to_string())
        .unwrap_or_default()
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}
