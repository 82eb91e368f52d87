//! What a node tells the head's directory about its actors: an incarnation
//! runs (`ActorUp`, with its spec) or died (`ActorDown`, with the cause and
//! whether it restarts).
//!
//! The directory takes an `ActorUp` of a newer incarnation over what it
//! knows and ignores an `ActorDown` of an older one, so reports about one
//! actor must reach it in the order they were made: a death report that
//! lost a datagram and was overtaken by its restart's `ActorUp` would never
//! be published, and whoever waits for that death (`actor::next_death`,
//! monitors, restart counts) would wait forever.
//!
//! 1. Each report about an actor starts once the one made before it about
//!    that actor has ended (answered, refused or given up after
//!    `REPORT_DEADLINE`); reports about different actors go side by side.
//! 2. Every report runs whether or not its maker waits for it.
//! 3. A report the head did not answer is kept: an `ActorDown` in the
//!    unreported list, an `ActorUp` as a flag. Once the head answers again
//!    (`again`), the kept deaths are told first, then every live actor, in
//!    that order per actor.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use tracing::warn;

use super::manager::{call_head, HeadLink};
use crate::client::ClientError;
use crate::cluster::{ActorId, ActorRecord, ActorSpec, DirectoryRequest};
use crate::head::directory::{self, ActorDown};
use crate::transport::{Endpoint, RequestError};
use crate::wire::NodeIdentity;

/// How long the head has to answer one report before it is kept to be
/// told again.
const REPORT_DEADLINE: Duration = Duration::from_secs(10);

/// A report under way (or done), which the next about its actor waits for.
type Pending = Shared<BoxFuture<'static, ()>>;

/// The node's reports to the head's directory, in order per actor.
pub(super) struct Reports {
    head: HeadLink,
    node: NodeIdentity,
    order: PerActor,
    /// Deaths the head did not take: told again once it answers.
    unreported: Arc<Mutex<Vec<ActorDown>>>,
    /// An `ActorUp` did not reach the head: every live actor is told again
    /// once it answers.
    up_due: Arc<AtomicBool>,
}

impl Reports {
    /// Reports of the node `node` to the head at `head`.
    pub(super) fn new(head: HeadLink, node: NodeIdentity) -> Self {
        Reports {
            head,
            node,
            order: PerActor::default(),
            unreported: Arc::default(),
            up_due: Arc::default(),
        }
    }

