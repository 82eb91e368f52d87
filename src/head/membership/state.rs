//! The membership table and failure detector, as a plain state machine:
//! every method takes the current time, and returns the events it caused.

use std::time::{Duration, Instant};

use crate::wire::NodeIdentity;

use super::MembershipError;
use crate::cluster::{
    ClusterEventKind, ClusterStatus, HostLoad, NodeRegistration, NodeState, NodeStatus,
    ResourceSet, ResourceUsage,
};
use crate::head::store::StoredNode;

/// Every node the head has heard of, alive or dead; one entry per node name.
#[derive(Clone, Debug)]
pub struct NodeTable {
    nodes: Vec<Entry>,
    timeout: Duration,
    last_poll: Option<Instant>,
    /// How long members loaded by [`NodeTable::restore`] have to come back.
    grace: Duration,
}

#[derive(Clone, Debug)]
struct Entry {
    registration: NodeRegistration,
    head: bool,
    state: NodeState,
    used: ResourceSet,
    last_heartbeat: Instant,
    death_reason: Option<String>,
    host: Option<HostLoad>,
    /// Loaded from the store by a restarted head and not heard from yet:
    /// declared dead after this instant instead of after the timeout.
    rejoin_by: Option<Instant>,
}

impl NodeTable {
    /// An empty table that declares a node dead after `timeout` without a
    /// heartbeat.
    pub fn new(timeout: Duration) -> Self {
        NodeTable {
            nodes: Vec::new(),
            timeout,
            last_poll: None,
            grace: Duration::ZERO,
        }
    }

    /// Loads the nodes a previous head recorded (`head/store.rs`). Members
    /// that were alive come back *unconfirmed*: not dead (their workers
    /// run on), but with until `now + grace` to heartbeat; those that were
    /// declared dead stay dead. The previous head's own record is left
    /// out: this head is its new incarnation.
    pub fn restore(&mut self, nodes: Vec<StoredNode>, grace: Duration, now: Instant) {
        self.grace = grace;
        for node in nodes.into_iter().filter(|node| !node.head) {
            let state = match node.death_reason {
                None => NodeState::Alive,
                Some(_) => NodeState::Dead,
            };
            let rejoin_by = (state == NodeState::Alive).then_some(now + grace);
            self.nodes.push(Entry {
                registration: node.registration,
                head: false,
                state,
                used: ResourceSet::default(),
                last_heartbeat: now,
                death_reason: node.death_reason,
                host: None,
                rejoin_by,
            });
        }
    }

    /// `name`'s record as the store keeps it.
    pub fn stored(&self, name: &str) -> Option<StoredNode> {
        let entry = &self.nodes[self.position(name)?];
        Some(StoredNode {
            registration: entry.registration.clone(),
            head: entry.head,
            death_reason: entry.death_reason.clone(),
        })
    }

    /// Members loaded by [`NodeTable::restore`] not heard from yet and not
    /// declared dead.
    pub fn unconfirmed(&self) -> usize {
        self.nodes
            .iter()
            .filter(|e| e.rejoin_by.is_some() && e.state == NodeState::Alive)
            .count()
    }

