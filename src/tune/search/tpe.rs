//! TPE, the Tree-structured Parzen Estimator (Bergstra et al. 2011; the
//! default sampler of Optuna and HyperOpt), univariate as Optuna's default.
//!
//! For each suggestion:
//! 1. the first `n_startup_trials` configs are random draws from the space
//!    (as `BasicSearch`);
//! 2. after that, the completed trials (with a score) are split: the best
//!    `γ(n) = min(⌈n/10⌉, 25)` are "good", the rest "bad";
//! 3. for each parameter on its own, a Parzen estimator (a mixture of
//!    truncated normals, one per observation plus one wide prior, each
//!    as wide as the larger gap to its neighbours, clipped) is fitted to
//!    the good values, l(x), and one to the bad, g(x); log-uniform
//!    parameters are modelled in log space, integers and steps rounded
//!    after; a choice is a categorical with counts plus one;
//! 4. `n_ei_candidates` values are drawn from l and the one with the
//!    largest l(x)/g(x) (the expected improvement's argmax) is taken;
//! 5. derived parameters are computed from the chosen ones.
//!
//! The space's grids and nested spaces are refused (TPE models flat
//! spaces; draw a grid's values with a `choice`).

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::{Searcher, TrialConfig};
use crate::tune::space::{Domain, SearchSpace};
use crate::tune::TuneError;

/// TPE's settings.
#[derive(Clone, Debug)]
pub struct TpeConfig {
    /// Random configs before the model is used (Optuna: 10).
    pub n_startup_trials: usize,
    /// Candidates drawn from l(x) per parameter (Optuna: 24).
    pub n_ei_candidates: usize,
}

impl Default for TpeConfig {
    fn default() -> Self {
        TpeConfig {
            n_startup_trials: 10,
            n_ei_candidates: 24,
        }
    }
}

/// The TPE searcher; see the module docs.
pub struct Tpe {
    space: SearchSpace,
    config: TpeConfig,
    num_samples: usize,
    suggested: usize,
    rng: StdRng,
    /// Completed trials' configs and scores (higher is better).
    observed: Vec<(TrialConfig, f64)>,
}

impl Tpe {
    /// `num_samples` suggestions from `space`, seeded; refused for a space
    /// with grids or nested spaces.
    pub fn new(
        space: SearchSpace,
        num_samples: usize,
        seed: u64,
        config: TpeConfig,
    ) -> Result<Self, TuneError> {
        for (name, domain) in space.params() {
            if matches!(domain, Domain::Grid(_) | Domain::Nested(_)) {
                return Err(TuneError::BadSpace {
                    param: name.clone(),
                    detail: "is a grid or a nested space, which TPE does not model: use a choice, or the basic searcher".into(),
                });
            }
        }
        Ok(Tpe {
            space,
            config,
            num_samples,
            suggested: 0,
            rng: StdRng::seed_from_u64(seed),
            observed: Vec::new(),
        })
    }

    /// Steps 2–5.
    fn model(&mut self) -> TrialConfig {
        let observed = self.observed.clone();
        let mut ranked: Vec<&(TrialConfig, f64)> = observed.iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let n_good = ranked.len().div_ceil(10).clamp(1, 25);
        let (good, bad) = ranked.split_at(n_good);
        let mut config = TrialConfig::new();
        let params = self.space.params().to_vec();
        for (name, domain) in &params {
            let values = |set: &[&(TrialConfig, f64)]| -> Vec<Value> {
                set.iter()
                    .filter_map(|(c, _)| c.get(name).cloned())
                    .collect()
            };
            let (good, bad) = (values(good), values(bad));
            let value = match domain {
                Domain::Derived(_) => continue,
                Domain::Constant(v) => v.clone(),
                Domain::Choice(options) => self.categorical(options, &good, &bad),
                numeric => match Numeric::of(numeric) {
                    Some(numeric) => self.numeric(&numeric, &good, &bad),
                    None => continue,
                },
            };
            config.insert(name.clone(), value);
        }
        self.space.derive(&mut config);
        config
    }

