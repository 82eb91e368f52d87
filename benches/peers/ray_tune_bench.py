"""Ray Tune's per-trial overhead, the peer of `examples/tune_bench.rs`.

N trivial trials, each reporting R results, one CPU per trial, on a local
Ray of `--cpus` CPUs (Ray's default `reuse_actors` for function trainables).
Run both in the same run on the same machine:

    python3 -m venv /tmp/ray && /tmp/ray/bin/pip install "ray[tune]==2.60.0"
    /tmp/ray/bin/python benches/peers/ray_tune_bench.py --trials 100 --reports 10
    make run EXAMPLE=tune_bench ARGS="--trials 100 --reports 10"

It prints `ray_tune_trials_per_s` and `ray_tune_results_per_s` lines, the
same names as nimbus's with a `ray_` prefix.
"""

import argparse
import tempfile
import time

import ray
from ray import tune


def trivial(config):
    for i in range(config["reports"]):
        tune.report({"score": config["x"] * i, "step": i})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--reports", type=int, default=10)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as storage:
        tuner = tune.Tuner(
            tune.with_resources(trivial, {"cpu": 1}),
            param_space={"x": tune.uniform(0.0, 1.0), "reports": args.reports},
            tune_config=tune.TuneConfig(
                num_samples=args.trials,
                metric="score",
                mode="max",
                max_concurrent_trials=args.cpus,
            ),
            run_config=tune.RunConfig(storage_path=storage, name="bench", verbose=0),
        )
        started = time.monotonic()
        grid = tuner.fit()
        seconds = time.monotonic() - started
    errors = grid.num_errors
    results = sum(len(r.metrics_dataframe) for r in grid if r.metrics_dataframe is not None)
    ray.shutdown()
    print(f"ray_tune_trials_per_s: {args.trials / seconds:.2f} trials/s")
    print(f"ray_tune_results_per_s: {results / seconds:.1f} results/s")
    print(
        f"summary: trials={args.trials} reports={args.reports} results={results} "
        f"errors={errors} seconds={seconds:.1f}"
    )


if __name__ == "__main__":
    main()