    /// Admits a node. A newer incarnation of a known node replaces the old
    /// one once that is dead or has left; while the old one is alive its
    /// name is taken (`NameTaken`, with when the old one would be declared
    /// dead if it is silent: a restarted node retries then). An older
    /// incarnation is refused. Joining twice with the same incarnation is
    /// harmless.
    pub fn handle_join(
        &mut self,
        registration: NodeRegistration,
        head: bool,
        now: Instant,
    ) -> Result<Vec<ClusterEventKind>, MembershipError> {
        NodeIdentity::check_name(&registration.node.name)?;
        let node = registration.node.clone();
        let joined = ClusterEventKind::NodeJoined {
            node: node.clone(),
            address: registration.address,
        };
        let entry = Entry {
            registration,
            head,
            state: NodeState::Alive,
            used: ResourceSet::default(),
            last_heartbeat: now,
            death_reason: None,
            host: None,
            rejoin_by: None,
        };
        let Some(index) = self.position(&node.name) else {
            self.nodes.push(entry);
            return Ok(vec![joined]);
        };
        let current = &mut self.nodes[index];
        let known = current.registration.node.clone();
        if node.incarnation < known.incarnation {
            return Err(MembershipError::Stale {
                node,
                current: known,
            });
        }
        if node.incarnation == known.incarnation {
            return match &current.death_reason {
                None => Ok(Vec::new()),
                Some(reason) => Err(MembershipError::Dead {
                    node,
                    reason: reason.clone(),
                }),
            };
        }
        if current.state == NodeState::Alive {
            // Declared dead once silent for the timeout, seen by the next
            // check (every tenth of it). An unconfirmed member whose newer
            // incarnation asks for its name restarted during the head's
            // outage: it gets the heartbeat timeout from the head's
            // restart, not the whole grace, to show that it still runs.
            let silent = now.saturating_duration_since(current.last_heartbeat);
            if let Some(by) = current.rejoin_by.as_mut() {
                *by = (*by).min(current.last_heartbeat + self.timeout);
            }
            let declared_in = match current.rejoin_by {
                Some(by) => by.saturating_duration_since(now) + self.timeout / 10,
                None => (self.timeout + self.timeout / 10).saturating_sub(silent),
            };
            return Err(MembershipError::NameTaken {
                node,
                holder: known,
                address: current.registration.address,
                retry_after: (!current.head).then_some(declared_in),
            });
        }
        *current = entry;
        Ok(vec![joined])
    }

    /// How `registration`'s versions differ from the head's in what does
    /// not stop a join (`Versions::differences`), if the head is known.
    pub fn versions_differ(&self, registration: &NodeRegistration) -> Option<String> {
        let head = self.nodes.iter().find(|entry| entry.head)?;
        registration
            .versions
            .differences(&head.registration.versions)
    }

    /// How long `node` (by name) has been silent: since its last
    /// heartbeat, or its join.
    pub fn silent_for(&self, node: &str, now: Instant) -> Option<Duration> {
        let entry = &self.nodes[self.position(node)?];
        Some(now.saturating_duration_since(entry.last_heartbeat))
    }

    /// Records how busy `node`'s machine is (from its heartbeat).
    pub fn record_host(&mut self, node: &NodeIdentity, host: HostLoad) {
        if let Ok(entry) = self.member(node) {
            entry.host = Some(host);
        }
    }

    /// Members alive and dead.
    pub fn counts(&self) -> (usize, usize) {
        let alive = self
            .nodes
            .iter()
            .filter(|e| e.state == NodeState::Alive)
            .count();
        (alive, self.nodes.len() - alive)
    }

    /// Records a heartbeat from a live member; reports a change of the
    /// resources it has in use.
    pub fn handle_heartbeat(
        &mut self,
        node: &NodeIdentity,
        used: ResourceSet,
        now: Instant,
    ) -> Result<Vec<ClusterEventKind>, MembershipError> {
        let entry = self.member(node)?;
        entry.last_heartbeat = now;
        // A member back after the head's restart: what it has in use is
        // news even when it has nothing in use.
        let rejoined = entry.rejoin_by.take().is_some();
        if entry.used == used && !rejoined {
            return Ok(Vec::new());
        }
        entry.used = used;
        Ok(vec![ClusterEventKind::ResourcesChanged {
            node: node.clone(),
        }])
    }

    /// Records that a member stopped on purpose.
    pub fn handle_leave(
        &mut self,
        node: &NodeIdentity,
    ) -> Result<Vec<ClusterEventKind>, MembershipError> {
        let entry = self.member(node)?;
        entry.state = NodeState::Dead;
        entry.death_reason = Some("left the cluster".into());
        Ok(vec![ClusterEventKind::NodeLeft { node: node.clone() }])
    }

