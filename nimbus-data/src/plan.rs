//! A dataset's plan: where each block's rows come from (a [`Split`]) and
//! the operators every block goes through in its worker ([`Op`]), both
//! sent to block workers as they are.

use std::path::PathBuf;

use nimbus::object_store::{ObjectRef, RawBytes};
use serde::{Deserialize, Serialize};

use crate::source::text::TextFormat;

/// Where one block's rows come from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Split {
    /// Row groups of a parquet file, with the columns to read (all when
    /// `None`).
    Parquet {
        /// The file.
        path: PathBuf,
        /// Its row groups to read, in order.
        row_groups: Vec<usize>,
        /// The columns to read.
        columns: Option<Vec<String>>,
    },
    /// A whole CSV or JSON-lines file.
    Text {
        /// The file.
        path: PathBuf,
        /// Its format.
        format: TextFormat,
    },
    /// Integers `start..end` as column `id` (Int64).
    Range {
        /// First value.
        start: u64,
        /// One past the last.
        end: u64,
    },
    /// A block already in the object store (`Dataset::from_batches`).
    Object(ObjectRef<RawBytes>),
}

impl Split {
    /// Where the rows come from, in words, for errors and stats.
    pub(crate) fn describe(&self) -> String {
        match self {
            Split::Parquet {
                path, row_groups, ..
            } => format!("{} row groups {row_groups:?}", path.display()),
            Split::Text { path, .. } => path.display().to_string(),
            Split::Range { start, end } => format!("range {start}..{end}"),
            Split::Object(object) => format!("in-memory block {:?}", object.id()),
        }
    }
}

/// One operator applied to every block, in its worker, in plan order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Op {
    /// The registered batch function of this name.
    MapBatches(String),
    /// Keep the rows the registered row predicate of this name keeps.
    Filter(String),
    /// Add (or replace) column `column`, computed by the registered column
    /// function `function`.
    WithColumn {
        /// The column's name.
        column: String,
        /// The function's name.
        function: String,
    },
    /// Keep these columns, in this order.
    SelectColumns(Vec<String>),
    /// Rename columns (`from`, `to`).
    RenameColumns(Vec<(String, String)>),
}

impl Op {
    /// Whether the operator may change the number of rows.
    pub(crate) fn changes_rows(&self) -> bool {
        matches!(self, Op::MapBatches(_) | Op::Filter(_))
    }

    /// The operator's name in errors and stats (`map_batches(normalise)`).
    pub(crate) fn name(&self) -> String {
        match self {
            Op::MapBatches(function) => format!("map_batches({function})"),
            Op::Filter(predicate) => format!("filter({predicate})"),
            Op::WithColumn { column, function } => format!("with_column({column}, {function})"),
            Op::SelectColumns(columns) => format!("select_columns({})", columns.join(", ")),
            Op::RenameColumns(pairs) => {
                let pairs: Vec<String> = pairs.iter().map(|(a, b)| format!("{a}->{b}")).collect();
                format!("rename_columns({})", pairs.join(", "))
            }
        }
    }
}
