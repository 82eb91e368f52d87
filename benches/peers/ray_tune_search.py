"""Search quality at a fixed budget, Ray Tune's side of `benches/tune_search.rs`.

The best score Ray Tune's `OptunaSearch` (Optuna's TPE sampler, Ray's
recommended model-based searcher) and its random search find in 40 trials
of the same synthetic objective, space and budget as nimbus's bench, mean
over 200 seeds. Only the searchers run (suggest, then on_trial_complete), no
trials:

    python3 -m venv /tmp/ray && /tmp/ray/bin/pip install "ray[tune]==2.60.0" optuna
    /tmp/ray/bin/python benches/peers/ray_tune_search.py
    cargo bench --bench tune_search

It prints `ray_tune_search_{optuna_tpe,random}_mean_best` (higher is
better; 0 is the optimum) and the standard error of each mean.
"""

import logging
import math

import numpy as np
import optuna
from ray import tune
from ray.tune.search.optuna import OptunaSearch

TRIALS = 40
SEEDS = 200

SPACE = {
    "x": tune.uniform(0.0, 1.0),
    "lr": tune.loguniform(1e-5, 1e-1),
    "kind": tune.choice(["a", "b", "c"]),
    "depth": tune.randint(1, 8),
}


def objective(c):
    kind = 0.0 if c["kind"] == "b" else -0.5
    depth = c["depth"] - 3
    return (
        -((c["x"] - 0.7) ** 2) * 4.0
        - (math.log10(c["lr"]) + 3.0) ** 2 / 4.0
        + kind
        - depth**2 / 8.0
    )


def best_of(searcher):
    best = -math.inf
    for i in range(TRIALS):
        trial_id = f"t{i}"
        config = searcher.suggest(trial_id)
        score = objective(config)
        best = max(best, score)
        searcher.on_trial_complete(trial_id, {"score": score})
    return best


def random_best(seed):
    """Ray Tune's random search: each domain's own sampler, seeded."""
    rng = np.random.default_rng(seed)
    best = -math.inf
    for _ in range(TRIALS):
        config = {name: domain.sample(random_state=rng) for name, domain in SPACE.items()}
        best = max(best, objective(config))
    return best


def main():
    optuna.logging.set_verbosity(logging.WARNING)
    tpe, random = [], []
    for seed in range(SEEDS):
        searcher = OptunaSearch(
            space=OptunaSearch.convert_search_space(SPACE),
            metric="score",
            mode="max",
            sampler=optuna.samplers.TPESampler(seed=seed),
        )
        tpe.append(best_of(searcher))
        random.append(random_best(seed))
    for name, bests in (("optuna_tpe", tpe), ("random", random)):
        print(f"ray_tune_search_{name}_mean_best: {np.mean(bests):.4f} score")
        sem = np.std(bests, ddof=1) / math.sqrt(SEEDS)
        print(f"ray_tune_search_{name}_mean_best_stderr: {sem:.4f} score")


if __name__ == "__main__":
    main()
