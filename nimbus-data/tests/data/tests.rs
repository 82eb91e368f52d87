//! The tests, and the batch functions their block workers run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use nimbus::actor::{Registry, SpawnOptions};
use nimbus_data::arrow_array::{
    Array, BinaryArray, BooleanArray, Float32Array, Int64Array, RecordBatch, StringArray,
};
use nimbus_data::arrow_schema::{DataType, Field, Schema};
use nimbus_data::{
    BatchFn, BlockingBatches, ColumnFn, DataError, DataSplit, Dataset, FilterFn, RegistryExt, Shard,
};
use serde::{Deserialize, Serialize};

use crate::harness::{boxed, Test};

/// `id` doubled.
const DOUBLE: BatchFn = BatchFn::new("data_tests.double");
/// Panics on every block.
const PANIC: BatchFn = BatchFn::new("data_tests.panic");
/// Keeps the rows whose `id` is a multiple of 3.
const THIRDS: FilterFn = FilterFn::new("data_tests.thirds");
/// Answers for one row fewer than the block has.
const SHORT: FilterFn = FilterFn::new("data_tests.short");
/// `id` squared.
const SQUARE: ColumnFn = ColumnFn::new("data_tests.square");
/// Fails on a block it ran on before in this job (a marker file per
/// block under the temporary directory says it did).
const ONCE: BatchFn = BatchFn::new("data_tests.once");
/// Kills its worker process on the block holding id 0, the first time
/// (a marker file under the temporary directory, per job, says it did).
const DIE_ONCE: BatchFn = BatchFn::new("data_tests.die_once");

pub fn registry() -> Registry {
    Registry::new()
        .batch_fn(DOUBLE, |batch: RecordBatch| {
            let ids = column::<Int64Array>(&batch, "id")?;
            let doubled: Int64Array = ids.iter().map(|v| v.map(|v| v * 2)).collect();
            RecordBatch::try_new(batch.schema(), vec![Arc::new(doubled)]).map_err(|e| e.to_string())
        })
        .batch_fn(
            PANIC,
            |_batch: RecordBatch| -> Result<RecordBatch, String> {
                panic!("this function always panics")
            },
        )
        .filter_fn(THIRDS, |batch: &RecordBatch| {
            let ids = column::<Int64Array>(batch, "id")?;
            Ok::<_, String>(
                ids.iter()
                    .map(|id| id.map(|id| id % 3 == 0))
                    .collect::<BooleanArray>(),
            )
        })
        .filter_fn(SHORT, |batch: &RecordBatch| {
            Ok::<_, String>(BooleanArray::from(vec![true; batch.num_rows() - 1]))
        })
        .column_fn(SQUARE, |batch: &RecordBatch| {
            let ids = column::<Int64Array>(batch, "id")?;
            let squares: Int64Array = ids.iter().map(|id| id.map(|id| id * id)).collect();
            Ok::<_, String>(Arc::new(squares) as nimbus_data::arrow_array::ArrayRef)
        })
        .batch_fn(ONCE, |batch: RecordBatch| {
            let first = column::<Int64Array>(&batch, "id")?.value(0);
            let marker = once_marker(first);
            if marker.exists() {
                return Err(format!("ran twice on the block of id {first}"));
            }
            std::fs::write(&marker, b"ran").map_err(|e| e.to_string())?;
            Ok(batch)
        })
        .batch_fn(DIE_ONCE, |batch: RecordBatch| {
            let ids = column::<Int64Array>(&batch, "id")?;
            let marker = die_once_marker();
            if ids.value(0) == 0 && !marker.exists() {
                std::fs::write(&marker, b"died once").map_err(|e| e.to_string())?;
                std::process::abort();
            }
            Ok::<_, String>(batch)
        })
}

fn once_marker(first: i64) -> PathBuf {
    let job = nimbus::library::job().unwrap_or_default();
    std::env::temp_dir().join(format!("nimbus-data-once-{job}-{first}"))
}

fn die_once_marker() -> PathBuf {
    let job = nimbus::library::job().unwrap_or_default();
    std::env::temp_dir().join(format!("nimbus-data-die-once-{job}"))
}

fn column<'a, A: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a A, String> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<A>())
        .ok_or_else(|| format!("no column {name} of the expected type"))
}

