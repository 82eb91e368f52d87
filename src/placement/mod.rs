//! Placement groups: bundles of resources reserved together across nodes
//! (Ray's gang reservation), for actors that must be placed as a group,
//! such as a trainer's workers.
//!
//! Creation, from any process of the cluster
//! (`PlacementGroup::create(bundles, strategy, deadline)`):
//! 1. Read the head's resource view and plan the bundles with the strategy
//!    ([`planner::plan`]: `Pack`, `Spread`, `StrictPack`, `StrictSpread`).
//!    If the plan fails even against the nodes' *total* resources, the
//!    group can never be placed: fail at once (`Infeasible`), unless the
//!    cluster's autoscaler may add nodes of its types that make it fit
//!    (`crate::autoscaler`): then wait as below.
//! 2. Ask each chosen node manager to reserve its bundle (`ReserveBundle`).
//!    If one refuses (the view was stale), give back every bundle reserved
//!    so far (`ReleaseBundle`), wait for a cluster event (a heartbeat
//!    reporting changed resource use publishes `ResourcesChanged`), or at
//!    most [`REPLAN_EVERY`], and plan again, until the deadline
//!    (`Timeout`); the first wait tells the head (`GroupWaiting`, a
//!    pending demand an autoscaler launches nodes for), the end too
//!    (`GroupPlaced`). (The view is sampled by heartbeats: resources freed and
//!    taken again between two of them change nothing the head sees, so no
//!    event may ever say that a stale view has become true.) A group is
//!    therefore either wholly reserved or not at all.
//!
//! Actors go into a bundle with [`InBundle::in_bundle`] on their
//! [`SpawnOptions`]; they draw from the bundle's resources on its node,
//! not the node's free ones, and are pinned to that node. `remove`
//! releases every bundle; actors still running in them keep running, and
//! what they hold is charged to the node until they die. The head keeps
//! no placement-group state: node managers own the reservations, the
//! creator owns the group; groups whose creator dies are not cleaned up
//! yet.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nimbus::placement::PlacementError> {
//! use nimbus::cluster::ResourceSet;
//! use nimbus::placement::{PlacementGroup, PlacementStrategy};
//! let bundle = ResourceSet::of("CPU", 1.0);
//! let group = PlacementGroup::create(vec![bundle; 4], PlacementStrategy::Spread, std::time::Duration::from_secs(10)).await?;
//! group.remove().await?;
//! # Ok(()) }
//! ```

pub mod planner;

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::actor::SpawnOptions;
use crate::client::{self, ClientError};
use crate::cluster::{
    AutoscalerReport, BundleId, BundleReply, DirectoryRequest, GroupDemand, MembershipReply,
    NodeState, NodeStatus, PlacementGroupId, ResourceSet, Subsystem, Together,
};
use crate::cluster::{BundleRequest, MembershipRequest};
use crate::runtime::ProcessContext;
use crate::transport::RequestOptions;

pub use planner::PlacementStrategy;

/// The longest a creation that did not fit waits for a cluster event
/// before it plans again (step 2).
pub const REPLAN_EVERY: Duration = Duration::from_secs(1);

/// Why a placement group could not be created or removed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// `nimbus::init` and `Driver::connect` have not run in this process.
    #[error("nimbus is not initialised in this process: call nimbus::init(..) and Driver::connect() first")]
    NotInitialized,
    /// The cluster could never hold these bundles with this strategy.
    #[error(
        "no placement of {bundles} bundles with {strategy:?} fits the cluster's nodes: {detail}"
    )]
    Infeasible {
        /// Number of bundles.
        bundles: usize,
        /// The strategy.
        strategy: PlacementStrategy,
        /// What the nodes offer.
        detail: String,
    },
    /// It could, but not before the deadline.
    #[error("the placement group was not ready within {after:?}: {last}")]
    Timeout {
        /// The deadline.
        after: Duration,
        /// The last obstacle.
        last: String,
    },
    /// A bundle index out of range.
    #[error("the placement group has no bundle {0}")]
    NoSuchBundle(usize),
    /// A bundle asks for a negative, infinite or NaN amount.
    #[error("invalid bundle {index}: {cause}")]
    BadBundle {
        /// The bundle.
        index: usize,
        /// What is wrong with it.
        cause: crate::cluster::ResourceError,
    },
    /// The cluster could not be reached.
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[from] ClientError),
}

/// Spawn options placed in a bundle of a placement group.
///
/// ```no_run
/// # async fn demo(group: nimbus::placement::PlacementGroup) -> Result<(), nimbus::placement::PlacementError> {
/// use nimbus::placement::InBundle;
/// let options = nimbus::actor::SpawnOptions::default().num_cpus(0.5).in_bundle(&group, 0)?;
/// # Ok(()) }
/// ```
pub trait InBundle: Sized {
    /// Places it in bundle `index` of `group`: on that bundle's node,
    /// drawing from the bundle's resources.
    fn in_bundle(self, group: &PlacementGroup, index: usize) -> Result<Self, PlacementError>;
}

