//! PPO on CartPole-v1, RLlib-style: `EnvRunner` actors (each in a worker
//! process, spread over the cluster's nodes, each stepping k environments
//! with the current policy) collect rollouts; the learner (this driver)
//! updates the policy with PPO and publishes the new weights once through
//! the object store, where every runner fetches them. A runner that dies is
//! restarted by its node and training goes on.
//!
//! ```text
//! make run EXAMPLE=rl_cartpole
//! make run EXAMPLE=rl_cartpole ARGS="--runners 2 --envs-per-runner 8 --seed 3 --kill-runner-at-iter 20"
//! ```
//!
//! One line per iteration (mean return of the last 100 episodes, env
//! steps, env steps/s, seconds), then `summary: solved=... mean_return_100=...
//! env_steps=... seconds=... env_steps_per_s=... runners=... runner_restarts=...
//! lost_calls=...` (`first_mean_return_100`: the first 100 episodes;
//! `runner_restarts`: the runners' restarts as the head recorded them;
//! `lost_calls`: rollouts asked again after their runner died).
//! Solved means a mean return of at least 475 over the last 100 episodes.
//! Each iteration's metrics also go to `metrics.jsonl` and `progress.csv`
//! in a run directory under `--storage` (default `~/.nimbus/runs`), with
//! the losses plotted into its `loss.svg` at the end: the line `results:`
//! names it.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod cartpole;
mod learner_group;
mod ppo;
mod runner;
mod training;

use anyhow::Result;
use clap::Parser;
use training::Settings;

#[derive(Parser, Debug)]
#[command(about = "PPO on CartPole-v1 with environment-runner actors", long_about = None)]
struct Args {
    /// Environment-runner actors.
    #[arg(long, default_value_t = 2)]
    runners: usize,
    /// Learners: more than 1 forms a learner group averaging gradients
    /// (runners must divide evenly among them).
    #[arg(long, default_value_t = 1)]
    learners: usize,
    /// Environments per runner.
    #[arg(long, default_value_t = 8)]
    envs_per_runner: usize,
    /// Steps per environment per iteration.
    #[arg(long, default_value_t = 64)]
    rollout_steps: usize,
    /// Seeds the policy, the environments and the sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up after this many environment steps.
    #[arg(long, default_value_t = 1_000_000)]
    max_env_steps: u64,
    /// Stop once the mean return of the last 100 episodes reaches this.
    #[arg(long, default_value_t = 475.0)]
    target: f32,
    /// Kill runner 0's worker process at this iteration.
    #[arg(long)]
    kill_runner_at_iter: Option<u64>,
    /// Where the run directory (`cartpole-MILLIS`) with the metrics goes
    /// (default: `runs/` in $NIMBUS_HOME, else ~/.nimbus).
    #[arg(long)]
    storage: Option<std::path::PathBuf>,
    /// Where the cluster is (read by nimbus::init).
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

fn main() -> Result<()> {
    // Worker processes run this binary too: there, init never returns (and
    // never parses the arguments); `--help` starts no cluster.
    let (driver, args) =
        nimbus::init_parsed::<Args>(runner::registry(), |_| nimbus::InitOptions::from_args(2))?;
    // Connects, runs, and on an error keeps the local cluster's node and
    // worker logs and says where.
    driver.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let storage = match args.storage {
        Some(storage) => storage,
        None => {
            let runs = nimbus::cluster::files::nimbus_home().join("runs");
            nimbus::cluster::files::private_dir(&runs)?;
            runs
        }
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let run_dir = storage.join(format!("cartpole-{stamp}"));
    let settings = Settings {
        runners: args.runners,
        learners: args.learners,
        envs_per_runner: args.envs_per_runner,
        rollout_steps: args.rollout_steps,
        seed: args.seed,
        max_env_steps: args.max_env_steps,
        target: args.target,
        kill_runner_at_iter: args.kill_runner_at_iter,
        verbose: true,
        results: Some(run_dir.clone()),
    };
    let outcome = training::train(&settings).await?;
    println!("runners ran on: {}", outcome.runner_nodes.join(", "));
    println!(
        "results: {} (metrics.jsonl, progress.csv, loss.svg)",
        run_dir.display()
    );
    println!(
        "summary: solved={} mean_return_100={:.1} first_mean_return_100={:.1} env_steps={} seconds={:.1} env_steps_per_s={:.0} runners={} learners={} runner_restarts={} lost_calls={}",
        outcome.solved,
        outcome.mean_return_100,
        outcome.first_mean_return_100,
        outcome.env_steps,
        outcome.seconds,
        outcome.env_steps as f64 / outcome.seconds,
        args.runners,
        args.learners,
        outcome.runner_restarts,
        outcome.lost_calls
    );
    Ok(())
}
