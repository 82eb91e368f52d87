//! `k` copies of an environment stepped together, reset as each episode
//! ends (Gymnasium's auto-reset), every observation, reward and action
//! checked against the spaces with errors that name the environment, the
//! copy and the step.

use crate::env::{Env, EnvFailure, Step};
use crate::error::RlError;
use crate::space::{Action, Space};

/// An episode that ended: its return and length.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Episode {
    /// The sum of its rewards.
    pub ret: f64,
    /// Its steps.
    pub len: u32,
}

/// What stepping every copy once gave, copy by copy.
#[derive(Clone, Debug, Default)]
pub struct VectorStep {
    /// Each copy's reward.
    pub rewards: Vec<f64>,
    /// Each copy's episode ended in a terminal state.
    pub terminated: Vec<bool>,
    /// Each copy's episode was cut short; its last observation is in
    /// `final_observations`.
    pub truncated: Vec<bool>,
    /// The observation a truncated copy stopped in (before its reset), for
    /// bootstrapping; `None` for the others.
    pub final_observations: Vec<Option<Vec<f32>>>,
    /// Episodes that ended in this step.
    pub episodes: Vec<Episode>,
}

/// `k` copies of one environment.
pub struct VectorEnv {
    name: String,
    envs: Vec<Box<dyn Env>>,
    observation_space: Space,
    action_space: Space,
    /// Each copy's current observation.
    observations: Vec<Vec<f32>>,
    /// Each copy's episode so far: return and length.
    running: Vec<Episode>,
    /// Steps taken by all copies together.
    steps: u64,
    /// Who runs it, for errors (e.g. "env runner 2").
    owner: String,
}

impl VectorEnv {
    /// `envs` (at least one, all of the environment `name`), each reset
    /// with its own seed `seed + i`; `owner` names who runs them in errors.
    pub fn new(
        name: &str,
        envs: Vec<Box<dyn Env>>,
        seed: u64,
        owner: &str,
    ) -> Result<Self, RlError> {
        let Some(first) = envs.first() else {
            return Err(RlError::Setting {
                setting: "envs_per_runner",
                why: "must be at least 1".into(),
            });
        };
        let (observation_space, action_space) = (first.observation_space(), first.action_space());
        let mut vector = VectorEnv {
            name: name.to_string(),
            observations: Vec::with_capacity(envs.len()),
            running: vec![Episode { ret: 0.0, len: 0 }; envs.len()],
            envs,
            observation_space,
            action_space,
            steps: 0,
            owner: owner.to_string(),
        };
        for i in 0..vector.envs.len() {
            let seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
            let observation = vector.envs[i].reset(Some(seed));
            let observation = vector.checked_observation(i, observation)?;
            vector.observations.push(observation);
        }
        Ok(vector)
    }

    /// Copies.
    pub fn len(&self) -> usize {
        self.envs.len()
    }

    /// Whether there are none (never: `new` refuses that).
    pub fn is_empty(&self) -> bool {
        self.envs.is_empty()
    }

    /// The observation space.
    pub fn observation_space(&self) -> &Space {
        &self.observation_space
    }

    /// The action space.
    pub fn action_space(&self) -> &Space {
        &self.action_space
    }

    /// Every copy's current observation, flat (`k × observation length`).
    pub fn observations(&self) -> Vec<f32> {
        self.observations.concat()
    }

    /// Steps copy `i` with `actions[i]`; a copy whose episode ends is reset.
    pub fn step(&mut self, actions: &[Action]) -> Result<VectorStep, RlError> {
        if actions.len() != self.envs.len() {
            return Err(self.error(
                0,
                format!("{} actions for {} copies", actions.len(), self.envs.len()),
            ));
        }
        let mut out = VectorStep::default();
        for (i, action) in actions.iter().enumerate() {
            self.action_space
                .check_action(action)
                .map_err(|why| self.error(i, why))?;
            let step = self.envs[i].step(action);
            let Step {
                observation,
                reward,
                terminated,
                truncated,
            } = step.map_err(|e| self.error(i, e.to_string()))?;
            if !reward.is_finite() {
                return Err(self.error(i, format!("a reward of {reward}")));
            }
            let observation = self.checked_observation(i, Ok(observation))?;
            self.running[i].ret += reward;
            self.running[i].len += 1;
            out.rewards.push(reward);
            out.terminated.push(terminated);
            out.truncated.push(truncated);
            if terminated || truncated {
                out.episodes.push(self.running[i]);
                self.running[i] = Episode { ret: 0.0, len: 0 };
                out.final_observations
                    .push(truncated.then(|| observation.clone()));
                let first = self.envs[i].reset(None);
                self.observations[i] = self.checked_observation(i, first)?;
            } else {
                out.final_observations.push(None);
                self.observations[i] = observation;
            }
        }
        self.steps += 1;
        Ok(out)
    }

    fn checked_observation(
        &self,
        i: usize,
        observation: Result<Vec<f32>, EnvFailure>,
    ) -> Result<Vec<f32>, RlError> {
        let observation = observation.map_err(|e| self.error(i, e.to_string()))?;
        self.observation_space
            .check_observation(&observation)
            .map_err(|why| self.error(i, why))?;
        Ok(observation)
    }

    fn error(&self, copy: usize, why: String) -> RlError {
        RlError::Env {
            env: self.name.clone(),
            owner: self.owner.clone(),
            copy,
            step: self.steps,
            why,
        }
    }
}
