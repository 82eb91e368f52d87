//! The learner's loop: spawn the runners spread over the nodes (and a
//! learner group, if asked), then publish weights, gather rollouts, update
//! with PPO, until solved.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use futures::future::join_all;
use nimbus::actor::{self, ActorHandle, SpawnOptions};
use nimbus::cluster::ResourceSet;
use nimbus::object_store::{self, ObjectRef};
use nimbus::placement::{InBundle, PlacementGroup, PlacementStrategy};
use nimbus_train::results::{self, ReportLine, ResultsLog};
use nimbus_train::Params;

use crate::learner_group::{JoinGroup, LearnerArgs, LearnerWorker, Update};
use crate::ppo::{Learner, Policy, PpoConfig};
use crate::runner::{Crash, EnvRunner, RunnerArgs, Sample, Sampled};

/// What to run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Environment-runner actors.
    pub runners: usize,
    /// Learners: 1 learns in this process; more form a learner group of
    /// `LearnerWorker` actors averaging gradients (runners must divide
    /// evenly among them).
    pub learners: usize,
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
    /// Write each iteration's metrics to `metrics.jsonl` and
    /// `progress.csv` in this directory, and plot the losses into
    /// `loss.svg` at the end (`nimbus_train::results`).
    pub results: Option<std::path::PathBuf>,
}

/// How it went.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Whether the target was reached.
    pub solved: bool,
    /// Mean return of the last 100 episodes at the end.
    pub mean_return_100: f32,
    /// Mean return of the first 100 episodes (of all, if fewer).
    pub first_mean_return_100: f32,
    /// Environment steps taken.
    pub env_steps: u64,
    /// Seconds from the first rollout to the end.
    pub seconds: f64,
    /// Restarts of the runners' processes, from the head's records.
    pub runner_restarts: u32,
    /// Rollout calls lost with a runner's process (and asked again).
    pub lost_calls: u32,
    /// The nodes the runners ran on.
    pub runner_nodes: Vec<String>,
}

/// One rollout from `runner`; when it dies, its node restarts it and the
/// rollout is asked of the new incarnation.
async fn sample(
    index: usize,
    runner: &ActorHandle<EnvRunner>,
    weights: &ObjectRef<Params>,
    lost_calls: &Cell<u32>,
) -> Result<Sampled> {
    for _ in 0..3 {
        let sample = Sample {
            weights: weights.clone(),
        };
        match runner.send(sample).await {
            Ok(Ok(sampled)) => return Ok(sampled),
            Ok(Err(e)) => bail!("runner {index} failed: {e}"),
            Err(e) => {
                println!("runner {index} lost ({e}); its node restarts it");
                lost_calls.set(lost_calls.get() + 1);
            }
        }
    }
    bail!("runner {index} kept dying")
}

/// Who learns.
enum Learners {
    /// This process.
    Local(Box<Learner>),
    /// A learner group: the workers, their placement group, and the
    /// weights rank 0 published last.
    Group {
        workers: Vec<ActorHandle<LearnerWorker>>,
        placement: PlacementGroup,
        weights: ObjectRef<Params>,
    },
}

