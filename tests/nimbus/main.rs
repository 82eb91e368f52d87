//! End-to-end tests: real node processes on loopback, real QUIC.
//!
//! One test binary with a module per area, so the crate links once.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod architecture;
mod autoscaler;
mod bad_input;
#[path = "../common/browser.rs"]
mod browser;
mod chaos;
mod cli;
mod dashboard;
mod failed_runs;
mod fault_plans;
mod faults;
mod hosts;
mod identity;
mod libraries;
mod membership;
mod metrics;
#[path = "../common/not_run.rs"]
mod not_run;
mod requests;
mod same_host;
mod security;
mod support;
