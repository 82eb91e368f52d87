//! Tune's per-trial overhead: N trivial trials, each reporting R results,
//! on a one-node local cluster (by default), at most `--concurrent` at once
//! with one CPU each. The same shape as Ray Tune's figure in issue 21
//! (100 trials × 10 results, 2 CPUs, one trial per CPU: about 1 trial/s
//! with Ray Tune 2.60 on this 2-core machine), so the two can be run side
//! by side.
//!
//! ```text
//! make run EXAMPLE=tune_bench
//! make run EXAMPLE=tune_bench ARGS="--trials 1000 --reports 10"
//! ```
//!
//! You should see `tune_trials_per_s` and `tune_results_per_s` lines and a
//! last `summary:` line; the experiment's files are in a temporary
//! directory, removed at the end.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::error::Error;

use anyhow::{ensure, Result};
use clap::Parser;
use nimbus::actor::Registry;
use nimbus::tune::{
    self, Metrics, Mode, SearchSpace, Trainable, TrialContext, TrialStatus, TuneConfig,
    TuneRegistry, Tuner,
};
use serde::Deserialize;

/// Tune's per-trial overhead: trivial trials on a local cluster (or --address).
#[derive(Parser)]
struct Args {
    /// Trials to run.
    #[arg(long, default_value_t = 100)]
    trials: usize,
    /// Results each trial reports.
    #[arg(long, default_value_t = 10)]
    reports: u64,
    /// Trials at once (one CPU each).
    #[arg(long, default_value_t = 2)]
    concurrent: usize,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

#[derive(Deserialize)]
struct Config {
    x: f64,
    reports: u64,
}

/// Reports `reports` results of a trivial function of `x`.
struct Trivial;

impl Trainable for Trivial {
    const NAME: &'static str = "tune_bench.Trivial";
    type Config = Config;
    fn run(config: Config, ctx: &mut TrialContext) -> Result<(), Box<dyn Error + Send + Sync>> {
        for i in 1..=config.reports {
            ctx.report(Metrics::from([("score".into(), config.x * i as f64)]))?;
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let (driver, args) =
        nimbus::init_parsed::<Args>(Registry::new().trainable::<Trivial>(), |_| {
            nimbus::InitOptions::from_args(1)
        })?;
    driver.block_on(async {
        let storage = tempfile::tempdir()?;
        let space = SearchSpace::new()
            .param("x", tune::uniform(0.0, 1.0))
            .param("reports", tune::constant(args.reports));
        let config = TuneConfig::new("score", Mode::Max)
            .num_samples(args.trials)
            .max_concurrent_trials(args.concurrent);
        let grid = Tuner::<Trivial>::new(space, config, "tune_bench", storage.path())
            .fit()
            .await?;
        let done = grid
            .trials
            .iter()
            .filter(|t| t.status == TrialStatus::Terminated && t.iterations == args.reports)
            .count();
        ensure!(
            done == args.trials,
            "{done} of {} trials completed",
            args.trials
        );
        let results = done as u64 * args.reports;
        println!(
            "tune_trials_per_s: {:.1} trials/s",
            done as f64 / grid.seconds
        );
        println!(
            "tune_results_per_s: {:.1} results/s",
            results as f64 / grid.seconds
        );
        println!(
            "summary: trials={done} reports={} concurrent={} seconds={:.3} trials_per_s={:.1}",
            args.reports,
            args.concurrent,
            grid.seconds,
            done as f64 / grid.seconds
        );
        Ok(())
    })
}
