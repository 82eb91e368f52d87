//! Capacity asked for ahead of use, as Ray's
//! `ray.autoscaler.sdk.request_resources`: a driver (or a library in one)
//! that knows what it is about to run asks for it, and the autoscaler
//! launches the nodes before the first spawn waits.
//!
//! 1. The driver sends the bundles to the head
//!    (`MembershipRequest::RequestResources`), which keeps the latest
//!    request (it replaces the one before; an empty one clears it) and
//!    shows it in `Status` (`ClusterStatus::requested`, `nimbus status`).
//! 2. Each round the autoscaler packs the bundles onto the nodes' *total*
//!    resources (what runs there does not count: a request is for
//!    capacity, not added to the load) and launches a node of the
//!    smallest fitting type for each bundle that fits nowhere, not held
//!    to `upscaling_speed` (`decide.rs`).
//! 3. The nodes the request fits on are kept, idle or not, until a later
//!    request no longer needs them; then the idle timeout runs as usual.

use crate::cluster::{MembershipReply, MembershipRequest, ResourceSet};
use crate::runtime::ProcessContext;

use super::AutoscalerError;

/// Asks the autoscaler to keep room for `bundles` (each on one node),
/// replacing what this cluster was asked for before; an empty list clears
/// it (step 1). Only a token holder (a driver, the CLI) may ask: actor
/// code starts no machines.
///
/// ```no_run
/// # async fn f() -> Result<(), nimbus::autoscaler::AutoscalerError> {
/// use nimbus::cluster::{ResourceSet, CPU};
/// // Room for 4 workers of 2 CPUs each before the training run starts.
/// nimbus::autoscaler::request_resources(vec![ResourceSet::of(CPU, 2.0); 4]).await?;
/// // ... once it has ended:
/// nimbus::autoscaler::request_resources(Vec::new()).await?;
/// # Ok(()) }
/// ```
pub async fn request_resources(bundles: Vec<ResourceSet>) -> Result<(), AutoscalerError> {
    let context = ProcessContext::current().ok_or(AutoscalerError::NotInitialized)?;
    let request = MembershipRequest::RequestResources { bundles };
    match context.call_head(request).await {
        Ok(MembershipReply::Ack) => Ok(()),
        Ok(other) => Err(AutoscalerError::Request {
            detail: format!("the head answered {other:?}"),
        }),
        Err(e) => Err(AutoscalerError::Request {
            detail: e.to_string(),
        }),
    }
}
