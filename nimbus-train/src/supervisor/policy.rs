//! The training supervisor's policy, as a plain state machine: which
//! attempt is live, when it has failed, hung, finished or should grow, and
//! what follows. Every method takes the news (and the time, where it
//! matters) and returns a decision; the `TrainerSupervisor` actor carries it
//! out (launch, teardown, restart, observer events) and reports back.
//!
//! The policy:
//! 1. An attempt goes launching → running → ending, one at a time:
//!    [`Attempts::begin`] numbers it (launching), [`Attempts::launched`]
//!    makes it run with every rank unfinished, at step 0; its first failure,
//!    its last rank finishing or a rescale ends it; once its group is gone,
//!    [`Attempts::ended`] says what follows. Nothing begins while an attempt
//!    launches, runs or ends.
//! 2. News is for the running attempt only: news with another attempt's id
//!    (a stale one), for a rank the attempt does not have, or for an ending
//!    attempt is ignored.
//! 3. The first failure of an attempt (of its launch, or of a rank) ends it;
//!    later news from it is ignored. A rank that finished cannot fail.
//! 4. A rank whose step count has not changed for longer than
//!    `progress_timeout` is hung: a failure of that rank. A finished rank is
//!    never hung.
//! 5. All ranks finished: the attempt ends and the run is done.
//! 6. After a failed attempt ended, its failure is recorded: more than
//!    `max_failures` failures → give up, with their count and the first and
//!    last reasons; otherwise restart (one more in `restarts`). An
//!    [`Unrecoverable`] failure ([`Attempts::unrecoverable`]: a checkpoint
//!    that found no room on its filesystem, or one the driver cannot see)
//!    fails the attempt too, but the run stops once it ended: a restart
//!    would write the same checkpoint to the same storage.
//! 7. Elastic: while the running attempt has fewer ranks than the maximum,
//!    a node joining makes the actor probe for room for the missing ones;
//!    room found (the attempt still running) → rescale: the attempt ends and
//!    the run restarts, a restart that records no failure.
//! 8. Recovery time: from the first failure since the last recovery to the
//!    first report of rank 0 of a later running attempt.
//! 9. Stop (the trainer's `StopHandle`): a running attempt ends and the run
//!    is over once it ended; with no attempt (before the first, or between
//!    a failure and its restart) the run is over at once; a launching or
//!    ending attempt is let finish that step, then ended instead of
//!    running or restarting.
//! 10. Once done, stopped or given up the run is over: later calls decide
//!     nothing and change nothing.
//! 11. Peer heal (`heal/mod.rs`): a rank's worker that died (or, while it
//!     is being replaced, failed) is healed instead of failing the attempt
//!     when the group can heal (the actor says), every other rank that is
//!     not being replaced heals (`healable`) and none has finished, and a
//!     failure is left under `max_failures` (the death counts as one): the
//!     rank's next worker is numbered, every rank being replaced gets a new
//!     worker too (a heal in progress starts again with them all), the
//!     lowest survivor is the source, and no rank counts as hung from that
//!     moment. News of a rank's earlier worker is stale. The heal is over
//!     once every replaced rank has reported, timed from its first death.

use std::time::{Duration, Instant};

use crate::checkpoint::{NoSpace, NotShared};

/// The attempts of one training run; see the module docs.
#[derive(Debug)]
pub(crate) struct Attempts {
    max_failures: u32,
    progress_timeout: Duration,
    /// The most workers of an elastic run (`None`: a fixed size).
    elastic_max: Option<usize>,
    phase: Phase,
    next_id: u64,
    restarts: u32,
    /// Why each failed attempt failed, oldest first.
    failures: Vec<String>,
    /// The first failure not yet followed by a recovery.
    failed_at: Option<Instant>,
    /// Stop was asked for while an attempt launched or ended (step 9).
    stop_asked: bool,
    /// Heals so far (step 11): the number of the latest.
    heals: u64,
}

/// Where the run stands.
#[derive(Debug)]
enum Phase {
    /// No attempt: before the first, or a restart is due.
    Idle,
    /// This attempt is being launched.
    Launching(u64),
    /// This attempt trains; one entry per rank; a heal may be going on.
    Running {
        id: u64,
        ranks: Vec<Rank>,
        healing: Option<Healing>,
    },
    /// The last attempt is being torn down, for this reason.
    Ending(Ending),
    /// Done or given up.
    Over,
}

/// One rank of the running attempt.
#[derive(Clone, Debug)]
struct Rank {
    finished: bool,
    steps: u64,
    /// When `steps` last changed (or the launch).
    changed: Instant,
    /// Its worker: 0 first, one more per replacement (step 11).
    worker: u32,
    /// Its loop heals from a peer.
    healable: bool,
}

/// A heal going on (step 11).
#[derive(Clone, Debug)]
struct Healing {
    /// The ranks being replaced that have not reported yet.
    waiting: Vec<usize>,
    /// Every rank replaced by this heal.
    ranks: Vec<usize>,
    /// The first death it mends.
    since: Instant,
}

/// What a worker's death leads to.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum Death {
    /// Heal the group from a peer.
    Heal(Heal),
    /// The attempt failed: as after [`Attempts::rank_failed`].
    Failed(Failure),
}

/// Replace these ranks' workers and heal the group: kill the ranks'
/// current workers (dead, or replacements of a heal that failed), spawn
/// new ones, and send every other rank the heal order.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) struct Heal {
    /// The heal's number (1 first).
    pub(crate) number: u64,
    /// The ranks to replace, each with its new worker's number.
    pub(crate) ranks: Vec<(usize, u32)>,
    /// The survivor that sends its state.
    pub(crate) source: usize,
    /// Why (the death).
    pub(crate) reason: String,
}

/// A heal is over: every replaced rank reported.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) struct Healed {
    /// The ranks it replaced.
    pub(crate) ranks: Vec<usize>,
    /// From the first death it mended to the last replaced rank's report.
    pub(crate) took: Duration,
}

/// Why an attempt ends.
#[derive(Debug)]
enum Ending {
    Failed(String),
    Unrecoverable(Unrecoverable),
    Finished,
    Rescaled,
    Stopped,
}

/// A failure that ended the live attempt: tell the observer, tear the
/// attempt down (nothing to tear down after a failed launch), then call
/// [`Attempts::ended`].
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) struct Failure {
    /// The attempt's number for the observer: the restarts before it.
    pub(crate) attempt: u32,
    /// Why it failed.
    pub(crate) reason: String,
}

