//! `Dataset::range`: the integers of a split as column `id` (Int64).

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};

/// Integers `start..end` as a batch of one column, `id`.
pub(super) fn read(start: u64, end: u64) -> Result<RecordBatch, String> {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let ids: Int64Array = (start as i64..end as i64).collect();
    RecordBatch::try_new(schema, vec![Arc::new(ids)]).map_err(|e| e.to_string())
}
