//! What can go wrong in an RL run, each saying who and what.

use std::path::PathBuf;

use nimbus::actor::{CallError, SpawnError};
use nimbus::object_store::ObjectStoreError;
use nimbus::placement::PlacementError;
use nimbus_train::collective::CollectiveError;
use nimbus_train::tch::TchError;

/// The errors of nimbus-rl.
#[derive(Debug, thiserror::Error)]
pub enum RlError {
    /// A config setting that cannot work; refused by `build()` before
    /// anything starts.
    #[error("setting {setting}: {why}")]
    Setting {
        /// The setting (the builder method's name).
        setting: &'static str,
        /// Why not.
        why: String,
    },
    /// An environment broke its contract, or failed.
    #[error("environment {env} ({owner}, copy {copy}, step {step}): {why}")]
    Env {
        /// The environment's registered name.
        env: String,
        /// Who ran it (an env runner, or the driver's evaluation).
        owner: String,
        /// Which of the runner's copies.
        copy: usize,
        /// The runner's vector step at which it happened.
        step: u64,
        /// What was wrong.
        why: String,
    },
    /// The environment is not registered in this program.
    #[error(
        "environment {0} is not registered in this binary (Registry::env, nimbus_rl::RegistryExt)"
    )]
    NotRegistered(String),
    /// An environment's constructor failed.
    #[error("environment {env} could not be built from its config: {why}")]
    Build {
        /// The environment.
        env: String,
        /// Its constructor's error.
        why: String,
    },
    /// An env runner or learner reported a failure.
    #[error("{actor} failed: {why}")]
    Actor {
        /// The actor (e.g. `env-runner-1`).
        actor: String,
        /// Its error.
        why: String,
    },
    /// An env runner kept dying while sampling.
    #[error("{actor} died {times} times in one iteration; giving up (max_runner_restarts)")]
    KeptDying {
        /// The runner.
        actor: String,
        /// How often.
        times: u32,
    },
    /// Starting an actor failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// A call to an actor failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The object store failed.
    #[error(transparent)]
    Objects(#[from] ObjectStoreError),
    /// Placing the runners or learners failed.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The learner group's allreduce failed.
    #[error("learner group: {0}")]
    Collective(#[from] CollectiveError),
    /// libtorch failed.
    #[error("libtorch: {0}")]
    Torch(#[from] TchError),
    /// Reading or writing a saved algorithm failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Weights or optimizer state of another policy's shape.
    #[error("weights of another policy: {0} (were hidden sizes or the environment changed?)")]
    PolicyShape(String),
    /// A directory that does not hold a saved algorithm of this kind.
    #[error("{path} cannot be restored: {why}")]
    Restore {
        /// The directory.
        path: PathBuf,
        /// Why.
        why: String,
    },
}