    /// Declares dead every member whose last heartbeat is older than the
    /// timeout. Call it often (every tenth of the timeout).
    ///
    /// The head never declares itself dead. And when calls stop for more
    /// than half the timeout, the head itself was stalled (stopped, swapped
    /// out, starved of CPU): the heartbeats it did not read then say nothing
    /// about the members, so every member gets a fresh timeout instead of
    /// being declared dead all at once.
    pub fn poll_failures(&mut self, now: Instant) -> Vec<ClusterEventKind> {
        let timeout = self.timeout;
        let paused = self
            .last_poll
            .replace(now)
            .is_some_and(|last| now.saturating_duration_since(last) > timeout / 2);
        if paused {
            for entry in &mut self.nodes {
                entry.last_heartbeat = entry.last_heartbeat.max(now);
            }
            return Vec::new();
        }
        let mut events = Vec::new();
        let grace = self.grace;
        for entry in &mut self.nodes {
            let silent = now.saturating_duration_since(entry.last_heartbeat);
            let reason = match entry.rejoin_by {
                Some(by) if now > by && by < entry.last_heartbeat + grace => Some(format!(
                    "did not come back within {silent:.1?} of the head's restart, and a newer incarnation asked for its name"
                )),
                Some(by) if now > by => Some(format!(
                    "did not come back within {grace:?} of the head's restart (--head-grace-s)"
                )),
                Some(_) => None,
                None if silent > timeout => Some(format!(
                    "no heartbeat for {silent:.1?} (timeout {timeout:?})"
                )),
                None => None,
            };
            if let (NodeState::Alive, false, Some(reason)) = (entry.state, entry.head, reason) {
                entry.state = NodeState::Dead;
                entry.death_reason = Some(reason.clone());
                events.push(ClusterEventKind::NodeDead {
                    node: entry.registration.node.clone(),
                    reason,
                });
            }
        }
        events
    }

    /// The table as `nimbus status` shows it, head first.
    pub fn status(&self, now: Instant) -> ClusterStatus {
        let mut nodes: Vec<NodeStatus> = self
            .nodes
            .iter()
            .map(|entry| NodeStatus {
                id: entry.registration.node.name.clone(),
                incarnation: entry.registration.node.incarnation.0,
                state: entry.state,
                head: entry.head,
                address: entry.registration.address,
                resources: ResourceUsage {
                    total: entry.registration.resources.clone(),
                    used: entry.used.clone(),
                },
                last_heartbeat_ms_ago: now
                    .saturating_duration_since(entry.last_heartbeat)
                    .as_millis() as u64,
                death_reason: entry.death_reason.clone(),
                host: entry.host,
                versions: entry.registration.versions.clone(),
                rejoining: entry.rejoin_by.is_some() && entry.state == NodeState::Alive,
            })
            .collect();
        nodes.sort_by_key(|n| !n.head);
        ClusterStatus {
            nodes,
            ..ClusterStatus::default()
        }
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.nodes
            .iter()
            .position(|e| e.registration.node.name == name)
    }

