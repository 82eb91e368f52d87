//! `Replica`: the actor, one per worker process, that hosts one instance
//! of a deployment and answers its requests.
//!
//! 1. Built, on its first message, from the deployment's name and init arguments
//!    (`DeploymentTable::build`); a constructor that fails leaves the
//!    replica unhealthy with the constructor's error, for the controller
//!    to report.
//! 2. A [`Request`] runs concurrently with the others, up to
//!    `max_ongoing`; past it the replica answers [`Answer::Full`] at once
//!    and the ingress tries another replica or queues the request.
//! 3. Every answer carries the replica's ongoing count after it, which the
//!    ingresses' power-of-two-choices routing reads (no extra round trip).
//!    With batching on, requests queue in `batcher.rs` and run through the
//!    deployment's `call_batch`, a batch at a time (or more, when one is
//!    full or has waited `max_wait` while another runs).
//! 4. [`Cancel`] (sent by the ingress when the request's client left or its
//!    timeout passed) stops the request's call where it waits (its future
//!    is dropped) or takes it out of the batch queue; a batch already
//!    started runs on for the others in it.
//! 5. [`Drain`] answers once no request is ongoing: an old version's
//!    replica is drained, then stopped, in a rolling update.
//! 6. [`Reconfigure`] hands the built deployment a new user config (a
//!    redeploy that changed only that), between its requests.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

use actix::prelude::*;
use futures::future::{AbortHandle, Abortable};
use futures::FutureExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, Notify};

use nimbus::actor::ActorHandle;

use crate::batcher::Batcher;
use crate::config::Batching;
use crate::controller::Controller;
use crate::deployment::{DeploymentTable, Hosted, Outcome};

/// A request waiting in the batch queue: its id, its body and where its
/// outcome goes.
type Queued = (u64, Vec<u8>, oneshot::Sender<Outcome>);

/// Hosts one instance of a deployment.
pub struct Replica {
    args: ReplicaArgs,
    /// Built on the first message (the worker's registry is installed
    /// after its actor is created).
    hosted: Option<Result<Rc<dyn Hosted>, String>>,
    ongoing: Rc<RefCell<Ongoing>>,
    /// How to stop each ongoing call, by request id.
    calls: Rc<RefCell<HashMap<u64, AbortHandle>>>,
    idle: Rc<Notify>,
    max_ongoing: u32,
    batcher: Option<Batcher<Queued>>,
    /// When the batch queue's timer fires, if one is set.
    wake_at: Option<Instant>,
}

impl Actor for Replica {
    type Context = Context<Self>;
}

/// What a replica is built from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplicaArgs {
    /// The deployment type's registered name (`Deployment::NAME`).
    pub(crate) kind: String,
    /// Its init arguments, MessagePack.
    #[serde(with = "serde_bytes")]
    pub(crate) init: Vec<u8>,
    /// Requests it runs at once.
    pub(crate) max_ongoing: u32,
    /// Dynamic batching, if on.
    pub(crate) batching: Option<Batching>,
    /// The user config it takes once built, JSON text.
    pub(crate) user_config: Option<String>,
    /// Its controller, which its deployment's `DeploymentHandle`s ask for
    /// the replicas of other applications.
    pub(crate) controller: Option<ActorHandle<Controller>>,
}

impl Replica {
    fn new(args: ReplicaArgs) -> Self {
        crate::handle::set_controller(args.controller.clone());
        Replica {
            max_ongoing: args.max_ongoing.max(1),
            batcher: args
                .batching
                .map(|batching| Batcher::new(batching.max_batch_size as usize, batching.max_wait)),
            wake_at: None,
            args,
            hosted: None,
            ongoing: Rc::new(RefCell::new(Ongoing::new(Instant::now()))),
            calls: Rc::default(),
            idle: Rc::new(Notify::new()),
        }
    }

    /// The deployment, built on first use.
    fn hosted(&mut self) -> &Result<Rc<dyn Hosted>, String> {
        let args = &self.args;
        self.hosted.get_or_insert_with(|| {
            let hosted = DeploymentTable::build(&args.kind, &args.init)
                .and_then(|hosted| match &args.user_config {
                    Some(config) => hosted.reconfigure(config).map(|()| hosted),
                    None => Ok(hosted),
                })
                .map(Rc::from)
                .map_err(|e| format!("replica of {} cannot be built: {e}", args.kind));
            if let Err(e) = &hosted {
                tracing::error!("{e}");
            }
            hosted
        })
    }

