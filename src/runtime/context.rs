//! What a process needs to reach the cluster: set once, by
//! [`Driver::connect`](crate::driver::Driver::connect) in a driver or by
//! the worker runtime in a worker process.
//!
//! Its home node is the worker's own node, or the head for a driver (where
//! its puts go). Installing it starts the death watch: the process
//! long-polls the head's events (30 s per poll) and, when an actor
//! incarnation it has a channel to dies (`ActorDied`), cuts the connection
//! to that worker, so calls in flight fail at once and the next call finds
//! the new incarnation, instead of waiting out the transport's idle timeout
//! (a SIGKILLed process sends no goodbye).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dashmap::DashMap;

use actix::{Actor, Addr};

use super::extensions::Extensions;
use super::registry::{HostedActor, Registry};

use crate::client::{self, ClientError};
use crate::cluster::{
    ActorId, ActorOwner, BinaryId, ClusterEvent, ClusterEventKind, ControlRequest, DirectoryReply,
    DirectoryRequest, Subsystem,
};
use crate::transport::{Connection, Endpoint, RequestOptions};
use crate::wire::Incarnation;

/// This process's link to the cluster.
pub struct ProcessContext {
    /// The process's QUIC endpoint.
    pub endpoint: Endpoint,
    /// The head's address.
    pub head: SocketAddr,
    /// The node whose object store this process puts into (its own node
    /// for a worker, the head for a driver).
    pub home: SocketAddr,
    /// The actor and message types this program knows.
    pub registry: Arc<Registry>,
    /// The job actors spawned from here belong to.
    pub job: String,
    /// This program's binary, shipped to nodes that run its actors.
    pub binary: (PathBuf, BinaryId),
    /// The actor incarnation that owns the actors spawned from here (an
    /// actor's worker process: [`owning`](Self::owning)); `None` in a
    /// driver or a task's worker, whose actors live as long as their job.
    pub owner: Option<ActorOwner>,
    local: Mutex<HashMap<ActorId, HostedActor>>,
    /// Workers this process has channels to, so their deaths cut them.
    workers: DashMap<ActorId, (SocketAddr, Incarnation)>,
    /// Held for the whole of a metrics push: the node keeps the push that
    /// arrives last, so a push must not overtake an older one.
    pushing: tokio::sync::Mutex<()>,
    /// The features' per-process state (`extensions.rs`).
    extensions: Extensions,
}

/// How long a process's last push of its metrics may take (a worker that
/// ends, training that finished): its node may be gone.
pub const LAST_PUSH_WAIT: Duration = Duration::from_secs(2);

static CONTEXT: OnceLock<ProcessContext> = OnceLock::new();

impl ProcessContext {
    /// A context; see [`install`](Self::install).
    pub fn new(
        endpoint: Endpoint,
        head: SocketAddr,
        home: SocketAddr,
        registry: Arc<Registry>,
        job: String,
        binary: (PathBuf, BinaryId),
    ) -> Self {
        ProcessContext {
            endpoint,
            head,
            home,
            registry,
            job,
            binary,
            owner: None,
            local: Mutex::new(HashMap::new()),
            workers: DashMap::new(),
            pushing: tokio::sync::Mutex::new(()),
            extensions: Extensions::default(),
        }
    }

    /// This context, in the worker process of `owner`: the actors spawned
    /// from it die with that incarnation.
    pub fn owning(mut self, owner: ActorOwner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// This process's `T`, a feature's per-process state, made with
    /// `T::default()` on first use (`extensions.rs`).
    pub(crate) fn extension<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.extensions.get()
    }

