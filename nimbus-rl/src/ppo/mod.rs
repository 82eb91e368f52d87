//! PPO (Schulman et al. 2017) with discrete actions: a config builder in
//! RLlib's style, `build()` → an [`Algorithm`].
//!
//! ```no_run
//! # async fn run() -> Result<(), nimbus_rl::RlError> {
//! use nimbus_rl::{envs::CartPole, PpoConfig};
//! let mut algo = PpoConfig::new()
//!     .environment::<CartPole>(())
//!     .env_runners(2)
//!     .envs_per_runner(8)
//!     .seed(1)
//!     .build()
//!     .await?;
//! loop {
//!     let metrics = algo.train().await?;
//!     if metrics.episode_return_mean >= 475.0 {
//!         break;
//!     }
//! }
//! algo.save(std::path::Path::new("ppo-cartpole")).await?;
//! algo.stop().await;
//! # Ok(())
//! # }
//! ```

mod learner;
mod policy;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use learner::{gae, Learner, LearnerState, Losses, Rollout};
pub use policy::{Net, Policy};

use crate::algorithm::Algorithm;
use crate::env::{self, MakeEnv, NamedEnv};
use crate::error::RlError;
use crate::space::Space;

/// PPO's update settings (what learners need).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hyper {
    /// Discount.
    pub gamma: f32,
    /// GAE's λ.
    pub lambda: f32,
    /// Clip range of the probability ratio.
    pub clip: f64,
    /// Weight of the value loss.
    pub value_coef: f64,
    /// Weight of the entropy bonus.
    pub entropy_coef: f64,
    /// Passes over each iteration's batch.
    pub epochs: usize,
    /// Minibatches per pass.
    pub minibatches: usize,
    /// Gradient norm clip.
    pub max_grad_norm: f64,
}

impl Default for Hyper {
    fn default() -> Self {
        Hyper {
            gamma: 0.99,
            lambda: 0.95,
            clip: 0.2,
            value_coef: 0.5,
            entropy_coef: 0.0,
            epochs: 4,
            minibatches: 4,
            max_grad_norm: 0.5,
        }
    }
}

/// The environment an algorithm trains on.
#[derive(Clone)]
pub(crate) struct EnvChoice {
    /// Its registered name.
    pub(crate) name: &'static str,
    /// Its config, as the runners get it.
    pub(crate) config: serde_json::Value,
    /// Builds one here (the driver's evaluation and checks).
    pub(crate) make: MakeEnv,
}

/// What a PPO run is: the environment, the runners, the learners and the
/// update's settings. Every setting has a default but the environment.
#[derive(Clone)]
pub struct PpoConfig {
    pub(crate) env: Option<EnvChoice>,
    pub(crate) runners: usize,
    pub(crate) envs_per_runner: usize,
    pub(crate) rollout_length: usize,
    pub(crate) runner_cpus: f64,
    pub(crate) max_runner_restarts: u32,
    pub(crate) learners: usize,
    pub(crate) lr: f64,
    pub(crate) lr_anneal_env_steps: Option<u64>,
    pub(crate) hidden: Vec<i64>,
    pub(crate) hyper: Hyper,
    pub(crate) seed: u64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            env: None,
            runners: 2,
            envs_per_runner: 8,
            rollout_length: 64,
            runner_cpus: 0.5,
            max_runner_restarts: 100,
            learners: 1,
            lr: 1e-3,
            lr_anneal_env_steps: Some(1_000_000),
            hidden: vec![64, 64],
            hyper: Hyper::default(),
            seed: 0,
        }
    }
}

impl PpoConfig {
    /// The defaults (2 runners × 8 environments × 64 steps per iteration,
    /// one learner in the driver, lr 1e-3 annealed over 1M env steps,
    /// two hidden layers of 64).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trains on `E` (registered in the program's registry with
    /// [`RegistryExt::env`](crate::RegistryExt::env)), built from `config`.
    pub fn environment<E: NamedEnv>(mut self, config: E::Config) -> Self {
        let config = serde_json::to_value(&config).unwrap_or(serde_json::Value::Null);
        self.env = Some(EnvChoice {
            name: E::NAME,
            config,
            make: Arc::new(env::make::<E>),
        });
        self
    }

    /// Env-runner actors (one process each), spread over the nodes.
    pub fn env_runners(mut self, runners: usize) -> Self {
        self.runners = runners;
        self
    }

    /// Environment copies each runner steps together.
    pub fn envs_per_runner(mut self, envs: usize) -> Self {
        self.envs_per_runner = envs;
        self
    }

    /// Steps per environment copy per iteration.
    pub fn rollout_length(mut self, steps: usize) -> Self {
        self.rollout_length = steps;
        self
    }

    /// CPUs each runner reserves (default 0.5).
    pub fn runner_cpus(mut self, cpus: f64) -> Self {
        self.runner_cpus = cpus;
        self
    }

    /// How often a runner's process may be restarted in all (default 100).
    pub fn max_runner_restarts(mut self, restarts: u32) -> Self {
        self.max_runner_restarts = restarts;
        self
    }

    /// Learners: 1 learns in the driver; more form a learner group of
    /// actors averaging gradients (packed on one host, through shared
    /// memory); runners must divide evenly among them.
    pub fn learners(mut self, learners: usize) -> Self {
        self.learners = learners;
        self
    }

    /// Adam's learning rate at the start.
    pub fn lr(mut self, lr: f64) -> Self {
        self.lr = lr;
        self
    }

