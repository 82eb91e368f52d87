//! The ingress's routing decisions, as plain state with the clock passed
//! in: which deployment a path goes to, and which of its replicas takes a
//! request.
//!
//! 1. **Route**: the longest route prefix that is the path, or a
//!    `/`-separated start of it (`/a` takes `/a` and `/a/b`, not `/ab`).
//! 2. **Pick** (power of two choices): two replicas drawn at random among
//!    those up, not held down and below `max_ongoing`; the one with fewer
//!    requests takes it (this ingress's in flight, plus the others' last
//!    reported by the replica in its answers).
//! 3. **Queue**: every replica full, or none at all (an application
//!    scaled to zero), the request waits (up to `max_queued` per
//!    deployment on this ingress) for one to finish or start; past that
//!    it is refused (503 with `Retry-After`). The controller reads how
//!    many wait ([`Router::waiting`]) as load for its autoscaling.
//! 4. **Faults**: a replica that failed a call is held down for
//!    [`DOWN_HOLD`] or until the controller's next route table says it is
//!    up after a health check.

use std::time::{Duration, Instant};

use nimbus::cluster::ActorId;

/// How long a replica that failed a call is left out of picks on this
/// ingress (unless the controller's health check finds it up sooner).
pub const DOWN_HOLD: Duration = Duration::from_secs(2);

/// One deployment's route, as the controller publishes it.
#[derive(Clone, Debug)]
pub(crate) struct RouteSpec<H> {
    pub(crate) prefix: String,
    pub(crate) deployment: String,
    pub(crate) max_ongoing: u32,
    pub(crate) max_queued: u32,
    /// The replicas, with whether the controller's last health check
    /// found each up.
    pub(crate) replicas: Vec<(ActorId, H, bool)>,
}

struct Slot<H> {
    id: ActorId,
    handle: H,
    up: bool,
    /// Requests this ingress has in flight on it.
    ongoing: u32,
    /// The others' requests, from its last answer.
    others: u32,
    down_until: Option<Instant>,
}

struct Route<H> {
    prefix: String,
    deployment: String,
    max_ongoing: u32,
    max_queued: u32,
    replicas: Vec<Slot<H>>,
    waiting: u32,
}

/// Where a request goes.
#[derive(Debug, PartialEq)]
pub(crate) enum Pick<H> {
    /// To this replica (its in-flight count is taken).
    Send { replica: ActorId, handle: H },
    /// Every replica is full: wait for one to finish, then pick again.
    Wait,
    /// Every replica full and `max_queued` requests waiting: refuse.
    Overloaded { deployment: String },
    /// No replica of the deployment is up.
    NoReplica { deployment: String },
    /// No route takes the path.
    NotFound,
}

/// The routes of one ingress.
pub(crate) struct Router<H> {
    routes: Vec<Route<H>>,
}

impl<H: Clone> Router<H> {
    pub(crate) fn new() -> Self {
        Router { routes: Vec::new() }
    }

    /// Replaces the route table, keeping what this ingress knows of the
    /// replicas that stay (their in-flight counts; a hold is lifted where
    /// the controller found the replica up since).
    pub(crate) fn set(&mut self, specs: Vec<RouteSpec<H>>) {
        let mut old: Vec<Route<H>> = std::mem::take(&mut self.routes);
        for spec in specs {
            let before = old.iter_mut().find(|route| route.prefix == spec.prefix);
            let waiting = before.as_ref().map_or(0, |route| route.waiting);
            let mut kept: Vec<Slot<H>> = before
                .map(|route| std::mem::take(&mut route.replicas))
                .unwrap_or_default();
            let replicas = spec
                .replicas
                .into_iter()
                .map(|(id, handle, up)| {
                    let known = kept.iter_mut().find(|slot| slot.id == id);
                    let (ongoing, others) = known.map_or((0, 0), |s| (s.ongoing, s.others));
                    Slot {
                        id,
                        handle,
                        up,
                        ongoing,
                        others,
                        down_until: None,
                    }
                })
                .collect();
            self.routes.push(Route {
                prefix: spec.prefix,
                deployment: spec.deployment,
                max_ongoing: spec.max_ongoing.max(1),
                max_queued: spec.max_queued,
                replicas,
                waiting,
            });
        }
        self.routes
            .sort_by_key(|route| std::cmp::Reverse(route.prefix.len()));
    }

    /// The route prefix that takes `path`.
    pub(crate) fn route_of(&self, path: &str) -> Option<&str> {
        self.routes
            .iter()
            .find(|route| prefix_takes(&route.prefix, path))
            .map(|route| route.prefix.as_str())
    }