    fn categorical(&mut self, options: &[Value], good: &[Value], bad: &[Value]) -> Value {
        let weights = |seen: &[Value]| -> Vec<f64> {
            let mut counts: HashMap<usize, f64> = HashMap::new();
            for v in seen {
                if let Some(i) = options.iter().position(|o| o == v) {
                    *counts.entry(i).or_default() += 1.0;
                }
            }
            let total = seen.len() as f64 + options.len() as f64;
            (0..options.len())
                .map(|i| (counts.get(&i).copied().unwrap_or(0.0) + 1.0) / total)
                .collect()
        };
        let (l, g) = (weights(good), weights(bad));
        let mut best = (f64::NEG_INFINITY, 0);
        for _ in 0..self.config.n_ei_candidates {
            let mut u = self.rng.random::<f64>();
            let mut i = 0;
            while i + 1 < l.len() && u >= l[i] {
                u -= l[i];
                i += 1;
            }
            let ratio = l[i].ln() - g[i].ln();
            if ratio > best.0 {
                best = (ratio, i);
            }
        }
        options[best.1].clone()
    }

    fn numeric(&mut self, numeric: &Numeric, good: &[Value], bad: &[Value]) -> Value {
        let points = |values: &[Value]| -> Vec<f64> {
            values
                .iter()
                .filter_map(Value::as_f64)
                .map(|x| numeric.to_model(x))
                .collect()
        };
        let l = Parzen::fit(&points(good), numeric.low, numeric.high);
        let g = Parzen::fit(&points(bad), numeric.low, numeric.high);
        let mut best = (f64::NEG_INFINITY, (numeric.low + numeric.high) / 2.0);
        for _ in 0..self.config.n_ei_candidates {
            let x = l.sample(&mut self.rng);
            let ratio = l.log_pdf(x) - g.log_pdf(x);
            if ratio > best.0 {
                best = (ratio, x);
            }
        }
        numeric.value_of(best.1)
    }
}

impl Searcher for Tpe {
    fn suggest(&mut self) -> Option<TrialConfig> {
        if self.suggested >= self.num_samples {
            return None;
        }
        self.suggested += 1;
        if self.observed.len() < self.config.n_startup_trials {
            return Some(self.space.sample(&mut self.rng, &Vec::new()));
        }
        Some(self.model())
    }

    fn total(&self) -> Option<usize> {
        Some(self.num_samples)
    }

    fn on_trial_complete(&mut self, config: &TrialConfig, score: Option<f64>) {
        if let Some(score) = score.filter(|s| !s.is_nan()) {
            self.observed.push((config.clone(), score));
        }
    }
}

/// A numeric parameter as the model sees it: bounds in model space (log
/// for log-uniform) and how values map back.
struct Numeric {
    low: f64,
    high: f64,
    log: bool,
    /// Round to a multiple of this after mapping back (1 for integers).
    step: Option<f64>,
    integer: bool,
}

impl Numeric {
    fn of(domain: &Domain) -> Option<Numeric> {
        let plain = |low: f64, high: f64| Numeric {
            low,
            high,
            log: false,
            step: None,
            integer: false,
        };
        Some(match domain {
            Domain::Uniform { low, high } => plain(*low, *high),
            Domain::LogUniform { low, high } => Numeric {
                log: true,
                ..plain(low.ln(), high.ln())
            },
            Domain::QUniform { low, high, q } => Numeric {
                step: Some(*q),
                ..plain(*low, *high)
            },
            Domain::RandInt { low, high } => Numeric {
                integer: true,
                ..plain(*low as f64, (*high - 1) as f64 + 0.999_999)
            },
            Domain::Normal { mean, sd } => plain(mean - 5.0 * sd, mean + 5.0 * sd),
            _ => return None,
        })
    }

    fn to_model(&self, x: f64) -> f64 {
        if self.log {
            x.max(f64::MIN_POSITIVE).ln()
        } else {
            x
        }
    }

    fn value_of(&self, x: f64) -> Value {
        let x = x.clamp(self.low, self.high);
        if self.integer {
            return Value::from(x.floor() as i64);
        }
        let x = if self.log { x.exp() } else { x };
        match self.step {
            Some(q) => Value::from((x / q).round() * q),
            None => Value::from(x),
        }
    }
}

/// A mixture of normals truncated to `[low, high]`, equally weighted: one
/// per observation and a prior over the whole range (step 3).
struct Parzen {
    low: f64,
    high: f64,
    components: Vec<(f64, f64)>,
}

