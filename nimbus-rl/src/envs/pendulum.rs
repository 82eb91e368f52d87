//! Pendulum-v1 (as in Gymnasium): a torque in [-2, 2] swings the pendulum
//! up; g 10, m 1, l 1, dt 0.05, speed within ±8; reward
//! −(θ² + 0.1·θ̇² + 0.001·u²) with θ normalised to [-π, π); never
//! terminates, truncated after 200 steps.

use std::f64::consts::PI;

use crate::env::{Env, EnvFailure, NamedEnv, Step};
use crate::rng::Rng;
use crate::space::{Action, Space};

const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f32 = 2.0;
const DT: f64 = 0.05;
const G: f64 = 10.0;
const M: f64 = 1.0;
const L: f64 = 1.0;
const MAX_STEPS: u32 = 200;

/// Pendulum-v1. Observation `[cos θ, sin θ, θ̇]`.
#[derive(Clone, Debug)]
pub struct Pendulum {
    state: [f64; 2],
    steps: u32,
    rng: Rng,
}

impl Pendulum {
    /// Sets the state `[θ, θ̇]`.
    pub fn set_state(&mut self, state: &[f64]) -> Result<(), EnvFailure> {
        self.state = super::state_from(state)?;
        self.steps = 0;
        Ok(())
    }

    /// The state `[θ, θ̇]`.
    pub fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn observation(&self) -> Vec<f32> {
        let [theta, theta_dot] = self.state;
        vec![theta.cos() as f32, theta.sin() as f32, theta_dot as f32]
    }
}

impl NamedEnv for Pendulum {
    const NAME: &'static str = "nimbus_rl.Pendulum-v1";
    type Config = ();
    fn new(_: &()) -> Result<Self, EnvFailure> {
        Ok(Pendulum {
            state: [0.0; 2],
            steps: 0,
            rng: Rng::new(0),
        })
    }
}

/// θ in [-π, π).
fn normalise(theta: f64) -> f64 {
    (theta + PI).rem_euclid(2.0 * PI) - PI
}

impl Env for Pendulum {
    fn observation_space(&self) -> Space {
        Space::Box {
            low: vec![-1.0, -1.0, -MAX_SPEED as f32],
            high: vec![1.0, 1.0, MAX_SPEED as f32],
        }
    }

    fn action_space(&self) -> Space {
        Space::uniform_box(1, -MAX_TORQUE, MAX_TORQUE)
    }

    /// θ uniform in [-π, π), θ̇ in [-1, 1).
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>, EnvFailure> {
        super::reseed(&mut self.rng, seed);
        self.state = [self.rng.uniform(-PI, PI), self.rng.uniform(-1.0, 1.0)];
        self.steps = 0;
        Ok(self.observation())
    }

    /// The torque is clipped to [-2, 2] (as Gymnasium does), in f32 as
    /// Gymnasium's action is.
    fn step(&mut self, action: &Action) -> Result<Step, EnvFailure> {
        let torque = match action {
            Action::Continuous(u) if u.len() == 1 => u[0].clamp(-MAX_TORQUE, MAX_TORQUE),
            other => return Err(format!("{other:?} is not a torque").into()),
        };
        let [theta, theta_dot] = self.state;
        // Gymnasium's torque terms stay in f32 (NumPy 2 keeps an f32
        // scalar's type against a Python float); so do these.
        let push = f64::from((3.0 / (M * L * L)) as f32 * torque);
        let costs = normalise(theta).powi(2)
            + 0.1 * theta_dot.powi(2)
            + f64::from(0.001f32 * (torque * torque));
        let theta_dot = (theta_dot + (3.0 * G / (2.0 * L) * theta.sin() + push) * DT)
            .clamp(-MAX_SPEED, MAX_SPEED);
        self.state = [theta + theta_dot * DT, theta_dot];
        self.steps += 1;
        let step = Step {
            observation: self.observation(),
            reward: -costs,
            terminated: false,
            truncated: false,
        };
        super::limited(step, self.steps, MAX_STEPS)
    }
}