    /// Picks a replica of route `prefix` for a request; `queued`: the
    /// request already waits (it holds a place in the queue). `draw`: two
    /// random numbers.
    pub(crate) fn pick(
        &mut self,
        prefix: &str,
        queued: bool,
        draw: (u32, u32),
        now: Instant,
    ) -> Pick<H> {
        let Some(route) = self.routes.iter_mut().find(|route| route.prefix == prefix) else {
            return Pick::NotFound;
        };
        let usable = |slot: &Slot<H>| slot.up && slot.down_until.is_none_or(|until| until <= now);
        if !route.replicas.is_empty() && !route.replicas.iter().any(usable) {
            return Pick::NoReplica {
                deployment: route.deployment.clone(),
            };
        }
        let max_ongoing = route.max_ongoing;
        let open: Vec<usize> = (0..route.replicas.len())
            .filter(|&i| usable(&route.replicas[i]) && route.replicas[i].ongoing < max_ongoing)
            .collect();
        if open.is_empty() {
            if queued {
                return Pick::Wait;
            }
            if route.waiting < route.max_queued {
                route.waiting += 1;
                return Pick::Wait;
            }
            return Pick::Overloaded {
                deployment: route.deployment.clone(),
            };
        }
        if queued {
            route.waiting = route.waiting.saturating_sub(1);
        }
        let first = open[draw.0 as usize % open.len()];
        let second = open[draw.1 as usize % open.len()];
        let load = |i: usize| route.replicas[i].ongoing + route.replicas[i].others;
        let chosen = if load(second) < load(first) {
            second
        } else {
            first
        };
        let slot = &mut route.replicas[chosen];
        slot.ongoing += 1;
        Pick::Send {
            replica: slot.id,
            handle: slot.handle.clone(),
        }
    }

    /// The requests waiting in each deployment's queue.
    pub(crate) fn waiting(&self) -> Vec<(String, u32)> {
        self.routes
            .iter()
            .map(|route| (route.deployment.clone(), route.waiting))
            .collect()
    }

    /// A queued request gave up (timed out, or its client left).
    pub(crate) fn leave_queue(&mut self, prefix: &str) {
        if let Some(route) = self.routes.iter_mut().find(|route| route.prefix == prefix) {
            route.waiting = route.waiting.saturating_sub(1);
        }
    }

    /// A request on `replica` ended; `reported`: the replica's ongoing
    /// count in its answer, if it answered.
    pub(crate) fn finished(&mut self, replica: ActorId, reported: Option<u32>) {
        if let Some(slot) = self.slot(replica) {
            slot.ongoing = slot.ongoing.saturating_sub(1);
            if let Some(reported) = reported {
                slot.others = reported.saturating_sub(slot.ongoing);
            }
        }
    }

    /// A call to `replica` failed: it is held down for [`DOWN_HOLD`].
    pub(crate) fn failed(&mut self, replica: ActorId, now: Instant) {
        if let Some(slot) = self.slot(replica) {
            slot.ongoing = slot.ongoing.saturating_sub(1);
            slot.down_until = Some(now + DOWN_HOLD);
        }
    }

    fn slot(&mut self, replica: ActorId) -> Option<&mut Slot<H>> {
        self.routes
            .iter_mut()
            .flat_map(|route| route.replicas.iter_mut())
            .find(|slot| slot.id == replica)
    }
}

