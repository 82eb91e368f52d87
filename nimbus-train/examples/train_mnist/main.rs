//! Data-parallel MNIST training across a local cluster, surviving a worker
//! crash.
//!
//! ```text
//! make run EXAMPLE=train_mnist ARGS="--workers 2 --epochs 2 --fail-at-step 60"
//! make run EXAMPLE=train_mnist ARGS="--data-dir ../shared/data/mnist-t10k"
//! make run EXAMPLE=train_mnist ARGS="--export-parquet /tmp/digits"
//! make run EXAMPLE=train_mnist ARGS="--data parquet:/tmp/digits --fail-at-step 60"
//! ```
//!
//! With no `--address` it starts a 2-node local cluster; each worker is a
//! worker process of its own, holding a replica of the CNN, and the workers
//! average gradients every step through shared memory. With no `--data-dir`
//! it trains on embedded generated digits (seven-segment digits drawn at
//! random size, position, slant and stroke width, with noise), so it runs
//! offline. `--export-parquet DIR` writes those digits as parquet files
//! (`DIR/train/`, `DIR/test/`) and exits; `--data parquet:DIR` trains on
//! such files, each worker streaming its shard of every epoch through nimbus
//! Data (a different shard each epoch, the same again after a failure).
//! `--fail-at-step K` makes the last worker SIGKILL itself before
//! step K on the first attempt: the supervisor replaces it and heals the
//! group from the surviving worker, no step redone (with `--no-peer-heal`,
//! it tears the group down and restarts it from the latest checkpoint).
//! `--bf16` trains in bf16
//! (parameters, activations and gradients; on GPUs NCCL averages them in
//! bf16); `--autocast` runs the forward pass under libtorch's autocast (f16
//! on CUDA). `--check-replicas` fails the run unless every worker holds rank
//! 0's exact parameters after every step; `--nccl-env NCCL_X=...` and
//! `--nccl-hostid-per-rank` set NCCL's variables for the run's ranks
//! (README, "Training on GPUs"). Each run gets a new directory
//! under `--storage` unless `--resume PATH` names a checkpoint; there,
//! besides the checkpoints, every report goes to `metrics.jsonl` and
//! `progress.csv` as it arrives and the losses are plotted into `loss.svg`
//! at the end (the line `results:` names the directory).
//!
//! `samples_per_s` counts training samples of all workers per second of
//! wall-clock time from the first attempt's start to the end (restarts,
//! evaluation and checkpoints included; cluster start-up excluded).
//!
//! The last line is `summary: workers=... epochs=... samples_per_s=...
//! test_accuracy=... final_loss=... restarts=... params_sha256=...
//! checkpoint=...`; two runs with the same `--seed` and `--workers` have the
//! same `params_sha256`, failures or not.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod mnist;

use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use mnist::{DataSource, FailMode, MnistConfig, MnistLoop};
use nimbus::actor::Registry;
use nimbus::host::files;
use nimbus::placement::PlacementStrategy;
use nimbus_train::{
    Checkpoint, CollectiveBackend, RunConfig, ScalingConfig, ScoreOrder, TrainEvent, TrainRegistry,
    Trainer,
};

