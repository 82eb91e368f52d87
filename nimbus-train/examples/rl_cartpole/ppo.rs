//! The policy (actor and critic MLPs), rollouts, GAE(λ), and the PPO update
//! (clipped surrogate, value loss, entropy bonus, minibatch epochs).

use nimbus_train::collective::{Collective, CollectiveError};
use nimbus_train::tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
use nimbus_train::Params;
use serde::{Deserialize, Serialize};

use crate::cartpole::Rng;

/// Observation size and number of actions of CartPole.
const OBS: i64 = 4;
const ACTIONS: i64 = 2;
const HIDDEN: i64 = 64;

/// Actor and critic, each 4 → 64 → 64 → out with tanh.
pub struct Policy {
    /// Their variables.
    pub vs: nn::VarStore,
    actor: nn::Sequential,
    critic: nn::Sequential,
}

fn mlp(path: nn::Path, out: i64, last_gain: f64) -> nn::Sequential {
    let init = |gain: f64| nn::LinearConfig {
        ws_init: nn::Init::Orthogonal { gain },
        bs_init: Some(nn::Init::Const(0.0)),
        bias: true,
    };
    let sqrt2 = std::f64::consts::SQRT_2;
    nn::seq()
        .add(nn::linear(&path / "l1", OBS, HIDDEN, init(sqrt2)))
        .add_fn(|x| x.tanh())
        .add(nn::linear(&path / "l2", HIDDEN, HIDDEN, init(sqrt2)))
        .add_fn(|x| x.tanh())
        .add(nn::linear(&path / "l3", HIDDEN, out, init(last_gain)))
}

impl Policy {
    /// A fresh policy, its weights drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        nimbus_train::tch::manual_seed(seed as i64);
        let vs = nn::VarStore::new(Device::Cpu);
        let actor = mlp(vs.root() / "actor", ACTIONS, 0.01);
        let critic = mlp(vs.root() / "critic", 1, 1.0);
        Policy { vs, actor, critic }
    }

    fn variables(&self) -> Vec<(String, Tensor)> {
        let mut variables: Vec<_> = self.vs.variables().into_iter().collect();
        variables.sort_by(|a, b| a.0.cmp(&b.0));
        variables
    }

    /// The weights, flat, in name order.
    pub fn params(&self) -> Params {
        let mut values = Vec::new();
        for (_, tensor) in self.variables() {
            values.extend(Vec::<f32>::try_from(tensor.detach().flatten(0, -1)).unwrap_or_default());
        }
        Params::from_f32(&values)
    }

    /// Loads weights made by [`params`](Self::params).
    pub fn load(&self, params: &Params) -> Result<(), String> {
        let values = params.to_f32();
        let mut offset = 0;
        nimbus_train::tch::no_grad(|| {
            for (name, mut tensor) in self.variables() {
                let n = tensor.numel();
                let slice = values
                    .get(offset..offset + n)
                    .ok_or_else(|| format!("weights end before {name}"))?;
                tensor.copy_(&Tensor::from_slice(slice).view(tensor.size().as_slice()));
                offset += n;
            }
            if offset == values.len() {
                Ok(())
            } else {
                Err(format!("{} weights for {offset} parameters", values.len()))
            }
        })
    }

    /// Actions sampled for `k` observations, with their log-probabilities
    /// and values.
    pub fn act(&self, observations: &[f32], rng: &mut Rng) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        nimbus_train::tch::no_grad(|| {
            let obs = Tensor::from_slice(observations).view([-1, OBS]);
            let log_probs = self.actor.forward(&obs).log_softmax(-1, Kind::Float);
            let log_probs = Vec::<f32>::try_from(log_probs.flatten(0, -1)).unwrap_or_default();
            let values = self.values(observations);
            let mut actions = Vec::with_capacity(values.len());
            let mut chosen = Vec::with_capacity(values.len());
            for pair in log_probs.chunks(2) {
                let right = f64::from(pair[1]).exp();
                let action = u8::from(rng.unit() < right);
                actions.push(action);
                chosen.push(pair[action as usize]);
            }
            (actions, chosen, values)
        })
    }

    /// The critic's values of observations.
    pub fn values(&self, observations: &[f32]) -> Vec<f32> {
        nimbus_train::tch::no_grad(|| {
            let obs = Tensor::from_slice(observations).view([-1, OBS]);
            Vec::<f32>::try_from(self.critic.forward(&obs).flatten(0, -1)).unwrap_or_default()
        })
    }
}

