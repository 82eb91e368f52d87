//! The digits as parquet files, read through nimbus Data: a directory with
//! `train/` and `test/` sub-directories of parquet files, each row an
//! image as column `image` (784 bytes, 28×28 pixels row by row) and its
//! class as column `label` (int64). Training workers read their shard of
//! `train/` each epoch (`Dataset::iter_shard`); the test set is read whole.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use nimbus_data::arrow_array::{Array, BinaryArray, Int64Array, RecordBatch};
use nimbus_data::arrow_schema::{DataType, Field, Schema};
use nimbus_data::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use nimbus_data::parquet::arrow::ArrowWriter;
use nimbus_data::parquet::file::properties::WriterProperties;
use nimbus_train::tch::{Kind, Tensor};

use super::{generate_digits, normalise, ImageSet};

/// Pixels per image.
const PIXELS: usize = 28 * 28;

/// Writes `train` + `test` generated digits (the embedded data of `seed`)
/// under `dir`: `train/part-N.parquet` files of `rows_per_group` rows per
/// row group (a block each), and `test/part-0.parquet`.
pub fn write_digits(
    dir: &Path,
    (train, test): (usize, usize),
    seed: u64,
    rows_per_group: usize,
) -> Result<(), String> {
    let (images, labels) = generate_digits(train + test, seed);
    let batch = |range: std::ops::Range<usize>| -> Result<RecordBatch, String> {
        let image: BinaryArray = range
            .clone()
            .map(|i| Some(&images[i * PIXELS..(i + 1) * PIXELS]))
            .collect();
        let label = Int64Array::from(labels[range].to_vec());
        RecordBatch::try_new(schema(), vec![Arc::new(image), Arc::new(label)])
            .map_err(|e| e.to_string())
    };
    write(&dir.join("train"), &batch(0..train)?, rows_per_group)?;
    write(
        &dir.join("test"),
        &batch(train..train + test)?,
        rows_per_group,
    )
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("image", DataType::Binary, false),
        Field::new("label", DataType::Int64, false),
    ]))
}

fn write(dir: &Path, batch: &RecordBatch, rows_per_group: usize) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("part-0.parquet");
    let failed = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = File::create_new(&path).map_err(|e| failed(&e))?;
    let properties = WriterProperties::builder()
        .set_max_row_group_size(rows_per_group.max(1))
        .build();
    let mut writer =
        ArrowWriter::try_new(file, batch.schema(), Some(properties)).map_err(|e| failed(&e))?;
    writer.write(batch).map_err(|e| failed(&e))?;
    writer.close().map_err(|e| failed(&e))?;
    Ok(())
}

/// A batch of rows as images `[N, 1, 28, 28]` (normalised) and labels.
pub fn to_tensors(batch: &RecordBatch) -> Result<(Tensor, Tensor), String> {
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .ok_or_else(|| format!("no column {name} (an image dataset has image and label)"))
    };
    let images = column("image")?
        .as_any()
        .downcast_ref::<BinaryArray>()
        .ok_or("column image is not binary")?;
    let labels = column("label")?
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("column label is not int64")?;
    let mut pixels = Vec::with_capacity(images.len() * PIXELS);
    for (row, image) in images.iter().enumerate() {
        match image {
            Some(image) if image.len() == PIXELS => pixels.extend_from_slice(image),
            _ => return Err(format!("row {row}: an image is {PIXELS} bytes")),
        }
    }
    let n = images.len() as i64;
    Ok((
        normalise(Tensor::from_slice(&pixels).view([n, 1, 28, 28])),
        Tensor::from_slice(labels.values()).to_kind(Kind::Int64),
    ))
}

/// Every row of the parquet files in `dir`, read here (the test set).
pub fn read_set(dir: &Path) -> Result<ImageSet, String> {
    let mut images = Vec::new();
    let mut labels = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "parquet"))
        .collect();
    paths.sort();
    for path in paths {
        let failed = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let file = File::open(&path).map_err(|e| failed(&e))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|builder| builder.build())
            .map_err(|e| failed(&e))?;
        for batch in reader {
            let (image, label) = to_tensors(&batch.map_err(|e| failed(&e))?)?;
            images.push(image);
            labels.push(label);
        }
    }
    if images.is_empty() {
        return Err(format!("{}: no rows in its parquet files", dir.display()));
    }
    Ok(ImageSet {
        images: Tensor::cat(&images, 0),
        labels: Tensor::cat(&labels, 0),
    })
}
