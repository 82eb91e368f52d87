//! Rollouts, GAE(λ), and the PPO update (clipped surrogate, value loss,
//! entropy bonus, minibatch epochs) with an Adam whose moments are plain
//! tensors, so a saved algorithm resumes with them (tch's optimizers keep
//! theirs inside libtorch).

use nimbus_train::collective::Collective;
use nimbus_train::tch::{nn::Module, Device, Kind, Tensor};
use serde::{Deserialize, Serialize};

use super::policy::{flat, load_flat, to_vec, Net, Policy};
use super::Hyper;
use crate::error::RlError;
use crate::rng::Rng;

/// `steps × copies` transitions from one runner, time-major.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Rollout {
    /// Environment copies.
    pub copies: usize,
    /// Observations, `steps × copies × observation length`.
    pub observations: Vec<f32>,
    /// Actions.
    pub actions: Vec<u32>,
    /// Their log-probabilities under the sampling policy.
    pub log_probs: Vec<f32>,
    /// The critic's values.
    pub values: Vec<f32>,
    /// Rewards (a truncated step's includes γ·V(the state it stopped in)).
    pub rewards: Vec<f32>,
    /// Whether the episode ended after the step (terminated or truncated).
    pub dones: Vec<bool>,
    /// The values of the observations after the last step, `copies`.
    pub last_values: Vec<f32>,
}

/// Advantages and returns of a rollout by GAE(λ).
pub fn gae(rollout: &Rollout, gamma: f32, lambda: f32) -> (Vec<f32>, Vec<f32>) {
    let k = rollout.copies.max(1);
    let n = rollout.rewards.len();
    let steps = n / k;
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

/// The last minibatch's losses of an update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Losses {
    /// The clipped surrogate's.
    pub policy: f64,
    /// The critic's.
    pub value: f64,
    /// The policy's mean entropy.
    pub entropy: f64,
}

/// A learner's complete state: what `save` writes and a learner group's
/// members start from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LearnerState {
    /// The networks' shape.
    pub net: Net,
    /// The weights, in name order.
    pub params: Vec<f32>,
    /// Adam's first moments, in the same order.
    pub adam_m: Vec<f32>,
    /// Adam's second moments.
    pub adam_v: Vec<f32>,
    /// Adam's steps taken.
    pub adam_steps: u64,
    /// The minibatch shuffling's generator.
    pub rng: Rng,
}

/// PyTorch's Adam (no weight decay, no amsgrad) over every parameter at
/// once: the gradients are one flat tensor, so a step is a handful of
/// tensor operations instead of a dozen per parameter.
struct Adam {
    m: Tensor,
    v: Tensor,
    steps: u64,
}

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const ADAM_EPS: f64 = 1e-5;

impl Adam {
    fn new(len: usize) -> Self {
        Adam {
            m: Tensor::zeros([len as i64], (Kind::Float, Device::Cpu)),
            v: Tensor::zeros([len as i64], (Kind::Float, Device::Cpu)),
            steps: 0,
        }
    }

    /// One step of `variables` (in the order `grad` was flattened in).
    fn step(&mut self, variables: &[(String, Tensor)], grad: &Tensor, lr: f64) {
        self.steps += 1;
        let bias1 = 1.0 - BETA1.powi(self.steps as i32);
        let bias2 = 1.0 - BETA2.powi(self.steps as i32);
        nimbus_train::tch::no_grad(|| {
            let _ = self.m.lerp_(grad, 1.0 - BETA1);
            let _ = self.v.g_mul_scalar_(BETA2);
            let _ = self.v.addcmul_(&(grad * (1.0 - BETA2)), grad);
            let mut denom = self.v.sqrt();
            let _ = denom.g_div_scalar_(bias2.sqrt());
            let _ = denom.g_add_scalar_(ADAM_EPS);
            let update = &self.m / denom * (lr / bias1);
            let mut offset = 0;
            for (_, param) in variables {
                let n = param.numel() as i64;
                let mut param = param.shallow_clone();
                let _ = param.g_sub_(&update.narrow(0, offset, n).view(param.size().as_slice()));
                offset += n;
            }
        });
    }
}

/// The learner: the policy and its optimizer.
pub struct Learner {
    /// The policy being trained.
    pub policy: Policy,
    variables: Vec<(String, Tensor)>,
    adam: Adam,
    hyper: Hyper,
    rng: Rng,
}

impl Learner {
    /// A learner for a fresh policy.
    pub fn new(seed: u64, net: &Net, hyper: Hyper) -> Self {
        let policy = Policy::new(seed, net);
        let variables = policy.variables();
        Learner {
            adam: Adam::new(variables.iter().map(|(_, t)| t.numel()).sum()),
            variables,
            policy,
            hyper,
            rng: Rng::new(seed ^ 0x1ea2),
        }
    }