/// `steps × envs` transitions from one runner, time-major.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rollout {
    /// Environments.
    pub envs: usize,
    /// Observations, `steps × envs × 4`.
    pub observations: Vec<f32>,
    /// Actions.
    pub actions: Vec<u8>,
    /// Their log-probabilities under the sampling policy.
    pub log_probs: Vec<f32>,
    /// The critic's values.
    pub values: Vec<f32>,
    /// Rewards (a truncated step's includes γ·V(final state)).
    pub rewards: Vec<f32>,
    /// Whether the episode ended after the step (terminated or truncated).
    pub dones: Vec<bool>,
    /// The values of the observations after the last step, `envs`.
    pub last_values: Vec<f32>,
    /// Returns of the episodes that ended in this rollout.
    pub episode_returns: Vec<f32>,
}

/// PPO's settings.
#[derive(Clone, Debug)]
pub struct PpoConfig {
    /// Discount.
    pub gamma: f32,
    /// GAE's λ.
    pub lambda: f32,
    /// Clip range of the probability ratio.
    pub clip: f64,
    /// Weight of the value loss.
    pub value_coef: f64,
    /// Weight of the entropy bonus.
    pub entropy_coef: f64,
    /// Passes over each batch.
    pub epochs: usize,
    /// Minibatches per pass.
    pub minibatches: usize,
    /// Adam's learning rate at the start (annealed linearly to 0).
    pub lr: f64,
    /// Gradient norm clip.
    pub max_grad_norm: f64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            gamma: 0.99,
            lambda: 0.95,
            clip: 0.2,
            value_coef: 0.5,
            entropy_coef: 0.0,
            epochs: 4,
            minibatches: 4,
            lr: 1e-3,
            max_grad_norm: 0.5,
        }
    }
}

/// Advantages and returns of a rollout by GAE(λ).
pub fn gae(rollout: &Rollout, gamma: f32, lambda: f32) -> (Vec<f32>, Vec<f32>) {
    let k = rollout.envs;
    let n = rollout.rewards.len();
    let steps = n / k.max(1);
    let mut advantages = vec![0.0; n];
    for e in 0..k {
        let mut last = 0.0;
        for t in (0..steps).rev() {
            let i = t * k + e;
            let next_value = if t + 1 == steps {
                rollout.last_values[e]
            } else {
                rollout.values[i + k]
            };
            let alive = if rollout.dones[i] { 0.0 } else { 1.0 };
            let delta = rollout.rewards[i] + gamma * next_value * alive - rollout.values[i];
            last = delta + gamma * lambda * alive * last;
            advantages[i] = last;
        }
    }
    let returns = advantages
        .iter()
        .zip(&rollout.values)
        .map(|(a, v)| a + v)
        .collect();
    (advantages, returns)
}

/// The learner: the policy and its optimizer.
pub struct Learner {
    /// The policy being trained.
    pub policy: Policy,
    optimizer: nn::Optimizer,
    config: PpoConfig,
    rng: Rng,
}

impl Learner {
    /// A learner for a fresh policy.
    pub fn new(seed: u64, config: PpoConfig) -> Result<Self, nimbus_train::tch::TchError> {
        let policy = Policy::new(seed);
        let optimizer = nn::Adam {
            eps: 1e-5,
            ..Default::default()
        }
        .build(&policy.vs, config.lr)?;
        Ok(Learner {
            policy,
            optimizer,
            config,
            rng: Rng::new(seed ^ 0x1ea2),
        })
    }