impl InBundle for SpawnOptions {
    fn in_bundle(self, group: &PlacementGroup, index: usize) -> Result<Self, PlacementError> {
        Ok(self.bundle(group.bundle(index)?, group.node(index)?))
    }
}

/// A reserved placement group: each bundle's resources and node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementGroup {
    id: PlacementGroupId,
    bundles: Vec<Placed>,
}

/// One reserved bundle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Placed {
    resources: ResourceSet,
    node: NodeStatus,
}

impl PlacementGroup {
    /// Reserves `bundles` with `strategy`, waiting up to `deadline` for
    /// room.
    pub async fn create(
        bundles: Vec<ResourceSet>,
        strategy: PlacementStrategy,
        deadline: Duration,
    ) -> Result<Self, PlacementError> {
        let context = ProcessContext::current().ok_or(PlacementError::NotInitialized)?;
        for (index, bundle) in bundles.iter().enumerate() {
            bundle
                .validate()
                .map_err(|cause| PlacementError::BadBundle { index, cause })?;
        }
        let id = PlacementGroupId(rand::random());
        let end = Instant::now() + deadline;
        let mut waited = false;
        let created = loop {
            let seen = context.last_event().await?;
            let (nodes, autoscaler) = cluster_view(context).await?;
            let totals: Vec<planner::Candidate> = nodes
                .iter()
                .map(|n| candidate(n, &n.resources.total))
                .collect();
            let last = if planner::plan(&bundles, strategy, &totals).is_none() {
                // Step 1: never placeable, unless the autoscaler can add
                // nodes that make it so.
                match autoscaler
                    .as_ref()
                    .filter(|a| fits_grown(&bundles, strategy, &totals, a))
                {
                    Some(_) => "waiting for the autoscaler to launch nodes for it".to_string(),
                    None => break Err(infeasible(&bundles, strategy, &nodes, autoscaler.as_ref())),
                }
            } else {
                let free: Vec<planner::Candidate> =
                    nodes.iter().map(|n| candidate(n, &free_of(n))).collect();
                match planner::plan(&bundles, strategy, &free) {
                    Some(plan) => {
                        let placed: Vec<Placed> = plan
                            .iter()
                            .zip(&bundles)
                            .map(|(&n, resources)| Placed {
                                resources: resources.clone(),
                                node: nodes[n].clone(),
                            })
                            .collect();
                        let group = PlacementGroup {
                            id,
                            bundles: placed,
                        };
                        match group.reserve(context).await {
                            Ok(None) => break Ok(group),
                            Ok(Some(refusal)) => refusal,
                            Err(e) => break Err(e),
                        }
                    }
                    None => format!(
                        "the nodes' free resources do not fit it now ({})",
                        free_now(&free)
                    ),
                }
            };
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(PlacementError::Timeout {
                    after: deadline,
                    last,
                });
            }
            if !waited {
                // Step 2: the head lists it as a pending demand.
                let waiting = DirectoryRequest::GroupWaiting {
                    group: GroupDemand {
                        id,
                        bundles: bundles.clone(),
                        together: together(strategy),
                    },
                    job: context.job.clone(),
                    for_ms: left.as_millis() as u64,
                };
                waited = context.call_head(waiting).await.is_ok();
            }
            context.events(seen, left.min(REPLAN_EVERY)).await?;
        };
        if waited {
            let placed = DirectoryRequest::GroupPlaced(id);
            if let Err(e) = context.call_head(placed).await {
                tracing::debug!(
                    "cannot tell the head that placement group {id:?} stopped waiting: {e}"
                );
            }
        }
        created
    }

    /// The group's id.
    pub fn id(&self) -> PlacementGroupId {
        self.id
    }

    /// Number of bundles.
    pub fn len(&self) -> usize {
        self.bundles.len()
    }

    /// Whether the group has no bundles.
    pub fn is_empty(&self) -> bool {
        self.bundles.is_empty()
    }

    /// The node holding bundle `index`.
    pub fn node(&self, index: usize) -> Result<&str, PlacementError> {
        self.bundles
            .get(index)
            .map(|b| b.node.id.as_str())
            .ok_or(PlacementError::NoSuchBundle(index))
    }

    /// The address of the node holding bundle `index`.
    pub fn address(&self, index: usize) -> Result<std::net::SocketAddr, PlacementError> {
        self.bundles
            .get(index)
            .map(|b| b.node.address)
            .ok_or(PlacementError::NoSuchBundle(index))
    }

    /// Bundle `index`'s id.
    pub fn bundle(&self, index: usize) -> Result<BundleId, PlacementError> {
        if index >= self.bundles.len() {
            return Err(PlacementError::NoSuchBundle(index));
        }
        Ok(BundleId {
            group: self.id,
            index: index as u32,
        })
    }

    /// Gives every bundle's resources back to its node.
    pub async fn remove(self) -> Result<(), PlacementError> {
        let context = ProcessContext::current().ok_or(PlacementError::NotInitialized)?;
        self.release(context, self.bundles.len()).await;
        Ok(())
    }

    /// Reserves every bundle; on a refusal, releases those reserved and
    /// returns the refusal.
    async fn reserve(&self, context: &ProcessContext) -> Result<Option<String>, PlacementError> {
        for (index, placed) in self.bundles.iter().enumerate() {
            let request = BundleRequest::ReserveBundle {
                bundle: self.bundle(index)?,
                resources: placed.resources.clone(),
                job: context.job.clone(),
            };
            let refusal = match call_node(context, &placed.node, request).await {
                Ok(BundleReply::Ack) => continue,
                Ok(BundleReply::NoCapacity(short)) => short,
                Ok(other) => format!("unexpected reply {other:?}"),
                Err(e) => e.to_string(),
            };
            self.release(context, index).await;
            return Ok(Some(refusal));
        }
        Ok(None)
    }

    /// Releases the first `count` bundles (best effort: a lost node's
    /// reservations are gone with it).
    async fn release(&self, context: &ProcessContext, count: usize) {
        for (index, placed) in self.bundles.iter().take(count).enumerate() {
            let bundle = BundleId {
                group: self.id,
                index: index as u32,
            };
            if let Err(e) =
                call_node(context, &placed.node, BundleRequest::ReleaseBundle(bundle)).await
            {
                tracing::warn!(%bundle, node = %placed.node.id, "cannot release a bundle: {e}");
            }
        }
    }
}

