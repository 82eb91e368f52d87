//! End-to-end tests of nimbus Serve: this binary is the user program. Run
//! by `cargo test`, it is a driver with a local cluster of two real node
//! processes; started by a node with `nimbus-worker`, it hosts a
//! controller, an ingress or a replica. Real HTTP over TCP to the
//! ingresses, real actor calls to replicas in their own processes.
//!
//! It has no libtest harness (a worker must reach `nimbus::init` first), so
//! `main` runs every test in turn, each under a deadline. `cargo test -p
//! nimbus-serve --test serve -- NAME` runs the tests whose name contains
//! NAME.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "../../../tests/common/harness.rs"]
mod harness;
mod head_restart;
mod tests;

use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

fn main() {
    if std::env::var_os(head_restart::HEAD_RESTART_DRIVER).is_some() {
        return head_restart::head_restart_driver();
    }
    let driver = nimbus::init_with(tests::registry(), nimbus::InitOptions::private(2))
        .expect("a local cluster starts");
    harness::run(
        driver,
        tests::ALL,
        DEADLINE,
        harness::Leaves::NothingInUse,
        || {},
    )
}
