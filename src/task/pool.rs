//! Worker leases: the `TaskWorker`s this process runs tasks on, kept and
//! reused per placement (resources, strategy, bundle), as Ray's worker
//! leases are.
//!
//! Scheduling, as in Ray:
//! 1. Whether any alive node could *ever* run the task is checked once per
//!    placement, at submission (`check_feasible`: else `Unsatisfiable`,
//!    unless the cluster's autoscaler has a node type that could).
//! 2. An idle lease of the same placement (resources, strategy, bundle,
//!    tasks in flight per worker) is reused.
//! 3. Otherwise a new worker is started on this process's own node if it
//!    has the resources free (local first), else on any node that has them
//!    (spill: the spawn's candidates, most free CPU first); at most
//!    `MAX_STARTING` (2) starts at a time per placement.
//! 4. If no node has the resources free (the placement backs off), the
//!    task is sent to a busy worker of its placement with fewer than
//!    `max_tasks_in_flight_per_worker` tasks (default
//!    [`MAX_TASKS_IN_FLIGHT_PER_WORKER`], 4) in flight, as Ray pipelines
//!    tasks to a leased worker: the worker runs them one at a time, in
//!    order, and each result comes back as its task ends.
//! 5. If none has room, the task queues for the next returned lease, and
//!    looks again every [`QUEUE_POLL`] (500 ms): resources may free up
//!    elsewhere.
//! 6. A finished task's lease goes to the oldest queued task; leases idle
//!    for [`IDLE_LEASE`] (2 s) are returned (the worker is killed).
//! 7. Every second, while a placement's last worker start found no node
//!    with room, the count of its tasks waiting to run is told to the
//!    head (`TasksWaiting`; 0 once none wait), where an autoscaler finds
//!    it among the pending demands.
//!
//! Which of these happens is decided by the plain state machine of
//! `policy.rs` ([`Leases`]); this module carries it out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashSet;
use tokio::sync::oneshot;

use crate::actor::{self, LaunchError, ProcessContext, SpawnError, SpawnOptions, Strategy};
use crate::cluster::{
    DeathCause, DirectoryRequest, MembershipReply, MembershipRequest, NodeState, ResourceSet,
};

use super::policy::{
    AfterStart, Ask, LeaseLimits, Leases, Lent, Release, Started, Ticket, WorkerId,
};
use super::{describe, TaskWorker, Worker, QUEUE_POLL};

/// How long an idle lease is kept before its worker is killed.
pub const IDLE_LEASE: Duration = Duration::from_secs(2);

/// Tasks in flight per leased worker, unless a task's options say
/// otherwise (`TaskOptions::max_tasks_in_flight_per_worker`).
pub const MAX_TASKS_IN_FLIGHT_PER_WORKER: usize = 4;

/// A worker leased for one task.
pub(crate) struct Lease {
    worker: Worker,
    id: WorkerId,
    key: String,
    /// The pool it is returned to.
    pool: Arc<Pool>,
}

impl Lease {
    fn new(lent: Lent<Worker>, key: &str, pool: &Arc<Pool>) -> Self {
        Lease {
            worker: lent.worker,
            id: lent.id,
            key: key.to_string(),
            pool: pool.clone(),
        }
    }
}

impl Lease {
    /// Its worker.
    pub(crate) fn worker(&self) -> &Worker {
        &self.worker
    }
}

/// Workers being started at once per placement: more would only race for
/// the same free resources.
const MAX_STARTING: usize = 2;

/// The policy's limits: idle leases are given up after [`IDLE_LEASE`], and
/// a placement no node had room for backs off for [`QUEUE_POLL`].
const LIMITS: LeaseLimits = LeaseLimits {
    idle: IDLE_LEASE,
    max_starting: MAX_STARTING,
    full_backoff: QUEUE_POLL,
};

/// This process's leases, and the tasks waiting for one.
struct State {
    leases: Leases<String, Worker>,
    waiters: HashMap<Ticket, oneshot::Sender<Lent<Worker>>>,
    /// Per placement key: what its tasks ask for, and what the head was
    /// last told of them (step 7).
    placements: HashMap<String, Told>,
}

/// A placement's tasks waiting for room, as last told to the head.
struct Told {
    queue: u64,
    resources: ResourceSet,
    count: u32,
}

impl State {
    /// Hands `lent` to the asker holding `ticket`; if that asker is gone,
    /// releases it again, to the next.
    fn hand(&mut self, key: &String, mut ticket: Ticket, mut lent: Lent<Worker>) {
        loop {
            lent = match self.waiters.remove(&ticket) {
                Some(waiter) => match waiter.send(lent) {
                    Ok(()) => return,
                    Err(back) => back,
                },
                None => lent,
            };
            match self.leases.release(key, lent.id, Instant::now()) {
                Release::Handoff(next, handed) => (ticket, lent) = (next, handed),
                Release::Kept | Release::Gone => return,
            }
        }
    }

