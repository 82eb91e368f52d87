//! Search quality at a fixed budget: the best score each searcher finds in
//! 40 trials of a synthetic objective of four parameters (a uniform, a
//! log-uniform, a choice and an integer), mean over 200 seeds; no trial
//! runs, only the searchers. Its peer, `benches/peers/ray_tune_search.py`,
//! measures Ray Tune's `OptunaSearch` (Optuna's TPE) and random search on
//! the same objective, space and budget.
//!
//! ```text
//! cargo bench --bench tune_search
//! /tmp/ray/bin/python benches/peers/ray_tune_search.py
//! ```
//!
//! It prints `tune_search_{tpe,tpe_univariate,random}_mean_best` (higher
//! is better; 0 is the optimum), the standard error of each mean, and how often TPE beat
//! random search.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use nimbus::tune::{
    choice, loguniform, randint, uniform, BasicSearch, SearchSpace, Searcher, Tpe, TpeConfig,
    TrialConfig,
};
use synthetic::{best_of, space};

const TRIALS: usize = 40;
const SEEDS: u64 = 200;

/// The objective and its space, shared with the TPE unit tests.
#[path = "../src/tune/search/synthetic.rs"]
mod synthetic;

/// The mean of `xs` and its standard error.
fn mean_and_stderr(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let variance = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (variance / n).sqrt())
}

fn main() {
    let (mut tpe, mut univariate, mut random) = (Vec::new(), Vec::new(), Vec::new());
    for seed in 0..SEEDS {
        tpe.push(best_of(
            &mut Tpe::new(space(), TRIALS, seed, TpeConfig::default()).unwrap(),
        ));
        let independent = TpeConfig {
            multivariate: false,
            ..TpeConfig::default()
        };
        univariate.push(best_of(
            &mut Tpe::new(space(), TRIALS, seed, independent).unwrap(),
        ));
        random.push(best_of(&mut BasicSearch::new(space(), TRIALS, seed)));
    }
    let wins = tpe.iter().zip(&random).filter(|(t, r)| t > r).count();
    for (name, bests) in [
        ("tpe", &tpe),
        ("tpe_univariate", &univariate),
        ("random", &random),
    ] {
        let (mean, stderr) = mean_and_stderr(bests);
        println!("tune_search_{name}_mean_best: {mean:.4} score");
        println!("tune_search_{name}_mean_best_stderr: {stderr:.4} score");
    }
    println!("tune_search_tpe_wins: {wins} of {SEEDS} seeds");
}