impl Learners {
    async fn start(args: &Settings, config: PpoConfig) -> Result<Self> {
        if args.learners <= 1 {
            return Ok(Learners::Local(Box::new(Learner::new(args.seed, config)?)));
        }
        if args.runners % args.learners != 0 {
            bail!(
                "{} runners do not divide evenly among {} learners",
                args.runners,
                args.learners
            );
        }
        // Packed on one host: the group averages through shared memory.
        let bundles = vec![ResourceSet::of("CPU", 0.5); args.learners];
        let placement = PlacementGroup::create(
            bundles,
            PlacementStrategy::StrictPack,
            std::time::Duration::from_secs(30),
        )
        .await?;
        let segment = std::path::Path::new("/dev/shm").join(format!(
            "rl-learners-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let mut workers = Vec::new();
        for rank in 0..args.learners {
            let learner_args = LearnerArgs {
                seed: args.seed,
                rank,
                world: args.learners,
                segment: segment.clone(),
            };
            let options = SpawnOptions::default()
                .name(format!("learner-{rank}"))
                .num_cpus(0.5)
                .in_bundle(&placement, rank)?;
            workers.push(actor::spawn::<LearnerWorker>(learner_args, options).await?);
        }
        for joined in join_all(workers.iter().map(|w| w.send(JoinGroup))).await {
            joined?.map_err(anyhow::Error::msg)?;
        }
        // Every learner starts from the same seeded policy: publish it.
        let weights = object_store::put(&Policy::new(args.seed).params()).await?;
        Ok(Learners::Group {
            workers,
            placement,
            weights,
        })
    }

    /// The weights to sample with.
    async fn weights(&self) -> Result<ObjectRef<Params>> {
        match self {
            Learners::Local(learner) => Ok(object_store::put(&learner.policy.params()).await?),
            Learners::Group { weights, .. } => Ok(weights.clone()),
        }
    }

    /// One update; the local learner also returns its losses.
    async fn update(&mut self, sampled: &[Sampled], progress: f64) -> Result<(f64, f64, f64)> {
        match self {
            Learners::Local(learner) => {
                let mut rollouts = Vec::new();
                for s in sampled {
                    rollouts.push(object_store::get(&s.rollout).await?);
                }
                Ok(learner.update(&rollouts, progress, None)?)
            }
            Learners::Group {
                workers, weights, ..
            } => {
                let n = workers.len();
                let updates = workers.iter().enumerate().map(|(rank, worker)| {
                    let rollouts = sampled
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| i % n == rank)
                        .map(|(_, s)| s.rollout.clone())
                        .collect();
                    worker.send(Update { rollouts, progress })
                });
                let replies = join_all(updates).await;
                // The group's losses: the mean of its learners'.
                let mut sum = (0.0, 0.0, 0.0);
                for (rank, reply) in replies.into_iter().enumerate() {
                    let ((policy, value, entropy), published) =
                        reply?.map_err(anyhow::Error::msg)?;
                    sum = (sum.0 + policy, sum.1 + value, sum.2 + entropy);
                    if rank == 0 {
                        *weights = published.context("rank 0 publishes the weights")?;
                    }
                }
                let n = n as f64;
                Ok((sum.0 / n, sum.1 / n, sum.2 / n))
            }
        }
    }

    async fn stop(self) {
        if let Learners::Group {
            workers, placement, ..
        } = self
        {
            for worker in &workers {
                let _ = worker.kill().await;
            }
            let _ = placement.remove().await;
        }
    }
}

/// Trains until solved or out of steps.
pub async fn train(args: &Settings) -> Result<Outcome> {
    nimbus_train::tch::set_num_threads(1);
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
    let mut learners = Learners::start(args, config).await?;
    let per_iteration = (args.runners * args.envs_per_runner * args.rollout_steps) as u64;
    let mut returns: VecDeque<f32> = VecDeque::new();
    let lost_calls = Cell::new(0);
    let mut first_100: Vec<f32> = Vec::new();
    let (mut env_steps, mut iteration) = (0u64, 0u64);
    let mut results = match &args.results {
        Some(dir) => Some(ResultsLog::open(dir)?),
        None => None,
    };
    let started = Instant::now();
    let mean = |r: &VecDeque<f32>| r.iter().sum::<f32>() / r.len().max(1) as f32;
    let solved = loop {
        iteration += 1;
        let weights = learners.weights().await.context("publishing the weights")?;
        if Some(iteration) == args.kill_runner_at_iter {
            println!("killing env-runner-0's worker process (SIGKILL)");
            runners[0].do_send(Crash)?;
        }
        let sampled: Vec<Sampled> = join_all(
            runners
                .iter()
                .enumerate()
                .map(|(i, r)| sample(i, r, &weights, &lost_calls)),
        )
        .await
        .into_iter()
        .collect::<Result<_>>()?;
        for s in &sampled {
            for &r in &s.episode_returns {
                if first_100.len() < 100 {
                    first_100.push(r);
                }
                returns.push_back(r);
                if returns.len() > 100 {
                    returns.pop_front();
                }
            }
        }
        env_steps += per_iteration;
        let progress = env_steps as f64 / args.max_env_steps as f64;
        let (policy, value, entropy) = learners.update(&sampled, progress).await?;
        let seconds = started.elapsed().as_secs_f64();
        let mean_100 = mean(&returns);
        if let Some(log) = &mut results {
            let metrics = BTreeMap::from([
                ("mean_return_100".to_string(), f64::from(mean_100)),
                ("env_steps".to_string(), env_steps as f64),
                ("seconds".to_string(), seconds),
                ("policy_loss".to_string(), policy),
                ("value_loss".to_string(), value),
                ("entropy".to_string(), entropy),
            ]);
            log.append(&ReportLine::now(iteration, 0, metrics))?;
        }
        if args.verbose {
            println!(
                "iter {iteration:4} mean_return_100 {mean_100:6.1} episodes {:3} env_steps {env_steps:7} env_steps_per_s {:6.0} seconds {seconds:5.1} policy_loss {policy:+.3} value_loss {value:.3} entropy {entropy:.3}",
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
    let mut runner_restarts = 0;
    for runner in &runners {
        runner_restarts += runner.record().await.map_or(0, |r| r.restarts);
        let _ = runner.kill().await;
    }
    let _ = group.remove().await;
    learners.stop().await;
    if let Some(dir) = &args.results {
        results::plot(dir)?;
    }
    Ok(Outcome {
        solved,
        mean_return_100: mean(&returns),
        first_mean_return_100: first_100.iter().sum::<f32>() / first_100.len().max(1) as f32,
        env_steps,
        seconds: started.elapsed().as_secs_f64(),
        runner_restarts,
        lost_calls: lost_calls.get(),
        runner_nodes,
    })
}
