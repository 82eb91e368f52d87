//! PPO on CartPole-v1 with nimbus RL: `EnvRunner` actors (each in a worker
//! process, spread over the cluster's nodes, each stepping k environments
//! with the current policy) collect rollouts; the learner (this driver, or
//! a learner group with `--learners 2`) updates the policy and publishes
//! the new weights once through the object store. A runner that dies is
//! restarted by its node and training goes on.
//!
//! ```text
//! make run EXAMPLE=rl_cartpole
//! make run EXAMPLE=rl_cartpole ARGS="--runners 2 --envs-per-runner 8 --seed 3 --kill-runner-at-iter 20"
//! ```
//!
//! One line per iteration (mean return of the last 100 episodes, env
//! steps, env steps/s, seconds, losses), then `summary: solved=...
//! mean_return_100=... first_mean_return_100=... env_steps=... seconds=...
//! env_steps_per_s=... runners=... learners=... runner_restarts=...
//! lost_calls=...` (`first_mean_return_100`: the first 100 episodes;
//! `runner_restarts`: the runners' restarts as the head recorded them;
//! `lost_calls`: rollouts asked again after their runner died). Solved
//! means a mean return of at least 475 over the last 100 episodes. Each
//! iteration's metrics also go to `metrics.jsonl` and `progress.csv` in a
//! run directory under `--storage` (default `~/.nimbus/runs`), with the
//! losses plotted into its `loss.svg` at the end: the line `results:`
//! names it.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use nimbus_rl::envs::CartPole;
use nimbus_rl::PpoConfig;
use nimbus_train::results::{self, ReportLine, ResultsLog};

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
    /// Give up after this many environment steps (the learning rate
    /// anneals over them).
    #[arg(long, default_value_t = 1_000_000)]
    max_env_steps: u64,
    /// Stop once the mean return of the last 100 episodes reaches this.
    #[arg(long, default_value_t = 475.0)]
    target: f64,
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
    let registry = nimbus_rl::register(nimbus::actor::Registry::new());
    let (driver, args) =
        nimbus::init_parsed::<Args>(registry, |_| nimbus::InitOptions::from_args(2))?;
    // Connects, runs, and on an error keeps the local cluster's node and
    // worker logs and says where.
    driver.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let storage = match args.storage {
        Some(storage) => storage,
        None => {
            let runs = nimbus::host::files::nimbus_home().join("runs");
            nimbus::host::files::private_dir(&runs)?;
            runs
        }
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let run_dir = storage.join(format!("cartpole-{stamp}"));
    let mut log = ResultsLog::open(&run_dir)?;
    let mut algo = PpoConfig::new()
        .environment::<CartPole>(())
        .env_runners(args.runners)
        .envs_per_runner(args.envs_per_runner)
        .rollout_length(args.rollout_steps)
        .learners(args.learners)
        .lr_anneal(Some(args.max_env_steps))
        .seed(args.seed)
        .build()
        .await?;
    let mut nodes = Vec::new();
    for (i, runner) in algo.runners().iter().enumerate() {
        let node = runner.record().await?.node.name;
        println!("env-runner-{i} on {node}");
        nodes.push(node);
    }
    let started = Instant::now();
    let mut first_100 = Vec::new();
    let mut lost_calls = 0;
    let (solved, m) = loop {
        if Some(algo.iteration() + 1) == args.kill_runner_at_iter {
            println!("killing env-runner-0's worker process (SIGKILL)");
            algo.crash_runner(0)?;
        }
        let m = algo.train().await?;
        lost_calls += m.lost_rollouts;
        let room = 100 - first_100.len().min(100);
        first_100.extend(m.episode_returns.iter().take(room));
        let seconds = started.elapsed().as_secs_f64();
        let values = BTreeMap::from([
            ("mean_return_100".to_string(), m.episode_return_mean),
            ("env_steps".to_string(), m.env_steps_sampled as f64),
            ("seconds".to_string(), seconds),
            ("policy_loss".to_string(), m.losses.policy),
            ("value_loss".to_string(), m.losses.value),
            ("entropy".to_string(), m.losses.entropy),
        ]);
        log.append(&ReportLine::now(m.iteration, 0, values))?;
        println!(
            "iter {:4} mean_return_100 {:6.1} env_steps {:7} env_steps_per_s {:6.0} seconds {seconds:5.1} sample_s {:.3} learn_s {:.3} policy_loss {:+.3} value_loss {:.3} entropy {:.3}",
            m.iteration,
            m.episode_return_mean,
            m.env_steps_sampled,
            m.env_steps_sampled as f64 / seconds,
            m.sample_s,
            m.learn_s,
            m.losses.policy,
            m.losses.value,
            m.losses.entropy
        );
        let done = m.env_steps_sampled >= args.max_env_steps;
        let reached = first_100.len() >= 100 && m.episode_return_mean >= args.target;
        if reached || done {
            break (reached, m);
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut runner_restarts = 0;
    for runner in algo.runners() {
        runner_restarts += runner.record().await.map_or(0, |r| r.restarts);
    }
    algo.stop().await;
    results::plot(&run_dir)?;
    println!("runners ran on: {}", nodes.join(", "));
    println!(
        "results: {} (metrics.jsonl, progress.csv, loss.svg)",
        run_dir.display()
    );
    println!(
        "summary: solved={solved} mean_return_100={:.1} first_mean_return_100={:.1} env_steps={} seconds={seconds:.1} env_steps_per_s={:.0} runners={} learners={} runner_restarts={runner_restarts} lost_calls={lost_calls}",
        m.episode_return_mean,
        first_100.iter().sum::<f64>() / first_100.len().max(1) as f64,
        m.env_steps_sampled,
        m.env_steps_sampled as f64 / seconds,
        args.runners,
        args.learners,
    );
    Ok(())
}
