//! End-to-end tests of the reinforcement-learning example: this binary is
//! the user program (driver and, started by node managers, the
//! environment runners), running the example's own modules on a 2-node
//! local cluster.
//!
//! No libtest harness (a worker must reach `nimbus::init` first): `main`
//! runs every test in turn under a deadline (`tests/common/harness.rs`).

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "../../examples/rl_cartpole/cartpole.rs"]
mod cartpole;
#[path = "../../../tests/common/harness.rs"]
mod harness;
#[path = "../../examples/rl_cartpole/learner_group.rs"]
mod learner_group;
#[path = "../../examples/rl_cartpole/ppo.rs"]
mod ppo;
#[path = "../../examples/rl_cartpole/runner.rs"]
mod runner;
#[path = "../../examples/rl_cartpole/training.rs"]
mod training;

use std::time::Duration;

use harness::{boxed, Test};
use training::Settings;

const DEADLINE: Duration = Duration::from_secs(120);

const ALL: &[(&str, Test)] = &[
    ("cartpole_dynamics_match_gymnasium", |_| {
        boxed(async { cartpole_dynamics_match_gymnasium() })
    }),
    ("ppo_on_two_runners_improves_the_mean_return", |_| {
        boxed(ppo_improves())
    }),
    ("a_learner_group_of_two_improves_it_too", |_| {
        boxed(learner_group_improves())
    }),
    ("a_killed_runner_is_replaced", |_| {
        boxed(killed_runner_is_replaced())
    }),
];

fn main() {
    let driver = nimbus::init_with(runner::registry(), nimbus::InitOptions::private(2))
        .expect("a local cluster starts");
    harness::run(driver, ALL, DEADLINE, || {})
}

/// Next states from Gymnasium 1.4.0's CartPole-v1 (`env.unwrapped.state`
/// set, then `step`), which keeps its state in float64.
fn cartpole_dynamics_match_gymnasium() {
    let actions = [1, 0, 0, 1, 1, 1, 0, 1, 0, 0];
    let expected: [[f64; 4]; 10] = [
        [
            0.009600000000000001,
            0.17467919574755525,
            0.030799999999999998,
            -0.2430687179600081,
        ],
        [
            0.013093583914951107,
            -0.020868848948191993,
            0.025938625640799837,
            0.0591679999394166,
        ],
        [
            0.012676206935987267,
            -0.21635292104612766,
            0.02712198563958817,
            0.3599205713784138,
        ],
        [
            0.008349148515064714,
            -0.021626799199488206,
            0.03432039706715644,
            0.0759116989474441,
        ],
        [
            0.00791661253107495,
            0.17298676004769037,
            0.035838631046105324,
            -0.20574851582677406,
        ],
        [
            0.011376347732028757,
            0.3675783725675468,
            0.03172366072956984,
            -0.4869142013445082,
        ],
        [
            0.01872791518337969,
            0.17202349486382784,
            0.02198537670267968,
            -0.18440428392099584,
        ],
        [
            0.022168385080656248,
            0.36682408600495897,
            0.01829729102425976,
            -0.4700713747851109,
        ],
        [
            0.02950486680075543,
            0.1714485132472654,
            0.008895863528557544,
            -0.17167796834313398,
        ],
        [
            0.03293383706570074,
            -0.02379962460232901,
            0.0054623041616948635,
            0.12379799946559022,
        ],
    ];
    let mut state = [0.01, -0.02, 0.03, 0.04];
    for (action, expected) in actions.iter().zip(expected) {
        state = cartpole::dynamics(state, *action);
        for (got, want) in state.iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{state:?} vs {expected:?}");
        }
        assert!(!cartpole::terminal(&state));
    }
    // At the track's edge (x = 2.4 exactly) the episode goes on; past 12°
    // it ends.
    let edge = cartpole::dynamics([2.39, 0.5, 0.0, 0.0], 1);
    assert!(
        (edge[0] - 2.4).abs() < 1e-12 && !cartpole::terminal(&edge),
        "{edge:?}"
    );
    let fallen = cartpole::dynamics([0.0, 0.0, 0.2, 0.5], 0);
    assert!(
        (fallen[2] - 0.21).abs() < 1e-12 && cartpole::terminal(&fallen),
        "{fallen:?}"
    );
    // Truncation at 500 steps: balance by pushing against the pole's lean.
    let mut env = cartpole::CartPole::new(3);
    let mut last = None;
    for _ in 0..cartpole::MAX_STEPS {
        let state = env.state();
        let step = env.step(u8::from(state[2] + 0.5 * state[3] > 0.0));
        last = Some(step);
        if step.terminated {
            break;
        }
    }
    let last = last.unwrap();
    assert!(
        last.truncated && !last.terminated,
        "a balanced pole is truncated at 500 steps"
    );
}