    /// Where the worker handed to `ticket` arrives.
    fn wait(&mut self, ticket: Ticket) -> oneshot::Receiver<Lent<Worker>> {
        let (tx, rx) = oneshot::channel();
        self.waiters.insert(ticket, tx);
        rx
    }
}

impl Default for State {
    fn default() -> Self {
        State {
            leases: Leases::new(LIMITS),
            waiters: HashMap::new(),
            placements: HashMap::new(),
        }
    }
}

/// This process's task pool, kept in its context
/// (`ProcessContext::extension`).
#[derive(Default)]
struct Pool {
    state: Mutex<State>,
    /// Placements some alive node could give (checked once each).
    feasible: DashSet<String>,
    /// The name of this process's home node, once known.
    home: OnceLock<String>,
    /// Set once the reaper runs.
    reaper: OnceLock<()>,
}

impl Pool {
    fn of(context: &ProcessContext) -> Arc<Pool> {
        context.extension()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a task asking for a lease does next.
enum Next {
    Run(Lent<Worker>),
    Start,
    Wait(Ticket, oneshot::Receiver<Lent<Worker>>),
}

/// Fails if no alive node could ever give a task `options`' resources.
/// (Checked once per placement.)
pub(crate) async fn check_feasible(
    context: &ProcessContext,
    options: &SpawnOptions,
) -> Result<(), SpawnError> {
    options.resources().validate()?;
    let pool = Pool::of(context);
    let feasible = &pool.feasible;
    let key = options.placement_key();
    if feasible.contains(&key) {
        return Ok(());
    }
    let status = match context.call_head(MembershipRequest::Status).await? {
        MembershipReply::Status(status) => status,
        other => {
            return Err(SpawnError::Launch(LaunchError::Start {
                node: "head".into(),
                detail: format!("unexpected reply to Status: {other:?}"),
            }))
        }
    };
    let fits = status.nodes.iter().any(|n| {
        n.state == NodeState::Alive
            && options.resources().fits_in(&n.resources.total)
            && match options.placement() {
                Strategy::Node(name) => &n.id == name,
                _ => true,
            }
    });
    // No node fits; a node type of the autoscaler may (as for a spawn):
    // then the tasks wait for it.
    if !fits {
        let needs = format!("{} ({})", options.resources(), describe(options));
        SpawnError::unless_autoscaled(&status, (needs, options.resources()), options.placement())?;
    }
    feasible.insert(key);
    Ok(())
}

/// A worker for a task placed by `options`, with at most `max_in_flight`
/// tasks in flight per worker: an idle lease, a new worker, a busy worker
/// with room, or (when none of these) the next lease returned.
pub(crate) async fn acquire(
    context: &'static ProcessContext,
    options: &SpawnOptions,
    max_in_flight: usize,
) -> Result<Lease, SpawnError> {
    start_reaper(context);
    let pool = Pool::of(context);
    let key = format!("{} in_flight={max_in_flight}", options.placement_key());
    loop {
        let next = {
            let mut state = pool.state();
            if !state.placements.contains_key(&key) {
                let told = Told {
                    queue: rand::random(),
                    resources: options.resources().clone(),
                    count: 0,
                };
                state.placements.insert(key.clone(), told);
            }
            match state.leases.ask(&key, max_in_flight, Instant::now()) {
                Ask::Run(lent) => Next::Run(lent),
                Ask::Start => Next::Start,
                Ask::Queue(ticket) => Next::Wait(ticket, state.wait(ticket)),
            }
        };
        let (ticket, mut handed) = match next {
            Next::Run(lent) => return Ok(Lease::new(lent, &key, &pool)),
            Next::Wait(ticket, handed) => (ticket, handed),
            Next::Start => {
                // Boxed: starting a worker is rare and its future large,
                // and every task in flight holds an `acquire` future.
                let outcome = match Box::pin(start_worker(context, options)).await {
                    Ok(worker) => Started::Up(worker),
                    Err(SpawnError::NoCapacity { .. }) => Started::NoCapacity,
                    Err(e) => Started::Failed(e),
                };
                let mut state = pool.state();
                match state.leases.started(&key, outcome, Instant::now()) {
                    AfterStart::Run(lent, handed) => {
                        for (ticket, lent) in handed {
                            state.hand(&key, ticket, lent);
                        }
                        return Ok(Lease::new(lent, &key, &pool));
                    }
                    AfterStart::Queue(ticket) => (ticket, state.wait(ticket)),
                    AfterStart::Fail(e) => return Err(e),
                }
            }
        };
        // Resources may also free up elsewhere (another job's actors), so
        // a queued task looks again now and then.
        if let Ok(Ok(lent)) = tokio::time::timeout(QUEUE_POLL, &mut handed).await {
            return Ok(Lease::new(lent, &key, &pool));
        }
        let mut state = pool.state();
        state.waiters.remove(&ticket);
        if !state.leases.cancel(&key, ticket) {
            // Handed a worker as the wait ended.
            if let Ok(lent) = handed.try_recv() {
                return Ok(Lease::new(lent, &key, &pool));
            }
        }
    }
}

/// Returns a lease whose task finished: to a queued task, or to the pool.
pub(crate) fn release(lease: Lease) {
    let mut state = lease.pool.state();
    if let Release::Handoff(ticket, handed) =
        state.leases.release(&lease.key, lease.id, Instant::now())
    {
        state.hand(&lease.key, ticket, handed);
    }
}

/// How long a failed worker gets to be recorded dead on its own before it
/// is killed.
const DEATH_WAIT: Duration = Duration::from_secs(3);

/// Drops a lease whose worker failed (for every task in flight on it);
/// returns why the worker died, as the
/// head recorded it. A worker that failed a call is usually dying already,
/// and its own reason (a panic) must not be masked by a kill: it is killed
/// only if it is not recorded dead within [`DEATH_WAIT`].
pub(crate) async fn discard(context: &ProcessContext, lease: Lease) -> Option<DeathCause> {
    // No task goes to it from now on; the others in flight on it find out
    // by their own calls.
    lease.pool.state().leases.lost(&lease.key, lease.id);
    let end = tokio::time::Instant::now() + DEATH_WAIT;
    let mut seen = context.last_event().await.ok()?;
    loop {
        if let Some(reason) = death(&lease.worker).await {
            return Some(reason);
        }
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match context.events(seen, left).await {
            Ok(events) => seen = events.last().map_or(seen, |e| e.seq),
            Err(_) => break,
        }
    }
    if let Err(e) = lease.worker.kill().await {
        tracing::debug!("discarding a task worker: {e}");
    }
    death(&lease.worker).await
}

/// Why `worker` died, if the head has recorded its death.
async fn death(worker: &Worker) -> Option<DeathCause> {
    worker.death().await.ok().flatten()
}

/// Starts a worker: on this process's node first, then anywhere.
async fn start_worker(
    context: &'static ProcessContext,
    options: &SpawnOptions,
) -> Result<Worker, SpawnError> {
    let now = options.clone().deadline(Duration::ZERO);
    if *options.placement() == Strategy::Any {
        if let Some(home) = home_node(context).await {
            let local = now.clone().strategy(Strategy::Node(home));
            if let Ok(worker) = actor::spawn::<TaskWorker>((), local).await {
                return Ok(worker);
            }
        }
    }
    actor::spawn::<TaskWorker>((), now).await
}

/// The name of this process's home node.
async fn home_node(context: &ProcessContext) -> Option<String> {
    let pool = Pool::of(context);
    if let Some(name) = pool.home.get() {
        return Some(name.clone());
    }
    let MembershipReply::Status(status) =
        context.call_head(MembershipRequest::Status).await.ok()?
    else {
        return None;
    };
    let name = status
        .nodes
        .iter()
        .find(|n| n.address == context.home)?
        .id
        .clone();
    Some(pool.home.get_or_init(|| name).clone())
}

/// Kills workers idle for longer than [`IDLE_LEASE`], and tells the head
/// of tasks waiting for room (step 7), from a background task started
/// with the first lease.
fn start_reaper(context: &'static ProcessContext) {
    let pool = Pool::of(context);
    if pool.reaper.set(()).is_err() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(IDLE_LEASE / 2);
        loop {
            tick.tick().await;
            let expired = pool.state().leases.expire(Instant::now());
            for worker in expired {
                if let Err(e) = worker.kill().await {
                    tracing::debug!("returning an idle task worker: {e}");
                }
            }
            for request in waiting_news(&pool, &context.job) {
                if let Err(e) = context.call_head(request).await {
                    tracing::debug!("telling the head of tasks waiting for room: {e}");
                }
            }
        }
    });
}

/// Step 7: what to tell the head of the placements with tasks waiting
/// for room, and of those with none any more.
fn waiting_news(pool: &Pool, job: &str) -> Vec<DirectoryRequest> {
    let mut state = pool.state();
    let waiting: HashMap<String, usize> = state.leases.waiting_for_room().into_iter().collect();
    let mut news = Vec::new();
    for (key, told) in state.placements.iter_mut() {
        let count = waiting
            .get(key)
            .map_or(0, |n| (*n).min(u32::MAX as usize) as u32);
        if count == 0 && told.count == 0 {
            continue;
        }
        told.count = count;
        news.push(DirectoryRequest::TasksWaiting {
            queue: told.queue,
            resources: told.resources.clone(),
            count,
            job: job.to_string(),
        });
    }
    news
}
