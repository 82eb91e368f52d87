//! End-to-end tests of user actors: this binary is the user program. Run by
//! `cargo test`, it is a driver with a local cluster of real node processes;
//! started by a node manager with `nimbus-worker`, it hosts one actor.
//!
//! It has no libtest harness (a worker must reach `nimbus::init` first), so
//! `main` runs every test in turn, each under a deadline, and fails if any
//! fails. `cargo test --test actors -- NAME` runs the tests whose name
//! contains NAME.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod fixtures;
#[path = "../common/harness.rs"]
mod harness;
mod jobs;
mod owners;
mod tests;
mod tune;

use std::time::Duration;

pub use harness::{boxed, Test};

const DEADLINE: Duration = Duration::from_secs(90);

/// Set in the environment of a second driver the tests start, which joins
/// the first one's cluster by address.
pub const REMOTE_DRIVER: &str = "NIMBUS_TEST_REMOTE_DRIVER";

/// Set in the environment of a driver a test SIGKILLs once it has
/// spawned its actors and a placement group.
pub const ORPHAN_DRIVER: &str = "NIMBUS_TEST_ORPHAN_DRIVER";

/// Set in the environment of a driver that starts a cluster of its own
/// and SIGKILLs and restarts its head under its actors.
pub const HEAD_RESTART_DRIVER: &str = "NIMBUS_TEST_HEAD_RESTART_DRIVER";

/// Set in the environment of a driver whose cluster's tickets expire
/// within the test.
pub const TICKET_RENEWAL_DRIVER: &str = "NIMBUS_TEST_TICKET_RENEWAL_DRIVER";

/// Set in the environment of a driver whose actor prints a line, which the
/// driver shows (`log_to_driver`).
pub const PRINTING_DRIVER: &str = "NIMBUS_TEST_PRINTING_DRIVER";

/// Seconds a job's driver may be silent before the job ends, in this
/// binary's cluster (`--driver-grace-s`; the nodes inherit it).
const DRIVER_GRACE_S: &str = "5";

/// Set in the environment of the workload `nimbus chaos run` runs in a test.
pub const CHAOS_WORKLOAD: &str = "NIMBUS_TEST_CHAOS_WORKLOAD";

/// Set (to an experiment storage path) in the environment of a driver
/// that runs an experiment until the test SIGKILLs it.
pub const TUNE_DRIVER: &str = "NIMBUS_TEST_TUNE_DRIVER";

fn main() {
    if let Some(storage) = std::env::var_os(TUNE_DRIVER) {
        return tune::tune_driver(storage.into());
    }
    if std::env::var_os(REMOTE_DRIVER).is_some() {
        return tests::remote_driver();
    }
    if std::env::var_os(CHAOS_WORKLOAD).is_some() {
        return tests::chaos_workload();
    }
    if std::env::var_os(ORPHAN_DRIVER).is_some() {
        return tests::orphan_driver();
    }
    if std::env::var_os(HEAD_RESTART_DRIVER).is_some() {
        return tests::head_restart_driver();
    }
    if std::env::var_os(TICKET_RENEWAL_DRIVER).is_some() {
        return tests::ticket_renewal_driver();
    }
    if std::env::var_os(PRINTING_DRIVER).is_some() {
        return tests::printing_driver();
    }
    if let Ok(mode) = std::env::var(jobs::JOB_DRIVER) {
        return jobs::job_driver(&mode);
    }
    if let Ok(mode) = std::env::var(jobs::PROGRAM_WITH_ITS_OWN_CLUSTER) {
        return jobs::program_with_its_own_cluster(&mode);
    }
    if std::env::var_os("NIMBUS_DRIVER_GRACE_S").is_none() {
        std::env::set_var("NIMBUS_DRIVER_GRACE_S", DRIVER_GRACE_S);
    }
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
