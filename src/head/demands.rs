//! What spawns are waiting for (`nimbus status`'s pending demands, as
//! `ray status` shows them):
//!
//! 1. A spawn that finds every candidate node full tells the head
//!    (`Waiting`: the actor, its class, resources and job, and how long it
//!    will go on trying), then waits for a cluster event and tries again;
//!    so does a placement group that finds no room for its bundles
//!    (`GroupWaiting`: the group, its bundles and their spread).
//! 2. When it ends, placed or failed, it says so (`Placed`,
//!    `GroupPlaced`); a spawner that dies first is forgotten once the time
//!    it gave has passed.
//! 3. Tasks that wait to run, with no node found with room for a worker,
//!    are counted per placement by their process, which says so every
//!    second while they wait (`TasksWaiting`, with the count; 0 once none
//!    do); a count not said again for [`TASKS_FRESH_FOR`] is forgotten.
//! 4. `ListDemands` answers the demands still waiting, with how long each
//!    has waited.
//!
//! [`Demands`] is the plain state (time passed in); the `Directory` actor
//! holds it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::cluster::{ActorId, Demand, GroupDemand, PlacementGroupId, ResourceSet};

/// The most demands kept: beyond it a new one is not recorded (the head's
/// memory is bounded whatever spawners send).
pub const MAX_DEMANDS: usize = 10_000;

/// How long a count of waiting tasks stands unless said again (step 3;
/// their process says it every second).
pub const TASKS_FRESH_FOR: Duration = Duration::from_secs(3);

/// The most tasks one count stands for (the autoscaler packs each).
pub const MAX_TASKS_COUNTED: u32 = 10_000;

/// Who waits: a spawn or a placement group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Waiter {
    /// An actor's spawn.
    Actor(ActorId),
    /// A placement group's creation.
    Group(PlacementGroupId),
    /// A process's tasks of one placement (its queue number).
    Tasks(u64),
}

/// One waiting spawn or group.
#[derive(Debug)]
struct Waiting {
    class: String,
    resources: ResourceSet,
    job: String,
    group: Option<GroupDemand>,
    tasks: u32,
    node: Option<String>,
    since: Instant,
    until: Instant,
}

/// The spawns and groups waiting for room, as a plain state machine.
#[derive(Debug, Default)]
pub struct Demands {
    waiting: HashMap<Waiter, Waiting>,
}

impl Demands {
    /// Step 1: `actor`'s spawn waits for `resources` at `now`, for at most
    /// `for_at_most` more; pinned to `node`, if any.
    pub fn wait(
        &mut self,
        actor: ActorId,
        (class, resources, job, node): (String, ResourceSet, String, Option<String>),
        now: Instant,
        for_at_most: Duration,
    ) {
        let waiter = Waiter::Actor(actor);
        self.insert(waiter, (class, resources, job, None), now, for_at_most);
        if let Some(waiting) = self.waiting.get_mut(&waiter) {
            waiting.node = node;
        }
    }

    /// Step 1: placement group `group` waits for room for its bundles.
    pub fn group_waits(
        &mut self,
        group: GroupDemand,
        job: String,
        now: Instant,
        for_at_most: Duration,
    ) {
        let mut resources = ResourceSet::default();
        for bundle in &group.bundles {
            resources.add(bundle);
        }
        let class = format!(
            "placement group ({} bundles, {:?})",
            group.bundles.len(),
            group.together
        );
        self.insert(
            Waiter::Group(group.id),
            (class, resources, job, Some(group)),
            now,
            for_at_most,
        );
    }

    /// Step 3: `count` tasks of `queue` wait for `resources` each (0:
    /// none do any more).
    pub fn tasks_wait(
        &mut self,
        queue: u64,
        (resources, job): (ResourceSet, String),
        count: u32,
        now: Instant,
    ) {
        let waiter = Waiter::Tasks(queue);
        if count == 0 {
            self.waiting.remove(&waiter);
            return;
        }
        let class = "tasks".to_string();
        self.insert(waiter, (class, resources, job, None), now, TASKS_FRESH_FOR);
        if let Some(waiting) = self.waiting.get_mut(&waiter) {
            waiting.tasks = count.min(MAX_TASKS_COUNTED);
        }
    }

    fn insert(
        &mut self,
        waiter: Waiter,
        (class, resources, job, group): (String, ResourceSet, String, Option<GroupDemand>),
        now: Instant,
        for_at_most: Duration,
    ) {
        self.expire(now);
        let until = now + for_at_most;
        if let Some(waiting) = self.waiting.get_mut(&waiter) {
            waiting.until = until;
            return;
        }
        if self.waiting.len() < MAX_DEMANDS {
            let waiting = Waiting {
                class,
                resources,
                job,
                group,
                tasks: 0,
                node: None,
                since: now,
                until,
            };
            self.waiting.insert(waiter, waiting);
        }
    }

