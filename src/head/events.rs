//! The cluster event stream: membership changes, resource changes, actor
//! starts and deaths, injected faults, recoveries and packet-fault counts,
//! numbered, kept for late readers, and pushed to subscribers.
//!
//! Every published event gets the next sequence number (from 1), and each
//! text in it is cut to `MAX_TEXT_BYTES` (4 KiB); the last `HISTORY`
//! (4096) are kept, older ones are dropped. One answer holds at most
//! `PAGE` (512) events, so it always fits in a frame; readers ask again
//! after the last one they got. Actors in the head
//! process subscribe with [`Subscribe`] (the directory does, for node
//! deaths); other processes long-poll with
//! [`EventRequest::Events`](crate::cluster::EventRequest::Events), which
//! the node service turns into [`EventsSince`]: the kept events after
//! `after` at once, or, when there are none, the first ones published
//! within the wait (which the node service caps at 60 s per request).
//! A wait for any change asks for the events after `u64::MAX`: it
//! returns, empty, as soon as the next event is published.
//!
//! Numbers grow across the head's restarts: the head's `epoch`th start
//! (`head/store.rs`, step 3) numbers from `(epoch - 1) << EPOCH_SHIFT`,
//! so a reader that kept its place from before a restart gets every event
//! of the new head instead of waiting for numbers it has seen. (It is not
//! told that it missed the events of the outage itself: a resync signal
//! is not built yet.)

use std::collections::VecDeque;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::cluster::{ClusterEvent, ClusterEventKind};

/// Events kept for readers that poll; older ones are dropped.
const HISTORY: usize = 4096;
/// The most events in one answer: 512 × (4 KiB texts × at most 3 per
/// event) stays below the 16 MiB frame limit.
const PAGE: usize = 512;

/// Bits of an event number below the head's epoch: 2^32 events per start.
const EPOCH_SHIFT: u32 = 32;

/// Numbers and fans out cluster events.
#[derive(Default)]
pub struct ClusterEvents {
    history: VecDeque<ClusterEvent>,
    next_seq: u64,
    subscribers: Vec<Recipient<ClusterEvent>>,
    waiting: Vec<oneshot::Sender<()>>,
}

impl Actor for ClusterEvents {
    type Context = Context<Self>;
}

/// Record an event and deliver it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Publish(pub ClusterEventKind);

/// Deliver every later event to this recipient.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Subscribe(pub Recipient<ClusterEvent>);

/// The kept events after `after`, waiting up to `wait` for one when there
/// are none yet.
#[derive(Message)]
#[rtype(result = "Vec<ClusterEvent>")]
pub struct EventsSince {
    /// Last sequence number seen (0 for all).
    pub after: u64,
    /// Longest wait for a new event.
    pub wait: Duration,
}

impl ClusterEvents {
    /// The event stream of the head's `epoch`th start (from 1).
    pub fn for_epoch(epoch: u64) -> Self {
        ClusterEvents {
            next_seq: epoch.saturating_sub(1) << EPOCH_SHIFT,
            ..ClusterEvents::default()
        }
    }

    fn since(&self, after: u64) -> Vec<ClusterEvent> {
        self.history
            .iter()
            .filter(|e| e.seq > after)
            .take(PAGE)
            .cloned()
            .collect()
    }
}

impl Handler<Publish> for ClusterEvents {
    type Result = ();

    fn handle(&mut self, Publish(kind): Publish, _: &mut Self::Context) {
        self.next_seq += 1;
        let event = ClusterEvent {
            seq: self.next_seq,
            kind: kind.bounded(),
            time_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(event.clone());
        self.subscribers
            .retain(|s| s.try_send(event.clone()).is_ok());
        for waiter in self.waiting.drain(..) {
            let _ = waiter.send(());
        }
    }
}

impl Handler<Subscribe> for ClusterEvents {
    type Result = ();

    fn handle(&mut self, Subscribe(recipient): Subscribe, _: &mut Self::Context) {
        self.subscribers.push(recipient);
    }
}

impl Handler<EventsSince> for ClusterEvents {
    type Result = ResponseActFuture<Self, Vec<ClusterEvent>>;

    fn handle(&mut self, msg: EventsSince, _: &mut Self::Context) -> Self::Result {
        let ready = self.since(msg.after);
        if !ready.is_empty() || msg.wait.is_zero() {
            return Box::pin(fut::ready(ready));
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.push(tx);
        let wait = tokio::time::timeout(msg.wait, rx);
        Box::pin(
            wait.into_actor(self)
                .map(move |_, events, _| events.since(msg.after)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Incarnation, NodeIdentity};

    fn left(name: &str) -> ClusterEventKind {
        ClusterEventKind::NodeLeft {
            node: NodeIdentity {
                name: name.into(),
                incarnation: Incarnation(1),
            },
        }
    }

    #[actix_rt::test]
    async fn a_long_poll_wakes_on_the_next_event() {
        let events = ClusterEvents::default().start();
        events.send(Publish(left("a"))).await.unwrap();
        let poll = events.send(EventsSince {
            after: 1,
            wait: Duration::from_secs(30),
        });
        events.do_send(Publish(left("b")));
        let got = poll.await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].seq, 2);
        assert_eq!(got[0].kind.node().unwrap().name, "b");
    }

    #[actix_rt::test]
    async fn a_reader_from_before_a_restart_gets_the_new_heads_events() {
        let before = ClusterEvents::for_epoch(1).start();
        for _ in 0..3 {
            before.send(Publish(left("a"))).await.unwrap();
        }
        let after = ClusterEvents::for_epoch(2).start();
        after.send(Publish(left("b"))).await.unwrap();
        let got = after
            .send(EventsSince {
                after: 3,
                wait: Duration::ZERO,
            })
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].seq, (1 << EPOCH_SHIFT) + 1);
    }

    #[actix_rt::test]
    async fn a_long_poll_without_events_returns_empty_at_its_deadline() {
        let events = ClusterEvents::default().start();
        let got = events
            .send(EventsSince {
                after: 0,
                wait: Duration::from_millis(10),
            })
            .await
            .unwrap();
        assert!(got.is_empty());
    }
}
