//! A node's resource accounting: what it offers, what actors and reserved
//! placement-group bundles hold, and which GPU devices (and fractions of
//! them, `gpu_slots.rs`) are free. Pure, so the node manager's decisions
//! are testable without processes.

use std::collections::HashMap;

use super::error::GrantError;
use super::gpu_slots::{GpuSlots, GpuTake};
use crate::cluster::{BundleId, ResourceSet, GPU};

/// What a grant took, to give back on release.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grant {
    /// The GPU devices (and fractions of them) handed to the holder.
    pub gpus: GpuTake,
    /// The bundle it was drawn from, if any.
    pub bundle: Option<BundleId>,
}

/// A reserved bundle: its resources and what its actors use of them.
#[derive(Debug)]
struct Bundle {
    resources: ResourceSet,
    used: ResourceSet,
    gpus: GpuSlots,
}

/// Total, used and reserved resources of one node.
#[derive(Debug)]
pub struct ResourcePool {
    total: ResourceSet,
    used: ResourceSet,
    gpus: GpuSlots,
    bundles: HashMap<BundleId, Bundle>,
}

impl ResourcePool {
    /// A pool offering `total`, whose GPUs are the devices `gpu_ids`.
    pub fn new(total: ResourceSet, gpu_ids: Vec<String>) -> Self {
        ResourcePool {
            total,
            used: ResourceSet::default(),
            gpus: GpuSlots::new(gpu_ids),
            bundles: HashMap::new(),
        }
    }

    /// Each reserved bundle: what it reserves and what its actors use.
    pub fn bundles(&self) -> impl Iterator<Item = (BundleId, &ResourceSet, &ResourceSet)> {
        self.bundles
            .iter()
            .map(|(id, bundle)| (*id, &bundle.resources, &bundle.used))
    }

    /// Everything handed out (actors and reserved bundles).
    pub fn used(&self) -> &ResourceSet {
        &self.used
    }

    /// Takes `request` from the node's free resources, or from `bundle`'s.
    pub fn reserve(
        &mut self,
        request: &ResourceSet,
        bundle: Option<BundleId>,
    ) -> Result<Grant, GrantError> {
        request.validate()?;
        let Some(id) = bundle else {
            check(request, &self.total.minus(&self.used), "node")?;
            let gpus = take_gpus(&mut self.gpus, request, "node")?;
            self.used.add(request);
            return Ok(Grant { gpus, bundle: None });
        };
        let bundle = self.bundles.get_mut(&id).ok_or(GrantError::NoBundle(id))?;
        check(request, &bundle.resources.minus(&bundle.used), "bundle")?;
        let gpus = take_gpus(&mut bundle.gpus, request, "bundle")?;
        bundle.used.add(request);
        Ok(Grant {
            gpus,
            bundle: Some(id),
        })
    }

    /// Gives back what [`reserve`](Self::reserve) took.
    ///
    /// Grants from a bundle released meanwhile go back to the node, which
    /// took over what they held when the bundle was released.
    pub fn release(&mut self, request: &ResourceSet, grant: Grant) {
        match grant.bundle.and_then(|id| self.bundles.get_mut(&id)) {
            Some(bundle) => {
                bundle.used.subtract(request);
                bundle.gpus.give_back(grant.gpus);
            }
            // No bundle (or it was released since, and what its actors held
            // was charged to the node then).
            None => {
                self.used.subtract(request);
                self.gpus.give_back(grant.gpus);
            }
        }
    }

    /// Sets `resources` aside for a placement-group bundle. Reserving the
    /// same bundle twice is harmless.
    pub fn reserve_bundle(
        &mut self,
        id: BundleId,
        resources: &ResourceSet,
    ) -> Result<(), GrantError> {
        if self.bundles.contains_key(&id) {
            return Ok(());
        }
        let grant = self.reserve(resources, None)?;
        let bundle = Bundle {
            resources: resources.clone(),
            used: ResourceSet::default(),
            gpus: GpuSlots::from_take(&grant.gpus),
        };
        self.bundles.insert(id, bundle);
        Ok(())
    }

    /// Returns a bundle's resources to the node. Actors still running in
    /// it keep running; what they hold goes back to the node when they die.
    pub fn release_bundle(&mut self, id: BundleId) {
        if let Some(bundle) = self.bundles.remove(&id) {
            self.used.subtract(&bundle.resources);
            self.used.add(&bundle.used);
            self.gpus.give_back(bundle.gpus.into_take());
        }
    }
}

/// Fails, naming what is short, unless `request` fits in `free`.
fn check(request: &ResourceSet, free: &ResourceSet, scope: &'static str) -> Result<(), GrantError> {
    let short = request.shortfall(free);
    if short.is_empty() {
        Ok(())
    } else {
        Err(GrantError::Short { scope, short })
    }
}

/// Takes the request's GPUs from `slots`, naming `scope` when it cannot.
fn take_gpus(
    slots: &mut GpuSlots,
    request: &ResourceSet,
    scope: &'static str,
) -> Result<GpuTake, GrantError> {
    slots
        .take(request.amount(GPU))
        .map_err(|cause| GrantError::Gpus { scope, cause })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{PlacementGroupId, CPU};

    fn cpus(n: f64) -> ResourceSet {
        ResourceSet::of(CPU, n)
    }

    #[test]
    fn actors_draw_from_the_node_or_from_their_bundle() {
        let mut pool = ResourcePool::new(cpus(4.0), Vec::new());
        let bundle = BundleId {
            group: PlacementGroupId(1),
            index: 0,
        };
        pool.reserve_bundle(bundle, &cpus(2.0)).unwrap();
        assert_eq!(pool.used().amount(CPU), 2.0);
        let in_bundle = pool.reserve(&cpus(2.0), Some(bundle)).unwrap();
        assert!(pool
            .reserve(&cpus(0.5), Some(bundle))
            .unwrap_err()
            .to_string()
            .contains("bundle lacks"));
        let outside = pool.reserve(&cpus(2.0), None).unwrap();
        assert!(pool
            .reserve(&cpus(0.5), None)
            .unwrap_err()
            .to_string()
            .contains("node lacks CPU"));
        pool.release(&cpus(2.0), in_bundle);
        pool.release(&cpus(2.0), outside);
        pool.release_bundle(bundle);
        assert_eq!(pool.used().amount(CPU), 0.0);
    }

    /// A NaN, infinite or negative request (any token holder can send
    /// one) is refused and leaves the accounting as it was; before, a NaN
    /// was granted and made the node's use NaN for good.
    #[test]
    fn amounts_that_are_not_finite_and_positive_are_refused() {
        let mut pool = ResourcePool::new(cpus(4.0), Vec::new());
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let refused = pool.reserve(&cpus(bad), None).unwrap_err();
            assert!(matches!(refused, GrantError::BadAmount(_)), "{refused}");
            let bundle = BundleId {
                group: PlacementGroupId(2),
                index: 0,
            };
            assert!(pool.reserve_bundle(bundle, &cpus(bad)).is_err());
        }
        assert_eq!(pool.used().amount(CPU), 0.0);
        assert!(pool.reserve(&cpus(4.0), None).is_ok());
    }
}
