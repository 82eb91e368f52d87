//! The task pool's policy, as a plain state machine: which worker a task
//! runs on, when a new one is started, who waits for a returned lease, when
//! an idle lease is given up, and whether a failed task is retried. Every
//! method takes the news (and the time, where it matters) and returns a
//! decision; `pool.rs` and `drive` carry it out (start, hand over, kill,
//! resubmit, fail the result) and report back.
//!
//! The caller owns the limits and passes them in a [`LeaseLimits`]
//! (`pool.rs`: `IDLE_LEASE`, `MAX_STARTING`, and the task module's
//! `QUEUE_POLL` as the back-off). Each key also has its tasks' limit of
//! tasks in flight per worker, `max_in_flight` (given with each ask; a
//! worker runs its tasks one at a time, in the order they reach it, so the
//! others wait there, in the worker, rather than here). Per placement key:
//! 1. An idle worker (no task in flight) is reused before anything is
//!    started, the one that went idle last first ([`Leases::ask`] →
//!    [`Ask::Run`]).
//! 2. Otherwise a worker is started ([`Ask::Start`]), unless
//!    `max_starting` are being started already or the key is backing off.
//! 3. Otherwise, while the key backs off (no node has the resources
//!    free), the task goes to a busy worker with fewer than
//!    `max_in_flight` tasks in flight, the one with fewest first
//!    ([`Ask::Run`]): it runs after the tasks already there. (While starts
//!    are only under way, it waits for them instead: a task behind a long
//!    one would wait for no reason.)
//! 4. A start that found no capacity anywhere makes the key back off for
//!    `full_backoff`; its asker runs as in 1 or 3 if it can, else queues
//!    ([`Leases::started`]), and the tickets queued meanwhile go to the
//!    workers with room as in 3, oldest first. A start that failed fails
//!    its asker; a worker that started runs its asker and, while the key
//!    backs off, takes queued tickets in the same way.
//! 5. An asker that can do none of these gets a [`Ticket`] at the back of
//!    the key's queue ([`Ask::Queue`]). It may give up waiting
//!    ([`Leases::cancel`]) and ask again, behind those still queued.
//! 6. A worker whose task finished goes to the oldest ticket still queued
//!    ([`Release::Handoff`]), else it has one task fewer in flight
//!    ([`Release::Kept`]). A ticket whose asker is gone passes its worker
//!    on: release it again.
//! 7. A worker that failed a task is no longer lent ([`Leases::lost`]);
//!    the other tasks in flight on it find out by their own calls, and
//!    their releases are ignored ([`Release::Gone`]).
//! 8. A worker with no task in flight for `idle` or longer is given up:
//!    [`Leases::expire`] returns it, for the caller to kill.
//! 9. While the last start of a key found no capacity and none has
//!    started since, its tasks waiting to run (queued, or behind another
//!    on a worker) are what it needs room for ([`Leases::waiting_for_room`]:
//!    the caller tells the head, for an autoscaler).
//!
//! And per task ([`Retries`]):
//! 10. A failure of the task itself (an error of its function, or its
//!    panic, which its worker catches), a panic recorded in the worker's
//!    death, or a call that failed with the worker still there (it could
//!    not be encoded or decoded) fails the task at once.
//! 11. A call that failed because the worker process or its node was lost
//!    is retried on a new lease, `max_retries` times at most: the loss after
//!    that fails the task, with the number of losses and the last one.
//!    Every task in flight on a lost worker is retried on its own count:
//!    each knows from its own call that it did not finish.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The limits of [`Leases`], owned by the caller.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseLimits {
    /// An idle worker is given up after this long.
    pub(crate) idle: Duration,
    /// Workers being started at once per key.
    pub(crate) max_starting: usize,
    /// How long a key backs off after a start found no capacity.
    pub(crate) full_backoff: Duration,
}

/// The leases of every placement key `K`, on workers `W`; see the module
/// docs.
#[derive(Debug)]
pub(crate) struct Leases<K, W> {
    limits: LeaseLimits,
    pools: HashMap<K, Pool<W>>,
    next_ticket: u64,
    next_worker: u64,
}

/// The leases of one key.
#[derive(Debug)]
struct Pool<W> {
    /// Its workers, in the order they started.
    workers: Vec<Leased<W>>,
    /// Askers waiting for a worker, oldest first.
    waiting: VecDeque<Ticket>,
    /// Workers being started.
    starting: usize,
    /// No capacity was found when last asked: back off until then.
    full_until: Option<Instant>,
    /// The last start found no capacity, and none has started since.
    no_room: bool,
    /// Tasks in flight per worker, at most (at least 1).
    max_in_flight: usize,
}

impl<W> Default for Pool<W> {
    fn default() -> Self {
        Pool {
            workers: Vec::new(),
            waiting: VecDeque::new(),
            starting: 0,
            full_until: None,
            no_room: false,
            max_in_flight: 1,
        }
    }
}

/// A worker of a pool.
#[derive(Debug)]
struct Leased<W> {
    id: WorkerId,
    worker: W,
    /// Its tasks in flight: lent and not released.
    in_flight: usize,
    /// When its last task in flight was released (meaningful when none is).
    idle_since: Instant,
}

/// A worker's name in [`Leases`], for its releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct WorkerId(u64);

/// A worker lent to one task: release it by its `id` when the task ends.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Lent<W> {
    pub(crate) id: WorkerId,
    pub(crate) worker: W,
}

/// An asker's place in a key's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ticket(u64);

/// What an asker does next.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum Ask<W> {
    /// Run on this worker.
    Run(Lent<W>),
    /// Start a worker, then report with [`Leases::started`].
    Start,
    /// Wait for a worker handed to this ticket (or give up:
    /// [`Leases::cancel`]).
    Queue(Ticket),
}

/// How a start that [`Ask::Start`] asked for ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Started<W, E> {
    /// This worker is up.
    Up(W),
    /// No node had the resources free.
    NoCapacity,
    /// It failed otherwise, with this error: the asker fails.
    Failed(E),
}

/// What the asker of a start does once it ended.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum AfterStart<W, E> {
    /// Run on this worker; the queued tickets listed were handed it too.
    Run(Lent<W>, Vec<(Ticket, Lent<W>)>),
    /// Wait for a worker handed to this ticket.
    Queue(Ticket),
    /// Fail with the start's error.
    Fail(E),
}

/// Where a released worker goes.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum Release<W> {
    /// To the asker holding this ticket, the oldest queued; if that asker
    /// is gone, release the worker again.
    Handoff(Ticket, Lent<W>),
    /// Nobody waits: it has one task fewer in flight.
    Kept,
    /// It is no longer lent ([`Leases::lost`], or expired).
    Gone,
}

