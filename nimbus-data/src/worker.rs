//! `BlockWorker`: the actor, one per worker process, that makes blocks:
//! it reads a split, runs the plan's operators on it, and puts the result
//! in the object store, one block at a time, in arrival order.
//!
//! 1. Read the split (a parquet file's row groups, a range, or an
//!    in-memory block fetched from the object store).
//! 2. Run each operator in turn; an error or a panic of the user's
//!    function fails the block with the operator's name and the split's
//!    source (the worker lives on for the next block).
//! 3. Encode the batch as an Arrow IPC stream, written straight into its
//!    object (`object_store::put_bytes_with`); reply with its reference,
//!    its rows and bytes, and the time each step took.

use std::time::Instant;

use actix::prelude::*;
use arrow_array::{Array, RecordBatch};
use nimbus::object_store::{self, ObjectRef, RawBytes};
use serde::{Deserialize, Serialize};

use crate::block;
use crate::error::BlockError;
use crate::functions::{BatchRun, ColumnRun, FilterRun, Table};
use crate::plan::{Op, Split};
use crate::stats::{thread_cpu, StepTime};

/// Makes blocks in its worker process.
pub struct BlockWorker;

impl Actor for BlockWorker {
    type Context = Context<Self>;
}

nimbus::remote_actor!(BlockWorker, args: (), new: |()| BlockWorker, handles: [MakeBlock]);

/// Make one block: read `split`, run `ops`, encode and put the result.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<MadeBlock, BlockError>")]
pub struct MakeBlock {
    pub(crate) split: Split,
    pub(crate) ops: Vec<Op>,
}

nimbus::remote_message!(MakeBlock);

/// A block made and stored.
#[derive(Serialize, Deserialize)]
pub struct MadeBlock {
    pub(crate) object: ObjectRef<RawBytes>,
    pub(crate) rows: u64,
    pub(crate) bytes: u64,
    /// Reading, then each operator, then encoding, then storing.
    pub(crate) steps: Vec<StepTime>,
}

impl Handler<MakeBlock> for BlockWorker {
    type Result = ResponseFuture<Result<MadeBlock, BlockError>>;

    fn handle(&mut self, m: MakeBlock, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let source_name = m.split.describe();
            let (batch, mut steps) = match &m.split {
                Split::Object(object) => {
                    let timer = Timer::start();
                    let bytes =
                        object_store::get_bytes(object)
                            .await
                            .map_err(|e| BlockError::Read {
                                source_name: source_name.clone(),
                                detail: e.to_string(),
                            })?;
                    let size = bytes.len() as u64;
                    let batch = block::decode(bytes, 0).map_err(|e| BlockError::Read {
                        source_name: source_name.clone(),
                        detail: e.to_string(),
                    })?;
                    let rows = batch.num_rows() as u64;
                    (batch, vec![timer.stop(rows, size)])
                }
                split => {
                    let timer = Timer::start();
                    let batch = crate::source::read(split).map_err(|detail| BlockError::Read {
                        source_name: source_name.clone(),
                        detail,
                    })?;
                    let (rows, size) = (batch.num_rows() as u64, batch.get_array_memory_size());
                    (batch, vec![timer.stop(rows, size as u64)])
                }
            };
            let mut batch: RecordBatch = batch;
            for op in &m.ops {
                let timer = Timer::start();
                batch = apply(op, batch).map_err(|detail| BlockError::Operator {
                    operator: op.name(),
                    source_name: source_name.clone(),
                    detail,
                })?;
                steps.push(timer.stop(
                    batch.num_rows() as u64,
                    batch.get_array_memory_size() as u64,
                ));
            }
            let timer = Timer::start();
            let store_error = |detail: String| BlockError::Store {
                source_name: source_name.clone(),
                detail,
            };
            let encoded = block::Encoded::new(&batch).map_err(|e| store_error(e.to_string()))?;
            let bytes = encoded.len() as u64;
            steps.push(timer.stop(batch.num_rows() as u64, bytes));
            let timer = Timer::start();
            let object = encoded.put().await.map_err(store_error)?;
            steps.push(timer.stop(batch.num_rows() as u64, bytes));
            Ok(MadeBlock {
                object,
                rows: batch.num_rows() as u64,
                bytes,
                steps,
            })
        })
    }
}