/// An elastic run has room to grow: tear the attempt down, then call
/// [`Attempts::ended`].
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) struct Rescale {
    /// Workers now.
    pub(crate) from: usize,
    /// Workers it restarts with.
    pub(crate) to: usize,
}

/// What follows an attempt that ended.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum Next {
    /// Start the next attempt ([`Attempts::begin`]) from the newest
    /// checkpoint that verifies.
    Restart,
    /// Every rank finished: the run succeeded.
    Done,
    /// Too many failures: the run failed.
    GiveUp(Exhausted),
    /// A failure no restart can fix: the run stopped.
    Stop(Unrecoverable),
    /// The run was asked to stop ([`Attempts::stop`]).
    Stopped,
}

/// What to do at once about a stop ([`Attempts::stop`]).
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum StopNow {
    /// Tear the running attempt down, then call [`Attempts::ended`].
    TearDown,
    /// No attempt: the run is over.
    Complete,
}

/// A failure no restart can fix, so the run stops.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Unrecoverable {
    /// A checkpoint found no room on its filesystem.
    StorageFull(NoSpace),
    /// A checkpoint rank 0 saved is not where the driver looks for it.
    StorageNotShared(NotShared),
}

impl Unrecoverable {
    fn reason(&self) -> String {
        match self {
            Unrecoverable::StorageFull(full) => full.to_string(),
            Unrecoverable::StorageNotShared(unshared) => unshared.to_string(),
        }
    }
}

/// The run failed more than `max_failures` times.
#[derive(Debug, PartialEq)]
pub(crate) struct Exhausted {
    /// Failures seen.
    pub(crate) failures: u32,
    /// The limit.
    pub(crate) max_failures: u32,
    /// The first failure, the root cause.
    pub(crate) first: String,
    /// The last failure.
    pub(crate) last: String,
}

impl Attempts {
    /// No attempt yet. A run gives up after more than `max_failures`
    /// failures, finds a rank hung after `progress_timeout` without a step,
    /// and (elastic, with `elastic_max`) grows up to `elastic_max` workers.
    pub(crate) fn new(
        max_failures: u32,
        progress_timeout: Duration,
        elastic_max: Option<usize>,
    ) -> Self {
        Attempts {
            max_failures,
            progress_timeout,
            elastic_max,
            phase: Phase::Idle,
            next_id: 0,
            restarts: 0,
            failures: Vec::new(),
            failed_at: None,
            stop_asked: false,
            heals: 0,
        }
    }