impl<W> Pool<W> {
    /// Whether the key backs off now: no node had room when last asked.
    fn full(&self, now: Instant) -> bool {
        self.full_until.is_some_and(|until| until > now)
    }

    /// The index of the idle worker that went idle last.
    fn newest_idle(&self) -> Option<usize> {
        (0..self.workers.len())
            .filter(|i| self.workers[*i].in_flight == 0)
            .max_by_key(|i| self.workers[*i].idle_since)
    }

    /// The index of the busy worker with room and fewest tasks in flight
    /// (the oldest of those).
    fn least_busy(&self) -> Option<usize> {
        (0..self.workers.len())
            .filter(|i| self.workers[*i].in_flight < self.max_in_flight)
            .min_by_key(|i| self.workers[*i].in_flight)
    }

    /// Hands the oldest queued tickets to the workers with room, the least
    /// busy first, until either runs out.
    fn fill(&mut self) -> Vec<(Ticket, Lent<W>)>
    where
        W: Clone,
    {
        let mut handed = Vec::new();
        while !self.waiting.is_empty() {
            let Some(index) = self.least_busy() else {
                break;
            };
            if let Some(ticket) = self.waiting.pop_front() {
                handed.push((ticket, self.lend(index)));
            }
        }
        handed
    }

    /// Lends worker `index` to one more task.
    fn lend(&mut self, index: usize) -> Lent<W>
    where
        W: Clone,
    {
        let leased = &mut self.workers[index];
        leased.in_flight += 1;
        Lent {
            id: leased.id,
            worker: leased.worker.clone(),
        }
    }
}

impl<K: Eq + Hash + Clone, W: Clone> Leases<K, W> {
    /// No leases yet.
    pub(crate) fn new(limits: LeaseLimits) -> Self {
        Leases {
            limits,
            pools: HashMap::new(),
            next_ticket: 0,
            next_worker: 0,
        }
    }

    /// A task placed by `key`, allowing `max_in_flight` tasks per worker,
    /// wants a worker: reuse an idle one, start one, add it to a busy one,
    /// or queue.
    pub(crate) fn ask(&mut self, key: &K, max_in_flight: usize, now: Instant) -> Ask<W> {
        let max_starting = self.limits.max_starting;
        let pool = self.pool(key);
        pool.max_in_flight = max_in_flight.max(1);
        if let Some(index) = pool.newest_idle() {
            return Ask::Run(pool.lend(index));
        }
        let full = pool.full(now);
        if !full && pool.starting < max_starting {
            pool.starting += 1;
            return Ask::Start;
        }
        if let Some(index) = pool.least_busy().filter(|_| full) {
            return Ask::Run(pool.lend(index));
        }
        Ask::Queue(self.queue(key))
    }

    /// A start for `key` ended: what its asker does.
    pub(crate) fn started<E>(
        &mut self,
        key: &K,
        outcome: Started<W, E>,
        now: Instant,
    ) -> AfterStart<W, E> {
        let backoff = self.limits.full_backoff;
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        let pool = self.pool(key);
        pool.starting = pool.starting.saturating_sub(1);
        match outcome {
            Started::Failed(error) => AfterStart::Fail(error),
            Started::Up(worker) => {
                pool.no_room = false;
                pool.workers.push(Leased {
                    id,
                    worker,
                    in_flight: 0,
                    idle_since: now,
                });
                let mine = pool.lend(pool.workers.len() - 1);
                let handed = if pool.full(now) {
                    pool.fill()
                } else {
                    Vec::new()
                };
                AfterStart::Run(mine, handed)
            }
            Started::NoCapacity => {
                pool.full_until = Some(now + backoff);
                pool.no_room = true;
                if let Some(index) = pool.newest_idle().or_else(|| pool.least_busy()) {
                    let mine = pool.lend(index);
                    return AfterStart::Run(mine, pool.fill());
                }
                AfterStart::Queue(self.queue(key))
            }
        }
    }

    /// A task on worker `id`, placed by `key`, finished: hand the worker
    /// to the oldest queued ticket, or count one task fewer on it.
    pub(crate) fn release(&mut self, key: &K, id: WorkerId, now: Instant) -> Release<W> {
        let pool = self.pool(key);
        let Some(leased) = pool.workers.iter_mut().find(|w| w.id == id) else {
            return Release::Gone;
        };
        match pool.waiting.pop_front() {
            Some(ticket) => Release::Handoff(
                ticket,
                Lent {
                    id,
                    worker: leased.worker.clone(),
                },
            ),
            None => {
                leased.in_flight = leased.in_flight.saturating_sub(1);
                if leased.in_flight == 0 {
                    leased.idle_since = now;
                }
                Release::Kept
            }
        }
    }

    /// Worker `id` of `key` failed a task: it is lent no more. Whether it
    /// was still lent.
    pub(crate) fn lost(&mut self, key: &K, id: WorkerId) -> bool {
        let Some(pool) = self.pools.get_mut(key) else {
            return false;
        };
        let before = pool.workers.len();
        pool.workers.retain(|w| w.id != id);
        pool.workers.len() < before
    }

    /// The asker holding `ticket` gives up waiting: whether the ticket was
    /// still queued (`false`: it was handed a worker already).
    pub(crate) fn cancel(&mut self, key: &K, ticket: Ticket) -> bool {
        let Some(pool) = self.pools.get_mut(key) else {
            return false;
        };
        let Some(index) = pool.waiting.iter().position(|t| *t == ticket) else {
            return false;
        };
        pool.waiting.remove(index);
        true
    }

    /// Step 9: the keys whose last start found no capacity, with their
    /// tasks waiting to run (queued, or behind another on a worker).
    pub(crate) fn waiting_for_room(&self) -> Vec<(K, usize)> {
        self.pools
            .iter()
            .filter(|(_, pool)| pool.no_room)
            .map(|(key, pool)| {
                let behind: usize = pool
                    .workers
                    .iter()
                    .map(|w| w.in_flight.saturating_sub(1))
                    .sum();
                (key.clone(), pool.waiting.len() + behind)
            })
            .collect()
    }

    /// Takes out the workers idle for the limit or longer, to kill.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<W> {
        let limit = self.limits.idle;
        let mut expired = Vec::new();
        for pool in self.pools.values_mut() {
            let (old, kept): (Vec<Leased<W>>, _) = std::mem::take(&mut pool.workers)
                .into_iter()
                .partition(|w| {
                    w.in_flight == 0 && now.saturating_duration_since(w.idle_since) >= limit
                });
            pool.workers = kept;
            expired.extend(old.into_iter().map(|w| w.worker));
        }
        expired
    }

    /// The leases of `key`.
    fn pool(&mut self, key: &K) -> &mut Pool<W> {
        self.pools.entry(key.clone()).or_default()
    }

    /// Queues a new ticket for `key`.
    fn queue(&mut self, key: &K) -> Ticket {
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.pool(key).waiting.push_back(ticket);
        ticket
    }
}

