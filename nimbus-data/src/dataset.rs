//! [`Dataset`]: a lazy plan (a source, then operators) and the ways to run
//! it: `iter_batches`, `count`, `take`, `schema`, `streaming_split`,
//! `materialize`, and the writers.

use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use nimbus::actor::{self, SpawnOptions};
use nimbus::object_store::{ObjectRef, RawBytes};
use serde::{Deserialize, Serialize};

use crate::batches::BatchStream;
use crate::error::DataError;
use crate::executor::{Execution, Settings};
use crate::functions::{BatchFn, BatchRun, ColumnFn, ColumnRun, FilterFn, FilterRun, Table};
use crate::plan::{Op, Split};
use crate::source::text::{self, TextFormat};
use crate::source::{self, parquet};
use crate::split::{DataSplit, SplitCoordinator, SplitPlan};

/// The memory budget when none is set: 512 MiB of blocks stored and not
/// yet consumed, plus those being made.
pub const DEFAULT_MEMORY_BUDGET: u64 = 512 << 20;
/// Block workers when none is set.
pub const DEFAULT_CONCURRENCY: usize = 2;
/// Runs of a block after its worker is lost, when none is set (as Ray's
/// task retries).
pub const DEFAULT_BLOCK_RETRIES: u32 = 3;

/// A source planned: its splits, and its rows (in all, and per split) and
/// schema where known without reading it.
pub(crate) struct Planned {
    pub(crate) splits: Vec<Split>,
    pub(crate) rows: Option<u64>,
    pub(crate) split_rows: Option<Vec<u64>>,
    pub(crate) schema: Option<SchemaRef>,
}

/// Batches put into the object store as blocks, for a dataset of them.
#[derive(Default)]
struct Stored {
    blocks: Vec<ObjectRef<RawBytes>>,
    schema: Option<SchemaRef>,
    rows: u64,
}

impl Stored {
    /// Puts `batch` as the next block; `what` names the caller in errors.
    async fn put(&mut self, what: &'static str, batch: &RecordBatch) -> Result<(), DataError> {
        let schema = self.schema.get_or_insert_with(|| batch.schema());
        if batch.schema().fields() != schema.fields() {
            return Err(DataError::Arrow {
                what,
                detail: format!(
                    "the batches' schemas differ: {:?} and {:?}",
                    schema.fields(),
                    batch.schema().fields()
                ),
            });
        }
        let encoded = crate::block::Encoded::new(batch).map_err(|e| DataError::Arrow {
            what: "encoding a batch",
            detail: e.to_string(),
        })?;
        let object = encoded.put().await.map_err(|detail| DataError::Arrow {
            what: "storing a batch",
            detail,
        })?;
        self.blocks.push(object);
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// The dataset of the blocks put; `what` names the caller in errors.
    fn into_dataset(self, what: &'static str) -> Result<Dataset, DataError> {
        let Some(schema) = self.schema else {
            return Err(DataError::Arrow {
                what,
                detail: "no rows (a dataset needs a schema)".into(),
            });
        };
        Ok(Dataset::new(Source::Blocks {
            blocks: self.blocks,
            schema,
            rows: self.rows,
        }))
    }
}

/// Where a dataset's rows come from.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Source {
    Parquet {
        paths: Vec<PathBuf>,
        columns: Option<Vec<String>>,
    },
    Text {
        paths: Vec<PathBuf>,
        format: TextFormat,
    },
    Range(u64),
    Blocks {
        blocks: Vec<ObjectRef<RawBytes>>,
        #[serde(with = "shared_schema")]
        schema: SchemaRef,
        rows: u64,
    },
}

