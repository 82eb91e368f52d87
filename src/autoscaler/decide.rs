//! The autoscaler's decisions as a plain state machine, the clock passed
//! in: [`Scaler::decide`] takes one round's view of the cluster and says
//! which nodes to launch and which to stop (the protocol is in
//! [`super`]'s docs, steps 2-5).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::cluster::{AutoscalerReport, NodeTypeReport, ResourceSet, Together, CPU, GPU, MEMORY};

use super::config::{ClusterConfig, NodeType};

/// The first back-off after a failed launch; each failure in a row
/// doubles it, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// The longest back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Launches at once, at least (Ray's `upscaling_speed` floor).
const MIN_LAUNCHES_AT_ONCE: usize = 5;
/// Decisions kept for the report.
const DECISIONS_KEPT: usize = 20;

/// One round's view of the cluster.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The members alive now (the head and hand-started nodes too).
    pub nodes: Vec<ObservedNode>,
    /// What waiting spawns and placement groups ask for, one entry each.
    pub demands: Vec<Wanted>,
    /// The capacity requested ahead of use (`request_resources`): bundles
    /// to fit the nodes' total resources, whatever runs on them.
    pub requested: Vec<ResourceSet>,
}

/// One waiting demand: a spawn's resources (one bundle), or a placement
/// group's bundles and how they must share nodes.
#[derive(Clone, Debug)]
pub struct Wanted {
    /// Its bundles.
    pub bundles: Vec<ResourceSet>,
    /// Where they may go together.
    pub together: Together,
}

impl Wanted {
    /// A spawn's demand.
    pub fn one(resources: ResourceSet) -> Self {
        Wanted {
            bundles: vec![resources],
            together: Together::Loose,
        }
    }

    /// The bundles to pack, larger first: a group that must share one
    /// node packs as one bundle.
    fn to_pack(&self) -> Vec<ResourceSet> {
        let mut bundles = match self.together {
            Together::OneNode => {
                let mut all = ResourceSet::default();
                for bundle in &self.bundles {
                    all.add(bundle);
                }
                vec![all]
            }
            Together::Loose | Together::DistinctNodes => self.bundles.clone(),
        };
        bundles.sort_by(larger_first);
        bundles
    }
}

/// A member, as the head last heard of it.
#[derive(Clone, Debug)]
pub struct ObservedNode {
    /// Its name.
    pub name: String,
    /// What it offers.
    pub total: ResourceSet,
    /// What it has handed out.
    pub used: ResourceSet,
    /// Whether its object store holds the primary copy of an object (it
    /// is not stopped then: the object would be lost).
    pub holds_objects: bool,
}

impl ObservedNode {
    fn idle(&self) -> bool {
        !self.holds_objects && self.used.iter().all(|(_, amount)| amount <= 1e-9)
    }
}

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start a node of `node_type` named `name`.
    Launch {
        /// The node type.
        node_type: String,
        /// The new node's name.
        name: String,
    },
    /// Stop the node `name` (it was launched by this autoscaler).
    Terminate {
        /// The node.
        name: String,
        /// Why, for the log.
        why: String,
    },
}

/// A node this autoscaler launched.
#[derive(Clone, Debug)]
struct Launched {
    node_type: String,
    at: Instant,
    joined: bool,
}

/// A node type whose launches fail.
#[derive(Clone, Debug)]
struct Backoff {
    failures: u32,
    until: Instant,
    why: String,
}

/// The autoscaler's state: its node types and limits, the nodes it
/// launched, how long each has been idle, and which types back off.
#[derive(Debug)]
pub struct Scaler {
    types: Vec<NodeType>,
    max_workers: usize,
    idle_timeout: Duration,
    upscaling_speed: f64,
    launch_timeout: Duration,
    launched: BTreeMap<String, Launched>,
    idle_since: HashMap<String, Instant>,
    backoff: HashMap<String, Backoff>,
    next_index: HashMap<String, u32>,
    decisions: VecDeque<String>,
    decided: u64,
}

