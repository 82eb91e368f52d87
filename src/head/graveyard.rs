//! Which dead actors the directory keeps, as Ray's state API keeps
//! destroyed actors: listed with their job and cause of death after their
//! job has ended (`nimbus list actors --filter state=DEAD`), and found by
//! name within their job for their logs (`nimbus logs NAME --job ID`).
//!
//! A plain state machine the `Directory` holds:
//! 1. every actor buried for good is recorded with its job, in order
//!    (`Graveyard::buried`);
//! 2. past [`DEAD_KEPT_PER_JOB`] dead actors of one job, that job's oldest
//!    is forgotten; past [`DEAD_KEPT`] in all, the oldest of any job is;
//!    the directory drops what is forgotten from memory and its store;
//! 3. an actor that lives again (a new incarnation reported up) leaves the
//!    graveyard (`Graveyard::revived`).

use std::collections::{HashMap, VecDeque};

use crate::cluster::ActorId;

/// Most dead actors kept per job.
pub const DEAD_KEPT_PER_JOB: usize = 1_000;
/// Most dead actors kept in all.
pub const DEAD_KEPT: usize = 10_000;

/// The dead actors kept, oldest first.
#[derive(Debug)]
pub(crate) struct Graveyard {
    order: VecDeque<(ActorId, String)>,
    per_job: HashMap<String, usize>,
    per_job_max: usize,
    max: usize,
}

impl Default for Graveyard {
    fn default() -> Self {
        Graveyard::new(DEAD_KEPT_PER_JOB, DEAD_KEPT)
    }
}

impl Graveyard {
    /// Keeps at most `per_job_max` dead actors per job and `max` in all.
    pub(crate) fn new(per_job_max: usize, max: usize) -> Self {
        Graveyard {
            order: VecDeque::new(),
            per_job: HashMap::new(),
            per_job_max: per_job_max.max(1),
            max: max.max(1),
        }
    }

    /// Steps 1 and 2: `actor` of `job` is dead for good; the actors to
    /// forget now (never `actor` itself).
    pub(crate) fn buried(&mut self, actor: ActorId, job: &str) -> Vec<ActorId> {
        if self.order.iter().any(|(a, _)| *a == actor) {
            return Vec::new();
        }
        self.order.push_back((actor, job.to_string()));
        *self.per_job.entry(job.to_string()).or_default() += 1;
        let mut forgotten = Vec::new();
        if self.per_job.get(job).copied().unwrap_or(0) > self.per_job_max {
            if let Some(at) = self.order.iter().position(|(_, j)| j == job) {
                forgotten.extend(self.remove_at(at));
            }
        }
        while self.order.len() > self.max {
            forgotten.extend(self.remove_at(0));
        }
        forgotten
    }

    /// Step 3: `actor` lives again.
    pub(crate) fn revived(&mut self, actor: ActorId) {
        if let Some(at) = self.order.iter().position(|(a, _)| *a == actor) {
            self.remove_at(at);
        }
    }

    /// The dead actors kept, oldest first.
    pub(crate) fn actors(&self) -> impl Iterator<Item = ActorId> + '_ {
        self.order.iter().map(|(actor, _)| *actor)
    }

    fn remove_at(&mut self, at: usize) -> Option<ActorId> {
        let (actor, job) = self.order.remove(at)?;
        if let Some(count) = self.per_job.get_mut(&job) {
            *count -= 1;
            if *count == 0 {
                self.per_job.remove(&job);
            }
        }
        Some(actor)
    }

    /// How many dead actors are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.actors().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_oldest_dead_actor_goes_first_and_other_jobs_keep_theirs() {
        let mut graves = Graveyard::new(2, 100);
        assert!(graves.buried(ActorId(1), "a").is_empty());
        assert!(graves.buried(ActorId(2), "b").is_empty());
        assert!(graves.buried(ActorId(3), "a").is_empty());
        assert_eq!(graves.buried(ActorId(4), "a"), vec![ActorId(1)]);
        assert_eq!(graves.buried(ActorId(5), "a"), vec![ActorId(3)]);
        assert_eq!(graves.len(), 3);
        // Burying again changes nothing.
        assert!(graves.buried(ActorId(5), "a").is_empty());
        assert_eq!(graves.len(), 3);
    }

    #[test]
    fn past_the_total_the_oldest_of_any_job_goes() {
        let mut graves = Graveyard::new(10, 3);
        for (actor, job) in [(1, "a"), (2, "b"), (3, "c")] {
            assert!(graves.buried(ActorId(actor), job).is_empty());
        }
        assert_eq!(graves.buried(ActorId(4), "d"), vec![ActorId(1)]);
        assert_eq!(graves.buried(ActorId(5), "d"), vec![ActorId(2)]);
    }

    #[test]
    fn a_revived_actor_leaves_and_frees_its_place() {
        let mut graves = Graveyard::new(1, 10);
        assert!(graves.buried(ActorId(1), "a").is_empty());
        graves.revived(ActorId(1));
        assert!(graves.buried(ActorId(2), "a").is_empty());
        assert_eq!(graves.len(), 1);
        graves.revived(ActorId(9));
        assert_eq!(graves.len(), 1);
    }
}