/// A shared schema (de)serialized as the schema it shares.
mod shared_schema {
    use arrow_schema::{Schema, SchemaRef};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(schema: &SchemaRef, to: S) -> Result<S::Ok, S::Error> {
        schema.as_ref().serialize(to)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<SchemaRef, D::Error> {
        Schema::deserialize(from).map(std::sync::Arc::new)
    }
}

/// A dataset: a source and the operators its blocks go through, run by
/// block workers on the cluster when consumed. Building one reads
/// nothing; every consumer runs the plan anew. It serializes, so it can
/// be sent to any process of the program's cluster (in a training loop's
/// configuration, or a message to an actor), which can run it there: a
/// plan names files (to be readable where it runs) and functions
/// (registered in every process, as the program's binary is the same);
/// the blocks of `from_batches` and `materialize` travel as references,
/// which keep them stored while any copy lives.
///
/// ```no_run
/// use nimbus_data::{BatchFn, Dataset, RegistryExt};
/// const DOUBLE: BatchFn = BatchFn::new("example.double");
///
/// # async fn demo() -> Result<(), nimbus_data::DataError> {
/// let mut batches = Dataset::read_parquet(["data/train"])
///     .columns(["image", "label"])
///     .map_batches(DOUBLE)
///     .memory_budget(256 << 20)
///     .iter_batches(256)
///     .await?;
/// while let Some(batch) = batches.next().await {
///     let batch = batch?;
///     // train on `batch`
/// }
/// println!("{}", batches.stats());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Dataset {
    source: Source,
    ops: Vec<Op>,
    limit: Option<u64>,
    settings: Settings,
}

impl Dataset {
    fn new(source: Source) -> Self {
        Dataset {
            source,
            ops: Vec::new(),
            limit: None,
            settings: Settings {
                concurrency: DEFAULT_CONCURRENCY,
                num_cpus: 1.0,
                budget: DEFAULT_MEMORY_BUDGET,
                max_block_retries: DEFAULT_BLOCK_RETRIES,
            },
        }
    }

    /// The parquet files at `paths` (files, or directories walked for
    /// `*.parquet` files in name order): one block per row group.
    pub fn read_parquet<P: Into<PathBuf>>(paths: impl IntoIterator<Item = P>) -> Self {
        Self::new(Source::Parquet {
            paths: paths.into_iter().map(Into::into).collect(),
            columns: None,
        })
    }

    /// The CSV files at `paths` (files, or directories walked for `*.csv`
    /// files in name order), each with a header line: one block per file,
    /// the column types inferred from each file's first
    /// [`INFER_RECORDS`](crate::INFER_RECORDS) records.
    pub fn read_csv<P: Into<PathBuf>>(paths: impl IntoIterator<Item = P>) -> Self {
        Self::new(Source::Text {
            paths: paths.into_iter().map(Into::into).collect(),
            format: TextFormat::Csv,
        })
    }

    /// The JSON-lines files at `paths` (files, or directories walked for
    /// `*.jsonl` files in name order), one object per line: one block per
    /// file, the schema inferred from each file's first
    /// [`INFER_RECORDS`](crate::INFER_RECORDS) records.
    pub fn read_json<P: Into<PathBuf>>(paths: impl IntoIterator<Item = P>) -> Self {
        Self::new(Source::Text {
            paths: paths.into_iter().map(Into::into).collect(),
            format: TextFormat::JsonLines,
        })
    }

    /// The integers `0..n` as column `id` (Int64), in blocks of
    /// 65,536 rows.
    pub fn range(n: u64) -> Self {
        Self::new(Source::Range(n))
    }

    /// These batches (all of one schema), put into the object store, one
    /// block each.
    pub async fn from_batches(batches: &[RecordBatch]) -> Result<Self, DataError> {
        let mut stored = Stored::default();
        for batch in batches {
            stored.put("from_batches", batch).await?;
        }
        stored.into_dataset("from_batches")
    }

    /// Runs the plan once and keeps its rows in the object store, one
    /// block per block made: a dataset of those blocks, which consumers
    /// read again and again without reading the files or running the
    /// operators again (Ray's `materialize`: preprocess once, train many
    /// epochs). The rows stay stored (in shared memory, or spilled by the
    /// store) while the returned dataset or a clone of it lives; the
    /// memory budget bounds only the run that makes them.
    pub async fn materialize(&self) -> Result<Dataset, DataError> {
        let mut stream = self.iter_batches(1).await?;
        let mut stored = Stored::default();
        while let Some(batch) = stream.next_block_rows().await {
            stored.put("materialize", &batch?).await?;
        }
        let mut dataset = stored.into_dataset("materialize")?;
        dataset.settings = self.settings.clone();
        Ok(dataset)
    }

