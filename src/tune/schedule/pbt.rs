//! Population-based training (Ray's `PopulationBasedTraining`,
//! asynchronous): trials train side by side; now and then a bad one takes
//! a good one's weights (exploit) and a perturbed copy of its
//! hyperparameters (explore), and goes on from there.
//!
//! After each result of trial T at iteration t:
//! 1. T's score is its latest; unless `perturbation_interval` iterations
//!    have passed since T's last perturbation point (or its start),
//!    `Continue`;
//! 2. t becomes T's perturbation point. Rank the trials that have a score;
//!    with n of them and q = `quantile_fraction`, the bottom and top
//!    k = min(⌈n·q⌉, ⌊n/2⌋) are the lower and upper quantiles;
//! 3. if T is in the lower quantile (and k ≥ 1): pick a trial S of the
//!    upper one at random and answer `Exploit { from: S, config }`, where
//!    `config` is S's config explored: for each mutated parameter, with
//!    probability `resample_probability` (or when S's value is not one of
//!    a choice's) a fresh draw from its domain; otherwise a choice moves
//!    to a neighbouring value and a number is multiplied by 1.2 or 0.8
//!    (kept an integer for `randint`, a multiple of `q` for `quniform`,
//!    and within the domain's bounds). T's config becomes that config;
//! 4. else `Continue`.
//!
//! The tuner carries an exploit out: it copies S's newest checkpoint into
//! T's directory, stops T's run and starts T again from that copy with
//! the new config. A source without a checkpoint yet is no exploit: T
//! goes on (PBT needs trainables that checkpoint).

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::{Decision, Scheduler};
use crate::tune::search::TrialConfig;
use crate::tune::space::{Domain, SearchSpace};
use crate::tune::TuneError;

/// PBT's settings.
#[derive(Clone, Debug)]
pub struct PbtConfig {
    /// Iterations between a trial's perturbation points.
    pub perturbation_interval: u64,
    /// The share of trials in the lower (and upper) quantile, `(0, 0.5]`.
    pub quantile_fraction: f64,
    /// Probability of drawing a mutated parameter afresh, `[0, 1]`.
    pub resample_probability: f64,
    /// The parameters explored, with the domains they are drawn from (top
    /// level of the config).
    pub mutations: Vec<(String, Domain)>,
    /// Seeds the picks and perturbations.
    pub seed: u64,
}

impl PbtConfig {
    /// Ray's defaults (quantile 0.25, resample probability 0.25) for these
    /// mutations every `perturbation_interval` iterations.
    pub fn new(perturbation_interval: u64, mutations: Vec<(String, Domain)>) -> Self {
        PbtConfig {
            perturbation_interval,
            quantile_fraction: 0.25,
            resample_probability: 0.25,
            mutations,
            seed: 0,
        }
    }
}

/// Population-based training; see the module docs.
pub struct Pbt {
    config: PbtConfig,
    rng: StdRng,
    configs: HashMap<u64, TrialConfig>,
    scores: HashMap<u64, f64>,
    last_perturbation: HashMap<u64, u64>,
}

impl Pbt {
    /// PBT with `config`, refused if its settings or mutations are.
    pub fn new(config: PbtConfig) -> Result<Self, TuneError> {
        let bad = |detail: String| Err(TuneError::BadScheduler(detail));
        if config.perturbation_interval == 0 {
            return bad("PBT perturbation_interval must be at least 1".into());
        }
        if !(config.quantile_fraction > 0.0 && config.quantile_fraction <= 0.5) {
            return bad(format!(
                "PBT quantile_fraction must be in (0, 0.5], got {}",
                config.quantile_fraction
            ));
        }
        if !(0.0..=1.0).contains(&config.resample_probability) {
            return bad(format!(
                "PBT resample_probability must be in [0, 1], got {}",
                config.resample_probability
            ));
        }
        if config.mutations.is_empty() {
            return bad("PBT needs at least one mutation (hyperparameter to explore)".into());
        }
        let mut space = SearchSpace::new();
        for (name, domain) in &config.mutations {
            if matches!(
                domain,
                Domain::Grid(_) | Domain::Nested(_) | Domain::Derived(_)
            ) {
                return bad(format!(
                    "PBT mutation {name:?}: a grid, nested or derived parameter cannot be explored; give a choice or a distribution"
                ));
            }
            space = space.param(name.clone(), domain.clone());
        }
        space
            .validate()
            .map_err(|e| TuneError::BadScheduler(format!("PBT mutation {e}")))?;
        Ok(Pbt {
            rng: StdRng::seed_from_u64(config.seed),
            config,
            configs: HashMap::new(),
            scores: HashMap::new(),
            last_perturbation: HashMap::new(),
        })
    }

