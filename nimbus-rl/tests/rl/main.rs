//! End-to-end tests of nimbus RL: this binary is the user program (driver
//! and, started by node managers, the env runners and learners) on a
//! 2-node local cluster.
//!
//! No libtest harness (a worker must reach `nimbus::init` first): `main`
//! runs every test in turn under a deadline (`tests/common/harness.rs`).

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "../../../tests/common/harness.rs"]
mod harness;

mod envs;
mod faulty;

use std::time::Duration;

use harness::{boxed, Test};
use nimbus_rl::envs::{CartPole, Pendulum};
use nimbus_rl::{PpoConfig, RegistryExt, RlError};

const DEADLINE: Duration = Duration::from_secs(120);

const ALL: &[(&str, Test)] = &[
    ("envs_match_gymnasium_step_by_step", |_| {
        boxed(async { envs::match_gymnasium() })
    }),
    ("impossible_configs_are_refused_naming_the_setting", |_| {
        boxed(impossible_configs_are_refused())
    }),
    (
        "a_broken_env_fails_the_iteration_naming_env_runner_and_step",
        |_| boxed(faulty::broken_env_is_named()),
    ),
    (
        "ppo_on_two_runners_learns_cartpole",
        |_| boxed(ppo_learns()),
    ),
    ("a_learner_group_of_two_learns_too", |_| {
        boxed(learner_group_learns())
    }),
    ("a_killed_runner_is_replaced_and_sampling_goes_on", |_| {
        boxed(killed_runner_is_replaced())
    }),
    ("save_with_two_runners_restore_with_three", |_| {
        boxed(save_and_restore_elsewhere())
    }),
];

fn main() {
    let registry = nimbus_rl::register(nimbus::actor::Registry::new()).env::<faulty::Faulty>();
    let driver = nimbus::init_with(registry, nimbus::InitOptions::private(2))
        .expect("a local cluster starts");
    harness::run(driver, ALL, DEADLINE, harness::Leaves::NothingInUse, || {})
}

fn cartpole() -> PpoConfig {
    PpoConfig::new()
        .environment::<CartPole>(())
        .env_runners(2)
        .envs_per_runner(8)
        .rollout_length(64)
        .seed(1)
}

async fn impossible_configs_are_refused() {
    let refused = |result: Result<nimbus_rl::Algorithm, RlError>| match result {
        Err(RlError::Setting { setting, why }) => format!("{setting}: {why}"),
        Err(other) => panic!("refused, but not as a setting: {other}"),
        Ok(_) => panic!("an impossible config was built"),
    };
    let why = refused(PpoConfig::new().build().await);
    assert_eq!(why, "environment: no environment was given");
    let why = refused(cartpole().minibatches(2000).build().await);
    assert!(
        why.starts_with("minibatches: 2000 minibatches of a learner's batch of 1024"),
        "{why}"
    );
    let why = refused(cartpole().env_runners(3).learners(2).build().await);
    assert_eq!(
        why,
        "learners: 3 env runners do not divide evenly among 2 learners"
    );
    let why = refused(cartpole().gamma(1.5).build().await);
    assert_eq!(why, "gamma: 1.5 is not in (0, 1]");
    let why = refused(cartpole().envs_per_runner(0).build().await);
    assert_eq!(why, "envs_per_runner: must be at least 1");
    let why = refused(PpoConfig::new().environment::<Pendulum>(()).build().await);
    assert!(
        why.starts_with("environment: nimbus_rl.Pendulum-v1 has the action space Box"),
        "{why}"
    );
    // A constructor's own error names the environment.
    let config = faulty::Config {
        refuse: true,
        ..faulty::Config::default()
    };
    match PpoConfig::new()
        .environment::<faulty::Faulty>(config)
        .build()
        .await
    {
        Err(e @ RlError::Build { .. }) => assert_eq!(
            e.to_string(),
            "environment tests.Faulty could not be built from its config: refused by its config"
        ),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("built"),
    }
}