#[derive(Parser, Debug)]
#[command(about = "Data-parallel MNIST on a nimbus cluster", long_about = None)]
struct Args {
    /// Training workers (0: run in this process, for debugging).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Passes over the training data.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Batch size per worker.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.01)]
    lr: f64,
    /// Seeds the weights, the data and the shuffles.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// MNIST or Fashion-MNIST idx files (gzip or not); default: embedded
    /// generated digits.
    #[arg(long, conflicts_with = "data")]
    data_dir: Option<PathBuf>,
    /// Train on files read through nimbus Data: `parquet:DIR`, a directory
    /// with `train/` and `test/` parquet files (see --export-parquet).
    #[arg(long, value_parser = data_files)]
    data: Option<PathBuf>,
    /// Write the embedded digits (--train-samples, --seed) as parquet files
    /// under this new directory, for --data parquet:DIR, and exit.
    #[arg(long)]
    export_parquet: Option<PathBuf>,
    /// Embedded data: training samples.
    #[arg(long, default_value_t = 6_000)]
    train_samples: usize,
    /// The last worker dies before this step on the first attempt.
    #[arg(long)]
    fail_at_step: Option<u64>,
    /// Also checkpoint every this many steps (always at each epoch's end).
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Resume from this checkpoint directory.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Where runs are stored [default: ~/nimbus_results beside ~/.nimbus;
    /// with NIMBUS_HOME=DIR, DIR_results].
    #[arg(long)]
    storage: Option<PathBuf>,
    /// Failures to recover from.
    #[arg(long, default_value_t = 3)]
    max_failures: u32,
    /// Restart the group from its checkpoint when a worker dies, instead of
    /// healing it from a live peer.
    #[arg(long)]
    no_peer_heal: bool,
    /// Train on GPUs (one per worker, or --gpus-per-worker); gradients go
    /// through NCCL when the program is built with `--features cuda`.
    #[arg(long)]
    use_gpu: bool,
    /// Train in bf16 (parameters, activations, gradients; averaged in
    /// bf16 by NCCL on GPUs).
    #[arg(long)]
    bf16: bool,
    /// Run the forward pass under libtorch's autocast (f16 on CUDA, as
    /// PyTorch's default; parameters and gradients stay f32); nothing on a
    /// CPU.
    #[arg(long, conflicts_with = "bf16")]
    autocast: bool,
    /// GPUs per worker with --use-gpu (0.5: two workers share a GPU).
    #[arg(long, default_value_t = 1.0)]
    gpus_per_worker: f64,
    /// Collective backend: auto, shared-memory, network (ring over QUIC)
    /// or nccl.
    #[arg(long, default_value = "auto", value_parser = ["auto", "shared-memory", "network", "nccl"])]
    collective: String,
    /// An NCCL variable for every rank of this run, NAME=VALUE (an NCCL_*
    /// name; repeatable), over the nodes' environment.
    #[arg(long = "nccl-env", value_name = "NAME=VALUE", value_parser = nccl_setting)]
    nccl_env: Vec<(String, String)>,
    /// Test knob for one-GPU machines: each rank gets its own NCCL_HOSTID,
    /// so ranks sharing the GPU form an NCCL group (over NCCL's socket
    /// transport; functional checking only).
    #[arg(long)]
    nccl_hostid_per_rank: bool,
    /// After every step, check that every worker's parameters equal rank
    /// 0's, bit for bit (the run fails otherwise).
    #[arg(long)]
    check_replicas: bool,
    /// Where the cluster is (read by nimbus::init).
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

fn main() -> Result<()> {
    let registry = Registry::new().train_loop::<MnistLoop>();
    // Worker processes run this binary too: there, init never returns (and
    // never parses the arguments); `--help` starts no cluster.
    let (driver, args) =
        nimbus::init_parsed::<Args>(registry, |_| nimbus::InitOptions::from_args(2))?;
    // Connects, runs, and on an error keeps the local cluster's node and
    // worker logs and says where.
    driver.block_on(run(&driver, args))
}

/// Rows per row group of the exported parquet files (a block each).
const EXPORT_ROWS_PER_GROUP: usize = 500;

async fn run(driver: &nimbus::Driver, args: Args) -> Result<()> {
    if let Some(dir) = &args.export_parquet {
        let samples = (args.train_samples, 1_000);
        mnist::data::parquet::write_digits(dir, samples, args.seed, EXPORT_ROWS_PER_GROUP)
            .map_err(anyhow::Error::msg)
            .context("writing the parquet files")?;
        println!(
            "summary: exported={} train={} test={}",
            dir.display(),
            samples.0,
            samples.1
        );
        return Ok(());
    }
    let data = match (&args.data_dir, &args.data) {
        (Some(dir), _) => DataSource::Dir(dir.clone()),
        (None, Some(dir)) => DataSource::Parquet(dir.clone()),
        (None, None) => DataSource::Embedded {
            train: args.train_samples,
            test: 1_000,
        },
    };
    let config = MnistConfig {
        epochs: args.epochs,
        batch_size: args.batch_size,
        lr: args.lr,
        seed: args.seed,
        data,
        fail_at_step: args.fail_at_step,
        fail_mode: FailMode::Kill,
        checkpoint_every: args.checkpoint_every,
        bf16: args.bf16,
        autocast: args.autocast,
        check_replicas: args.check_replicas,
        ..MnistConfig::default()
    };
    let described = config
        .load()
        .map_err(|e| anyhow::anyhow!("loading the data: {e}"))?;
    println!("data: {}", described.description);
    let train_len = match config.train_dataset() {
        Some(dataset) => dataset.count().await? as usize,
        None => described.train.len(),
    };
    drop(described);

    let storage = match args.storage.clone() {
        Some(storage) => storage,
        None => default_storage()?,
    };
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let name = format!("mnist-{stamp}");
    let run = RunConfig::new(&name, &storage)
        .max_failures(args.max_failures)
        .peer_heal(!args.no_peer_heal)
        // A hung or dead peer shows within 10 s (CPU steps take milliseconds).
        .collective_timeout(Duration::from_secs(10))
        .num_to_keep(2)
        .score("test_accuracy", ScoreOrder::Max);
    let backend = match args.collective.as_str() {
        "shared-memory" => CollectiveBackend::SharedMemory,
        "network" => CollectiveBackend::Network,
        "nccl" => CollectiveBackend::Nccl,
        _ => CollectiveBackend::Auto,
    };
    let mut scaling = ScalingConfig::workers(args.workers)
        .placement(PlacementStrategy::Spread)
        .collective(backend);
    if args.use_gpu {
        scaling = scaling.use_gpu(true).gpus_per_worker(args.gpus_per_worker);
    }
    for (name, value) in &args.nccl_env {
        scaling = scaling.nccl_env(name, value);
    }
    scaling = scaling.nccl_host_id_per_rank(args.nccl_hostid_per_rank);
    println!(
        "run {} with {} worker(s), cluster at {}",
        run.run_dir().display(),
        args.workers,
        driver.address()
    );

    let workers = args.workers.max(1);
    let steps_per_epoch = (train_len.div_ceil(workers)).div_ceil(args.batch_size) as u64;
    let bar = ProgressBar::new(steps_per_epoch * args.epochs);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let run_dir = run.run_dir();
    let mut state = Progress::default();
    let training_since = state.training_since.clone();
    let observer_bar = bar.clone();
    let mut trainer = Trainer::<MnistLoop>::new(config, scaling, run)
        .on_event(move |event| state.observe(event, &observer_bar, &run_dir));
    if let Some(resume) = &args.resume {
        trainer = trainer.resume_from_checkpoint(resume);
    }
    let result = trainer.fit().await;
    bar.finish_and_clear();
    let seconds = training_since
        .get()
        .map_or(f64::NAN, |t| t.elapsed().as_secs_f64());
    if let Some(error) = &result.error {
        bail!("training failed: {error}");
    }
    let history = &result.metrics_history;
    let samples: f64 = history.iter().filter_map(|m| m.get("samples")).sum();
    let last = result.metrics.clone().unwrap_or_default();
    let checkpoint = result
        .checkpoint
        .as_ref()
        .context("the run saved no checkpoint")?;
    let sha = Checkpoint::load(&checkpoint.path)?.model_sha256()?;
    let accuracy = history
        .iter()
        .rev()
        .find_map(|m| m.get("test_accuracy"))
        .copied()
        .unwrap_or(f64::NAN);
    println!(
        "results: {} (metrics.jsonl, progress.csv, loss.svg; `nimbus plot` redraws)",
        result.path.display()
    );
    println!(
        "summary: workers={} epochs={} samples_per_s={:.0} test_accuracy={:.4} final_loss={:.4} restarts={} params_sha256={} checkpoint={}",
        result.workers,
        args.epochs,
        samples / seconds,
        accuracy,
        last.get("loss").copied().unwrap_or(f64::NAN),
        result.restarts,
        sha,
        checkpoint.path.display()
    );
    Ok(())
}

/// `--data parquet:DIR`.
fn data_files(text: &str) -> Result<PathBuf, String> {
    match text.split_once(':') {
        Some(("parquet", dir)) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => Err(format!(
            "`{text}` is not parquet:DIR (the one kind of files read through nimbus Data here)"
        )),
    }
}

/// `--nccl-env NAME=VALUE`.
fn nccl_setting(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if name.starts_with("NCCL_") => {
            Ok((name.to_string(), value.to_string()))
        }
        Some((name, _)) => Err(format!("`{name}` is not an NCCL variable (NCCL_*)")),
        None => Err(format!("`{text}` is not NAME=VALUE")),
    }
}

/// Prints a line above the progress bar (or plainly, when output is not a
/// terminal and the bar is hidden).
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}

