//! A running algorithm: its env runners, its learners, and the loop of
//! iterations (RLlib's `Algorithm`).
//!
//! One `train()` iteration:
//! 1. publish the weights (one object, read by every runner);
//! 2. every runner samples a rollout; a runner lost meanwhile is started
//!    again by its node and asked again (`MAX_LOST_PER_ITERATION` times
//!    per runner per iteration), its episode in flight dropped and counted
//!    (`lost_rollouts`);
//! 3. the learner (here, or the learner group) updates on the rollouts at
//!    the scheduled learning rate;
//! 4. the metrics: the episodes that ended, over the last 100.
//!
//! `save(dir)` writes `algorithm.json` (counters, settings, the last
//! returns) and `learner.msgpack` (weights, Adam's moments, generator) as
//! `.partial` files renamed into place; `restore` starts from them with
//! the config given, which may have other runner and learner counts.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::future::join_all;
use nimbus::actor::{self, ActorHandle, SpawnOptions};
use nimbus::cluster::ResourceSet;
use nimbus::object_store::{self, ObjectRef};
use nimbus::placement::{InBundle, PlacementGroup, PlacementStrategy};
use nimbus_train::Params;
use serde::{Deserialize, Serialize};

use crate::error::RlError;
use crate::group::{GetState, JoinGroup, LearnerArgs, LearnerWorker, Update};
use crate::ppo::{Learner, LearnerState, Losses, Net, Policy, PpoConfig};
use crate::runner::{Crash, EnvRunner, RunnerArgs, Sample, Sampled};
use crate::space::Action;
use crate::vector::{Episode, VectorEnv};

/// How often one runner may be lost within one iteration before the
/// iteration fails.
const MAX_LOST_PER_ITERATION: u32 = 3;
/// How long placing the runners or learners may take.
const PLACEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Episodes the mean return is taken over.
const WINDOW: usize = 100;

/// One iteration's metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterationMetrics {
    /// Iterations so far (this one included).
    pub iteration: u64,
    /// Mean return of the last 100 episodes (of all, if fewer).
    pub episode_return_mean: f64,
    /// The lowest of those returns.
    pub episode_return_min: f64,
    /// The highest.
    pub episode_return_max: f64,
    /// Mean length of those episodes.
    pub episode_len_mean: f64,
    /// Returns of the episodes that ended in this iteration.
    pub episode_returns: Vec<f64>,
    /// Environment steps sampled in all.
    pub env_steps_sampled: u64,
    /// Environment steps trained on in all.
    pub env_steps_trained: u64,
    /// Seconds sampling took in this iteration.
    pub sample_s: f64,
    /// Seconds the update took.
    pub learn_s: f64,
    /// The update's last minibatch's losses.
    pub losses: Losses,
    /// The learning rate of this update.
    pub lr: f64,
    /// Rollouts lost with their runner's process in this iteration (and
    /// asked again).
    pub lost_rollouts: u32,
}

/// What `save` writes besides the learner's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Saved {
    algorithm: String,
    env: String,
    net: Net,
    iteration: u64,
    env_steps: u64,
    recent: Vec<Episode>,
}

/// Who learns.
enum Learners {
    /// The driver.
    Local(Box<Learner>),
    /// A learner group: the workers and their placement group.
    Group {
        workers: Vec<ActorHandle<LearnerWorker>>,
        placement: PlacementGroup,
    },
}

/// A PPO run on the cluster.
pub struct Algorithm {
    config: PpoConfig,
    net: Net,
    runners: Vec<ActorHandle<EnvRunner>>,
    placement: PlacementGroup,
    learners: Learners,
    /// The current weights: the local learner's, or rank 0's last.
    weights: Option<ObjectRef<Params>>,
    /// The policy in the driver, for `compute_action` and `evaluate`.
    policy: Policy,
    iteration: u64,
    env_steps: u64,
    recent: VecDeque<Episode>,
}

impl Algorithm {
    /// Starts runners and learners for a checked config (step 0), from a
    /// fresh policy.
    pub(crate) async fn start(config: PpoConfig, net: Net) -> Result<Self, RlError> {
        let learner = Learner::new(config.seed, &net, config.hyper.clone());
        let state = learner.state(&net);
        let saved = Saved::fresh(&net);
        Self::start_from(config, net, state, saved).await
    }