    /// Tells the directory that an incarnation runs; the future ends when
    /// the head has answered (or the report was given up and kept).
    pub(super) fn up(&mut self, record: ActorRecord, spec: ActorSpec) -> BoxFuture<'static, ()> {
        let actor = record.actor;
        let report = match &self.head {
            HeadLink::Local { directory, .. } => {
                let sent = directory.send(directory::ActorUp { record, spec });
                async move {
                    let _ = sent.await;
                }
                .boxed()
            }
            HeadLink::Remote { endpoint, head } => {
                let call = call(endpoint, *head, DirectoryRequest::ActorUp { record, spec });
                let due = self.up_due.clone();
                async move {
                    match call.await {
                        Ok(()) => {}
                        Err(e @ ClientError::Request(RequestError::Remote { .. })) => {
                            warn!("the head refused an actor report: {e}");
                        }
                        Err(e) => {
                            warn!("cannot report an actor to the head (told again once it answers): {e}");
                            due.store(true, Ordering::Relaxed);
                        }
                    }
                }
                .boxed()
            }
        };
        self.order.after_last(actor, report)
    }

    /// Tells the directory that an incarnation died; it is told again once
    /// the head answers if it could not be told now.
    pub(super) fn down(&mut self, down: ActorDown) {
        let actor = down.actor;
        let report = match &self.head {
            HeadLink::Local { directory, .. } => {
                directory.do_send(ActorDown {
                    node: Some(self.node.clone()),
                    ..down
                });
                futures::future::ready(()).boxed()
            }
            HeadLink::Remote { endpoint, head } => {
                let request = DirectoryRequest::ActorDown {
                    actor: down.actor,
                    incarnation: down.incarnation,
                    reason: down.reason.clone(),
                    restarting: down.restarting,
                };
                let call = call(endpoint, *head, request);
                let unreported = self.unreported.clone();
                async move {
                    match call.await {
                        Ok(()) => {}
                        // The head answered: it took the report, or never will.
                        Err(e @ ClientError::Request(RequestError::Remote { .. })) => {
                            warn!(actor = %down.actor, "the head refused an actor death report: {e}");
                        }
                        Err(e) => {
                            warn!(actor = %down.actor, "cannot report an actor death to the head (told again once it answers): {e}");
                            unreported.lock().unwrap_or_else(|e| e.into_inner()).push(down);
                        }
                    }
                }
                .boxed()
            }
        };
        drop(self.order.after_last(actor, report));
    }

    /// Whether a report did not reach the head (clears the `ActorUp` flag).
    pub(super) fn take_due(&self) -> bool {
        let up = self.up_due.swap(false, Ordering::Relaxed);
        up || !self.lock_unreported().is_empty()
    }

    /// After the head was unreachable (it may have restarted): the deaths
    /// it was not told of, then every actor in `live`.
    pub(super) fn again(&mut self, live: Vec<(ActorRecord, ActorSpec)>) {
        let downs = std::mem::take(&mut *self.lock_unreported());
        for down in downs {
            self.down(down);
        }
        for (record, spec) in live {
            drop(self.up(record, spec));
        }
    }

    fn lock_unreported(&self) -> std::sync::MutexGuard<'_, Vec<ActorDown>> {
        self.unreported.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One directory request to the head at `head`, within `REPORT_DEADLINE`.
fn call(
    endpoint: &Endpoint,
    head: SocketAddr,
    request: DirectoryRequest,
) -> BoxFuture<'static, Result<(), ClientError>> {
    let call = call_head(endpoint, head, request, REPORT_DEADLINE);
    async move { call.await.map(drop) }.boxed()
}

/// Reports run in order per actor (steps 1 and 2).
#[derive(Default)]
struct PerActor {
    /// Per actor, the last report made; done ones are dropped as new ones
    /// come.
    last: HashMap<ActorId, Pending>,
}

impl PerActor {
    /// Runs `report` once the last report about `actor` has ended (step 1),
    /// whether or not the returned future is awaited (step 2).
    fn after_last(
        &mut self,
        actor: ActorId,
        report: BoxFuture<'static, ()>,
    ) -> BoxFuture<'static, ()> {
        self.last.retain(|_, pending| pending.peek().is_none());
        let before = self.last.remove(&actor);
        let pending: Pending = async move {
            if let Some(before) = before {
                before.await;
            }
            report.await;
        }
        .boxed()
        .shared();
        self.last.insert(actor, pending.clone());
        actix::spawn(pending.clone());
        pending.boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::FutureExt;
    use tokio::sync::oneshot;

    use super::PerActor;
    use crate::cluster::ActorId;

    #[actix_rt::test]
    async fn a_report_waits_for_the_one_before_it_about_its_actor_only() {
        let ran = Arc::new(Mutex::new(Vec::new()));
        let note = |what: &'static str| {
            let ran = ran.clone();
            async move { ran.lock().unwrap().push(what) }.boxed()
        };
        let mut order = PerActor::default();
        let (release, held) = oneshot::channel::<()>();
        let first_ran = note("down 1");
        drop(
            order.after_last(
                ActorId(1),
                async move {
                    let _ = held.await;
                    first_ran.await;
                }
                .boxed(),
            ),
        );
        let up = order.after_last(ActorId(1), note("up 1"));
        order.after_last(ActorId(2), note("up 2")).await;
        assert_eq!(
            *ran.lock().unwrap(),
            ["up 2"],
            "actor 1's up overtook its down"
        );
        release.send(()).unwrap();
        up.await;
        assert_eq!(*ran.lock().unwrap(), ["up 2", "down 1", "up 1"]);
    }
}
