//! Choosing nodes for the bundles of a placement group: a pure function of
//! the bundles, the strategy and the nodes' resources.

use serde::{Deserialize, Serialize};

use crate::cluster::ResourceSet;

/// How a placement group's bundles are spread over nodes (Ray's four).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlacementStrategy {
    /// As few nodes as possible; several if one is not enough.
    Pack,
    /// As many nodes as possible; shared if there are too few.
    Spread,
    /// All bundles on one node, or fail.
    StrictPack,
    /// Every bundle on a different node, or fail.
    StrictSpread,
}

/// A node bundles may go to.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Its name.
    pub name: String,
    /// What it has free for new bundles.
    pub free: ResourceSet,
}

/// The node index of each bundle, or `None` if the strategy cannot be met
/// with these free resources.
pub fn plan(
    bundles: &[ResourceSet],
    strategy: PlacementStrategy,
    nodes: &[Candidate],
) -> Option<Vec<usize>> {
    let mut free: Vec<ResourceSet> = nodes.iter().map(|n| n.free.clone()).collect();
    match strategy {
        PlacementStrategy::StrictPack => {
            let total = sum(bundles);
            let node = (0..nodes.len()).find(|&n| total.fits_in(&free[n]))?;
            Some(vec![node; bundles.len()])
        }
        PlacementStrategy::Pack => {
            if let Some(all) = plan(bundles, PlacementStrategy::StrictPack, nodes) {
                return Some(all);
            }
            let mut used: Vec<usize> = Vec::new();
            let mut placed = Vec::new();
            for bundle in bundles {
                let node = used
                    .iter()
                    .copied()
                    .find(|&n| bundle.fits_in(&free[n]))
                    .or_else(|| roomiest(bundle, &free, |_| true))?;
                free[node].subtract(bundle);
                if !used.contains(&node) {
                    used.push(node);
                }
                placed.push(node);
            }
            Some(placed)
        }
        PlacementStrategy::StrictSpread | PlacementStrategy::Spread => {
            let strict = strategy == PlacementStrategy::StrictSpread;
            let mut count = vec![0usize; nodes.len()];
            let mut placed = Vec::new();
            for bundle in bundles {
                let fresh = roomiest(bundle, &free, |n| count[n] == 0);
                let node = match fresh {
                    Some(node) => node,
                    None if strict => return None,
                    None => (0..nodes.len())
                        .filter(|&n| bundle.fits_in(&free[n]))
                        .min_by_key(|&n| count[n])?,
                };
                free[node].subtract(bundle);
                count[node] += 1;
                placed.push(node);
            }
            Some(placed)
        }
    }
}

/// The node with the most free CPU among those `allowed` that fit `bundle`.
fn roomiest(
    bundle: &ResourceSet,
    free: &[ResourceSet],
    allowed: impl Fn(usize) -> bool,
) -> Option<usize> {
    (0..free.len())
        .filter(|&n| allowed(n) && bundle.fits_in(&free[n]))
        .max_by(|&a, &b| {
            free[a]
                .amount(crate::cluster::CPU)
                .total_cmp(&free[b].amount(crate::cluster::CPU))
        })
}

fn sum(bundles: &[ResourceSet]) -> ResourceSet {
    let mut total = ResourceSet::default();
    for bundle in bundles {
        total.add(bundle);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::CPU;

    fn cpus(n: f64) -> ResourceSet {
        ResourceSet::of(CPU, n)
    }

    fn nodes(free: &[f64]) -> Vec<Candidate> {
        free.iter()
            .enumerate()
            .map(|(i, f)| Candidate {
                name: format!("n{i}"),
                free: cpus(*f),
            })
            .collect()
    }

    #[test]
    fn each_strategy_places_as_ray_does() {
        let bundles = vec![cpus(1.0); 3];
        let three = nodes(&[4.0, 4.0, 4.0]);
        assert_eq!(
            plan(&bundles, PlacementStrategy::StrictPack, &three),
            Some(vec![0, 0, 0])
        );
        assert_eq!(
            plan(&bundles, PlacementStrategy::Pack, &three),
            Some(vec![0, 0, 0])
        );
        let mut spread = plan(&bundles, PlacementStrategy::StrictSpread, &three).unwrap();
        spread.sort();
        assert_eq!(spread, vec![0, 1, 2]);

        let small = nodes(&[2.0, 2.0]);
        assert_eq!(plan(&bundles, PlacementStrategy::StrictPack, &small), None);
        assert_eq!(
            plan(&bundles, PlacementStrategy::StrictSpread, &small),
            None
        );
        let packed = plan(&bundles, PlacementStrategy::Pack, &small).unwrap();
        assert_eq!(packed.iter().filter(|&&n| n == packed[0]).count(), 2);
        let spread = plan(&bundles, PlacementStrategy::Spread, &small).unwrap();
        assert!(spread.contains(&0) && spread.contains(&1));
        assert_eq!(plan(&[cpus(5.0)], PlacementStrategy::Pack, &small), None);
    }
}