    /// Anneals the learning rate linearly to 5 % of it over this many env
    /// steps (`None`: constant).
    pub fn lr_anneal(mut self, env_steps: Option<u64>) -> Self {
        self.lr_anneal_env_steps = env_steps;
        self
    }

    /// Hidden layer widths of actor and critic.
    pub fn hidden(mut self, widths: &[i64]) -> Self {
        self.hidden = widths.to_vec();
        self
    }

    /// Discount.
    pub fn gamma(mut self, gamma: f32) -> Self {
        self.hyper.gamma = gamma;
        self
    }

    /// GAE's λ.
    pub fn lambda(mut self, lambda: f32) -> Self {
        self.hyper.lambda = lambda;
        self
    }

    /// Clip range of the probability ratio.
    pub fn clip(mut self, clip: f64) -> Self {
        self.hyper.clip = clip;
        self
    }

    /// Weight of the value loss.
    pub fn value_coef(mut self, coef: f64) -> Self {
        self.hyper.value_coef = coef;
        self
    }

    /// Weight of the entropy bonus.
    pub fn entropy_coef(mut self, coef: f64) -> Self {
        self.hyper.entropy_coef = coef;
        self
    }

    /// Passes over each iteration's batch.
    pub fn epochs(mut self, epochs: usize) -> Self {
        self.hyper.epochs = epochs;
        self
    }

    /// Minibatches per pass.
    pub fn minibatches(mut self, minibatches: usize) -> Self {
        self.hyper.minibatches = minibatches;
        self
    }

    /// Gradient norm clip.
    pub fn max_grad_norm(mut self, norm: f64) -> Self {
        self.hyper.max_grad_norm = norm;
        self
    }

    /// Seeds the policy, the environments and the sampling.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Checks the settings, builds one environment here (its constructor's
    /// error and its spaces are known before anything starts), then starts
    /// the runners and learners.
    pub async fn build(self) -> Result<Algorithm, RlError> {
        let net = self.check()?;
        Algorithm::start(self, net).await
    }

    /// The networks' shape, once every setting is known to work.
    pub(crate) fn check(&self) -> Result<Net, RlError> {
        let refuse = |setting: &'static str, why: String| Err(RlError::Setting { setting, why });
        let Some(env) = &self.env else {
            return refuse("environment", "no environment was given".into());
        };
        if self.runners == 0 {
            return refuse("env_runners", "must be at least 1".into());
        }
        if self.envs_per_runner == 0 {
            return refuse("envs_per_runner", "must be at least 1".into());
        }
        if self.rollout_length == 0 {
            return refuse("rollout_length", "must be at least 1".into());
        }
        if self.learners == 0 {
            return refuse("learners", "must be at least 1".into());
        }
        if self.runners % self.learners != 0 {
            let why = format!(
                "{} env runners do not divide evenly among {} learners",
                self.runners, self.learners
            );
            return refuse("learners", why);
        }
        let batch = self.runners / self.learners * self.envs_per_runner * self.rollout_length;
        let h = &self.hyper;
        if h.minibatches == 0 || h.minibatches > batch {
            let why = format!(
                "{} minibatches of a learner's batch of {batch} transitions (env_runners / learners × envs_per_runner × rollout_length)",
                h.minibatches
            );
            return refuse("minibatches", why);
        }
        if h.epochs == 0 {
            return refuse("epochs", "must be at least 1".into());
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return refuse("lr", format!("{} is not a positive learning rate", self.lr));
        }
        if !(h.gamma > 0.0 && h.gamma <= 1.0) {
            return refuse("gamma", format!("{} is not in (0, 1]", h.gamma));
        }
        if !(0.0..=1.0).contains(&h.lambda) {
            return refuse("lambda", format!("{} is not in [0, 1]", h.lambda));
        }
        if h.clip.is_nan() || h.clip <= 0.0 {
            return refuse("clip", format!("{} is not positive", h.clip));
        }
        if !(self.runner_cpus >= 0.0 && self.runner_cpus.is_finite()) {
            return refuse("runner_cpus", format!("{} CPUs", self.runner_cpus));
        }
        if self.hidden.iter().any(|&w| w <= 0) {
            return refuse("hidden", format!("layer widths {:?}", self.hidden));
        }
        let probe = (env.make)(&env.config).map_err(|e| RlError::Build {
            env: env.name.to_string(),
            why: e.to_string(),
        })?;
        let observations = match probe.observation_space() {
            Space::Box { low, .. } => low.len() as i64,
            Space::Discrete { .. } => 1,
            Space::MultiDiscrete { nvec } => nvec.len() as i64,
        };
        let actions = match probe.action_space() {
            Space::Discrete { n } if n >= 1 => i64::from(n),
            other => {
                let why = format!(
                    "{} has the action space {other:?}; this PPO takes discrete actions only (continuous ones are not built yet)",
                    env.name
                );
                return refuse("environment", why);
            }
        };
        Ok(Net {
            observations,
            actions,
            hidden: self.hidden.clone(),
        })
    }

    /// The learning rate after `env_steps`.
    pub(crate) fn lr_at(&self, env_steps: u64) -> f64 {
        match self.lr_anneal_env_steps {
            Some(total) if total > 0 => {
                let progress = env_steps as f64 / total as f64;
                self.lr * (1.0 - progress).max(0.05)
            }
            _ => self.lr,
        }
    }
}
