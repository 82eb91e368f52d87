//! The task pool's policy, as a plain state machine: which worker a task
//! runs on, when a new one is started, who waits for a returned lease, when
//! an idle lease is given up, and whether a failed task is retried. Every
//! method takes the news (and the time, where it matters) and returns a
//! decision; `pool.rs` and `drive` carry it out (start, hand over, kill,
//! resubmit, fail the result) and report back.
//!
//! The caller owns the limits and passes them in a [`LeaseLimits`]
//! (`pool.rs`: `IDLE_LEASE`, `MAX_STARTING`, and the task module's
//! `QUEUE_POLL` as the back-off). Per placement key:
//! 1. An idle worker is reused before anything is started, the one that
//!    went idle last first ([`Leases::ask`] → [`Ask::Run`]).
//! 2. Otherwise a worker is started ([`Ask::Start`]), unless
//!    `max_starting` are being started already or the key is backing off.
//! 3. A start that found no capacity anywhere makes the key back off for
//!    `full_backoff`: its asker, and every asker until then, queues
//!    ([`Leases::started`]). A start that failed otherwise, or succeeded,
//!    only frees its slot.
//! 4. An asker that queues gets a [`Ticket`] at the back of the key's
//!    queue ([`Ask::Queue`]). It may give up waiting ([`Leases::cancel`])
//!    and ask again, behind those still queued.
//! 5. A worker whose task finished goes to the oldest ticket still queued
//!    ([`Release::Handoff`]), else idle from then on ([`Release::Idle`]).
//!    A ticket whose asker is gone passes its worker on: release it again.
//! 6. A worker idle for `idle` or longer is given up: [`Leases::expire`]
//!    returns it, for the caller to kill.
//!
//! And per task ([`Retries`]):
//! 7. A failure of the task itself (an error of its function), a panic
//!    recorded in the worker's death, or a call that failed with the worker
//!    still there (it could not be encoded or decoded) fails the task at
//!    once.
//! 8. A call that failed because the worker process or its node was lost
//!    is retried on a new lease, `max_retries` times at most: the loss after
//!    that fails the task, with the number of losses and the last one.

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
}

/// The leases of one key.
#[derive(Debug)]
struct Pool<W> {
    /// Idle workers and since when, in the order they went idle.
    idle: Vec<(W, Instant)>,
    /// Askers waiting for a worker, oldest first.
    waiting: VecDeque<Ticket>,
    /// Workers being started.
    starting: usize,
    /// No capacity was found when last asked: back off until then.
    full_until: Option<Instant>,
}

impl<W> Default for Pool<W> {
    fn default() -> Self {
        Pool {
            idle: Vec::new(),
            waiting: VecDeque::new(),
            starting: 0,
            full_until: None,
        }
    }
}

/// An asker's place in a key's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ticket(u64);

/// What an asker does next.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum Ask<W> {
    /// Run on this idle worker.
    Run(W),
    /// Start a worker, then report with [`Leases::started`].
    Start,
    /// Wait for a worker handed to this ticket (or give up:
    /// [`Leases::cancel`]).
    Queue(Ticket),
}

/// How a start that [`Ask::Start`] asked for ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Started {
    /// A worker is up: the asker runs on it.
    Up,
    /// No node had the resources free.
    NoCapacity,
    /// It failed otherwise: the asker fails.
    Failed,
}

/// Where a released worker goes.
#[must_use]
#[derive(Debug, PartialEq)]
pub(crate) enum Release<W> {
    /// To the asker holding this ticket, the oldest queued; if that asker
    /// is gone, release the worker again.
    Handoff(Ticket, W),
    /// Nobody waits: it is idle from now on.
    Idle,
}

impl<K: Eq + Hash + Clone, W> Leases<K, W> {
    /// No leases yet.
    pub(crate) fn new(limits: LeaseLimits) -> Self {
        Leases {
            limits,
            pools: HashMap::new(),
            next_ticket: 0,
        }
    }