    /// Step 2: the lower and upper quantiles, by score.
    fn quantiles(&self) -> (Vec<u64>, Vec<u64>) {
        let mut ranked: Vec<(u64, f64)> = self
            .scores
            .iter()
            .filter(|(_, s)| !s.is_nan())
            .map(|(t, s)| (*t, *s))
            .collect();
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let n = ranked.len();
        let k = ((n as f64 * self.config.quantile_fraction).ceil() as usize).min(n / 2);
        let lower = ranked[..k].iter().map(|(t, _)| *t).collect();
        let upper = ranked[n - k..].iter().map(|(t, _)| *t).collect();
        (lower, upper)
    }

    /// Step 3: `config` with its mutated parameters explored.
    fn explore(&mut self, config: &TrialConfig) -> TrialConfig {
        let mut explored = config.clone();
        let mutations = self.config.mutations.clone();
        for (name, domain) in &mutations {
            let current = config.get(name);
            let resample = self.rng.random::<f64>() < self.config.resample_probability;
            let value = match (domain, current) {
                (Domain::Choice(values), Some(v)) if !resample => {
                    match values.iter().position(|x| x == v) {
                        Some(i) => {
                            let up = self.rng.random::<bool>();
                            let j = if up {
                                (i + 1).min(values.len() - 1)
                            } else {
                                i.saturating_sub(1)
                            };
                            values[j].clone()
                        }
                        None => self.draw(name, domain),
                    }
                }
                (_, Some(v)) if !resample && v.is_number() => {
                    let factor = if self.rng.random::<bool>() { 1.2 } else { 0.8 };
                    perturb(domain, v, factor).unwrap_or_else(|| self.draw(name, domain))
                }
                _ => self.draw(name, domain),
            };
            explored.insert(name.clone(), value);
        }
        explored
    }

    fn draw(&mut self, name: &str, domain: &Domain) -> Value {
        let space = SearchSpace::new().param(name, domain.clone());
        let mut drawn = space.sample(&mut self.rng, &Vec::new());
        drawn.remove(name).unwrap_or(Value::Null)
    }
}

/// `value` times `factor`, kept within `domain`'s bounds and kind;
/// `None` for a value or domain that is not a number's.
fn perturb(domain: &Domain, value: &Value, factor: f64) -> Option<Value> {
    let x = value.as_f64()? * factor;
    Some(match domain {
        Domain::Uniform { low, high } | Domain::LogUniform { low, high } => {
            Value::from(x.clamp(*low, *high))
        }
        Domain::QUniform { low, high, q } => Value::from(((x / q).round() * q).clamp(*low, *high)),
        Domain::RandInt { low, high } => Value::from((x.round() as i64).clamp(*low, high - 1)),
        Domain::Normal { .. } => Value::from(x),
        _ => return None,
    })
}

impl Scheduler for Pbt {
    fn on_trial_add(&mut self, trial: u64, config: &TrialConfig) {
        self.configs.insert(trial, config.clone());
    }