    /// Restarts so far: the number of the latest attempt.
    pub(crate) fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Numbers the next attempt, for the actor to launch; `None` unless one
    /// is due (the first, or after [`Next::Restart`]).
    pub(crate) fn begin(&mut self) -> Option<u64> {
        if !matches!(self.phase, Phase::Idle) {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.phase = Phase::Launching(id);
        Some(id)
    }

    /// Attempt `id` launched with `ranks` workers: it runs, every rank at
    /// step 0 since `now`. `false`: a stop was asked for while it launched,
    /// so it ends instead (tear it down, then [`Attempts::ended`]).
    pub(crate) fn launched(&mut self, id: u64, ranks: usize, now: Instant) -> bool {
        if !self.launching(id) {
            return true;
        }
        if self.stop_asked {
            self.phase = Phase::Ending(Ending::Stopped);
            return false;
        }
        let rank = Rank {
            finished: false,
            steps: 0,
            changed: now,
            worker: 0,
            healable: false,
        };
        let ranks = vec![rank; ranks];
        self.phase = Phase::Running {
            id,
            ranks,
            healing: None,
        };
        true
    }

    /// Stop the run (step 9): what to do now, if anything.
    pub(crate) fn stop(&mut self) -> Option<StopNow> {
        match self.phase {
            Phase::Idle => {
                self.phase = Phase::Over;
                Some(StopNow::Complete)
            }
            Phase::Running { .. } => {
                self.phase = Phase::Ending(Ending::Stopped);
                Some(StopNow::TearDown)
            }
            Phase::Launching(_) | Phase::Ending(_) => {
                self.stop_asked = true;
                None
            }
            Phase::Over => None,
        }
    }

    /// Attempt `id` could not launch (for a reason a restart may fix): it
    /// ends, with nothing to tear down. `None` unless it was launching.
    pub(crate) fn launch_failed(
        &mut self,
        id: u64,
        reason: String,
        now: Instant,
    ) -> Option<Failure> {
        self.launching(id).then(|| self.fail(reason, now))
    }

    /// Rank `rank` of attempt `id` is at step `steps`; whether that is news
    /// of the running attempt (to act on) or stale.
    pub(crate) fn progress(&mut self, id: u64, rank: usize, steps: u64, now: Instant) -> bool {
        let Some(rank) = self.rank(id, rank) else {
            return false;
        };
        if rank.steps != steps {
            rank.steps = steps;
            rank.changed = now;
        }
        true
    }

    /// Whether `worker` is rank `rank`'s current worker in running attempt
    /// `id` (news of any other is stale, step 11).
    pub(crate) fn current(&mut self, id: u64, rank: usize, worker: u32) -> bool {
        self.rank(id, rank).is_some_and(|r| r.worker == worker)
    }

    /// Whether rank `rank`'s loop heals from a peer (its last poll said).
    pub(crate) fn healable(&mut self, id: u64, rank: usize, healable: bool) {
        if let Some(rank) = self.rank(id, rank) {
            rank.healable = healable;
        }
    }

    /// Worker `worker` of rank `rank` of attempt `id` died (`died`) or
    /// failed, for `reason`: a heal when one can mend it (step 11, the
    /// group `can_heal`), else the attempt's failure as
    /// [`Attempts::rank_failed`]; `None` for stale news.
    pub(crate) fn worker_lost(
        &mut self,
        (id, rank, worker): (u64, usize, u32),
        (reason, died): (&str, bool),
        can_heal: bool,
        now: Instant,
    ) -> Option<Death> {
        if !self.current(id, rank, worker) {
            return None;
        }
        let failures_left = (self.failures.len() as u32) < self.max_failures;
        let Phase::Running { ranks, healing, .. } = &mut self.phase else {
            return None;
        };
        let replacing = healing.as_ref().is_some_and(|h| h.ranks.contains(&rank));
        let mut lost: Vec<usize> = healing.as_ref().map_or(Vec::new(), |h| h.ranks.clone());
        if !lost.contains(&rank) {
            lost.push(rank);
        }
        lost.sort_unstable();
        let survivors: Vec<usize> = (0..ranks.len()).filter(|r| !lost.contains(r)).collect();
        let heals = can_heal
            && (died || replacing)
            && failures_left
            && !survivors.is_empty()
            && ranks.iter().all(|r| !r.finished)
            && survivors.iter().all(|&r| ranks[r].healable);
        if !heals {
            return self.rank_failed(id, rank, reason, now).map(Death::Failed);
        }
        let reason = format!("worker rank {rank}: {reason}");
        self.failures.push(reason.clone());
        self.failed_at.get_or_insert(now);
        let since = healing.as_ref().map_or(now, |h| h.since);
        for rank in ranks.iter_mut() {
            rank.changed = now;
        }
        let mut replaced = Vec::new();
        for &r in &lost {
            ranks[r].worker += 1;
            ranks[r].steps = 0;
            ranks[r].healable = false;
            replaced.push((r, ranks[r].worker));
        }
        *healing = Some(Healing {
            waiting: lost.clone(),
            ranks: lost,
            since,
        });
        self.heals += 1;
        Some(Death::Heal(Heal {
            number: self.heals,
            ranks: replaced,
            source: survivors[0],
            reason,
        }))
    }

    /// The heal that gave rank `rank` of attempt `id` its worker `worker`
    /// could not replace it, for `reason`: the attempt fails (the heal's
    /// failure is recorded once, as the attempt's). `None` when a later
    /// heal replaced the rank again (it goes on) or the attempt ended.
    pub(crate) fn heal_failed(
        &mut self,
        (id, rank, worker): (u64, usize, u32),
        reason: &str,
        now: Instant,
    ) -> Option<Failure> {
        if !self.current(id, rank, worker) {
            return None;
        }
        self.failures.pop();
        self.rank_failed(id, rank, reason, now)
    }

    /// Worker `worker` of rank `rank` of attempt `id` reported: the heal it
    /// ends, if it was the last replaced rank to report (step 11).
    pub(crate) fn healed(
        &mut self,
        (id, rank, worker): (u64, usize, u32),
        now: Instant,
    ) -> Option<Healed> {
        if !self.current(id, rank, worker) {
            return None;
        }
        let Phase::Running { healing, .. } = &mut self.phase else {
            return None;
        };
        let heal = healing.as_mut()?;
        heal.waiting.retain(|&r| r != rank);
        if !heal.waiting.is_empty() {
            return None;
        }
        let heal = healing.take()?;
        Some(Healed {
            ranks: heal.ranks,
            took: now.saturating_duration_since(heal.since),
        })
    }

    /// Rank `rank` of attempt `id` reported: for rank 0 of the running
    /// attempt after a failure, the recovery time (once).
    pub(crate) fn report(&mut self, id: u64, rank: usize, now: Instant) -> Option<Duration> {
        if rank != 0 || self.rank(id, rank).is_none() {
            return None;
        }
        let failed = self.failed_at.take()?;
        Some(now.saturating_duration_since(failed))
    }

    /// Rank `rank` of attempt `id` failed: the attempt's failure if it is
    /// the first of the running attempt and the rank had not finished.
    pub(crate) fn rank_failed(
        &mut self,
        id: u64,
        rank: usize,
        reason: &str,
        now: Instant,
    ) -> Option<Failure> {
        if self.rank(id, rank)?.finished {
            return None;
        }
        Some(self.fail(format!("worker rank {rank}: {reason}"), now))
    }

    /// Rank `rank` of attempt `id` failed in a way no restart can fix:
    /// like [`Attempts::rank_failed`], but once the attempt ended the run
    /// stops.
    pub(crate) fn unrecoverable(
        &mut self,
        id: u64,
        rank: usize,
        failure: Unrecoverable,
        now: Instant,
    ) -> Option<Failure> {
        let failed = self.rank_failed(id, rank, &failure.reason(), now)?;
        self.phase = Phase::Ending(Ending::Unrecoverable(failure));
        Some(failed)
    }

    /// Rank `rank` of attempt `id` finished: whether every rank has, so
    /// the attempt ends (tear it down, then [`Attempts::ended`]).
    pub(crate) fn rank_finished(&mut self, id: u64, rank: usize) -> bool {
        let Some(ranks) = self.running(id) else {
            return false;
        };
        let Some(finished) = ranks.get_mut(rank) else {
            return false;
        };
        finished.finished = true;
        let all = ranks.iter().all(|r| r.finished);
        if all {
            self.phase = Phase::Ending(Ending::Finished);
        }
        all
    }

    /// The running attempt and its first unfinished rank without a step for
    /// longer than the progress timeout: fail it with
    /// [`Attempts::rank_failed`].
    pub(crate) fn hung(&self, now: Instant) -> Option<(u64, usize)> {
        let Phase::Running { id, ranks, .. } = &self.phase else {
            return None;
        };
        let silent = |r: &Rank| now.saturating_duration_since(r.changed) > self.progress_timeout;
        let rank = ranks.iter().position(|r| !r.finished && silent(r))?;
        Some((*id, rank))
    }

    /// A node joined: how many more workers attempt `id` wants (probe for
    /// room for them), if it runs, elastic, below its maximum.
    pub(crate) fn room_wanted(&self, id: u64) -> Option<usize> {
        let max = self.elastic_max?;
        let Phase::Running {
            id: live, ranks, ..
        } = &self.phase
        else {
            return None;
        };
        let extra = max.saturating_sub(ranks.len());
        (*live == id && extra > 0).then_some(extra)
    }

    /// The probe for attempt `id` found room: rescale, if it still runs.
    pub(crate) fn room_found(&mut self, id: u64) -> Option<Rescale> {
        let extra = self.room_wanted(id)?;
        let to = self.elastic_max?;
        self.phase = Phase::Ending(Ending::Rescaled);
        Some(Rescale {
            from: to - extra,
            to,
        })
    }

    /// The ending attempt is gone (torn down, or never launched): what
    /// follows. `None` unless an attempt was ending.
    pub(crate) fn ended(&mut self) -> Option<Next> {
        let Phase::Ending(ending) = &self.phase else {
            return None;
        };
        let next = match ending {
            Ending::Failed(reason) => {
                self.failures.push(reason.clone());
                self.after_failure()
            }
            Ending::Unrecoverable(failure) => {
                self.failures.push(failure.reason());
                Next::Stop(failure.clone())
            }
            Ending::Finished => Next::Done,
            Ending::Rescaled => Next::Restart,
            Ending::Stopped => Next::Stopped,
        };
        let next = match next {
            Next::Restart if self.stop_asked => Next::Stopped,
            next => next,
        };
        if next == Next::Restart {
            self.restarts += 1;
            self.phase = Phase::Idle;
        } else {
            self.phase = Phase::Over;
        }
        Some(next)
    }

    /// Restart, unless the recorded failures are more than allowed.
    fn after_failure(&self) -> Next {
        let failures = self.failures.len() as u32;
        if failures <= self.max_failures {
            return Next::Restart;
        }
        Next::GiveUp(Exhausted {
            failures,
            max_failures: self.max_failures,
            first: self.failures[0].clone(),
            last: self.failures[self.failures.len() - 1].clone(),
        })
    }

    /// Ends the live attempt for `reason`.
    fn fail(&mut self, reason: String, now: Instant) -> Failure {
        self.failed_at.get_or_insert(now);
        self.phase = Phase::Ending(Ending::Failed(reason.clone()));
        Failure {
            attempt: self.restarts,
            reason,
        }
    }

    /// Whether attempt `id` is launching.
    fn launching(&self, id: u64) -> bool {
        matches!(self.phase, Phase::Launching(launching) if launching == id)
    }

    /// The ranks of attempt `id`, if it is running.
    fn running(&mut self, id: u64) -> Option<&mut [Rank]> {
        match &mut self.phase {
            Phase::Running {
                id: live, ranks, ..
            } if *live == id => Some(ranks),
            _ => None,
        }
    }

    /// Rank `rank` of attempt `id`, if it is running and has that rank.
    fn rank(&mut self, id: u64, rank: usize) -> Option<&mut Rank> {
        self.running(id)?.get_mut(rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// A run whose attempt 0 runs with `ranks` ranks since `t0`.
    fn running(max_failures: u32, elastic: Option<usize>, ranks: usize, t0: Instant) -> Attempts {
        let mut attempts = Attempts::new(max_failures, 10 * SECOND, elastic);
        assert_eq!(attempts.begin(), Some(0));
        assert_eq!(attempts.begin(), None);
        attempts.launched(0, ranks, t0);
        attempts
    }

    /// Fails rank `rank` of running attempt `id`, tears it down and starts
    /// the next one with `ranks` ranks; returns its id.
    fn fail_and_restart(attempts: &mut Attempts, id: u64, rank: usize, now: Instant) -> u64 {
        assert!(attempts.rank_failed(id, rank, "boom", now).is_some());
        assert_eq!(attempts.ended(), Some(Next::Restart));
        let next = attempts.begin().expect("a restart is due");
        attempts.launched(next, 2, now);
        next
    }

    #[test]
    fn stale_attempts_and_unknown_ranks_are_ignored() {
        let t0 = Instant::now();
        let mut attempts = running(3, Some(4), 2, t0);
        let live = fail_and_restart(&mut attempts, 0, 1, t0);
        assert_eq!(live, 1);
        let before = format!("{attempts:?}");
        assert!(!attempts.progress(0, 0, 7, t0));
        assert_eq!(attempts.report(0, 0, t0), None);
        assert_eq!(attempts.rank_failed(0, 0, "late", t0), None);
        assert!(!attempts.rank_finished(0, 0));
        assert_eq!(attempts.room_wanted(0), None);
        assert_eq!(attempts.room_found(0), None);
        assert_eq!(attempts.launch_failed(0, "late".into(), t0), None);
        attempts.launched(0, 4, t0);
        assert!(!attempts.progress(live, 2, 7, t0));
        assert_eq!(attempts.rank_failed(live, 2, "no such rank", t0), None);
        assert!(!attempts.rank_finished(live, 2));
        assert_eq!(before, format!("{attempts:?}"));
        assert!(attempts.progress(live, 1, 7, t0));
    }

    #[test]
    fn only_the_first_failure_of_an_attempt_counts() {
        let t0 = Instant::now();
        let mut attempts = running(3, None, 2, t0);
        let failure = attempts.rank_failed(0, 1, "died: killed", t0);
        let reason = "worker rank 1: died: killed".to_string();
        assert_eq!(failure, Some(Failure { attempt: 0, reason }));
        assert_eq!(attempts.rank_failed(0, 0, "collective aborted", t0), None);
        assert!(!attempts.progress(0, 0, 3, t0));
        assert_eq!(attempts.hung(t0 + 60 * SECOND), None);
        assert_eq!(attempts.begin(), None);
        assert_eq!(attempts.ended(), Some(Next::Restart));
        assert_eq!(attempts.ended(), None);
        assert_eq!(attempts.failures, ["worker rank 1: died: killed"]);
        assert_eq!(attempts.restarts(), 1);
    }

    #[test]
    fn a_finished_rank_cannot_fail_and_all_finished_is_done() {
        let t0 = Instant::now();
        let mut attempts = running(3, None, 2, t0);
        assert!(!attempts.rank_finished(0, 0));
        assert_eq!(attempts.rank_failed(0, 0, "killed in teardown", t0), None);
        assert_eq!(attempts.hung(t0 + 11 * SECOND), Some((0, 1)));
        assert!(attempts.rank_finished(0, 1));
        assert_eq!(attempts.rank_failed(0, 1, "killed in teardown", t0), None);
        assert_eq!(attempts.ended(), Some(Next::Done));
        assert_eq!(attempts.begin(), None);
        assert_eq!(attempts.ended(), None);
        assert_eq!(attempts.restarts(), 0);
        assert!(attempts.failures.is_empty());
    }

    #[test]
    fn a_rank_is_hung_only_after_the_timeout_and_a_step_resets_it() {
        let t0 = Instant::now();
        let mut attempts = running(3, None, 2, t0);
        let timeout = t0 + 10 * SECOND;
        let after = timeout + Duration::from_millis(1);
        assert_eq!(attempts.hung(timeout), None);
        assert_eq!(attempts.hung(after), Some((0, 0)));
        // A report of the same step is no progress; a new step is.
        assert!(attempts.progress(0, 0, 0, t0 + 5 * SECOND));
        assert_eq!(attempts.hung(after), Some((0, 0)));
        assert!(attempts.progress(0, 0, 1, t0 + 5 * SECOND));
        assert_eq!(attempts.hung(after), Some((0, 1)));
        assert!(attempts.progress(0, 1, 1, t0 + 6 * SECOND));
        assert_eq!(attempts.hung(after), None);
        assert_eq!(attempts.hung(timeout + 5 * SECOND), None);
        assert_eq!(attempts.hung(after + 5 * SECOND), Some((0, 0)));
    }

    #[test]
    fn a_full_disk_stops_the_run_whatever_failures_are_left() {
        let t0 = Instant::now();
        let mut attempts = running(3, None, 2, t0);
        let full = NoSpace {
            index: 10,
            dir: "/runs/r".into(),
            needed: 4 << 20,
            free: 1 << 20,
        };
        let full = Unrecoverable::StorageFull(full);
        let failure = attempts.unrecoverable(0, 0, full.clone(), t0);
        assert!(failure.is_some_and(|f| f.reason.contains("no space for checkpoint 10")));
        // Later news of the ending attempt is ignored.
        assert!(attempts.rank_failed(0, 1, "aborted", t0).is_none());
        assert_eq!(attempts.ended(), Some(Next::Stop(full)));
        assert_eq!(attempts.restarts(), 0);
        assert_eq!(attempts.begin(), None);
        assert_eq!(attempts.ended(), None);
    }

    #[test]
    fn two_max_failures_allow_two_restarts_then_give_up() {
        let t0 = Instant::now();
        let mut attempts = running(2, None, 2, t0);
        let id = fail_and_restart(&mut attempts, 0, 0, t0);
        assert!(attempts.rank_failed(id, 1, "hung", t0).is_some());
        assert_eq!(attempts.ended(), Some(Next::Restart));
        assert_eq!(attempts.restarts(), 2);
        let id = attempts.begin().expect("a restart is due");
        let failure = attempts.launch_failed(id, "no room".into(), t0);
        let reason = "no room".to_string();
        assert_eq!(failure, Some(Failure { attempt: 2, reason }));
        let exhausted = Exhausted {
            failures: 3,
            max_failures: 2,
            first: "worker rank 0: boom".into(),
            last: "no room".into(),
        };
        assert_eq!(attempts.ended(), Some(Next::GiveUp(exhausted)));
        assert_eq!(attempts.restarts(), 2);
        assert_eq!(attempts.begin(), None);
        assert_eq!(attempts.ended(), None);
    }

    #[test]
    fn an_elastic_rescale_restarts_without_a_failure() {
        let t0 = Instant::now();
        let mut attempts = running(0, Some(4), 2, t0);
        assert_eq!(attempts.room_wanted(0), Some(2));
        assert_eq!(attempts.room_found(0), Some(Rescale { from: 2, to: 4 }));
        assert_eq!(attempts.room_found(0), None);
        assert_eq!(attempts.rank_failed(0, 0, "killed in teardown", t0), None);
        assert_eq!(attempts.ended(), Some(Next::Restart));
        assert_eq!(attempts.restarts(), 1);
        assert!(attempts.failures.is_empty());
        assert_eq!(attempts.failed_at, None);
        assert_eq!(attempts.begin(), Some(1));
        attempts.launched(1, 4, t0);
        assert_eq!(attempts.room_wanted(1), None);
        // A fixed-size run never grows.
        assert_eq!(running(0, None, 2, t0).room_wanted(0), None);
    }

    #[test]
    fn recovery_is_timed_from_the_first_failure_to_the_next_rank_0_report() {
        let t0 = Instant::now();
        let mut attempts = running(3, None, 2, t0);
        assert_eq!(attempts.report(0, 0, t0), None);
        let id = fail_and_restart(&mut attempts, 0, 0, t0 + SECOND);
        // More failures before the recovery (a rank, a launch): it still
        // counts from the first.
        assert!(attempts
            .rank_failed(id, 1, "boom", t0 + 2 * SECOND)
            .is_some());
        assert_eq!(attempts.ended(), Some(Next::Restart));
        let id = attempts.begin().expect("a restart is due");
        assert!(attempts
            .launch_failed(id, "no room".into(), t0 + 3 * SECOND)
            .is_some());
        assert_eq!(attempts.ended(), Some(Next::Restart));
        let id = attempts.begin().expect("a restart is due");
        attempts.launched(id, 2, t0 + 4 * SECOND);
        assert_eq!(attempts.report(id, 1, t0 + 9 * SECOND), None);
        assert_eq!(attempts.report(id, 0, t0 + 10 * SECOND), Some(9 * SECOND));
        assert_eq!(attempts.report(id, 0, t0 + 11 * SECOND), None);
    }

    #[test]
    fn a_heal_that_cannot_start_fails_the_attempt_once_and_a_later_heal_goes_on() {
        let t0 = Instant::now();
        let mut attempts = running(3, None, 3, t0);
        for rank in 0..3 {
            attempts.healable(0, rank, true);
        }
        let first = attempts.worker_lost((0, 2, 0), ("died: killed", true), true, t0);
        let Some(Death::Heal(first)) = first else {
            panic!("not a heal: {first:?}");
        };
        assert_eq!((first.ranks.clone(), first.source), (vec![(2, 1)], 0));
        // Rank 1 dies too: the heal starts again with both.
        let second = attempts.worker_lost((0, 1, 0), ("died: killed", true), true, t0);
        let Some(Death::Heal(second)) = second else {
            panic!("not a heal: {second:?}");
        };
        assert_eq!(second.ranks, [(1, 1), (2, 2)]);
        // The first heal's failure to start is stale: the second goes on.
        assert_eq!(attempts.heal_failed((0, 2, 1), "gone", t0), None);
        assert_eq!(attempts.failures.len(), 2);
        let failed = attempts.heal_failed((0, 1, 1), "no room", t0);
        let reason = "worker rank 1: no room".to_string();
        assert_eq!(failed, Some(Failure { attempt: 0, reason }));
        assert_eq!(attempts.ended(), Some(Next::Restart));
        assert_eq!(attempts.failures.len(), 2, "the failed heal counted once");
    }

    #[test]
    fn a_stop_ends_the_run_in_every_phase() {
        let t0 = Instant::now();
        // Running: tear down, then the run is over, stopped.
        let mut attempts = running(3, None, 2, t0);
        assert_eq!(attempts.stop(), Some(StopNow::TearDown));
        assert_eq!(attempts.stop(), None);
        assert_eq!(attempts.rank_failed(0, 0, "killed in teardown", t0), None);
        assert_eq!(attempts.ended(), Some(Next::Stopped));
        assert!(attempts.failures.is_empty());
        assert_eq!(attempts.begin(), None);
        // Before the first attempt: over at once.
        let mut attempts = Attempts::new(3, 10 * SECOND, None);
        assert_eq!(attempts.stop(), Some(StopNow::Complete));
        assert_eq!(attempts.begin(), None);
        // Launching: it launches, then ends instead of running.
        let mut attempts = Attempts::new(3, 10 * SECOND, None);
        assert_eq!(attempts.begin(), Some(0));
        assert_eq!(attempts.stop(), None);
        assert!(!attempts.launched(0, 2, t0));
        assert_eq!(attempts.hung(t0 + 60 * SECOND), None);
        assert_eq!(attempts.ended(), Some(Next::Stopped));
        // A launch that fails while stopping: no restart.
        let mut attempts = Attempts::new(3, 10 * SECOND, None);
        assert_eq!(attempts.begin(), Some(0));
        assert_eq!(attempts.stop(), None);
        assert!(attempts.launch_failed(0, "no room".into(), t0).is_some());
        assert_eq!(attempts.ended(), Some(Next::Stopped));
        // Ending after a failure: stopped instead of restarted; a failure
        // beyond max_failures still gives up.
        let mut attempts = running(3, None, 2, t0);
        assert!(attempts.rank_failed(0, 1, "boom", t0).is_some());
        assert_eq!(attempts.stop(), None);
        assert_eq!(attempts.ended(), Some(Next::Stopped));
        let mut attempts = running(0, None, 2, t0);
        assert!(attempts.rank_failed(0, 1, "boom", t0).is_some());
        assert_eq!(attempts.stop(), None);
        assert!(matches!(attempts.ended(), Some(Next::GiveUp(_))));
        // Between a failure and its restart: over at once.
        let mut attempts = running(3, None, 2, t0);
        assert!(attempts.rank_failed(0, 1, "boom", t0).is_some());
        assert_eq!(attempts.ended(), Some(Next::Restart));
        assert_eq!(attempts.stop(), Some(StopNow::Complete));
        assert_eq!(attempts.begin(), None);
        // Finished runs stay finished.
        let mut attempts = running(3, None, 1, t0);
        assert!(attempts.rank_finished(0, 0));
        assert_eq!(attempts.stop(), None);
        assert_eq!(attempts.ended(), Some(Next::Done));
        assert_eq!(attempts.stop(), None);
    }

    /// A seeded simulation in virtual time: attempts launch (or fail to),
    /// ranks progress, fail, hang and finish, nodes join with or without
    /// room, stale news arrives, in random order. The policy must agree at
    /// every step with a model of the actor's view, and keep its
    /// invariants. A failure prints its seed, which replays it.
    #[test]
    fn simulated_runs_keep_the_invariants() {
        let mut seen = Stats::default();
        for seed in 1..=100u64 {
            let mut sim = Sim::new(seed);
            for step in 0..3_000 {
                sim.step(step);
                sim.check();
            }
            seen.add(&sim.stats);
        }
        let Stats(counts) = seen;
        assert!(counts.iter().all(|n| *n > 0), "never seen: {counts:?}");
    }

    /// Counts of what a simulation went through: done, given up, rescales,
    /// hangs, failed launches, heals, heals over, deaths during a heal,
    /// deaths that found no peer to heal from, deaths that found no failure
    /// left to heal with.
    #[derive(Debug, Default)]
    struct Stats([u32; 10]);

    impl Stats {
        fn add(&mut self, other: &Stats) {
            for (n, m) in self.0.iter_mut().zip(other.0) {
                *n += m;
            }
        }
    }

    /// A worker of the running attempt, as the actor's model sees it.
    #[derive(Clone)]
    struct Worker {
        steps: u64,
        changed: Instant,
        finished: bool,
        /// Its number: one more per replacement.
        worker: u32,
        healable: bool,
    }

    /// A heal in the model: the ranks replaced, those yet to report, since.
    type ModelHeal = (Vec<usize>, Vec<usize>, Instant);

    /// Why the model's attempt is being torn down.
    #[derive(Debug)]
    enum End {
        Failed(String),
        Finished,
        Rescaled,
    }

    /// The policy and, beside it, a model of the actor's view.
    struct Sim {
        seed: u64,
        rng: u64,
        now: Instant,
        timeout: Duration,
        max_failures: u32,
        elastic: Option<usize>,
        policy: Attempts,
        /// A start is due (the first, or after a restart).
        due: bool,
        launching: Option<u64>,
        live: Option<(u64, Vec<Worker>)>,
        ending: Option<End>,
        /// Attempts with a probe for room in flight.
        probes: Vec<u64>,
        begun: u64,
        /// Decisions that ended each attempt, by id.
        ends: Vec<u32>,
        reasons: Vec<String>,
        rescales: u32,
        /// Failures mended by a heal.
        healed: u32,
        healing: Option<ModelHeal>,
        failed_at: Option<Instant>,
        /// The policy, printed, once the run is over.
        over: Option<String>,
        stats: Stats,
    }

    impl Sim {
        fn new(seed: u64) -> Sim {
            let mut sim = Sim {
                seed,
                rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
                now: Instant::now(),
                timeout: 10 * SECOND,
                max_failures: 0,
                elastic: None,
                policy: Attempts::new(0, SECOND, None),
                due: true,
                launching: None,
                live: None,
                ending: None,
                probes: Vec::new(),
                begun: 0,
                ends: Vec::new(),
                reasons: Vec::new(),
                rescales: 0,
                healed: 0,
                healing: None,
                failed_at: None,
                over: None,
                stats: Stats::default(),
            };
            sim.max_failures = sim.next(12) as u32;
            sim.elastic = (sim.next(2) == 0).then_some(4);
            sim.policy = Attempts::new(sim.max_failures, sim.timeout, sim.elastic);
            sim
        }

        fn next(&mut self, bound: u64) -> u64 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            self.rng % bound
        }

        fn step(&mut self, step: u32) {
            // Whole tenths of a second: some checks land on the timeout.
            let elapse = Duration::from_millis(100 * self.next(4));
            self.now += elapse;
            let live = self.live.as_ref().map(|(id, _)| *id);
            let id = match live {
                Some(id) if self.next(4) != 0 => id,
                _ => self.next(self.begun + 1),
            };
            let rank = self.next(5) as usize;
            match self.next(20) {
                0 => self.begin(),
                1 => self.launch(),
                2..=8 => self.progress(id, rank),
                9 | 18 => self.died(id, rank),
                10 | 19 => self.report(id, rank),
                11 if self.next(8) == 0 => self.rank_failed(id, rank, format!("boom {step}")),
                12 if self.next(3) == 0 => self.rank_finished(id, rank),
                13 => self.hang(),
                14 => self.node_joined(id),
                15 => self.probed(),
                16 | 17 => self.torn_down(),
                _ => {}
            }
        }

        fn begin(&mut self) {
            let got = self.policy.begin();
            if !self.due {
                assert_eq!(got, None, "seed {}: began while not due", self.seed);
                return;
            }
            assert_eq!(got, Some(self.begun), "seed {}", self.seed);
            self.due = false;
            self.launching = Some(self.begun);
            self.begun += 1;
            self.ends.push(0);
        }

        fn launch(&mut self) {
            let Some(id) = self.launching.take() else {
                let stale = self.next(self.begun + 1);
                let before = format!("{:?}", self.policy);
                self.policy.launched(stale, 2, self.now);
                let failed = self.policy.launch_failed(stale, "stale".into(), self.now);
                assert_eq!(failed, None, "seed {}", self.seed);
                assert_eq!(before, format!("{:?}", self.policy), "seed {}", self.seed);
                return;
            };
            if self.next(5) == 0 {
                let reason = format!("launch {id} failed");
                let got = self.policy.launch_failed(id, reason.clone(), self.now);
                self.failed(id, got, reason);
                self.stats.0[4] += 1;
                return self.torn_down();
            }
            let ranks = match self.elastic {
                Some(max) => 1 + self.next(max as u64) as usize,
                None => 3,
            };
            self.policy.launched(id, ranks, self.now);
            let worker = Worker {
                steps: 0,
                changed: self.now,
                finished: false,
                worker: 0,
                healable: false,
            };
            self.live = Some((id, vec![worker; ranks]));
            self.healing = None;
        }

        /// The model's worker `rank` of attempt `id`, if it runs.
        fn worker(&mut self, id: u64, rank: usize) -> Option<&mut Worker> {
            match &mut self.live {
                Some((live, workers)) if *live == id => workers.get_mut(rank),
                _ => None,
            }
        }

        fn progress(&mut self, id: u64, rank: usize) {
            let (advance, stale, now) = (self.next(2) == 0, self.next(10), self.now);
            let steps = match self.worker(id, rank) {
                Some(w) if advance && !w.finished => {
                    w.steps += 1;
                    w.changed = now;
                    Some(w.steps)
                }
                Some(w) => Some(w.steps),
                None => None,
            };
            let got = self.policy.progress(id, rank, steps.unwrap_or(stale), now);
            assert_eq!(got, steps.is_some(), "seed {}", self.seed);
            if self.next(3) != 0 {
                if let Some(w) = self.worker(id, rank) {
                    w.healable = true;
                }
                self.policy.healable(id, rank, true);
            }
        }

        /// Worker of rank `rank` of attempt `id` dies or fails, in a group
        /// that can heal or not, as the actor's model of step 11 expects.
        fn died(&mut self, id: u64, rank: usize) {
            let ranks = self.live.as_ref().map_or(0, |(_, w)| w.len() as u64);
            let rank = match self.next(4) {
                0 => rank,
                _ => self.next(ranks.max(1)) as usize,
            };
            let (can_heal, died, stale) = (self.next(4) != 0, self.next(3) != 0, self.next(8) == 0);
            let reason = format!("lost {}", self.next(1000));
            let worker = self.worker(id, rank).map(|w| w.worker);
            let number = worker.unwrap_or(0) + u32::from(stale);
            let now = self.now;
            let got = self
                .policy
                .worker_lost((id, rank, number), (&reason, died), can_heal, now);
            let (Some(_), false) = (worker, stale) else {
                return assert_eq!(got, None, "seed {}", self.seed);
            };
            let Some((_, workers)) = &mut self.live else {
                unreachable!("a worker of a live attempt");
            };
            let heal = self.healing.as_ref();
            let replacing = heal.is_some_and(|h| h.0.contains(&rank));
            let mut lost = heal.map_or(Vec::new(), |h| h.0.clone());
            if !lost.contains(&rank) {
                lost.push(rank);
            }
            lost.sort_unstable();
            let survivors: Vec<usize> = (0..workers.len()).filter(|r| !lost.contains(r)).collect();
            let mendable = can_heal
                && (died || replacing)
                && !survivors.is_empty()
                && workers.iter().all(|w| !w.finished)
                && survivors.iter().all(|&r| workers[r].healable);
            let failures_left = (self.reasons.len() as u32) < self.max_failures;
            if mendable && !failures_left {
                self.stats.0[9] += 1;
            }
            if !(mendable && failures_left) {
                if survivors.is_empty() && can_heal && died {
                    self.stats.0[8] += 1;
                }
                let failed = got.map(|death| match death {
                    Death::Failed(failure) => failure,
                    Death::Heal(heal) => panic!("seed {}: healed {heal:?}", self.seed),
                });
                return match workers[rank].finished {
                    true => assert_eq!(failed, None, "seed {}", self.seed),
                    false => self.failed(id, failed, format!("worker rank {rank}: {reason}")),
                };
            }
            let reason = format!("worker rank {rank}: {reason}");
            let mut ranks = Vec::new();
            for w in workers.iter_mut() {
                w.changed = now;
            }
            for &r in &lost {
                workers[r].worker += 1;
                workers[r].steps = 0;
                workers[r].healable = false;
                ranks.push((r, workers[r].worker));
            }
            let since = heal.map_or(now, |h| h.2);
            self.stats.0[5] += 1;
            if replacing || heal.is_some() {
                self.stats.0[7] += 1;
            }
            self.healing = Some((lost.clone(), lost, since));
            self.healed += 1;
            self.reasons.push(reason.clone());
            self.failed_at.get_or_insert(now);
            let expected = Heal {
                number: u64::from(self.healed),
                ranks,
                source: survivors[0],
                reason,
            };
            assert_eq!(got, Some(Death::Heal(expected)), "seed {}", self.seed);
        }

        fn report(&mut self, id: u64, rank: usize) {
            let waiting = self.healing.as_ref().map_or(Vec::new(), |h| h.1.clone());
            let rank = match waiting.is_empty() || self.next(2) == 0 {
                true => rank,
                false => waiting[self.next(waiting.len() as u64) as usize],
            };
            let now = self.now;
            let worker = self.worker(id, rank).map(|w| w.worker);
            let got = self.policy.healed((id, rank, worker.unwrap_or(0)), now);
            let mut expected = None;
            if let (Some(_), Some((ranks, waiting, since))) = (worker, &mut self.healing) {
                waiting.retain(|&r| r != rank);
                if waiting.is_empty() {
                    expected = Some(Healed {
                        ranks: ranks.clone(),
                        took: now - *since,
                    });
                    self.healing = None;
                    self.stats.0[6] += 1;
                }
            }
            assert_eq!(got, expected, "seed {}", self.seed);
            let expected = match self.worker(id, rank) {
                Some(_) if rank == 0 => self.failed_at.take().map(|at| now - at),
                _ => None,
            };
            let got = self.policy.report(id, rank, now);
            assert_eq!(got, expected, "seed {}", self.seed);
        }

        fn rank_failed(&mut self, id: u64, rank: usize, reason: String) {
            let fails = self.worker(id, rank).is_some_and(|w| !w.finished);
            let got = self.policy.rank_failed(id, rank, &reason, self.now);
            if fails {
                self.failed(id, got, format!("worker rank {rank}: {reason}"));
            } else {
                assert_eq!(got, None, "seed {}", self.seed);
            }
        }

        /// Checks the failure `got` that ended attempt `id` for `reason`.
        fn failed(&mut self, id: u64, got: Option<Failure>, reason: String) {
            let attempt = self.policy.restarts();
            let expected = Failure {
                attempt,
                reason: reason.clone(),
            };
            assert_eq!(got, Some(expected), "seed {}", self.seed);
            self.failed_at.get_or_insert(self.now);
            self.end(id, End::Failed(reason));
        }

        fn rank_finished(&mut self, id: u64, rank: usize) {
            let got = self.policy.rank_finished(id, rank);
            let Some(worker) = self.worker(id, rank) else {
                return assert!(!got, "seed {}", self.seed);
            };
            worker.finished = true;
            let all = self
                .live
                .as_ref()
                .is_some_and(|(_, workers)| workers.iter().all(|w| w.finished));
            assert_eq!(got, all, "seed {}", self.seed);
            if all {
                self.end(id, End::Finished);
            }
        }

        /// What the model says is hung.
        fn expected_hung(&self) -> Option<(u64, usize)> {
            let (id, workers) = self.live.as_ref()?;
            let silent = |w: &Worker| self.now - w.changed > self.timeout;
            let rank = workers.iter().position(|w| !w.finished && silent(w))?;
            Some((*id, rank))
        }

        fn hang(&mut self) {
            if let Some((id, rank)) = self.policy.hung(self.now) {
                self.stats.0[3] += 1;
                self.rank_failed(id, rank, "hung".into());
            }
        }

        fn node_joined(&mut self, id: u64) {
            let extra = match (&self.live, self.elastic) {
                (Some((live, workers)), Some(max)) if *live == id => {
                    Some(max - workers.len()).filter(|e| *e > 0)
                }
                _ => None,
            };
            let got = self.policy.room_wanted(id);
            assert_eq!(got, extra, "seed {}", self.seed);
            if got.is_some() {
                self.probes.push(id);
            }
        }

        fn probed(&mut self) {
            if self.probes.is_empty() || self.next(2) == 0 {
                return; // No probe, or no room: nothing to do.
            }
            let index = self.next(self.probes.len() as u64) as usize;
            let id = self.probes.swap_remove(index);
            let expected = match (&self.live, self.elastic) {
                (Some((live, workers)), Some(to)) if *live == id => Some(Rescale {
                    from: workers.len(),
                    to,
                }),
                _ => None,
            };
            let got = self.policy.room_found(id);
            let grows = expected.is_some();
            assert_eq!(got, expected, "seed {}", self.seed);
            if grows {
                self.end(id, End::Rescaled);
            }
        }

        /// Attempt `id` ends: the model tears it down.
        fn end(&mut self, id: u64, why: End) {
            self.live = None;
            self.healing = None;
            self.launching = None;
            self.ending = Some(why);
            self.ends[id as usize] += 1;
            let ends = self.ends[id as usize];
            assert_eq!(
                ends, 1,
                "seed {}: attempt {id} ended {ends} times",
                self.seed
            );
        }

        fn torn_down(&mut self) {
            let got = self.policy.ended();
            let Some(why) = self.ending.take() else {
                return assert_eq!(got, None, "seed {}", self.seed);
            };
            match (why, got) {
                (End::Rescaled, Some(Next::Restart)) => {
                    self.rescales += 1;
                    self.stats.0[2] += 1;
                    self.due = true;
                }
                (End::Finished, Some(Next::Done)) => self.over(0),
                (End::Failed(reason), next) => {
                    self.reasons.push(reason);
                    self.after_failure(next);
                }
                other => panic!("seed {}: {other:?}", self.seed),
            }
        }

        fn after_failure(&mut self, next: Option<Next>) {
            let failures = self.reasons.len() as u32;
            if failures <= self.max_failures {
                assert_eq!(next, Some(Next::Restart), "seed {}", self.seed);
                self.due = true;
                return;
            }
            let exhausted = Exhausted {
                failures,
                max_failures: self.max_failures,
                first: self.reasons[0].clone(),
                last: self.reasons[self.reasons.len() - 1].clone(),
            };
            assert_eq!(next, Some(Next::GiveUp(exhausted)), "seed {}", self.seed);
            self.over(1);
        }

        fn over(&mut self, outcome: usize) {
            self.stats.0[outcome] += 1;
            self.over = Some(format!("{:?}", self.policy));
        }

        /// The invariants, after every step.
        fn check(&self) {
            let seed = self.seed;
            let policy = &self.policy;
            assert_eq!(policy.failures, self.reasons, "seed {seed}");
            assert!(
                policy.failures.len() as u32 <= self.max_failures + 1,
                "seed {seed}"
            );
            assert_eq!(policy.hung(self.now), self.expected_hung(), "seed {seed}");
            match &self.over {
                Some(over) => assert_eq!(*over, format!("{policy:?}"), "seed {seed}"),
                None => {
                    let restarts = self.reasons.len() as u32 - self.healed + self.rescales;
                    assert_eq!(policy.restarts(), restarts, "seed {seed}");
                }
            }
            let busy = [
                self.due,
                self.launching.is_some(),
                self.live.is_some(),
                self.ending.is_some(),
            ];
            let busy = busy.iter().filter(|b| **b).count();
            assert!(busy <= 1, "seed {seed}: {busy} attempts at once");
        }
    }
}
