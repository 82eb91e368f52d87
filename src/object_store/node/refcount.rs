//! Reference counting of the objects a node owns, as a plain state
//! machine: who holds each object, how many references are in transit, and
//! when the object is freed. The shard (`shard/`) keeps the bytes and
//! acts on what this decides.
//!
//! The protocol (the sending side is `process/refs.rs`):
//! 1. An owned object arrives (a put, a task's result) or fails with its
//!    first holder: [`RefCounts::arrived`]. It is *present*.
//! 2. `Hold` adds a holder (one per process, or a containing object);
//!    `Hold { arrived: true }` also consumes one transit; `Transit` adds
//!    one; `Release` removes the holder ([`RefCounts::change`]). Changes may
//!    come before the object itself: the counts then belong to a
//!    *placeholder*, which is the job of the first that held it
//!    ([`RefCounts::claim`]: the owner, who holds a task's result from its
//!    submission on), so that another job's worker may not hold or fail it
//!    before it arrives.
//! 3. An object with no holder and nothing in transit is collected: a
//!    present one is freed (the shard drops its bytes and tells its copies
//!    and contained references), a placeholder is forgotten (the object may
//!    still arrive, with its holder). A transit count below zero (the
//!    receiver's `Hold` came before the sender's `Transit`) only delays the
//!    free.
//! 4. A freed id is remembered (the last [`TOMBSTONES`] of them): late
//!    changes to it are ignored, late readers learn it was freed.
//! 5. A worker process that died releases every reference it held
//!    ([`RefCounts::drop_holders`]).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::cluster::{ObjectId, RefChange, RefHolder};

/// Freed ids remembered, so late readers learn the object was freed.
pub(crate) const TOMBSTONES: usize = 1 << 16;

/// The references to one owned object.
#[derive(Debug, Default)]
struct Counts {
    holders: BTreeSet<RefHolder>,
    transit: i64,
    /// The object is here (complete, arriving or failed), not only its
    /// references.
    present: bool,
    /// A placeholder's job: that of the first that held it.
    job: Option<Arc<str>>,
}

impl Counts {
    fn unreferenced(&self) -> bool {
        self.holders.is_empty() && self.transit == 0
    }
}

/// What a change did to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Collected {
    /// Still referenced (or only a placeholder was touched).
    Kept,
    /// The object had been freed already: the change came late.
    Late,
    /// No reference remains to a placeholder: its counts are forgotten.
    Placeholder,
    /// No reference remains to a present object: free it.
    Freed,
}

/// The reference counts of the objects one shard owns.
#[derive(Debug)]
pub(crate) struct RefCounts {
    counts: HashMap<ObjectId, Counts>,
    freed: HashSet<ObjectId>,
    freed_order: VecDeque<ObjectId>,
    tombstones: usize,
}

impl Default for RefCounts {
    fn default() -> Self {
        RefCounts::remembering(TOMBSTONES)
    }
}

impl RefCounts {
    /// Counts that remember the last `tombstones` freed ids.
    fn remembering(tombstones: usize) -> Self {
        RefCounts {
            counts: HashMap::new(),
            freed: HashSet::new(),
            freed_order: VecDeque::new(),
            tombstones,
        }
    }

    /// Step 1: owned object `id` is here, held by `holder`.
    pub(crate) fn arrived(&mut self, id: ObjectId, holder: RefHolder) {
        let counts = self.counts.entry(id).or_default();
        counts.present = true;
        counts.holders.insert(holder);
    }

    /// Step 2: a hold for `job` is about to be taken on `id`: a placeholder
    /// made by it is that job's.
    pub(crate) fn claim(&mut self, id: ObjectId, job: Option<&Arc<str>>) {
        if self.freed.contains(&id) || self.counts.get(&id).is_some_and(|c| c.present) {
            return;
        }
        let counts = self.counts.entry(id).or_default();
        if counts.job.is_none() {
            counts.job = job.cloned();
        }
    }

