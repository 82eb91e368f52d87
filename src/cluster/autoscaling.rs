//! What the autoscaler tells the head, and the head shows in `nimbus
//! status` and uses to decide whether a spawn may wait for a node that
//! is not there yet (`crate::autoscaler` decides; these are its wire types).

use serde::{Deserialize, Serialize};

use super::ResourceSet;

/// The most node types and decisions a report carries (the head keeps
/// one report: bounded whatever a caller sends).
pub const MAX_REPORTED: usize = 64;

/// The most bundles a `RequestResources` may ask for (the head keeps the
/// latest request: bounded whatever a caller sends).
pub const MAX_REQUESTED_BUNDLES: usize = 1024;

/// The autoscaler's view, sent to the head after each decision round.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AutoscalerReport {
    /// Every node type of its cluster config, in the config's order.
    pub node_types: Vec<NodeTypeReport>,
    /// Its latest decisions, newest last (`launching 1 × cpu-2 for 2
    /// waiting actors`, `terminating cpu-2-1: idle 10.0 s`).
    pub decisions: Vec<String>,
    /// The most worker nodes it runs, all types together.
    pub max_workers: u32,
    /// How many decisions it has made since it started (the head
    /// publishes the ones it has not seen as events).
    #[serde(default)]
    pub decided: u64,
    /// The autoscaler process that reported (0: not said), so that a
    /// reader tells a restarted autoscaler's report from its
    /// predecessor's, which the head keeps until the next one.
    #[serde(default)]
    pub pid: u32,
}

impl AutoscalerReport {
    /// The decisions of this report that a head which saw `seen` decisions
    /// counted (`decided`) in the report before has not seen: the newest
    /// ones (all it carries when the autoscaler started again).
    pub fn new_decisions(&self, seen: u64) -> &[String] {
        let new = match self.decided >= seen {
            true => self.decided - seen,
            false => self.decided,
        };
        let new = new.min(self.decisions.len() as u64) as usize;
        &self.decisions[self.decisions.len() - new..]
    }
}

impl AutoscalerReport {
    /// The first node type whose nodes offer `needs` (a spawn waits for
    /// one: launched now, or once its running nodes have room), or why none
    /// can: `Err("no node type offers it
    /// (the largest, gpu-4, offers CPU=8 GPU=4)")`.
    pub fn type_for(&self, needs: &ResourceSet) -> Result<&NodeTypeReport, String> {
        if let Some(fits) = self.node_types.iter().find(|t| needs.fits_in(&t.resources)) {
            return Ok(fits);
        }
        let largest = self.node_types.iter().max_by(|a, b| {
            let size = |t: &NodeTypeReport| t.resources.iter().map(|(_, v)| v).sum::<f64>();
            size(a).total_cmp(&size(b))
        });
        Err(match largest {
            Some(t) => format!(
                "no node type offers it (the largest, {}, offers {})",
                t.name, t.resources
            ),
            None => "the autoscaler has no node types".to_string(),
        })
    }
}

/// One node type, as the autoscaler last saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeTypeReport {
    /// The type's name in the config (its nodes are named `NAME-N`).
    pub name: String,
    /// What each of its nodes offers.
    pub resources: ResourceSet,
    /// The fewest of its nodes kept running.
    pub min: u32,
    /// The most of its nodes run at once.
    pub max: u32,
    /// Its nodes that are members of the cluster.
    pub running: u32,
    /// Its nodes launched and not yet members.
    pub launching: u32,
    /// Its nodes with nothing to do, and for how long, in milliseconds.
    pub idle: Vec<(String, u64)>,
    /// Why its last launch failed, and in how many milliseconds the next
    /// may be tried (the back-off), while it backs off.
    pub backing_off: Option<(String, u64)>,
}
