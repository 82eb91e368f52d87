//! `Dataset::streaming_split`: one execution read by `n` consumers, each
//! in any process of the cluster (a training worker per split, say). A
//! [`DataSplit`] is small and serializable: send it to the consumer, which
//! reads it with [`DataSplit::iter_batches`]; the blocks are dealt by a
//! `SplitCoordinator` actor (`coordinator.rs`), which decides through the
//! `Dealer` (`dealer.rs`: equal shares, lockstep, consumers' liveness).

mod coordinator;
mod dealer;

use std::time::Instant;

use nimbus::actor::{ActorHandle, CallError};
use nimbus::object_store;
use serde::{Deserialize, Serialize};

use crate::batches::BatchStream;
use crate::error::DataError;
use crate::executor::Delivered;
use crate::stats::DatasetStats;

pub use coordinator::{Alive, Leave, NextSlice, SliceRef, SplitCoordinator, SplitPlan, RECHECK};
pub use dealer::{FIRST_WORD, HEARTBEAT, SILENCE};

/// Split `index` of a `streaming_split`: what its consumer reads.
#[derive(Clone, Serialize, Deserialize)]
pub struct DataSplit {
    pub(crate) coordinator: ActorHandle<SplitCoordinator>,
    pub(crate) index: usize,
    pub(crate) count: usize,
}

impl std::fmt::Debug for DataSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DataSplit({} of {})", self.index, self.count)
    }
}

impl DataSplit {
    /// Which split this is.
    pub fn index(&self) -> usize {
        self.index
    }

    /// This split's batches of `batch_size` rows, in order. Read it to its
    /// end (or drop it, which makes the other splits fail: a split's
    /// consumer is expected to read its whole share). Each split can be
    /// read once.
    pub fn iter_batches(&self, batch_size: usize) -> BatchStream {
        let reader = SplitReader::new(self.clone());
        BatchStream::from_split(reader, batch_size)
    }
}

/// The consumer's side of a split: asks the coordinator for slices, maps
/// and decodes them, and says it is alive every [`HEARTBEAT`].
pub(crate) struct SplitReader {
    split: DataSplit,
    heartbeat: tokio::task::JoinHandle<()>,
    ended: bool,
    stats: DatasetStats,
}

impl SplitReader {
    fn new(split: DataSplit) -> Self {
        let (coordinator, index) = (split.coordinator.clone(), split.index);
        let heartbeat = tokio::spawn(async move {
            let mut beat = tokio::time::interval(HEARTBEAT);
            loop {
                beat.tick().await;
                if coordinator.do_send(Alive { split: index }).is_err() {
                    return;
                }
            }
        });
        SplitReader {
            split,
            heartbeat,
            ended: false,
            stats: DatasetStats::default(),
        }
    }

    /// The next slice, read; `None` at the end of this split's share.
    pub(crate) async fn next_block(&mut self) -> Option<Result<Delivered, DataError>> {
        if self.ended {
            return None;
        }
        let waited = Instant::now();
        let asked = self
            .split
            .coordinator
            .send(NextSlice {
                split: self.split.index,
            })
            .await;
        self.stats.consumer_wait += waited.elapsed();
        let failed = |detail: String| DataError::SplitConsumer {
            split: self.split.index,
            splits: self.split.count,
            detail,
        };
        let slice = match asked {
            Ok(Ok(Some(slice))) => slice,
            Ok(Ok(None)) => {
                self.end(true);
                return None;
            }
            Ok(Err(e)) => return Some(Err(failed(e))),
            Err(e @ (CallError::ActorDead { .. } | CallError::NodeLost { .. })) => {
                return Some(Err(failed(format!("its coordinator is gone: {e}"))))
            }
            Err(e) => return Some(Err(failed(e.to_string()))),
        };
        let bytes = match object_store::get_bytes(&slice.object).await {
            Ok(bytes) => bytes,
            Err(e) => return Some(Err(DataError::ObjectStore(e))),
        };
        let batch = match crate::block::decode(bytes, slice.block) {
            Ok(batch) => batch,
            Err(e) => return Some(Err(e)),
        };
        let (offset, rows) = (slice.offset as usize, slice.rows as usize);
        if offset + rows > batch.num_rows() {
            return Some(Err(failed(format!(
                "slice {offset}+{rows} of block {} past its {} rows (a bug)",
                slice.block,
                batch.num_rows()
            ))));
        }
        self.stats.blocks += 1;
        self.stats.rows += rows as u64;
        Some(Ok(Delivered {
            batch: batch.slice(offset, rows),
            bytes: 0,
        }))
    }

    /// The figures of this consumer (rows, blocks, time waited).
    pub(crate) fn stats(&self) -> DatasetStats {
        self.stats.clone()
    }

    fn end(&mut self, at_end: bool) {
        if !self.ended {
            self.ended = true;
            self.heartbeat.abort();
            let _ = self.split.coordinator.do_send(Leave {
                split: self.split.index,
                at_end,
            });
        }
    }
}

impl Drop for SplitReader {
    fn drop(&mut self) {
        self.end(false);
    }
}