    /// The job of placeholder `id` (step 2), if it is one and has a job.
    pub(crate) fn placeholder_job(&self, id: ObjectId) -> Option<&str> {
        self.counts
            .get(&id)
            .filter(|c| !c.present)
            .and_then(|c| c.job.as_deref())
    }

    /// Steps 2–4: `holder` changed its references to `id`.
    pub(crate) fn change(
        &mut self,
        id: ObjectId,
        holder: &RefHolder,
        change: RefChange,
    ) -> Collected {
        if self.freed.contains(&id) {
            return Collected::Late;
        }
        let counts = self.counts.entry(id).or_default();
        match change {
            RefChange::Hold { arrived } => {
                counts.holders.insert(holder.clone());
                if arrived {
                    counts.transit -= 1;
                }
            }
            RefChange::Release => {
                counts.holders.remove(holder);
            }
            RefChange::Transit => counts.transit += 1,
        }
        self.collect(id)
    }

    /// Every process that holds a reference here (step 5's candidates).
    pub(crate) fn processes(&self) -> BTreeSet<&RefHolder> {
        self.counts
            .values()
            .flat_map(|counts| &counts.holders)
            .filter(|holder| matches!(holder, RefHolder::Process { .. }))
            .collect()
    }

    /// Step 5: removes every holder `dead` matches; returns the present
    /// objects that were freed by it.
    pub(crate) fn drop_holders(&mut self, dead: impl Fn(&RefHolder) -> bool) -> Vec<ObjectId> {
        let touched: Vec<ObjectId> = self
            .counts
            .iter_mut()
            .filter_map(|(id, counts)| {
                let before = counts.holders.len();
                counts.holders.retain(|h| !dead(h));
                (counts.holders.len() < before).then_some(*id)
            })
            .collect();
        touched
            .into_iter()
            .filter(|id| self.collect(*id) == Collected::Freed)
            .collect()
    }

    /// Forgets `id` without freeing it (its transfer was aborted).
    pub(crate) fn forget(&mut self, id: ObjectId) {
        self.counts.remove(&id);
    }

    /// Whether `id` was freed (among the last [`TOMBSTONES`] freed).
    pub(crate) fn was_freed(&self, id: ObjectId) -> bool {
        self.freed.contains(&id)
    }

    /// `id`'s holders and references in transit, if counted here.
    pub(crate) fn holders(&self, id: ObjectId) -> Option<(&BTreeSet<RefHolder>, i64)> {
        self.counts.get(&id).map(|c| (&c.holders, c.transit))
    }

    /// The objects referenced before they arrived.
    pub(crate) fn placeholders(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.counts
            .iter()
            .filter(|(_, c)| !c.present)
            .map(|(id, _)| *id)
    }