/// Runs one operator on `batch`; a panic of the user's function is its
/// error.
fn apply(op: &Op, batch: RecordBatch) -> Result<RecordBatch, String> {
    match op {
        Op::MapBatches(name) => {
            let run = registered::<BatchRun>(name)?;
            guarded(|| run(batch))
        }
        Op::Filter(name) => {
            let run = registered::<FilterRun>(name)?;
            let keep = guarded(|| run(&batch))?;
            if keep.len() != batch.num_rows() {
                return Err(format!(
                    "the predicate answered for {} rows of a block of {}",
                    keep.len(),
                    batch.num_rows()
                ));
            }
            arrow_select::filter::filter_record_batch(&batch, &keep).map_err(|e| e.to_string())
        }
        Op::WithColumn { column, function } => {
            let run = registered::<ColumnRun>(function)?;
            let values = guarded(|| run(&batch))?;
            if values.len() != batch.num_rows() {
                return Err(format!(
                    "the function gave {} values for a block of {} rows",
                    values.len(),
                    batch.num_rows()
                ));
            }
            with_column(&batch, column, values)
        }
        Op::SelectColumns(columns) => {
            let schema = batch.schema();
            let indices = columns
                .iter()
                .map(|column| {
                    schema.index_of(column).map_err(|_| {
                        format!(
                            "no column {column} (the columns are {})",
                            crate::source::parquet::column_names(&schema)
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            batch.project(&indices).map_err(|e| e.to_string())
        }
        Op::RenameColumns(pairs) => {
            let schema = batch.schema();
            let mut fields: Vec<arrow_schema::Field> =
                schema.fields().iter().map(|f| f.as_ref().clone()).collect();
            for (from, to) in pairs {
                let index = schema.index_of(from).map_err(|_| {
                    format!(
                        "no column {from} (the columns are {})",
                        crate::source::parquet::column_names(&schema)
                    )
                })?;
                fields[index] = fields[index].clone().with_name(to);
            }
            let renamed = std::sync::Arc::new(arrow_schema::Schema::new(fields));
            RecordBatch::try_new(renamed, batch.columns().to_vec()).map_err(|e| e.to_string())
        }
    }
}

/// The function of kind `F` registered in this worker's binary as `name`.
fn registered<F: ?Sized + Send + Sync + 'static>(name: &str) -> Result<std::sync::Arc<F>, String> {
    let registry = nimbus::library::registry().ok_or("this worker is not initialised")?;
    Table::<F>::lookup(&registry, name).ok_or_else(|| {
        format!("this binary registers no function {name} (nimbus_data::RegistryExt)")
    })
}

/// Runs the user's function `run`: a panic is its error.
fn guarded<T>(run: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    nimbus::library::catch_panic(run).unwrap_or_else(|panic| Err(format!("panicked: {panic}")))
}

/// `batch` with `values` as column `name`: in place of the column of that
/// name, or after the others.
fn with_column(
    batch: &RecordBatch,
    name: &str,
    values: arrow_array::ArrayRef,
) -> Result<RecordBatch, String> {
    let schema = batch.schema();
    let mut fields: Vec<arrow_schema::Field> =
        schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = batch.columns().to_vec();
    // Nullable whatever this block holds, so every block has one schema.
    let field = arrow_schema::Field::new(name, values.data_type().clone(), true);
    match schema.index_of(name) {
        Ok(index) => {
            fields[index] = field;
            columns[index] = values;
        }
        Err(_) => {
            fields.push(field);
            columns.push(values);
        }
    }
    let schema = std::sync::Arc::new(arrow_schema::Schema::new(fields));
    RecordBatch::try_new(schema, columns).map_err(|e| e.to_string())
}

/// Wall and CPU time of one step.
struct Timer {
    wall: Instant,
    cpu: std::time::Duration,
}

impl Timer {
    fn start() -> Self {
        Timer {
            wall: Instant::now(),
            cpu: thread_cpu(),
        }
    }

    fn stop(self, rows: u64, bytes: u64) -> StepTime {
        StepTime {
            rows,
            bytes,
            wall: self.wall.elapsed(),
            cpu: thread_cpu().saturating_sub(self.cpu),
        }
    }
}
