//! CartPole-v1 (Barto, Sutton & Anderson; as in Gymnasium): gravity 9.8,
//! cart mass 1.0, pole mass 0.1, pole half-length 0.5, force 10, tau 0.02,
//! explicit Euler; terminates when |x| > 2.4 or |θ| > 12°, truncated after
//! 500 steps, 1 per step. The state is kept in f64, as Gymnasium does.

use crate::env::{Env, EnvFailure, NamedEnv, Step};
use crate::rng::Rng;
use crate::space::{Action, Space};

const GRAVITY: f64 = 9.8;
const CART_MASS: f64 = 1.0;
const POLE_MASS: f64 = 0.1;
const TOTAL_MASS: f64 = CART_MASS + POLE_MASS;
const HALF_LENGTH: f64 = 0.5;
const POLE_MASS_LENGTH: f64 = POLE_MASS * HALF_LENGTH;
const FORCE: f64 = 10.0;
const TAU: f64 = 0.02;
const X_LIMIT: f64 = 2.4;
const THETA_LIMIT: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
/// Steps after which an episode is truncated.
const MAX_STEPS: u32 = 500;

/// CartPole-v1: push the cart left (0) or right (1) to keep the pole up.
/// Observation `[x, ẋ, θ, θ̇]`.
#[derive(Clone, Debug)]
pub struct CartPole {
    state: [f64; 4],
    steps: u32,
    rng: Rng,
}

impl CartPole {
    /// Sets the state `[x, ẋ, θ, θ̇]` (as a reference trace's start).
    pub fn set_state(&mut self, state: &[f64]) -> Result<(), EnvFailure> {
        self.state = super::state_from(state)?;
        self.steps = 0;
        Ok(())
    }

    /// The state `[x, ẋ, θ, θ̇]`.
    pub fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn observation(&self) -> Vec<f32> {
        self.state.iter().map(|&v| v as f32).collect()
    }
}

impl NamedEnv for CartPole {
    const NAME: &'static str = "nimbus_rl.CartPole-v1";
    type Config = ();
    fn new(_: &()) -> Result<Self, EnvFailure> {
        Ok(CartPole {
            state: [0.0; 4],
            steps: 0,
            rng: Rng::new(0),
        })
    }
}

impl Env for CartPole {
    fn observation_space(&self) -> Space {
        let high = [
            X_LIMIT as f32 * 2.0,
            f32::MAX,
            THETA_LIMIT as f32 * 2.0,
            f32::MAX,
        ];
        Space::Box {
            low: high.iter().map(|h| -h).collect(),
            high: high.to_vec(),
        }
    }

    fn action_space(&self) -> Space {
        Space::Discrete { n: 2 }
    }

    /// Every state variable uniform in ±0.05.
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>, EnvFailure> {
        super::reseed(&mut self.rng, seed);
        for v in &mut self.state {
            *v = self.rng.uniform(-0.05, 0.05);
        }
        self.steps = 0;
        Ok(self.observation())
    }

    fn step(&mut self, action: &Action) -> Result<Step, EnvFailure> {
        let [x, x_dot, theta, theta_dot] = self.state;
        let force = if *action == Action::Discrete(1) {
            FORCE
        } else {
            -FORCE
        };
        let (sin, cos) = theta.sin_cos();
        let temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS;
        let theta_acc = (GRAVITY * sin - cos * temp)
            / (HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * cos * cos / TOTAL_MASS));
        let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS;
        self.state = [
            x + TAU * x_dot,
            x_dot + TAU * x_acc,
            theta + TAU * theta_dot,
            theta_dot + TAU * theta_acc,
        ];
        self.steps += 1;
        let [x, _, theta, _] = self.state;
        let terminated = x.abs() > X_LIMIT || theta.abs() > THETA_LIMIT;
        let step = Step {
            observation: self.observation(),
            reward: 1.0,
            terminated,
            truncated: false,
        };
        super::limited(step, self.steps, MAX_STEPS)
    }
}