fn settings(max_env_steps: u64) -> Settings {
    Settings {
        runners: 2,
        learners: 1,
        envs_per_runner: 8,
        rollout_steps: 64,
        seed: 1,
        max_env_steps,
        target: 475.0,
        kill_runner_at_iter: None,
        verbose: false,
        results: None,
    }
}

async fn ppo_improves() {
    let outcome = training::train(&settings(40_960))
        .await
        .expect("training runs");
    println!(
        "  mean return of the first 100 episodes {:.1}, of the last 100 after {} steps {:.1} ({:.1} s, solved: {})",
        outcome.first_mean_return_100,
        outcome.env_steps,
        outcome.mean_return_100,
        outcome.seconds,
        outcome.solved
    );
    assert!(
        outcome.mean_return_100 > 3.0 * outcome.first_mean_return_100,
        "{outcome:?}"
    );
    let mut nodes = outcome.runner_nodes.clone();
    nodes.dedup();
    assert_eq!(
        nodes.len(),
        2,
        "one runner per node: {:?}",
        outcome.runner_nodes
    );
}

async fn killed_runner_is_replaced() {
    let results = tempfile::tempdir().unwrap();
    let settings = Settings {
        kill_runner_at_iter: Some(2),
        results: Some(results.path().to_path_buf()),
        ..settings(8_192)
    };
    let outcome = training::train(&settings).await.expect("training goes on");
    // Every iteration is on disk, and the losses are plotted.
    let reports = nimbus_train::results::read_reports(results.path()).unwrap();
    let indices: Vec<u64> = reports.iter().map(|r| r.index).collect();
    assert_eq!(
        indices,
        (1..=8).collect::<Vec<_>>(),
        "one line per iteration"
    );
    assert!(reports
        .iter()
        .all(|r| r.metrics.contains_key("policy_loss")));
    let csv = std::fs::read_to_string(results.path().join("progress.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 8, "{csv}");
    let svg = std::fs::read_to_string(results.path().join("loss.svg")).unwrap();
    assert!(
        svg.contains("policy_loss") && svg.contains("value_loss"),
        "{svg}"
    );
    // The head's record of the runners: one restart, whether or not a
    // rollout call was in flight when the process died.
    assert_eq!(outcome.runner_restarts, 1, "{outcome:?}");
    println!("  rollout calls asked again: {}", outcome.lost_calls);
    assert_eq!(outcome.env_steps, 8_192, "every iteration ran: {outcome:?}");
}

async fn learner_group_improves() {
    let results = tempfile::tempdir().unwrap();
    let settings = Settings {
        learners: 2,
        results: Some(results.path().to_path_buf()),
        ..settings(40_960)
    };
    let outcome = training::train(&settings).await.expect("training runs");
    // The group's losses (the mean of its learners') are reported and
    // plotted, as a single learner's are.
    let svg = std::fs::read_to_string(results.path().join("loss.svg")).unwrap();
    assert!(
        svg.contains("policy_loss") && svg.contains("value_loss"),
        "{svg}"
    );
    println!(
        "  two learners: mean return {:.1} -> {:.1} after {} steps",
        outcome.first_mean_return_100, outcome.mean_return_100, outcome.env_steps
    );
    assert!(
        outcome.mean_return_100 > 3.0 * outcome.first_mean_return_100,
        "{outcome:?}"
    );
}
