//! Fault plans: what to inject, when, and where.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::actor::faults::{ActorFault, ActorFaultAction, ACTOR_FAULTS_ENV};
use crate::cluster::faults::WORKERS_KILL_NODE_ENV;
use crate::train::faults::{TrainingFault, TrainingFaultAction, TRAINING_FAULTS_ENV};
use crate::transport::faults::PACKET_FAULTS_ENV;
use crate::transport::{PacketFaults, PacketRule};

/// A chaos plan that cannot be read, or does not fit the cluster.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The text is not a plan.
    #[error("not a chaos plan: {0}")]
    Toml(#[from] toml::de::Error),
    /// A partition with nobody on its side.
    #[error("a partition needs at least one node in `nodes`")]
    EmptyPartition,
    /// A fault names a node the cluster does not have.
    #[error("the plan names node {0:?}, which the cluster does not have")]
    UnknownNode(String),
    /// A partition puts a node on both sides.
    #[error("node {0:?} is on both sides of a partition")]
    BothSides(String),
    /// `degrade_links` given what it sets itself.
    #[error("degrade_links sets its faults' peers and window itself (use `nodes`, `from`, `for_ms`; `partition` for a cut)")]
    DegradeWindow,
    /// `"random"` with no node to pick.
    #[error("\"random\" picks among non-head nodes, and there are none")]
    NoRandomNode,
    /// A packet rule that can never apply: an earlier rule of the same
    /// list applies to all its peers for all its window, and the first
    /// rule that matches a datagram decides.
    #[error("{section} rule {rule} can never apply: rule {by} before it covers its peers and window, and the first matching rule decides (put rule {rule} first)")]
    ShadowedRule {
        /// `packet_faults` or `node_packet_faults`.
        section: &'static str,
        /// The rule that cannot apply (1-based, in plan order).
        rule: usize,
        /// The earlier rule that covers it (1-based).
        by: usize,
    },
}

/// A seeded list of faults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChaosPlan {
    /// Seeds every random choice.
    pub seed: u64,
    /// What the timed faults' `at_ms` count from.
    #[serde(default)]
    pub clock: Clock,
    /// The faults, in any order.
    #[serde(default)]
    pub faults: Vec<PlannedFault>,
    /// Faults triggered by an actor's message count, applied inside worker
    /// processes (the nodes must be started with [`ChaosPlan::node_env`]).
    #[serde(default)]
    pub actor_faults: Vec<ActorFault>,
    /// Faults triggered by training step, applied inside training workers
    /// (the workload's trainer reads them: [`ChaosPlan::workload_env`]).
    #[serde(default)]
    pub training_faults: Vec<TrainingFault>,
    /// Packet faults on the workload process's QUIC socket (everything it
    /// sends and receives: calls to actors, the head): loss, duplication,
    /// reordering, delay, partitions, each in a time window after the
    /// workload starts.
    #[serde(default)]
    pub packet_faults: Option<PacketFaults>,
    /// Packet faults on every node process's socket (and, with `workers =
    /// true`, on their worker processes' sockets), times counted from each
    /// socket's opening.
    #[serde(default)]
    pub node_packet_faults: Option<PacketFaults>,
}

/// What a plan's timed faults count their time from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// The start of the run (when the workload is started).
    #[default]
    Run,
    /// The first actor the cluster starts during the run: the workload
    /// has connected and begun its work, however long it took to start
    /// (a `make run` that builds first, say).
    FirstActor,
}

/// One fault and its trigger (a time after the run starts).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedFault {
    /// Milliseconds after the run starts.
    pub at_ms: u64,
    /// What to do.
    pub action: FaultAction,
}

