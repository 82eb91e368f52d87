//! Hyperparameter search for the MNIST CNN of `train_mnist`: learning rate
//! (log-uniform), momentum (uniform) and batch size (a choice), each trial
//! training the CNN for up to `--epochs` epochs in a trial runner (a worker
//! process, reused from trial to trial) and reporting its test accuracy
//! after each epoch with a checkpoint of its weights.
//!
//! ```text
//! make run EXAMPLE=tune_mnist
//! make run EXAMPLE=tune_mnist ARGS="--searcher tpe"
//! make run EXAMPLE=tune_mnist ARGS="--scheduler pbt --samples 4 --concurrent 4"
//! make run EXAMPLE=tune_mnist ARGS="--data-dir ../shared/data/mnist-t10k"
//! ```
//!
//! With no `--address` it starts a one-node local cluster. By default ASHA
//! (grace period 1 epoch, reduction factor 2, `max_t` = `--epochs`) stops
//! trials that fall behind; `--scheduler hyperband` does so in two brackets
//! (the second cuts first after 2 epochs); `--scheduler pbt` evolves the population
//! instead (a weak trial takes a strong one's weights and a perturbed copy
//! of its learning rate and momentum after each epoch), `--scheduler fifo`
//! runs every trial to the end. With no `--data-dir` it trains on the
//! embedded generated digits (`--train-samples`, 1,000 test samples). A
//! progress table goes to standard error every 5 s; the experiment's
//! files are under `--storage` (a temporary directory by default, removed
//! at the end). A resumed trial (a retry, an exploit) reloads its weights;
//! its optimizer's momentum starts afresh.
//!
//! The last line is `summary: trials=16 completed=... stopped_early=...
//! best_accuracy=... best_config=... seconds=...` (seconds of the whole
//! experiment, its runners' start included).

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[allow(dead_code)]
#[path = "train_mnist/mnist.rs"]
mod mnist;

use std::error::Error;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Parser;
use nimbus::actor::Registry;
use nimbus::tune::{
    self, Metrics, Mode, PbtConfig, SchedulerConfig, SearchConfig, SearchSpace, Trainable,
    TrialContext, TrialStatus, TuneConfig, TuneRegistry, Tuner,
};
use nimbus_train::tch::{nn, nn::ModuleT, nn::OptimizerConfig, Device, Kind, Tensor};
use serde::Deserialize;

use mnist::{accuracy, network, DataSource, MnistConfig};

