//! Sources: turning what a dataset reads into splits (one block each),
//! planned in the consumer's process, and reading a split into a batch, in
//! a block worker.

pub(crate) mod parquet;
mod range;

use arrow_array::RecordBatch;

use crate::plan::Split;

/// Rows per block of `Dataset::range`.
pub(crate) const RANGE_BLOCK_ROWS: u64 = 65_536;

/// The rows of `split`, or what went wrong, in words.
pub(crate) fn read(split: &Split) -> Result<RecordBatch, String> {
    match split {
        Split::Parquet {
            path,
            row_groups,
            columns,
        } => parquet::read(path, row_groups, columns.as_deref()),
        Split::Range { start, end } => range::read(*start, *end),
        Split::Object(_) => Err("an in-memory block is read by its worker, not a source".into()),
    }
}

/// The splits of `range(n)`.
pub(crate) fn range_splits(n: u64) -> Vec<Split> {
    (0..n)
        .step_by(RANGE_BLOCK_ROWS as usize)
        .map(|start| Split::Range {
            start,
            end: (start + RANGE_BLOCK_ROWS).min(n),
        })
        .collect()
}
