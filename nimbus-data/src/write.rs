//! `Dataset::write_parquet`, `write_csv`, `write_json`: the dataset's
//! blocks, as they arrive, one file each (parquet with snappy, CSV with a
//! header line, JSON lines), written by the consuming process with
//! Arrow's writers; a file is written under a temporary name and renamed
//! into place when whole, so a failed write leaves no part file that looks
//! complete.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::dataset::Dataset;
use crate::error::DataError;

/// A file format to write.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Format {
    Parquet,
    Csv,
    JsonLines,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
            Format::JsonLines => "jsonl",
        }
    }

    /// Writes `batch` into `file`.
    fn write(self, file: File, batch: &RecordBatch) -> Result<(), String> {
        match self {
            Format::Parquet => {
                let properties = WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .build();
                let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties))
                    .map_err(|e| e.to_string())?;
                writer.write(batch).map_err(|e| e.to_string())?;
                writer.close().map(drop).map_err(|e| e.to_string())
            }
            Format::Csv => {
                let mut writer = arrow_csv::WriterBuilder::new()
                    .with_header(true)
                    .build(file);
                writer.write(batch).map_err(|e| e.to_string())
            }
            Format::JsonLines => {
                let mut writer = arrow_json::LineDelimitedWriter::new(file);
                writer.write(batch).map_err(|e| e.to_string())?;
                writer.finish().map_err(|e| e.to_string())
            }
        }
    }
}

/// Writes `dataset` into `dir` as `format` (see `Dataset::write_parquet`).
pub(crate) async fn write(
    dataset: &Dataset,
    dir: &Path,
    format: Format,
) -> Result<Vec<PathBuf>, DataError> {
    let failed = |path: &Path, detail: String| DataError::Write {
        path: path.to_path_buf(),
        detail,
    };
    std::fs::create_dir_all(dir).map_err(|e| failed(dir, e.to_string()))?;
    let mut stream = dataset.iter_batches(1).await?;
    let mut written = Vec::new();
    let extension = format.extension();
    while let Some(batch) = stream.next_block_rows().await {
        let batch = batch?;
        let path = dir.join(format!("part-{:05}.{extension}", written.len()));
        if path.exists() {
            return Err(failed(
                &path,
                "it exists already: write into an empty directory (nothing is overwritten)".into(),
            ));
        }
        let partial = dir.join(format!(".part-{:05}.{extension}.partial", written.len()));
        let file = File::create(&partial).map_err(|e| failed(&partial, e.to_string()))?;
        if let Err(e) = format.write(file, &batch) {
            // The partial file is this write's own: it goes.
            let _ = std::fs::remove_file(&partial);
            return Err(failed(&partial, e));
        }
        std::fs::rename(&partial, &path).map_err(|e| failed(&path, e.to_string()))?;
        written.push(path);
    }
    Ok(written)
}
