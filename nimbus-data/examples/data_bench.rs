//! nimbus Data's ingest rate, in the shape of the Ray Data figure of issue
//! 52 (Ray Data 2.60 on this kind of 2-core machine: about 33,000 rows/s):
//! 20 parquet files of 10,000 rows (784 random uint8 pixels as a binary
//! column, an int64 label; written here first, seed 0) read by block
//! workers, decoded to float32 and normalised with MNIST's mean and
//! standard deviation (`map_batches`), and consumed in batches of 256 by
//! this driver, on a one-node local cluster (2 CPUs: two block workers).
//!
//! ```text
//! make run EXAMPLE=data_bench
//! make run EXAMPLE=data_bench ARGS="--files 40 --budget-mb 128"
//! ```
//!
//! You should see, in this order: the floor (`floor_rows_per_s`: one
//! thread reading and decoding the same files, no cluster), the first
//! block of the program's first dataset (`data_cold_start_s`: the node
//! hashes and caches the program's binary before its first worker, once
//! per program and node), the pipeline (`data_rows_per_s` from the
//! `iter_batches` call to the last batch, workers' start included,
//! `data_mb_per_s` of decoded float32, the fraction of the floor,
//! `data_peak_rss_mb`, the largest sum of the resident memory of every
//! process of the cluster, sampled every 50 ms), the same pipeline read by
//! two consumers in worker processes of their own through an equal
//! `streaming_split(2)` (`data_split_rows_per_s`, both shares together), the slow-consumer case (10 ms per batch: `data_budget_mb` and
//! `data_peak_resident_mb`, which stays within it), each pipeline's
//! per-operator figures, and a last `summary:` line. The files are in a
//! temporary directory, removed at the end.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use nimbus::actor::{self, Registry, SpawnOptions};
use nimbus_data::arrow_array::{
    Array, BinaryArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use nimbus_data::arrow_schema::{DataType, Field, Schema};
use nimbus_data::{BatchFn, DataSplit, Dataset, DatasetStats, RegistryExt};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Pixels per image (28 × 28).
const PIXELS: usize = 784;
/// MNIST's mean and standard deviation of a pixel in [0, 1].
const MEAN: f32 = 0.1307;
const STD: f32 = 0.3081;
/// Ray Data 2.60's rate for this pipeline on this kind of machine, as
/// issue 52 reports it (not measured by this program).
const RAY_REPORTED_ROWS_PER_S: f64 = 33_000.0;

/// Decodes the `image` column to float32 and normalises it.
const NORMALISE: BatchFn = BatchFn::new("data_bench.normalise");

/// nimbus Data's ingest rate: parquet → decode and normalise in block workers → batches of 256 in the driver.
#[derive(Parser)]
struct Args {
    /// Parquet files to write and read.
    #[arg(long, default_value_t = 20)]
    files: usize,
    /// Rows per file (one row group each).
    #[arg(long, default_value_t = 10_000)]
    rows_per_file: usize,
    /// Rows per batch the driver consumes.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Block workers (one CPU each).
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Memory budget of the main run, MB.
    #[arg(long, default_value_t = 512)]
    budget_mb: u64,
    /// Memory budget of the slow-consumer run, MB.
    #[arg(long, default_value_t = 100)]
    slow_budget_mb: u64,
    /// Rows the slow consumer reads (10 ms per batch).
    #[arg(long, default_value_t = 40_000)]
    slow_rows: u64,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

fn registry() -> Registry {
    Registry::new().batch_fn(NORMALISE, |batch: RecordBatch| normalise(&batch))
}

fn main() -> Result<()> {
    let (driver, args) = nimbus::init_parsed::<Args>(registry(), |args| {
        nimbus::InitOptions::private(args.cluster.nodes.unwrap_or(1))
    })?;
    let dir = tempfile::tempdir()?;
    let files = write_files(dir.path(), &args)?;
    let rows = (args.files * args.rows_per_file) as u64;

    let floor = floor(&files, args.batch_size)?;
    println!("floor_rows_per_s: {floor:.0} rows/s");

    driver.block_on(async {
        let peak_rss = RssSampler::start();
        let dataset = Dataset::read_parquet([dir.path()])
            .map_batches(NORMALISE)
            .concurrency(args.concurrency)
            .memory_budget(args.budget_mb << 20);
        // The program's first workers on the node: the node hashes and
        // caches the program's binary first (once per program and node).
        let cold = Instant::now();
        dataset.take(1).await?;
        let cold_start = cold.elapsed().as_secs_f64();
        println!("data_cold_start_s: {cold_start:.2} s");
        let started = Instant::now();
        let (consumed, stats) = consume(&dataset, args.batch_size, Duration::ZERO).await?;
        let seconds = started.elapsed().as_secs_f64();
        let peak_rss_mb = peak_rss.stop() as f64 / 1e6;
        ensure!(consumed == rows, "consumed {consumed} rows of {rows}");
        let rate = rows as f64 / seconds;
        let mb_per_s = rate * (PIXELS * 4) as f64 / 1e6;
        println!("data_rows_per_s: {rate:.0} rows/s");
        println!("data_mb_per_s: {mb_per_s:.0} MB/s");
        println!("data_fraction_of_floor: {:.2}", rate / floor);
        println!(
            "data_vs_ray_reported: {:.1} x",
            rate / RAY_REPORTED_ROWS_PER_S
        );
        println!("data_peak_rss_mb: {peak_rss_mb:.0} MB");
        println!("{stats}");

        // Two consumers in worker processes of their own, as two training
        // workers would read their shares.
        let splits = dataset.streaming_split(2, true).await?;
        let readers = futures::future::try_join_all(
            (0..2).map(|_| actor::spawn::<Reader>((), SpawnOptions::default().num_cpus(0.0))),
        )
        .await?;
        let started = Instant::now();
        let shares = futures::future::join_all(readers.iter().zip(&splits).map(|(reader, split)| {
            reader.send(ReadShare {
                split: split.clone(),
                batch_size: args.batch_size,
            })
        }))
        .await;
        let split_seconds = started.elapsed().as_secs_f64();
        let mut split_rows = Vec::new();
        for share in shares {
            split_rows.push(share?.map_err(anyhow::Error::msg)?);
        }
        for reader in &readers {
            reader.kill().await?;
        }
        ensure!(
            split_rows[0] == split_rows[1] && split_rows.iter().sum::<u64>() == rows,
            "unequal or incomplete shares: {split_rows:?} of {rows}"
        );
        let split_rate = rows as f64 / split_seconds;
        println!("data_split_rows_per_s: {split_rate:.0} rows/s");

        let slow = Dataset::read_parquet([dir.path()])
            .map_batches(NORMALISE)
            .concurrency(args.concurrency)
            .memory_budget(args.slow_budget_mb << 20)
            .limit(args.slow_rows);
        let (slow_rows, slow_stats) =
            consume(&slow, args.batch_size, Duration::from_millis(10)).await?;
        ensure!(slow_rows == args.slow_rows.min(rows), "slow consumer: {slow_rows} rows");
        let resident_mb = slow_stats.peak_resident_bytes as f64 / 1e6;
        let budget_mb = slow_stats.budget_bytes as f64 / 1e6;
        println!("data_budget_mb: {budget_mb:.1} MB");
        println!("data_peak_resident_mb: {resident_mb:.1} MB");
        println!("{slow_stats}");
        ensure!(
            slow_stats.peak_resident_bytes <= slow_stats.budget_bytes,
            "the slow consumer's peak resident {resident_mb:.1} MB passed its budget {budget_mb:.1} MB"
        );
        println!(
            "summary: rows={rows} rows_per_s={rate:.0} mb_per_s={mb_per_s:.0} floor_rows_per_s={floor:.0} fraction_of_floor={:.2} cold_start_s={cold_start:.2} split_rows_per_s={split_rate:.0} peak_rss_mb={peak_rss_mb:.0} budget_mb={budget_mb:.1} peak_resident_mb={resident_mb:.1}",
            rate / floor
        );
        Ok(())
    })
}

/// Reads one split of the dataset in a worker process of its own.
pub struct Reader;

impl Actor for Reader {
    type Context = Context<Self>;
}

nimbus::remote_actor!(Reader, args: (), new: |()| Reader, handles: [ReadShare]);

/// Read `split` to its end in batches of `batch_size`; its rows.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<u64, String>")]
pub struct ReadShare {
    split: DataSplit,
    batch_size: usize,
}

nimbus::remote_message!(ReadShare);

impl Handler<ReadShare> for Reader {
    type Result = ResponseFuture<Result<u64, String>>;

    fn handle(&mut self, m: ReadShare, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let mut stream = m.split.iter_batches(m.batch_size);
            let mut rows = 0;
            while let Some(batch) = stream.next().await {
                let batch = batch.map_err(|e| e.to_string())?;
                touch(&batch).map_err(|e| e.to_string())?;
                rows += batch.num_rows() as u64;
            }
            Ok(rows)
        })
    }
}

