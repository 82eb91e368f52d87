//! Helpers for tests of programs built on nimbus (nimbus's own tests use
//! them too): waiting for a condition with a deadline, checking an
//! invariant while a workload runs under faults ([`check`]), and making sure
//! a test leaves no node or worker process behind ([`ExitWatch`]).

pub mod check;
mod leaks;

pub use leaks::{ExitWatch, LeftBehind};
