//! `iter_batches`: the executor's blocks re-cut into batches of the size
//! the consumer asked for: slices of a block where it holds enough rows
//! (no copy), rows of consecutive blocks concatenated where a batch spans
//! them.

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::error::DataError;
use crate::executor::{Delivered, Execution};
use crate::split::SplitReader;
use crate::stats::DatasetStats;

/// Where a stream's blocks come from.
enum Blocks {
    /// An execution of its own (boxed: it is much the larger).
    Local(Box<Execution>),
    /// A split of an execution shared with other consumers.
    Split(SplitReader),
}

impl Blocks {
    async fn next_block(&mut self) -> Option<Result<Delivered, DataError>> {
        match self {
            Blocks::Local(execution) => execution.next_block().await,
            Blocks::Split(reader) => reader.next_block().await,
        }
    }

    fn consumed(&mut self, bytes: u64) {
        if let Blocks::Local(execution) = self {
            execution.consumed(bytes);
        }
    }

    fn stats(&self) -> DatasetStats {
        match self {
            Blocks::Local(execution) => execution.stats(),
            Blocks::Split(reader) => reader.stats(),
        }
    }
}

/// The batches of a running dataset (or of one split of it), in order;
/// the last may be shorter. Dropping it stops the execution (its workers
/// are killed).
pub struct BatchStream {
    execution: Option<Blocks>,
    batch_size: usize,
    /// Rows still to give before the dataset's `limit`, if it has one.
    remaining: Option<u64>,
    /// The block being cut, and where the next batch starts in it.
    current: Option<(Delivered, usize)>,
    schema: Option<SchemaRef>,
    /// The last figures, kept once the execution has ended.
    stats: DatasetStats,
    /// Rows shuffled before they are given, if asked.
    shuffle: Option<LocalShuffle>,
}

/// A local shuffle: windows of rows, each shuffled whole, then given out.
struct LocalShuffle {
    window: usize,
    rng: StdRng,
    /// The window being given out, its order, and the next position.
    current: Option<(RecordBatch, Vec<u32>, usize)>,
}

impl BatchStream {
    pub(crate) fn new(execution: Execution, batch_size: usize, limit: Option<u64>) -> Self {
        Self::of(Blocks::Local(Box::new(execution)), batch_size, limit)
    }

    pub(crate) fn from_split(reader: SplitReader, batch_size: usize) -> Self {
        Self::of(Blocks::Split(reader), batch_size, None)
    }

    fn of(blocks: Blocks, batch_size: usize, limit: Option<u64>) -> Self {
        BatchStream {
            execution: Some(blocks),
            batch_size: batch_size.max(1),
            remaining: limit,
            current: None,
            schema: None,
            stats: DatasetStats::default(),
            shuffle: None,
        }
    }

    /// Shuffles the rows as they stream (Ray's local shuffle buffer):
    /// windows of at least `buffer_rows` rows (a whole number of batches)
    /// are gathered in order and each given out in a random order drawn
    /// from `seed`, so the same seed gives the same batches. Rows move
    /// only within their window, and each window is copied once.
    pub fn local_shuffle(mut self, buffer_rows: usize, seed: u64) -> Self {
        let window = buffer_rows.max(1).div_ceil(self.batch_size) * self.batch_size;
        self.shuffle = Some(LocalShuffle {
            window,
            rng: StdRng::seed_from_u64(seed),
            current: None,
        });
        self
    }

    /// Reads and drops the next `batches` batches (a consumer resuming
    /// mid-epoch: `Dataset::iter_shard`); an error reading them is the
    /// stream's error.
    pub async fn skip(mut self, batches: u64) -> Result<Self, DataError> {
        for _ in 0..batches {
            match self.next().await {
                Some(batch) => drop(batch?),
                None => break,
            }
        }
        Ok(self)
    }

    /// Reads and drops the next `rows` rows (in order, past any shuffle).
    pub(crate) async fn skip_rows(mut self, mut rows: u64) -> Result<Self, DataError> {
        while rows > 0 {
            let wanted = usize::try_from(rows).unwrap_or(usize::MAX);
            match self.next_in_order(wanted).await {
                Some(batch) => rows -= batch?.num_rows() as u64,
                None => break,
            }
        }
        Ok(self)
    }

