//! SGD with momentum whose state can be checkpointed (tch's optimizers keep
//! their momentum buffers inside libtorch, out of reach of a checkpoint,
//! and bit-exact resume needs them).

use tch::Tensor;

use super::checkpoint::Checkpoint;
use super::context::DistributedModel;
use super::TrainError;

/// PyTorch's `torch.optim.SGD` (dampening 0, no Nesterov, no weight decay):
/// `buf = momentum·buf + grad` (`buf = grad` on the first step), then
/// `param -= lr·buf`.
pub struct Sgd {
    params: Vec<(String, Tensor)>,
    buffers: Vec<Option<Tensor>>,
    lr: f64,
    momentum: f64,
}

/// Checkpoint key prefix of the momentum buffers.
const PREFIX: &str = "optimizer.momentum.";

impl Sgd {
    /// An optimizer for `model`'s parameters.
    pub fn new(model: &DistributedModel, lr: f64, momentum: f64) -> Self {
        let params: Vec<(String, Tensor)> = model
            .parameters()
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        Sgd {
            buffers: params.iter().map(|_| None).collect(),
            params,
            lr,
            momentum,
        }
    }

    /// The learning rate.
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// Clears every gradient.
    pub fn zero_grad(&mut self) {
        for (_, param) in &mut self.params {
            param.zero_grad();
        }
    }

    /// One update from the current gradients.
    pub fn step(&mut self) {
        tch::no_grad(|| {
            for ((_, param), buffer) in self.params.iter_mut().zip(&mut self.buffers) {
                let grad = param.grad();
                if !grad.defined() {
                    continue;
                }
                let update = if self.momentum == 0.0 {
                    grad
                } else {
                    match buffer {
                        Some(buf) => {
                            let _ = buf.g_mul_scalar_(self.momentum).g_add_(&grad);
                            buf.shallow_clone()
                        }
                        None => {
                            let buf = grad.copy();
                            *buffer = Some(buf.shallow_clone());
                            buf
                        }
                    }
                };
                let _ = param.g_sub_(&(update * self.lr));
            }
        });
    }

    /// `checkpoint` with this optimizer's state added.
    pub fn save_to(&self, mut checkpoint: Checkpoint) -> Checkpoint {
        for ((name, _), buffer) in self.params.iter().zip(&self.buffers) {
            if let Some(buf) = buffer {
                checkpoint = checkpoint.with_tensor(format!("{PREFIX}{name}"), buf);
            }
        }
        checkpoint
    }

    /// Restores the state saved by [`save_to`](Self::save_to).
    pub fn load_from(&mut self, checkpoint: &Checkpoint) -> Result<(), TrainError> {
        for ((name, param), buffer) in self.params.iter().zip(&mut self.buffers) {
            *buffer = match checkpoint.tensor(&format!("{PREFIX}{name}")) {
                Some(saved) => {
                    if saved.size() != param.size() {
                        return Err(TrainError::Shape {
                            what: format!("momentum of {name}"),
                            saved: saved.size(),
                            current: param.size(),
                        });
                    }
                    Some(saved.to_device(param.device()).copy())
                }
                None => None,
            };
        }
        Ok(())
    }
}
