//! Jobs and their drivers: what a driver program creates is its job's, and
//! is cleaned up when the driver is gone (Ray's job ownership).
//!
//! 1. A driver sends `DriverAlive { job }` to the head every
//!    [`DRIVER_BEAT`] (1 s) while it runs (`crate::driver`).
//! 2. The head's [`JobTable`] keeps when it last heard from each job. A job
//!    not heard from for the grace period (`--driver-grace-s`, default
//!    [`DEFAULT_DRIVER_GRACE`], 30 s) ends: its driver died, was killed, or
//!    lost the head for that long. An ended job stays ended: a driver heard
//!    from again after that is told nothing, its actors are gone.
//! 3. For an ended job the head sends `EndJob { job }` to every live node
//!    and publishes `JobEnded`. Each node kills the job's actors (not the
//!    detached ones, `SpawnOptions::detached`) for good, which gives back
//!    their resources and task leases, and releases the job's
//!    placement-group bundles (`crate::node`'s `manager.rs`).
//!
//! Not yet: a job's object references are not dropped (a driver's holds
//! stay until their owners stop), and jobs are not persisted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{info, warn};

use super::events::{ClusterEvents, Publish};
use super::membership::{self, Membership};
use crate::cluster::{ClusterEventKind, ControlRequest, JobRequest};
use crate::transport::{Endpoint, RequestOptions};

pub use crate::cluster::DRIVER_BEAT;
/// How long a job's driver may be silent before the job ends.
pub const DEFAULT_DRIVER_GRACE: Duration = Duration::from_secs(30);
/// How often the head looks for jobs past their grace.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// The jobs the head has heard of, as a plain state machine (time passed
/// in).
#[derive(Debug, Default)]
pub struct JobTable {
    /// Live jobs: when each was last heard from.
    alive: HashMap<String, Instant>,
    /// Jobs that ended.
    ended: HashMap<String, String>,
}

impl JobTable {
    /// Step 2: `job`'s driver is alive at `now`; false for a job that ended.
    pub fn heard(&mut self, job: &str, now: Instant) -> bool {
        if self.ended.contains_key(job) {
            return false;
        }
        self.alive.insert(job.to_string(), now);
        true
    }

    /// Step 2: the jobs silent for longer than `grace` at `now`, which end
    /// now (each once), with the reason.
    pub fn expire(&mut self, now: Instant, grace: Duration) -> Vec<(String, String)> {
        let silent: Vec<String> = self
            .alive
            .iter()
            .filter(|(_, seen)| now.saturating_duration_since(**seen) > grace)
            .map(|(job, _)| job.clone())
            .collect();
        silent
            .into_iter()
            .map(|job| {
                self.alive.remove(&job);
                let reason = format!("its driver was not heard from for {grace:?}");
                self.ended.insert(job.clone(), reason.clone());
                (job, reason)
            })
            .collect()
    }

    /// Whether `job` ended.
    pub fn has_ended(&self, job: &str) -> bool {
        self.ended.contains_key(job)
    }
}

/// The head's job keeper: a thin shell around [`JobTable`].
pub struct Jobs {
    table: JobTable,
    grace: Duration,
    endpoint: Endpoint,
    membership: Addr<Membership>,
    events: Addr<ClusterEvents>,
}

impl Jobs {
    /// A keeper that ends jobs silent for `grace`, telling the nodes
    /// `membership` lists through `endpoint`.
    pub fn new(
        grace: Duration,
        endpoint: Endpoint,
        membership: Addr<Membership>,
        events: Addr<ClusterEvents>,
    ) -> Self {
        Jobs {
            table: JobTable::default(),
            grace,
            endpoint,
            membership,
            events,
        }
    }
}

impl Actor for Jobs {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(CHECK_EVERY, |jobs, ctx| {
            for (job, reason) in jobs.table.expire(Instant::now(), jobs.grace) {
                info!(%job, "job ended: {reason}; killing its actors and releasing its bundles");
                let end = end_job(
                    jobs.endpoint.clone(),
                    jobs.membership.clone(),
                    jobs.events.clone(),
                    job,
                    reason,
                );
                ctx.spawn(end.into_actor(jobs));
            }
        });
    }
}

/// Step 3: every live node ends `job`; then `JobEnded` is published.
async fn end_job(
    endpoint: Endpoint,
    membership: Addr<Membership>,
    events: Addr<ClusterEvents>,
    job: String,
    reason: String,
) {
    let Ok(status) = membership.send(membership::Status).await else {
        return;
    };
    let request = ControlRequest::Jobs(JobRequest::EndJob { job: job.clone() });
    let Ok(body) = rmp_serde::to_vec_named(&request) else {
        return;
    };
    for node in status.alive() {
        let ended = match endpoint.connect(node.address, Some(&node.identity())).await {
            Ok(connection) => connection
                .request(body.clone(), RequestOptions::control())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = ended {
            warn!(%job, node = %node.id, "could not end the job there: {e}");
        }
    }
    events.do_send(Publish(ClusterEventKind::JobEnded { job, reason }));
}

/// Step 1, at the head: a driver of `job` is alive. Answers false for a
/// job that ended.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct DriverAlive(pub String);

impl Handler<DriverAlive> for Jobs {
    type Result = bool;

    fn handle(&mut self, DriverAlive(job): DriverAlive, _: &mut Self::Context) -> bool {
        self.table.heard(&job, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_ends_once_after_its_grace_and_stays_ended() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        assert!(table.heard("a", t0));
        assert!(table.heard("b", t0));
        assert!(table.heard("a", t0 + Duration::from_secs(20)));
        assert!(
            table.expire(t0 + grace, grace).is_empty(),
            "not past it yet"
        );
        let ended = table.expire(t0 + grace + Duration::from_secs(1), grace);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].0, "b");
        assert!(table.has_ended("b") && !table.has_ended("a"));
        assert!(table
            .expire(t0 + grace * 2, grace)
            .iter()
            .all(|(job, _)| job == "a"));
        assert!(
            !table.heard("b", t0 + grace * 3),
            "an ended job stays ended"
        );
        assert!(table.expire(t0 + grace * 9, grace).is_empty());
    }
}
