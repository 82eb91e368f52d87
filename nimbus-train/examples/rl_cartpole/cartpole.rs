//! CartPole-v1 with the standard dynamics (Barto, Sutton & Anderson; as in
//! Gymnasium): gravity 9.8, cart mass 1.0, pole mass 0.1, pole half-length
//! 0.5, force 10, tau 0.02, explicit Euler; an episode terminates when
//! |x| > 2.4 or |θ| > 12°, is truncated after 500 steps, and pays 1 per
//! step. The state is kept in f64, as Gymnasium does.

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
pub const MAX_STEPS: u32 = 500;

/// `[x, ẋ, θ, θ̇]`.
pub type State = [f64; 4];

/// What a step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// The reward (1 per step).
    pub reward: f32,
    /// The pole fell or the cart left the track.
    pub terminated: bool,
    /// The episode reached [`MAX_STEPS`].
    pub truncated: bool,
}

/// The dynamics: the state after pushing left (0) or right (1).
pub fn dynamics(state: State, action: u8) -> State {
    let [x, x_dot, theta, theta_dot] = state;
    let force = if action == 1 { FORCE } else { -FORCE };
    let (sin, cos) = theta.sin_cos();
    let temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS;
    let theta_acc = (GRAVITY * sin - cos * temp)
        / (HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * cos * cos / TOTAL_MASS));
    let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS;
    [
        x + TAU * x_dot,
        x_dot + TAU * x_acc,
        theta + TAU * theta_dot,
        theta_dot + TAU * theta_acc,
    ]
}

/// Whether `state` ends the episode.
pub fn terminal(state: &State) -> bool {
    state[0].abs() > X_LIMIT || state[2].abs() > THETA_LIMIT
}

/// A small seeded generator (splitmix64): the same numbers on every build.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5eed_ca47_901e_0001)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One CartPole.
#[derive(Clone, Debug)]
pub struct CartPole {
    state: State,
    steps: u32,
    rng: Rng,
}

impl CartPole {
    /// A new environment, reset from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut env = CartPole {
            state: [0.0; 4],
            steps: 0,
            rng: Rng::new(seed),
        };
        env.reset();
        env
    }

    /// Starts an episode: every state variable uniform in ±0.05.
    pub fn reset(&mut self) -> State {
        for v in &mut self.state {
            *v = self.rng.unit() * 0.1 - 0.05;
        }
        self.steps = 0;
        self.state
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// One step.
    pub fn step(&mut self, action: u8) -> Step {
        self.state = dynamics(self.state, action);
        self.steps += 1;
        let terminated = terminal(&self.state);
        Step {
            reward: 1.0,
            terminated,
            truncated: !terminated && self.steps >= MAX_STEPS,
        }
    }
}

/// `k` environments stepped together.
pub struct VecCartPole {
    /// The environments.
    pub envs: Vec<CartPole>,
    /// Each one's return so far in its episode.
    pub returns: Vec<f32>,
}

impl VecCartPole {
    /// `k` environments seeded from `seed`.
    pub fn new(k: usize, seed: u64) -> Self {
        VecCartPole {
            envs: (0..k)
                .map(|i| CartPole::new(seed.wrapping_mul(1_000_003).wrapping_add(i as u64)))
                .collect(),
            returns: vec![0.0; k],
        }
    }

    /// Observations, `k × 4`, as f32.
    pub fn observations(&self) -> Vec<f32> {
        self.envs
            .iter()
            .flat_map(|e| e.state().map(|v| v as f32))
            .collect()
    }
}
