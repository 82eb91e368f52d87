//! The built-in environments against Gymnasium 1.4.0's own, step by step:
//! the traces in `tests/traces` (made by `make_traces.py`) hold, for three
//! seeds each, Gymnasium's start state and, for each step of an episode,
//! the action, observation, reward, flags and state after it. Each
//! environment starts from that state and takes the same actions.

use nimbus_rl::envs::{Acrobot, CartPole, MountainCar, Pendulum};
use nimbus_rl::{Action, Env, NamedEnv};
use serde_json::Value;

/// The relative tolerance: Gymnasium computes some terms in f32 (NumPy 2
/// keeps an f32 action's type), these envs in f64.
const TOLERANCE: f64 = 1e-5;

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= TOLERANCE * want.abs().max(1.0)
}

fn floats(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// Replays `file`'s episodes on `env`, set to each start state by `set`.
fn replay<E: Env>(
    file: &str,
    mut env: E,
    set: impl Fn(&mut E, &[f64]),
    state: impl Fn(&E) -> Vec<f64>,
    continuous: bool,
) -> usize {
    let path = format!("{}/tests/traces/{file}.json", env!("CARGO_MANIFEST_DIR"));
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut steps = 0;
    for episode in trace["episodes"].as_array().unwrap() {
        let seed = &episode["seed"];
        env.reset(Some(0)).unwrap();
        set(&mut env, &floats(&episode["state"]));
        for (t, expected) in episode["steps"].as_array().unwrap().iter().enumerate() {
            let action = if continuous {
                Action::Continuous(
                    floats(&expected["action"])
                        .iter()
                        .map(|&v| v as f32)
                        .collect(),
                )
            } else {
                Action::Discrete(expected["action"].as_u64().unwrap() as u32)
            };
            let step = env.step(&action).unwrap();
            let at = format!("{file} seed {seed} step {t}");
            for (got, want) in state(&env).iter().zip(floats(&expected["state"])) {
                assert!(
                    close(*got, want),
                    "{at}: state {:?} vs {}",
                    state(&env),
                    expected["state"]
                );
            }
            for (got, want) in step
                .observation
                .iter()
                .zip(floats(&expected["observation"]))
            {
                assert!(
                    close(f64::from(*got), want),
                    "{at}: observation {:?} vs {}",
                    step.observation,
                    expected["observation"]
                );
            }
            let reward = expected["reward"].as_f64().unwrap();
            assert!(
                close(step.reward, reward),
                "{at}: reward {} vs {reward}",
                step.reward
            );
            assert_eq!(
                step.terminated,
                expected["terminated"].as_bool().unwrap(),
                "{at}: terminated"
            );
            assert_eq!(
                step.truncated,
                expected["truncated"].as_bool().unwrap(),
                "{at}: truncated"
            );
            steps += 1;
        }
    }
    steps
}

pub fn match_gymnasium() {
    let steps = [
        replay(
            "cartpole",
            CartPole::new(&()).unwrap(),
            |e, s| e.set_state(s).unwrap(),
            CartPole::state,
            false,
        ),
        replay(
            "mountain_car",
            MountainCar::new(&()).unwrap(),
            |e, s| e.set_state(s).unwrap(),
            MountainCar::state,
            false,
        ),
        replay(
            "pendulum",
            Pendulum::new(&()).unwrap(),
            |e, s| e.set_state(s).unwrap(),
            Pendulum::state,
            true,
        ),
        replay(
            "acrobot",
            Acrobot::new(&()).unwrap(),
            |e, s| e.set_state(s).unwrap(),
            Acrobot::state,
            false,
        ),
    ];
    println!(
        "  steps checked: cartpole {}, mountain_car {}, pendulum {}, acrobot {}",
        steps[0], steps[1], steps[2], steps[3]
    );
    assert!(steps.iter().all(|&n| n > 0));
}
