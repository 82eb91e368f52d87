//! Sources: turning what a dataset reads into splits (one block each),
//! planned in the consumer's process, and reading a split into a batch, in
//! a block worker.

pub(crate) mod parquet;
mod range;
pub(crate) mod text;

use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;

use crate::error::DataError;
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
        Split::Text { path, format } => text::read(path, *format),
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

/// The files of source `what` under `paths`: files as given, directories
/// walked for files ending in `.{extension}`, in name order.
pub(crate) fn files(
    paths: &[PathBuf],
    what: &'static str,
    extension: &'static str,
) -> Result<Vec<PathBuf>, DataError> {
    let mut found = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| DataError::Path {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        if meta.is_dir() {
            walk(path, extension, &mut found)?;
        } else {
            found.push(path.clone());
        }
    }
    if found.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(DataError::NoFiles {
            what,
            kind: extension,
            paths: shown.join(", "),
        });
    }
    Ok(found)
}

fn walk(dir: &Path, extension: &str, found: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let unreadable = |e: std::io::Error| DataError::Path {
        path: dir.to_path_buf(),
        detail: e.to_string(),
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(unreadable)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(unreadable)?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, extension, found)?;
        } else if path.extension().is_some_and(|e| e == extension) {
            found.push(path);
        }
    }
    Ok(())
}
