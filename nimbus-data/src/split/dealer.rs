//! Dealing a dataset's blocks to the consumers of a `streaming_split`, as a
//! plain state machine with time passed in (the coordinator actor carries
//! it out).
//!
//! 1. **Equal** splits: every block is cut into `n` slices of `rows / n`
//!    rows, one per consumer, in block order; the rows left over (fewer
//!    than `n` per block) gather and are cut the same way once there are
//!    `n` of them; fewer than `n` left at the end are dropped (counted).
//!    So every consumer gets exactly as many rows, and the same rows on
//!    every run.
//! 2. **Unequal** splits: whole blocks, to whichever consumer asks first.
//! 3. **Lockstep**: a consumer may pull a new block from the executor
//!    only while no live consumer has more than [`MAX_LEAD`] slices
//!    waiting, so a slow consumer holds the others back rather than
//!    growing memory; a block counts as consumed once each of its slices
//!    has been taken and the consumer asked again.
//! 4. **Liveness**: each consumer is heard from (a request or a heartbeat)
//!    at least every [`HEARTBEAT`]; silent for [`SILENCE`] after its first
//!    word, or for [`FIRST_WORD`] before it, it is declared gone and every
//!    other consumer's next request fails, naming it. A consumer that
//!    stops before the end (drops its stream) is gone too.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Slices a consumer may have waiting before the others stop pulling.
pub(crate) const MAX_LEAD: usize = 2;
/// How often a consumer's stream says it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(300);
/// Silence after which a consumer is declared gone.
pub const SILENCE: Duration = Duration::from_millis(1500);
/// How long a consumer may take to ask for the first time.
pub const FIRST_WORD: Duration = Duration::from_secs(60);

/// Rows `offset..offset + rows` of block `block`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Slice {
    pub(crate) block: usize,
    pub(crate) offset: u64,
    pub(crate) rows: u64,
}

/// What a consumer's request gets now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Deal {
    /// Its next slice.
    Slice(Slice),
    /// Nothing yet: pull the next block from the executor, then ask again.
    Pull,
    /// Nothing yet: wait for the others to catch up, then ask again.
    Wait,
    /// Its share is complete.
    End,
    /// Consumer `split` is gone: why.
    Gone { split: usize, why: String },
}

#[derive(Debug)]
struct Consumer {
    waiting: VecDeque<Slice>,
    heard: Option<Instant>,
    /// The block of the slice it took last, counted consumed when it asks
    /// again.
    holding: Option<usize>,
    ended: bool,
}

/// The dealer of one `streaming_split`.
#[derive(Debug)]
pub(crate) struct Dealer {
    equal: bool,
    started: Instant,
    consumers: Vec<Consumer>,
    /// Unequal splits: whole blocks, for whoever asks.
    shared: VecDeque<Slice>,
    /// Equal splits: rows left over, not yet dealt.
    leftover: Vec<Slice>,
    /// Slices of each block not yet consumed (and one while rows of it
    /// are left over).
    outstanding: HashMap<usize, usize>,
    /// Blocks consumed by everyone since the last call that reports them.
    freed: Vec<usize>,
    exhausted: bool,
    gone: Option<(usize, String)>,
    dropped_rows: u64,
}

impl Dealer {
    /// A dealer for `n` consumers.
    pub(crate) fn new(n: usize, equal: bool, now: Instant) -> Self {
        Dealer {
            equal,
            started: now,
            consumers: (0..n)
                .map(|_| Consumer {
                    waiting: VecDeque::new(),
                    heard: None,
                    holding: None,
                    ended: false,
                })
                .collect(),
            shared: VecDeque::new(),
            leftover: Vec::new(),
            outstanding: HashMap::new(),
            freed: Vec::new(),
            exhausted: false,
            gone: None,
            dropped_rows: 0,
        }
    }

    /// Consumer `split` asks for its next slice (steps 1-4). Returns the
    /// deal and the blocks now consumed by everyone.
    pub(crate) fn next(&mut self, split: usize, now: Instant) -> (Deal, Vec<usize>) {
        self.heard(split, now);
        if let Some(block) = self.consumers[split].holding.take() {
            self.release(block);
        }
        let consumed = std::mem::take(&mut self.freed);
        if let Some(deal) = self.check_gone(now) {
            return (deal, consumed);
        }
        let slice = if self.equal {
            self.consumers[split].waiting.pop_front()
        } else {
            self.shared.pop_front()
        };
        if let Some(slice) = slice {
            self.consumers[split].holding = Some(slice.block);
            return (Deal::Slice(slice), consumed);
        }
        if self.exhausted {
            self.consumers[split].ended = true;
            return (Deal::End, consumed);
        }
        let lead = self
            .consumers
            .iter()
            .filter(|c| !c.ended)
            .map(|c| c.waiting.len())
            .max()
            .unwrap_or(0);
        if self.equal && lead >= MAX_LEAD {
            return (Deal::Wait, consumed);
        }
        (Deal::Pull, consumed)
    }