pub const ALL: &[(&str, Test)] = &[
    (
        "range_through_a_batch_function_keeps_every_row_in_order",
        |_| boxed(range_through_a_batch_function()),
    ),
    (
        "filter_and_with_column_run_the_registered_functions_on_every_block",
        |_| boxed(filter_and_with_column()),
    ),
    (
        "a_materialized_dataset_is_read_again_here_and_elsewhere_without_running_its_plan",
        |_| boxed(materialized()),
    ),
    (
        "shards_of_an_epoch_are_equal_disjoint_and_the_same_when_read_again",
        |_| boxed(shards()),
    ),
    (
        "a_local_shuffle_is_a_permutation_the_same_for_a_seed",
        |_| boxed(local_shuffle()),
    ),
    ("parquet_round_trips_through_write_and_read", |_| {
        boxed(parquet_round_trips())
    }),
    (
        "csv_and_json_lines_round_trip_and_a_bad_record_is_named",
        |_| boxed(text_formats()),
    ),
    ("a_projection_reads_only_the_selected_columns", |_| {
        boxed(projection())
    }),
    ("the_memory_budget_holds_with_a_slow_consumer", |_| {
        boxed(budget_holds())
    }),
    ("a_corrupt_parquet_file_is_named", |_| boxed(corrupt_file())),
    ("files_whose_schemas_disagree_are_both_named", |_| {
        boxed(schemas_disagree())
    }),
    ("a_panicking_function_names_its_operator_and_file", |_| {
        boxed(panicking_function())
    }),
    ("an_unregistered_function_is_refused_before_running", |_| {
        boxed(unregistered_function())
    }),
    ("a_killed_block_worker_loses_no_row", |_| {
        boxed(killed_worker())
    }),
    (
        "an_equal_streaming_split_gives_two_processes_equal_shares_of_every_row_once",
        |_| boxed(equal_split()),
    ),
    ("a_dead_split_consumer_fails_the_other_naming_it", |_| {
        boxed(dead_split_consumer())
    }),
];

/// Reads a split in its own worker process, as a training worker would.
pub struct SplitConsumer;

impl Actor for SplitConsumer {
    type Context = Context<Self>;
}

nimbus::remote_actor!(SplitConsumer, args: (), new: |()| SplitConsumer, handles: [ReadSplit, ReadDataset]);

/// Run `dataset` in this process; its ids.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Vec<i64>, String>")]
pub struct ReadDataset {
    dataset: Dataset,
}

nimbus::remote_message!(ReadDataset);

impl Handler<ReadDataset> for SplitConsumer {
    type Result = ResponseFuture<Result<Vec<i64>, String>>;

    fn handle(&mut self, m: ReadDataset, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let mut stream = m
                .dataset
                .iter_batches(4096)
                .await
                .map_err(|e| e.to_string())?;
            let mut ids = Vec::new();
            while let Some(batch) = stream.next().await {
                let batch = batch.map_err(|e| e.to_string())?;
                ids.extend(column::<Int64Array>(&batch, "id")?.values().iter());
            }
            Ok(ids)
        })
    }
}

/// Read `split` to its end (or kill this process after `die_after`
/// batches); its ids.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Vec<i64>, String>")]
pub struct ReadSplit {
    split: DataSplit,
    die_after: Option<usize>,
}

nimbus::remote_message!(ReadSplit);

impl Handler<ReadSplit> for SplitConsumer {
    type Result = ResponseFuture<Result<Vec<i64>, String>>;

    fn handle(&mut self, m: ReadSplit, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let mut stream = m.split.iter_batches(4096);
            let mut ids = Vec::new();
            let mut batches = 0;
            while let Some(batch) = stream.next().await {
                let batch = batch.map_err(|e| e.to_string())?;
                ids.extend(column::<Int64Array>(&batch, "id")?.values().iter());
                batches += 1;
                if Some(batches) == m.die_after {
                    std::process::abort();
                }
            }
            Ok(ids)
        })
    }
}

/// Reads `split` here; its ids, or the error that stopped it.
async fn read_here(split: &DataSplit) -> Result<Vec<i64>, DataError> {
    let mut stream = split.iter_batches(4096);
    let mut ids = Vec::new();
    while let Some(batch) = stream.next().await {
        ids.extend(column::<Int64Array>(&batch?, "id").unwrap().values().iter());
    }
    Ok(ids)
}

