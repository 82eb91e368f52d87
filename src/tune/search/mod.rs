//! Searchers: which config the next trial gets.
//!
//! Files: this one (the trait, and random and grid search), `tpe.rs` (a
//! model-based searcher), `synthetic.rs` (the objective searchers are
//! compared on, in tests and a benchmark).
//!
//! [`BasicSearch`] is Ray Tune's default (`BasicVariantGenerator`): random
//! search over the random parameters, crossed with every grid point; the
//! whole grid is repeated `num_samples` times, so an experiment has
//! `num_samples × grid points` trials, in this order: sample 0 at every
//! grid point, then sample 1, …. Draws come from one generator seeded with
//! `TuneConfig::seed`, so an experiment's configs repeat.

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{Map, Value};

#[cfg(test)]
mod synthetic;
mod tpe;

#[cfg(test)]
use super::space::{choice, loguniform, randint, uniform};
pub use tpe::{Tpe, TpeConfig};

use super::space::{GridPoint, SearchSpace};
use super::TuneError;

/// A trial's config: a JSON object, decoded into the trainable's `Config`.
pub type TrialConfig = Map<String, Value>;

/// Chooses the configs of an experiment's trials.
pub trait Searcher: Send {
    /// The next trial's config, or `None` once the search is over.
    fn suggest(&mut self) -> Option<TrialConfig>;
    /// How many trials the search makes, if it knows.
    fn total(&self) -> Option<usize>;
    /// A trial ended with `score` (its metric, higher is better), or with
    /// none (it reported no metric, or failed for good), for searchers
    /// that learn from results or track the trials running.
    fn on_trial_complete(&mut self, _config: &TrialConfig, _score: Option<f64>) {}
    /// The experiment was restored: the suggestions it replayed to bring
    /// the searcher where it was are not trials running now.
    fn restored(&mut self) {}
}

/// Which searcher an experiment uses.
#[derive(Clone, Debug, Default)]
pub enum SearchConfig {
    /// Random and grid search ([`BasicSearch`]).
    #[default]
    Basic,
    /// The Tree-structured Parzen Estimator ([`Tpe`]).
    Tpe(TpeConfig),
}

impl SearchConfig {
    /// The searcher for `space`, `num_samples` and `seed`.
    pub fn build(
        &self,
        space: SearchSpace,
        num_samples: usize,
        seed: u64,
    ) -> Result<Box<dyn Searcher>, TuneError> {
        Ok(match self {
            SearchConfig::Basic => Box::new(BasicSearch::new(space, num_samples, seed)),
            SearchConfig::Tpe(config) => {
                Box::new(Tpe::new(space, num_samples, seed, config.clone())?)
            }
        })
    }
}

/// Random and grid search; see the module docs.
pub struct BasicSearch {
    space: SearchSpace,
    points: Vec<GridPoint>,
    num_samples: usize,
    next: usize,
    rng: StdRng,
}

impl BasicSearch {
    /// `num_samples` draws at each of `space`'s grid points, from `seed`.
    pub fn new(space: SearchSpace, num_samples: usize, seed: u64) -> Self {
        BasicSearch {
            points: space.grid_points(),
            space,
            num_samples,
            next: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }
}

impl Searcher for BasicSearch {
    fn suggest(&mut self) -> Option<TrialConfig> {
        if self.next >= self.num_samples * self.points.len() {
            return None;
        }
        let point = &self.points[self.next % self.points.len()];
        self.next += 1;
        Some(self.space.sample(&mut self.rng, point))
    }

    fn total(&self) -> Option<usize> {
        Some(self.num_samples * self.points.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::space::{grid, uniform};

    #[test]
    fn num_samples_repeats_the_grid_with_fresh_draws() {
        let space = SearchSpace::new()
            .param("a", grid([1, 2, 3]))
            .param("x", uniform(0.0, 1.0));
        let mut search = BasicSearch::new(space, 2, 5);
        assert_eq!(search.total(), Some(6));
        let configs: Vec<TrialConfig> = std::iter::from_fn(|| search.suggest()).collect();
        assert_eq!(configs.len(), 6);
        let a: Vec<i64> = configs.iter().map(|c| c["a"].as_i64().unwrap()).collect();
        assert_eq!(a, [1, 2, 3, 1, 2, 3]);
        let mut xs: Vec<f64> = configs.iter().map(|c| c["x"].as_f64().unwrap()).collect();
        xs.dedup();
        assert_eq!(xs.len(), 6, "each trial its own draw");
        assert_eq!(search.suggest(), None);
    }
}