/// Faults on node processes, actors, and the links between nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[serde(deny_unknown_fields)]
pub enum FaultAction {
    /// SIGKILL the node process.
    KillNode {
        /// Which node.
        node: NodeTarget,
    },
    /// SIGSTOP the node process and its worker processes, and SIGCONT
    /// them `for_ms` later (a stall of the whole node).
    StopNode {
        /// Which node.
        node: NodeTarget,
        /// How long it stays stopped.
        for_ms: u64,
    },
    /// Start the node again (same name and port: a new incarnation).
    RestartNode {
        /// Which node.
        node: NodeTarget,
    },
    /// SIGKILL the worker process of the live actor with this unique name,
    /// or of every live actor of a type (it restarts per its policy).
    KillActor {
        /// The actor's name, or `type:TYPE` (its registered type name).
        actor: String,
    },
    /// Make the live actor with this unique name, or every live actor of a
    /// type, panic (in its worker, as a handler panic does): its death
    /// reason names the plan.
    PanicActor {
        /// The actor's name, or `type:TYPE` (its registered type name).
        actor: String,
    },
    /// Cut the processes of `nodes` (the node processes and the worker
    /// processes of their actors) off from those of `from` for `for_ms`,
    /// both ways, then heal: packet rules added to each process's socket
    /// when the fault fires, which expire on their own.
    Partition {
        /// One side, by node name.
        nodes: Vec<String>,
        /// The other side, by node name (empty: every other node).
        #[serde(default)]
        from: Vec<String>,
        /// How long it lasts.
        for_ms: u64,
    },
    /// Make the links between the processes of `nodes` and those of `from`
    /// lossy or slow for `for_ms`, both ways (as [`FaultAction::Partition`]
    /// does, with these packet faults instead of a cut).
    DegradeLinks {
        /// One side, by node name.
        nodes: Vec<String>,
        /// The other side, by node name (empty: every other node).
        #[serde(default)]
        from: Vec<String>,
        /// How long it lasts.
        for_ms: u64,
        /// What happens to the datagrams between them: `drop`,
        /// `duplicate`, `reorder`, `delay` (fractions), `delay_ms`,
        /// `bandwidth_bytes_per_s`. The fault sets the rule's peers and
        /// window itself.
        faults: PacketRule,
    },
}

impl FaultAction {
    /// The fault in the timeline's words (`kill_node`, `stop_node(800ms)`,
    /// `partition(1000ms)`, `degrade_links(drop=0.1,2000ms)`, ...).
    pub fn label(&self) -> String {
        match self {
            FaultAction::KillNode { .. } => "kill_node".into(),
            FaultAction::StopNode { for_ms, .. } => format!("stop_node({for_ms}ms)"),
            FaultAction::RestartNode { .. } => "restart_node".into(),
            FaultAction::KillActor { .. } => "kill_actor".into(),
            FaultAction::PanicActor { .. } => "panic_actor".into(),
            FaultAction::Partition { for_ms, .. } => format!("partition({for_ms}ms)"),
            FaultAction::DegradeLinks { for_ms, faults, .. } => {
                let mut kinds = faults.kinds();
                kinds.push(format!("{for_ms}ms"));
                format!("degrade_links({})", kinds.join(","))
            }
        }
    }

    /// For faults on links between two sets of nodes: the sides, how long,
    /// and the packet rule each process gets (peers and window filled in
    /// when it fires).
    pub fn link_rule(&self) -> Option<(&[String], &[String], u64, PacketRule)> {
        match self {
            FaultAction::Partition {
                nodes,
                from,
                for_ms,
            } => Some((
                nodes,
                from,
                *for_ms,
                PacketRule {
                    partition: true,
                    ..PacketRule::default()
                },
            )),
            FaultAction::DegradeLinks {
                nodes,
                from,
                for_ms,
                faults,
            } => Some((nodes, from, *for_ms, faults.clone())),
            _ => None,
        }
    }
}

/// A node, by name, or chosen from the seed among the non-head nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum NodeTarget {
    /// This node.
    Named(String),
    /// A non-head node chosen from the seed (`"random"`).
    Random,
}

impl From<String> for NodeTarget {
    fn from(name: String) -> Self {
        if name == "random" {
            NodeTarget::Random
        } else {
            NodeTarget::Named(name)
        }
    }
}

impl From<NodeTarget> for String {
    fn from(target: NodeTarget) -> Self {
        match target {
            NodeTarget::Named(name) => name,
            NodeTarget::Random => "random".into(),
        }
    }
}