/// Reads one value per row, as a trainer reading the batch would touch
/// it; their sum.
fn touch(batch: &RecordBatch) -> Result<f64> {
    let images = batch
        .column(0)
        .as_any()
        .downcast_ref::<FixedSizeListArray>()
        .context("image column")?;
    let values = images
        .values()
        .as_any()
        .downcast_ref::<Float32Array>()
        .context("image values")?;
    Ok(values
        .values()
        .iter()
        .step_by(PIXELS)
        .map(|v| *v as f64)
        .sum::<f64>())
}

/// Consumes `dataset` in batches of `batch_size`, `pause` per batch;
/// returns its rows and figures.
async fn consume(
    dataset: &Dataset,
    batch_size: usize,
    pause: Duration,
) -> Result<(u64, DatasetStats)> {
    let mut stream = dataset.iter_batches(batch_size).await?;
    let mut rows = 0u64;
    let mut checksum = 0f64;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        checksum += touch(&batch)?;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    ensure!(checksum.is_finite(), "checksum {checksum}");
    Ok((rows, stream.stats()))
}

/// The schema of the normalised rows.
fn normalised_schema() -> Arc<Schema> {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    Arc::new(Schema::new(vec![
        Field::new("image", DataType::FixedSizeList(item, PIXELS as i32), false),
        Field::new("label", DataType::Int64, false),
    ]))
}

