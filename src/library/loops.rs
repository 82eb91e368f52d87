//! A user's loop on a thread of its own, watched by the actor that started
//! it: what training workers (`nimbus-train`) and Tune's trial runners
//! share, and what Serve's replicas and RL's env runners will.
//!
//! 1. The loop pushes events ([`LoopProgress::push`]), numbered from 1,
//!    and at its end its outcome ([`LoopProgress::finish`]).
//! 2. The watcher long-polls the events after the last it saw
//!    ([`LoopProgress::poll`]: at once if there are any or the loop ended,
//!    else after the wait), and may acknowledge the first N
//!    ([`LoopProgress::ack`]) for a loop that goes in lock-step with it
//!    ([`LoopProgress::wait_acked`]: Tune's reports wait for the tuner's
//!    decision).
//! 3. The watcher asks the loop to stop ([`LoopProgress::stop`], with a
//!    reason; the first reason is kept): a loop waiting for an
//!    acknowledgement wakes, and the loop checks
//!    [`LoopProgress::stop_reason`] at its next step and ends itself.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

/// What a poll answers: the events after the asked number, with their
/// numbers, and the loop's outcome once it has ended.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopPoll<E, End> {
    /// New events, in order, numbered from 1.
    pub events: Vec<(u64, E)>,
    /// `Some` once the loop ended.
    pub end: Option<End>,
}

struct Log<E, End> {
    events: Vec<E>,
    /// Events the watcher has acknowledged.
    acked: u64,
    end: Option<End>,
    stop: Option<String>,
}

/// The events and outcome of one loop, shared between its thread and its
/// watcher (the protocol is in the module docs).
pub struct LoopProgress<E, End> {
    log: Mutex<Log<E, End>>,
    /// Bumped on every event and at the end, for polls.
    changed: watch::Sender<u64>,
    /// Acknowledgements and stops, for a loop waiting in `wait_acked`.
    decided: Condvar,
}

impl<E, End> Default for LoopProgress<E, End> {
    fn default() -> Self {
        LoopProgress {
            log: Mutex::new(Log {
                events: Vec::new(),
                acked: 0,
                end: None,
                stop: None,
            }),
            changed: watch::channel(0).0,
            decided: Condvar::new(),
        }
    }
}

impl<E: Clone, End: Clone> LoopProgress<E, End> {
    fn lock(&self) -> MutexGuard<'_, Log<E, End>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Step 1: records an event; returns its number.
    pub fn push(&self, event: E) -> u64 {
        let number = {
            let mut log = self.lock();
            log.events.push(event);
            log.events.len() as u64
        };
        self.bump();
        number
    }

    /// Step 1: records the loop's outcome (once: a second is ignored).
    pub fn finish(&self, end: End) {
        self.lock().end.get_or_insert(end);
        self.bump();
    }

    /// Whether the loop has ended.
    pub fn ended(&self) -> bool {
        self.lock().end.is_some()
    }

    /// Step 2: the watcher has decided on the first `events` events.
    pub fn ack(&self, events: u64) {
        let mut log = self.lock();
        if events > log.acked {
            log.acked = events;
            self.decided.notify_all();
        }
    }

    /// Step 2, in the loop: waits until event `number` is acknowledged or
    /// the loop is asked to stop.
    pub fn wait_acked(&self, number: u64) {
        let mut log = self.lock();
        while log.acked < number && log.stop.is_none() {
            log = self.decided.wait(log).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Step 3: asks the loop to stop, for `reason` (the first reason is
    /// kept).
    pub fn stop(&self, reason: impl Into<String>) {
        let mut log = self.lock();
        if log.stop.is_none() {
            log.stop = Some(reason.into());
        }
        self.decided.notify_all();
    }

    /// Why the loop was asked to stop, if it was.
    pub fn stop_reason(&self) -> Option<String> {
        self.lock().stop.clone()
    }

    /// The events after `after`, and the end.
    pub fn since(&self, after: u64) -> LoopPoll<E, End> {
        let log = self.lock();
        LoopPoll {
            events: log
                .events
                .iter()
                .enumerate()
                .skip(after as usize)
                .map(|(i, e)| (i as u64 + 1, e.clone()))
                .collect(),
            end: log.end.clone(),
        }
    }

    /// Step 2: the events after `after`, waiting up to `wait` for one (or
    /// the end).
    pub async fn poll(&self, after: u64, wait: Duration) -> LoopPoll<E, End> {
        let mut changed = self.changed.subscribe();
        changed.borrow_and_update();
        let now = self.since(after);
        if !now.events.is_empty() || now.end.is_some() {
            return now;
        }
        let _ = tokio::time::timeout(wait, changed.changed()).await;
        self.since(after)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_poll_answers_new_events_at_once_and_waits_for_the_end() {
        let progress: Arc<LoopProgress<&str, Result<(), String>>> = Arc::default();
        assert_eq!(progress.push("a"), 1);
        assert_eq!(progress.push("b"), 2);
        let seen = progress.poll(1, Duration::from_secs(60)).await;
        assert_eq!((seen.events, seen.end), (vec![(2, "b")], None));
        let watcher = progress.clone();
        let waiting = tokio::spawn(async move { watcher.poll(2, Duration::from_secs(60)).await });
        progress.finish(Ok(()));
        progress.finish(Err("ignored: the first outcome holds".into()));
        let ended = waiting.await.unwrap();
        assert_eq!((ended.events, ended.end), (vec![], Some(Ok(()))));
        assert!(progress.ended());
    }

    #[tokio::test]
    async fn a_loop_in_lock_step_waits_for_its_ack_or_a_stop() {
        let progress: Arc<LoopProgress<u32, ()>> = Arc::default();
        let looping = progress.clone();
        let steps = std::thread::spawn(move || {
            for step in 0..3 {
                let number = looping.push(step);
                looping.wait_acked(number);
                if looping.stop_reason().is_some() {
                    return step;
                }
            }
            3
        });
        // Event 1 acknowledged: the loop goes on to push event 2, and
        // waits; the watcher stops it instead of acknowledging.
        let first = progress.poll(0, Duration::from_secs(60)).await;
        assert_eq!(first.events, vec![(1, 0)]);
        progress.ack(1);
        let second = progress.poll(1, Duration::from_secs(60)).await;
        assert_eq!(second.events, vec![(2, 1)]);
        progress.stop("the scheduler stopped it");
        progress.stop("a second reason is not kept");
        assert_eq!(steps.join().unwrap(), 1);
        assert_eq!(
            progress.stop_reason().as_deref(),
            Some("the scheduler stopped it")
        );
    }
}
