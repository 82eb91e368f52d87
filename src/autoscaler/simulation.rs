//! The decisions of `decide.rs` against a model cluster, seeded: nodes
//! that join a few seconds after their launch (or fail, or never join),
//! demands that arrive, run for a while on the first node with room, and
//! end. Checked every half second of model time:
//!
//! - the limits (each type's max, `max_workers`) are never exceeded;
//! - no demand waits long while a node type that offers it has room;
//! - a node is stopped only after it has been idle for the idle timeout;
//! - idle nodes go once the work is over, down to each type's min;
//! - a steady load launches and stops nothing once placed;
//! - a demand no type offers launches nothing;
//! - a provider whose launches fail is asked less and less often.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::decide::{Action, Observed, ObservedNode, Scaler, Wanted, FIRST_BACKOFF};
use super::ClusterConfig;
use crate::cluster::{ResourceSet, Together, CPU, GPU};

const STEP: Duration = Duration::from_millis(500);
const IDLE: Duration = Duration::from_secs(20);

fn config() -> ClusterConfig {
    let text = r#"
        max_workers = 5
        idle_timeout_s = 20
        launch_timeout_s = 30
        [provider]
        kind = "local"
        [node_types.small]
        resources = { CPU = 2 }
        max_workers = 4
        [node_types.gpu]
        resources = { CPU = 4, GPU = 1 }
        max_workers = 2
        [node_types.base]
        resources = { CPU = 1 }
        min_workers = 1
        max_workers = 1
    "#;
    ClusterConfig::parse(Path::new("sim.toml"), text).unwrap()
}

/// How the model's provider treats launches.
#[derive(Clone, Copy, PartialEq)]
enum Provider {
    /// Every node joins 1 to 5 s after its launch.
    Reliable,
    /// A fifth of launches fail at once, a fifth never join.
    Flaky,
    /// Every launch fails at once.
    Failing,
}

struct Node {
    node_type: String,
    total: ResourceSet,
    joins_at: Option<Instant>,
    running: Vec<(ResourceSet, Instant)>,
    idle_since: Instant,
}

impl Node {
    fn used(&self) -> ResourceSet {
        let mut used = ResourceSet::default();
        for (r, _) in &self.running {
            used.add(r);
        }
        used
    }
}

struct Demand {
    needs: ResourceSet,
    lasts: Duration,
    room_since: Option<Instant>,
}

struct Model {
    config: ClusterConfig,
    scaler: Scaler,
    nodes: BTreeMap<String, Node>,
    pending: Vec<Demand>,
    rng: StdRng,
    provider: Provider,
    now: Instant,
    launches: Vec<Instant>,
    actions_after: Vec<(Instant, Action)>,
}

impl Model {
    fn new(seed: u64, provider: Provider) -> Self {
        let config = config();
        Model {
            scaler: Scaler::new(&config),
            config,
            nodes: BTreeMap::new(),
            pending: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            provider,
            now: Instant::now(),
            launches: Vec::new(),
            actions_after: Vec::new(),
        }
    }

    fn arrive(&mut self, needs: ResourceSet, lasts: Duration) {
        self.pending.push(Demand {
            needs,
            lasts,
            room_since: None,
        });
    }

    /// One step: work ends, waiting work is placed, nodes join, the
    /// scaler decides, and its actions are checked and applied.
    fn step(&mut self) {
        self.now += STEP;
        let now = self.now;
        for node in self.nodes.values_mut() {
            let before = node.running.len();
            node.running.retain(|(_, ends)| *ends > now);
            if before > 0 && node.running.is_empty() {
                node.idle_since = now;
            }
            if node.joins_at.is_some_and(|at| at <= now) {
                node.joins_at = None;
                node.idle_since = now;
            }
        }
        let mut waiting = Vec::new();
        for demand in std::mem::take(&mut self.pending) {
            let free = self
                .nodes
                .values_mut()
                .filter(|n| n.joins_at.is_none())
                .find(|n| demand.needs.fits_in(&n.total.minus(&n.used())));
            match free {
                Some(node) => node.running.push((demand.needs, now + demand.lasts)),
                None => waiting.push(demand),
            }
        }
        self.pending = waiting;
        if self.provider == Provider::Reliable {
            // With launches that fail, a type backs off: it has no room.
            self.check_waits();
        }
        let observed = Observed {
            nodes: self
                .nodes
                .iter()
                .filter(|(_, n)| n.joins_at.is_none())
                .map(|(name, n)| ObservedNode {
                    name: name.clone(),
                    total: n.total.clone(),
                    used: n.used(),
                    holds_objects: false,
                })
                .collect(),
            demands: self
                .pending
                .iter()
                .map(|d| Wanted::one(d.needs.clone()))
                .collect(),
            requested: Vec::new(),
        };
        for action in self.scaler.decide(&observed, now) {
            self.apply(action);
        }
        self.check_limits();
    }