/// `image` (binary, 784 bytes a row) to float32, normalised; `label` kept.
fn normalise(batch: &RecordBatch) -> Result<RecordBatch, String> {
    let images = batch
        .column_by_name("image")
        .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
        .ok_or("no binary column image")?;
    let labels = batch
        .column_by_name("label")
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .ok_or("no int64 column label")?;
    let mut table = [0f32; 256];
    for (pixel, value) in table.iter_mut().enumerate() {
        *value = (pixel as f32 / 255.0 - MEAN) / STD;
    }
    let offsets = images.value_offsets();
    for (row, pair) in offsets.windows(2).enumerate() {
        if (pair[1] - pair[0]) as usize != PIXELS {
            return Err(format!(
                "row {row}: an image of {} bytes, not {PIXELS}",
                pair[1] - pair[0]
            ));
        }
    }
    let (first, last) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
    let pixels = &images.value_data()[first..last];
    let values: Vec<f32> = pixels.iter().map(|p| table[*p as usize]).collect();
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let values = Float32Array::from(values);
    let images = FixedSizeListArray::try_new(item, PIXELS as i32, Arc::new(values), None)
        .map_err(|e| e.to_string())?;
    RecordBatch::try_new(
        normalised_schema(),
        vec![Arc::new(images), Arc::new(labels.clone())],
    )
    .map_err(|e| e.to_string())
}

/// Writes the benchmark's files (seed 0) with the parquet crate's defaults
/// plus snappy, as pyarrow writes them.
fn write_files(dir: &Path, args: &Args) -> Result<Vec<PathBuf>> {
    use nimbus_data::parquet::arrow::ArrowWriter;
    use nimbus_data::parquet::basic::Compression;
    use nimbus_data::parquet::file::properties::WriterProperties;
    let schema = Arc::new(Schema::new(vec![
        Field::new("image", DataType::Binary, false),
        Field::new("label", DataType::Int64, false),
    ]));
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut files = Vec::new();
    for index in 0..args.files {
        let mut pixels = vec![0u8; args.rows_per_file * PIXELS];
        rng.fill(pixels.as_mut_slice());
        let images: BinaryArray = pixels.chunks(PIXELS).map(Some).collect();
        let labels: Int64Array = (0..args.rows_per_file)
            .map(|_| rng.random_range(0..10i64))
            .collect();
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(images), Arc::new(labels)])?;
        let path = dir.join(format!("part-{index:05}.parquet"));
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_size(args.rows_per_file)
            .build();
        let mut writer =
            ArrowWriter::try_new(File::create(&path)?, schema.clone(), Some(properties))?;
        writer.write(&batch)?;
        writer.close()?;
        files.push(path);
    }
    Ok(files)
}

/// One thread reading and decoding `files` in batches of `batch_size`,
/// no cluster, no object store: the floor the pipeline is measured
/// against. Rows per second.
fn floor(files: &[PathBuf], batch_size: usize) -> Result<f64> {
    use nimbus_data::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let started = Instant::now();
    let mut rows = 0usize;
    let mut checksum = 0f64;
    for path in files {
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path)?)?
            .with_batch_size(batch_size)
            .build()?;
        for batch in reader {
            let batch = normalise(&batch?).map_err(anyhow::Error::msg)?;
            rows += batch.num_rows();
            let images = batch
                .column(0)
                .as_any()
                .downcast_ref::<FixedSizeListArray>();
            let values = images.context("image column")?.values();
            let values = values.as_any().downcast_ref::<Float32Array>();
            checksum += values.context("values")?.values()[0] as f64;
        }
    }
    ensure!(checksum.is_finite());
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

/// Samples, every 50 ms on a thread of its own, the resident memory of
/// this process and every process below it (the local cluster's nodes and
/// their workers), summed; keeps the largest sum.
struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl RssSampler {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let thread = std::thread::spawn({
            let (stop, peak) = (stop.clone(), peak.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(tree_rss(std::process::id()), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        RssSampler { stop, peak, thread }
    }

    /// Stops sampling; the peak sum, bytes.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.peak.load(Ordering::Relaxed)
    }
}

/// Resident bytes of process `root` and its descendants now.
fn tree_rss(root: u32) -> u64 {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The parent is the second field after the command's closing paren.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(parent) = parent {
            children.entry(parent).or_default().push(pid);
        }
    }
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    let mut total = 0;
    while let Some(pid) = stack.pop() {
        if !seen.insert(pid) {
            continue;
        }
        total += rss(pid);
        stack.extend(children.get(&pid).into_iter().flatten().copied());
    }
    total
}

/// Resident bytes of `pid` (VmRSS), 0 if it is gone.
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