async fn equal_split() {
    // Four full blocks and one of 37,857 rows: 150,000 rows each, one
    // row dropped.
    let n = 4 * 65_536 + 37_857;
    let splits = Dataset::range(n).streaming_split(2, true).await.unwrap();
    let consumer = nimbus::actor::spawn::<SplitConsumer>((), SpawnOptions::default().num_cpus(0.0))
        .await
        .unwrap();
    let (there, here) = futures::join!(
        consumer.send(ReadSplit {
            split: splits[1].clone(),
            die_after: None,
        }),
        read_here(&splits[0])
    );
    let (there, here) = (there.unwrap().unwrap(), here.unwrap());
    assert_eq!(here.len(), 150_000);
    assert_eq!(there.len(), 150_000);
    let mut all: Vec<i64> = here.into_iter().chain(there).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 300_000, "a row was read twice");
    assert!(all.iter().all(|id| (0..n as i64).contains(id)));
    consumer.kill().await.unwrap();
}

async fn dead_split_consumer() {
    let splits = Dataset::range(2_000_000)
        .streaming_split(2, true)
        .await
        .unwrap();
    let consumer = nimbus::actor::spawn::<SplitConsumer>((), SpawnOptions::default().num_cpus(0.0))
        .await
        .unwrap();
    let died = async {
        let read = consumer
            .send(ReadSplit {
                split: splits[1].clone(),
                die_after: Some(2),
            })
            .await;
        assert!(read.is_err(), "the consumer should have died: {read:?}");
        std::time::Instant::now()
    };
    let (died, (failed, error)) = futures::join!(died, async {
        let error = read_here(&splits[0]).await.unwrap_err();
        (std::time::Instant::now(), error)
    });
    let text = error.to_string();
    assert!(text.contains("split 1 of 2"), "{text}");
    let after = failed.saturating_duration_since(died);
    assert!(
        after <= Duration::from_secs(2),
        "failed {after:?} after the death: {text}"
    );
}

/// Every id of `stream`, in order.
async fn ids(dataset: &Dataset, batch_size: usize) -> Vec<i64> {
    let mut stream = dataset.iter_batches(batch_size).await.unwrap();
    let mut ids: Vec<i64> = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap();
        assert!(batch.num_rows() <= batch_size);
        ids.extend(column::<Int64Array>(&batch, "id").unwrap().values().iter());
    }
    ids
}

async fn range_through_a_batch_function() {
    let n = 200_000;
    let dataset = Dataset::range(n).map_batches(DOUBLE);
    let got = ids(&dataset, 1000).await;
    let want: Vec<i64> = (0..n as i64).map(|i| i * 2).collect();
    assert_eq!(got, want);
    assert_eq!(dataset.count().await.unwrap(), n);
    let first = dataset.take(5).await.unwrap();
    let first: Vec<i64> = first
        .iter()
        .flat_map(|b| column::<Int64Array>(b, "id").unwrap().values().to_vec())
        .collect();
    assert_eq!(first, [0, 2, 4, 6, 8]);
}

async fn filter_and_with_column() {
    let n = 200_000;
    let dataset = Dataset::range(n)
        .filter(THIRDS)
        .with_column("square", SQUARE);
    let mut stream = dataset.iter_batches(1000).await.unwrap();
    let (mut kept, mut squares): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap();
        let names: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["id", "square"]);
        kept.extend(column::<Int64Array>(&batch, "id").unwrap().values().iter());
        squares.extend(
            column::<Int64Array>(&batch, "square")
                .unwrap()
                .values()
                .iter(),
        );
    }
    let want: Vec<i64> = (0..n as i64).filter(|id| id % 3 == 0).collect();
    assert_eq!(kept, want);
    let want_squares: Vec<i64> = want.iter().map(|id| id * id).collect();
    assert_eq!(squares, want_squares);
    // A filter changes the count: it is counted by running the plan.
    assert_eq!(dataset.count().await.unwrap(), want.len() as u64);
    // A column of the same name is replaced, in place.
    let replaced = ids(&Dataset::range(10).with_column("id", SQUARE), 10).await;
    assert_eq!(replaced, (0..10).map(|id| id * id).collect::<Vec<i64>>());
    // A predicate that does not answer for every row fails the dataset,
    // naming the operator and the block.
    let text = Dataset::range(10)
        .filter(SHORT)
        .count()
        .await
        .unwrap_err()
        .to_string();
    assert!(text.contains("filter(data_tests.short)"), "{text}");
    assert!(text.contains("range 0..10"), "{text}");
    assert!(
        text.contains("answered for 9 rows of a block of 10"),
        "{text}"
    );
    // An unregistered predicate is refused before anything runs.
    refused_unregistered(
        Dataset::range(10).filter(FilterFn::new("data_tests.nowhere")),
        "filter(data_tests.nowhere)",
    )
    .await;
}

