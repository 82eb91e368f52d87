//! The learner's loop: spawn the runners spread over the nodes, then
//! publish weights, gather rollouts, update with PPO, until solved.

use std::cell::Cell;
use std::collections::VecDeque;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use futures::future::join_all;
use nimbus::actor::{self, ActorHandle, SpawnOptions};
use nimbus::cluster::ResourceSet;
use nimbus::object_store::{self, ObjectRef};
use nimbus::placement::{PlacementGroup, PlacementStrategy};
use nimbus::train::Params;

use crate::ppo::{Learner, PpoConfig, Rollout};
use crate::runner::{Crash, EnvRunner, RunnerArgs, Sample};

/// What to run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Environment-runner actors.
    pub runners: usize,
    /// Environments per runner.
    pub envs_per_runner: usize,
    /// Steps per environment per iteration.
    pub rollout_steps: usize,
    /// Seeds everything.
    pub seed: u64,
    /// Give up after this many environment steps.
    pub max_env_steps: u64,
    /// Stop once the mean return of the last 100 episodes reaches this.
    pub target: f32,
    /// Kill runner 0's worker process at this iteration.
    pub kill_runner_at_iter: Option<u64>,
    /// Print a line per iteration.
    pub verbose: bool,
}

/// How it went.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Whether the target was reached.
    pub solved: bool,
    /// Mean return of the last 100 episodes at the end.
    pub mean_return_100: f32,
    /// Mean return of the first 100 episodes.
    pub first_mean_return_100: f32,
    /// Environment steps taken.
    pub env_steps: u64,
    /// Seconds from the first rollout to the end.
    pub seconds: f64,
    /// Runner deaths recovered from.
    pub runner_restarts: u32,
    /// The nodes the runners ran on.
    pub runner_nodes: Vec<String>,
}

/// One rollout from `runner`; when it dies, its node restarts it and the
/// rollout is asked of the new incarnation.
async fn sample(
    index: usize,
    runner: &ActorHandle<EnvRunner>,
    weights: &ObjectRef<Params>,
    restarts: &Cell<u32>,
) -> Result<Rollout> {
    for _ in 0..3 {
        let sample = Sample {
            weights: weights.clone(),
        };
        match runner.send(sample).await {
            Ok(Ok(rollout)) => return Ok(object_store::get(&rollout).await?),
            Ok(Err(e)) => bail!("runner {index} failed: {e}"),
            Err(e) => {
                println!("runner {index} lost ({e}); its node restarts it");
                restarts.set(restarts.get() + 1);
            }
        }
    }
    bail!("runner {index} kept dying")
}

/// Trains until solved or out of steps.
pub async fn train(args: &Settings) -> Result<Outcome> {
    nimbus::tch::set_num_threads(1);
    let config = PpoConfig::default();
    // One bundle per runner, spread over the nodes.
    let bundles = vec![ResourceSet::of("CPU", 0.5); args.runners];
    let group = PlacementGroup::create(
        bundles,
        PlacementStrategy::Spread,
        std::time::Duration::from_secs(30),
    )
    .await?;
    let mut runners = Vec::new();
    let mut runner_nodes = Vec::new();
    for i in 0..args.runners {
        let runner_args = RunnerArgs {
            envs: args.envs_per_runner,
            steps: args.rollout_steps,
            seed: args.seed.wrapping_mul(7919).wrapping_add(i as u64),
            gamma: config.gamma,
        };
        let options = SpawnOptions::default()
            .name(format!("env-runner-{i}"))
            .num_cpus(0.5)
            .max_restarts(100)
            .in_bundle(&group, i)?;
        let runner = actor::spawn::<EnvRunner>(runner_args, options).await?;
        let node = runner.record().await?.node.name;
        if args.verbose {
            println!("env-runner-{i} on {node}");
        }
        runner_nodes.push(node);
        runners.push(runner);
    }
    let mut learner = Learner::new(args.seed, config)?;
    let per_iteration = (args.runners * args.envs_per_runner * args.rollout_steps) as u64;
    let mut returns: VecDeque<f32> = VecDeque::new();
    let restarts = Cell::new(0);
    let mut first_mean = None;
    let (mut env_steps, mut iteration) = (0u64, 0u64);
    let started = Instant::now();
    let mean = |r: &VecDeque<f32>| r.iter().sum::<f32>() / r.len().max(1) as f32;
    let solved = loop {
        iteration += 1;
        let weights = object_store::put(&learner.policy.params())
            .await
            .context("publishing the weights")?;
        if Some(iteration) == args.kill_runner_at_iter {
            println!("killing env-runner-0's worker process (SIGKILL)");
            runners[0].do_send(Crash)?;
        }
        let rollouts: Vec<Rollout> = join_all(
            runners
                .iter()
                .enumerate()
                .map(|(i, r)| sample(i, r, &weights, &restarts)),
        )
        .await
        .into_iter()
        .collect::<Result<_>>()?;
        for rollout in &rollouts {
            for &r in &rollout.episode_returns {
                returns.push_back(r);
                if returns.len() > 100 {
                    returns.pop_front();
                }
            }
        }
        env_steps += per_iteration;
        let progress = env_steps as f64 / args.max_env_steps as f64;
        let (policy_loss, value_loss, entropy) = learner.update(&rollouts, progress);
        let seconds = started.elapsed().as_secs_f64();
        let mean_100 = mean(&returns);
        if returns.len() >= 100 && first_mean.is_none() {
            first_mean = Some(mean_100);
        }
        if args.verbose {
            println!(
            "iter {iteration:4} mean_return_100 {mean_100:6.1} episodes {:3} env_steps {env_steps:7} env_steps_per_s {:6.0} seconds {seconds:5.1} policy_loss {policy_loss:+.3} value_loss {value_loss:.3} entropy {entropy:.3}",
            returns.len(),
            env_steps as f64 / seconds
        );
        }
        if returns.len() >= 100 && mean_100 >= args.target {
            break true;
        }
        if env_steps >= args.max_env_steps {
            break false;
        }
    };
    for runner in &runners {
        let _ = runner.kill().await;
    }
    let _ = group.remove().await;
    Ok(Outcome {
        solved,
        mean_return_100: mean(&returns),
        first_mean_return_100: first_mean.unwrap_or(mean(&returns)),
        env_steps,
        seconds: started.elapsed().as_secs_f64(),
        runner_restarts: restarts.get(),
        runner_nodes,
    })
}
