//! The streaming executor's decisions, as a plain state machine with time
//! passed in: which split to start next, within the memory budget, and
//! which block the consumer gets next (in split order).
//!
//! 1. A split may start while the bytes *resident* (blocks stored and not
//!    yet consumed) plus one estimated block per split being made stay
//!    within the budget. The estimate is the largest block made so far;
//!    before the first one is known, one split is made at a time.
//! 2. The split the consumer needs next may always start (after its
//!    worker was lost, say): the pipeline never stalls on its own budget.
//!    So does a split when nothing is resident or being made: a block
//!    larger than the budget still moves, alone.
//! 3. Blocks are handed out in split order; one made early waits, and
//!    counts as resident.
//! 4. Time a worker had room while the budget held a split back is the
//!    backpressure time of `stats()`.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// The executor's schedule.
#[derive(Debug)]
pub(crate) struct Schedule {
    budget: u64,
    total: usize,
    /// The first split never started.
    next_new: usize,
    /// Splits to run again (their worker was lost), lowest first.
    again: VecDeque<usize>,
    /// Splits being made.
    making: usize,
    /// Blocks made and not yet handed out: their bytes.
    made: BTreeMap<usize, u64>,
    /// The next block to hand out.
    next_out: usize,
    /// Bytes of blocks made and not yet consumed (handed out or not).
    resident: u64,
    /// The largest block so far.
    estimate: u64,
    peak: u64,
    held_back_since: Option<Instant>,
    backpressure: Duration,
}

impl Schedule {
    /// A schedule for `total` splits within `budget` bytes.
    pub(crate) fn new(total: usize, budget: u64) -> Self {
        Schedule {
            budget,
            total,
            next_new: 0,
            again: VecDeque::new(),
            making: 0,
            made: BTreeMap::new(),
            next_out: 0,
            resident: 0,
            estimate: 0,
            peak: 0,
            held_back_since: None,
            backpressure: Duration::ZERO,
        }
    }

    /// The split to start now on a worker with room, if the budget allows
    /// one (steps 1 and 2); `None` also when every split has started.
    pub(crate) fn start(&mut self, now: Instant) -> Option<usize> {
        let candidate = match self.again.front() {
            Some(index) => *index,
            None if self.next_new < self.total => self.next_new,
            None => {
                self.stop_holding(now);
                return None;
            }
        };
        let needed = candidate == self.next_out;
        let idle = self.making == 0 && self.resident == 0;
        let fits = self.estimate > 0
            && self.resident + (self.making as u64 + 1) * self.estimate <= self.budget;
        if !(needed || idle || fits) {
            self.held_back_since.get_or_insert(now);
            return None;
        }
        self.stop_holding(now);
        if self.again.front() == Some(&candidate) {
            self.again.pop_front();
        } else {
            self.next_new += 1;
        }
        self.making += 1;
        Some(candidate)
    }

    fn stop_holding(&mut self, now: Instant) {
        if let Some(since) = self.held_back_since.take() {
            self.backpressure += now.saturating_duration_since(since);
        }
    }

    /// Block `index` was made: `bytes` in the object store.
    pub(crate) fn made(&mut self, index: usize, bytes: u64) {
        self.making = self.making.saturating_sub(1);
        self.made.insert(index, bytes);
        self.resident += bytes;
        self.estimate = self.estimate.max(bytes);
        self.peak = self.peak.max(self.resident);
    }

    /// Split `index` was lost with its worker (or its block with its
    /// node): it runs again. `was_making`: it was being made (not a block
    /// already made and then lost).
    pub(crate) fn lost(&mut self, index: usize, was_making: bool) {
        if was_making {
            self.making = self.making.saturating_sub(1);
        } else if let Some(bytes) = self.made.remove(&index) {
            self.resident = self.resident.saturating_sub(bytes);
        }
        self.run_again(index);
    }

    /// Queues split `index` to run again, lowest first.
    fn run_again(&mut self, index: usize) {
        let at = self.again.partition_point(|i| *i < index);
        self.again.insert(at, index);
    }

    /// Block `index`, handed out (the latest), was lost before it was
    /// read (its node died): it runs again and is handed out again next.
    pub(crate) fn lost_handed_out(&mut self, index: usize, bytes: u64) {
        self.resident = self.resident.saturating_sub(bytes);
        self.next_out = self.next_out.min(index);
        self.run_again(index);
    }