    /// Starts every batch due now, and sets the timer for the next one.
    fn start_batches(&mut self, ctx: &mut Context<Self>) {
        let Ok(hosted) = self.hosted().clone() else {
            return;
        };
        let Some(batcher) = self.batcher.as_mut() else {
            return;
        };
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(batch) = batcher.take(now) {
            due.push(batch);
        }
        let wake_at = batcher.wake_at();
        for batch in due {
            let (bodies, senders): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .map(|(_, body, sender)| (body, sender))
                .unzip();
            let run = hosted.call_batch(bodies).into_actor(self);
            ctx.spawn(run.map(|outcomes, replica, ctx| {
                for (sender, outcome) in senders.into_iter().zip(outcomes) {
                    let _ = sender.send(outcome);
                }
                if let Some(batcher) = replica.batcher.as_mut() {
                    batcher.finished();
                }
                replica.start_batches(ctx);
            }));
        }
        if let Some(at) = wake_at.filter(|at| self.wake_at.is_none_or(|set| *at < set)) {
            self.wake_at = Some(at);
            ctx.run_later(at.saturating_duration_since(now), |replica, ctx| {
                replica.wake_at = None;
                replica.start_batches(ctx);
            });
        }
    }
}

/// The requests a replica holds, and how many it held on average since
/// the last health check: what autoscaling reads (the count at one instant
/// mostly misses requests that take a millisecond).
#[derive(Debug)]
struct Ongoing {
    now: u32,
    /// Request-seconds held since `since`, counted up to `changed`.
    held: f64,
    since: Instant,
    changed: Instant,
}

impl Ongoing {
    fn new(at: Instant) -> Self {
        Ongoing {
            now: 0,
            held: 0.0,
            since: at,
            changed: at,
        }
    }

    fn get(&self) -> u32 {
        self.now
    }

    fn set(&mut self, count: u32, at: Instant) {
        let lasted = at.saturating_duration_since(self.changed).as_secs_f64();
        self.held += f64::from(self.now) * lasted;
        self.now = count;
        self.changed = at;
    }

    /// The average held since the call before (or the start); a new period
    /// starts.
    fn average(&mut self, at: Instant) -> f64 {
        self.set(self.now, at);
        let period = at.saturating_duration_since(self.since).as_secs_f64();
        let average = if period > 0.0 {
            self.held / period
        } else {
            f64::from(self.now)
        };
        self.held = 0.0;
        self.since = at;
        average
    }
}

nimbus::remote_actor!(Replica, args: ReplicaArgs, new: Replica::new, handles: [Request, Cancel, Health, Drain, Reconfigure]);

/// One HTTP request's body, for the deployment.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Answer")]
pub struct Request {
    /// Names the request to [`Cancel`] (drawn at random by its ingress).
    pub(crate) id: u64,
    #[serde(with = "serde_bytes")]
    pub(crate) body: Vec<u8>,
}

nimbus::remote_message!(Request);

/// A replica's answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
pub enum Answer {
    /// Answered: the HTTP status and JSON body, and the replica's ongoing
    /// requests after it.
    Done {
        /// HTTP status.
        status: u16,
        /// JSON body.
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
        /// Requests still ongoing on the replica.
        ongoing: u32,
    },
    /// Not run: the replica has `max_ongoing` requests already.
    Full {
        /// Requests ongoing on the replica.
        ongoing: u32,
    },
}

impl Answer {
    fn done(outcome: Outcome, ongoing: u32) -> Self {
        Answer::Done {
            status: outcome.status,
            body: outcome.body,
            ongoing,
        }
    }
}

impl Handler<Request> for Replica {
    type Result = ResponseFuture<Answer>;

