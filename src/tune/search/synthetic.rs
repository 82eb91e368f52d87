//! The synthetic objective searchers are compared on: four parameters (a
//! uniform, a log-uniform, a choice and an integer), higher is better, its
//! optimum 0 at x = 0.7, lr = 1e-3, kind "b", depth 3. Used by the TPE
//! unit tests and by `benches/tune_search.rs` (which includes this file;
//! its Ray peer, `benches/peers/ray_tune_search.py`, has the same in
//! Python). The including module provides the names imported below.

use super::{choice, loguniform, randint, uniform, SearchSpace, Searcher, TrialConfig};

/// The objective.
pub(super) fn objective(c: &TrialConfig) -> f64 {
    let x = c["x"].as_f64().unwrap_or(f64::NAN);
    let lr = c["lr"].as_f64().unwrap_or(f64::NAN);
    let kind = if c["kind"] == "b" { 0.0 } else { -0.5 };
    let depth = (c["depth"].as_i64().unwrap_or(i64::MAX) - 3) as f64;
    -(x - 0.7).powi(2) * 4.0 - (lr.log10() + 3.0).powi(2) / 4.0 + kind - depth.powi(2) / 8.0
}

/// Its search space.
pub(super) fn space() -> SearchSpace {
    SearchSpace::new()
        .param("x", uniform(0.0, 1.0))
        .param("lr", loguniform(1e-5, 1e-1))
        .param("kind", choice(["a", "b", "c"]))
        .param("depth", randint(1, 8))
}

/// The best score `search` finds, telling it each trial's score.
pub(super) fn best_of(search: &mut dyn Searcher) -> f64 {
    let mut best = f64::NEG_INFINITY;
    while let Some(config) = search.suggest() {
        let score = objective(&config);
        best = best.max(score);
        search.on_trial_complete(&config, Some(score));
    }
    best
}