    /// The next block to hand out, if it is made (step 3).
    pub(crate) fn hand_out(&mut self) -> Option<usize> {
        let index = self.next_out;
        self.made.remove(&index)?;
        self.next_out += 1;
        Some(index)
    }

    /// A handed-out block of `bytes` was consumed.
    pub(crate) fn consumed(&mut self, bytes: u64, now: Instant) {
        self.resident = self.resident.saturating_sub(bytes);
        if self.held_back_since.is_some() {
            // The next `start` decides again; the time so far counts.
            self.stop_holding(now);
        }
    }

    /// Every block has been handed out.
    pub(crate) fn finished(&self) -> bool {
        self.next_out >= self.total
    }

    /// The most bytes resident at once.
    pub(crate) fn peak(&self) -> u64 {
        self.peak
    }

    /// Time workers were held back by the budget.
    pub(crate) fn backpressure(&self) -> Duration {
        self.backpressure
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn one_split_at_a_time_until_a_block_size_is_known() {
        let now = Instant::now();
        let mut s = Schedule::new(10, 100 * MB);
        assert_eq!(s.start(now), Some(0));
        assert_eq!(s.start(now), None);
        s.made(0, 10 * MB);
        assert_eq!(s.start(now), Some(1));
        assert_eq!(s.start(now), Some(2));
    }

    #[test]
    fn resident_and_making_stay_within_the_budget_with_a_slow_consumer() {
        let now = Instant::now();
        let mut s = Schedule::new(100, 40 * MB);
        let mut making = Vec::new();
        let mut handed = Vec::new();
        for step in 0..1000u32 {
            while let Some(index) = s.start(now) {
                making.push(index);
            }
            // Workers finish everything; the consumer takes one block every
            // third step.
            for index in making.drain(..) {
                s.made(index, 10 * MB);
            }
            assert!(
                s.resident <= 40 * MB,
                "resident {} at step {step}",
                s.resident
            );
            if step % 3 == 0 {
                if let Some(index) = s.hand_out() {
                    handed.push(index);
                    s.consumed(10 * MB, now);
                }
            }
        }
        assert_eq!(handed, (0..100).collect::<Vec<_>>());
        assert!(s.finished());
        assert_eq!(s.peak(), 40 * MB);
    }

    #[test]
    fn a_lost_split_needed_next_runs_again_over_the_budget() {
        let now = Instant::now();
        let mut s = Schedule::new(4, 20 * MB);
        assert_eq!(s.start(now), Some(0));
        s.made(0, 10 * MB);
        assert_eq!(s.start(now), Some(1));
        assert_eq!(s.start(now), None);
        s.made(1, 10 * MB);
        // Block 0's node died before it was read: made again, though the
        // budget is spent by block 1.
        s.lost(0, false);
        assert_eq!(s.start(now), Some(0));
        s.made(0, 10 * MB);
        assert_eq!(s.hand_out(), Some(0));
        assert_eq!(s.hand_out(), Some(1));
        assert_eq!(s.hand_out(), None);
    }

    #[test]
    fn a_handed_out_block_lost_before_it_was_read_is_handed_out_again() {
        let now = Instant::now();
        let mut s = Schedule::new(2, 100 * MB);
        assert_eq!(s.start(now), Some(0));
        s.made(0, 10 * MB);
        assert_eq!(s.hand_out(), Some(0));
        s.lost_handed_out(0, 10 * MB);
        assert_eq!(s.start(now), Some(0));
        s.made(0, 10 * MB);
        assert_eq!(s.hand_out(), Some(0));
        assert!(!s.finished());
    }

    #[test]
    fn a_block_larger_than_the_budget_moves_alone() {
        let now = Instant::now();
        let mut s = Schedule::new(3, MB);
        assert_eq!(s.start(now), Some(0));
        s.made(0, 5 * MB);
        assert_eq!(s.start(now), None);
        assert_eq!(s.hand_out(), Some(0));
        s.consumed(5 * MB, now);
        assert_eq!(s.start(now), Some(1));
        assert_eq!(s.start(now), None);
    }

    #[test]
    fn time_held_back_by_the_budget_is_counted() {
        let start = Instant::now();
        let mut s = Schedule::new(3, 10 * MB);
        assert_eq!(s.start(start), Some(0));
        s.made(0, 10 * MB);
        assert_eq!(s.start(start), None);
        assert_eq!(s.hand_out(), Some(0));
        s.consumed(10 * MB, start + Duration::from_millis(30));
        assert_eq!(s.backpressure(), Duration::from_millis(30));
    }
}
