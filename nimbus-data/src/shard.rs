//! `Dataset::iter_shard`: the part of a dataset that one of `count`
//! consumers (a training worker per rank) reads in one epoch, the same in
//! every process that asks, so that a consumer restarted from a checkpoint,
//! or healed from a peer, reads exactly the rows it would have read:
//!
//! 1. The dataset's splits (a parquet row group, 65,536 integers of a
//!    range) are put in an order drawn from the seed and the epoch
//!    ([`Shard::order`]), a different one each epoch.
//! 2. The `k`-th split of that order goes to shard `k mod count`.
//! 3. Every shard reads as many rows as the smallest shard holds: the
//!    last rows of the others are left out of that epoch (another epoch's
//!    order leaves out others), so every consumer takes the same number of
//!    batches (each step's allreduce needs every rank). The rows of each
//!    split must be known without reading it: parquet files (their
//!    footers) or a range, through operators that keep every row.
//! 4. A consumer resuming at batch `b` of an epoch
//!    (`Dataset::iter_shard_from`) has the blocks wholly before that batch
//!    left unmade and the rows before it of the next block dropped: by
//!    steps 1–3 the batches from there are the ones it would have taken.
//!
//! A training loop runs on a thread of its own, outside the worker's
//! async runtime: [`BlockingBatches`] runs the stream on that runtime and
//! hands its batches over a bounded channel (the loop reads while the next
//! batches are made).

use arrow_array::RecordBatch;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::batches::BatchStream;
use crate::error::DataError;

/// Which part of a dataset one of `count` consumers reads in `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This consumer (a training worker's rank), below `count`.
    pub index: usize,
    /// How many consumers read the dataset (the world size).
    pub count: usize,
    /// Seeds every epoch's order of the splits.
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
}

impl Shard {
    /// The indices of `splits` splits in this epoch's order (step 1).
    pub(crate) fn order(&self, splits: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..splits).collect();
        let mixed = self.seed ^ self.epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        order.shuffle(&mut StdRng::seed_from_u64(mixed));
        order
    }

    /// This shard's splits, in the order it reads them, and the rows every
    /// shard reads (steps 1–3).
    pub(crate) fn deal(&self, split_rows: &[u64]) -> Result<(Vec<usize>, u64), DataError> {
        let refused = |detail: String| DataError::Arrow {
            what: "iter_shard",
            detail,
        };
        if self.index >= self.count {
            return Err(refused(format!(
                "shard {} of {}: the index must be below the count",
                self.index, self.count
            )));
        }
        if split_rows.len() < self.count {
            return Err(refused(format!(
                "{} blocks cannot give each of {} shards one: use fewer shards, or write the files with smaller row groups",
                split_rows.len(),
                self.count
            )));
        }
        let mut rows = vec![0u64; self.count];
        let mut mine = Vec::new();
        for (k, split) in self.order(split_rows.len()).into_iter().enumerate() {
            rows[k % self.count] += split_rows[split];
            if k % self.count == self.index {
                mine.push(split);
            }
        }
        Ok((mine, rows.into_iter().min().unwrap_or(0)))
    }
}

/// A [`BatchStream`] read from a thread outside the async runtime (a
/// training loop's): the stream runs on the runtime, at most `prefetch`
/// batches ahead of the reader; dropping this stops it.
pub struct BlockingBatches {
    batches: tokio::sync::mpsc::Receiver<Result<RecordBatch, DataError>>,
    task: tokio::task::JoinHandle<()>,
}

impl BlockingBatches {
    /// Runs `start` (which makes the stream: `Dataset::iter_shard`, say)
    /// and then the stream on `runtime`.
    pub fn spawn(
        runtime: &tokio::runtime::Handle,
        prefetch: usize,
        start: impl std::future::Future<Output = Result<BatchStream, DataError>> + Send + 'static,
    ) -> Self {
        let (send, batches) = tokio::sync::mpsc::channel(prefetch.max(1));
        let task = runtime.spawn(async move {
            let mut stream = match start.await {
                Ok(stream) => stream,
                Err(e) => {
                    let _ = send.send(Err(e)).await;
                    return;
                }
            };
            while let Some(batch) = stream.next().await {
                let failed = batch.is_err();
                if send.send(batch).await.is_err() || failed {
                    return;
                }
            }
        });
        BlockingBatches { batches, task }
    }
}

impl Iterator for BlockingBatches {
    type Item = Result<RecordBatch, DataError>;

    /// The next batch, waiting for it; `None` after the last. Call it
    /// from a thread outside the runtime only.
    fn next(&mut self) -> Option<Self::Item> {
        self.batches.blocking_recv()
    }
}

impl Drop for BlockingBatches {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(index: usize, epoch: u64) -> Shard {
        Shard {
            index,
            count: 3,
            seed: 7,
            epoch,
        }
    }

    #[test]
    fn every_split_goes_to_one_shard_and_the_rows_are_the_fewest_any_has() {
        let split_rows = [10, 20, 30, 40, 50, 60, 70];
        let deals: Vec<_> = (0..3)
            .map(|index| shard(index, 0).deal(&split_rows).unwrap())
            .collect();
        let shares: Vec<u64> = deals
            .iter()
            .map(|(mine, _)| mine.iter().map(|&s| split_rows[s]).sum())
            .collect();
        let fewest = *shares.iter().min().unwrap();
        assert!(deals.iter().all(|(_, rows)| *rows == fewest), "{deals:?}");
        let mut seen: Vec<usize> = deals.iter().flat_map(|(mine, _)| mine.clone()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn the_order_is_the_same_for_an_epoch_and_differs_between_epochs() {
        assert_eq!(shard(0, 1).order(100), shard(2, 1).order(100));
        assert_ne!(shard(0, 1).order(100), shard(0, 2).order(100));
    }

    #[test]
    fn too_few_blocks_or_a_bad_index_are_refused() {
        let few = shard(0, 0).deal(&[1, 2]).unwrap_err().to_string();
        assert!(
            few.contains("2 blocks cannot give each of 3 shards one"),
            "{few}"
        );
        let past = Shard {
            index: 3,
            ..shard(0, 0)
        };
        let text = past.deal(&[1, 2, 3]).unwrap_err().to_string();
        assert!(text.contains("shard 3 of 3"), "{text}");
    }
}