    /// Step 3: collects `id` if nothing references it.
    fn collect(&mut self, id: ObjectId) -> Collected {
        let Some(counts) = self.counts.get(&id).filter(|c| c.unreferenced()) else {
            return Collected::Kept;
        };
        let present = counts.present;
        self.counts.remove(&id);
        if !present {
            return Collected::Placeholder;
        }
        self.freed.insert(id);
        self.freed_order.push_back(id);
        if self.freed_order.len() > self.tombstones {
            if let Some(old) = self.freed_order.pop_front() {
                self.freed.remove(&old);
            }
        }
        Collected::Freed
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cluster::ActorId;
    use crate::wire::Incarnation;

    fn process(id: u64) -> RefHolder {
        RefHolder::Process {
            id,
            label: format!("process {id}"),
            worker: Some((ActorId(id), Incarnation(1))),
            job: None,
        }
    }

    const HOLD: RefChange = RefChange::Hold { arrived: false };
    const LANDED: RefChange = RefChange::Hold { arrived: true };

    #[test]
    fn an_object_is_freed_when_its_last_holder_releases_and_not_before() {
        let mut refs = RefCounts::default();
        let id = ObjectId(1);
        refs.arrived(id, process(1));
        assert_eq!(refs.change(id, &process(2), HOLD), Collected::Kept);
        assert_eq!(
            refs.change(id, &process(1), RefChange::Release),
            Collected::Kept
        );
        assert_eq!(
            refs.change(id, &process(2), RefChange::Release),
            Collected::Freed
        );
        assert!(refs.was_freed(id));
        assert_eq!(refs.change(id, &process(3), HOLD), Collected::Late);
    }

    #[test]
    fn a_reference_in_transit_keeps_the_object_whichever_order_the_owner_hears() {
        for landed_first in [false, true] {
            let mut refs = RefCounts::default();
            let id = ObjectId(2);
            refs.arrived(id, process(1));
            let (a, b) = if landed_first {
                ((process(2), LANDED), (process(1), RefChange::Transit))
            } else {
                ((process(1), RefChange::Transit), (process(2), LANDED))
            };
            assert_eq!(refs.change(id, &a.0, a.1), Collected::Kept);
            assert_eq!(refs.change(id, &b.0, b.1), Collected::Kept);
            assert_eq!(
                refs.change(id, &process(1), RefChange::Release),
                Collected::Kept
            );
            assert_eq!(
                refs.change(id, &process(2), RefChange::Release),
                Collected::Freed
            );
        }
    }

    #[test]
    fn a_placeholder_is_the_job_of_its_first_holder_until_it_arrives() {
        let mut refs = RefCounts::default();
        let (id, owner, other) = (ObjectId(9), Arc::from("j1"), Arc::from("j2"));
        refs.claim(id, Some(&owner));
        refs.change(id, &process(1), HOLD);
        refs.claim(id, Some(&other));
        refs.change(id, &process(2), HOLD);
        assert_eq!(refs.placeholder_job(id), Some("j1"));
        refs.arrived(id, process(1));
        assert_eq!(refs.placeholder_job(id), None, "the object's own job rules");
        let unclaimed = ObjectId(10);
        refs.change(unclaimed, &process(1), HOLD);
        assert_eq!(refs.placeholder_job(unclaimed), None);
        refs.change(unclaimed, &process(1), RefChange::Release);
        refs.claim(ObjectId(11), None);
        refs.change(ObjectId(11), &process(1), RefChange::Release);
        assert!(refs.placeholders().all(|p| p == id), "nothing left behind");
    }

    #[test]
    fn references_before_the_object_make_a_placeholder_that_is_forgotten_not_freed() {
        let mut refs = RefCounts::default();
        let id = ObjectId(3);
        assert_eq!(refs.change(id, &process(2), HOLD), Collected::Kept);
        assert_eq!(refs.placeholders().collect::<Vec<_>>(), vec![id]);
        assert_eq!(
            refs.change(id, &process(2), RefChange::Release),
            Collected::Placeholder
        );
        assert!(!refs.was_freed(id) && refs.holders(id).is_none());
        refs.arrived(id, process(1));
        assert_eq!(
            refs.change(id, &process(1), RefChange::Release),
            Collected::Freed
        );
    }

    #[test]
    fn a_dead_workers_references_are_released() {
        let mut refs = RefCounts::default();
        refs.arrived(ObjectId(4), process(1));
        refs.arrived(ObjectId(5), process(1));
        refs.change(ObjectId(5), &process(2), HOLD);
        let freed = refs.drop_holders(|h| *h == process(1));
        assert_eq!(freed, vec![ObjectId(4)]);
        assert!(refs.holders(ObjectId(5)).is_some());
    }

    #[test]
    fn only_the_last_tombstones_are_remembered() {
        let mut refs = RefCounts::remembering(2);
        for n in 0..3 {
            refs.arrived(ObjectId(n), process(1));
            refs.change(ObjectId(n), &process(1), RefChange::Release);
        }
        assert!(!refs.was_freed(ObjectId(0)));
        assert!(refs.was_freed(ObjectId(1)) && refs.was_freed(ObjectId(2)));
    }

    /// A seeded simulation: processes take, pass on (through messages, in
    /// transit) and drop references to a few objects, and the owner hears
    /// each process's changes in order but interleaved at random with the
    /// others'. Checked at every step against a model that knows every
    /// reference: an object is freed exactly when no process holds it and
    /// no message carrying it is undelivered, and never twice. The failing
    /// seed replays the run.
    #[test]
    fn simulated_reference_passing_frees_exactly_the_unreachable_objects() {
        for seed in 1..=30u64 {
            simulate(seed);
        }
    }

    /// The simulation above with senders that die: a dead process's
    /// undelivered changes are lost and its holds dropped
    /// ([`RefCounts::drop_holders`], as when the head reports a worker
    /// dead). With the barrier of `crate::runtime::transits` (a message
    /// leaves only once its sender's changes, its `Transit` included, are
    /// delivered), no seed frees an object a live process holds or a
    /// message still carries; without it, some seed does: the early free
    /// the barrier is for.
    #[test]
    fn a_sender_dying_after_passing_a_reference_on_never_frees_it_early() {
        for seed in 1..=50u64 {
            let early = first_early_free(seed, true);
            assert_eq!(early, None, "seed {seed}, with the barrier");
        }
        let found = (1..=50u64).find_map(|seed| first_early_free(seed, false));
        assert!(found.is_some(), "without the barrier no seed frees early");
    }

    /// The first step of `seed` at which an object is freed while a live
    /// process holds it or a message to a live process carries it.
    fn first_early_free(seed: u64, barrier: bool) -> Option<String> {
        const PROCESSES: u64 = 4;
        const OBJECTS: u64 = 3;
        let mut next = seeded(seed);
        let mut refs = RefCounts::default();
        let mut holds: HashSet<(u64, ObjectId)> = HashSet::new();
        let mut in_flight: Vec<(u64, ObjectId)> = Vec::new();
        let mut outboxes: Vec<Outbox> = vec![VecDeque::new(); PROCESSES as usize];
        let mut dead: HashSet<u64> = HashSet::new();
        let mut freed: HashSet<ObjectId> = HashSet::new();
        for o in 0..OBJECTS {
            refs.arrived(ObjectId(o), process(0));
            holds.insert((0, ObjectId(o)));
        }
        // The owner hears `p`'s next change.
        fn hear(refs: &mut RefCounts, outbox: &mut Outbox, p: u64, freed: &mut HashSet<ObjectId>) {
            if let Some((object, change)) = outbox.pop_front() {
                if refs.change(object, &process(p), change) == Collected::Freed {
                    freed.insert(object);
                }
            }
        }
        for step in 0..600 {
            let p = next(PROCESSES);
            let object = ObjectId(next(OBJECTS));
            if dead.contains(&p) {
                continue;
            }
            let holding = holds.contains(&(p, object));
            match next(12) {
                0..=2 if holding => {
                    let to = next(PROCESSES);
                    outboxes[p as usize].push_back((object, RefChange::Transit));
                    if barrier {
                        while !outboxes[p as usize].is_empty() {
                            hear(&mut refs, &mut outboxes[p as usize], p, &mut freed);
                        }
                    }
                    in_flight.push((to, object));
                }
                3..=4 if holding => {
                    holds.remove(&(p, object));
                    outboxes[p as usize].push_back((object, RefChange::Release));
                }
                5..=7 if !in_flight.is_empty() => {
                    let (to, object) = in_flight.swap_remove(next(in_flight.len() as u64) as usize);
                    if !dead.contains(&to) {
                        holds.insert((to, object));
                        outboxes[to as usize].push_back((object, LANDED));
                    }
                }
                8 => {
                    dead.insert(p);
                    outboxes[p as usize].clear();
                    holds.retain(|&(h, _)| h != p);
                    freed.extend(refs.drop_holders(|h| *h == process(p)));
                }
                _ => hear(&mut refs, &mut outboxes[p as usize], p, &mut freed),
            }
            for id in &freed {
                let held = holds.iter().any(|&(_, h)| h == *id);
                let carried = in_flight
                    .iter()
                    .any(|&(to, h)| h == *id && !dead.contains(&to));
                if held || carried {
                    return Some(format!(
                        "seed {seed} step {step}: {id} freed while referenced"
                    ));
                }
            }
        }
        None
    }

    /// One process's undelivered changes, in order.
    type Outbox = VecDeque<(ObjectId, RefChange)>;

    /// The simulations' random numbers (xorshift): `next(n)` is in `0..n`.
    fn seeded(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        }
    }

