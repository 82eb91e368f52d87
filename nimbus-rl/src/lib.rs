//! nimbus RL: reinforcement learning as a library on the nimbus runtime
//! (RLlib's new API stack, in Rust).
//!
//! A user writes an environment ([`Env`] with Gymnasium's semantics, and
//! [`NamedEnv`] so runners can build it), registers it, and runs an
//! algorithm from a config:
//!
//! 1. `nimbus::init(nimbus_rl::register(Registry::new()).env::<MyEnv>())`
//!    in `main` (runners and learners are processes of the same binary);
//! 2. `PpoConfig::new().environment::<MyEnv>(config)...build().await?`
//!    checks every setting, builds one environment here, then starts the
//!    env-runner actors (spread over the nodes) and the learners;
//! 3. `train()` runs one iteration (sample on every runner, update,
//!    metrics); `save`/`restore`, `evaluate` and `compute_action` as
//!    RLlib's.
//!
//! Built in: CartPole, MountainCar, Pendulum and Acrobot ([`envs`]),
//! checked step by step against Gymnasium; PPO with discrete actions
//! ([`ppo`]) on one learner or a learner group. Not yet: continuous-action
//! PPO, DQN, SAC, IMPALA, connectors, offline data, multi-agent
//! environments.

mod algorithm;
mod env;
pub mod envs;
mod error;
mod group;
pub mod ppo;
mod rng;
mod runner;
mod space;
mod vector;

use nimbus::actor::Registry;

pub use algorithm::{Algorithm, IterationMetrics};
pub use env::{Env, EnvFailure, NamedEnv, RegistryExt, Step};
pub use error::RlError;
pub use ppo::PpoConfig;
pub use rng::Rng;
pub use runner::EnvRunner;
pub use space::{Action, Space};
pub use vector::{Episode, VectorEnv, VectorStep};

/// Adds the library's actors and messages and the built-in environments
/// to a program's registry.
pub fn register(registry: Registry) -> Registry {
    registry
        .actor::<EnvRunner>()
        .message::<EnvRunner, runner::Sample>()
        .message::<EnvRunner, runner::Crash>()
        .actor::<group::LearnerWorker>()
        .message::<group::LearnerWorker, group::JoinGroup>()
        .message::<group::LearnerWorker, group::Update>()
        .message::<group::LearnerWorker, group::GetState>()
        .env::<envs::CartPole>()
        .env::<envs::MountainCar>()
        .env::<envs::Pendulum>()
        .env::<envs::Acrobot>()
}
