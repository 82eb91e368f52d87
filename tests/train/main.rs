//! End-to-end tests of data-parallel training: this binary is the user
//! program (driver and, started by node managers, the training workers),
//! training the MNIST example's very loop on real worker processes with
//! real libtorch, over a 3-node local cluster.
//!
//! No libtest harness (a worker must reach `nimbus::init` first): `main`
//! runs every test in turn under a deadline. `cargo test --test train --
//! NAME` runs those whose name contains NAME.

#[path = "../../examples/train_mnist/mnist.rs"]
mod mnist;
mod tests;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::FutureExt;

type Test = fn(&mut nimbus::Driver) -> Pin<Box<dyn Future<Output = ()> + '_>>;

const DEADLINE: Duration = Duration::from_secs(180);

fn main() {
    let registry = nimbus::actor::Registry::new()
        .train_loop::<mnist::MnistLoop>()
        .parameter_aggregator();
    let mut driver = nimbus::init_with(registry, nimbus::InitOptions { local_nodes: 3 })
        .expect("a local cluster starts");
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let system = actix::System::new();
    let failed = system.block_on(async {
        driver.connect().await.expect("the driver connects");
        let mut failed = Vec::new();
        for (name, test) in tests::ALL {
            if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
                continue;
            }
            let started = Instant::now();
            let run =
                AssertUnwindSafe(tokio::time::timeout(DEADLINE, test(&mut driver))).catch_unwind();
            let outcome = match run.await {
                Ok(Ok(())) => "ok",
                Ok(Err(_)) => "TIMED OUT",
                Err(_) => "FAILED",
            };
            println!("test {name} ... {outcome} ({:.1?})", started.elapsed());
            if outcome != "ok" {
                failed.push(*name);
            }
        }
        failed
    });
    drop(driver);
    if !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        std::process::exit(1);
    }
    println!("test result: ok");
}

/// Boxes a test body for [`tests::ALL`].
fn boxed<'a>(test: impl Future<Output = ()> + 'a) -> Pin<Box<dyn Future<Output = ()> + 'a>> {
    Box::pin(test)
}