    /// Step 2: a spawn or group that waited ended.
    pub fn placed(&mut self, waiter: Waiter) {
        self.waiting.remove(&waiter);
    }

    /// Step 3: the demands waiting at `now`, longest waiting first.
    pub fn list(&mut self, now: Instant) -> Vec<Demand> {
        self.expire(now);
        let mut demands: Vec<Demand> = self
            .waiting
            .iter()
            .map(|(waiter, w)| Demand {
                actor: match waiter {
                    Waiter::Actor(actor) => *actor,
                    Waiter::Group(_) | Waiter::Tasks(_) => ActorId(0),
                },
                class: w.class.clone(),
                resources: w.resources.clone(),
                job: w.job.clone(),
                waited_ms: now.saturating_duration_since(w.since).as_millis() as u64,
                group: w.group.clone(),
                tasks: w.tasks,
                node: w.node.clone(),
            })
            .collect();
        demands.sort_by(|a, b| b.waited_ms.cmp(&a.waited_ms).then(a.actor.cmp(&b.actor)));
        demands
    }

    fn expire(&mut self, now: Instant) {
        self.waiting.retain(|_, w| w.until > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what(cpus: f64) -> (String, ResourceSet, String, Option<String>) {
        ("T".into(), ResourceSet::of("CPU", cpus), "job".into(), None)
    }

    #[test]
    fn a_demand_is_listed_until_placed_or_past_its_time() {
        let mut demands = Demands::default();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        demands.wait(ActorId(1), what(4.0), t0, s * 30);
        demands.wait(ActorId(2), what(1.0), t0 + s, s * 5);
        demands.wait(ActorId(1), what(4.0), t0 + s * 2, s * 30);
        let listed = demands.list(t0 + s * 3);
        assert_eq!(listed.len(), 2);
        assert_eq!(
            (listed[0].actor, listed[0].waited_ms),
            (ActorId(1), 3000),
            "waits since it first said so"
        );
        demands.placed(Waiter::Actor(ActorId(1)));
        assert_eq!(demands.list(t0 + s * 4).len(), 1);
        assert!(
            demands.list(t0 + s * 7).is_empty(),
            "a silent spawner's demand expires"
        );
    }

    #[test]
    fn a_placement_group_is_listed_with_its_bundles_until_placed() {
        let mut demands = Demands::default();
        let t0 = Instant::now();
        let group = GroupDemand {
            id: PlacementGroupId(7),
            bundles: vec![ResourceSet::of("CPU", 1.0); 3],
            together: crate::cluster::Together::DistinctNodes,
        };
        demands.group_waits(group.clone(), "job".into(), t0, Duration::from_secs(30));
        demands.wait(ActorId(7), what(1.0), t0, Duration::from_secs(30));
        let listed = demands.list(t0);
        let listed_group = listed.iter().find(|d| d.group.is_some()).unwrap();
        assert_eq!(listed_group.resources, ResourceSet::of("CPU", 3.0));
        assert_eq!(listed_group.group.as_ref(), Some(&group));
        demands.placed(Waiter::Group(PlacementGroupId(7)));
        let listed = demands.list(t0);
        assert_eq!(listed.len(), 1, "the actor of the same number still waits");
        assert_eq!(listed[0].actor, ActorId(7));
    }

    #[test]
    fn waiting_tasks_are_counted_until_none_wait_or_their_process_falls_silent() {
        let mut demands = Demands::default();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let cpu = || (ResourceSet::of("CPU", 1.0), "job".to_string());
        demands.tasks_wait(3, cpu(), 12, t0);
        demands.tasks_wait(3, cpu(), 7, t0 + s);
        let listed = demands.list(t0 + s);
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].tasks, listed[0].waited_ms), (7, 1000));
        assert_eq!(listed[0].bundles().0.len(), 7, "a bundle per task");
        demands.tasks_wait(3, cpu(), 0, t0 + s * 2);
        assert!(demands.list(t0 + s * 2).is_empty(), "none wait any more");
        demands.tasks_wait(4, cpu(), u32::MAX, t0);
        assert_eq!(demands.list(t0)[0].tasks, MAX_TASKS_COUNTED);
        assert!(
            demands.list(t0 + TASKS_FRESH_FOR).is_empty(),
            "a silent process's count is forgotten"
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let mut demands = Demands::default();
        let t0 = Instant::now();
        for i in 0..MAX_DEMANDS as u64 + 10 {
            demands.wait(ActorId(i), what(1.0), t0, Duration::from_secs(60));
        }
        assert_eq!(demands.list(t0).len(), MAX_DEMANDS);
    }
}