    fn simulate(seed: u64) {
        const PROCESSES: u64 = 4;
        const OBJECTS: u64 = 3;
        let mut next = seeded(seed);
        let mut refs = RefCounts::default();
        // The model: who really holds what, and messages carrying a
        // reference not yet received.
        let mut holds: HashMap<(u64, ObjectId), bool> = HashMap::new();
        let mut in_flight: Vec<(u64, ObjectId)> = Vec::new();
        let mut outboxes: Vec<Outbox> = vec![VecDeque::new(); PROCESSES as usize];
        let mut freed: HashSet<ObjectId> = HashSet::new();
        for o in 0..OBJECTS {
            refs.arrived(ObjectId(o), process(0));
            holds.insert((0, ObjectId(o)), true);
        }
        for step in 0..400 {
            let p = next(PROCESSES);
            let object = ObjectId(next(OBJECTS));
            let holding = holds.get(&(p, object)).copied().unwrap_or(false);
            match next(4) {
                // Pass a held reference on in a message.
                0 if holding => {
                    let to = next(PROCESSES);
                    in_flight.push((to, object));
                    outboxes[p as usize].push_back((object, RefChange::Transit));
                }
                // Drop it.
                1 if holding => {
                    holds.insert((p, object), false);
                    outboxes[p as usize].push_back((object, RefChange::Release));
                }
                // A message lands: its receiver holds the reference.
                2 if !in_flight.is_empty() => {
                    let (to, object) = in_flight.swap_remove(next(in_flight.len() as u64) as usize);
                    holds.insert((to, object), true);
                    outboxes[to as usize].push_back((object, LANDED));
                }
                // The owner hears one process's next change.
                _ => {
                    let Some((object, change)) = outboxes[p as usize].pop_front() else {
                        continue;
                    };
                    match refs.change(object, &process(p), change) {
                        Collected::Freed => assert!(
                            freed.insert(object),
                            "seed {seed} step {step}: {object} freed twice"
                        ),
                        Collected::Late => assert!(freed.contains(&object), "seed {seed}"),
                        Collected::Kept | Collected::Placeholder => {}
                    }
                }
            }
            for o in 0..OBJECTS {
                let id = ObjectId(o);
                let referenced = holds.iter().any(|(&(_, h), &held)| h == id && held)
                    || in_flight.iter().any(|&(_, h)| h == id);
                if freed.contains(&id) {
                    assert!(
                        !referenced,
                        "seed {seed} step {step}: {id} freed while referenced"
                    );
                }
            }
        }
        // Deliver everything, drop everything: every object must be freed.
        for (to, object) in in_flight.drain(..) {
            outboxes[to as usize].push_back((object, LANDED));
            holds.insert((to, object), true);
        }
        for ((p, object), held) in holds {
            if held {
                outboxes[p as usize].push_back((object, RefChange::Release));
            }
        }
        for (p, outbox) in outboxes.into_iter().enumerate() {
            for (object, change) in outbox {
                if refs.change(object, &process(p as u64), change) == Collected::Freed {
                    assert!(freed.insert(object), "seed {seed}: {object} freed twice");
                }
            }
        }
        assert_eq!(
            freed.len() as u64,
            OBJECTS,
            "seed {seed}: not every object was freed"
        );
    }
}