/// Why a run of a task did not succeed: `A`, an error of the task itself;
/// `E`, an error of the call to its worker.
#[derive(Debug)]
pub(crate) enum Failure<A, E> {
    /// The task failed in its worker (its function returned an error).
    Application(A),
    /// The worker died of a panic, with this message.
    Panicked(String),
    /// The call failed with the worker still there (encoding, decoding).
    NotLost(E),
    /// The call failed because the worker process or its node was lost.
    Lost(E),
}

/// What follows a [`Failure`].
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict<A, E> {
    /// Run it again on a new lease; this loss is why.
    Retry(E),
    /// The task failed.
    Fail(Reason<A, E>),
}

/// Why a task failed. It displays as the end of a sentence about the task:
/// `task {name} {reason}`.
#[derive(Debug, PartialEq)]
pub(crate) enum Reason<A, E> {
    /// Its function failed.
    Failed(A),
    /// Its worker panicked, with this message.
    Panicked(String),
    /// The call to its worker failed without a loss.
    CouldNotRun(E),
    /// It was lost more than `max_retries` times.
    Lost {
        /// How many times it was lost: the retried losses and the last.
        times: u32,
        /// The retries allowed.
        max_retries: u32,
        /// The last loss.
        last: E,
    },
}

impl<A: fmt::Display, E: fmt::Display> fmt::Display for Reason<A, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Failed(application) => write!(f, "failed: {application}"),
            Reason::Panicked(panic) => write!(f, "failed: it panicked: {panic}"),
            Reason::CouldNotRun(system) => write!(f, "could not run: {system}"),
            Reason::Lost {
                times,
                max_retries,
                last,
            } => write!(
                f,
                "was lost {times} times (max_retries = {max_retries}); last: {last}"
            ),
        }
    }
}

/// The losses of one task, and how many are allowed a retry.
#[derive(Debug)]
pub(crate) struct Retries {
    max_retries: u32,
    losses: u32,
}

impl Retries {
    /// No loss yet; `max_retries` losses are retried.
    pub(crate) fn new(max_retries: u32) -> Self {
        Retries {
            max_retries,
            losses: 0,
        }
    }

