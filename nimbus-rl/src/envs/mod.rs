//! Built-in environments: Gymnasium's classic-control tasks, with their
//! dynamics, rewards, termination and time limits, checked step by step
//! against Gymnasium 1.4.0's own (`tests/traces`: same state, same actions
//! → same observations, rewards and flags).
//!
//! Their random starts come from this crate's seeded generator, not
//! NumPy's, so a seed gives other start states than in Gymnasium; the
//! checks set Gymnasium's start state with `set_state`.

mod acrobot;
mod cartpole;
mod mountain_car;
mod pendulum;

pub use acrobot::Acrobot;
pub use cartpole::CartPole;
pub use mountain_car::MountainCar;
pub use pendulum::Pendulum;

use crate::env::{EnvFailure, Step};
use crate::rng::Rng;

/// A generator seeded from `seed`, or left as it is without one.
fn reseed(rng: &mut Rng, seed: Option<u64>) {
    if let Some(seed) = seed {
        *rng = Rng::new(seed);
    }
}

/// Gymnasium's `TimeLimit`: a step that reaches `limit` without
/// terminating truncates the episode.
fn limited(step: Step, steps: u32, limit: u32) -> Result<Step, EnvFailure> {
    Ok(Step {
        truncated: !step.terminated && steps >= limit,
        ..step
    })
}

/// The internal state of a built-in environment, for checks against a
/// reference: set with `set_state`, read with `state`.
fn state_from<const N: usize>(state: &[f64]) -> Result<[f64; N], EnvFailure> {
    state
        .try_into()
        .map_err(|_| format!("a state of {} values, where {N} are needed", state.len()).into())
}
