//! Acrobot-v1 (Sutton 1996, the book's dynamics; as in Gymnasium): a torque
//! of −1, 0 or +1 (actions 0, 1, 2) on the joint between two links swings
//! the tip above the bar; RK4 over dt 0.2; angles wrapped to [-π, π],
//! speeds bounded by 4π and 9π; terminates when −cos θ₁ − cos(θ₁ + θ₂) >
//! 1, −1 per step (0 on the terminal one), truncated after 500 steps.

use std::f64::consts::PI;

use crate::env::{Env, EnvFailure, NamedEnv, Step};
use crate::rng::Rng;
use crate::space::{Action, Space};

const DT: f64 = 0.2;
const LINK_LENGTH_1: f64 = 1.0;
const LINK_MASS_1: f64 = 1.0;
const LINK_MASS_2: f64 = 1.0;
const LINK_COM_POS_1: f64 = 0.5;
const LINK_COM_POS_2: f64 = 0.5;
const LINK_MOI: f64 = 1.0;
const MAX_VEL_1: f64 = 4.0 * PI;
const MAX_VEL_2: f64 = 9.0 * PI;
const TORQUES: [f64; 3] = [-1.0, 0.0, 1.0];
const MAX_STEPS: u32 = 500;

/// Acrobot-v1. Observation `[cos θ₁, sin θ₁, cos θ₂, sin θ₂, θ̇₁, θ̇₂]`.
#[derive(Clone, Debug)]
pub struct Acrobot {
    state: [f64; 4],
    steps: u32,
    rng: Rng,
}

impl Acrobot {
    /// Sets the state `[θ₁, θ₂, θ̇₁, θ̇₂]`.
    pub fn set_state(&mut self, state: &[f64]) -> Result<(), EnvFailure> {
        self.state = super::state_from(state)?;
        self.steps = 0;
        Ok(())
    }

    /// The state `[θ₁, θ₂, θ̇₁, θ̇₂]`.
    pub fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn observation(&self) -> Vec<f32> {
        let [t1, t2, d1, d2] = self.state;
        [t1.cos(), t1.sin(), t2.cos(), t2.sin(), d1, d2]
            .iter()
            .map(|&v| v as f32)
            .collect()
    }
}

impl NamedEnv for Acrobot {
    const NAME: &'static str = "nimbus_rl.Acrobot-v1";
    type Config = ();
    fn new(_: &()) -> Result<Self, EnvFailure> {
        Ok(Acrobot {
            state: [0.0; 4],
            steps: 0,
            rng: Rng::new(0),
        })
    }
}

/// The derivatives of `[θ₁, θ₂, θ̇₁, θ̇₂]` under torque `a`.
fn derivatives(s: [f64; 4], a: f64) -> [f64; 4] {
    let (m1, m2, l1) = (LINK_MASS_1, LINK_MASS_2, LINK_LENGTH_1);
    let (lc1, lc2, i1, i2) = (LINK_COM_POS_1, LINK_COM_POS_2, LINK_MOI, LINK_MOI);
    let g = 9.8;
    let [theta1, theta2, dtheta1, dtheta2] = s;
    let d1 = m1 * lc1.powi(2)
        + m2 * (l1.powi(2) + lc2.powi(2) + 2.0 * l1 * lc2 * theta2.cos())
        + i1
        + i2;
    let d2 = m2 * (lc2.powi(2) + l1 * lc2 * theta2.cos()) + i2;
    let phi2 = m2 * lc2 * g * (theta1 + theta2 - PI / 2.0).cos();
    let phi1 = -m2 * l1 * lc2 * dtheta2.powi(2) * theta2.sin()
        - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * theta2.sin()
        + (m1 * lc1 + m2 * l1) * g * (theta1 - PI / 2.0).cos()
        + phi2;
    let ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1.powi(2) * theta2.sin() - phi2)
        / (m2 * lc2.powi(2) + i2 - d2.powi(2) / d1);
    let ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    [dtheta1, dtheta2, ddtheta1, ddtheta2]
}

/// One fourth-order Runge-Kutta step of `dt`.
fn rk4(y: [f64; 4], a: f64, dt: f64) -> [f64; 4] {
    let add = |y: [f64; 4], k: [f64; 4], h: f64| std::array::from_fn(|i| y[i] + h * k[i]);
    let k1 = derivatives(y, a);
    let k2 = derivatives(add(y, k1, dt / 2.0), a);
    let k3 = derivatives(add(y, k2, dt / 2.0), a);
    let k4 = derivatives(add(y, k3, dt), a);
    std::array::from_fn(|i| y[i] + dt / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]))
}

/// `x` wrapped into `[low, high]`.
fn wrap(mut x: f64, low: f64, high: f64) -> f64 {
    let span = high - low;
    while x > high {
        x -= span;
    }
    while x < low {
        x += span;
    }
    x
}

impl Env for Acrobot {
    fn observation_space(&self) -> Space {
        let high = [1.0, 1.0, 1.0, 1.0, MAX_VEL_1 as f32, MAX_VEL_2 as f32];
        Space::Box {
            low: high.iter().map(|h| -h).collect(),
            high: high.to_vec(),
        }
    }

    fn action_space(&self) -> Space {
        Space::Discrete { n: 3 }
    }

    /// Every state variable uniform in ±0.1 (in f32, as Gymnasium's).
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>, EnvFailure> {
        super::reseed(&mut self.rng, seed);
        for v in &mut self.state {
            *v = f64::from(self.rng.uniform(-0.1, 0.1) as f32);
        }
        self.steps = 0;
        Ok(self.observation())
    }

    fn step(&mut self, action: &Action) -> Result<Step, EnvFailure> {
        let torque = match action {
            Action::Discrete(a) if (*a as usize) < TORQUES.len() => TORQUES[*a as usize],
            other => return Err(format!("{other:?} is not one of 3 torques").into()),
        };
        let next = rk4(self.state, torque, DT);
        self.state = [
            wrap(next[0], -PI, PI),
            wrap(next[1], -PI, PI),
            next[2].clamp(-MAX_VEL_1, MAX_VEL_1),
            next[3].clamp(-MAX_VEL_2, MAX_VEL_2),
        ];
        self.steps += 1;
        let [t1, t2, _, _] = self.state;
        let terminated = -t1.cos() - (t2 + t1).cos() > 1.0;
        let step = Step {
            observation: self.observation(),
            reward: if terminated { 0.0 } else { -1.0 },
            terminated,
            truncated: false,
        };
        super::limited(step, self.steps, MAX_STEPS)
    }
}