/// Iterations until the mean return of the last 100 episodes is 3× the
/// first iteration's, or `limit` iterations.
async fn learn(algo: &mut nimbus_rl::Algorithm, limit: u64) -> (f64, f64) {
    let first = algo.train().await.unwrap();
    let start = first.episode_return_mean;
    let mut last = first;
    while last.iteration < limit && last.episode_return_mean < 3.0 * start {
        last = algo.train().await.unwrap();
    }
    println!(
        "  mean return {start:.1} -> {:.1} after {} iterations ({} env steps)",
        last.episode_return_mean, last.iteration, last.env_steps_sampled
    );
    (start, last.episode_return_mean)
}

async fn ppo_learns() {
    let mut algo = cartpole().build().await.unwrap();
    let mut nodes = Vec::new();
    for runner in algo.runners() {
        nodes.push(runner.record().await.unwrap().node.name);
    }
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 2, "one runner per node: {nodes:?}");
    let (start, end) = learn(&mut algo, 40).await;
    assert!(end >= 3.0 * start, "{start} -> {end}");
    // The greedy policy in the driver acts and evaluates.
    let action = algo.compute_action(&[0.0, 0.0, 0.1, 0.0]).unwrap();
    assert!(
        matches!(action, nimbus_rl::Action::Discrete(0 | 1)),
        "{action:?}"
    );
    assert!(algo.compute_action(&[0.0]).is_err());
    let evaluated = algo.evaluate(8).unwrap();
    println!("  greedy evaluation over 8 episodes: {evaluated:.1}");
    assert!(evaluated > start, "{evaluated} vs {start}");
    algo.stop().await;
}

async fn learner_group_learns() {
    let mut algo = cartpole().learners(2).build().await.unwrap();
    let (start, end) = learn(&mut algo, 60).await;
    assert!(end >= 3.0 * start, "{start} -> {end}");
    algo.stop().await;
}

async fn killed_runner_is_replaced() {
    let mut algo = cartpole().build().await.unwrap();
    algo.train().await.unwrap();
    algo.crash_runner(0).unwrap();
    let mut lost = 0;
    for _ in 0..3 {
        let m = algo.train().await.expect("training goes on");
        lost += m.lost_rollouts;
        assert_eq!(
            m.env_steps_sampled,
            m.iteration * 1024,
            "every rollout came"
        );
    }
    let record = algo.runners()[0].record().await.unwrap();
    assert_eq!(record.restarts, 1, "the head's record: one restart");
    println!("  rollouts asked again: {lost}");
    algo.stop().await;
}

async fn save_and_restore_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let mut algo = cartpole().build().await.unwrap();
    let mut before = None;
    for _ in 0..12 {
        before = Some(algo.train().await.unwrap());
    }
    let before = before.unwrap();
    algo.save(dir.path()).await.unwrap();
    let action = algo.compute_action(&[0.01, 0.2, -0.05, -0.3]).unwrap();
    algo.stop().await;
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!files.iter().any(|f| f.ends_with(".partial")), "{files:?}");

    let mut restored = nimbus_rl::Algorithm::restore(cartpole().env_runners(3), dir.path())
        .await
        .unwrap();
    assert_eq!(restored.runners().len(), 3);
    assert_eq!(restored.iteration(), 12);
    assert_eq!(
        restored.compute_action(&[0.01, 0.2, -0.05, -0.3]).unwrap(),
        action,
        "the same weights"
    );
    let after = restored.train().await.unwrap();
    assert_eq!(after.iteration, 13);
    assert_eq!(
        after.env_steps_sampled,
        before.env_steps_sampled + 3 * 8 * 64
    );
    println!(
        "  mean return {:.1} before saving, {:.1} one iteration after restoring on 3 runners",
        before.episode_return_mean, after.episode_return_mean
    );
    assert!(
        after.episode_return_mean >= 0.5 * before.episode_return_mean,
        "learning continued: {} -> {}",
        before.episode_return_mean,
        after.episode_return_mean
    );
    restored.stop().await;

    // Another network or environment is refused, naming the directory.
    match nimbus_rl::Algorithm::restore(cartpole().hidden(&[32]), dir.path()).await {
        Err(e @ RlError::Restore { .. }) => assert!(e.to_string().contains("its policy is"), "{e}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("restored into another network"),
    }
}
