//! Your own environment trained with PPO, saved, restored on another number
//! of runners, and evaluated: the README's "Reinforcement learning" code.
//!
//! ```text
//! make run EXAMPLE=custom_env
//! ```
//!
//! One line per iteration (iteration, mean return of the last 100
//! episodes), then `summary: first_return=... last_return=...
//! restored_iteration=... evaluation=... action_at_3=...`: the corridor is
//! learnt when the return nears 1 (walk right to +10 in the fewest
//! steps).

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use nimbus_rl::{Action, Env, EnvFailure, NamedEnv, PpoConfig, RegistryExt, Space, Step};

/// A corridor from -10 to +10: +1 for reaching the right end, -0.01 a
/// step; the left end terminates with nothing.
struct Corridor {
    position: i32,
    steps: u32,
}

impl NamedEnv for Corridor {
    const NAME: &'static str = "my_project.Corridor"; // the same in every build
    type Config = (); // any serde type
    fn new(_: &()) -> Result<Self, EnvFailure> {
        Ok(Corridor {
            position: 0,
            steps: 0,
        })
    }
}

impl Env for Corridor {
    fn observation_space(&self) -> Space {
        Space::uniform_box(1, -10.0, 10.0)
    }

    fn action_space(&self) -> Space {
        Space::Discrete { n: 2 }
    }

    fn reset(&mut self, _seed: Option<u64>) -> Result<Vec<f32>, EnvFailure> {
        (self.position, self.steps) = (0, 0);
        Ok(vec![0.0])
    }

    fn step(&mut self, action: &Action) -> Result<Step, EnvFailure> {
        self.position += if *action == Action::Discrete(1) {
            1
        } else {
            -1
        };
        self.steps += 1;
        Ok(Step {
            observation: vec![self.position as f32],
            reward: if self.position == 10 { 1.0 } else { -0.01 },
            terminated: self.position.abs() == 10,
            truncated: self.steps == 200,
        })
    }
}

fn main() -> anyhow::Result<()> {
    // Runners are processes of this binary: register the env in main.
    let registry = nimbus_rl::register(nimbus::actor::Registry::new()).env::<Corridor>();
    let driver = nimbus::init(registry)?;
    driver.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile_dir()?;
    let mut algo = PpoConfig::new()
        .environment::<Corridor>(())
        .env_runners(2)
        .envs_per_runner(8)
        .build() // every setting checked, one env built here first
        .await?;
    let mut first = None;
    for _ in 0..15 {
        let m = algo.train().await?;
        println!(
            "iter {} mean_return_100 {:.2}",
            m.iteration, m.episode_return_mean
        );
        first.get_or_insert(m.episode_return_mean);
    }
    algo.save(&dir).await?;
    algo.stop().await;
    // Later, with 3 runners this time.
    let config = PpoConfig::new().environment::<Corridor>(()).env_runners(3);
    let mut again = nimbus_rl::Algorithm::restore(config, &dir).await?;
    let m = again.train().await?;
    println!(
        "iter {} mean_return_100 {:.2} (restored, 3 runners)",
        m.iteration, m.episode_return_mean
    );
    let evaluation = again.evaluate(10)?;
    let action = again.compute_action(&[3.0])?; // greedy
    again.stop().await;
    std::fs::remove_dir_all(&dir)?;
    println!(
        "summary: first_return={:.2} last_return={:.2} restored_iteration={} evaluation={evaluation:.2} action_at_3={action:?}",
        first.unwrap_or_default(),
        m.episode_return_mean,
        m.iteration,
    );
    Ok(())
}

/// A fresh directory for the saved algorithm (removed at the end).
fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("corridor-ppo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
