//! The cluster event stream: membership changes, resource changes, actor
//! starts and deaths, injected faults, recoveries and packet-fault counts,
//! numbered, kept for late readers, and pushed to subscribers.
//!
//! Every published event gets the next sequence number (from 1), and each
//! text in it is cut to `MAX_TEXT_BYTES` (4 KiB); the last `HISTORY`
//! (4096) are kept, older ones are dropped. One answer holds at most
//! `PAGE` (512) events, so it always fits in a frame; readers ask again
//! after the last one they got. Actors in the head
//! process subscribe with [`Subscribe`] (the directory and the job keeper
//! do, for node deaths) and get every event, however many are published
//! while they are busy (past their mailbox's capacity); other processes
//! ask for the latest number ([`LastSeq`]) and long-poll with
//! [`EventRequest::Events`](crate::cluster::EventRequest::Events), which
//! the node service turns into [`EventsSince`]: the kept events after
//! `after` at once, or, when there are none, the first ones published
//! within the wait (which the node service caps at 60 s per request).
//! A wait for any change asks for the events after `u64::MAX`: it
//! returns, empty, as soon as the next event is published.
//!
//! No silent gaps:
//! 1. Numbers grow across the head's restarts: the head's `epoch`th start
//!    (`head/store.rs`, step 3) numbers from `(epoch - 1) << EPOCH_SHIFT`,
//!    so a reader that kept its place from before a restart gets every
//!    event of the new head instead of waiting for numbers it has seen.
//! 2. A reader whose `after` is older than the oldest event kept (the
//!    events in between were dropped, or belonged to an earlier head whose
//!    last events it may not have read), or newer than the last one
//!    published (it read another head's stream), gets a
//!    [`Resync`](ClusterEventKind::Resync) marker first, numbered just
//!    before the events that follow it. It is not kept in the history. The
//!    reader reads the state it follows again (`ListActors`, `Status`,
//!    `ListJobs`) and goes on after the marker. `after = 0` (a new reader)
//!    and `u64::MAX` (any change) get no marker.

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