/// Whether route `prefix` takes `path`.
fn prefix_takes(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(
        prefix: &str,
        replicas: &[(u64, bool)],
        max_ongoing: u32,
        max_queued: u32,
    ) -> RouteSpec<u64> {
        RouteSpec {
            prefix: prefix.into(),
            deployment: format!("d{prefix}"),
            max_ongoing,
            max_queued,
            replicas: replicas
                .iter()
                .map(|&(id, up)| (ActorId(id), id, up))
                .collect(),
        }
    }

    fn sent(pick: Pick<u64>) -> u64 {
        match pick {
            Pick::Send { handle, .. } => handle,
            other => panic!("expected a replica, got {other:?}"),
        }
    }

    #[test]
    fn longest_prefix_on_segment_boundaries() {
        let mut router = Router::new();
        router.set(vec![
            route("/", &[(1, true)], 1, 0),
            route("/a", &[(2, true)], 1, 0),
            route("/a/b", &[(3, true)], 1, 0),
        ]);
        assert_eq!(router.route_of("/a/b/c"), Some("/a/b"));
        assert_eq!(router.route_of("/a/bc"), Some("/a"));
        assert_eq!(router.route_of("/ab"), Some("/"));
        let mut only = Router::<u64>::new();
        only.set(vec![route("/a", &[(2, true)], 1, 0)]);
        assert_eq!(only.route_of("/ab"), None);
        assert_eq!(only.route_of("/a"), Some("/a"));
    }

    #[test]
    fn two_choices_take_the_less_loaded_and_full_ones_queue_then_refuse() {
        let now = Instant::now();
        let mut router = Router::new();
        router.set(vec![route("/m", &[(1, true), (2, true)], 2, 1)]);
        assert_eq!(sent(router.pick("/m", false, (0, 0), now)), 1);
        // Replica 1 has one in flight: drawing both, replica 2 wins.
        assert_eq!(sent(router.pick("/m", false, (0, 1), now)), 2);
        assert_eq!(sent(router.pick("/m", false, (1, 0), now)), 2);
        assert_eq!(sent(router.pick("/m", false, (0, 0), now)), 1);
        // Both full (2 each): one may wait, the next is refused.
        assert_eq!(router.pick("/m", false, (0, 1), now), Pick::Wait);
        assert_eq!(
            router.pick("/m", false, (0, 1), now),
            Pick::Overloaded {
                deployment: "d/m".into()
            }
        );
        // A replica reports back: the waiting request gets it.
        router.finished(ActorId(2), Some(1));
        assert_eq!(sent(router.pick("/m", true, (0, 0), now)), 2);
        assert_eq!(router.pick("/m", false, (0, 1), now), Pick::Wait);
    }

    #[test]
    fn a_route_scaled_to_zero_queues_until_a_replica_comes_and_counts_its_waiting() {
        let now = Instant::now();
        let mut router = Router::new();
        router.set(vec![route("/z", &[], 2, 2)]);
        assert_eq!(router.pick("/z", false, (0, 0), now), Pick::Wait);
        assert_eq!(router.pick("/z", false, (0, 0), now), Pick::Wait);
        assert_eq!(
            router.pick("/z", false, (0, 0), now),
            Pick::Overloaded {
                deployment: "d/z".into()
            }
        );
        assert_eq!(router.waiting(), vec![("d/z".to_string(), 2)]);
        // A replica started: the waiting requests take it.
        router.set(vec![route("/z", &[(1, true)], 2, 2)]);
        assert_eq!(router.waiting(), vec![("d/z".to_string(), 2)]);
        assert_eq!(sent(router.pick("/z", true, (0, 0), now)), 1);
        assert_eq!(sent(router.pick("/z", true, (0, 0), now)), 1);
        assert_eq!(router.waiting(), vec![("d/z".to_string(), 0)]);
        // Its replica down (not gone): no queueing, refused at once.
        router.set(vec![route("/z", &[(1, false)], 2, 2)]);
        assert_eq!(
            router.pick("/z", false, (0, 0), now),
            Pick::NoReplica {
                deployment: "d/z".into()
            }
        );
    }

    #[test]
    fn reported_load_of_other_ingresses_steers_picks() {
        let now = Instant::now();
        let mut router = Router::new();
        router.set(vec![route("/m", &[(1, true), (2, true)], 100, 0)]);
        assert_eq!(sent(router.pick("/m", false, (0, 0), now)), 1);
        router.finished(ActorId(1), Some(0));
        assert_eq!(sent(router.pick("/m", false, (0, 0), now)), 1);
        // Replica 1 says 9 requests ongoing: other ingresses load it.
        router.finished(ActorId(1), Some(9));
        assert_eq!(sent(router.pick("/m", false, (0, 1), now)), 2);
    }

    #[test]
    fn failed_replicas_are_held_down_until_the_hold_ends_or_the_controller_says_up() {
        let now = Instant::now();
        let mut router = Router::new();
        router.set(vec![route("/m", &[(1, true), (2, true)], 10, 0)]);
        assert_eq!(sent(router.pick("/m", false, (0, 0), now)), 1);
        router.failed(ActorId(1), now);
        for draw in 0..4 {
            assert_eq!(sent(router.pick("/m", false, (draw, draw + 1), now)), 2);
        }
        assert_eq!(sent(router.pick("/m", false, (0, 0), now + DOWN_HOLD)), 1);
        router.failed(ActorId(2), now);
        router.failed(ActorId(1), now);
        assert_eq!(
            router.pick("/m", false, (0, 0), now),
            Pick::NoReplica {
                deployment: "d/m".into()
            }
        );
        router.set(vec![route("/m", &[(1, true), (2, false)], 10, 0)]);
        assert_eq!(sent(router.pick("/m", false, (1, 1), now)), 1);
        assert_eq!(router.pick("/x", false, (0, 0), now), Pick::NotFound);
    }
}