    async fn start_from(
        config: PpoConfig,
        net: Net,
        state: LearnerState,
        saved: Saved,
    ) -> Result<Self, RlError> {
        nimbus_train::tch::set_num_threads(1);
        let Some(env) = config.env.clone() else {
            return Err(RlError::Setting {
                setting: "environment",
                why: "no environment was given".into(),
            });
        };
        let bundles = vec![ResourceSet::of("CPU", config.runner_cpus); config.runners];
        let placement =
            PlacementGroup::create(bundles, PlacementStrategy::Spread, PLACEMENT_TIMEOUT).await?;
        let mut runners = Vec::new();
        for index in 0..config.runners {
            let args = RunnerArgs {
                index,
                env: env.name.to_string(),
                env_config: env.config.to_string(),
                copies: config.envs_per_runner,
                rollout_length: config.rollout_length,
                seed: config
                    .seed
                    .wrapping_mul(7919)
                    .wrapping_add(index as u64)
                    .wrapping_add(saved.iteration.wrapping_mul(104_729)),
                gamma: config.hyper.gamma,
                net: net.clone(),
            };
            let options = SpawnOptions::default()
                .name(format!("env-runner-{index}-{:x}", rand::random::<u32>()))
                .num_cpus(config.runner_cpus)
                .max_restarts(config.max_runner_restarts)
                .in_bundle(&placement, index)?;
            runners.push(actor::spawn::<EnvRunner>(args, options).await?);
        }
        let policy = Policy::new(0, &net);
        policy.load(&Params::from_f32(&state.params))?;
        let learners = if config.learners <= 1 {
            let mut learner = Learner::new(0, &net, config.hyper.clone());
            learner.load(&state)?;
            Learners::Local(Box::new(learner))
        } else {
            Self::start_group(&config, state).await?
        };
        let weights = Some(object_store::put(&policy.params()).await?);
        Ok(Algorithm {
            recent: saved.recent.into_iter().collect(),
            iteration: saved.iteration,
            env_steps: saved.env_steps,
            config,
            net,
            runners,
            placement,
            learners,
            weights,
            policy,
        })
    }