    /// The next batch; `None` after the last.
    pub async fn next(&mut self) -> Option<Result<RecordBatch, DataError>> {
        if self.shuffle.is_none() {
            return self.next_in_order(self.batch_size).await;
        }
        let exhausted = self.shuffle.as_ref().is_none_or(|s| {
            s.current
                .as_ref()
                .is_none_or(|(_, order, at)| *at >= order.len())
        });
        if exhausted {
            let window = self.shuffle.as_ref().map_or(0, |s| s.window);
            let rows = match self.next_in_order(window).await? {
                Ok(rows) => rows,
                Err(e) => return Some(Err(e)),
            };
            let shuffle = self.shuffle.as_mut()?;
            let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
            order.shuffle(&mut shuffle.rng);
            shuffle.current = Some((rows, order, 0));
        }
        let batch_size = self.batch_size;
        let (rows, order, at) = self.shuffle.as_mut()?.current.as_mut()?;
        let end = (*at + batch_size).min(order.len());
        let indices = UInt32Array::from(order[*at..end].to_vec());
        *at = end;
        Some(
            arrow_select::take::take_record_batch(rows, &indices).map_err(|e| DataError::Arrow {
                what: "taking a shuffled batch",
                detail: e.to_string(),
            }),
        )
    }

    /// The next `batch_size` rows in order; `None` after the last.
    async fn next_in_order(&mut self, batch_size: usize) -> Option<Result<RecordBatch, DataError>> {
        let mut wanted = batch_size;
        if let Some(remaining) = self.remaining {
            wanted = wanted.min(remaining as usize);
        }
        if wanted == 0 {
            self.end();
            return None;
        }
        let mut pieces = Vec::new();
        let mut have = 0;
        while have < wanted {
            if self.current.is_none() {
                match self.next_block().await {
                    Some(Ok(block)) => self.current = Some((block, 0)),
                    Some(Err(e)) => {
                        self.end();
                        return Some(Err(e));
                    }
                    None => break,
                }
            }
            let Some((block, offset)) = self.current.as_mut() else {
                break;
            };
            let take = (wanted - have).min(block.batch.num_rows() - *offset);
            pieces.push(block.batch.slice(*offset, take));
            *offset += take;
            have += take;
            if *offset == block.batch.num_rows() {
                if let Some((done, _)) = self.current.take() {
                    if let Some(execution) = self.execution.as_mut() {
                        execution.consumed(done.bytes);
                    }
                }
            }
        }
        if let Some(remaining) = self.remaining.as_mut() {
            *remaining -= have as u64;
        }
        let batch = match pieces.len() {
            0 => {
                self.end();
                return None;
            }
            1 => pieces.pop()?,
            _ => {
                let schema = pieces[0].schema();
                match arrow_select::concat::concat_batches(&schema, &pieces) {
                    Ok(batch) => batch,
                    Err(e) => {
                        self.end();
                        return Some(Err(DataError::Arrow {
                            what: "joining the rows of two blocks into one batch",
                            detail: e.to_string(),
                        }));
                    }
                }
            }
        };
        self.schema.get_or_insert_with(|| batch.schema());
        Some(Ok(batch))
    }

    /// The rest of the current block, or the next block whole, whatever
    /// the batch size (what the writers write, one file per block).
    pub(crate) async fn next_block_rows(&mut self) -> Option<Result<RecordBatch, DataError>> {
        let (block, offset) = match self.current.take() {
            Some(current) => current,
            None => match self.next_block().await? {
                Ok(block) => (block, 0),
                Err(e) => {
                    self.end();
                    return Some(Err(e));
                }
            },
        };
        let mut rows = block.batch.num_rows() - offset;
        if let Some(remaining) = self.remaining.as_mut() {
            rows = rows.min(*remaining as usize);
            *remaining -= rows as u64;
        }
        if let Some(execution) = self.execution.as_mut() {
            execution.consumed(block.bytes);
        }
        if rows == 0 {
            self.end();
            return None;
        }
        Some(Ok(block.batch.slice(offset, rows)))
    }

    /// The next non-empty block from the execution.
    async fn next_block(&mut self) -> Option<Result<Delivered, DataError>> {
        loop {
            let block = self.execution.as_mut()?.next_block().await?;
            match block {
                Ok(block) if block.batch.num_rows() == 0 => {
                    if let Some(execution) = self.execution.as_mut() {
                        execution.consumed(block.bytes);
                    }
                }
                other => return Some(other),
            }
        }
    }

    /// Ends the execution (its workers are killed), keeping its figures.
    fn end(&mut self) {
        if let Some(execution) = self.execution.take() {
            self.stats = execution.stats();
        }
        self.current = None;
    }

    /// The figures of the execution so far (final once `next` returned
    /// `None`).
    pub fn stats(&self) -> DatasetStats {
        match &self.execution {
            Some(execution) => execution.stats(),
            None => self.stats.clone(),
        }
    }

    /// The schema of the batches, once one was given.
    pub fn schema(&self) -> Option<SchemaRef> {
        self.schema.clone()
    }
}