    /// One slice (or the leftover hold) of `block` is done with.
    fn release(&mut self, block: usize) {
        if let Some(left) = self.outstanding.get_mut(&block) {
            *left -= 1;
            if *left == 0 {
                self.outstanding.remove(&block);
                self.freed.push(block);
            }
        }
    }

    /// Consumer `split` is alive (a heartbeat).
    pub(crate) fn heard(&mut self, split: usize, now: Instant) {
        if let Some(consumer) = self.consumers.get_mut(split) {
            consumer.heard = Some(now);
        }
    }

    /// Consumer `split` stopped: at its end, or before it (its stream
    /// dropped), which makes it gone for the others (step 4).
    pub(crate) fn left(&mut self, split: usize, at_end: bool) {
        if let Some(consumer) = self.consumers.get_mut(split) {
            if !consumer.ended && !at_end && self.gone.is_none() {
                self.gone = Some((split, "its consumer stopped reading before the end".into()));
            }
            consumer.ended = true;
        }
    }

    /// Block `block` of `rows` rows arrived from the executor: dealt out
    /// (steps 1-2).
    pub(crate) fn add_block(&mut self, block: usize, rows: u64) {
        let n = self.consumers.len() as u64;
        if !self.equal {
            self.outstanding.insert(block, 1);
            self.shared.push_back(Slice {
                block,
                offset: 0,
                rows,
            });
            return;
        }
        let per = rows / n;
        let mut slices = 0;
        if per > 0 {
            for (i, consumer) in self.consumers.iter_mut().enumerate() {
                consumer.waiting.push_back(Slice {
                    block,
                    offset: i as u64 * per,
                    rows: per,
                });
            }
            slices += n as usize;
        }
        if rows > per * n {
            self.leftover.push(Slice {
                block,
                offset: per * n,
                rows: rows - per * n,
            });
            slices += 1;
        }
        if slices > 0 {
            *self.outstanding.entry(block).or_default() += slices;
        } else {
            self.freed.push(block);
        }
        self.deal_leftover();
    }

    /// Deals the leftover rows once there are at least `n` of them.
    fn deal_leftover(&mut self) {
        let n = self.consumers.len() as u64;
        let total: u64 = self.leftover.iter().map(|s| s.rows).sum();
        let per = total / n;
        if per == 0 {
            return;
        }
        let mut pieces = std::mem::take(&mut self.leftover).into_iter();
        let mut current = pieces.next();
        for consumer in 0..self.consumers.len() {
            let mut need = per;
            while need > 0 {
                let Some(slice) = current.as_mut() else {
                    break;
                };
                let take = need.min(slice.rows);
                let piece = Slice {
                    block: slice.block,
                    offset: slice.offset,
                    rows: take,
                };
                *self.outstanding.entry(piece.block).or_default() += 1;
                self.consumers[consumer].waiting.push_back(piece);
                slice.offset += take;
                slice.rows -= take;
                need -= take;
                if slice.rows == 0 {
                    let block = slice.block;
                    self.release(block);
                    current = pieces.next();
                }
            }
        }
        self.leftover = current
            .into_iter()
            .chain(pieces)
            .filter(|s| s.rows > 0)
            .collect();
    }

    /// The executor has no block left: the leftover rows (fewer than `n`)
    /// are dropped. Returns the blocks consumed by everyone since last
    /// reported (those only leftover rows still held among them).
    pub(crate) fn exhausted(&mut self) -> Vec<usize> {
        self.exhausted = true;
        for slice in std::mem::take(&mut self.leftover) {
            self.dropped_rows += slice.rows;
            self.release(slice.block);
        }
        std::mem::take(&mut self.freed)
    }

    /// Rows dropped to keep the splits equal.
    pub(crate) fn dropped_rows(&self) -> u64 {
        self.dropped_rows
    }

    /// Whether every consumer has ended.
    pub(crate) fn all_ended(&self) -> bool {
        self.consumers.iter().all(|c| c.ended)
    }