    fn on_result(&mut self, trial: u64, iteration: u64, score: f64) -> Decision {
        self.scores.insert(trial, score);
        let last = *self.last_perturbation.entry(trial).or_insert(0);
        if iteration < last + self.config.perturbation_interval {
            return Decision::Continue;
        }
        self.last_perturbation.insert(trial, iteration);
        let (lower, upper) = self.quantiles();
        if !lower.contains(&trial) || upper.is_empty() {
            return Decision::Continue;
        }
        let from = upper[self.rng.random_range(0..upper.len())];
        let Some(source) = self.configs.get(&from).cloned() else {
            return Decision::Continue;
        };
        let config = self.explore(&source);
        self.configs.insert(trial, config.clone());
        Decision::Exploit { from, config }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::space::{choice, randint, uniform};
    use serde_json::json;

    fn config(lr: f64, batch: i64, depth: i64) -> TrialConfig {
        let mut c = TrialConfig::new();
        c.insert("lr".into(), json!(lr));
        c.insert("batch".into(), json!(batch));
        c.insert("depth".into(), json!(depth));
        c.insert("fixed".into(), json!("kept"));
        c
    }

    fn pbt(resample_probability: f64, seed: u64) -> Pbt {
        Pbt::new(PbtConfig {
            perturbation_interval: 2,
            quantile_fraction: 0.25,
            resample_probability,
            mutations: vec![
                ("lr".into(), uniform(0.001, 0.1)),
                ("batch".into(), choice([16, 32, 64, 128])),
                ("depth".into(), randint(1, 5)),
            ],
            seed,
        })
        .unwrap()
    }

    #[test]
    fn the_worst_trial_exploits_the_best_at_its_perturbation_points() {
        let mut pbt = pbt(0.0, 3);
        for t in 0..4 {
            pbt.on_trial_add(t, &config(0.01 * (t + 1) as f64, 32, 2));
        }
        // Iteration 1: before the first perturbation point.
        for (t, score) in [(0, 1.0), (1, 2.0), (2, 3.0), (3, 4.0)] {
            assert_eq!(pbt.on_result(t, 1, score), Decision::Continue);
        }
        // Iteration 2: n = 4, k = 1; trial 0 is the lower quantile, 3 the
        // upper. Trials 1..3 go on.
        for (t, score) in [(3, 4.5), (2, 3.5), (1, 2.5)] {
            assert_eq!(pbt.on_result(t, 2, score), Decision::Continue);
        }
        let Decision::Exploit { from, config } = pbt.on_result(0, 2, 1.5) else {
            panic!("trial 0 exploits");
        };
        assert_eq!(from, 3);
        // Trial 3's lr (0.04) times 1.2 or 0.8; its batch's neighbour; its
        // depth times 1.2 or 0.8, rounded; the rest copied.
        let lr = config["lr"].as_f64().unwrap();
        assert!(
            (lr - 0.048).abs() < 1e-12 || (lr - 0.032).abs() < 1e-12,
            "{lr}"
        );
        assert!(
            [16, 64].contains(&config["batch"].as_i64().unwrap()),
            "{config:?}"
        );
        assert!(
            [2].contains(&config["depth"].as_i64().unwrap()),
            "{config:?}"
        );
        assert_eq!(config["fixed"], "kept");
        // Its next perturbation point is iteration 4, not 3.
        assert_eq!(pbt.on_result(0, 3, 0.1), Decision::Continue);
    }

    #[test]
    fn explored_values_stay_within_their_domains() {
        for seed in 0..200 {
            let mut pbt = pbt(0.25, seed);
            let edge = config(0.1, 128, 4);
            let explored = pbt.explore(&edge);
            let lr = explored["lr"].as_f64().unwrap();
            assert!((0.001..=0.1).contains(&lr), "seed {seed}: lr {lr}");
            let batch = explored["batch"].as_i64().unwrap();
            assert!([16, 32, 64, 128].contains(&batch), "seed {seed}: {batch}");
            let depth = explored["depth"].as_i64().unwrap();
            assert!((1..5).contains(&depth), "seed {seed}: depth {depth}");
        }
    }

    #[test]
    fn bad_pbt_settings_are_refused() {
        let mutations = || vec![("lr".to_string(), uniform(0.0, 1.0))];
        let mut c = PbtConfig::new(0, mutations());
        assert!(Pbt::new(c.clone()).is_err());
        c.perturbation_interval = 1;
        c.quantile_fraction = 0.6;
        assert!(Pbt::new(c.clone()).is_err());
        c.quantile_fraction = 0.25;
        assert!(Pbt::new(c.clone()).is_ok());
        assert!(Pbt::new(PbtConfig::new(1, vec![])).is_err());
        let bad = PbtConfig::new(1, vec![("lr".into(), crate::tune::loguniform(0.0, 1.0))]);
        let refused = Pbt::new(bad).err().unwrap().to_string();
        assert!(refused.contains("lr"), "{refused}");
    }
}
