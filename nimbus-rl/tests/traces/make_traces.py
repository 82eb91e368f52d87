"""Reference traces of Gymnasium's classic-control environments, which the
built-in environments of nimbus-rl are checked against step by step
(tests/rl/envs.rs).

Run once, with Gymnasium installed (1.4.0 made the files here):

    python3 nimbus-rl/tests/traces/make_traces.py nimbus-rl/tests/traces

For each environment and seed: reset with the seed, the internal state
(float64, `env.unwrapped.state`), then seeded random actions until the
episode ends (terminated, or truncated by the time limit), each step's
action, observation, reward, flags and internal state after it.
"""

import json
import sys

import gymnasium as gym
import numpy as np

ENVS = {
    "CartPole-v1": "cartpole",
    "MountainCar-v0": "mountain_car",
    "Pendulum-v1": "pendulum",
    "Acrobot-v1": "acrobot",
}


def plain(value):
    if isinstance(value, np.ndarray):
        return [float(v) for v in value.reshape(-1)]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    return value


def trace(name, seed):
    env = gym.make(name)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    episode = {
        "seed": seed,
        "state": plain(np.asarray(env.unwrapped.state, dtype=np.float64)),
        "observation": plain(obs),
        "steps": [],
    }
    while True:
        action = env.action_space.sample()
        obs, reward, terminated, truncated, _ = env.step(action)
        episode["steps"].append(
            {
                "action": plain(action),
                "observation": plain(obs),
                "reward": float(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "state": plain(np.asarray(env.unwrapped.state, dtype=np.float64)),
            }
        )
        if terminated or truncated:
            return episode


def main(out):
    for name, file in ENVS.items():
        episodes = [trace(name, seed) for seed in (0, 1, 2)]
        record = {"env": name, "gymnasium": gym.__version__, "episodes": episodes}
        with open(f"{out}/{file}.json", "w") as f:
            json.dump(record, f)
            f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
