//! The MNIST CNN of nimbus-train's `train_mnist` as a deployment: each
//! replica loads a `train_mnist` checkpoint with tch (libtorch on one
//! thread, as Ray Serve's torch replicas of the anchor) and answers
//! a JSON array of 784 pixel intensities in `[0, 1]` (28×28, row by row)
//! with the digit it sees and that digit's probability. A batch runs as one
//! forward pass. The `serve_mnist` example's, included by the training
//! tests.

use std::path::PathBuf;

use nimbus_serve::{Deployment, HandlerError};
use nimbus_train::tch::{self, nn, nn::ModuleT, Device, Kind, Tensor};
use nimbus_train::Checkpoint;
use serde::{Deserialize, Serialize};

// The CNN and the digits of the training example, from the crate root
// (each program includes their files once).
use crate::{generate_digits, network};

/// Pixels per image (28×28).
pub const PIXELS: usize = 784;

/// A replica's model: the CNN with a checkpoint's parameters.
pub struct MnistCnn {
    net: nn::SequentialT,
    /// Owns the parameters `net` uses.
    _vs: nn::VarStore,
}

/// What a request is answered with.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// The digit with the highest probability.
    pub digit: i64,
    /// Its probability.
    pub probability: f32,
}

impl MnistCnn {
    /// The network with the parameters of the `train_mnist` checkpoint
    /// in directory `checkpoint`.
    pub fn load(checkpoint: &std::path::Path) -> Result<Self, String> {
        let vs = nn::VarStore::new(Device::Cpu);
        let net = network::network(&vs.root());
        Checkpoint::load(checkpoint)
            .and_then(|saved| saved.restore_var_store(&vs))
            .map_err(|e| {
                format!(
                    "cannot load the MNIST CNN from checkpoint {}: {e}",
                    checkpoint.display()
                )
            })?;
        Ok(MnistCnn { net, _vs: vs })
    }

    /// One prediction per image, in one forward pass.
    pub fn predict(&self, images: &[Vec<f32>]) -> Vec<Prediction> {
        let pixels: Vec<f32> = images.concat();
        let input = Tensor::from_slice(&pixels).view([images.len() as i64, 1, 28, 28]);
        let probabilities = tch::no_grad(|| {
            self.net
                .forward_t(&network::standardise(input), false)
                .softmax(-1, Kind::Float)
        });
        let (best, digits) = probabilities.max_dim(-1, false);
        let best = Vec::<f32>::try_from(best).unwrap_or_default();
        let digits = Vec::<i64>::try_from(digits).unwrap_or_default();
        digits
            .into_iter()
            .zip(best)
            .map(|(digit, probability)| Prediction { digit, probability })
            .collect()
    }
}

/// `n` generated digits (pixels in `[0, 1]`) and their labels, the same
/// for a seed everywhere.
pub fn test_digits(n: usize, seed: u64) -> (Vec<Vec<f32>>, Vec<i64>) {
    let (bytes, labels) = generate_digits(n, seed);
    let images = bytes
        .chunks(PIXELS)
        .map(|image| image.iter().map(|&b| f32::from(b) / 255.0).collect())
        .collect();
    (images, labels)
}

/// Built from a `train_mnist` checkpoint directory.
impl Deployment for MnistCnn {
    const NAME: &'static str = "examples.MnistCnn";
    type Init = PathBuf;
    type Request = Vec<f32>;
    type Response = Prediction;

    fn new(checkpoint: PathBuf) -> Result<Self, String> {
        tch::set_num_threads(1);
        MnistCnn::load(&checkpoint)
    }

    async fn call(&self, image: Vec<f32>) -> Result<Prediction, HandlerError> {
        self.call_batch(vec![image])
            .await
            .pop()
            .unwrap_or_else(|| Err(HandlerError::Failed("no prediction".into())))
    }

    /// The images of the right size in one forward pass; each other one
    /// answered 400.
    async fn call_batch(&self, images: Vec<Vec<f32>>) -> Vec<Result<Prediction, HandlerError>> {
        let sizes: Vec<usize> = images.iter().map(Vec::len).collect();
        let valid: Vec<Vec<f32>> = images
            .into_iter()
            .filter(|image| image.len() == PIXELS)
            .collect();
        let mut predictions = if valid.is_empty() {
            Vec::new()
        } else {
            self.predict(&valid)
        }
        .into_iter();
        sizes
            .into_iter()
            .map(|size| {
                if size != PIXELS {
                    return Err(HandlerError::BadRequest(format!(
                        "an image is {PIXELS} pixel intensities (28×28, row by row), got {size}"
                    )));
                }
                predictions
                    .next()
                    .ok_or_else(|| HandlerError::Failed("the model answered too few".into()))
            })
            .collect()
    }
}