    /// Reads only these columns, in this order (for parquet, the others'
    /// pages are never read); other sources select them after reading.
    pub fn columns<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        let columns: Vec<String> = columns.into_iter().map(Into::into).collect();
        match &mut self.source {
            Source::Parquet { columns: read, .. } if self.ops.is_empty() => *read = Some(columns),
            _ => self.ops.push(Op::SelectColumns(columns)),
        }
        self
    }

    /// Runs registered batch function `function` on every block, in the
    /// block workers.
    pub fn map_batches(mut self, function: BatchFn) -> Self {
        self.ops.push(Op::MapBatches(function.name().to_string()));
        self
    }

    /// Keeps the rows that registered row predicate `predicate` keeps,
    /// in the block workers.
    pub fn filter(mut self, predicate: FilterFn) -> Self {
        self.ops.push(Op::Filter(predicate.name().to_string()));
        self
    }

    /// Adds column `column`, computed by registered column function
    /// `function` in the block workers, after the others (or in place of
    /// the column of that name, if there is one).
    pub fn with_column(mut self, column: impl Into<String>, function: ColumnFn) -> Self {
        self.ops.push(Op::WithColumn {
            column: column.into(),
            function: function.name().to_string(),
        });
        self
    }

    /// Keeps these columns, in this order.
    pub fn select_columns<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.ops.push(Op::SelectColumns(
            columns.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// Renames columns (`from`, `to`).
    pub fn rename_columns<S: Into<String>>(
        mut self,
        pairs: impl IntoIterator<Item = (S, S)>,
    ) -> Self {
        self.ops.push(Op::RenameColumns(
            pairs
                .into_iter()
                .map(|(a, b)| (a.into(), b.into()))
                .collect(),
        ));
        self
    }

    /// At most the first `n` rows (no block past them is consumed).
    pub fn limit(mut self, n: u64) -> Self {
        self.limit = Some(self.limit.map_or(n, |limit| limit.min(n)));
        self
    }

    /// Block workers to run (default [`DEFAULT_CONCURRENCY`]; at most one
    /// per block).
    pub fn concurrency(mut self, workers: usize) -> Self {
        self.settings.concurrency = workers.max(1);
        self
    }

    /// CPUs each block worker holds (default 1).
    pub fn num_cpus(mut self, cpus: f64) -> Self {
        self.settings.num_cpus = cpus;
        self
    }

    /// Bytes of blocks stored and not yet consumed, plus those being made,
    /// that the execution keeps within (default [`DEFAULT_MEMORY_BUDGET`]):
    /// a slow consumer makes the workers wait. One block always moves,
    /// even if larger.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.settings.budget = bytes;
        self
    }

    /// Runs of a block after its worker is lost (default
    /// [`DEFAULT_BLOCK_RETRIES`]).
    pub fn max_block_retries(mut self, retries: u32) -> Self {
        self.settings.max_block_retries = retries;
        self
    }

    /// Runs the plan: its batches of `batch_size` rows, in order.
    pub async fn iter_batches(&self, batch_size: usize) -> Result<BatchStream, DataError> {
        let splits = self.plan()?.splits;
        self.check_functions()?;
        let execution = self.execute(splits).await?;
        Ok(BatchStream::new(execution, batch_size, self.limit))
    }

    /// Starts running this dataset's operators on `splits`.
    async fn execute(&self, splits: Vec<Split>) -> Result<Execution, DataError> {
        Execution::start(
            splits,
            self.ops.clone(),
            self.read_name(),
            self.settings.clone(),
        )
        .await
    }

    /// Shard `shard` of this dataset in its epoch, in batches of
    /// `batch_size` rows: the same rows in the same order in any process
    /// that asks, every shard as many rows (see `shard.rs` for how they
    /// are dealt). A training worker reads `Shard { index: rank, count:
    /// world size, seed, epoch }` each epoch, and resumes at batch `b`
    /// with [`iter_shard_from`](Self::iter_shard_from). The rows of each block
    /// must be known without reading it (parquet files, a range) and no
    /// operator may change them (`map_batches` and `filter` may: refused).
    pub async fn iter_shard(
        &self,
        shard: crate::Shard,
        batch_size: usize,
    ) -> Result<BatchStream, DataError> {
        self.iter_shard_from(shard, batch_size, 0).await
    }

    /// [`iter_shard`](Self::iter_shard) from its batch `skip_batches` on
    /// (a consumer resuming mid-epoch): the blocks wholly before that
    /// batch are not made at all, and the rows of the first block made
    /// that come before it are dropped, so the batches are exactly those
    /// `iter_shard` gives from there.
    pub async fn iter_shard_from(
        &self,
        shard: crate::Shard,
        batch_size: usize,
        skip_batches: u64,
    ) -> Result<BatchStream, DataError> {
        let (dealt, rows) = self.deal(shard)?;
        let skip = skip_batches.saturating_mul(batch_size as u64).min(rows);
        let mut passed = 0;
        let mut splits = Vec::new();
        for (split, split_rows) in dealt {
            if splits.is_empty() && passed + split_rows <= skip {
                passed += split_rows;
            } else {
                splits.push(split);
            }
        }
        let execution = self.execute(splits).await?;
        BatchStream::new(execution, batch_size, Some(rows - passed))
            .skip_rows(skip - passed)
            .await
    }

    /// The rows [`iter_shard`](Self::iter_shard) gives `shard` (as many as
    /// every other shard of its epoch), from the files' footers.
    pub fn shard_rows(&self, shard: crate::Shard) -> Result<u64, DataError> {
        Ok(self.deal(shard)?.1)
    }

    /// `shard`'s splits with the rows of each, and the rows it reads
    /// (`shard.rs`), or why it has none.
    fn deal(&self, shard: crate::Shard) -> Result<(Vec<(Split, u64)>, u64), DataError> {
        let refused = |detail: &str| DataError::Arrow {
            what: "iter_shard",
            detail: detail.into(),
        };
        if self.limit.is_some() {
            return Err(refused("a limited dataset cannot be sharded"));
        }
        if self.ops.iter().any(Op::changes_rows) {
            return Err(refused(
                "an operator may change the rows of a block (map_batches, filter): shard the rows first and transform each batch in the consumer, or materialize and shard the files written",
            ));
        }
        let planned = self.plan()?;
        let Some(split_rows) = planned.split_rows else {
            return Err(refused(
                "the rows of each block are known only for parquet files and ranges",
            ));
        };
        self.check_functions()?;
        let (mine, rows) = shard.deal(&split_rows)?;
        let splits = mine
            .into_iter()
            .map(|i| (planned.splits[i].clone(), split_rows[i]))
            .collect();
        Ok((splits, rows))
    }

    /// One execution read by `n` consumers, anywhere in the cluster: send
    /// each [`DataSplit`] to its consumer, which reads it with
    /// `DataSplit::iter_batches`. With `equal`, every split gets exactly
    /// as many rows (each block cut into `n` slices; fewer than `n` rows
    /// left at the end are dropped) and the splits are read in lockstep (a
    /// consumer far ahead waits for the slowest); without, whole blocks go
    /// to whichever consumer asks first. A consumer that dies or drops its
    /// split before its end makes the others fail, naming it, within about
    /// [`SILENCE`](crate::SILENCE). The blocks are dealt by a
    /// `SplitCoordinator` actor (a worker process without CPUs), which
    /// stops once every split has been read or dropped.
    pub async fn streaming_split(
        &self,
        n: usize,
        equal: bool,
    ) -> Result<Vec<DataSplit>, DataError> {
        if n == 0 {
            return Err(DataError::Arrow {
                what: "streaming_split",
                detail: "split into 0 parts".into(),
            });
        }
        if self.limit.is_some() {
            return Err(DataError::Arrow {
                what: "streaming_split",
                detail: "a limited dataset cannot be split yet: split first, then stop reading"
                    .into(),
            });
        }
        let splits = self.plan()?.splits;
        self.check_functions()?;
        let plan = SplitPlan {
            splits,
            ops: self.ops.clone(),
            read_name: self.read_name().to_string(),
            settings: self.settings.clone(),
            n,
            equal,
        };
        let coordinator =
            actor::spawn::<SplitCoordinator>(plan, SpawnOptions::default().num_cpus(0.0)).await?;
        Ok((0..n)
            .map(|index| DataSplit {
                coordinator: coordinator.clone(),
                index,
                count: n,
            })
            .collect())
    }

    /// The number of rows (from the files' footers when no operator can
    /// change it; by running the plan otherwise).
    pub async fn count(&self) -> Result<u64, DataError> {
        let changes_rows = self.ops.iter().any(Op::changes_rows);
        if !changes_rows {
            if let Some(rows) = self.plan()?.rows {
                return Ok(self.limit.map_or(rows, |limit| limit.min(rows)));
            }
        }
        let mut stream = self.iter_batches(1 << 20).await?;
        let mut rows = 0;
        while let Some(batch) = stream.next().await {
            rows += batch?.num_rows() as u64;
        }
        Ok(rows)
    }

    /// The first `n` rows, as batches.
    pub async fn take(&self, n: u64) -> Result<Vec<RecordBatch>, DataError> {
        let mut stream = self.clone().limit(n).iter_batches(1 << 20).await?;
        let mut batches = Vec::new();
        while let Some(batch) = stream.next().await {
            batches.push(batch?);
        }
        Ok(batches)
    }

    /// The schema of the rows (of the first block, when operators may
    /// change it).
    pub async fn schema(&self) -> Result<SchemaRef, DataError> {
        if self.ops.is_empty() {
            if let Some(schema) = self.plan()?.schema {
                return Ok(schema);
            }
        }
        let mut stream = self.clone().limit(1).iter_batches(1).await?;
        match stream.next().await {
            Some(batch) => Ok(batch?.schema()),
            None => Err(DataError::Arrow {
                what: "schema",
                detail: "the dataset has no rows to take a schema from".into(),
            }),
        }
    }

    /// Writes the rows to `dir` as parquet files (snappy), one per block,
    /// `part-00000.parquet` and on; `dir` is created if missing and must
    /// hold no such file already (nothing is overwritten). Returns the
    /// files written.
    pub async fn write_parquet(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>, DataError> {
        crate::write::write(self, dir.as_ref(), crate::write::Format::Parquet).await
    }

    /// [`write_parquet`](Self::write_parquet), as CSV files with a header
    /// line (`part-00000.csv`).
    pub async fn write_csv(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>, DataError> {
        crate::write::write(self, dir.as_ref(), crate::write::Format::Csv).await
    }

    /// [`write_parquet`](Self::write_parquet), as JSON-lines files
    /// (`part-00000.jsonl`).
    pub async fn write_json(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>, DataError> {
        crate::write::write(self, dir.as_ref(), crate::write::Format::JsonLines).await
    }

    /// The splits to run, and the rows and schema of the source where
    /// known without reading it.
    pub(crate) fn plan(&self) -> Result<Planned, DataError> {
        Ok(match &self.source {
            Source::Parquet { paths, columns } => {
                let files = parquet::files(paths)?;
                let planned = parquet::plan(&files, columns.as_deref())?;
                Planned {
                    splits: planned.splits,
                    rows: Some(planned.split_rows.iter().sum()),
                    split_rows: Some(planned.split_rows),
                    schema: Some(planned.schema),
                }
            }
            Source::Text { paths, format } => {
                let files = source::files(paths, format.source(), format.extension())?;
                let (schema, splits) = text::plan(&files, *format)?;
                Planned {
                    splits,
                    rows: None,
                    split_rows: None,
                    schema: Some(schema),
                }
            }
            Source::Range(n) => {
                let splits = source::range_splits(*n);
                let split_rows = splits
                    .iter()
                    .map(|split| match split {
                        Split::Range { start, end } => end - start,
                        _ => 0,
                    })
                    .collect();
                Planned {
                    splits,
                    rows: Some(*n),
                    split_rows: Some(split_rows),
                    schema: None,
                }
            }
            Source::Blocks {
                blocks,
                rows,
                schema,
            } => Planned {
                splits: blocks.iter().cloned().map(Split::Object).collect(),
                rows: Some(*rows),
                split_rows: None,
                schema: Some(schema.clone()),
            },
        })
    }

    /// Every function of the plan is registered in this binary (so in its
    /// workers, which run it too).
    pub(crate) fn check_functions(&self) -> Result<(), DataError> {
        let registry = nimbus::library::registry().ok_or(DataError::NotConnected)?;
        for op in &self.ops {
            let registered = match op {
                Op::MapBatches(name) => Table::<BatchRun>::lookup(&registry, name).is_some(),
                Op::Filter(name) => Table::<FilterRun>::lookup(&registry, name).is_some(),
                Op::WithColumn { function, .. } => {
                    Table::<ColumnRun>::lookup(&registry, function).is_some()
                }
                Op::SelectColumns(_) | Op::RenameColumns(_) => true,
            };
            if !registered {
                return Err(DataError::NotRegistered(op.name()));
            }
        }
        Ok(())
    }

    pub(crate) fn read_name(&self) -> &'static str {
        match self.source {
            Source::Parquet { .. } => "read_parquet",
            Source::Text { format, .. } => format.source(),
            Source::Range(_) => "range",
            Source::Blocks { .. } => "from_batches",
        }
    }
}