    /// A run failed: retry after a loss while the retries last, else fail.
    pub(crate) fn after<A, E>(&mut self, failure: Failure<A, E>) -> Verdict<A, E> {
        let reason = match failure {
            Failure::Application(application) => Reason::Failed(application),
            Failure::Panicked(panic) => Reason::Panicked(panic),
            Failure::NotLost(system) => Reason::CouldNotRun(system),
            Failure::Lost(last) => {
                self.losses = self.losses.saturating_add(1);
                if self.losses <= self.max_retries {
                    return Verdict::Retry(last);
                }
                Reason::Lost {
                    times: self.losses,
                    max_retries: self.max_retries,
                    last,
                }
            }
        };
        Verdict::Fail(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const SECOND: Duration = Duration::from_secs(1);
    const MILLI: Duration = Duration::from_millis(1);

    /// The limits `pool.rs` passes.
    const LIMITS: LeaseLimits = LeaseLimits {
        idle: Duration::from_secs(2),
        max_starting: 2,
        full_backoff: Duration::from_millis(500),
    };

    /// A start's outcome in these tests: workers are numbers, errors text.
    type Outcome = Started<u32, &'static str>;

    /// The ticket an asker queued with.
    fn queued(ask: Ask<u32>) -> Ticket {
        match ask {
            Ask::Queue(ticket) => ticket,
            other => panic!("expected to queue, got {other:?}"),
        }
    }

    /// The worker an asker runs on.
    fn runs(ask: Ask<u32>) -> Lent<u32> {
        match ask {
            Ask::Run(lent) => lent,
            other => panic!("expected to run, got {other:?}"),
        }
    }

    /// Asks for a worker of `key` (`max` in flight), which must be
    /// started, and starts `worker`: its lease, and the tickets it took.
    fn start(
        leases: &mut Leases<&'static str, u32>,
        key: &'static str,
        max: usize,
        worker: u32,
        now: Instant,
    ) -> (Lent<u32>, Vec<(Ticket, Lent<u32>)>) {
        assert_eq!(leases.ask(&key, max, now), Ask::Start);
        match leases.started(&key, Outcome::Up(worker), now) {
            AfterStart::Run(lent, handed) => (lent, handed),
            other => panic!("expected to run, got {other:?}"),
        }
    }

    /// Leases of key "a" (one task per worker) with two workers being
    /// started and `n` askers queued behind them; returns their tickets,
    /// oldest first.
    fn full(n: usize, t0: Instant) -> (Leases<&'static str, u32>, Vec<Ticket>) {
        let mut leases = Leases::new(LIMITS);
        assert_eq!(leases.ask(&"a", 1, t0), Ask::Start);
        assert_eq!(leases.ask(&"a", 1, t0), Ask::Start);
        let tickets = (0..n).map(|_| queued(leases.ask(&"a", 1, t0))).collect();
        (leases, tickets)
    }

    #[test]
    fn tasks_wait_for_room_from_a_start_that_found_none_until_one_starts() {
        let t0 = Instant::now();
        let mut leases = Leases::new(LIMITS);
        let (one, _) = start(&mut leases, "a", 2, 1, t0);
        assert_eq!(leases.ask(&"a", 2, t0), Ask::Start);
        assert!(leases.waiting_for_room().is_empty(), "a start is under way");
        // No room: the start's asker goes behind the task on worker 1, and
        // the next task queues.
        let full = leases.started(&"a", Outcome::NoCapacity, t0);
        assert!(matches!(full, AfterStart::Run(..)), "{full:?}");
        queued(leases.ask(&"a", 2, t0));
        assert_eq!(
            leases.waiting_for_room(),
            [("a", 2)],
            "one behind, one queued"
        );
        let _ = leases.release(&"a", one.id, t0);
        assert_eq!(leases.waiting_for_room(), [("a", 1)]);
        // A worker started: there is room again.
        let later = t0 + LIMITS.full_backoff;
        let _ = start(&mut leases, "a", 2, 2, later);
        assert!(leases.waiting_for_room().is_empty());
    }

    #[test]
    fn idle_leases_are_reused_newest_first_before_anything_starts() {
        let t0 = Instant::now();
        let mut leases = Leases::new(LIMITS);
        let (one, _) = start(&mut leases, "a", 1, 1, t0);
        let (two, _) = start(&mut leases, "a", 1, 2, t0);
        assert_eq!(leases.release(&"a", one.id, t0), Release::Kept);
        assert_eq!(leases.release(&"a", two.id, t0 + SECOND), Release::Kept);
        // Another key has its own leases.
        assert_eq!(leases.ask(&"b", 1, t0 + SECOND), Ask::Start);
        assert_eq!(leases.ask(&"a", 1, t0 + SECOND), Ask::Run(two));
        assert_eq!(leases.ask(&"a", 1, t0 + SECOND), Ask::Run(one));
        assert_eq!(leases.ask(&"a", 1, t0 + SECOND), Ask::Start);
    }

    #[test]
    fn at_most_max_starting_start_at_once_per_key() {
        let t0 = Instant::now();
        let (mut leases, tickets) = full(1, t0);
        assert_eq!(tickets.len(), 1);
        assert_eq!(leases.ask(&"b", 1, t0), Ask::Start);
        let failed = leases.started(&"a", Outcome::Failed("no binary"), t0);
        assert_eq!(failed, AfterStart::Fail("no binary"));
        assert_eq!(leases.ask(&"a", 1, t0), Ask::Start);
        queued(leases.ask(&"a", 1, t0));
        // One task per worker: a new worker takes no queued ticket.
        for worker in [1, 2] {
            let AfterStart::Run(lent, handed) = leases.started(&"a", Outcome::Up(worker), t0)
            else {
                panic!("worker {worker} did not run its asker");
            };
            assert_eq!((lent.worker, handed), (worker, Vec::new()));
        }
        assert_eq!(leases.pools[&"a"].starting, 0);
        assert_eq!(leases.pools[&"a"].waiting.len(), 2);
    }

    #[test]
    fn busy_workers_take_tasks_up_to_max_in_flight_while_no_node_has_room() {
        let t0 = Instant::now();
        let mut leases = Leases::new(LIMITS);
        let (one, _) = start(&mut leases, "a", 3, 1, t0);
        let (two, _) = start(&mut leases, "a", 3, 2, t0);
        // A start is still allowed: it comes first; while starts are under
        // way, the next task waits for them.
        assert_eq!(leases.ask(&"a", 3, t0), Ask::Start);
        assert_eq!(leases.ask(&"a", 3, t0), Ask::Start);
        let waits = queued(leases.ask(&"a", 3, t0));
        assert!(leases.cancel(&"a", waits));
        // No node has room: the least busy worker, the oldest of equals.
        let full = leases.started(&"a", Outcome::NoCapacity, t0);
        assert_eq!(full, AfterStart::Run(one.clone(), Vec::new()));
        let order: Vec<u32> = (0..3)
            .map(|_| runs(leases.ask(&"a", 3, t0)).worker)
            .collect();
        assert_eq!(order, [2, 1, 2]);
        let ticket = queued(leases.ask(&"a", 3, t0));
        assert_eq!(
            leases.release(&"a", two.id, t0),
            Release::Handoff(ticket, two.clone())
        );
        assert_eq!(leases.release(&"a", two.id, t0), Release::Kept);
        assert_eq!(runs(leases.ask(&"a", 3, t0)), two);
        // The back-off over, a start comes first again.
        let later = t0 + LIMITS.full_backoff;
        assert_eq!(leases.ask(&"a", 3, later), Ask::Start);
        assert_eq!(
            leases.started(&"a", Outcome::Failed("gone"), later),
            AfterStart::Fail("gone")
        );
        // An idle worker comes before a busy one with room.
        for _ in 0..3 {
            assert_eq!(leases.release(&"a", one.id, t0), Release::Kept);
        }
        assert_eq!(runs(leases.ask(&"a", 3, later)), one);
    }

    #[test]
    fn a_started_worker_takes_the_oldest_tickets_up_to_its_room_while_full() {
        let t0 = Instant::now();
        let mut leases = Leases::new(LIMITS);
        assert_eq!(leases.ask(&"a", 3, t0), Ask::Start);
        assert_eq!(leases.ask(&"a", 3, t0), Ask::Start);
        let tickets: Vec<Ticket> = (0..3).map(|_| queued(leases.ask(&"a", 3, t0))).collect();
        // One start finds no capacity and no worker has room: its asker
        // queues, and the key backs off.
        let after = leases.started(&"a", Outcome::NoCapacity, t0);
        let AfterStart::Queue(last) = after else {
            panic!("expected to queue, got {after:?}");
        };
        // The other worker starts meanwhile: it takes the oldest two.
        let AfterStart::Run(lent, handed) = leases.started(&"a", Outcome::Up(7), t0) else {
            panic!("the new worker did not run its asker");
        };
        let expected: Vec<(Ticket, Lent<u32>)> =
            tickets[..2].iter().map(|t| (*t, lent.clone())).collect();
        assert_eq!(handed, expected);
        assert_eq!(leases.pools[&"a"].waiting, [tickets[2], last]);
        // The back-off over, a new worker takes its own asker only.
        let later = t0 + LIMITS.full_backoff;
        assert_eq!(leases.ask(&"a", 3, later), Ask::Start);
        let AfterStart::Run(_, handed) = leases.started(&"a", Outcome::Up(8), later) else {
            panic!("the new worker did not run its asker");
        };
        assert!(handed.is_empty());
        assert_eq!(leases.pools[&"a"].waiting, [tickets[2], last]);
    }

    #[test]
    fn no_capacity_backs_off_and_runs_on_a_worker_with_room_if_any() {
        let t0 = Instant::now();
        let (mut leases, _) = full(0, t0);
        let first = match leases.started(&"a", Outcome::NoCapacity, t0) {
            AfterStart::Queue(ticket) => ticket,
            other => panic!("expected to queue, got {other:?}"),
        };
        // A slot is free, but the key backs off.
        let second = queued(leases.ask(&"a", 1, t0 + LIMITS.full_backoff - MILLI));
        assert_eq!(leases.ask(&"b", 1, t0), Ask::Start);
        assert_eq!(leases.ask(&"a", 1, t0 + LIMITS.full_backoff), Ask::Start);
        let AfterStart::Run(seven, handed) = leases.started(&"a", Outcome::Up(7), t0) else {
            panic!("worker 7 did not run its asker");
        };
        assert!(handed.is_empty());
        let handoff = leases.release(&"a", seven.id, t0);
        assert_eq!(handoff, Release::Handoff(first, seven.clone()));
        let handoff = leases.release(&"a", seven.id, t0);
        assert_eq!(handoff, Release::Handoff(second, seven.clone()));
        assert_eq!(leases.release(&"a", seven.id, t0), Release::Kept);
        // The last start finds no capacity, but worker 7 is idle.
        let after = leases.started(&"a", Outcome::NoCapacity, t0);
        assert_eq!(after, AfterStart::Run(seven, Vec::new()));
    }

    #[test]
    fn a_release_goes_to_the_oldest_waiter_then_is_kept() {
        let t0 = Instant::now();
        let (mut leases, tickets) = full(2, t0);
        let AfterStart::Run(one, _) = leases.started(&"a", Outcome::Up(1), t0) else {
            panic!("worker 1 did not run its asker");
        };
        let handoff = leases.release(&"a", one.id, t0);
        assert_eq!(handoff, Release::Handoff(tickets[0], one.clone()));
        let handoff = leases.release(&"a", one.id, t0);
        assert_eq!(handoff, Release::Handoff(tickets[1], one.clone()));
        assert_eq!(leases.release(&"a", one.id, t0), Release::Kept);
        assert_eq!(leases.ask(&"a", 1, t0), Ask::Run(one));
    }

    #[test]
    fn cancelled_tickets_are_skipped_and_a_gone_asker_passes_its_worker_on() {
        let t0 = Instant::now();
        let (mut leases, tickets) = full(4, t0);
        assert!(leases.cancel(&"a", tickets[1]));
        assert!(!leases.cancel(&"a", tickets[1]));
        assert!(!leases.cancel(&"b", tickets[2]));
        let AfterStart::Run(one, _) = leases.started(&"a", Outcome::Up(1), t0) else {
            panic!("worker 1 did not run its asker");
        };
        let handoff = leases.release(&"a", one.id, t0);
        assert_eq!(handoff, Release::Handoff(tickets[0], one.clone()));
        // Handed a worker already: too late to cancel.
        assert!(!leases.cancel(&"a", tickets[0]));
        // The asker of tickets[2] is gone: its worker goes to the next.
        let handoff = leases.release(&"a", one.id, t0);
        assert_eq!(handoff, Release::Handoff(tickets[2], one.clone()));
        let handoff = leases.release(&"a", one.id, t0);
        assert_eq!(handoff, Release::Handoff(tickets[3], one.clone()));
        assert_eq!(leases.release(&"a", one.id, t0), Release::Kept);
    }

    #[test]
    fn a_lost_worker_is_lent_no_more_and_its_releases_are_ignored() {
        let t0 = Instant::now();
        let mut leases = Leases::new(LIMITS);
        let (one, _) = start(&mut leases, "a", 2, 1, t0);
        let (two, _) = start(&mut leases, "a", 2, 2, t0);
        // No node has room for a third: the next tasks go to busy ones.
        assert_eq!(leases.ask(&"a", 2, t0), Ask::Start);
        let full = leases.started(&"a", Outcome::NoCapacity, t0);
        assert_eq!(full, AfterStart::Run(one.clone(), Vec::new()));
        let ticket = {
            assert_eq!(runs(leases.ask(&"a", 2, t0)), two);
            queued(leases.ask(&"a", 2, t0))
        };
        assert!(leases.lost(&"a", one.id));
        assert!(!leases.lost(&"a", one.id));
        // Its other task ends later: nothing to hand over, nothing kept.
        assert_eq!(leases.release(&"a", one.id, t0), Release::Gone);
        assert_eq!(leases.release(&"a", one.id, t0), Release::Gone);
        assert_eq!(
            leases.release(&"a", two.id, t0),
            Release::Handoff(ticket, two.clone())
        );
        queued(leases.ask(&"a", 2, t0));
    }

    #[test]
    fn expire_takes_exactly_the_workers_idle_for_the_limit() {
        let t0 = Instant::now();
        let mut leases = Leases::new(LIMITS);
        let mut lent = Vec::new();
        for (key, worker) in [("a", 1), ("a", 2), ("b", 3), ("b", 4)] {
            lent.push((key, start(&mut leases, key, 2, worker, t0).0));
        }
        // Worker 3 keeps a task in flight: never idle.
        assert_eq!(leases.ask(&"b", 2, t0), Ask::Start);
        let full = leases.started(&"b", Outcome::NoCapacity, t0);
        assert_eq!(full, AfterStart::Run(lent[2].1.clone(), Vec::new()));
        for ((key, lent), since) in lent.iter().zip([t0, t0 + SECOND, t0, t0]) {
            assert_eq!(leases.release(key, lent.id, since), Release::Kept);
        }
        let late = t0 + LIMITS.idle + SECOND;
        assert_eq!(leases.expire(t0 + LIMITS.idle - MILLI), Vec::<u32>::new());
        let mut expired = leases.expire(t0 + LIMITS.idle);
        expired.sort();
        assert_eq!(expired, [1, 4]);
        assert_eq!(leases.expire(t0 + LIMITS.idle), Vec::<u32>::new());
        assert_eq!(leases.ask(&"a", 2, late), Ask::Run(lent[1].1.clone()));
        assert_eq!(leases.expire(late), Vec::<u32>::new());
        assert_eq!(leases.release(&"a", lent[0].1.id, late), Release::Gone);
    }

    /// A task's failure message as `drive` words it.
    fn message(verdict: Verdict<&str, &str>) -> String {
        match verdict {
            Verdict::Fail(reason) => format!("task square {reason}"),
            Verdict::Retry(loss) => panic!("retried after {loss}"),
        }
    }

    #[test]
    fn three_max_retries_retry_three_losses_and_the_fourth_fails() {
        let mut retries = Retries::new(3);
        for _ in 0..3 {
            assert_eq!(
                retries.after(Failure::<&str, _>::Lost("dead")),
                Verdict::Retry("dead")
            );
        }
        let verdict = retries.after(Failure::Lost("node lost"));
        assert_eq!(
            message(verdict),
            "task square was lost 4 times (max_retries = 3); last: node lost"
        );
        let mut none = Retries::new(0);
        assert_eq!(
            message(none.after(Failure::Lost("dead"))),
            "task square was lost 1 times (max_retries = 0); last: dead"
        );
    }

    #[test]
    fn failures_that_are_not_losses_fail_at_once() {
        let mut retries = Retries::new(3);
        assert_eq!(
            retries.after(Failure::<&str, _>::Lost("dead")),
            Verdict::Retry("dead")
        );
        let failures = [
            (Failure::Application("boom"), "task square failed: boom"),
            (
                Failure::Panicked("oops".into()),
                "task square failed: it panicked: oops",
            ),
            (
                Failure::NotLost("bad frame"),
                "task square could not run: bad frame",
            ),
        ];
        for (failure, expected) in failures {
            assert_eq!(message(retries.after(failure)), expected);
        }
        assert_eq!(retries.losses, 1);
    }

    /// A seeded simulation in virtual time: tasks arrive on two keys (one
    /// task in flight per worker, and three) and ask for workers; starts
    /// succeed, find no capacity or fail; queued tasks take a handed
    /// worker, give up waiting and ask again, or vanish without
    /// cancelling; tasks finish and release, or lose their worker and ask
    /// again; idle workers expire; time passes; all in random order. The
    /// policy must agree with a model of the caller at every step, and
    /// drain at the end. A failure prints its seed, which replays it.
    #[test]
    fn simulated_leases_keep_the_invariants_and_drain() {
        let mut seen = Stats::default();
        for seed in 1..=20u64 {
            let mut sim = Sim::new(seed);
            for _ in 0..3_000 {
                sim.step();
                sim.check();
            }
            sim.drain();
            seen.add(&sim.stats);
        }
        let Stats(counts) = seen;
        assert!(counts.iter().all(|n| *n > 0), "never seen: {counts:?}");
    }

    /// Tasks in flight per worker, per simulated key.
    const MAX_IN_FLIGHT: [usize; 2] = [1, 3];

    /// Counts of what a simulation went through: idle reuses, starts,
    /// starts without capacity, handoffs, handoffs to a vanished asker,
    /// cancels too late (a worker was handed), expired workers, tasks sent
    /// to a busy worker, lost workers, releases of a lost worker, queued
    /// tickets handed a worker after a start.
    #[derive(Debug, Default)]
    struct Stats([u32; 11]);

    impl Stats {
        fn add(&mut self, other: &Stats) {
            for (n, m) in self.0.iter_mut().zip(other.0) {
                *n += m;
            }
        }
    }

    /// What a simulated task is doing.
    #[derive(Clone, Copy, Debug)]
    enum Doing {
        /// Starting a worker.
        Starting,
        /// Queued with this ticket; a worker handed to it is in `inbox`.
        Queued {
            ticket: Ticket,
            inbox: Option<WorkerId>,
        },
        /// Running on this worker.
        Running(WorkerId),
        /// Vanished while queued, without cancelling its ticket.
        Gone(Ticket),
        /// Finished, or failed to start.
        Done,
    }

    /// A task: its key and what it does.
    struct Task {
        key: u8,
        doing: Doing,
    }

    /// The model's view of a worker lent out.
    #[derive(Debug)]
    struct Model {
        key: u8,
        worker: u32,
        in_flight: usize,
        idle_since: Instant,
    }

    /// The policy and, beside it, a model of the caller's view.
    struct Sim {
        seed: u64,
        rng: u64,
        now: Instant,
        leases: Leases<u8, u32>,
        tasks: Vec<Task>,
        /// Workers started, neither lost nor expired.
        workers: HashMap<WorkerId, Model>,
        /// Per key, the tickets queued, oldest first.
        queues: HashMap<u8, VecDeque<Ticket>>,
        /// Per key, when its back-off ends.
        backoff: HashMap<u8, Instant>,
        /// Tickets handed a worker.
        handed: HashSet<Ticket>,
        started: u32,
        stats: Stats,
    }

    impl Sim {
        fn new(seed: u64) -> Self {
            Sim {
                seed,
                rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
                now: Instant::now(),
                leases: Leases::new(LIMITS),
                tasks: Vec::new(),
                workers: HashMap::new(),
                queues: HashMap::new(),
                backoff: HashMap::new(),
                handed: HashSet::new(),
                started: 0,
                stats: Stats::default(),
            }
        }

        fn next(&mut self, bound: u64) -> u64 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            self.rng % bound
        }

        /// One random event: a task arrives (while fewer than a dozen are
        /// at work), one at work makes progress, idle workers expire, or
        /// time passes.
        fn step(&mut self) {
            let working: Vec<usize> = (0..self.tasks.len())
                .filter(|i| !matches!(self.tasks[*i].doing, Doing::Gone(_) | Doing::Done))
                .collect();
            match self.next(10) {
                0..=2 if working.len() < 12 => self.arrive(),
                _ if working.is_empty() => self.arrive(),
                0..=6 => {
                    let i = working[self.next(working.len() as u64) as usize];
                    self.progress(i);
                }
                7 => self.expire(),
                _ => {
                    let pause = self.next(400) as u32 * MILLI;
                    self.now += pause;
                }
            }
        }

        /// A new task asks for a worker.
        fn arrive(&mut self) {
            let key = self.next(2) as u8;
            let doing = Doing::Done;
            self.tasks.push(Task { key, doing });
            self.ask(self.tasks.len() - 1);
        }

        /// Task `i`, at work, makes progress (or not).
        fn progress(&mut self, i: usize) {
            let doing = self.tasks[i].doing;
            match doing {
                Doing::Starting => {
                    let outcome = match self.next(10) {
                        0..=5 => {
                            self.started += 1;
                            Started::Up(self.started)
                        }
                        6..=7 => Started::NoCapacity,
                        _ => Started::Failed("no binary"),
                    };
                    self.start_ends(i, outcome);
                }
                Doing::Queued { inbox: Some(_), .. } if self.next(2) == 0 => self.take(i),
                Doing::Queued { inbox: Some(_), .. } => self.give_up(i),
                Doing::Queued {
                    ticket,
                    inbox: None,
                } => match self.next(10) {
                    0 => self.tasks[i].doing = Doing::Gone(ticket),
                    1..=4 => self.give_up(i),
                    _ => {}
                },
                Doing::Running(id) => match self.next(8) {
                    0..=3 => self.finish(i, id),
                    4 => self.lose(i, id),
                    _ => {}
                },
                Doing::Gone(_) | Doing::Done => {}
            }
        }

        /// The model's workers of `key`.
        fn of_key(&self, key: u8) -> impl Iterator<Item = (&WorkerId, &Model)> + '_ {
            self.workers.iter().filter(move |(_, m)| m.key == key)
        }

        /// What the model expects an asker of `key` to be lent, if it
        /// does not start a worker: when the newest idle worker went idle,
        /// or else the fewest tasks in flight on a worker with room.
        fn lendable(&self, key: u8) -> (Option<Instant>, Option<usize>) {
            let max = MAX_IN_FLIGHT[key as usize];
            let idle = self.of_key(key).filter(|(_, m)| m.in_flight == 0);
            let newest = idle.map(|(_, m)| m.idle_since).max();
            let busy = self.of_key(key).filter(|(_, m)| m.in_flight < max);
            (newest, busy.map(|(_, m)| m.in_flight).min())
        }

        /// Counts `lent` as one more task on its worker, which must be the
        /// one the model expects (`lendable`, before): its stats index.
        fn check_lent(
            &mut self,
            key: u8,
            lent: &Lent<u32>,
            expected: (Option<Instant>, Option<usize>),
        ) -> usize {
            let seed = self.seed;
            let max = MAX_IN_FLIGHT[key as usize];
            let Some(model) = self.workers.get_mut(&lent.id) else {
                panic!("seed {seed}: lent {lent:?}, not a worker");
            };
            assert_eq!((model.key, model.worker), (key, lent.worker), "seed {seed}");
            let stat = match expected {
                (Some(newest), _) => {
                    assert_eq!(model.in_flight, 0, "seed {seed}: lent a busy one");
                    assert_eq!(model.idle_since, newest, "seed {seed}: not the newest");
                    0
                }
                (None, fewest) => {
                    assert!(model.in_flight < max, "seed {seed}: over max_in_flight");
                    assert_eq!(Some(model.in_flight), fewest, "seed {seed}: not the least");
                    7
                }
            };
            model.in_flight += 1;
            stat
        }

        /// Task `i` asks; the answer must be what the model expects.
        fn ask(&mut self, i: usize) {
            let (seed, now, key) = (self.seed, self.now, self.tasks[i].key);
            let max = MAX_IN_FLIGHT[key as usize];
            let lendable = self.lendable(key);
            let starting = self.starting(key);
            let backing_off = self.backoff.get(&key).is_some_and(|until| *until > now);
            let may_start = !backing_off && starting < LIMITS.max_starting;
            self.tasks[i].doing = match self.leases.ask(&key, max, now) {
                Ask::Run(lent) => {
                    if lendable.0.is_none() {
                        assert!(backing_off, "seed {seed}: a busy one, though not full");
                    }
                    let stat = self.check_lent(key, &lent, lendable);
                    self.stats.0[stat] += 1;
                    Doing::Running(lent.id)
                }
                Ask::Start => {
                    assert!(lendable.0.is_none(), "seed {seed}: started with one idle");
                    assert!(may_start, "seed {seed}: started while it may not");
                    self.stats.0[1] += 1;
                    Doing::Starting
                }
                Ask::Queue(ticket) => {
                    assert_eq!(lendable.0, None, "seed {seed}: queued with one idle");
                    if backing_off {
                        assert_eq!(lendable.1, None, "seed {seed}: queued with room");
                    }
                    assert!(!may_start, "seed {seed}: queued though it could start");
                    self.queues.entry(key).or_default().push_back(ticket);
                    Doing::Queued {
                        ticket,
                        inbox: None,
                    }
                }
            };
        }

        /// The start of task `i` ended with `outcome`.
        fn start_ends(&mut self, i: usize, outcome: Started<u32, &'static str>) {
            let (seed, now, key) = (self.seed, self.now, self.tasks[i].key);
            let lendable = self.lendable(key);
            let after = self.leases.started(&key, outcome, now);
            self.tasks[i].doing = match (outcome, after) {
                (Started::Up(worker), AfterStart::Run(lent, handed)) => {
                    assert_eq!(lent.worker, worker, "seed {seed}: another worker");
                    let model = Model {
                        key,
                        worker,
                        in_flight: 1,
                        idle_since: now,
                    };
                    assert!(self.workers.insert(lent.id, model).is_none(), "seed {seed}");
                    let backing_off = self.backoff.get(&key).is_some_and(|until| *until > now);
                    if !backing_off {
                        assert!(handed.is_empty(), "seed {seed}: handed while not full");
                    }
                    self.tasks[i].doing = Doing::Running(lent.id);
                    self.check_handed(key, handed, backing_off);
                    return;
                }
                (Started::NoCapacity, AfterStart::Run(lent, handed)) => {
                    let stat = self.check_lent(key, &lent, lendable);
                    self.backoff.insert(key, now + LIMITS.full_backoff);
                    self.stats.0[2] += 1;
                    self.stats.0[stat] += 1;
                    self.tasks[i].doing = Doing::Running(lent.id);
                    self.check_handed(key, handed, true);
                    return;
                }
                (Started::NoCapacity, AfterStart::Queue(ticket)) => {
                    assert_eq!(lendable, (None, None), "seed {seed}: queued with room");
                    self.backoff.insert(key, now + LIMITS.full_backoff);
                    self.queues.entry(key).or_default().push_back(ticket);
                    self.stats.0[2] += 1;
                    Doing::Queued {
                        ticket,
                        inbox: None,
                    }
                }
                (Started::Failed(_), AfterStart::Fail("no binary")) => Doing::Done,
                other => panic!("seed {seed}: {other:?}"),
            };
        }

        /// The queued tickets of `key` handed a worker (after a start):
        /// the oldest, each to a least busy worker with room, and (if
        /// `filled`) until no worker has room or no ticket is left. Then
        /// each task takes its worker.
        fn check_handed(&mut self, key: u8, handed: Vec<(Ticket, Lent<u32>)>, filled: bool) {
            let seed = self.seed;
            for (ticket, lent) in &handed {
                let oldest = self.queues.entry(key).or_default().pop_front();
                assert_eq!(oldest, Some(*ticket), "seed {seed}: not the oldest ticket");
                let (_, fewest) = self.lendable(key);
                let model = self.workers.get_mut(&lent.id).expect("a worker");
                assert_eq!(model.worker, lent.worker, "seed {seed}");
                assert_eq!(Some(model.in_flight), fewest, "seed {seed}: not the least");
                model.in_flight += 1;
            }
            if filled {
                let left = self.queues.get(&key).is_some_and(|q| !q.is_empty());
                assert!(
                    !left || self.lendable(key).1.is_none(),
                    "seed {seed}: not filled"
                );
            }
            for (ticket, lent) in handed {
                self.stats.0[10] += 1;
                self.deliver(key, ticket, lent.id);
            }
        }

        /// Queued task `i` takes the worker handed to it.
        fn take(&mut self, i: usize) {
            if let Doing::Queued {
                inbox: Some(id), ..
            } = self.tasks[i].doing
            {
                self.tasks[i].doing = Doing::Running(id);
            }
        }

        /// Queued task `i` gives up waiting: it cancels its ticket, then
        /// takes the worker handed to it meanwhile or asks again.
        fn give_up(&mut self, i: usize) {
            let (seed, key) = (self.seed, self.tasks[i].key);
            let Doing::Queued { ticket, inbox } = self.tasks[i].doing else {
                return;
            };
            let waiting = self.leases.cancel(&key, ticket);
            assert_eq!(
                waiting,
                inbox.is_none(),
                "seed {seed}: cancel of {ticket:?}"
            );
            if inbox.is_some() {
                self.stats.0[5] += 1;
                return self.take(i);
            }
            let queue = self.queues.entry(key).or_default();
            queue.retain(|t| *t != ticket);
            self.ask(i);
        }

        /// Task `i` finished on worker `id`.
        fn finish(&mut self, i: usize, id: WorkerId) {
            self.tasks[i].doing = Doing::Done;
            let key = self.tasks[i].key;
            self.release(key, id);
        }

        /// Task `i` lost worker `id`: it is lent no more, and the task
        /// asks again.
        fn lose(&mut self, i: usize, id: WorkerId) {
            let (seed, key) = (self.seed, self.tasks[i].key);
            let known = self.workers.remove(&id).is_some();
            assert_eq!(self.leases.lost(&key, id), known, "seed {seed}: lost");
            if known {
                self.stats.0[8] += 1;
            }
            self.ask(i);
        }

        /// A task on worker `id` ended: the worker goes to the oldest
        /// queued task that is still there, or it has one task fewer.
        fn release(&mut self, key: u8, id: WorkerId) {
            let (seed, now) = (self.seed, self.now);
            let released = self.leases.release(&key, id, now);
            let Some(model) = self.workers.get_mut(&id) else {
                assert_eq!(released, Release::Gone, "seed {seed}: a lost worker");
                self.stats.0[9] += 1;
                return;
            };
            match released {
                Release::Handoff(ticket, handed) => {
                    assert_eq!(handed.id, id, "seed {seed}: another worker handed");
                    let oldest = self.queues.entry(key).or_default().pop_front();
                    assert_eq!(oldest, Some(ticket), "seed {seed}: not first in, first out");
                    self.stats.0[3] += 1;
                    self.deliver(key, ticket, id);
                }
                Release::Kept => {
                    assert!(self.queues.get(&key).is_none_or(VecDeque::is_empty));
                    model.in_flight -= 1;
                    if model.in_flight == 0 {
                        model.idle_since = now;
                    }
                }
                Release::Gone => panic!("seed {seed}: {id:?} is not gone"),
            }
        }

        /// Worker `id` was handed to `ticket`: its task takes it, or (gone)
        /// passes it on.
        fn deliver(&mut self, key: u8, ticket: Ticket, id: WorkerId) {
            let seed = self.seed;
            assert!(self.handed.insert(ticket), "seed {seed}: {ticket:?} twice");
            let waiter = self.tasks.iter_mut().find(|task| match task.doing {
                Doing::Queued { ticket: t, .. } | Doing::Gone(t) => t == ticket,
                _ => false,
            });
            let Some(waiter) = waiter else {
                panic!("seed {seed}: {ticket:?} has no task");
            };
            match &mut waiter.doing {
                Doing::Queued { inbox, .. } => {
                    assert_eq!(*inbox, None, "seed {seed}: handed twice");
                    *inbox = Some(id);
                }
                _ => {
                    self.stats.0[4] += 1;
                    self.release(key, id);
                }
            }
        }

        /// The reaper's tick: exactly the workers idle for the limit go.
        fn expire(&mut self) {
            let (seed, now) = (self.seed, self.now);
            let mut expired = self.leases.expire(now);
            expired.sort();
            let old = |m: &Model| {
                m.in_flight == 0 && now.saturating_duration_since(m.idle_since) >= LIMITS.idle
            };
            let gone: Vec<WorkerId> = (self.workers.iter())
                .filter(|(_, m)| old(m))
                .map(|(id, _)| *id)
                .collect();
            let mut expected: Vec<u32> = gone.iter().map(|id| self.workers[id].worker).collect();
            expected.sort();
            assert_eq!(expired, expected, "seed {seed}: expired");
            for id in gone {
                self.workers.remove(&id);
            }
            self.stats.0[6] += expired.len() as u32;
        }

        /// Tasks of `key` starting a worker.
        fn starting(&self, key: u8) -> usize {
            let of_key = |t: &&Task| t.key == key && matches!(t.doing, Doing::Starting);
            self.tasks.iter().filter(of_key).count()
        }

        /// The policy agrees with the model.
        fn check(&self) {
            let seed = self.seed;
            let mut lent = 0;
            for (key, pool) in &self.leases.pools {
                for w in &pool.workers {
                    let Some(model) = self.workers.get(&w.id) else {
                        panic!("seed {seed}: {:?} lent, but lost or expired", w.id);
                    };
                    assert_eq!((model.key, model.worker), (*key, w.worker), "seed {seed}");
                    assert_eq!(model.in_flight, w.in_flight, "seed {seed}: in flight");
                    if w.in_flight == 0 {
                        assert_eq!(model.idle_since, w.idle_since, "seed {seed}: idle since");
                    }
                    assert!(w.in_flight <= pool.max_in_flight, "seed {seed}");
                    // Every task in flight on it is a task holding it.
                    let holding = (self.tasks.iter())
                        .filter(|t| match t.doing {
                            Doing::Running(id)
                            | Doing::Queued {
                                inbox: Some(id), ..
                            } => id == w.id,
                            _ => false,
                        })
                        .count();
                    assert_eq!(holding, w.in_flight, "seed {seed}: tasks on {:?}", w.id);
                    lent += 1;
                }
                let starting = self.starting(*key);
                assert_eq!(pool.starting, starting, "seed {seed}: starting");
                assert!(pool.starting <= LIMITS.max_starting, "seed {seed}");
                let queue = self.queues.get(key).cloned().unwrap_or_default();
                assert_eq!(pool.waiting, queue, "seed {seed}: queue");
            }
            assert_eq!(
                lent,
                self.workers.len(),
                "seed {seed}: workers out of place"
            );
        }

        /// Once no task arrives, every task ends (starts succeed), every
        /// worker goes idle, and once idle long enough, expires. Only the
        /// tickets of vanished tasks may stay queued.
        fn drain(&mut self) {
            let seed = self.seed;
            let ended = |t: &Task| matches!(t.doing, Doing::Gone(_) | Doing::Done);
            for _ in 0..100 {
                if self.tasks.iter().all(ended) {
                    break;
                }
                self.now += 100 * MILLI;
                for i in 0..self.tasks.len() {
                    match self.tasks[i].doing {
                        Doing::Starting => {
                            self.started += 1;
                            self.start_ends(i, Started::Up(self.started));
                        }
                        Doing::Queued { inbox: Some(_), .. } => self.take(i),
                        Doing::Queued { inbox: None, .. } => self.give_up(i),
                        Doing::Running(id) => self.finish(i, id),
                        Doing::Gone(_) | Doing::Done => {}
                    }
                }
                self.check();
            }
            assert!(self.tasks.iter().all(ended), "seed {seed}: not drained");
            self.now += LIMITS.idle;
            self.expire();
            self.check();
            assert!(self.workers.is_empty(), "seed {seed}: workers left");
            let gone: HashSet<Ticket> = (self.tasks.iter())
                .filter_map(|t| match t.doing {
                    Doing::Gone(ticket) => Some(ticket),
                    _ => None,
                })
                .collect();
            for pool in self.leases.pools.values() {
                assert_eq!(pool.starting, 0, "seed {seed}: still starting");
                let left = pool.waiting.iter().all(|t| gone.contains(t));
                assert!(left, "seed {seed}: a live task still queued");
            }
        }
    }
}
