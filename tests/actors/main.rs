//! End-to-end tests of user actors: this binary is the user program. Run by
//! `cargo test`, it is a driver with a local cluster of real node processes;
//! started by a node manager with `nimbus-worker`, it hosts one actor.
//!
//! It has no libtest harness (a worker must reach `nimbus::init` first), so
//! `main` runs every test in turn, each under a deadline, and fails if any
//! fails. `cargo test --test actors -- NAME` runs the tests whose name
//! contains NAME.

mod fixtures;
mod tests;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::FutureExt;

type Test = fn(&mut nimbus::Driver) -> Pin<Box<dyn Future<Output = ()> + '_>>;

const DEADLINE: Duration = Duration::from_secs(90);

/// Set in the environment of a second driver the tests start, which joins
/// the first one's cluster by address.
pub const REMOTE_DRIVER: &str = "NIMBUS_TEST_REMOTE_DRIVER";

/// Set in the environment of the workload `nimbus chaos run` runs in a test.
pub const CHAOS_WORKLOAD: &str = "NIMBUS_TEST_CHAOS_WORKLOAD";

fn main() {
    if std::env::var_os(REMOTE_DRIVER).is_some() {
        return tests::remote_driver();
    }
    if std::env::var_os(CHAOS_WORKLOAD).is_some() {
        return tests::chaos_workload();
    }
    let mut driver =
        nimbus::init_with(fixtures::registry(), nimbus::InitOptions { local_nodes: 3 })
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