    /// One PPO update from `rollouts`; `progress` in [0, 1] anneals the
    /// learning rate. Returns the last minibatch's (policy loss, value
    /// loss, entropy).
    pub fn update(
        &mut self,
        rollouts: &[Rollout],
        progress: f64,
        mut group: Option<&mut dyn Collective>,
    ) -> Result<(f64, f64, f64), CollectiveError> {
        let c = self.config.clone();
        self.optimizer.set_lr(c.lr * (1.0 - progress).max(0.05));
        let mut obs = Vec::new();
        let (mut actions, mut old_log_probs, mut advantages, mut returns) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rollout in rollouts {
            let (adv, ret) = gae(rollout, c.gamma, c.lambda);
            obs.extend_from_slice(&rollout.observations);
            actions.extend(rollout.actions.iter().map(|&a| a as i64));
            old_log_probs.extend_from_slice(&rollout.log_probs);
            advantages.extend(adv);
            returns.extend(ret);
        }
        let n = actions.len();
        let obs = Tensor::from_slice(&obs).view([n as i64, OBS]);
        let actions = Tensor::from_slice(&actions);
        let old_log_probs = Tensor::from_slice(&old_log_probs);
        let advantages = Tensor::from_slice(&advantages);
        let returns = Tensor::from_slice(&returns);
        let size = n.div_ceil(c.minibatches);
        let mut last = (0.0, 0.0, 0.0);
        for _ in 0..c.epochs {
            let mut order: Vec<i64> = (0..n as i64).collect();
            for i in (1..n).rev() {
                let j = (self.rng.next_u64() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            for batch in order.chunks(size) {
                let index = Tensor::from_slice(batch);
                let mb_obs = obs.index_select(0, &index);
                let mb_adv = advantages.index_select(0, &index);
                let mb_adv = (&mb_adv - mb_adv.mean(Kind::Float)) / (mb_adv.std(true) + 1e-8);
                let log_probs = self
                    .policy
                    .actor
                    .forward(&mb_obs)
                    .log_softmax(-1, Kind::Float);
                let taken = log_probs
                    .gather(1, &actions.index_select(0, &index).unsqueeze(1), false)
                    .squeeze_dim(1);
                let entropy =
                    -(log_probs.exp() * &log_probs).sum_dim_intlist(-1, false, Kind::Float);
                let ratio = (taken - old_log_probs.index_select(0, &index)).exp();
                let surrogate = -(&mb_adv * &ratio);
                let clipped = -(&mb_adv * ratio.clamp(1.0 - c.clip, 1.0 + c.clip));
                let policy_loss = surrogate.maximum(&clipped).mean(Kind::Float);
                let values = self.policy.critic.forward(&mb_obs).squeeze_dim(1);
                let value_loss = (values - returns.index_select(0, &index))
                    .square()
                    .mean(Kind::Float)
                    * 0.5;
                let entropy = entropy.mean(Kind::Float);
                let loss = &policy_loss + &value_loss * c.value_coef - &entropy * c.entropy_coef;
                self.optimizer.zero_grad();
                loss.backward();
                if let Some(group) = group.as_deref_mut() {
                    self.average_gradients(group)?;
                }
                self.optimizer.clip_grad_norm(c.max_grad_norm);
                self.optimizer.step();
                last = (
                    policy_loss.double_value(&[]),
                    value_loss.double_value(&[]),
                    entropy.double_value(&[]),
                );
            }
        }
        Ok(last)
    }

    /// Replaces every gradient with its mean over the learner group, so
    /// every learner applies the same update.
    fn average_gradients(&mut self, group: &mut dyn Collective) -> Result<(), CollectiveError> {
        let mut variables: Vec<_> = self.policy.vs.trainable_variables();
        // trainable_variables() follows the store's creation order, the same
        // in every learner.
        let mut flat = Vec::new();
        for variable in &variables {
            flat.extend(Vec::<f32>::try_from(variable.grad().flatten(0, -1)).unwrap_or_default());
        }
        group.allreduce_mean(&mut flat)?;
        let mut offset = 0;
        nimbus_train::tch::no_grad(|| {
            for variable in &mut variables {
                let n = variable.numel();
                let mut grad = variable.grad();
                grad.copy_(
                    &Tensor::from_slice(&flat[offset..offset + n]).view(variable.size().as_slice()),
                );
                offset += n;
            }
        });
        Ok(())
    }
}