/// The number of the latest event published: the events after it are
/// new. Before the first event of this start it is the number the start
/// counts from (step 1), which a reader may ask after without a marker.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct LastSeq;

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

    /// Step 2: the marker a reader at `after` gets before the events, if
    /// it missed some.
    fn gap(&self, after: u64) -> Option<ClusterEvent> {
        let first_kept = self.history.front().map_or(self.next_seq + 1, |e| e.seq);
        let missed =
            after != 0 && after != u64::MAX && (after + 1 < first_kept || after > self.next_seq);
        missed.then(|| ClusterEvent {
            seq: first_kept - 1,
            kind: ClusterEventKind::Resync { after, first_kept },
            time_ms: now_ms(),
        })
    }

    /// The answer to a reader at `after`: the marker if it missed events,
    /// then the kept events after it.
    fn answer(&self, after: u64) -> Vec<ClusterEvent> {
        let Some(marker) = self.gap(after) else {
            return self.since(after);
        };
        let kept = self.since(marker.seq);
        std::iter::once(marker).chain(kept).collect()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Handler<Publish> for ClusterEvents {
    type Result = ();

    fn handle(&mut self, Publish(kind): Publish, _: &mut Self::Context) {
        self.next_seq += 1;
        let event = ClusterEvent {
            seq: self.next_seq,
            kind: kind.bounded(),
            time_ms: now_ms(),
        };
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(event.clone());
        // Past the mailbox's capacity too (`do_send`): a subscriber busy
        // during a burst of events must get all of them, not be dropped.
        self.subscribers.retain(|s| {
            s.do_send(event.clone());
            s.connected()
        });
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

impl Handler<LastSeq> for ClusterEvents {
    type Result = u64;

    fn handle(&mut self, _: LastSeq, _: &mut Self::Context) -> u64 {
        self.next_seq
    }
}

impl Handler<EventsSince> for ClusterEvents {
    type Result = ResponseActFuture<Self, Vec<ClusterEvent>>;

    fn handle(&mut self, msg: EventsSince, _: &mut Self::Context) -> Self::Result {
        let ready = self.answer(msg.after);
        if !ready.is_empty() || msg.wait.is_zero() {
            return Box::pin(fut::ready(ready));
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.push(tx);
        let wait = tokio::time::timeout(msg.wait, rx);
        Box::pin(
            wait.into_actor(self)
                .map(move |_, events, _| events.answer(msg.after)),
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
    async fn a_reader_from_before_a_restart_is_told_to_resync_then_gets_the_new_heads_events() {
        let before = ClusterEvents::for_epoch(1).start();
        for _ in 0..3 {
            before.send(Publish(left("a"))).await.unwrap();
        }
        let after = ClusterEvents::for_epoch(2).start();
        let base = 1 << EPOCH_SHIFT;
        let marker = ClusterEventKind::Resync {
            after: 3,
            first_kept: base + 1,
        };
        // A long poll from before the restart does not wait: it must resync.
        let got = read(&after, 3, Duration::from_secs(30)).await;
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].seq, &got[0].kind), (base, &marker));
        after.send(Publish(left("b"))).await.unwrap();
        let got = read(&after, 3, Duration::ZERO).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].kind, marker);
        assert_eq!(got[1].seq, base + 1);
        assert!(
            read(&after, base + 1, Duration::ZERO).await.is_empty(),
            "a reader that went on after the marker is in step"
        );
        assert!(
            read(&after, 0, Duration::ZERO).await.len() == 1,
            "a new reader"
        );
    }

    #[actix_rt::test]
    async fn a_reader_that_fell_behind_the_history_or_read_another_stream_is_told_to_resync() {
        let events = ClusterEvents::default().start();
        for _ in 0..HISTORY + 10 {
            events.send(Publish(left("a"))).await.unwrap();
        }
        let got = read(&events, 5, Duration::ZERO).await;
        assert_eq!(
            got[0].kind,
            ClusterEventKind::Resync {
                after: 5,
                first_kept: 11
            }
        );
        assert_eq!((got[0].seq, got[1].seq), (10, 11));
        assert!(
            !matches!(
                read(&events, 10, Duration::ZERO).await[0].kind,
                ClusterEventKind::Resync { .. }
            ),
            "none was dropped after 10"
        );
        let ahead = read(&events, 1 << 40, Duration::ZERO).await;
        assert!(matches!(ahead[0].kind, ClusterEventKind::Resync { .. }));
        assert_eq!(ahead[0].seq, 10);
    }

    #[actix_rt::test]
    async fn the_last_number_is_the_latest_event_past_a_page_and_a_restart() {
        let before = ClusterEvents::for_epoch(1).start();
        assert_eq!(before.send(LastSeq).await.unwrap(), 0);
        for _ in 0..PAGE + 10 {
            before.send(Publish(left("a"))).await.unwrap();
        }
        let last = before.send(LastSeq).await.unwrap();
        assert_eq!(last, (PAGE + 10) as u64);
        assert!(read(&before, last, Duration::ZERO).await.is_empty());
        // A new start's number before its first event is one a reader may
        // wait after: no marker, the first event.
        let after = ClusterEvents::for_epoch(2).start();
        let base = after.send(LastSeq).await.unwrap();
        assert_eq!(base, 1 << EPOCH_SHIFT);
        assert!(read(&after, base, Duration::ZERO).await.is_empty());
        after.send(Publish(left("b"))).await.unwrap();
        let got = read(&after, base, Duration::ZERO).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].seq, base + 1);
    }

    async fn read(events: &Addr<ClusterEvents>, after: u64, wait: Duration) -> Vec<ClusterEvent> {
        events.send(EventsSince { after, wait }).await.unwrap()
    }

    /// Counts the events it is given.
    struct Counting(std::rc::Rc<std::cell::Cell<usize>>);

    impl Actor for Counting {
        type Context = Context<Self>;
    }

    impl Handler<ClusterEvent> for Counting {
        type Result = ();

        fn handle(&mut self, _: ClusterEvent, _: &mut Self::Context) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[actix_rt::test]
    async fn a_subscriber_gets_a_burst_larger_than_its_mailbox() {
        let seen = std::rc::Rc::new(std::cell::Cell::new(0));
        let counting = Counting(seen.clone()).start();
        let events = ClusterEvents::default().start();
        events
            .send(Subscribe(counting.clone().recipient()))
            .await
            .unwrap();
        for _ in 0..100 {
            events.do_send(Publish(left("a")));
        }
        events.send(Publish(left("b"))).await.unwrap();
        // The subscriber's mailbox is ordered: this answers after the burst.
        counting.send(Probe).await.unwrap();
        assert_eq!(seen.get(), 101);
    }

    /// Answers once everything sent before it was handled.
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Probe;

    impl Handler<Probe> for Counting {
        type Result = ();

        fn handle(&mut self, _: Probe, _: &mut Self::Context) {}
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