/// A fault with its target chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedFault {
    /// When, after the run starts.
    pub at: Duration,
    /// What.
    pub action: FaultAction,
    /// The node's index in the cluster (node faults).
    pub node: usize,
}

impl ChaosPlan {
    /// A plan with this seed and no faults yet.
    pub fn new(seed: u64) -> Self {
        ChaosPlan {
            seed,
            ..ChaosPlan::default()
        }
    }

    /// Environment variables node processes need for the plan's actor and
    /// node packet faults (see [`LocalClusterBuilder::env`](crate::local::LocalClusterBuilder::env)).
    /// A plan with partitions (or degraded links) gives every node and
    /// worker socket a packet fault plan (`workers = true`), so that their
    /// rules can be added to them when they fire.
    pub fn node_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        let kills_nodes_from_workers = self
            .actor_faults
            .iter()
            .any(|f| f.action == ActorFaultAction::KillNode)
            || self
                .training_faults
                .iter()
                .any(|f| matches!(f.action, TrainingFaultAction::KillNode));
        if kills_nodes_from_workers {
            env.push((WORKERS_KILL_NODE_ENV, "1".to_string()));
        }
        if !self.actor_faults.is_empty() {
            let rules = serde_json::to_string(&self.actor_faults).unwrap_or_default();
            env.push((ACTOR_FAULTS_ENV, rules));
        }
        let partitions = self.faults.iter().any(|f| f.action.link_rule().is_some());
        let packets = match (&self.node_packet_faults, partitions) {
            (Some(packets), true) => Some(PacketFaults {
                workers: true,
                ..packets.clone()
            }),
            (Some(packets), false) => Some(packets.clone()),
            (None, true) => Some(PacketFaults {
                workers: true,
                ..PacketFaults::default()
            }),
            (None, false) => None,
        };
        if let Some(packets) = &packets {
            env.push(self.packet_env(packets));
        }
        env
    }

    /// `NIMBUS_PACKET_FAULTS` for `packets`, seeded by the plan's seed (one
    /// seed for the whole plan).
    fn packet_env(&self, packets: &PacketFaults) -> (&'static str, String) {
        let packets = PacketFaults {
            seed: self.seed,
            ..packets.clone()
        };
        let json = serde_json::to_string(&packets).unwrap_or_default();
        (PACKET_FAULTS_ENV, json)
    }

    /// Environment variables the workload (the program run against the
    /// cluster) needs for the plan's training and packet faults.
    pub fn workload_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if !self.training_faults.is_empty() {
            let rules = serde_json::to_string(&self.training_faults).unwrap_or_default();
            env.push((TRAINING_FAULTS_ENV, rules));
        }
        if let Some(packets) = &self.packet_faults {
            env.push(self.packet_env(packets));
        }
        env
    }

    /// Adds a fault at `at` after the start.
    pub fn at(mut self, at: Duration, action: FaultAction) -> Self {
        self.faults.push(PlannedFault {
            at_ms: at.as_millis() as u64,
            action,
        });
        self
    }

    /// Parses a TOML plan.
    pub fn from_toml(text: &str) -> Result<Self, PlanError> {
        let plan: ChaosPlan = toml::from_str(text)?;
        plan.check_packet_rules()?;
        Ok(plan)
    }

    /// Refuses packet rules that can never apply.
    fn check_packet_rules(&self) -> Result<(), PlanError> {
        let sections = [
            ("packet_faults", &self.packet_faults),
            ("node_packet_faults", &self.node_packet_faults),
        ];
        for (section, packets) in sections {
            if let Some((rule, by)) = packets.as_ref().and_then(PacketFaults::shadowed) {
                return Err(PlanError::ShadowedRule {
                    section,
                    rule: rule + 1,
                    by: by + 1,
                });
            }
        }
        Ok(())
    }

    /// The plan as TOML, to print next to a failure for replay.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the plan: {e}"))
    }

    /// The faults in time order, with targets chosen: `nodes` are the
    /// cluster's node names, index 0 the head. `"random"` picks a non-head
    /// node from the seed, and the `k`-th random choice of a plan is always
    /// the same node for the same seed and nodes.
    pub fn resolve(&self, nodes: &[String]) -> Result<Vec<ResolvedFault>, PlanError> {
        self.check_packet_rules()?;
        let mut faults: Vec<&PlannedFault> = self.faults.iter().collect();
        faults.sort_by_key(|f| f.at_ms);
        let mut choices = 0u64;
        faults
            .into_iter()
            .map(|fault| {
                let target = match &fault.action {
                    FaultAction::KillNode { node }
                    | FaultAction::StopNode { node, .. }
                    | FaultAction::RestartNode { node } => node,
                    FaultAction::Partition {
                        nodes: side, from, ..
                    }
                    | FaultAction::DegradeLinks {
                        nodes: side, from, ..
                    } => {
                        if side.is_empty() {
                            return Err(PlanError::EmptyPartition);
                        }
                        for name in side.iter().chain(from) {
                            if !nodes.contains(name) {
                                return Err(PlanError::UnknownNode(name.clone()));
                            }
                        }
                        if let Some(both) = side.iter().find(|n| from.contains(n)) {
                            return Err(PlanError::BothSides(both.clone()));
                        }
                        if let FaultAction::DegradeLinks { faults, .. } = &fault.action {
                            if !faults.peers.is_empty()
                                || faults.partition
                                || faults.from_ms != 0
                                || faults.until_ms.is_some()
                            {
                                return Err(PlanError::DegradeWindow);
                            }
                        }
                        return Ok(ResolvedFault {
                            at: Duration::from_millis(fault.at_ms),
                            action: fault.action.clone(),
                            node: 0,
                        });
                    }
                    // Not a node fault: the actor is found when it fires.
                    FaultAction::KillActor { .. } | FaultAction::PanicActor { .. } => {
                        return Ok(ResolvedFault {
                            at: Duration::from_millis(fault.at_ms),
                            action: fault.action.clone(),
                            node: 0,
                        })
                    }
                };
                let node = match target {
                    NodeTarget::Named(name) => nodes
                        .iter()
                        .position(|n| n == name)
                        .ok_or_else(|| PlanError::UnknownNode(name.clone()))?,
                    NodeTarget::Random if nodes.len() < 2 => return Err(PlanError::NoRandomNode),
                    NodeTarget::Random => {
                        choices += 1;
                        1 + (mix(self.seed, choices) % (nodes.len() as u64 - 1)) as usize
                    }
                };
                Ok(ResolvedFault {
                    at: Duration::from_millis(fault.at_ms),
                    action: fault.action.clone(),
                    node,
                })
            })
            .collect()
    }
}

