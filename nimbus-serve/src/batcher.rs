//! Dynamic batching in a replica, as plain state with the clock passed in:
//! when queued requests start as one batch.
//!
//! 1. A request is queued on arrival.
//! 2. With no batch running, the queue starts at once as one batch (up to
//!    `max_batch_size`): an idle replica adds no wait.
//! 3. While a batch runs, requests gather; they start as the next batch
//!    when it ends, or sooner when `max_batch_size` of them are queued or
//!    the oldest has waited `max_wait` (then batches overlap).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The queue of one replica.
pub(crate) struct Batcher<T> {
    queue: VecDeque<(Instant, T)>,
    running: u32,
    max_batch_size: usize,
    max_wait: Duration,
}

impl<T> Batcher<T> {
    pub(crate) fn new(max_batch_size: usize, max_wait: Duration) -> Self {
        Batcher {
            queue: VecDeque::new(),
            running: 0,
            max_batch_size: max_batch_size.max(1),
            max_wait,
        }
    }

    pub(crate) fn push(&mut self, item: T, now: Instant) {
        self.queue.push_back((now, item));
    }

    /// The next batch to start now, if one is due (counted as running).
    pub(crate) fn take(&mut self, now: Instant) -> Option<Vec<T>> {
        let (oldest, _) = self.queue.front()?;
        let due = self.running == 0
            || self.queue.len() >= self.max_batch_size
            || now.saturating_duration_since(*oldest) >= self.max_wait;
        if !due {
            return None;
        }
        let size = self.queue.len().min(self.max_batch_size);
        self.running += 1;
        Some(self.queue.drain(..size).map(|(_, item)| item).collect())
    }

    /// Takes the first queued item `matches` picks out of the queue (a
    /// request whose client left before its batch started).
    pub(crate) fn remove(&mut self, matches: impl Fn(&T) -> bool) -> Option<T> {
        let at = self.queue.iter().position(|(_, item)| matches(item))?;
        self.queue.remove(at).map(|(_, item)| item)
    }

    /// A batch ended.
    pub(crate) fn finished(&mut self) {
        self.running = self.running.saturating_sub(1);
    }

    /// When the oldest queued request will have waited `max_wait`.
    pub(crate) fn wake_at(&self) -> Option<Instant> {
        self.queue.front().map(|(since, _)| *since + self.max_wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_removed_while_queued_never_starts() {
        let now = Instant::now();
        let mut batcher = Batcher::new(4, Duration::from_millis(50));
        batcher.push(0, now);
        assert_eq!(batcher.take(now), Some(vec![0]));
        for i in 1..=3 {
            batcher.push(i, now);
        }
        assert_eq!(batcher.remove(|&i| i == 2), Some(2));
        assert_eq!(batcher.remove(|&i| i == 2), None, "removed once");
        batcher.finished();
        assert_eq!(batcher.take(now), Some(vec![1, 3]));
    }

    #[test]
    fn an_idle_replica_starts_a_request_at_once() {
        let now = Instant::now();
        let mut batcher = Batcher::new(8, Duration::from_millis(50));
        batcher.push(1, now);
        assert_eq!(batcher.take(now), Some(vec![1]));
        assert_eq!(batcher.take(now), None);
    }

    #[test]
    fn requests_gather_while_a_batch_runs_and_start_when_it_ends() {
        let now = Instant::now();
        let mut batcher = Batcher::new(4, Duration::from_millis(50));
        batcher.push(0, now);
        assert_eq!(batcher.take(now), Some(vec![0]));
        for i in 1..=3 {
            batcher.push(i, now);
            assert_eq!(batcher.take(now), None, "a batch runs: request {i} waits");
        }
        batcher.finished();
        assert_eq!(batcher.take(now), Some(vec![1, 2, 3]));
    }

    #[test]
    fn a_full_batch_or_the_wait_bound_starts_one_beside_the_running_one() {
        let now = Instant::now();
        let wait = Duration::from_millis(50);
        let mut batcher = Batcher::new(2, wait);
        batcher.push(0, now);
        assert!(batcher.take(now).is_some());
        batcher.push(1, now);
        batcher.push(2, now);
        assert_eq!(batcher.take(now), Some(vec![1, 2]), "full");
        batcher.push(3, now);
        assert_eq!(batcher.take(now + wait / 2), None);
        assert_eq!(batcher.wake_at(), Some(now + wait));
        assert_eq!(batcher.take(now + wait), Some(vec![3]), "waited max_wait");
        assert_eq!(batcher.wake_at(), None);
    }
}