impl Scaler {
    /// A scaler for `config`'s node types and limits, having launched nothing.
    pub fn new(config: &ClusterConfig) -> Self {
        Scaler {
            types: config.node_types.clone(),
            max_workers: config.max_workers as usize,
            idle_timeout: config.idle_timeout,
            upscaling_speed: config.upscaling_speed,
            launch_timeout: config.launch_timeout,
            launched: BTreeMap::new(),
            idle_since: HashMap::new(),
            backoff: HashMap::new(),
            next_index: HashMap::new(),
            decisions: VecDeque::new(),
            decided: 0,
        }
    }

    /// Step 1: a node launched before this scaler started (its provider
    /// lists it): counted as launched at `now`, never launched again.
    pub fn adopt(&mut self, name: &str, node_type: &str, now: Instant) {
        if let Some(index) = name
            .strip_prefix(node_type)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse::<u32>().ok())
        {
            let next = self.next_index.entry(node_type.to_string()).or_insert(1);
            *next = (*next).max(index + 1);
        }
        self.launched.insert(
            name.to_string(),
            Launched {
                node_type: node_type.to_string(),
                at: now,
                joined: false,
            },
        );
    }

    /// Step 4: the provider could not launch `name`: forget it, and back
    /// its type off.
    pub fn launch_failed(&mut self, name: &str, why: &str, now: Instant) {
        if let Some(node) = self.launched.remove(name) {
            self.fail(&node.node_type, why, now);
        }
    }

    /// The nodes launched, by name, with their types.
    pub fn launched(&self) -> impl Iterator<Item = (&str, &str)> {
        self.launched
            .iter()
            .map(|(name, node)| (name.as_str(), node.node_type.as_str()))
    }

    /// Steps 2-5: what to launch and stop, given the cluster `observed` at `now`.
    pub fn decide(&mut self, observed: &Observed, now: Instant) -> Vec<Action> {
        let mut actions = self.reconcile(observed, now);
        let (launches, (packed_into, requested)) = self.plan_launches(observed, now);
        for (node_type, why) in launches {
            let name = self.name_for(&node_type);
            self.note(format!("launching {name} ({node_type}) {why}"));
            self.launched.insert(
                name.clone(),
                Launched {
                    node_type: node_type.clone(),
                    at: now,
                    joined: false,
                },
            );
            actions.push(Action::Launch { node_type, name });
        }
        actions.extend(self.stop_idle(observed, (&packed_into, &requested), now));
        actions
    }

    /// Step 2: launched nodes that joined, left, or never joined in time.
    fn reconcile(&mut self, observed: &Observed, now: Instant) -> Vec<Action> {
        let alive: HashSet<&str> = observed.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut actions = Vec::new();
        let mut joined_types = Vec::new();
        let mut gone = Vec::new();
        for (name, node) in self.launched.iter_mut() {
            match (alive.contains(name.as_str()), node.joined) {
                (true, false) => {
                    node.joined = true;
                    joined_types.push(node.node_type.clone());
                }
                (false, true) => gone.push((name.clone(), "it left the cluster".to_string())),
                (false, false) if now.saturating_duration_since(node.at) >= self.launch_timeout => {
                    gone.push((
                        name.clone(),
                        format!(
                            "it did not join within launch_timeout_s ({} s)",
                            self.launch_timeout.as_secs()
                        ),
                    ))
                }
                _ => {}
            }
        }
        for node_type in joined_types {
            self.backoff.remove(&node_type);
        }
        for (name, why) in gone {
            let Some(node) = self.launched.remove(&name) else {
                continue;
            };
            self.idle_since.remove(&name);
            if !node.joined {
                self.fail(&node.node_type, &format!("{name}: {why}"), now);
            }
            self.note(format!("terminating {name}: {why}"));
            actions.push(Action::Terminate { name, why });
        }
        actions
    }

    /// Step 3: the node types to launch (with why), first-fit decreasing
    /// of the demands onto the free resources of the members, the nodes
    /// launching, and new nodes; and the members a demand was packed into
    /// and those the requested capacity was.
    #[allow(clippy::type_complexity)]
    fn plan_launches(
        &mut self,
        observed: &Observed,
        now: Instant,
    ) -> (Vec<(String, String)>, (HashSet<String>, HashSet<String>)) {
        let mut bins: Vec<(Bin, ResourceSet)> = observed
            .nodes
            .iter()
            .map(|n| (Bin::Member(n.name.clone()), n.total.minus(&n.used)))
            .collect();
        for node in self.launched.values().filter(|n| !n.joined) {
            if let Some(t) = self.node_type(&node.node_type) {
                bins.push((Bin::Launching, t.resources.clone()));
            }
        }
        let mut demands: Vec<(Vec<ResourceSet>, bool)> = observed
            .demands
            .iter()
            .map(|d| (d.to_pack(), d.together == Together::DistinctNodes))
            .collect();
        demands.sort_by(|(a, _), (b, _)| larger_first(&a[0], &b[0]));
        let mut counts = self.counts();
        // Per node type: new nodes, and the demands they take.
        let mut planned: Vec<(String, usize, usize)> = Vec::new();
        let mut packed_into = HashSet::new();
        for (bundles, distinct) in demands {
            // The bins this demand used: a strict spread uses each once.
            let mut used = HashSet::new();
            for bundle in bundles.iter().filter(|b| !b.iter().all(|(_, v)| v <= 0.0)) {
                let open = |(i, (_, free)): &(usize, &mut (Bin, ResourceSet))| {
                    bundle.fits_in(free) && !(distinct && used.contains(i))
                };
                if let Some((i, (bin, free))) = bins.iter_mut().enumerate().find(open) {
                    free.subtract(bundle);
                    used.insert(i);
                    match bin {
                        Bin::Member(name) => {
                            packed_into.insert(name.clone());
                        }
                        Bin::Planned(index) => planned[*index].2 += 1,
                        Bin::Launching => {}
                    }
                    continue;
                }
                let Some(t) = self.cheapest_open(bundle, &counts, now) else {
                    continue;
                };
                *counts.entry(t.name.clone()).or_default() += 1;
                let index = match planned.iter().position(|(name, _, _)| *name == t.name) {
                    Some(index) => index,
                    None => {
                        planned.push((t.name.clone(), 0, 0));
                        planned.len() - 1
                    }
                };
                planned[index].1 += 1;
                planned[index].2 += 1;
                used.insert(bins.len());
                bins.push((Bin::Planned(index), t.resources.minus(bundle)));
            }
        }
        let mut launches: Vec<(String, String)> = Vec::new();
        for (node_type, nodes, served) in planned {
            let why = format!("for {served} waiting demand(s)");
            launches.extend(std::iter::repeat_n((node_type, why), nodes));
        }
        for t in &self.types {
            let have = counts.get(&t.name).copied().unwrap_or(0);
            let total: usize = counts.values().sum();
            let short = (t.min as usize).saturating_sub(have);
            for _ in 0..short.min(self.max_workers.saturating_sub(total)) {
                *counts.entry(t.name.clone()).or_default() += 1;
                launches.push((t.name.clone(), format!("to keep min_workers {}", t.min)));
            }
        }
        let joined = self.launched.values().filter(|n| n.joined).count();
        let launching = self.launched.len() - joined;
        let at_once =
            ((self.upscaling_speed * joined as f64).ceil() as usize).max(MIN_LAUNCHES_AT_ONCE);
        launches.truncate(at_once.saturating_sub(launching));
        let (for_requested, requested) = self.plan_requested(observed, &launches, &mut counts, now);
        launches.extend(for_requested);
        (launches, (packed_into, requested))
    }

    /// Step 3, requested capacity: the node types to launch so that the
    /// requested bundles fit, first-fit decreasing, the *total* resources
    /// of the members, the nodes launching and those planned this round
    /// (as Ray's `request_resources`: not added to what runs there, and
    /// not held to the upscaling speed); and the members they fit on.
    fn plan_requested(
        &self,
        observed: &Observed,
        planned: &[(String, String)],
        counts: &mut HashMap<String, usize>,
        now: Instant,
    ) -> (Vec<(String, String)>, HashSet<String>) {
        let launching = self
            .launched
            .values()
            .filter(|n| !n.joined)
            .map(|n| n.node_type.as_str())
            .chain(planned.iter().map(|(node_type, _)| node_type.as_str()));
        let mut bins: Vec<(Option<String>, ResourceSet)> = observed
            .nodes
            .iter()
            .map(|n| (Some(n.name.clone()), n.total.clone()))
            .chain(
                launching
                    .filter_map(|t| self.node_type(t))
                    .map(|t| (None, t.resources.clone())),
            )
            .collect();
        let mut bundles = observed.requested.clone();
        bundles.sort_by(larger_first);
        let mut launches = Vec::new();
        let mut kept = HashSet::new();
        for bundle in bundles.iter().filter(|b| !b.iter().all(|(_, v)| v <= 0.0)) {
            if let Some((member, free)) = bins.iter_mut().find(|(_, free)| bundle.fits_in(free)) {
                free.subtract(bundle);
                kept.extend(member.clone());
                continue;
            }
            let Some(t) = self.cheapest_open(bundle, counts, now) else {
                continue;
            };
            *counts.entry(t.name.clone()).or_default() += 1;
            bins.push((None, t.resources.minus(bundle)));
            launches.push((
                t.name.clone(),
                format!("for the requested resources ({} bundles)", bundles.len()),
            ));
        }
        (launches, kept)
    }

    /// The smallest node type that offers `demand`, may launch another
    /// (its max, `max_workers`) and does not back off.
    fn cheapest_open(
        &self,
        demand: &ResourceSet,
        counts: &HashMap<String, usize>,
        now: Instant,
    ) -> Option<&NodeType> {
        let total: usize = counts.values().sum();
        if total >= self.max_workers {
            return None;
        }
        self.types
            .iter()
            .filter(|t| demand.fits_in(&t.resources))
            .filter(|t| counts.get(&t.name).copied().unwrap_or(0) < t.max as usize)
            .filter(|t| self.backoff.get(&t.name).is_none_or(|b| b.until <= now))
            .min_by(|a, b| larger_first(&b.resources, &a.resources))
    }

    /// Step 5: stops nodes idle for the idle timeout, keeping each type's
    /// min, any node a waiting demand was packed into (it is about to be
    /// used: not idle) and any the requested capacity was packed into
    /// (idle, and kept).
    fn stop_idle(
        &mut self,
        observed: &Observed,
        (packed_into, requested): (&HashSet<String>, &HashSet<String>),
        now: Instant,
    ) -> Vec<Action> {
        let mut counts = self.counts();
        let mut actions = Vec::new();
        for node in &observed.nodes {
            let Some(launched) = self.launched.get(&node.name) else {
                continue;
            };
            if !node.idle() || packed_into.contains(&node.name) {
                self.idle_since.remove(&node.name);
                continue;
            }
            let since = *self.idle_since.entry(node.name.clone()).or_insert(now);
            let idle = now.saturating_duration_since(since);
            let node_type = launched.node_type.clone();
            let min = self.node_type(&node_type).map_or(0, |t| t.min as usize);
            let count = counts.get(&node_type).copied().unwrap_or(0);
            if idle >= self.idle_timeout && count > min && !requested.contains(&node.name) {
                counts.insert(node_type, count - 1);
                self.launched.remove(&node.name);
                self.idle_since.remove(&node.name);
                let why = format!("idle {:.1} s", idle.as_secs_f64());
                self.note(format!("terminating {}: {why}", node.name));
                actions.push(Action::Terminate {
                    name: node.name.clone(),
                    why,
                });
            }
        }
        actions
    }

    /// What the head shows of this scaler at `now`.
    pub fn report(&self, now: Instant) -> AutoscalerReport {
        let node_types = self
            .types
            .iter()
            .map(|t| {
                let of_type = || self.launched.iter().filter(|(_, n)| n.node_type == t.name);
                let mut idle: Vec<(String, u64)> = of_type()
                    .filter_map(|(name, _)| {
                        let since = self.idle_since.get(name)?;
                        Some((
                            name.clone(),
                            now.saturating_duration_since(*since).as_millis() as u64,
                        ))
                    })
                    .collect();
                idle.sort();
                NodeTypeReport {
                    name: t.name.clone(),
                    resources: t.resources.clone(),
                    min: t.min,
                    max: t.max,
                    running: of_type().filter(|(_, n)| n.joined).count() as u32,
                    launching: of_type().filter(|(_, n)| !n.joined).count() as u32,
                    idle,
                    backing_off: self
                        .backoff
                        .get(&t.name)
                        .filter(|b| b.until > now)
                        .map(|b| {
                            (
                                b.why.clone(),
                                b.until.saturating_duration_since(now).as_millis() as u64,
                            )
                        }),
                }
            })
            .collect();
        AutoscalerReport {
            node_types,
            decisions: self.decisions.iter().cloned().collect(),
            max_workers: self.max_workers as u32,
            decided: self.decided,
            pid: 0,
        }
    }

    fn fail(&mut self, node_type: &str, why: &str, now: Instant) {
        let failures = self.backoff.get(node_type).map_or(0, |b| b.failures) + 1;
        let wait = FIRST_BACKOFF
            .saturating_mul(1 << (failures - 1).min(16))
            .min(MAX_BACKOFF);
        self.note(format!(
            "{node_type}: launch failed ({why}); next try in {} s",
            wait.as_secs()
        ));
        self.backoff.insert(
            node_type.to_string(),
            Backoff {
                failures,
                until: now + wait,
                why: why.to_string(),
            },
        );
    }

    fn counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for node in self.launched.values() {
            *counts.entry(node.node_type.clone()).or_default() += 1;
        }
        counts
    }

    fn node_type(&self, name: &str) -> Option<&NodeType> {
        self.types.iter().find(|t| t.name == name)
    }

    fn name_for(&mut self, node_type: &str) -> String {
        let next = self.next_index.entry(node_type.to_string()).or_insert(1);
        let name = format!("{node_type}-{next}");
        *next += 1;
        name
    }

    fn note(&mut self, decision: String) {
        tracing::info!("{decision}");
        if self.decisions.len() == DECISIONS_KEPT {
            self.decisions.pop_front();
        }
        self.decisions.push_back(decision);
        self.decided += 1;
    }
}

/// Where a demand may go in step 3.
enum Bin {
    /// A member's free resources.
    Member(String),
    /// A node launched earlier that has not joined yet.
    Launching,
    /// A node planned this round (its index in the plan).
    Planned(usize),
}

/// The order of demands in step 3, and of node types by size: the
/// larger first, comparing GPUs, then CPUs, then memory, then the rest.
fn larger_first(a: &ResourceSet, b: &ResourceSet) -> std::cmp::Ordering {
    let rest = |r: &ResourceSet| -> f64 {
        r.iter()
            .filter(|(name, _)| ![CPU, GPU, MEMORY].contains(name))
            .map(|(_, amount)| amount)
            .sum()
    };
    let key = |r: &ResourceSet| [r.amount(GPU), r.amount(CPU), r.amount(MEMORY), rest(r)];
    let (a, b) = (key(a), key(b));
    (0..4)
        .map(|i| b[i].total_cmp(&a[i]))
        .find(|order| order.is_ne())
        .unwrap_or(std::cmp::Ordering::Equal)
}
