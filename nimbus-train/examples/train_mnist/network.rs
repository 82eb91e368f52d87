//! The MNIST CNN: defined once, trained by `mnist.rs` and served by the
//! `serve_mnist` example (which includes this file), so a `train_mnist`
//! checkpoint loads into what it serves.

use nimbus_train::tch::{nn, Tensor};

/// MNIST's mean and standard deviation, the usual normalisation.
const MEAN: f64 = 0.1307;
const STD: f64 = 0.3081;

/// Pixel intensities in `[0, 1]` (float) as the network takes them.
pub fn standardise(pixels: Tensor) -> Tensor {
    (pixels - MEAN) / STD
}

/// conv(1→32, 3×3) → pool → conv(32→64, 3×3) → pool → fc(3136→128) →
/// fc(128→10).
pub fn network(root: &nn::Path) -> nn::SequentialT {
    let same = nn::ConvConfig {
        padding: 1,
        ..Default::default()
    };
    nn::seq_t()
        .add(nn::conv2d(root / "conv1", 1, 32, 3, same))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add(nn::conv2d(root / "conv2", 32, 64, 3, same))
        .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
        .add(nn::linear(root / "fc1", 3136, 128, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(root / "fc2", 128, 10, Default::default()))
}
