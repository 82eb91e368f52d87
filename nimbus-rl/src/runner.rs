//! The `EnvRunner` actor: `k` copies of the environment stepped with the
//! latest policy, each rollout returned through the object store.
//!
//! 1. Started (one worker process each) with the environment's registered
//!    name and JSON config; it builds its copies on its first `Sample`, as
//!    the program's registry is installed after the actor is created, and
//!    a build failure is that call's error.
//! 2. `Sample { weights }`: fetch the weights (one object per update, read
//!    by every runner), step every copy `rollout_length` times, put the
//!    rollout in the object store, answer where it is and the episodes
//!    that ended.
//! 3. A runner that dies is started again by its node (up to
//!    `max_runner_restarts`) with a fresh set of copies; the learner asks
//!    the new incarnation for the rollout again.

use actix::prelude::*;
use nimbus::actor::{RemoteActor, RemoteMessage};
use nimbus::object_store::{self, ObjectRef};
use nimbus_train::Params;
use serde::{Deserialize, Serialize};

use crate::env::EnvTable;
use crate::error::RlError;
use crate::ppo::{Net, Policy, Rollout};
use crate::rng::Rng;
use crate::space::Action;
use crate::vector::{Episode, VectorEnv};

/// An [`EnvRunner`]'s constructor arguments.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunnerArgs {
    /// Its index among the runners.
    pub index: usize,
    /// The environment's registered name.
    pub env: String,
    /// Its config, JSON.
    pub env_config: String,
    /// Copies.
    pub copies: usize,
    /// Steps per copy per rollout.
    pub rollout_length: usize,
    /// Seeds its copies and its sampling.
    pub seed: u64,
    /// Discount, for the bootstrap of truncated episodes.
    pub gamma: f32,
    /// The policy's shape.
    pub net: Net,
}

/// Steps `k` copies of an environment with the latest policy.
pub struct EnvRunner {
    args: RunnerArgs,
    built: Option<(VectorEnv, Policy)>,
    rng: Rng,
}

impl Actor for EnvRunner {
    type Context = Context<Self>;
}

impl RemoteActor for EnvRunner {
    const NAME: &'static str = "nimbus_rl.EnvRunner";
    type Args = RunnerArgs;
    fn from_args(args: RunnerArgs) -> Self {
        nimbus_train::tch::set_num_threads(1);
        EnvRunner {
            rng: Rng::new(args.seed ^ 0xac7),
            args,
            built: None,
        }
    }
}

impl EnvRunner {
    fn owner(&self) -> String {
        format!("env-runner-{}", self.args.index)
    }

    /// Its copies and policy, built on first use (step 1).
    fn build(&mut self) -> Result<&mut (VectorEnv, Policy), RlError> {
        if self.built.is_none() {
            let a = &self.args;
            let registry =
                nimbus::library::registry().ok_or_else(|| RlError::NotRegistered(a.env.clone()))?;
            let make = EnvTable::lookup(&registry, &a.env)
                .ok_or_else(|| RlError::NotRegistered(a.env.clone()))?;
            let config: serde_json::Value =
                serde_json::from_str(&a.env_config).map_err(|e| RlError::Build {
                    env: a.env.clone(),
                    why: e.to_string(),
                })?;
            let mut envs = Vec::with_capacity(a.copies);
            for _ in 0..a.copies {
                envs.push(make(&config).map_err(|e| RlError::Build {
                    env: a.env.clone(),
                    why: e.to_string(),
                })?);
            }
            let vector = VectorEnv::new(&a.env, envs, a.seed, &self.owner())?;
            self.built = Some((vector, Policy::new(0, &a.net)));
        }
        self.built
            .as_mut()
            .ok_or_else(|| RlError::NotRegistered(self.args.env.clone()))
    }

    /// Steps every copy `rollout_length` times with the loaded policy.
    fn rollout(&mut self, weights: &Params) -> Result<(Rollout, Vec<Episode>), RlError> {
        let (steps, gamma) = (self.args.rollout_length, self.args.gamma);
        let mut rng = self.rng.clone();
        let (envs, policy) = self.build()?;
        policy.load(weights)?;
        let mut rollout = Rollout {
            copies: envs.len(),
            ..Rollout::default()
        };
        let mut episodes = Vec::new();
        for _ in 0..steps {
            let observations = envs.observations();
            let (actions, log_probs, values) = policy.act(&observations, &mut rng);
            let chosen: Vec<Action> = actions.iter().map(|&a| Action::Discrete(a)).collect();
            let step = envs.step(&chosen)?;
            for (i, reward) in step.rewards.iter().enumerate() {
                let mut reward = *reward as f32;
                if let Some(last) = &step.final_observations[i] {
                    // Not a real end: bootstrap from the state it stopped in.
                    reward += gamma * policy.values(last)[0];
                }
                rollout.rewards.push(reward);
                rollout.dones.push(step.terminated[i] || step.truncated[i]);
            }
            episodes.extend(step.episodes);
            rollout.observations.extend(observations);
            rollout.actions.extend(actions);
            rollout.log_probs.extend(log_probs);
            rollout.values.extend(values);
        }
        rollout.last_values = policy.values(&envs.observations());
        self.rng = rng;
        Ok((rollout, episodes))
    }
}

/// What a runner sends back: where its rollout is, and the episodes that
/// ended in it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sampled {
    /// The rollout, in the runner's node's object store.
    pub rollout: ObjectRef<Rollout>,
    /// The episodes that ended.
    pub episodes: Vec<Episode>,
    /// Environment steps taken (all copies).
    pub env_steps: u64,
}

/// Load these weights, collect a rollout, and put it in the object store
/// (step 2).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Sampled, String>")]
pub struct Sample {
    /// The policy's weights.
    pub weights: ObjectRef<Params>,
}

impl RemoteMessage for Sample {
    const NAME: &'static str = "nimbus_rl.Sample";
}

impl Handler<Sample> for EnvRunner {
    type Result = ResponseActFuture<Self, Result<Sampled, String>>;

    fn handle(&mut self, sample: Sample, _: &mut Context<Self>) -> Self::Result {
        let fetch = async move { object_store::get(&sample.weights).await };
        Box::pin(
            fetch
                .into_actor(self)
                .map(|weights, runner, _| {
                    let weights = weights.map_err(|e| e.to_string())?;
                    runner.rollout(&weights).map_err(|e| e.to_string())
                })
                .then(|rollout, runner, _| {
                    async move {
                        let (rollout, episodes) = rollout?;
                        let env_steps = rollout.rewards.len() as u64;
                        let rollout = object_store::put(&rollout)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok(Sampled {
                            rollout,
                            episodes,
                            env_steps,
                        })
                    }
                    .into_actor(runner)
                }),
        )
    }
}

/// Fault injection: the runner's process dies at once (SIGKILL), as a lost
/// process would, for testing that sampling goes on (step 3).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Crash;

impl RemoteMessage for Crash {
    const NAME: &'static str = "nimbus_rl.Crash";
}

impl Handler<Crash> for EnvRunner {
    type Result = ();
    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        // SAFETY: a plain syscall on this process.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}