    fn apply(&mut self, action: Action) {
        let now = self.now;
        self.actions_after.push((now, action.clone()));
        match action {
            Action::Launch { node_type, name } => {
                self.launches.push(now);
                let roll = self.rng.random_range(0..10);
                let fails = match self.provider {
                    Provider::Reliable => false,
                    Provider::Flaky => roll < 2,
                    Provider::Failing => true,
                };
                if fails {
                    self.scaler.launch_failed(&name, "the model refused", now);
                    return;
                }
                let joins = match (self.provider, roll) {
                    (Provider::Flaky, 2 | 3) => now + Duration::from_secs(3600),
                    _ => now + Duration::from_millis(self.rng.random_range(1000..5000)),
                };
                let total = self.config.node_type(&node_type).unwrap().resources.clone();
                self.nodes.insert(
                    name,
                    Node {
                        node_type,
                        total,
                        joins_at: Some(joins),
                        running: Vec::new(),
                        idle_since: now,
                    },
                );
            }
            Action::Terminate { name, why } => {
                let node = self
                    .nodes
                    .remove(&name)
                    .expect("a node the scaler launched");
                if node.joins_at.is_none() {
                    assert!(
                        node.running.is_empty(),
                        "{name} stopped while running work ({why})"
                    );
                    assert!(
                        now.duration_since(node.idle_since) >= IDLE,
                        "{name} stopped after {:?} idle ({why})",
                        now.duration_since(node.idle_since)
                    );
                }
            }
        }
    }

    fn check_limits(&self) {
        let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
        for node in self.nodes.values() {
            *counts.entry(&node.node_type).or_default() += 1;
        }
        for t in &self.config.node_types {
            let count = counts.get(t.name.as_str()).copied().unwrap_or(0);
            assert!(count <= t.max, "{count} {} nodes, max {}", t.name, t.max);
        }
        assert!(self.nodes.len() as u32 <= self.config.max_workers);
    }

    /// No demand waits more than 15 s while a type that offers it has had
    /// room (under its max and `max_workers`) all along.
    fn check_waits(&mut self) {
        let now = self.now;
        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
        for node in self.nodes.values() {
            *counts.entry(node.node_type.clone()).or_default() += 1;
        }
        let total = self.nodes.len() as u32;
        for demand in &mut self.pending {
            let room = total < self.config.max_workers
                && self.config.node_types.iter().any(|t| {
                    demand.needs.fits_in(&t.resources)
                        && counts.get(&t.name).copied().unwrap_or(0) < t.max
                });
            match (room, demand.room_since) {
                (false, _) => demand.room_since = None,
                (true, None) => demand.room_since = Some(now),
                (true, Some(since)) => assert!(
                    now.duration_since(since) <= Duration::from_secs(15),
                    "a demand for {} has waited {:?} with room for it",
                    demand.needs,
                    now.duration_since(since)
                ),
            }
        }
    }

    fn run_for(&mut self, time: Duration, arrivals_per_s: f64) {
        let shapes = [
            ResourceSet::of(CPU, 1.0),
            ResourceSet::of(CPU, 2.0),
            ResourceSet::of(CPU, 2.0).with(GPU, 1.0),
        ];
        for _ in 0..(time.as_millis() / STEP.as_millis()) {
            if self.rng.random_bool(arrivals_per_s * STEP.as_secs_f64()) {
                let shape = shapes[self.rng.random_range(0..shapes.len())].clone();
                let lasts = Duration::from_secs(self.rng.random_range(5..60));
                self.arrive(shape, lasts);
            }
            self.step();
        }
    }

    fn workers(&self) -> usize {
        self.nodes.len()
    }
}

