//! Parquet files: listed and planned in the consumer's process (each file's
//! footer only: its schema and row groups), one split per row group, read
//! in block workers with the projection pushed down (only the selected
//! columns' pages are read and decoded).

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use crate::error::DataError;
use crate::plan::Split;

/// A planned parquet read: its schema (after projection), its splits and
/// the rows of each.
pub(crate) struct Planned {
    pub(crate) schema: SchemaRef,
    pub(crate) splits: Vec<Split>,
    pub(crate) split_rows: Vec<u64>,
}

/// The parquet files under `paths` (files as given; directories walked,
/// `*.parquet` files in name order).
pub(crate) fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, DataError> {
    super::files(paths, "read_parquet", "parquet")
}

/// Plans reading `files`: one split per row group, `columns` only (all
/// when `None`); every file must have the first one's schema.
pub(crate) fn plan(files: &[PathBuf], columns: Option<&[String]>) -> Result<Planned, DataError> {
    let mut first: Option<(PathBuf, SchemaRef)> = None;
    let mut splits = Vec::new();
    let mut split_rows = Vec::new();
    for path in files {
        let corrupt = |detail: String| DataError::File {
            path: path.clone(),
            detail,
        };
        let file = File::open(path).map_err(|e| corrupt(e.to_string()))?;
        let metadata = ArrowReaderMetadata::load(&file, Default::default())
            .map_err(|e| corrupt(format!("not a readable parquet file: {e}")))?;
        let schema = metadata.schema().clone();
        match &first {
            None => first = Some((path.clone(), schema)),
            Some((first_path, first_schema)) => {
                if first_schema.fields() != schema.fields() {
                    return Err(DataError::SchemaMismatch {
                        first: first_path.clone(),
                        first_schema: describe(first_schema),
                        second: path.clone(),
                        second_schema: describe(&schema),
                    });
                }
            }
        }
        for (index, group) in metadata.metadata().row_groups().iter().enumerate() {
            split_rows.push(group.num_rows().max(0) as u64);
            splits.push(Split::Parquet {
                path: path.clone(),
                row_groups: vec![index],
                columns: columns.map(<[String]>::to_vec),
            });
        }
    }
    let (_, schema) = first.ok_or(DataError::NoFiles {
        what: "read_parquet",
        kind: "parquet",
        paths: String::new(),
    })?;
    let schema = match columns {
        None => schema,
        Some(columns) => {
            let indices = columns
                .iter()
                .map(|column| {
                    schema.index_of(column).map_err(|_| DataError::NoColumn {
                        operator: "read_parquet(columns)".into(),
                        column: column.clone(),
                        columns: column_names(&schema),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            std::sync::Arc::new(schema.project(&indices).map_err(|e| DataError::Arrow {
                what: "projecting the schema",
                detail: e.to_string(),
            })?)
        }
    };
    Ok(Planned {
        schema,
        splits,
        split_rows,
    })
}

/// The columns of `schema`, comma-separated.
pub(crate) fn column_names(schema: &SchemaRef) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    names.join(", ")
}

/// A schema in words: `(name: type, ...)`.
pub(crate) fn describe(schema: &SchemaRef) -> String {
    let fields: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    format!("({})", fields.join(", "))
}

/// Reads row groups `row_groups` of `path`, `columns` only, as one batch.
pub(crate) fn read(
    path: &Path,
    row_groups: &[usize],
    columns: Option<&[String]>,
) -> Result<RecordBatch, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| format!("not a readable parquet file: {e}"))?;
    let groups = builder.metadata().row_groups();
    let rows: i64 = row_groups
        .iter()
        .map(|g| groups.get(*g).map_or(0, |group| group.num_rows()))
        .sum();
    if let Some(missing) = row_groups.iter().find(|g| **g >= groups.len()) {
        return Err(format!(
            "row group {missing} does not exist (the file has {}): it changed since the dataset was planned",
            groups.len()
        ));
    }
    let schema = builder.schema().clone();
    let mut builder = builder
        .with_row_groups(row_groups.to_vec())
        .with_batch_size(rows.max(1) as usize);
    let mut order = None;
    if let Some(columns) = columns {
        let mask =
            ProjectionMask::columns(builder.parquet_schema(), columns.iter().map(String::as_str));
        builder = builder.with_projection(mask);
        order = Some(columns);
    }
    let reader = builder.build().map_err(|e| e.to_string())?;
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("row groups {row_groups:?}: {e}"))?;
    let batch = match batches.len() {
        1 => batches.into_iter().next().ok_or("no batch")?,
        _ => {
            let read_schema = match batches.first() {
                Some(batch) => batch.schema(),
                None => schema,
            };
            arrow_select::concat::concat_batches(&read_schema, &batches)
                .map_err(|e| e.to_string())?
        }
    };
    match order {
        None => Ok(batch),
        Some(columns) => {
            let indices = columns
                .iter()
                .map(|c| batch.schema().index_of(c).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            batch.project(&indices).map_err(|e| e.to_string())
        }
    }
}