/// Hyperparameter search for the MNIST CNN on a local cluster (or --address).
#[derive(Parser)]
struct Args {
    /// Trials (configs drawn).
    #[arg(long, default_value_t = 16)]
    samples: usize,
    /// Trials at once (one CPU each).
    #[arg(long, default_value_t = 2)]
    concurrent: usize,
    /// Epochs per trial at most.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// random (and grid) or tpe.
    #[arg(long, default_value = "random", value_parser = ["random", "tpe"])]
    searcher: String,
    /// asha, hyperband, pbt or fifo.
    #[arg(long, default_value = "asha", value_parser = ["asha", "hyperband", "pbt", "fifo"])]
    scheduler: String,
    /// Seeds the search, the weights and the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// MNIST-format idx files; default: embedded generated digits.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Embedded data: training samples.
    #[arg(long, default_value_t = 4_000)]
    train_samples: usize,
    /// Where the experiment is kept [default: a temporary directory,
    /// removed at the end].
    #[arg(long)]
    storage: Option<PathBuf>,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

/// One trial's config: the searched parameters and the fixed ones.
#[derive(Deserialize)]
struct TrialConfig {
    lr: f64,
    momentum: f64,
    batch_size: i64,
    epochs: u64,
    seed: u64,
    data: DataSource,
}

/// Trains the CNN on one thread, an epoch per result.
struct MnistTrial;

impl Trainable for MnistTrial {
    const NAME: &'static str = "examples.TuneMnist";
    type Config = TrialConfig;
    fn run(
        config: TrialConfig,
        ctx: &mut TrialContext,
    ) -> Result<(), Box<dyn Error + Send + Sync>> {
        nimbus_train::tch::set_num_threads(1);
        nimbus_train::tch::manual_seed(config.seed as i64);
        let data = MnistConfig {
            seed: config.seed,
            data: config.data.clone(),
            ..MnistConfig::default()
        }
        .load()?;
        let mut vs = nn::VarStore::new(Device::Cpu);
        let net = network(&vs.root());
        let sgd = nn::Sgd {
            momentum: config.momentum,
            ..Default::default()
        };
        let mut optimizer = sgd.build(&vs, config.lr)?;
        // A retry or an exploit goes on from a checkpoint's weights.
        if let Some(weights) = ctx.restore::<serde_bytes::ByteBuf>()? {
            vs.load_from_stream(std::io::Cursor::new(weights.into_vec()))?;
        }
        let n = data.train.len() as i64;
        let batch = config.batch_size.max(1);
        while ctx.iteration() < config.epochs {
            let epoch = ctx.iteration();
            nimbus_train::tch::manual_seed((config.seed + epoch) as i64);
            let order = Tensor::randperm(n, (Kind::Int64, Device::Cpu));
            let order: Vec<i64> = Vec::try_from(&order)?;
            let mut losses = Vec::new();
            for chunk in order.chunks(batch as usize) {
                let indices: Vec<usize> = chunk.iter().map(|i| *i as usize).collect();
                let (images, labels) = data.train.batch(&indices);
                let loss = net
                    .forward_t(&images, true)
                    .cross_entropy_for_logits(&labels);
                optimizer.backward_step(&loss);
                losses.push(loss.double_value(&[]));
            }
            let accuracy = accuracy(&net, &data, Device::Cpu, Kind::Float);
            let loss = losses.iter().sum::<f64>() / losses.len().max(1) as f64;
            let mut weights = Vec::new();
            vs.save_to_stream(&mut weights)?;
            let metrics = Metrics::from([("accuracy".into(), accuracy), ("loss".into(), loss)]);
            ctx.report_with_checkpoint(metrics, &serde_bytes::ByteBuf::from(weights))?;
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let registry = Registry::new().trainable::<MnistTrial>();
    let (driver, args) =
        nimbus::init_parsed::<Args>(registry, |_| nimbus::InitOptions::from_args(1))?;
    driver.block_on(async {
        let data = match &args.data_dir {
            Some(dir) => DataSource::Dir(dir.clone()),
            None => DataSource::Embedded {
                train: args.train_samples,
                test: 1_000,
            },
        };
        let space = SearchSpace::new()
            .param("lr", tune::loguniform(1e-4, 1e-1))
            .param("momentum", tune::uniform(0.1, 0.99))
            .param("batch_size", tune::choice([32, 64, 128]))
            .param("epochs", tune::constant(args.epochs))
            .param("seed", tune::constant(args.seed))
            .param("data", tune::constant(&data));
        let scheduler = match args.scheduler.as_str() {
            "asha" => SchedulerConfig::Asha {
                grace_period: 1,
                reduction_factor: 2.0,
                max_t: args.epochs,
            },
            "hyperband" => SchedulerConfig::HyperBand {
                grace_period: 1,
                reduction_factor: 2.0,
                max_t: args.epochs,
                brackets: 2,
            },
            "pbt" => SchedulerConfig::Pbt(PbtConfig {
                seed: args.seed,
                ..PbtConfig::new(
                    1,
                    vec![
                        ("lr".into(), tune::loguniform(1e-4, 1e-1)),
                        ("momentum".into(), tune::uniform(0.1, 0.99)),
                    ],
                )
            }),
            _ => SchedulerConfig::Fifo,
        };
        let search = match args.searcher.as_str() {
            "tpe" => SearchConfig::Tpe(tune::TpeConfig {
                n_startup_trials: (args.samples / 3).max(1),
                ..Default::default()
            }),
            _ => SearchConfig::Basic,
        };
        let config = TuneConfig::new("accuracy", Mode::Max)
            .num_samples(args.samples)
            .max_concurrent_trials(args.concurrent)
            .scheduler(scheduler)
            .search(search)
            .seed(args.seed);
        let temporary = tempfile::tempdir()?;
        let storage = args.storage.clone().unwrap_or_else(|| temporary.path().into());
        let name = format!("tune_mnist-{}-{}", args.searcher, args.scheduler);
        let grid = Tuner::<MnistTrial>::new(space, config, &name, storage)
            .fit()
            .await?;
        if let Some(failed) = grid.errors().next() {
            bail!("trial {} failed: {:?}", failed.id, failed.error);
        }
        let completed = grid
            .trials
            .iter()
            .filter(|t| t.status == TrialStatus::Terminated)
            .count();
        let stopped = grid.trials.iter().filter(|t| t.stopped_early).count();
        let Some(best) = grid.best_result() else {
            bail!("no trial reported: {grid:?}");
        };
        let best_accuracy = best.last.as_ref().map_or(0.0, |l| l["accuracy"]);
        let best_config = format!(
            "lr={:.5},momentum={:.3},batch_size={}",
            best.config["lr"].as_f64().unwrap_or_default(),
            best.config["momentum"].as_f64().unwrap_or_default(),
            best.config["batch_size"]
        );
        println!(
            "summary: trials={} completed={completed} stopped_early={stopped} best_accuracy={best_accuracy:.4} best_config={best_config} seconds={:.1}",
            grid.trials.len(),
            grid.seconds
        );
        Ok(())
    })
}