#[test]
fn random_workloads_keep_the_limits_starve_nothing_and_stop_only_idle_nodes() {
    for seed in 0..20 {
        let mut model = Model::new(seed, Provider::Reliable);
        model.run_for(Duration::from_secs(300), 0.3);
        assert!(
            model.launches.len() > 1,
            "seed {seed}: the workload needed nodes"
        );
        // The work ends: every node but the min goes after the idle timeout.
        model.pending.clear();
        model.run_for(Duration::from_secs(60) + IDLE + Duration::from_secs(5), 0.0);
        let left: Vec<&String> = model.nodes.keys().collect();
        assert_eq!(left, ["base-1"], "seed {seed}: only the min stays");
    }
}

#[test]
fn flaky_launches_keep_the_limits_and_are_retried() {
    for seed in 0..20 {
        let mut model = Model::new(seed, Provider::Flaky);
        model.run_for(Duration::from_secs(300), 0.3);
        model.run_for(Duration::from_secs(900), 0.0);
        assert!(
            model.pending.is_empty(),
            "seed {seed}: every demand placed in the end, launches retried"
        );
    }
}

#[test]
fn a_steady_load_launches_and_stops_nothing_once_placed() {
    for seed in 0..10 {
        let mut model = Model::new(seed, Provider::Reliable);
        for _ in 0..3 {
            model.arrive(ResourceSet::of(CPU, 2.0), Duration::from_secs(86_400));
        }
        model.arrive(
            ResourceSet::of(CPU, 2.0).with(GPU, 1.0),
            Duration::from_secs(86_400),
        );
        model.run_for(Duration::from_secs(30), 0.0);
        assert!(model.pending.is_empty(), "seed {seed}: all placed");
        let settled = model.actions_after.len();
        model.run_for(Duration::from_secs(600), 0.0);
        assert_eq!(
            &model.actions_after[settled..],
            &[],
            "seed {seed}: nothing changes under a steady load"
        );
        assert_eq!(
            model.workers(),
            4,
            "base-1, 2 × small for 3 × CPU=2... and one gpu"
        );
    }
}

#[test]
fn a_demand_no_type_offers_launches_nothing() {
    let mut model = Model::new(7, Provider::Reliable);
    model.run_for(Duration::from_secs(5), 0.0);
    let before = model.launches.len();
    model.arrive(ResourceSet::of(GPU, 8.0), Duration::from_secs(10));
    model.arrive(ResourceSet::of("TPU", 1.0), Duration::from_secs(10));
    model.run_for(Duration::from_secs(120), 0.0);
    assert_eq!(model.launches.len(), before, "only the min's launch");
    let report = model.scaler.report(model.now);
    let why = report.type_for(&ResourceSet::of(GPU, 8.0)).unwrap_err();
    assert!(
        why.contains("the largest, gpu, offers CPU=4 GPU=1"),
        "{why}"
    );
}

#[test]
fn failing_launches_back_off_more_each_time() {
    let mut model = Model::new(3, Provider::Failing);
    model.arrive(ResourceSet::of(CPU, 2.0), Duration::from_secs(10));
    model.run_for(Duration::from_secs(600), 0.0);
    let small: Vec<Instant> = model
        .actions_after
        .iter()
        .filter_map(|(at, a)| match a {
            Action::Launch { node_type, .. } if node_type == "small" => Some(*at),
            _ => None,
        })
        .collect();
    let gaps: Vec<Duration> = small.windows(2).map(|w| w[1] - w[0]).take(10).collect();
    assert!(gaps[0] >= FIRST_BACKOFF, "{gaps:?}");
    assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "growing: {gaps:?}");
    assert!(small.len() <= 8, "{} launches in 10 min", small.len());
    let report = model.scaler.report(model.now);
    let small = report
        .node_types
        .iter()
        .find(|t| t.name == "small")
        .unwrap();
    assert!(
        small
            .backing_off
            .as_ref()
            .is_some_and(|(why, _)| why.contains("refused")),
        "{small:?}"
    );
}

