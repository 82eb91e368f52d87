//! The fuzzing run of the decoders of this crate (the harness is
//! `harness.rs`, the decoders `targets.rs`).

// Tests: a failed unwrap is the failure report, and their items are
// public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

mod harness;
mod targets;

pub use harness::{Outcome, Target};

fn main() {
    harness::run(targets::ALL)
}
