//! `Dataset::write_parquet`: the dataset's blocks, as they arrive, one
//! parquet file each (snappy), written by the consuming process; a file
//! is written under a temporary name and renamed into place when whole,
//! so a failed write leaves no part file that looks complete.

use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::dataset::Dataset;
use crate::error::DataError;

/// Writes `dataset` into `dir` (see `Dataset::write_parquet`).
pub(crate) async fn parquet(dataset: &Dataset, dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let failed = |path: &Path, detail: String| DataError::Write {
        path: path.to_path_buf(),
        detail,
    };
    std::fs::create_dir_all(dir).map_err(|e| failed(dir, e.to_string()))?;
    let mut stream = dataset.iter_batches(1).await?;
    let mut written = Vec::new();
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    while let Some(batch) = stream.next_block_rows().await {
        let batch = batch?;
        let path = dir.join(format!("part-{:05}.parquet", written.len()));
        if path.exists() {
            return Err(failed(
                &path,
                "it exists already: write into an empty directory (nothing is overwritten)".into(),
            ));
        }
        let partial = dir.join(format!(".part-{:05}.parquet.partial", written.len()));
        let file = File::create(&partial).map_err(|e| failed(&partial, e.to_string()))?;
        let outcome = ArrowWriter::try_new(file, batch.schema(), Some(properties.clone()))
            .and_then(|mut writer| {
                writer.write(&batch)?;
                writer.close().map(drop)
            });
        if let Err(e) = outcome {
            // The partial file is this write's own: it goes.
            let _ = std::fs::remove_file(&partial);
            return Err(failed(&partial, e.to_string()));
        }
        std::fs::rename(&partial, &path).map_err(|e| failed(&path, e.to_string()))?;
        written.push(path);
    }
    Ok(written)
}
