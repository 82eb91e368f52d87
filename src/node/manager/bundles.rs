//! Placement-group bundles reserved on this node's resources, released
//! and listed.

use actix::prelude::*;

use crate::cluster::{BundleId, BundleListing, ResourceSet};

use super::NodeManager;
use crate::node::authorize::{Confinement, Forbidden};
use crate::node::error::NoCapacity;

/// Set resources aside for a placement-group bundle.
#[derive(Message)]
#[rtype(result = "Result<(), NoCapacity>")]
pub struct ReserveBundle {
    /// The bundle.
    pub bundle: BundleId,
    /// Its resources.
    pub resources: ResourceSet,
    /// The job whose placement group it is.
    pub job: String,
}

/// Give a bundle's resources back; asked by a worker (`confined`), only a
/// bundle of its job.
#[derive(Message)]
#[rtype(result = "Result<(), Forbidden>")]
pub struct ReleaseBundle {
    /// The bundle.
    pub bundle: BundleId,
    /// Asked by a worker: only its job's bundles.
    pub confined: Option<Confinement>,
}

/// The bundles this node holds.
#[derive(Message)]
#[rtype(result = "Vec<BundleListing>")]
pub struct ListBundles;

impl Handler<ListBundles> for NodeManager {
    type Result = MessageResult<ListBundles>;

    fn handle(&mut self, _: ListBundles, _: &mut Self::Context) -> Self::Result {
        let mut listed: Vec<BundleListing> = self
            .resources
            .bundles()
            .map(|(bundle, resources, used)| BundleListing {
                bundle,
                resources: resources.clone(),
                used: used.clone(),
                job: self.bundle_jobs.get(&bundle).cloned().unwrap_or_default(),
            })
            .collect();
        listed.sort_by_key(|b| b.bundle);
        MessageResult(listed)
    }
}

impl Handler<ReserveBundle> for NodeManager {
    type Result = Result<(), NoCapacity>;

    fn handle(&mut self, msg: ReserveBundle, _: &mut Self::Context) -> Self::Result {
        self.resources
            .reserve_bundle(msg.bundle, &msg.resources)
            .map_err(|cause| self.no_capacity(cause))?;
        self.bundle_jobs.insert(msg.bundle, msg.job);
        Ok(())
    }
}

impl Handler<ReleaseBundle> for NodeManager {
    type Result = Result<(), Forbidden>;

    fn handle(&mut self, msg: ReleaseBundle, _: &mut Self::Context) -> Self::Result {
        let bundle = msg.bundle;
        let job = self.bundle_jobs.get(&bundle).map(String::as_str);
        // A bundle not held here is not released, whoever asks.
        if let (Some(confined), Some(job)) = (&msg.confined, job) {
            let rule = "a worker releases its own job's bundles only";
            confined.allows("ReleaseBundle", Some(job), rule)?;
        }
        self.resources.release_bundle(bundle);
        self.bundle_jobs.remove(&bundle);
        Ok(())
    }
}