    /// A consumer silent too long is gone (step 4).
    fn check_gone(&mut self, now: Instant) -> Option<Deal> {
        if self.gone.is_none() {
            for (split, consumer) in self.consumers.iter().enumerate() {
                if consumer.ended {
                    continue;
                }
                let silent = match consumer.heard {
                    Some(heard) if now.saturating_duration_since(heard) > SILENCE => Some(format!(
                        "no word from its consumer for {SILENCE:?}: it died or hangs"
                    )),
                    None if now.saturating_duration_since(self.started) > FIRST_WORD => Some(
                        format!("its consumer never asked for a batch in {FIRST_WORD:?}"),
                    ),
                    _ => None,
                };
                if let Some(why) = silent {
                    self.gone = Some((split, why));
                    break;
                }
            }
        }
        self.gone.as_ref().map(|(split, why)| Deal::Gone {
            split: *split,
            why: why.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take_all(dealer: &mut Dealer, split: usize, now: Instant) -> Vec<Slice> {
        let mut got = Vec::new();
        while let (Deal::Slice(slice), _) = dealer.next(split, now) {
            got.push(slice);
        }
        got
    }

    #[test]
    fn equal_splits_get_the_same_rows_and_each_row_once() {
        let now = Instant::now();
        let mut dealer = Dealer::new(3, true, now);
        let sizes = [10u64, 7, 5, 1, 9];
        for (block, rows) in sizes.iter().enumerate() {
            dealer.add_block(block, *rows);
        }
        dealer.exhausted();
        let mut seen = Vec::new();
        let mut totals = Vec::new();
        for split in 0..3 {
            let got = take_all(&mut dealer, split, now);
            totals.push(got.iter().map(|s| s.rows).sum::<u64>());
            for s in got {
                seen.extend((s.offset..s.offset + s.rows).map(|r| (s.block, r)));
            }
        }
        assert_eq!(totals, [10, 10, 10]);
        assert_eq!(dealer.dropped_rows(), 2);
        seen.sort();
        let before = seen.len();
        seen.dedup();
        assert_eq!(seen.len(), before, "a row was dealt twice");
        assert_eq!(seen.len(), 30);
    }

    #[test]
    fn a_consumer_far_ahead_waits_for_the_slowest() {
        let now = Instant::now();
        let mut dealer = Dealer::new(2, true, now);
        dealer.heard(1, now);
        assert_eq!(dealer.next(0, now).0, Deal::Pull);
        dealer.add_block(0, 10);
        assert!(matches!(dealer.next(0, now).0, Deal::Slice(_)));
        assert_eq!(dealer.next(0, now).0, Deal::Pull);
        dealer.add_block(1, 10);
        assert!(matches!(dealer.next(0, now).0, Deal::Slice(_)));
        // Consumer 1 has two slices waiting: consumer 0 may not pull more.
        assert_eq!(dealer.next(0, now).0, Deal::Wait);
        let (deal, consumed) = dealer.next(1, now);
        assert!(matches!(deal, Deal::Slice(Slice { block: 0, .. })));
        assert!(consumed.is_empty());
        // Consumer 1 asks again: block 0 is consumed by both.
        let (_, consumed) = dealer.next(1, now);
        assert_eq!(consumed, [0]);
    }

    #[test]
    fn a_silent_consumer_is_named_to_the_others() {
        let now = Instant::now();
        let mut dealer = Dealer::new(2, false, now);
        dealer.heard(1, now);
        let later = now + SILENCE + Duration::from_millis(1);
        match dealer.next(0, later).0 {
            Deal::Gone { split, why } => {
                assert_eq!(split, 1);
                assert!(why.contains("no word"), "{why}");
            }
            other => panic!("expected Gone, got {other:?}"),
        }
    }

    #[test]
    fn a_consumer_that_drops_its_stream_early_is_gone_but_one_at_its_end_is_not() {
        let now = Instant::now();
        let mut dealer = Dealer::new(2, false, now);
        dealer.heard(1, now);
        dealer.left(1, true);
        assert_eq!(dealer.next(0, now).0, Deal::Pull);
        let mut dealer = Dealer::new(2, false, now);
        dealer.left(1, false);
        assert!(matches!(dealer.next(0, now).0, Deal::Gone { split: 1, .. }));
    }

    #[test]
    fn unequal_splits_take_whole_blocks_in_turn() {
        let now = Instant::now();
        let mut dealer = Dealer::new(2, false, now);
        dealer.add_block(0, 5);
        dealer.add_block(1, 3);
        dealer.exhausted();
        let a = take_all(&mut dealer, 0, now);
        assert_eq!(a.len(), 2);
        assert_eq!(dealer.next(1, now).0, Deal::End);
    }
}