/// Counting `dataset` is refused before anything runs: the function of
/// `operator` is not registered.
async fn refused_unregistered(dataset: Dataset, operator: &str) {
    let error = dataset.count().await.unwrap_err();
    assert!(
        matches!(&error, DataError::NotRegistered(name) if name == operator),
        "{error:?}"
    );
}

async fn materialized() {
    let n = 3 * 65_536;
    let markers: Vec<PathBuf> = (0..n as i64).step_by(65_536).map(once_marker).collect();
    for marker in &markers {
        let _ = std::fs::remove_file(marker);
    }
    let planned = Dataset::range(n).map_batches(ONCE);
    let stored = planned.materialize().await.unwrap();
    let want: Vec<i64> = (0..n as i64).collect();
    // Read twice, and counted without running anything: the function ran
    // once per block, in the materializing run.
    assert_eq!(ids(&stored, 1000).await, want);
    assert_eq!(ids(&stored, 4096).await, want);
    assert_eq!(stored.count().await.unwrap(), n);
    // Sent to another process, the materialized blocks (references) and a
    // plan (its function registered there too) run there.
    let consumer = nimbus::actor::spawn::<SplitConsumer>((), SpawnOptions::default().num_cpus(0.0))
        .await
        .unwrap();
    let there = consumer
        .send(ReadDataset {
            dataset: stored.clone(),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(there, want);
    let plan = Dataset::range(1_000).filter(THIRDS).map_batches(DOUBLE);
    let there = consumer
        .send(ReadDataset { dataset: plan })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        there,
        (0..1_000)
            .filter(|id| id % 3 == 0)
            .map(|id| id * 2)
            .collect::<Vec<i64>>()
    );
    consumer.kill().await.unwrap();
    // The plan itself runs its function again, which fails.
    let again = planned.count().await;
    for marker in &markers {
        std::fs::remove_file(marker).unwrap();
    }
    let text = again.unwrap_err().to_string();
    assert!(text.contains("ran twice on the block of id"), "{text}");
}

/// The ids of `shard` of `dataset`, in batches of 1000, from batch `skip`.
async fn shard_ids(dataset: &Dataset, shard: Shard, skip: u64) -> Vec<i64> {
    let mut stream = dataset
        .iter_shard(shard, 1000)
        .await
        .unwrap()
        .skip(skip)
        .await
        .unwrap();
    let mut ids = Vec::new();
    while let Some(batch) = stream.next().await {
        ids.extend(
            column::<Int64Array>(&batch.unwrap(), "id")
                .unwrap()
                .values()
                .iter(),
        );
    }
    ids
}

async fn shards() {
    // 7 blocks (six of 65,536 rows, one of 1,000) dealt to 3 shards.
    let n = 6 * 65_536 + 1_000;
    let dataset = Dataset::range(n);
    let shard = |index, epoch| Shard {
        index,
        count: 3,
        seed: 5,
        epoch,
    };
    let mut epochs = Vec::new();
    for epoch in 0..2 {
        let mut read = Vec::new();
        for index in 0..3 {
            read.push(shard_ids(&dataset, shard(index, epoch), 0).await);
        }
        // As many rows each, no row twice.
        assert!(
            read.iter().all(|ids| ids.len() == read[0].len()),
            "{:?}",
            read.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert!(read[0].len() >= 65_536);
        let mut all: Vec<i64> = read.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 3 * read[0].len());
        // Read again: the same rows in the same order.
        assert_eq!(shard_ids(&dataset, shard(1, epoch), 0).await, read[1]);
        epochs.push(read);
    }
    assert_ne!(epochs[0], epochs[1], "each epoch deals the blocks anew");
    // Resuming at batch 10, from a thread outside the runtime (a training
    // loop's): the batches after the first 10, and nothing else.
    let runtime = tokio::runtime::Handle::current();
    let resumed = {
        let dataset = dataset.clone();
        tokio::task::spawn_blocking(move || {
            let start = async move { dataset.iter_shard_from(shard(2, 1), 1000, 10).await };
            let mut ids: Vec<i64> = Vec::new();
            for batch in BlockingBatches::spawn(&runtime, 2, start) {
                ids.extend(
                    column::<Int64Array>(&batch.unwrap(), "id")
                        .unwrap()
                        .values()
                        .iter(),
                );
            }
            ids
        })
        .await
        .unwrap()
    };
    assert_eq!(resumed, epochs[1][2][10_000..]);
    // Past a whole block (66,000 rows: at least the first block, of 65,536
    // or 1,000 rows; the shards hold 66,536 each), which is not made at all;
    // and as `skip` would drop the same batches after reading them.
    let mut past = dataset
        .iter_shard_from(shard(0, 0), 1000, 66)
        .await
        .unwrap();
    let mut ids: Vec<i64> = Vec::new();
    while let Some(batch) = past.next().await {
        ids.extend(
            column::<Int64Array>(&batch.unwrap(), "id")
                .unwrap()
                .values()
                .iter(),
        );
    }
    assert_eq!(ids, epochs[0][0][66_000..]);
    let mut read_past = dataset
        .iter_shard(shard(0, 0), 1000)
        .await
        .unwrap()
        .skip(66)
        .await
        .unwrap();
    let mut same: Vec<i64> = Vec::new();
    while let Some(batch) = read_past.next().await {
        same.extend(
            column::<Int64Array>(&batch.unwrap(), "id")
                .unwrap()
                .values()
                .iter(),
        );
    }
    assert_eq!(same, ids);
    assert_eq!(
        past.stats().blocks + 1,
        read_past.stats().blocks,
        "the block wholly before batch 66 is not made"
    );
    // What cannot be dealt equally without reading is refused.
    let text = dataset
        .clone()
        .map_batches(DOUBLE)
        .iter_shard(shard(0, 0), 1000)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(text.contains("may change the rows"), "{text}");
}

/// Every id of `dataset` through a local shuffle of `buffer` rows.
async fn shuffled_ids(dataset: &Dataset, buffer: usize, seed: u64) -> Vec<i64> {
    let mut stream = dataset
        .iter_batches(1000)
        .await
        .unwrap()
        .local_shuffle(buffer, seed);
    let mut ids: Vec<i64> = Vec::new();
    let mut sizes = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap();
        sizes.push(batch.num_rows());
        ids.extend(column::<Int64Array>(&batch, "id").unwrap().values().iter());
    }
    // Full batches but the last.
    assert!(
        sizes[..sizes.len() - 1].iter().all(|s| *s == 1000),
        "{sizes:?}"
    );
    ids
}