    /// A task placed by `key` wants a worker: reuse, start, or queue.
    pub(crate) fn ask(&mut self, key: &K, now: Instant) -> Ask<W> {
        let max_starting = self.limits.max_starting;
        let pool = self.pool(key);
        if let Some((worker, _)) = pool.idle.pop() {
            return Ask::Run(worker);
        }
        let full = pool.full_until.is_some_and(|until| until > now);
        if !full && pool.starting < max_starting {
            pool.starting += 1;
            return Ask::Start;
        }
        Ask::Queue(self.queue(key))
    }

    /// A start for `key` ended: `Some` ticket when the asker queues (no
    /// capacity), `None` when it runs on the new worker or fails.
    #[must_use]
    pub(crate) fn started(&mut self, key: &K, outcome: Started, now: Instant) -> Option<Ticket> {
        let backoff = self.limits.full_backoff;
        let pool = self.pool(key);
        pool.starting = pool.starting.saturating_sub(1);
        if outcome != Started::NoCapacity {
            return None;
        }
        pool.full_until = Some(now + backoff);
        Some(self.queue(key))
    }

    /// The task on `worker`, placed by `key`, finished: hand the worker to
    /// the oldest queued ticket, or keep it idle.
    pub(crate) fn release(&mut self, key: &K, worker: W, now: Instant) -> Release<W> {
        let pool = self.pool(key);
        match pool.waiting.pop_front() {
            Some(ticket) => Release::Handoff(ticket, worker),
            None => {
                pool.idle.push((worker, now));
                Release::Idle
            }
        }
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

    /// Takes out the workers idle for the limit or longer, to kill.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<W> {
        let limit = self.limits.idle;
        let mut expired = Vec::new();
        for pool in self.pools.values_mut() {
            let (old, kept) = std::mem::take(&mut pool.idle)
                .into_iter()
                .partition(|(_, since)| now.saturating_duration_since(*since) >= limit);
            pool.idle = kept;
            expired.extend(old.into_iter().map(|(worker, _)| worker));
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

    /// The ticket an asker queued with.
    fn queued(ask: Ask<u32>) -> Ticket {
        match ask {
            Ask::Queue(ticket) => ticket,
            other => panic!("expected to queue, got {other:?}"),
        }
    }

    /// Leases of key "a" with two workers being started and `n` askers
    /// queued behind them; returns their tickets, oldest first.
    fn full(n: usize, t0: Instant) -> (Leases<&'static str, u32>, Vec<Ticket>) {
        let mut leases = Leases::new(LIMITS);
        assert_eq!(leases.ask(&"a", t0), Ask::Start);
        assert_eq!(leases.ask(&"a", t0), Ask::Start);
        let tickets = (0..n).map(|_| queued(leases.ask(&"a", t0))).collect();
        (leases, tickets)
    }

    #[test]
    fn idle_leases_are_reused_newest_first_before_anything_starts() {
        let t0 = Instant::now();
        let mut leases = Leases::new(LIMITS);
        for _ in 0..2 {
            assert_eq!(leases.ask(&"a", t0), Ask::Start);
            assert_eq!(leases.started(&"a", Started::Up, t0), None);
        }
        assert_eq!(leases.release(&"a", 1, t0), Release::Idle);
        assert_eq!(leases.release(&"a", 2, t0 + SECOND), Release::Idle);
        // Another key has its own leases.
        assert_eq!(leases.ask(&"b", t0 + SECOND), Ask::Start);
        assert_eq!(leases.ask(&"a", t0 + SECOND), Ask::Run(2));
        assert_eq!(leases.ask(&"a", t0 + SECOND), Ask::Run(1));
        assert_eq!(leases.ask(&"a", t0 + SECOND), Ask::Start);
    }

    #[test]
    fn at_most_max_starting_start_at_once_per_key() {
        let t0 = Instant::now();
        let (mut leases, tickets) = full(1, t0);
        assert_eq!(tickets.len(), 1);
        assert_eq!(leases.ask(&"b", t0), Ask::Start);
        assert_eq!(leases.started(&"a", Started::Failed, t0), None);
        assert_eq!(leases.ask(&"a", t0), Ask::Start);
        queued(leases.ask(&"a", t0));
        assert_eq!(leases.started(&"a", Started::Up, t0), None);
        assert_eq!(leases.started(&"a", Started::Up, t0), None);
        assert_eq!(leases.pools[&"a"].starting, 0);
        assert_eq!(leases.pools[&"a"].waiting.len(), 2);
    }

    #[test]
    fn no_capacity_queues_every_asker_until_the_back_off_passes() {
        let t0 = Instant::now();
        let (mut leases, _) = full(0, t0);
        let first = leases.started(&"a", Started::NoCapacity, t0);
        assert!(first.is_some());
        // A slot is free, but the key backs off.
        let second = queued(leases.ask(&"a", t0 + LIMITS.full_backoff - MILLI));
        assert_eq!(leases.ask(&"b", t0), Ask::Start);
        assert_eq!(leases.ask(&"a", t0 + LIMITS.full_backoff), Ask::Start);
        assert_eq!(
            leases.release(&"a", 7, t0),
            Release::Handoff(first.unwrap(), 7)
        );
        assert_eq!(leases.release(&"a", 8, t0), Release::Handoff(second, 8));
    }

    #[test]
    fn a_release_goes_to_the_oldest_waiter_then_idle() {
        let t0 = Instant::now();
        let (mut leases, tickets) = full(2, t0);
        assert_eq!(leases.release(&"a", 1, t0), Release::Handoff(tickets[0], 1));
        assert_eq!(leases.release(&"a", 2, t0), Release::Handoff(tickets[1], 2));
        assert_eq!(leases.release(&"a", 3, t0), Release::Idle);
        assert_eq!(leases.ask(&"a", t0), Ask::Run(3));
    }

    #[test]
    fn cancelled_tickets_are_skipped_and_a_gone_asker_passes_its_worker_on() {
        let t0 = Instant::now();
        let (mut leases, tickets) = full(4, t0);
        assert!(leases.cancel(&"a", tickets[1]));
        assert!(!leases.cancel(&"a", tickets[1]));
        assert!(!leases.cancel(&"b", tickets[2]));
        assert_eq!(leases.release(&"a", 1, t0), Release::Handoff(tickets[0], 1));
        // Handed a worker already: too late to cancel.
        assert!(!leases.cancel(&"a", tickets[0]));
        // The asker of tickets[2] is gone: its worker goes to the next.
        assert_eq!(leases.release(&"a", 2, t0), Release::Handoff(tickets[2], 2));
        assert_eq!(leases.release(&"a", 2, t0), Release::Handoff(tickets[3], 2));
        assert_eq!(leases.release(&"a", 3, t0), Release::Idle);
    }

    #[test]
    fn expire_takes_exactly_the_workers_idle_for_the_limit() {
        let t0 = Instant::now();
        let mut leases = Leases::new(LIMITS);
        for (key, worker, since) in [("a", 1, t0), ("a", 2, t0 + SECOND), ("b", 3, t0)] {
            assert_eq!(leases.release(&key, worker, since), Release::Idle);
        }
        assert_eq!(leases.expire(t0 + LIMITS.idle - MILLI), Vec::<u32>::new());
        let mut expired = leases.expire(t0 + LIMITS.idle);
        expired.sort();
        assert_eq!(expired, [1, 3]);
        assert_eq!(leases.expire(t0 + LIMITS.idle), Vec::<u32>::new());
        assert_eq!(leases.ask(&"a", t0 + LIMITS.idle), Ask::Run(2));
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

    /// A seeded simulation in virtual time: tasks arrive on two keys and
    /// ask for workers; starts succeed, find no capacity or fail; queued
    /// tasks take a handed worker, give up waiting and ask again, or vanish
    /// without cancelling; tasks finish and release; idle workers expire;
    /// time passes; all in random order. The policy must agree with a model
    /// of the caller at every step, and drain at the end. A failure prints
    /// its seed, which replays it.
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

    /// Counts of what a simulation went through: idle reuses, starts,
    /// starts without capacity, handoffs, handoffs to a vanished asker,
    /// cancels too late (a worker was handed), expired workers.
    #[derive(Debug, Default)]
    struct Stats([u32; 7]);

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
        Queued { ticket: Ticket, inbox: Option<u32> },
        /// Running on this worker.
        Running(u32),
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

    /// The policy and, beside it, a model of the caller's view.
    struct Sim {
        seed: u64,
        rng: u64,
        now: Instant,
        leases: Leases<u8, u32>,
        tasks: Vec<Task>,
        /// Idle workers: their key, and since when.
        idle: HashMap<u32, (u8, Instant)>,
        /// Per key, the tickets queued, oldest first.
        queues: HashMap<u8, VecDeque<Ticket>>,
        /// Per key, when its back-off ends.
        backoff: HashMap<u8, Instant>,
        /// Workers started and not expired.
        alive: HashSet<u32>,
        /// Tickets handed a worker.
        handed: HashSet<Ticket>,
        workers: u32,
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
                idle: HashMap::new(),
                queues: HashMap::new(),
                backoff: HashMap::new(),
                alive: HashSet::new(),
                handed: HashSet::new(),
                workers: 0,
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
                        0..=5 => Started::Up,
                        6..=7 => Started::NoCapacity,
                        _ => Started::Failed,
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
                Doing::Running(worker) if self.next(2) == 0 => self.finish(i, worker),
                Doing::Running(_) | Doing::Gone(_) | Doing::Done => {}
            }
        }

        /// Task `i` asks; the answer must be what the model expects.
        fn ask(&mut self, i: usize) {
            let (seed, now, key) = (self.seed, self.now, self.tasks[i].key);
            let newest = self.idle_of(key).map(|(_, since)| since).max();
            let starting = self.starting(key);
            let backing_off = self.backoff.get(&key).is_some_and(|until| *until > now);
            self.tasks[i].doing = match self.leases.ask(&key, now) {
                Ask::Run(worker) => {
                    let idle = self.idle.remove(&worker);
                    let since = idle.map(|(_, since)| since);
                    assert_eq!(idle.map(|(k, _)| k), Some(key), "seed {seed}: not idle");
                    assert_eq!(since, newest, "seed {seed}: not the newest idle");
                    self.stats.0[0] += 1;
                    Doing::Running(worker)
                }
                Ask::Start => {
                    assert!(newest.is_none(), "seed {seed}: started with one idle");
                    assert!(!backing_off, "seed {seed}: started while backing off");
                    assert!(starting < LIMITS.max_starting, "seed {seed}: starts");
                    self.stats.0[1] += 1;
                    Doing::Starting
                }
                Ask::Queue(ticket) => {
                    assert!(newest.is_none(), "seed {seed}: queued with one idle");
                    let busy = backing_off || starting == LIMITS.max_starting;
                    assert!(busy, "seed {seed}: queued though it could start");
                    self.queues.entry(key).or_default().push_back(ticket);
                    Doing::Queued {
                        ticket,
                        inbox: None,
                    }
                }
            };
        }

        /// The start of task `i` ended with `outcome`.
        fn start_ends(&mut self, i: usize, outcome: Started) {
            let (seed, now, key) = (self.seed, self.now, self.tasks[i].key);
            let queued = self.leases.started(&key, outcome, now);
            self.tasks[i].doing = match (outcome, queued) {
                (Started::Up, None) => {
                    self.workers += 1;
                    self.alive.insert(self.workers);
                    Doing::Running(self.workers)
                }
                (Started::NoCapacity, Some(ticket)) => {
                    self.backoff.insert(key, now + LIMITS.full_backoff);
                    self.queues.entry(key).or_default().push_back(ticket);
                    self.stats.0[2] += 1;
                    Doing::Queued {
                        ticket,
                        inbox: None,
                    }
                }
                (Started::Failed, None) => Doing::Done,
                other => panic!("seed {seed}: {other:?}"),
            };
        }

        /// Queued task `i` takes the worker handed to it.
        fn take(&mut self, i: usize) {
            if let Doing::Queued {
                inbox: Some(worker),
                ..
            } = self.tasks[i].doing
            {
                self.tasks[i].doing = Doing::Running(worker);
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

        /// Task `i` finished on `worker`, which goes to the oldest queued
        /// task that is still there, or idle.
        fn finish(&mut self, i: usize, worker: u32) {
            let (seed, now, key) = (self.seed, self.now, self.tasks[i].key);
            self.tasks[i].doing = Doing::Done;
            loop {
                let Release::Handoff(ticket, handed) = self.leases.release(&key, worker, now)
                else {
                    self.idle.insert(worker, (key, now));
                    return;
                };
                assert_eq!(handed, worker, "seed {seed}: another worker handed");
                assert!(self.handed.insert(ticket), "seed {seed}: {ticket:?} twice");
                let oldest = self.queues.entry(key).or_default().pop_front();
                assert_eq!(oldest, Some(ticket), "seed {seed}: not first in, first out");
                self.stats.0[3] += 1;
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
                        *inbox = Some(worker);
                        return;
                    }
                    _ => self.stats.0[4] += 1,
                }
            }
        }

        /// The reaper's tick: exactly the workers idle for the limit go.
        fn expire(&mut self) {
            let (seed, now) = (self.seed, self.now);
            let mut expired = self.leases.expire(now);
            expired.sort();
            let old = |since: &Instant| now.saturating_duration_since(*since) >= LIMITS.idle;
            let mut expected: Vec<u32> = (self.idle.iter())
                .filter(|(_, (_, since))| old(since))
                .map(|(worker, _)| *worker)
                .collect();
            expected.sort();
            assert_eq!(expired, expected, "seed {seed}: expired");
            for worker in &expired {
                self.idle.remove(worker);
                self.alive.remove(worker);
            }
            self.stats.0[6] += expired.len() as u32;
            for pool in self.leases.pools.values() {
                let fresh = pool.idle.iter().all(|(_, since)| !old(since));
                assert!(fresh, "seed {seed}: an old idle worker kept");
            }
        }

        /// The model's idle workers of `key`, and since when.
        fn idle_of(&self, key: u8) -> impl Iterator<Item = (u32, Instant)> + '_ {
            let of_key = move |(worker, (k, since)): (&u32, &(u8, Instant))| {
                (*k == key).then_some((*worker, *since))
            };
            self.idle.iter().filter_map(of_key)
        }

        /// Tasks of `key` starting a worker.
        fn starting(&self, key: u8) -> usize {
            let of_key = |t: &&Task| t.key == key && matches!(t.doing, Doing::Starting);
            self.tasks.iter().filter(of_key).count()
        }

        /// The policy agrees with the model.
        fn check(&self) {
            let seed = self.seed;
            // Every worker started and not expired is in one place only.
            let mut places: Vec<u32> = Vec::new();
            for (key, pool) in &self.leases.pools {
                for (worker, since) in &pool.idle {
                    let model = self.idle.get(worker);
                    assert_eq!(model, Some(&(*key, *since)), "seed {seed}: idle");
                    places.push(*worker);
                }
                let starting = self.starting(*key);
                assert_eq!(pool.starting, starting, "seed {seed}: starting");
                assert!(pool.starting <= LIMITS.max_starting, "seed {seed}");
                let queue = self.queues.get(key).cloned().unwrap_or_default();
                assert_eq!(pool.waiting, queue, "seed {seed}: queue");
            }
            for task in &self.tasks {
                match task.doing {
                    Doing::Queued {
                        inbox: Some(worker),
                        ..
                    }
                    | Doing::Running(worker) => places.push(worker),
                    _ => {}
                }
            }
            places.sort();
            let mut alive: Vec<u32> = self.alive.iter().copied().collect();
            alive.sort();
            assert_eq!(places, alive, "seed {seed}: workers out of place");
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
                        Doing::Starting => self.start_ends(i, Started::Up),
                        Doing::Queued { inbox: Some(_), .. } => self.take(i),
                        Doing::Queued { inbox: None, .. } => self.give_up(i),
                        Doing::Running(worker) => self.finish(i, worker),
                        Doing::Gone(_) | Doing::Done => {}
                    }
                }
                self.check();
            }
            assert!(self.tasks.iter().all(ended), "seed {seed}: not drained");
            self.now += LIMITS.idle;
            self.expire();
            self.check();
            assert!(self.alive.is_empty(), "seed {seed}: workers left");
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
