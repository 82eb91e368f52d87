//! End-to-end tests of data-parallel training: this binary is the user
//! program (driver and, started by node managers, the training workers),
//! training the MNIST example's very loop on real worker processes with
//! real libtorch, over a 3-node local cluster.
//!
//! No libtest harness (a worker must reach `nimbus::init` first): `main`
//! runs every test in turn under a deadline. `cargo test --test train --
//! NAME` runs those whose name contains NAME.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "../../../tests/common/harness.rs"]
mod harness;
#[path = "../../examples/train_mnist/mnist.rs"]
mod mnist;
#[path = "../../examples/serve_mnist/model.rs"]
mod serve_mnist;
mod serving;
mod tests;
mod tune;
mod unused;

// What the serving model takes from the training example.
use mnist::{data::generate_digits, network};
use nimbus::tune::TuneRegistry;
use nimbus_serve::RegistryExt;
use nimbus_train::TrainRegistry;

use std::time::Duration;

pub use harness::{boxed, Test};

const DEADLINE: Duration = Duration::from_secs(180);

fn main() {
    let registry = nimbus::actor::Registry::new()
        .train_loop::<mnist::MnistLoop>()
        .train_loop::<tune::TunedMnist>()
        .train_loop::<unused::OneHeadPerRank>()
        .trainable::<nimbus_train::tune::TrainerTrainable<tune::TunedMnist>>()
        .parameter_aggregator()
        .deployment::<serve_mnist::MnistCnn>();
    let driver = nimbus::init_with(registry, nimbus::InitOptions::private(3))
        .expect("a local cluster starts");
    // Checkpoints of every run go under one directory, removed at the end.
    harness::run(
        driver,
        tests::ALL,
        DEADLINE,
        harness::Leaves::NothingInUse,
        || {
            let _ = std::fs::remove_dir_all(tests::storage());
        },
    )
}
