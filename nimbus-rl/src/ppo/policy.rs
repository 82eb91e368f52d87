//! The policy: an actor network (logits of a categorical distribution over
//! the discrete actions) and a critic (the state's value), each an MLP with
//! tanh, orthogonally initialised as in CleanRL's and RLlib's PPO.

use nimbus_train::tch::{nn, nn::Module, Device, Kind, Tensor};
use nimbus_train::Params;
use serde::{Deserialize, Serialize};

use crate::error::RlError;
use crate::rng::Rng;

/// The networks' shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Net {
    /// Observation length.
    pub observations: i64,
    /// Number of discrete actions.
    pub actions: i64,
    /// Hidden layer widths (the same for actor and critic).
    pub hidden: Vec<i64>,
}

/// Actor and critic.
pub struct Policy {
    pub(crate) vs: nn::VarStore,
    pub(crate) actor: nn::Sequential,
    pub(crate) critic: nn::Sequential,
    net: Net,
}

fn mlp(path: nn::Path, net: &Net, out: i64, last_gain: f64) -> nn::Sequential {
    let init = |gain: f64| nn::LinearConfig {
        ws_init: nn::Init::Orthogonal { gain },
        bs_init: Some(nn::Init::Const(0.0)),
        bias: true,
    };
    let mut seq = nn::seq();
    let mut width = net.observations;
    for (i, &hidden) in net.hidden.iter().enumerate() {
        let layer = nn::linear(
            &path / format!("l{}", i + 1),
            width,
            hidden,
            init(2f64.sqrt()),
        );
        seq = seq.add(layer).add_fn(|x| x.tanh());
        width = hidden;
    }
    let last = format!("l{}", net.hidden.len() + 1);
    seq.add(nn::linear(&path / last, width, out, init(last_gain)))
}

impl Policy {
    /// A fresh policy, its weights drawn from `seed`.
    pub fn new(seed: u64, net: &Net) -> Self {
        nimbus_train::tch::manual_seed(seed as i64);
        let vs = nn::VarStore::new(Device::Cpu);
        let actor = mlp(vs.root() / "actor", net, net.actions, 0.01);
        let critic = mlp(vs.root() / "critic", net, 1, 1.0);
        Policy {
            vs,
            actor,
            critic,
            net: net.clone(),
        }
    }

    /// Its variables in name order (the order of [`params`](Self::params)).
    pub(crate) fn variables(&self) -> Vec<(String, Tensor)> {
        let mut variables: Vec<_> = self.vs.variables().into_iter().collect();
        variables.sort_by(|a, b| a.0.cmp(&b.0));
        variables
    }

    /// The weights, flat, in name order.
    pub fn params(&self) -> Params {
        Params::from_f32(&flat(self.variables().iter().map(|(_, t)| t.detach())))
    }

    /// Loads weights made by [`params`](Self::params) of a policy of the
    /// same shape.
    pub fn load(&self, params: &Params) -> Result<(), RlError> {
        load_flat(&self.variables(), &params.to_f32())
    }

    fn observations(&self, observations: &[f32]) -> Tensor {
        Tensor::from_slice(observations).view([-1, self.net.observations])
    }

    /// Actions sampled for a batch of observations, with their
    /// log-probabilities and the critic's values.
    pub fn act(&self, observations: &[f32], rng: &mut Rng) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
        nimbus_train::tch::no_grad(|| {
            let obs = self.observations(observations);
            let log_probs = self.actor.forward(&obs).log_softmax(-1, Kind::Float);
            let log_probs = to_vec(&log_probs);
            let values = self.values(observations);
            let n = self.net.actions as usize;
            let mut actions = Vec::with_capacity(values.len());
            let mut chosen = Vec::with_capacity(values.len());
            for row in log_probs.chunks(n) {
                let u = rng.unit();
                let mut cumulative = 0.0;
                let mut action = n - 1;
                for (a, lp) in row.iter().enumerate() {
                    cumulative += f64::from(*lp).exp();
                    if u < cumulative {
                        action = a;
                        break;
                    }
                }
                actions.push(action as u32);
                chosen.push(row[action]);
            }
            (actions, chosen, values)
        })
    }

    /// The most likely action for each observation.
    pub fn greedy(&self, observations: &[f32]) -> Vec<u32> {
        nimbus_train::tch::no_grad(|| {
            let logits = self.actor.forward(&self.observations(observations));
            let best = logits.argmax(-1, false);
            Vec::<i64>::try_from(best)
                .unwrap_or_default()
                .into_iter()
                .map(|a| a as u32)
                .collect()
        })
    }

    /// The critic's values of a batch of observations.
    pub fn values(&self, observations: &[f32]) -> Vec<f32> {
        nimbus_train::tch::no_grad(|| {
            to_vec(&self.critic.forward(&self.observations(observations)))
        })
    }
}

/// A tensor's values, flat.
pub(crate) fn to_vec(tensor: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(tensor.flatten(0, -1)).unwrap_or_default()
}

/// The values of `tensors`, one after another.
pub(crate) fn flat(tensors: impl Iterator<Item = Tensor>) -> Vec<f32> {
    let mut values = Vec::new();
    for tensor in tensors {
        values.extend(to_vec(&tensor));
    }
    values
}

/// Copies `values` into `variables`, in order; their sizes must add up.
pub(crate) fn load_flat(variables: &[(String, Tensor)], values: &[f32]) -> Result<(), RlError> {
    let mut offset = 0;
    nimbus_train::tch::no_grad(|| {
        for (name, tensor) in variables {
            let n = tensor.numel();
            let slice = values
                .get(offset..offset + n)
                .ok_or_else(|| RlError::PolicyShape(format!("the weights end before {name}")))?;
            let mut target = tensor.shallow_clone();
            target.copy_(&Tensor::from_slice(slice).view(tensor.size().as_slice()));
            offset += n;
        }
        if offset == values.len() {
            Ok(())
        } else {
            Err(RlError::PolicyShape(format!(
                "{} weights for a policy of {offset}",
                values.len()
            )))
        }
    })
}
