//! MountainCar-v0 (Moore; as in Gymnasium): push left (0), nothing (1) or
//! right (2); force 0.001, gravity 0.0025, speed within ±0.07, position
//! within [-1.2, 0.6] (stopped at the left wall); terminates at position
//! ≥ 0.5, −1 per step, truncated after 200 steps.

use crate::env::{Env, EnvFailure, NamedEnv, Step};
use crate::rng::Rng;
use crate::space::{Action, Space};

const MIN_POSITION: f64 = -1.2;
const MAX_POSITION: f64 = 0.6;
const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.5;
const FORCE: f64 = 0.001;
const GRAVITY: f64 = 0.0025;
const MAX_STEPS: u32 = 200;

/// MountainCar-v0. Observation `[position, velocity]`.
#[derive(Clone, Debug)]
pub struct MountainCar {
    state: [f64; 2],
    steps: u32,
    rng: Rng,
}

impl MountainCar {
    /// Sets the state `[position, velocity]`.
    pub fn set_state(&mut self, state: &[f64]) -> Result<(), EnvFailure> {
        self.state = super::state_from(state)?;
        self.steps = 0;
        Ok(())
    }

    /// The state `[position, velocity]`.
    pub fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn observation(&self) -> Vec<f32> {
        self.state.iter().map(|&v| v as f32).collect()
    }
}

impl NamedEnv for MountainCar {
    const NAME: &'static str = "nimbus_rl.MountainCar-v0";
    type Config = ();
    fn new(_: &()) -> Result<Self, EnvFailure> {
        Ok(MountainCar {
            state: [0.0; 2],
            steps: 0,
            rng: Rng::new(0),
        })
    }
}

impl Env for MountainCar {
    fn observation_space(&self) -> Space {
        Space::Box {
            low: vec![MIN_POSITION as f32, -MAX_SPEED as f32],
            high: vec![MAX_POSITION as f32, MAX_SPEED as f32],
        }
    }

    fn action_space(&self) -> Space {
        Space::Discrete { n: 3 }
    }

    /// Position uniform in [-0.6, -0.4), at rest.
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>, EnvFailure> {
        super::reseed(&mut self.rng, seed);
        self.state = [self.rng.uniform(-0.6, -0.4), 0.0];
        self.steps = 0;
        Ok(self.observation())
    }

    fn step(&mut self, action: &Action) -> Result<Step, EnvFailure> {
        let Action::Discrete(push) = action else {
            return Err(format!("{action:?} is not a discrete action").into());
        };
        let [position, velocity] = self.state;
        let velocity =
            (velocity + (f64::from(*push) - 1.0) * FORCE + (3.0 * position).cos() * -GRAVITY)
                .clamp(-MAX_SPEED, MAX_SPEED);
        let position = (position + velocity).clamp(MIN_POSITION, MAX_POSITION);
        let velocity = if position == MIN_POSITION && velocity < 0.0 {
            0.0
        } else {
            velocity
        };
        self.state = [position, velocity];
        self.steps += 1;
        let step = Step {
            observation: self.observation(),
            reward: -1.0,
            terminated: position >= GOAL_POSITION && velocity >= 0.0,
            truncated: false,
        };
        super::limited(step, self.steps, MAX_STEPS)
    }
}