async fn call_node<R: Subsystem>(
    context: &ProcessContext,
    node: &NodeStatus,
    request: R,
) -> Result<R::Reply, ClientError> {
    let connection = context
        .endpoint
        .connect(node.address, Some(&node.identity()))
        .await?;
    client::call(&connection, request, RequestOptions::control()).await
}

/// The alive nodes, and the autoscaler's report if the cluster has one.
async fn cluster_view(
    context: &ProcessContext,
) -> Result<(Vec<NodeStatus>, Option<AutoscalerReport>), ClientError> {
    match context.call_head(MembershipRequest::Status).await? {
        MembershipReply::Status(status) => Ok((
            status
                .nodes
                .into_iter()
                .filter(|n| n.state == NodeState::Alive)
                .collect(),
            status.autoscaler,
        )),
        reply => Err(ClientError::from(crate::cluster::UnexpectedReply::new(
            "Status", reply,
        ))),
    }
}

/// Whether `bundles` fit `totals` with the nodes the autoscaler is
/// launching and as many more of each type as it may still launch.
fn fits_grown(
    bundles: &[ResourceSet],
    strategy: PlacementStrategy,
    totals: &[planner::Candidate],
    autoscaler: &AutoscalerReport,
) -> bool {
    let running: u32 = autoscaler
        .node_types
        .iter()
        .map(|t| t.running + t.launching)
        .sum();
    let mut room = autoscaler.max_workers.saturating_sub(running) as usize;
    let mut grown = totals.to_vec();
    for t in &autoscaler.node_types {
        // Its launching nodes are not members yet; then what it may add.
        let more = (t.max.saturating_sub(t.running + t.launching) as usize).min(room);
        room -= more;
        for i in 0..(t.launching as usize + more).min(bundles.len()) {
            grown.push(planner::Candidate {
                name: format!("{} (to launch, {i})", t.name),
                free: t.resources.clone(),
            });
        }
    }
    planner::plan(bundles, strategy, &grown).is_some()
}

fn infeasible(
    bundles: &[ResourceSet],
    strategy: PlacementStrategy,
    nodes: &[NodeStatus],
    autoscaler: Option<&AutoscalerReport>,
) -> PlacementError {
    let mut detail: Vec<String> = nodes
        .iter()
        .map(|n| format!("{} offers {}", n.id, n.resources.total))
        .collect();
    if let Some(autoscaler) = autoscaler {
        let types: Vec<String> = autoscaler
            .node_types
            .iter()
            .map(|t| format!("{} ({}, at most {})", t.name, t.resources, t.max))
            .collect();
        detail.push(format!(
            "the autoscaler may add nodes of types {} (at most {} workers), which do not fit it either",
            types.join(", "),
            autoscaler.max_workers
        ));
    }
    PlacementError::Infeasible {
        bundles: bundles.len(),
        strategy,
        detail: detail.join("; "),
    }
}

/// What the autoscaler must honour of `strategy`.
fn together(strategy: PlacementStrategy) -> Together {
    match strategy {
        PlacementStrategy::StrictSpread => Together::DistinctNodes,
        PlacementStrategy::StrictPack => Together::OneNode,
        PlacementStrategy::Pack | PlacementStrategy::Spread => Together::Loose,
    }
}

fn candidate(node: &NodeStatus, free: &ResourceSet) -> planner::Candidate {
    planner::Candidate {
        name: node.id.clone(),
        free: free.clone(),
    }
}

fn free_of(node: &NodeStatus) -> ResourceSet {
    node.resources.total.minus(&node.resources.used)
}

/// What each node has free (the candidates just planned on), for a group
/// that does not fit them.
fn free_now(free: &[planner::Candidate]) -> String {
    let named: Vec<String> = free
        .iter()
        .map(|c| format!("{} has {} free", c.name, c.free))
        .collect();
    named.join("; ")
}