    /// The entry of `node` if it is this incarnation and alive.
    fn member(&mut self, node: &NodeIdentity) -> Result<&mut Entry, MembershipError> {
        let index = self
            .position(&node.name)
            .ok_or_else(|| MembershipError::Unknown { node: node.clone() })?;
        let entry = &mut self.nodes[index];
        let known = &entry.registration.node;
        if node.incarnation < known.incarnation {
            return Err(MembershipError::Stale {
                node: node.clone(),
                current: known.clone(),
            });
        }
        if node.incarnation > known.incarnation {
            return Err(MembershipError::Unknown { node: node.clone() });
        }
        if let Some(reason) = &entry.death_reason {
            return Err(MembershipError::Dead {
                node: node.clone(),
                reason: reason.clone(),
            });
        }
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Versions;
    use crate::wire::Incarnation;

    fn registration(name: &str, incarnation: u64) -> NodeRegistration {
        NodeRegistration {
            node: NodeIdentity {
                name: name.into(),
                incarnation: Incarnation(incarnation),
            },
            address: "127.0.0.1:1".parse().unwrap(),
            resources: ResourceSet::default(),
            versions: Versions::here(),
        }
    }

    #[test]
    fn a_member_of_another_release_is_admitted_and_its_difference_said() {
        let t0 = Instant::now();
        let mut table = NodeTable::new(Duration::from_secs(3));
        table
            .handle_join(registration("head", 1), true, t0)
            .unwrap();
        let same = registration("a", 1);
        assert_eq!(table.versions_differ(&same), None);
        let mut other = registration("b", 1);
        other.versions.nimbus = "0.0.1".into();
        let said = table.versions_differ(&other).unwrap();
        assert!(said.contains("runs nimbus 0.0.1 and the head"), "{said}");
        table.handle_join(other, false, t0).unwrap();
        let status = table.status(t0);
        assert_eq!(status.nodes[1].versions.nimbus, "0.0.1");
    }

    #[test]
    fn silent_node_is_declared_dead_after_the_timeout_only() {
        let t0 = Instant::now();
        let mut table = NodeTable::new(Duration::from_secs(3));
        table.handle_join(registration("a", 1), false, t0).unwrap();
        assert!(table.poll_failures(t0 + Duration::from_secs(3)).is_empty());
        let events = table.poll_failures(t0 + Duration::from_millis(3001));
        assert!(
            matches!(&events[..], [ClusterEventKind::NodeDead { node, .. }] if node.name == "a")
        );
        assert!(table.poll_failures(t0 + Duration::from_secs(10)).is_empty());
        assert_eq!(table.status(t0).nodes[0].state, NodeState::Dead);
    }

    #[test]
    fn a_stalled_head_gives_members_a_fresh_timeout_and_never_declares_itself_dead() {
        let t0 = Instant::now();
        let mut table = NodeTable::new(Duration::from_secs(3));
        table
            .handle_join(registration("head", 1), true, t0)
            .unwrap();
        table.handle_join(registration("a", 1), false, t0).unwrap();
        assert!(table.poll_failures(t0).is_empty());
        // The head was stopped for 10 s: nobody is declared dead on waking.
        let woke = t0 + Duration::from_secs(10);
        assert!(table.poll_failures(woke).is_empty());
        // Members that stay silent after that are; the head is not.
        let mut now = woke;
        let mut events = Vec::new();
        while now < woke + Duration::from_secs(4) {
            now += Duration::from_millis(300);
            events.extend(table.poll_failures(now));
        }
        assert!(
            matches!(&events[..], [ClusterEventKind::NodeDead { node, .. }] if node.name == "a")
        );
    }

    /// A live member's name is not for the taking: not the head's (ever),
    /// not another member's while it heartbeats. Before, a join with a
    /// taken name replaced the live owner, and one named like the head
    /// took the cluster down.
    #[test]
    fn a_live_members_name_is_refused_and_freed_by_its_death() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(3);
        let mut table = NodeTable::new(timeout);
        table
            .handle_join(registration("head", 1), true, t0)
            .unwrap();
        table.handle_join(registration("a", 5), false, t0).unwrap();
        let later = t0 + Duration::from_secs(1);
        match table.handle_join(registration("head", 9), false, later) {
            Err(MembershipError::NameTaken { retry_after, .. }) => {
                assert_eq!(retry_after, None, "the head is never declared dead")
            }
            other => panic!("{other:?}"),
        }
        match table.handle_join(registration("a", 7), false, later) {
            Err(MembershipError::NameTaken {
                holder,
                retry_after,
                ..
            }) => {
                assert_eq!(holder.incarnation.0, 5);
                assert_eq!(
                    retry_after,
                    Some(timeout + timeout / 10 - Duration::from_secs(1))
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(table.status(later).nodes.len(), 2);
        assert!(table
            .status(later)
            .nodes
            .iter()
            .all(|n| n.state == NodeState::Alive && n.incarnation != 7 && n.incarnation != 9));
        // Silent for the timeout: declared dead, and the name is free.
        let dead = t0 + timeout + Duration::from_millis(1);
        assert_eq!(table.poll_failures(dead).len(), 1);
        let events = table
            .handle_join(registration("a", 7), false, dead)
            .unwrap();
        assert!(
            matches!(&events[..], [ClusterEventKind::NodeJoined { node, .. }] if node.incarnation.0 == 7)
        );
    }

    #[test]
    fn old_incarnations_are_refused_and_new_ones_replace_a_node_that_left() {
        let t0 = Instant::now();
        let mut table = NodeTable::new(Duration::from_secs(3));
        table.handle_join(registration("a", 5), false, t0).unwrap();
        table.handle_leave(&registration("a", 5).node).unwrap();
        let events = table.handle_join(registration("a", 7), false, t0).unwrap();
        assert!(
            matches!(&events[..], [ClusterEventKind::NodeJoined { node, .. }] if node.incarnation.0 == 7)
        );
        let old = registration("a", 5).node;
        let err = table
            .handle_heartbeat(&old, ResourceSet::default(), t0)
            .unwrap_err();
        assert!(matches!(err, MembershipError::Stale { .. }));
        assert!(table.handle_join(registration("a", 5), false, t0).is_err());
    }

    #[test]
    fn a_dead_incarnation_stays_dead() {
        let t0 = Instant::now();
        let mut table = NodeTable::new(Duration::from_secs(1));
        let a = registration("a", 1);
        table.handle_join(a.clone(), false, t0).unwrap();
        table.poll_failures(t0 + Duration::from_secs(2));
        let later = t0 + Duration::from_secs(3);
        let err = table
            .handle_heartbeat(&a.node, ResourceSet::default(), later)
            .unwrap_err();
        assert!(matches!(err, MembershipError::Dead { .. }));
        assert!(table.handle_join(a, false, later).is_err());
    }

    /// A seeded simulation in virtual time: nodes heartbeat, crash and
    /// restart at random; the detector must declare exactly the crashed
    /// ones dead, within the timeout plus one step. A failure prints its
    /// seed, which replays it.
    #[test]
    fn simulated_crashes_and_restarts_are_detected_and_nothing_else() {
        for seed in 1..=20u64 {
            simulate(seed);
        }
    }

    fn simulate(seed: u64) {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move |bound: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % bound
        };
        let timeout = Duration::from_secs(3);
        let step = Duration::from_millis(250);
        let t0 = Instant::now();
        let mut now = t0;
        let mut table = NodeTable::new(timeout);
        // Per node: incarnation, crashed?, last heartbeat sent, and since
        // when a restart has been trying to join.
        let mut nodes: Vec<(u64, bool, Instant, Option<Instant>)> = Vec::new();
        for i in 0..5 {
            table
                .handle_join(registration(&format!("n{i}"), 1), false, now)
                .unwrap();
            nodes.push((1, false, now, None));
        }
        for _ in 0..2_000 {
            now += step;
            let alive: Vec<bool> = table
                .status(now)
                .nodes
                .iter()
                .map(|n| n.state == NodeState::Alive)
                .collect();
            for (i, (incarnation, crashed, last, joining)) in nodes.iter_mut().enumerate() {
                let name = format!("n{i}");
                match next(100) {
                    0 if !*crashed => *crashed = true,
                    _ if joining.is_some() || (*crashed && next(100) == 0) => {
                        // A restart joins once the old incarnation is dead.
                        let since = *joining.get_or_insert(now);
                        let joined =
                            table.handle_join(registration(&name, *incarnation + 1), false, now);
                        match joined {
                            Ok(_) => {
                                assert!(!alive[i], "seed {seed}: {name} taken over alive");
                                *incarnation += 1;
                                *crashed = false;
                                *last = now;
                                *joining = None;
                            }
                            Err(MembershipError::NameTaken { .. }) => {
                                assert!(alive[i], "seed {seed}: {name} refused, yet dead");
                                assert!(
                                    now - since <= timeout + step,
                                    "seed {seed}: {name} kept out for {:?}",
                                    now - since
                                );
                            }
                            Err(e) => panic!("seed {seed}: {e}"),
                        }
                    }
                    // Live nodes heartbeat at random, but at least every
                    // 500 ms (a sixth of the timeout, as real nodes do).
                    _ if !*crashed
                        && (next(2) == 0 || now - *last >= Duration::from_millis(500)) =>
                    {
                        let node = registration(&name, *incarnation).node;
                        table
                            .handle_heartbeat(&node, ResourceSet::default(), now)
                            .unwrap();
                        *last = now;
                    }
                    _ => {}
                }
            }
            table.poll_failures(now);
            for status in table.status(now).nodes {
                let i: usize = status.id[1..].parse().unwrap();
                let (incarnation, crashed, last, _) = nodes[i];
                assert_eq!(status.incarnation, incarnation, "seed {seed}");
                let silent = now - last;
                if status.state == NodeState::Dead {
                    assert!(
                        crashed && silent > timeout,
                        "seed {seed}: {} declared dead after {silent:?}",
                        status.id
                    );
                } else {
                    assert!(
                        silent <= timeout + step,
                        "seed {seed}: {} silent {silent:?} yet alive",
                        status.id
                    );
                }
            }
        }
    }

    /// A restarted head (`head/store.rs`): the members its store holds
    /// have the grace, not the heartbeat timeout, to come back; the first
    /// heartbeat of the same incarnation confirms one; one that stays
    /// silent is declared dead when the grace ends, saying why; a dead
    /// one stays dead; the previous head's record gives way to the new
    /// head.
    #[test]
    fn a_restarted_heads_members_have_the_grace_to_come_back() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        let mut table = NodeTable::new(Duration::from_secs(3));
        let stored = |name: &str, incarnation, head, dead: Option<&str>| StoredNode {
            registration: registration(name, incarnation),
            head,
            death_reason: dead.map(Into::into),
        };
        let nodes = vec![
            stored("head", 1, true, None),
            stored("a", 5, false, None),
            stored("b", 6, false, None),
            stored("c", 7, false, Some("left the cluster")),
        ];
        table.restore(nodes, grace, t0);
        table
            .handle_join(registration("head", 9), true, t0)
            .unwrap();
        assert_eq!(table.unconfirmed(), 2);
        let a = registration("a", 5).node;
        let mut now = t0;
        let mut deaths = Vec::new();
        while now < t0 + grace + Duration::from_secs(1) {
            now += Duration::from_millis(300);
            if now > t0 + Duration::from_secs(10) {
                let confirming = table.unconfirmed() == 2;
                let events = table
                    .handle_heartbeat(&a, ResourceSet::default(), now)
                    .unwrap();
                if confirming {
                    // News even with nothing in use: spawns may place again.
                    assert!(matches!(
                        &events[..],
                        [ClusterEventKind::ResourcesChanged { node }] if node == &a
                    ));
                    assert_eq!(table.unconfirmed(), 1);
                }
            }
            for event in table.poll_failures(now) {
                deaths.push((now, event));
            }
        }
        assert_eq!(table.unconfirmed(), 0);
        match &deaths[..] {
            [(when, ClusterEventKind::NodeDead { node, reason })] => {
                assert_eq!(node.name, "b");
                assert!(*when > t0 + grace, "declared dead at {:?}", *when - t0);
                assert!(reason.contains("did not come back within 60s"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let status = table.status(now);
        let state = |name: &str| status.nodes.iter().find(|n| n.id == name).unwrap().state;
        assert_eq!(state("a"), NodeState::Alive);
        assert_eq!(state("head"), NodeState::Alive);
        assert_eq!(status.nodes[0].incarnation, 9);
        let c = registration("c", 7).node;
        let err = table
            .handle_heartbeat(&c, ResourceSet::default(), now)
            .unwrap_err();
        assert!(matches!(err, MembershipError::Dead { .. }));
        // A member restarted during the outage waits the heartbeat timeout
        // from the restart, not the grace, for its old incarnation to go.
        let mut table = NodeTable::new(Duration::from_secs(3));
        table.restore(vec![stored("d", 8, false, None)], grace, t0);
        let refused = table.handle_join(registration("d", 10), false, t0 + Duration::from_secs(1));
        match refused {
            Err(MembershipError::NameTaken {
                retry_after: Some(after),
                ..
            }) => assert!(after <= Duration::from_secs(3), "{after:?}"),
            other => panic!("{other:?}"),
        }
        let deaths = table.poll_failures(t0 + Duration::from_millis(3100));
        assert!(
            matches!(&deaths[..], [ClusterEventKind::NodeDead { reason, .. }] if reason.contains("newer incarnation")),
            "{deaths:?}"
        );
        table
            .handle_join(
                registration("d", 10),
                false,
                t0 + Duration::from_millis(3200),
            )
            .unwrap();
    }

    #[test]
    fn leaving_is_reported_once() {
        let t0 = Instant::now();
        let mut table = NodeTable::new(Duration::from_secs(1));
        let a = registration("a", 1);
        table.handle_join(a.clone(), false, t0).unwrap();
        assert_eq!(table.handle_leave(&a.node).unwrap().len(), 1);
        assert!(table.handle_leave(&a.node).is_err());
        assert!(table.poll_failures(t0 + Duration::from_secs(5)).is_empty());
    }
}
