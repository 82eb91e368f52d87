//! The `EnvRunner` actor: k CartPoles stepped with the latest policy, its
//! rollouts returned through the object store.

use actix::prelude::*;
use nimbus::actor::{self, RemoteActor, RemoteMessage};
use nimbus::object_store::{self, ObjectRef};
use nimbus_train::Params;
use serde::{Deserialize, Serialize};

use crate::cartpole::{Rng, VecCartPole};
use crate::ppo::{Policy, Rollout};

/// Steps `k` CartPoles with the latest policy.
pub struct EnvRunner {
    envs: VecCartPole,
    policy: Policy,
    rng: Rng,
    steps: usize,
    gamma: f32,
}

/// An [`EnvRunner`]'s constructor arguments.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunnerArgs {
    /// Environments.
    pub envs: usize,
    /// Steps per environment per rollout.
    pub steps: usize,
    /// Seeds its environments and its sampling.
    pub seed: u64,
    /// Discount, for the bootstrap of truncated episodes.
    pub gamma: f32,
}

impl Actor for EnvRunner {
    type Context = Context<Self>;
}

impl RemoteActor for EnvRunner {
    const NAME: &'static str = "examples.EnvRunner";
    type Args = RunnerArgs;
    fn from_args(args: RunnerArgs) -> Self {
        nimbus_train::tch::set_num_threads(1);
        EnvRunner {
            envs: VecCartPole::new(args.envs, args.seed),
            policy: Policy::new(0),
            rng: Rng::new(args.seed ^ 0xac7),
            steps: args.steps,
            gamma: args.gamma,
        }
    }
}

impl EnvRunner {
    /// Steps every environment `steps` times with the loaded policy.
    fn rollout(&mut self) -> Rollout {
        let k = self.envs.envs.len();
        let mut rollout = Rollout {
            envs: k,
            ..Rollout::default()
        };
        for _ in 0..self.steps {
            let observations = self.envs.observations();
            let (actions, log_probs, values) = self.policy.act(&observations, &mut self.rng);
            for (e, env) in self.envs.envs.iter_mut().enumerate() {
                let step = env.step(actions[e]);
                let mut reward = step.reward;
                self.envs.returns[e] += step.reward;
                if step.truncated {
                    // Not a real end: bootstrap from the state it stopped in.
                    let state = env.state().map(|v| v as f32);
                    reward += self.gamma * self.policy.values(&state)[0];
                }
                if step.terminated || step.truncated {
                    rollout.episode_returns.push(self.envs.returns[e]);
                    self.envs.returns[e] = 0.0;
                    env.reset();
                }
                rollout.rewards.push(reward);
                rollout.dones.push(step.terminated || step.truncated);
            }
            rollout.observations.extend(observations);
            rollout.actions.extend(actions);
            rollout.log_probs.extend(log_probs);
            rollout.values.extend(values);
        }
        rollout.last_values = self.policy.values(&self.envs.observations());
        rollout
    }
}

/// What a runner sends back: where its rollout is, and the returns of the
/// episodes that ended in it (for the learner's statistics).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sampled {
    /// The rollout, in the runner's node's object store.
    pub rollout: ObjectRef<Rollout>,
    /// Returns of the episodes that ended.
    pub episode_returns: Vec<f32>,
}

/// Load these weights, collect a rollout, and put it in the object store.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Sampled, String>")]
pub struct Sample {
    /// The policy's weights.
    pub weights: ObjectRef<Params>,
}

impl RemoteMessage for Sample {
    const NAME: &'static str = "examples.Sample";
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
                    runner.policy.load(&weights)?;
                    Ok(runner.rollout())
                })
                .then(|rollout: Result<Rollout, String>, runner, _| {
                    async move {
                        let rollout = rollout?;
                        let episode_returns = rollout.episode_returns.clone();
                        let rollout = object_store::put(&rollout)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok(Sampled {
                            rollout,
                            episode_returns,
                        })
                    }
                    .into_actor(runner)
                }),
        )
    }
}

/// Die at once: SIGKILL this worker process (the `--kill-runner-at-iter`
/// demonstration of a runner lost mid-training).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Crash;

impl RemoteMessage for Crash {
    const NAME: &'static str = "examples.Crash";
}

impl Handler<Crash> for EnvRunner {
    type Result = ();
    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        // SAFETY: plain syscall on this process.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// The runner, the learner group and their messages, for `nimbus::init`.
pub fn registry() -> actor::Registry {
    use crate::learner_group::{JoinGroup, LearnerWorker, Update};
    actor::Registry::new()
        .actor::<EnvRunner>()
        .message::<EnvRunner, Sample>()
        .message::<EnvRunner, Crash>()
        .actor::<LearnerWorker>()
        .message::<LearnerWorker, JoinGroup>()
        .message::<LearnerWorker, Update>()
}