    fn handle(&mut self, request: Request, ctx: &mut Context<Self>) -> Self::Result {
        let hosted = match self.hosted() {
            Ok(hosted) => hosted.clone(),
            Err(e) => {
                let answer = Answer::done(Outcome::error(503, e), 0);
                return Box::pin(async move { answer });
            }
        };
        let ongoing = self.ongoing.clone();
        let held = ongoing.borrow().get();
        if held >= self.max_ongoing {
            return Box::pin(async move { Answer::Full { ongoing: held } });
        }
        ongoing.borrow_mut().set(held + 1, Instant::now());
        let idle = self.idle.clone();
        let id = request.id;
        let call = match self.batcher.as_mut() {
            Some(batcher) => {
                let (sender, outcome) = oneshot::channel();
                batcher.push((id, request.body, sender), Instant::now());
                self.start_batches(ctx);
                outcome
                    .map(|outcome| {
                        outcome.unwrap_or_else(|_| {
                            Outcome::error(CANCELLED, "cancelled before its batch started")
                        })
                    })
                    .boxed_local()
            }
            None => {
                let (stop, registration) = AbortHandle::new_pair();
                let calls = self.calls.clone();
                calls.borrow_mut().insert(id, stop);
                let call = Abortable::new(hosted.call(&request.body), registration);
                async move {
                    let outcome = call.await.unwrap_or_else(|_| {
                        Outcome::error(CANCELLED, "cancelled: its client left")
                    });
                    calls.borrow_mut().remove(&id);
                    outcome
                }
                .boxed_local()
            }
        };
        Box::pin(async move {
            let outcome = call.await;
            let held = ongoing.borrow().get() - 1;
            ongoing.borrow_mut().set(held, Instant::now());
            if held == 0 {
                idle.notify_waiters();
            }
            Answer::done(outcome, held)
        })
    }
}

/// The status of a cancelled request's answer (nginx's "client closed
/// request"; no client reads it).
const CANCELLED: u16 = 499;

/// Stops request `id` (its client left, or its ingress gave up on it).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Cancel {
    pub(crate) id: u64,
}

nimbus::remote_message!(Cancel);

impl Handler<Cancel> for Replica {
    type Result = ();

    fn handle(&mut self, Cancel { id }: Cancel, _: &mut Context<Self>) {
        match self.batcher.as_mut() {
            // Queued: taken out, it never starts (its answer's sender is
            // dropped). In a batch under way, it runs on with the others.
            Some(batcher) => drop(batcher.remove(|(queued, _, _)| *queued == id)),
            None => {
                if let Some(call) = self.calls.borrow_mut().remove(&id) {
                    call.abort();
                }
            }
        }
    }
}

/// Asks whether the replica was built and its deployment's health check
/// passes; a healthy replica answers the requests it held on average
/// since the check before (for autoscaling).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<f64, HealthError>")]
pub struct Health;

/// Why a replica cannot serve.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum HealthError {
    /// Its deployment could not be built (for good: the constructor's error).
    #[error("{0}")]
    NotBuilt(String),
    /// Its deployment's health check failed (it may pass later).
    #[error("{0}")]
    Unhealthy(String),
}

nimbus::remote_message!(Health);

impl Handler<Health> for Replica {
    type Result = Result<f64, HealthError>;

    fn handle(&mut self, _: Health, _: &mut Context<Self>) -> Self::Result {
        let hosted = self
            .hosted()
            .as_ref()
            .map_err(|e| HealthError::NotBuilt(e.clone()))?;
        hosted.check_health().map_err(HealthError::Unhealthy)?;
        Ok(self.ongoing.borrow_mut().average(Instant::now()))
    }
}

/// Answers once the replica has no request ongoing.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Drain;

nimbus::remote_message!(Drain);

impl Handler<Drain> for Replica {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> Self::Result {
        let (ongoing, idle) = (self.ongoing.clone(), self.idle.clone());
        Box::pin(async move {
            while ongoing.borrow().get() > 0 {
                idle.notified().await;
            }
        })
    }
}

/// Step 6: the deployment takes this user config (JSON text); the error
/// names why not.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
pub struct Reconfigure(pub(crate) String);

nimbus::remote_message!(Reconfigure);

impl Handler<Reconfigure> for Replica {
    type Result = Result<(), String>;

    fn handle(&mut self, Reconfigure(config): Reconfigure, _: &mut Context<Self>) -> Self::Result {
        let hosted = self.hosted().clone()?;
        hosted.reconfigure(&config)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_average_weighs_each_count_by_how_long_it_was_held() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut ongoing = Ongoing::new(start);
        // 2 requests for 250 ms, 1 for 250 ms, none for 500 ms: 0.75.
        ongoing.set(2, at(0));
        ongoing.set(1, at(250));
        ongoing.set(0, at(500));
        assert!((ongoing.average(at(1000)) - 0.75).abs() < 1e-9);
        // A new period: one request held through it.
        ongoing.set(1, at(1000));
        assert!((ongoing.average(at(2000)) - 1.0).abs() < 1e-9);
        assert_eq!(ongoing.get(), 1);
    }
}