/// Turns training events into the progress bar and lines for the user.
#[derive(Default)]
struct Progress {
    failed_at: Option<Instant>,
    recovering: bool,
    /// When the first attempt started training.
    training_since: Rc<Cell<Option<Instant>>>,
}

impl Progress {
    fn observe(&mut self, event: &TrainEvent, bar: &ProgressBar, run_dir: &std::path::Path) {
        match event {
            TrainEvent::Started {
                attempt,
                workers,
                resumed_from,
                ..
            } => {
                if self.training_since.get().is_none() {
                    self.training_since.set(Some(Instant::now()));
                }
                if *attempt > 0 {
                    let from = resumed_from
                        .as_ref()
                        .map_or("the start".to_string(), |p| p.display().to_string());
                    say(
                        bar,
                        format!("restart {attempt}: {workers} worker(s) from {from}"),
                    );
                }
            }
            TrainEvent::Reported { metrics, .. } => {
                let step = metrics.get("step").copied().unwrap_or(0.0) as u64;
                bar.set_position(step);
                bar.set_message(format!(
                    "loss {:.4}",
                    metrics.get("loss").copied().unwrap_or(0.0)
                ));
                if self.recovering {
                    self.recovering = false;
                    let injected = std::fs::read_to_string(run_dir.join("injected-failure"))
                        .ok()
                        .and_then(|t| t.trim().parse::<f64>().ok());
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map(|d| d.as_secs_f64())
                        .unwrap_or(0.0);
                    let observed = self
                        .failed_at
                        .map(|t| t.elapsed())
                        .unwrap_or(Duration::ZERO);
                    match injected {
                        Some(at) => say(bar, format!(
                            "recovery: {:.2} s from the worker's death to the first step after restore ({:.2} s after the supervisor saw it)",
                            now - at,
                            observed.as_secs_f64()
                        )),
                        None => say(bar, format!(
                            "recovery: {:.2} s from the failure to the first step after restore",
                            observed.as_secs_f64()
                        )),
                    }
                }
                if let Some(accuracy) = metrics.get("test_accuracy") {
                    say(
                        bar,
                        format!(
                            "epoch {} done: loss {:.4}, test accuracy {:.4}",
                            metrics.get("epoch").copied().unwrap_or(0.0) as u64 + 1,
                            metrics.get("loss").copied().unwrap_or(0.0),
                            accuracy
                        ),
                    );
                }
            }
            TrainEvent::CheckpointSaved(saved) => {
                say(bar, format!("checkpoint {}", saved.path.display()));
            }
            TrainEvent::FaultInjected {
                fault,
                target,
                trigger,
            } => say(
                bar,
                format!("injected fault: {fault} on {target} at {trigger}"),
            ),
            TrainEvent::Rescaling { from, to } => say(
                bar,
                format!("resources are back: growing from {from} to {to} workers"),
            ),
            TrainEvent::Healing {
                ranks,
                source,
                reason,
            } => say(
                bar,
                format!("{reason}: replacing ranks {ranks:?}, their state from rank {source}"),
            ),
            TrainEvent::Healed { ranks, took } => say(
                bar,
                format!(
                    "recovery: healed from a peer in {:.2} s (death to the first step of ranks {ranks:?}), no step redone",
                    took.as_secs_f64()
                ),
            ),
            TrainEvent::Failed { attempt, reason } => {
                self.failed_at = Some(Instant::now());
                self.recovering = true;
                say(bar, format!("attempt {attempt} failed: {reason}"));
            }
        }
    }
}

/// `NAME_results` beside this user's nimbus state directory
/// (`~/nimbus_results` beside `~/.nimbus`, as Ray's `~/ray_results`),
/// private to them. Not inside it: the sandbox of the workers that write
/// the checkpoints hides the state directory from them.
fn default_storage() -> Result<PathBuf> {
    let home = files::nimbus_home();
    let name = home
        .file_name()
        .map(|name| name.to_string_lossy().trim_start_matches('.').to_string())
        .unwrap_or_else(|| "nimbus".into());
    let runs = home.with_file_name(format!("{name}_results"));
    files::private_dir(&runs).with_context(|| format!("creating {}", runs.display()))?;
    files::own_state_dir(&runs)?;
    Ok(runs)
}
