//! The environment a user writes, with Gymnasium's semantics, and its
//! registration: env runners are processes of the user's own binary, so an
//! environment is registered by a stable name (as actors and task
//! functions are) and built there from its config.

use std::collections::HashMap;
use std::error::Error;
use std::sync::Arc;

use nimbus::actor::Registry;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::space::{Action, Space};

/// What an environment's own code may fail with: its message is carried
/// into the error that names the environment, runner and step.
pub type EnvFailure = Box<dyn Error + Send + Sync>;

/// What one step did.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The observation after it.
    pub observation: Vec<f32>,
    /// The reward for it.
    pub reward: f64,
    /// The episode ended in a terminal state (no bootstrap past it).
    pub terminated: bool,
    /// The episode was cut short (a time limit): its value is bootstrapped.
    pub truncated: bool,
}

/// An environment: Gymnasium's `reset` and `step`.
///
/// Observations are flat `f32` vectors in
/// [`observation_space`](Env::observation_space); actions come in
/// [`action_space`](Env::action_space)'s form. An environment that needs a
/// time limit applies it itself and reports `truncated` (the built-in ones
/// do, as Gymnasium's `TimeLimit`). Runners check every observation and
/// reward: one outside its space, or a NaN reward, fails the iteration
/// with an error naming the environment, runner and step.
pub trait Env: Send + 'static {
    /// What observations are.
    fn observation_space(&self) -> Space;
    /// What actions are.
    fn action_space(&self) -> Space;
    /// Starts an episode; with a seed, the environment's generator is
    /// seeded first. Returns the first observation.
    fn reset(&mut self, seed: Option<u64>) -> Result<Vec<f32>, EnvFailure>;
    /// One step with `action` (checked against the action space first).
    fn step(&mut self, action: &Action) -> Result<Step, EnvFailure>;
}

/// An environment env runners can build: a stable name and a config.
pub trait NamedEnv: Env + Sized {
    /// Its name, the same in every build of the program (e.g.
    /// `"my_project.Maze"`).
    const NAME: &'static str;
    /// What builds one (sent to the runners as JSON).
    type Config: Serialize + DeserializeOwned + Clone + Send + Sync + 'static;
    /// Builds one; an `Err` fails `build()` (on the driver) or the runner's
    /// start, naming the environment.
    fn new(config: &Self::Config) -> Result<Self, EnvFailure>;
}

/// Builds an environment from its JSON config.
pub(crate) type MakeEnv =
    Arc<dyn Fn(&serde_json::Value) -> Result<Box<dyn Env>, EnvFailure> + Send + Sync>;

/// The environments a program registered, by name (their table in the
/// [`Registry`]).
#[derive(Clone, Default)]
pub(crate) struct EnvTable(HashMap<&'static str, MakeEnv>);

impl EnvTable {
    /// The constructor registered as `name` in `registry`.
    pub(crate) fn lookup(registry: &Registry, name: &str) -> Option<MakeEnv> {
        registry.table::<EnvTable>()?.0.get(name).cloned()
    }
}

/// Builds `E` from a JSON config.
pub(crate) fn make<E: NamedEnv>(config: &serde_json::Value) -> Result<Box<dyn Env>, EnvFailure> {
    let config: E::Config = serde_json::from_value(config.clone())?;
    Ok(Box::new(E::new(&config)?))
}

/// Registers environments on a program's [`Registry`].
pub trait RegistryExt {
    /// Registers `E`, so env runners of this program can build it.
    fn env<E: NamedEnv>(self) -> Self;
}

impl RegistryExt for Registry {
    fn env<E: NamedEnv>(self) -> Self {
        let entry: MakeEnv = Arc::new(make::<E>);
        self.extend(|table: &mut EnvTable| {
            table.0.insert(E::NAME, entry);
        })
    }
}
