//! End-to-end tests: real node processes on loopback, real QUIC.
//!
//! One test binary with a module per area, so the crate links once.

mod architecture;
mod bad_input;
mod chaos;
mod cli;
mod fault_plans;
mod faults;
mod membership;
mod requests;
mod security;
mod support;