async fn local_shuffle() {
    let n = 150_500;
    let dataset = Dataset::range(n);
    let first = shuffled_ids(&dataset, 20_000, 7).await;
    assert_ne!(first, (0..n as i64).collect::<Vec<_>>(), "not shuffled");
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..n as i64).collect::<Vec<_>>(),
        "not a permutation"
    );
    assert_eq!(
        shuffled_ids(&dataset, 20_000, 7).await,
        first,
        "seed 7 twice"
    );
    assert_ne!(
        shuffled_ids(&dataset, 20_000, 8).await,
        first,
        "seeds 7 and 8"
    );
}

/// A batch of `rows` rows from `start`: `id`, a float, a string and a
/// binary column.
fn sample(start: i64, rows: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("score", DataType::Float32, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("pixels", DataType::Binary, false),
    ]));
    let ids: Int64Array = (start..start + rows).collect();
    let scores: Float32Array = (start..start + rows).map(|i| i as f32 * 0.5).collect();
    let names: StringArray = (start..start + rows)
        .map(|i| Some(format!("row-{i}")))
        .collect();
    let pixels: Vec<Vec<u8>> = (start..start + rows)
        .map(|i| vec![(i % 251) as u8; 16])
        .collect();
    let pixels: BinaryArray = pixels.iter().map(|p| Some(p.as_slice())).collect();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(ids),
            Arc::new(scores),
            Arc::new(names),
            Arc::new(pixels),
        ],
    )
    .unwrap()
}