/// The node types each launch of one round is for, given `demands` on an
/// empty cluster of `small` (CPU=2, at most 4) and `gpu` (CPU=4 GPU=1).
fn launched_for(demands: Vec<Wanted>) -> Vec<String> {
    let text = "[provider]\nkind = \"local\"\n\
                [node_types.small]\nresources = { CPU = 2 }\nmax_workers = 4\n\
                [node_types.gpu]\nresources = { CPU = 4, GPU = 1 }\nmax_workers = 2\n";
    let config = ClusterConfig::parse(Path::new("groups.toml"), text).unwrap();
    let observed = Observed {
        nodes: Vec::new(),
        demands,
        requested: Vec::new(),
    };
    Scaler::new(&config)
        .decide(&observed, Instant::now())
        .into_iter()
        .map(|action| match action {
            Action::Launch { node_type, .. } => node_type,
            Action::Terminate { name, .. } => panic!("stopped {name} on an empty cluster"),
        })
        .collect()
}

#[test]
fn placement_groups_get_the_nodes_their_strategy_needs() {
    let group = |together| Wanted {
        bundles: vec![ResourceSet::of(CPU, 1.0); 3],
        together,
    };
    assert_eq!(
        launched_for(vec![group(Together::Loose)]),
        ["small", "small"],
        "three CPU=1 bundles anywhere: two CPU=2 nodes"
    );
    assert_eq!(
        launched_for(vec![group(Together::DistinctNodes)]),
        ["small", "small", "small"],
        "a strict spread: a node per bundle"
    );
    assert_eq!(
        launched_for(vec![group(Together::OneNode)]),
        ["gpu"],
        "a strict pack of CPU=3: the one type that holds it all"
    );
    let too_wide = Wanted {
        bundles: vec![ResourceSet::of(CPU, 1.0); 7],
        together: Together::DistinctNodes,
    };
    assert_eq!(
        launched_for(vec![too_wide]).len(),
        5,
        "at most 5 launches at once (the upscaling floor), 6 nodes in all (max_workers)"
    );
}

#[test]
fn requested_capacity_is_launched_kept_while_idle_and_let_go_once_cleared() {
    let text = "idle_timeout_s = 10\n[provider]\nkind = \"local\"\n\
                [node_types.small]\nresources = { CPU = 2 }\nmax_workers = 4\n";
    let config = ClusterConfig::parse(Path::new("requested.toml"), text).unwrap();
    let mut scaler = Scaler::new(&config);
    let start = Instant::now();
    let requested = vec![
        ResourceSet::of(CPU, 2.0),
        ResourceSet::of(CPU, 1.0),
        ResourceSet::of(CPU, 2.0),
    ];
    let mut observed = Observed {
        requested: requested.clone(),
        ..Observed::default()
    };
    let launched: Vec<String> = scaler
        .decide(&observed, start)
        .into_iter()
        .map(|action| match action {
            Action::Launch { name, .. } => name,
            other => panic!("{other:?} on an empty cluster"),
        })
        .collect();
    assert_eq!(
        launched.len(),
        3,
        "two CPU=2 bundles and a CPU=1: three nodes"
    );
    // They join and sit idle: kept, and nothing more is launched, for as
    // long as the request stands, even when their CPUs are in use (the
    // request is for capacity, not added to what runs); shown idle.
    observed.nodes = launched
        .iter()
        .map(|name| ObservedNode {
            name: name.clone(),
            total: ResourceSet::of(CPU, 2.0),
            used: ResourceSet::default(),
            holds_objects: false,
        })
        .collect();
    for second in 1..=120 {
        observed.nodes[0].used = match second > 60 {
            true => ResourceSet::of(CPU, 2.0),
            false => ResourceSet::default(),
        };
        let actions = scaler.decide(&observed, start + Duration::from_secs(second));
        assert!(actions.is_empty(), "at {second} s: {actions:?}");
    }
    let report = scaler.report(start + Duration::from_secs(120));
    assert_eq!(report.node_types[0].idle.len(), 2, "{report:?}");
    // Cleared: the two nodes idle since they joined go at once, the one
    // in use until now once idle for the timeout.
    observed.requested.clear();
    observed.nodes[0].used = ResourceSet::default();
    let mut stopped = Vec::new();
    for second in 121..=140 {
        for action in scaler.decide(&observed, start + Duration::from_secs(second)) {
            match action {
                Action::Terminate { name, .. } => stopped.push((second, name)),
                other => panic!("{other:?} once the request is cleared"),
            }
        }
    }
    let expected = [
        (121, launched[1].clone()),
        (121, launched[2].clone()),
        (131, launched[0].clone()),
    ];
    assert_eq!(stopped, expected);
}