    /// A learner group packed on one host (its collective is shared
    /// memory), every member starting from `state`.
    async fn start_group(config: &PpoConfig, state: LearnerState) -> Result<Learners, RlError> {
        let bundles = vec![ResourceSet::of("CPU", 0.5); config.learners];
        let placement =
            PlacementGroup::create(bundles, PlacementStrategy::StrictPack, PLACEMENT_TIMEOUT)
                .await?;
        let segment = nimbus::library::job_shared_memory().join(format!(
            "nimbus-rl-learners-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let mut workers = Vec::new();
        for rank in 0..config.learners {
            let args = LearnerArgs {
                state: state.clone(),
                hyper: config.hyper.clone(),
                rank,
                world: config.learners,
                segment: segment.clone(),
            };
            let options = SpawnOptions::default()
                .name(format!("learner-{rank}-{:x}", rand::random::<u32>()))
                .num_cpus(0.5)
                .in_bundle(&placement, rank)?;
            workers.push(actor::spawn::<LearnerWorker>(args, options).await?);
        }
        for (rank, joined) in join_all(workers.iter().map(|w| w.send(JoinGroup)))
            .await
            .into_iter()
            .enumerate()
        {
            joined?.map_err(|why| RlError::Actor {
                actor: format!("learner-{rank}"),
                why,
            })?;
        }
        Ok(Learners::Group { workers, placement })
    }

    /// One iteration: sample, update, report (steps 1–4).
    pub async fn train(&mut self) -> Result<IterationMetrics, RlError> {
        let weights = match &self.weights {
            Some(weights) => weights.clone(),
            None => object_store::put(&self.policy.params()).await?,
        };
        let started = Instant::now();
        let sampled = join_all(
            self.runners
                .iter()
                .enumerate()
                .map(|(i, runner)| sample(i, runner, &weights)),
        )
        .await;
        let mut rollouts = Vec::new();
        let (mut lost_rollouts, mut steps) = (0, 0);
        let mut episode_returns = Vec::new();
        for result in sampled {
            let (sampled, lost) = result?;
            lost_rollouts += lost;
            episode_returns.extend(sampled.episodes.iter().map(|e| e.ret));
            steps += sampled.env_steps;
            for episode in &sampled.episodes {
                self.recent.push_back(*episode);
                if self.recent.len() > WINDOW {
                    self.recent.pop_front();
                }
            }
            rollouts.push(sampled);
        }
        let sample_s = started.elapsed().as_secs_f64();
        let lr = self.config.lr_at(self.env_steps);
        let started = Instant::now();
        let losses = self.update(&rollouts, lr).await?;
        let learn_s = started.elapsed().as_secs_f64();
        self.env_steps += steps;
        self.iteration += 1;
        let returns: Vec<f64> = self.recent.iter().map(|e| e.ret).collect();
        let count = returns.len().max(1) as f64;
        Ok(IterationMetrics {
            iteration: self.iteration,
            episode_return_mean: returns.iter().sum::<f64>() / count,
            episode_return_min: returns.iter().copied().fold(f64::INFINITY, f64::min),
            episode_return_max: returns.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            episode_len_mean: self.recent.iter().map(|e| f64::from(e.len)).sum::<f64>() / count,
            episode_returns,
            env_steps_sampled: self.env_steps,
            env_steps_trained: self.env_steps,
            sample_s,
            learn_s,
            losses,
            lr,
            lost_rollouts,
        })
    }

    /// The update (step 3); the new weights are published for the next
    /// iteration and loaded into the driver's policy.
    async fn update(&mut self, sampled: &[Sampled], lr: f64) -> Result<Losses, RlError> {
        match &mut self.learners {
            Learners::Local(learner) => {
                let mut rollouts = Vec::new();
                for s in sampled {
                    rollouts.push(object_store::get(&s.rollout).await?);
                }
                let losses = learner.update(&rollouts, lr, None)?;
                let params = learner.policy.params();
                self.policy.load(&params)?;
                self.weights = Some(object_store::put(&params).await?);
                Ok(losses)
            }
            Learners::Group { workers, .. } => {
                let n = workers.len();
                let updates = workers.iter().enumerate().map(|(rank, worker)| {
                    let rollouts = sampled
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| i % n == rank)
                        .map(|(_, s)| s.rollout.clone())
                        .collect();
                    worker.send(Update { rollouts, lr })
                });
                let replies = join_all(updates).await;
                let mut sum = Losses::default();
                for (rank, reply) in replies.into_iter().enumerate() {
                    let (losses, published) = reply?.map_err(|why| RlError::Actor {
                        actor: format!("learner-{rank}"),
                        why,
                    })?;
                    sum.policy += losses.policy / n as f64;
                    sum.value += losses.value / n as f64;
                    sum.entropy += losses.entropy / n as f64;
                    if let Some(weights) = published {
                        self.policy.load(&object_store::get(&weights).await?)?;
                        self.weights = Some(weights);
                    }
                }
                Ok(sum)
            }
        }
    }

    /// The policy's most likely action for one observation.
    pub fn compute_action(&self, observation: &[f32]) -> Result<Action, RlError> {
        if observation.len() as i64 != self.net.observations {
            return Err(RlError::PolicyShape(format!(
                "an observation of {} values for a policy of {}",
                observation.len(),
                self.net.observations
            )));
        }
        let action = self.policy.greedy(observation);
        Ok(Action::Discrete(action.first().copied().unwrap_or(0)))
    }

    /// Mean return of `episodes` episodes of the greedy policy, stepped in
    /// this process on its own copies (seeded apart from the runners').
    pub fn evaluate(&self, episodes: usize) -> Result<f64, RlError> {
        let Some(env) = &self.config.env else {
            return Ok(0.0);
        };
        let copies = episodes.clamp(1, 16);
        let mut envs = Vec::with_capacity(copies);
        for _ in 0..copies {
            envs.push((env.make)(&env.config).map_err(|e| RlError::Build {
                env: env.name.to_string(),
                why: e.to_string(),
            })?);
        }
        let seed = self.config.seed ^ 0xe7a1 ^ self.iteration;
        let mut vector = VectorEnv::new(env.name, envs, seed, "evaluation")?;
        let mut returns = Vec::new();
        while returns.len() < episodes {
            let actions: Vec<Action> = self
                .policy
                .greedy(&vector.observations())
                .into_iter()
                .map(Action::Discrete)
                .collect();
            let step = vector.step(&actions)?;
            returns.extend(step.episodes.iter().map(|e| e.ret));
        }
        returns.truncate(episodes);
        Ok(returns.iter().sum::<f64>() / returns.len().max(1) as f64)
    }

    /// Iterations so far.
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// The env runners (e.g. to watch their records).
    pub fn runners(&self) -> &[ActorHandle<EnvRunner>] {
        &self.runners
    }

    /// Fault injection: runner `index`'s process dies at once.
    pub fn crash_runner(&self, index: usize) -> Result<(), RlError> {
        match self.runners.get(index) {
            Some(runner) => Ok(runner.do_send(Crash)?),
            None => Err(RlError::Setting {
                setting: "env_runners",
                why: format!("there is no runner {index} of {}", self.runners.len()),
            }),
        }
    }

    /// Writes the algorithm's state into `dir` (created if missing).
    pub async fn save(&self, dir: &Path) -> Result<(), RlError> {
        let state = match &self.learners {
            Learners::Local(learner) => learner.state(&self.net),
            Learners::Group { workers, .. } => {
                workers[0]
                    .send(GetState)
                    .await?
                    .map_err(|why| RlError::Actor {
                        actor: "learner-0".into(),
                        why,
                    })?
            }
        };
        let env = self.config.env.as_ref().map_or("", |e| e.name);
        let saved = Saved {
            algorithm: "PPO".into(),
            env: env.to_string(),
            net: self.net.clone(),
            iteration: self.iteration,
            env_steps: self.env_steps,
            recent: self.recent.iter().copied().collect(),
        };
        std::fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
        let json = serde_json::to_vec_pretty(&saved).map_err(|e| restore(dir, e))?;
        let bytes = rmp_serde::to_vec(&state).map_err(|e| restore(dir, e))?;
        write_atomically(&dir.join(LEARNER_FILE), &bytes)?;
        write_atomically(&dir.join(ALGORITHM_FILE), &json)
    }

    /// Starts from what `save` wrote in `dir`, with `config` (the same
    /// environment and network; runner and learner counts may differ).
    pub async fn restore(config: PpoConfig, dir: &Path) -> Result<Self, RlError> {
        let net = config.check()?;
        let json = std::fs::read(dir.join(ALGORITHM_FILE))
            .map_err(|source| io(&dir.join(ALGORITHM_FILE), source))?;
        let saved: Saved = serde_json::from_slice(&json).map_err(|e| restore(dir, e))?;
        let env = config.env.as_ref().map_or("", |e| e.name);
        if saved.algorithm != "PPO" || saved.env != env {
            let why = format!(
                "it holds {} on {}, not PPO on {env}",
                saved.algorithm, saved.env
            );
            return Err(RlError::Restore {
                path: dir.to_path_buf(),
                why,
            });
        }
        if saved.net != net {
            let why = format!("its policy is {:?}, the config's {net:?}", saved.net);
            return Err(RlError::Restore {
                path: dir.to_path_buf(),
                why,
            });
        }
        let bytes = std::fs::read(dir.join(LEARNER_FILE))
            .map_err(|source| io(&dir.join(LEARNER_FILE), source))?;
        let state: LearnerState = rmp_serde::from_slice(&bytes).map_err(|e| restore(dir, e))?;
        Self::start_from(config, net, state, saved).await
    }

    /// Stops the runners and learners and gives back their resources.
    pub async fn stop(self) {
        for runner in &self.runners {
            let _ = runner.kill().await;
        }
        let _ = self.placement.remove().await;
        if let Learners::Group { workers, placement } = self.learners {
            for worker in &workers {
                let _ = worker.kill().await;
            }
            let _ = placement.remove().await;
        }
    }
}

impl Saved {
    fn fresh(net: &Net) -> Self {
        Saved {
            algorithm: "PPO".into(),
            env: String::new(),
            net: net.clone(),
            iteration: 0,
            env_steps: 0,
            recent: Vec::new(),
        }
    }
}

/// The saved counters and settings.
const ALGORITHM_FILE: &str = "algorithm.json";
/// The saved learner state.
const LEARNER_FILE: &str = "learner.msgpack";

fn io(path: &Path, source: std::io::Error) -> RlError {
    RlError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn restore(dir: &Path, why: impl std::fmt::Display) -> RlError {
    RlError::Restore {
        path: dir.to_path_buf(),
        why: why.to_string(),
    }
}

/// Writes `path.partial`, syncs it, and renames it to `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RlError> {
    let partial = PathBuf::from(format!("{}.partial", path.display()));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&partial, path)
    };
    write().map_err(|source| io(path, source))
}

/// One rollout from runner `index`; when its process dies, its node starts
/// it again and the rollout is asked of the new incarnation (step 2).
/// Returns the rollout and how often it was lost.
async fn sample(
    index: usize,
    runner: &ActorHandle<EnvRunner>,
    weights: &ObjectRef<Params>,
) -> Result<(Sampled, u32), RlError> {
    let actor = format!("env-runner-{index}");
    for lost in 0..=MAX_LOST_PER_ITERATION {
        let sample = Sample {
            weights: weights.clone(),
        };
        match runner.send(sample).await {
            Ok(Ok(sampled)) => return Ok((sampled, lost)),
            Ok(Err(why)) => return Err(RlError::Actor { actor, why }),
            Err(e) => tracing::warn!("{actor} lost ({e}); its node starts it again"),
        }
    }
    Err(RlError::KeptDying {
        actor,
        times: MAX_LOST_PER_ITERATION + 1,
    })
}