    /// Makes `context` this process's, and starts watching the cluster for
    /// deaths of actors this process calls (see `watch_deaths`); `None` if
    /// one was installed already. Call it inside the async runtime the
    /// process keeps for its lifetime; the composition root (driver or
    /// worker) then starts the per-process services of the features.
    pub fn install(context: ProcessContext) -> Option<&'static ProcessContext> {
        CONTEXT.set(context).ok()?;
        let context = Self::current()?;
        tokio::spawn(watch_deaths(context));
        if crate::metrics::install().is_some() {
            tokio::spawn(push_metrics(context));
        }
        Some(context)
    }

    /// Notes that this process talks to `actor` at `address` (incarnation
    /// `incarnation`).
    pub(crate) fn talking_to(&self, actor: ActorId, address: SocketAddr, incarnation: Incarnation) {
        self.workers.insert(actor, (address, incarnation));
    }

    /// This process's context, once installed.
    pub fn current() -> Option<&'static ProcessContext> {
        CONTEXT.get()
    }

    /// Sends a control request to the head. An idempotent one
    /// ([`ControlRequest::is_idempotent`]) that finds the head unreachable
    /// is asked again on a new connection, with backoff, for up to the
    /// head's grace ([`client::head_wait`]): a restarting head delays it instead of
    /// failing it.
    pub async fn call_head<R: Subsystem>(&self, request: R) -> Result<R::Reply, ClientError> {
        let request: ControlRequest = request.into();
        let again = request.is_idempotent();
        let request = &request;
        let ask = |head: Connection| async move {
            client::exchange(&head, request, RequestOptions::control()).await
        };
        Ok(R::expect(self.ask_head(again, ask).await?)?)
    }

    /// The sequence number of the head's latest event (asked again while
    /// the head is unreachable, as [`call_head`](Self::call_head)).
    pub async fn last_event(&self) -> Result<u64, ClientError> {
        let ask = |head: Connection| async move { client::last_event_seq(&head).await };
        self.ask_head(true, ask).await
    }

    /// Events after `after`, waiting up to `wait` for one (asked again
    /// while the head is unreachable: a watcher rides a head restart out,
    /// and event numbers grow across restarts, `head/events.rs`).
    pub async fn events(
        &self,
        after: u64,
        wait: Duration,
    ) -> Result<Vec<ClusterEvent>, ClientError> {
        let ask = |head: Connection| async move { client::events(&head, after, wait).await };
        self.ask_head(true, ask).await
    }

    async fn ask_head<T, F, Fut>(&self, again: bool, ask: F) -> Result<T, ClientError>
    where
        F: Fn(Connection) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        client::ask_head(&self.endpoint, self.head, again, ask).await
    }

    /// Pushes this process's metrics to its node now, over its own
    /// endpoint (the node keys a worker's pushes by its certified
    /// identity), after any push in flight; for at most
    /// [`LAST_PUSH_WAIT`]. What a process that ends calls last, so its
    /// node keeps the totals of what it did (`crate::metrics`, step 2).
    pub async fn push_metrics_now(&self) -> Result<(), ClientError> {
        match tokio::time::timeout(LAST_PUSH_WAIT, self.push_metrics_once()).await {
            Ok(pushed) => pushed,
            Err(_) => Err(ClientError::Deadline {
                what: "the last metrics push to this process's node".into(),
                after: LAST_PUSH_WAIT,
            }),
        }
    }

    /// Sends `request` to this process's node, over its own endpoint.
    pub async fn call_node(
        &self,
        request: crate::cluster::WorkerRequest,
    ) -> Result<crate::cluster::WorkerReply, ClientError> {
        let home = self.endpoint.connect(self.home, None).await?;
        client::call(&home, request, RequestOptions::control()).await
    }

    async fn push_metrics_once(&self) -> Result<(), ClientError> {
        let _turn = self.pushing.lock().await;
        let request = self.metrics_push();
        let home = self.endpoint.connect(self.home, None).await?;
        client::call(&home, request, RequestOptions::control()).await?;
        Ok(())
    }

    /// This process's metrics as a push to its node (`crate::metrics`).
    pub fn metrics_push(&self) -> crate::cluster::WorkerRequest {
        crate::cluster::WorkerRequest::PushMetrics {
            process: self.endpoint.identity().to_string(),
            text: crate::metrics::render(),
        }
    }

    /// Records that `actor` runs in this process, so calls from here skip
    /// serialization.
    pub fn host_locally(&self, actor: ActorId, hosted: HostedActor) {
        self.lock().insert(actor, hosted);
    }

    /// The address of `actor` if it runs in this process as an `A`.
    pub fn local<A: Actor>(&self, actor: ActorId) -> Option<Addr<A>> {
        self.lock().get(&actor)?.addr::<A>().cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ActorId, HostedActor>> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Pushes this process's metrics to its home node every
/// [`PUSH_INTERVAL`](crate::metrics::PUSH_INTERVAL) (the protocol is in
/// `crate::metrics`); a push that fails is logged at debug level and the
/// next one carries the same counters.
async fn push_metrics(context: &'static ProcessContext) {
    let mut interval = tokio::time::interval(crate::metrics::PUSH_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if let Err(e) = context.push_metrics_once().await {
            tracing::debug!("cannot push this process's metrics to its node: {e}");
        }
    }
}

/// Cuts the connection to every worker whose actor incarnation dies, so that
/// calls in flight fail at once and the next call finds the new incarnation,
/// instead of both waiting out the transport's idle timeout (a SIGKILLed
/// process sends no goodbye).
async fn watch_deaths(context: &'static ProcessContext) {
    let mut after = 0;
    let wait = Duration::from_secs(30);
    loop {
        let events = match context.events(after, wait).await {
            Ok(events) => events,
            Err(e) => {
                tracing::debug!("death watch: the head is unreachable ({e}); retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        after = events.last().map_or(after, |e| e.seq);
        for event in events {
            match event.kind {
                ClusterEventKind::ActorDied {
                    actor,
                    incarnation,
                    reason,
                    ..
                } => forget_worker(
                    context,
                    actor,
                    incarnation,
                    &format!("actor died: {reason}"),
                ),
                ClusterEventKind::Resync { .. } => resync_workers(context).await,
                _ => {}
            }
        }
    }
}

/// Forgets the worker of `actor` if it is `incarnation`, and cuts its
/// connection saying `why`.
fn forget_worker(context: &ProcessContext, actor: ActorId, incarnation: Incarnation, why: &str) {
    let known = context.workers.get(&actor).map(|w| *w);
    if let Some((address, current)) = known {
        if current == incarnation {
            context.workers.remove(&actor);
            context.endpoint.disconnect(address, why);
        }
    }
}

/// The death watch missed events (`head/events.rs`, step 2): every known
/// worker whose incarnation the directory records dead, or replaced by a
/// newer one, is forgotten as if its death had been read. A worker the
/// directory does not know (yet) is kept.
async fn resync_workers(context: &ProcessContext) {
    let known: Vec<(ActorId, Incarnation)> = context
        .workers
        .iter()
        .map(|w| (*w.key(), w.value().1))
        .collect();
    for (actor, incarnation) in known {
        let request = DirectoryRequest::LocateActor(actor);
        let record = match context.call_head(request).await {
            Ok(DirectoryReply::Actor(Some(record))) => record,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!("death watch: cannot read the directory to resync ({e})");
                return;
            }
        };
        let gone = incarnation < record.incarnation
            || (incarnation == record.incarnation && record.dead.is_some());
        if gone {
            let why = "actor incarnation gone (read after missed events)";
            forget_worker(context, actor, incarnation, why);
        }
    }
}
