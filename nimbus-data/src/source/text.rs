//! CSV and JSON-lines files, one block per file, read with Arrow's own
//! readers. The schema of each file is inferred from its first
//! [`INFER_RECORDS`] records, by the planner (which checks that every file
//! agrees) and again by the block worker that reads it (the same records,
//! so the same schema); a later record that does not fit fails the read,
//! naming the file.

use std::fs::File;
use std::io::{BufReader, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::DataError;
use crate::plan::Split;

/// Records a file's schema is inferred from.
pub const INFER_RECORDS: usize = 1000;

/// Rows per batch while reading a file (then joined into one block).
const READ_BATCH: usize = 65_536;

/// A text format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TextFormat {
    /// Comma-separated, a header line first.
    Csv,
    /// One JSON object per line.
    JsonLines,
}

impl TextFormat {
    /// The source's name (`read_csv`).
    pub(crate) fn source(self) -> &'static str {
        match self {
            TextFormat::Csv => "read_csv",
            TextFormat::JsonLines => "read_json",
        }
    }

    /// The file extension a directory is searched for.
    pub(crate) fn extension(self) -> &'static str {
        match self {
            TextFormat::Csv => "csv",
            TextFormat::JsonLines => "jsonl",
        }
    }
}

/// Plans reading `files` in `format`: one split per file, every file of
/// the first one's schema.
pub(crate) fn plan(
    files: &[PathBuf],
    format: TextFormat,
) -> Result<(SchemaRef, Vec<Split>), DataError> {
    let mut first: Option<(PathBuf, SchemaRef)> = None;
    for path in files {
        let schema = infer(path, format).map_err(|detail| DataError::File {
            path: path.clone(),
            detail,
        })?;
        match &first {
            None => first = Some((path.clone(), schema)),
            Some((first_path, first_schema)) if first_schema.fields() != schema.fields() => {
                return Err(DataError::SchemaMismatch {
                    first: first_path.clone(),
                    first_schema: super::parquet::describe(first_schema),
                    second: path.clone(),
                    second_schema: super::parquet::describe(&schema),
                });
            }
            Some(_) => {}
        }
    }
    let splits = files
        .iter()
        .map(|path| Split::Text {
            path: path.clone(),
            format,
        })
        .collect();
    let (_, schema) = first.ok_or(DataError::NoFiles {
        what: format.source(),
        kind: format.extension(),
        paths: String::new(),
    })?;
    Ok((schema, splits))
}

/// The schema of `path`, from its first [`INFER_RECORDS`] records.
fn infer(path: &Path, format: TextFormat) -> Result<SchemaRef, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let schema: Schema = match format {
        TextFormat::Csv => {
            arrow_csv::reader::Format::default()
                .with_header(true)
                .infer_schema(file, Some(INFER_RECORDS))
                .map_err(|e| format!("not readable as CSV: {e}"))?
                .0
        }
        TextFormat::JsonLines => {
            arrow_json::reader::infer_json_schema(BufReader::new(file), Some(INFER_RECORDS))
                .map_err(|e| format!("not readable as JSON lines: {e}"))?
                .0
        }
    };
    Ok(Arc::new(schema))
}

/// Reads the whole of `path` as one batch.
pub(crate) fn read(path: &Path, format: TextFormat) -> Result<RecordBatch, String> {
    let schema = infer(path, format)?;
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    file.rewind().map_err(|e| e.to_string())?;
    let batches: Vec<RecordBatch> = match format {
        TextFormat::Csv => arrow_csv::ReaderBuilder::new(schema.clone())
            .with_header(true)
            .with_batch_size(READ_BATCH)
            .build(file)
            .map_err(|e| e.to_string())?
            .collect::<Result<_, _>>(),
        TextFormat::JsonLines => arrow_json::ReaderBuilder::new(schema.clone())
            .with_batch_size(READ_BATCH)
            .build(BufReader::new(file))
            .map_err(|e| e.to_string())?
            .collect::<Result<_, _>>(),
    }
    .map_err(|e| e.to_string())?;
    arrow_select::concat::concat_batches(&schema, &batches).map_err(|e| e.to_string())
}