    /// Its complete state.
    pub fn state(&self, net: &Net) -> LearnerState {
        LearnerState {
            net: net.clone(),
            params: flat(self.variables.iter().map(|(_, t)| t.detach())),
            adam_m: to_vec(&self.adam.m),
            adam_v: to_vec(&self.adam.v),
            adam_steps: self.adam.steps,
            rng: self.rng.clone(),
        }
    }

    /// Takes on `state` (of a policy of the same shape).
    pub fn load(&mut self, state: &LearnerState) -> Result<(), RlError> {
        load_flat(&self.variables, &state.params)?;
        let len = self.adam.m.numel();
        for moments in [&state.adam_m, &state.adam_v] {
            if moments.len() != len {
                let why = format!("{} optimizer moments for {len} weights", moments.len());
                return Err(RlError::PolicyShape(why));
            }
        }
        self.adam.m = Tensor::from_slice(&state.adam_m);
        self.adam.v = Tensor::from_slice(&state.adam_v);
        self.adam.steps = state.adam_steps;
        self.rng = state.rng.clone();
        Ok(())
    }

    /// One PPO update from `rollouts` at learning rate `lr`; with a group,
    /// every gradient is averaged over it first, so every learner applies
    /// the same update.
    pub fn update(
        &mut self,
        rollouts: &[Rollout],
        lr: f64,
        mut group: Option<&mut dyn Collective>,
    ) -> Result<Losses, RlError> {
        let h = self.hyper.clone();
        let width = self.policy_width();
        let mut obs = Vec::new();
        let (mut actions, mut old_log_probs, mut advantages, mut returns) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rollout in rollouts {
            let (adv, ret) = gae(rollout, h.gamma, h.lambda);
            obs.extend_from_slice(&rollout.observations);
            actions.extend(rollout.actions.iter().map(|&a| i64::from(a)));
            old_log_probs.extend_from_slice(&rollout.log_probs);
            advantages.extend(adv);
            returns.extend(ret);
        }
        let n = actions.len();
        let obs = Tensor::from_slice(&obs).view([n as i64, width]);
        let actions = Tensor::from_slice(&actions);
        let old_log_probs = Tensor::from_slice(&old_log_probs);
        let advantages = Tensor::from_slice(&advantages);
        let returns = Tensor::from_slice(&returns);
        let size = n.div_ceil(h.minibatches);
        let mut last = Losses::default();
        for _ in 0..h.epochs {
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
                let clipped = -(&mb_adv * ratio.clamp(1.0 - h.clip, 1.0 + h.clip));
                let policy_loss = surrogate.maximum(&clipped).mean(Kind::Float);
                let values = self.policy.critic.forward(&mb_obs).squeeze_dim(1);
                let value_loss = (values - returns.index_select(0, &index))
                    .square()
                    .mean(Kind::Float)
                    * 0.5;
                let entropy = entropy.mean(Kind::Float);
                let loss = &policy_loss + &value_loss * h.value_coef - &entropy * h.entropy_coef;
                self.zero_grad();
                loss.backward();
                let mut grad = self.gradient();
                if let Some(group) = group.as_deref_mut() {
                    grad = average(grad, group)?;
                }
                clip_grad_norm(&mut grad, h.max_grad_norm);
                self.adam.step(&self.variables, &grad, lr);
                last = Losses {
                    policy: policy_loss.double_value(&[]),
                    value: value_loss.double_value(&[]),
                    entropy: entropy.double_value(&[]),
                };
            }
        }
        Ok(last)
    }

    fn policy_width(&self) -> i64 {
        self.variables
            .iter()
            .find(|(name, _)| name == "actor.l1.weight")
            .map_or(0, |(_, t)| t.size()[1])
    }

    fn zero_grad(&mut self) {
        for (_, variable) in &self.variables {
            let mut grad = variable.grad();
            if grad.defined() {
                let _ = grad.zero_();
            }
        }
    }

    /// Every gradient, flat, in the variables' order (zeros for one that
    /// got none).
    fn gradient(&self) -> Tensor {
        let grads: Vec<Tensor> = self
            .variables
            .iter()
            .map(|(_, v)| {
                let grad = v.grad();
                if grad.defined() {
                    grad.flatten(0, -1)
                } else {
                    v.zeros_like().flatten(0, -1)
                }
            })
            .collect();
        Tensor::cat(&grads, 0)
    }
}

/// `torch.nn.utils.clip_grad_norm_`: the gradients scaled down together so
/// their joint 2-norm is at most `max_norm`.
fn clip_grad_norm(grad: &mut Tensor, max_norm: f64) {
    let total = grad.norm().double_value(&[]);
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        let _ = grad.g_mul_scalar_(coef);
    }
}

/// The gradient's mean over the learner group, so every learner applies
/// the same update.
fn average(grad: Tensor, group: &mut dyn Collective) -> Result<Tensor, RlError> {
    let mut values = to_vec(&grad);
    group.allreduce_mean(&mut values)?;
    Ok(Tensor::from_slice(&values))
}
