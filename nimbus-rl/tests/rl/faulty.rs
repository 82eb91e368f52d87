//! A user's environment that breaks its contract on purpose: the runner
//! must name it, the runner and the step, not panic in a tensor op.

use nimbus_rl::{Action, Env, EnvFailure, NamedEnv, PpoConfig, RlError, Space, Step};
use serde::{Deserialize, Serialize};

/// What goes wrong, and when.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Config {
    /// The constructor refuses.
    pub refuse: bool,
    /// At this step of a copy's life: an observation outside the space.
    pub outside_at: Option<u32>,
    /// At this step: a NaN reward.
    pub nan_at: Option<u32>,
}

/// A one-dimensional walk that ends after 10 steps.
pub struct Faulty {
    config: Config,
    position: f32,
    steps: u32,
    lived: u32,
}

impl NamedEnv for Faulty {
    const NAME: &'static str = "tests.Faulty";
    type Config = Config;
    fn new(config: &Config) -> Result<Self, EnvFailure> {
        if config.refuse {
            return Err("refused by its config".into());
        }
        Ok(Faulty {
            config: config.clone(),
            position: 0.0,
            steps: 0,
            lived: 0,
        })
    }
}

impl Env for Faulty {
    fn observation_space(&self) -> Space {
        Space::uniform_box(1, -10.0, 10.0)
    }

    fn action_space(&self) -> Space {
        Space::Discrete { n: 2 }
    }

    fn reset(&mut self, _: Option<u64>) -> Result<Vec<f32>, EnvFailure> {
        self.position = 0.0;
        self.steps = 0;
        Ok(vec![0.0])
    }

    fn step(&mut self, action: &Action) -> Result<Step, EnvFailure> {
        self.steps += 1;
        self.lived += 1;
        self.position += if *action == Action::Discrete(1) {
            1.0
        } else {
            -1.0
        };
        let observation = if Some(self.lived) == self.config.outside_at {
            vec![99.0]
        } else {
            vec![self.position]
        };
        let reward = if Some(self.lived) == self.config.nan_at {
            f64::NAN
        } else {
            f64::from(self.position)
        };
        Ok(Step {
            observation,
            reward,
            terminated: false,
            truncated: self.steps >= 10,
        })
    }
}

pub async fn broken_env_is_named() {
    let run = |config: Config| async move {
        let mut algo = PpoConfig::new()
            .environment::<Faulty>(config)
            .env_runners(1)
            .envs_per_runner(2)
            .rollout_length(16)
            .build()
            .await
            .unwrap();
        let error = algo
            .train()
            .await
            .expect_err("a broken environment fails the iteration");
        algo.stop().await;
        error
    };
    let error = run(Config {
        outside_at: Some(5),
        ..Config::default()
    })
    .await;
    assert!(matches!(error, RlError::Actor { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "env-runner-0 failed: environment tests.Faulty (env-runner-0, copy 0, step 4): component 0 of the observation is 99, outside [-10, 10]"
    );
    let error = run(Config {
        nan_at: Some(3),
        ..Config::default()
    })
    .await;
    assert_eq!(
        error.to_string(),
        "env-runner-0 failed: environment tests.Faulty (env-runner-0, copy 0, step 2): a reward of NaN"
    );
}
