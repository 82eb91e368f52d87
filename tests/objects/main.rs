//! End-to-end tests of the object store (reference counting, spilling,
//! transfers) and of tasks: this binary is the user program. Run by
//! `cargo test`, it is a driver with a local cluster of three real node
//! processes; started by a node manager with `nimbus-worker`, it hosts a
//! task worker or a test actor.
//!
//! It has no libtest harness (a worker must reach `nimbus::init` first), so
//! `main` runs every test in turn, each under a deadline. `cargo test
//! --test objects -- NAME` runs the tests whose name contains NAME.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod fixtures;
#[path = "../common/harness.rs"]
mod harness;
mod tests;

use std::time::Duration;

pub use harness::{boxed, Test};

const DEADLINE: Duration = Duration::from_secs(120);

fn main() {
    let driver = nimbus::init_with(fixtures::registry(), nimbus::InitOptions::private(3))
        .expect("a local cluster starts");
    harness::run(
        driver,
        tests::ALL,
        DEADLINE,
        harness::Leaves::Anything,
        || {},
    )
}