/// SplitMix64 of the seed and a counter.
fn mix(seed: u64, counter: u64) -> u64 {
    let mut z = seed.wrapping_add(counter.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        ["head", "node-1", "node-2", "node-3"]
            .map(String::from)
            .to_vec()
    }

    #[test]
    fn a_toml_plan_round_trips_and_resolves_the_same_way_for_the_same_seed() {
        let text = r#"
            seed = 7
            [[faults]]
            at_ms = 4000
            action = { restart_node = { node = "random" } }
            [[faults]]
            at_ms = 500
            action = { kill_node = { node = "random" } }
            [[faults]]
            at_ms = 900
            action = { stop_node = { node = "node-1", for_ms = 2000 } }
        "#;
        let plan = ChaosPlan::from_toml(text).unwrap();
        assert_eq!(ChaosPlan::from_toml(&plan.to_toml()).unwrap(), plan);
        let once = plan.resolve(&names()).unwrap();
        assert_eq!(once, plan.resolve(&names()).unwrap());
        assert_eq!(once[0].at, Duration::from_millis(500));
        assert_eq!(once[1].node, 1);
        assert!(
            once.iter().all(|f| f.node != 0),
            "random never picks the head"
        );
        let choices = |seed| {
            let plan = ChaosPlan {
                seed,
                ..plan.clone()
            };
            plan.resolve(&names())
                .unwrap()
                .iter()
                .map(|f| f.node)
                .collect::<Vec<_>>()
        };
        assert!(
            (0..20).any(|seed| choices(seed) != choices(7)),
            "the seed matters"
        );
    }

    #[test]
    fn partitions_name_nodes_the_cluster_has_on_two_sides() {
        let partition = |nodes: &[&str], from: &[&str]| {
            ChaosPlan::new(1).at(
                Duration::from_millis(100),
                FaultAction::Partition {
                    nodes: nodes.iter().map(|n| n.to_string()).collect(),
                    from: from.iter().map(|n| n.to_string()).collect(),
                    for_ms: 500,
                },
            )
        };
        assert!(partition(&["node-1"], &["head"]).resolve(&names()).is_ok());
        let windowed = ChaosPlan::new(1).at(
            Duration::ZERO,
            FaultAction::DegradeLinks {
                nodes: vec!["node-1".into()],
                from: Vec::new(),
                for_ms: 10,
                faults: PacketRule {
                    until_ms: Some(5),
                    ..PacketRule::default()
                },
            },
        );
        let error = windowed.resolve(&names()).unwrap_err().to_string();
        assert!(error.contains("window itself"), "{error}");
        let text = "seed = 1\n[[faults]]\nat_ms = 5\naction = { partition = { nodes = [\"node-2\"], for_ms = 10 } }\n[[faults]]\nat_ms = 9\naction = { degrade_links = { nodes = [\"node-1\"], for_ms = 10, faults = { drop = 0.2 } } }\n";
        let plan = ChaosPlan::from_toml(text).unwrap();
        assert_eq!(ChaosPlan::from_toml(&plan.to_toml()).unwrap(), plan);
        let (_, _, _, rule) = plan.faults[1].action.link_rule().unwrap();
        assert_eq!((rule.drop, rule.partition), (0.2, false));
        let env = plan.node_env();
        assert!(
            env.iter()
                .any(|(k, v)| *k == PACKET_FAULTS_ENV && v.contains("\"workers\":true")),
            "a partition needs fault sockets on nodes and workers: {env:?}"
        );
        for (bad, says) in [
            (partition(&["ghost"], &[]), "ghost"),
            (partition(&[], &["head"]), "at least one node"),
            (partition(&["node-1"], &["node-1"]), "both sides"),
        ] {
            let error = bad.resolve(&names()).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn unknown_nodes_and_bad_plans_are_named() {
        let plan = ChaosPlan::new(1).at(
            Duration::ZERO,
            FaultAction::KillNode {
                node: NodeTarget::Named("ghost".into()),
            },
        );
        let unknown = plan.resolve(&names()).unwrap_err().to_string();
        assert!(unknown.contains("ghost"), "{unknown}");
        let malformed = ChaosPlan::from_toml("seed = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(malformed.contains("not a chaos plan"), "{malformed}");
    }

    #[test]
    fn a_packet_rule_behind_one_that_covers_it_is_refused_by_number() {
        let shadowed = "seed = 1\n[[packet_faults.rules]]\ndrop = 0.05\n[[packet_faults.rules]]\nfrom_ms = 1500\nuntil_ms = 2500\npartition = true\n";
        let error = ChaosPlan::from_toml(shadowed).unwrap_err().to_string();
        assert_eq!(
            error,
            "packet_faults rule 2 can never apply: rule 1 before it covers its peers and window, and the first matching rule decides (put rule 2 first)"
        );
        let reordered = "seed = 1\nclock = \"first_actor\"\n[[packet_faults.rules]]\nfrom_ms = 1500\nuntil_ms = 2500\npartition = true\n[[packet_faults.rules]]\ndrop = 0.05\n";
        let plan = ChaosPlan::from_toml(reordered).unwrap();
        assert_eq!(plan.clock, Clock::FirstActor);
        assert_eq!(ChaosPlan::from_toml(&plan.to_toml()).unwrap(), plan);
    }
}