async fn write_sample(dir: &Path, files: i64, rows: i64) -> Vec<PathBuf> {
    let batches: Vec<RecordBatch> = (0..files).map(|f| sample(f * rows, rows)).collect();
    let dataset = Dataset::from_batches(&batches).await.unwrap();
    dataset.write_parquet(dir).await.unwrap()
}

async fn parquet_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_sample(dir.path(), 3, 5000).await;
    assert_eq!(written.len(), 3);
    let read = Dataset::read_parquet([dir.path()]);
    assert_eq!(read.count().await.unwrap(), 15_000);
    let mut stream = read.iter_batches(4096).await.unwrap();
    let mut rows = Vec::new();
    while let Some(batch) = stream.next().await {
        rows.push(batch.unwrap());
    }
    let got = arrow_select_concat(&rows);
    assert_eq!(got, sample(0, 15_000));
    // Writing again into the same directory overwrites nothing.
    let again = Dataset::read_parquet([dir.path()])
        .write_parquet(dir.path())
        .await;
    match again {
        Err(DataError::Write { path, detail }) => {
            assert!(path.ends_with("part-00000.parquet"), "{path:?}");
            assert!(detail.contains("exists already"), "{detail}");
        }
        other => panic!("expected a refusal to overwrite, got {other:?}"),
    }
}

/// The rows of `batches` as one batch.
fn arrow_select_concat(batches: &[RecordBatch]) -> RecordBatch {
    let schema = batches[0].schema();
    let columns = (0..schema.fields().len())
        .map(|c| {
            let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
            arrow_concat(&arrays)
        })
        .collect();
    RecordBatch::try_new(schema, columns).unwrap()
}

fn arrow_concat(arrays: &[&dyn Array]) -> Arc<dyn Array> {
    nimbus_data::arrow_select::concat::concat(arrays).unwrap()
}

async fn text_formats() {
    let dir = tempfile::tempdir().unwrap();
    let batches: Vec<RecordBatch> = (0..3).map(|f| sample(f * 2000, 2000)).collect();
    let rows = Dataset::from_batches(&batches)
        .await
        .unwrap()
        .select_columns(["id", "name"]);
    let csv = rows.write_csv(dir.path().join("csv")).await.unwrap();
    let json = rows.write_json(dir.path().join("json")).await.unwrap();
    assert_eq!((csv.len(), json.len()), (3, 3));
    let want = arrow_select_concat(&rows.take(6000).await.unwrap());
    for read in [
        Dataset::read_csv([dir.path().join("csv")]),
        Dataset::read_json([dir.path().join("json")]),
    ] {
        assert_eq!(read.count().await.unwrap(), 6000);
        let got = arrow_select_concat(&read.take(6000).await.unwrap());
        // The same values (an inferred schema says every column may be null).
        assert_eq!(got.columns(), want.columns());
    }
    // A record past the inferred prefix that does not fit its column.
    let bad = dir.path().join("bad.csv");
    let mut text = String::from("id,name\n");
    for i in 0..2000 {
        text.push_str(&format!("{i},row-{i}\n"));
    }
    text.push_str("not-a-number,row-x\n");
    std::fs::write(&bad, text).unwrap();
    let error = Dataset::read_csv([&bad]).count().await.unwrap_err();
    let text = error.to_string();
    assert!(text.contains("bad.csv"), "{text}");
    assert!(text.contains("not-a-number"), "{text}");
}

async fn projection() {
    let dir = tempfile::tempdir().unwrap();
    write_sample(dir.path(), 2, 100).await;
    let read = Dataset::read_parquet([dir.path()]).columns(["name", "id"]);
    let schema = read.schema().await.unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["name", "id"]);
    let batches = read.take(150).await.unwrap();
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 150);
    assert_eq!(batches[0].num_columns(), 2);
    let missing = Dataset::read_parquet([dir.path()]).columns(["nope"]);
    match missing.count().await {
        Err(DataError::NoColumn {
            column, columns, ..
        }) => {
            assert_eq!(column, "nope");
            assert!(columns.contains("pixels"), "{columns}");
        }
        other => panic!("expected NoColumn, got {other:?}"),
    }
}