impl Parzen {
    fn fit(points: &[f64], low: f64, high: f64) -> Parzen {
        let range = high - low;
        let mut mus: Vec<f64> = points.iter().map(|x| x.clamp(low, high)).collect();
        mus.push((low + high) / 2.0);
        mus.sort_by(f64::total_cmp);
        let n = mus.len();
        let min_sigma = range / (100f64).min(1.0 + n as f64);
        let components = (0..n)
            .map(|i| {
                let left = if i == 0 {
                    mus[i] - low
                } else {
                    mus[i] - mus[i - 1]
                };
                let right = if i + 1 == n {
                    high - mus[i]
                } else {
                    mus[i + 1] - mus[i]
                };
                let sigma = left.max(right).clamp(min_sigma, range);
                (mus[i], sigma)
            })
            .collect();
        Parzen {
            low,
            high,
            components,
        }
    }

    fn sample(&self, rng: &mut StdRng) -> f64 {
        let (mu, sigma) = self.components[rng.random_range(0..self.components.len())];
        for _ in 0..100 {
            let u: f64 = 1.0 - rng.random::<f64>();
            let v: f64 = rng.random();
            let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
            let x = mu + sigma * z;
            if (self.low..=self.high).contains(&x) {
                return x;
            }
        }
        mu
    }

    fn log_pdf(&self, x: f64) -> f64 {
        let weight = 1.0 / self.components.len() as f64;
        let density: f64 = self
            .components
            .iter()
            .map(|&(mu, sigma)| {
                let mass = phi((self.high - mu) / sigma) - phi((self.low - mu) / sigma);
                let z = (x - mu) / sigma;
                weight * (-0.5 * z * z).exp()
                    / (sigma * (2.0 * std::f64::consts::PI).sqrt() * mass.max(1e-12))
            })
            .sum();
        density.max(1e-300).ln()
    }
}

/// The standard normal CDF (Abramowitz and Stegun 7.1.26 for erf,
/// |error| < 1.5e-7).
fn phi(x: f64) -> f64 {
    let z = x / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-z * z).exp();
    0.5 * (1.0 + if z >= 0.0 { erf } else { -erf })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::search::synthetic::{best_of, objective, space};
    use crate::tune::search::BasicSearch;

    #[test]
    fn tpe_beats_random_search_at_the_same_budget() {
        let (mut tpe_wins, mut tpe_total, mut random_total) = (0, 0.0, 0.0);
        let seeds = 20;
        for seed in 0..seeds {
            let tpe = best_of(&mut Tpe::new(space(), 40, seed, TpeConfig::default()).unwrap());
            let random = best_of(&mut BasicSearch::new(space(), 40, seed));
            tpe_wins += usize::from(tpe > random);
            tpe_total += tpe;
            random_total += random;
        }
        let (tpe, random) = (tpe_total / seeds as f64, random_total / seeds as f64);
        assert!(tpe > random, "mean best: TPE {tpe:.4}, random {random:.4}");
        assert!(tpe_wins >= 17, "TPE better in {tpe_wins} of {seeds} seeds");
    }

    #[test]
    fn suggestions_stay_in_their_domains_and_grids_are_refused() {
        let mut tpe = Tpe::new(space(), 60, 1, TpeConfig::default()).unwrap();
        while let Some(c) = tpe.suggest() {
            let x = c["x"].as_f64().unwrap();
            let lr = c["lr"].as_f64().unwrap();
            let depth = c["depth"].as_i64().unwrap();
            assert!(
                (0.0..=1.0).contains(&x) && (1e-5..=1e-1).contains(&lr),
                "{c:?}"
            );
            assert!((1..8).contains(&depth), "{c:?}");
            assert!(["a", "b", "c"].iter().any(|k| c["kind"] == *k), "{c:?}");
            tpe.on_trial_complete(&c, Some(objective(&c)));
        }
        let grid = SearchSpace::new().param("g", crate::tune::space::grid([1, 2]));
        let refused = Tpe::new(grid, 4, 0, TpeConfig::default()).err().unwrap();
        assert!(refused.to_string().contains("\"g\""), "{refused}");
    }

    #[test]
    fn phi_matches_known_values() {
        for (x, p) in [
            (0.0, 0.5),
            (1.0, 0.841_344_7),
            (-1.96, 0.024_997_9),
            (3.0, 0.998_650_1),
        ] {
            assert!((phi(x) - p).abs() < 1e-6, "phi({x}) = {}", phi(x));
        }
    }
}