async fn budget_holds() {
    // Blocks of 65,536 ids (512 KiB of Int64 each, a little more as IPC);
    // a budget of about three of them; a consumer that takes 10 ms per
    // batch of 8,192 rows is far slower than two workers.
    let budget = 1_700_000;
    let dataset = Dataset::range(16 * 65_536).memory_budget(budget);
    let mut stream = dataset.iter_batches(8192).await.unwrap();
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch.unwrap().num_rows();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rows, 16 * 65_536);
    let stats = stream.stats();
    println!("{stats}");
    assert_eq!(stats.budget_bytes, budget);
    assert!(stats.peak_resident_bytes > 0);
    assert!(
        stats.peak_resident_bytes <= budget,
        "peak resident {} over the budget {budget}",
        stats.peak_resident_bytes
    );
    assert!(stats.backpressure > Duration::ZERO, "{stats}");
}

async fn corrupt_file() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_sample(dir.path(), 2, 100).await;
    let bytes = std::fs::read(&written[1]).unwrap();
    std::fs::write(&written[1], &bytes[..bytes.len() / 2]).unwrap();
    let error = Dataset::read_parquet([dir.path()])
        .count()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("part-00001.parquet"), "{text}");
    assert!(matches!(error, DataError::File { .. }), "{error:?}");
    // Truncated inside a row group (the footer intact): named with the
    // row group, by the block worker that reads it.
    let intact = std::fs::read(&written[0]).unwrap();
    let mut damaged = intact.clone();
    for byte in &mut damaged[4..intact.len() / 3] {
        *byte = 0xff;
    }
    std::fs::write(&written[1], &damaged).unwrap();
    let mut stream = Dataset::read_parquet([dir.path()])
        .iter_batches(64)
        .await
        .unwrap();
    let mut error = None;
    while let Some(batch) = stream.next().await {
        if let Err(e) = batch {
            error = Some(e);
            break;
        }
    }
    let text = error.expect("a damaged row group fails").to_string();
    assert!(text.contains("part-00001.parquet row groups [0]"), "{text}");
}

async fn schemas_disagree() {
    let dir = tempfile::tempdir().unwrap();
    write_sample(dir.path(), 1, 10).await;
    let other = Dataset::range(10)
        .write_parquet(dir.path().join("more"))
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    let error = Dataset::read_parquet([dir.path()])
        .count()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("part-00000.parquet"), "{text}");
    assert!(text.contains("more/part-00000.parquet"), "{text}");
    assert!(text.contains("pixels"), "{text}");
}

async fn panicking_function() {
    let dir = tempfile::tempdir().unwrap();
    write_sample(dir.path(), 1, 10).await;
    let error = Dataset::read_parquet([dir.path()])
        .map_batches(PANIC)
        .count()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("map_batches(data_tests.panic)"), "{text}");
    assert!(text.contains("part-00000.parquet"), "{text}");
    assert!(text.contains("this function always panics"), "{text}");
}

async fn unregistered_function() {
    refused_unregistered(
        Dataset::range(10).map_batches(BatchFn::new("data_tests.nowhere")),
        "map_batches(data_tests.nowhere)",
    )
    .await;
}

async fn killed_worker() {
    let marker = die_once_marker();
    let _ = std::fs::remove_file(&marker);
    let n = 4 * 65_536;
    let dataset = Dataset::range(n).map_batches(DIE_ONCE);
    let mut stream = dataset.iter_batches(65_536).await.unwrap();
    let mut got: Vec<i64> = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap();
        got.extend(column::<Int64Array>(&batch, "id").unwrap().values().iter());
    }
    assert!(marker.exists(), "the worker never died");
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(got, (0..n as i64).collect::<Vec<_>>());
    let stats = stream.stats();
    assert!(stats.retried_blocks >= 1, "{stats}");
    assert!(stats.workers_started >= 3, "{stats}");
}
