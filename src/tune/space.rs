//! Search spaces: typed parameters a trial's config is sampled from, as
//! Ray Tune's `tune.choice`, `tune.grid_search`, `tune.uniform`, ….
//!
//! A [`SearchSpace`] is an ordered list of named [`Domain`]s. Sampling
//! (with a seeded generator, so an experiment's configs repeat) makes a
//! JSON object, which reaches the trainable as its typed `Config` (serde):
//!
//! 1. every grid parameter takes the value of the grid point being
//!    sampled (the searcher walks the cross product of all grids, nested
//!    ones included, `search.rs`);
//! 2. every random parameter is drawn, in the order they were added;
//! 3. every [`Domain::Derived`] parameter is computed last, in order, from
//!    the config drawn so far at its level (Ray's `tune.sample_from`): a
//!    conditional parameter is one whose function looks at another.
//!
//! A space is checked before any trial starts ([`SearchSpace::validate`]):
//! an empty choice, `low >= high`, a log-uniform bound `<= 0` or a step
//! `<= 0` is refused, naming the parameter.

use std::fmt;
use std::sync::Arc;

use rand::{Rng, RngCore};
use serde::Serialize;
use serde_json::{Map, Value};

use super::TuneError;

/// A user function of the config drawn so far at its level.
pub type DeriveFn = Arc<dyn Fn(&Map<String, Value>) -> Value + Send + Sync>;

/// Where one parameter's values come from.
#[derive(Clone)]
pub enum Domain {
    /// Always this value.
    Constant(Value),
    /// One of these, uniformly.
    Choice(Vec<Value>),
    /// Every one of these, one per grid point (a cross product with the
    /// other grids).
    Grid(Vec<Value>),
    /// A float in `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
    },
    /// A float in `[low, high]` rounded to a multiple of `q`.
    QUniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
        /// The step.
        q: f64,
    },
    /// A float in `[low, high)` whose logarithm is uniform.
    LogUniform {
        /// Lower bound, `> 0`.
        low: f64,
        /// Upper bound.
        high: f64,
    },
    /// An integer in `[low, high)`.
    RandInt {
        /// Lower bound.
        low: i64,
        /// Upper bound, excluded.
        high: i64,
    },
    /// A float from a normal distribution.
    Normal {
        /// Its mean.
        mean: f64,
        /// Its standard deviation, `> 0`.
        sd: f64,
    },
    /// A nested object of parameters.
    Nested(SearchSpace),
    /// Computed from the parameters drawn before it at its level (step 3).
    Derived(DeriveFn),
}

impl fmt::Debug for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Domain::Constant(v) => write!(f, "Constant({v})"),
            Domain::Choice(v) => write!(f, "Choice({v:?})"),
            Domain::Grid(v) => write!(f, "Grid({v:?})"),
            Domain::Uniform { low, high } => write!(f, "Uniform({low}, {high})"),
            Domain::QUniform { low, high, q } => write!(f, "QUniform({low}, {high}, {q})"),
            Domain::LogUniform { low, high } => write!(f, "LogUniform({low}, {high})"),
            Domain::RandInt { low, high } => write!(f, "RandInt({low}, {high})"),
            Domain::Normal { mean, sd } => write!(f, "Normal({mean}, {sd})"),
            Domain::Nested(space) => write!(f, "Nested({space:?})"),
            Domain::Derived(_) => write!(f, "Derived(fn)"),
        }
    }
}

fn json(value: impl Serialize) -> Value {
    // Serializing plain values (numbers, strings, their structs) to a JSON
    // value fails only for maps with non-string keys.
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// One of `values`, uniformly (`tune.choice`).
pub fn choice<T: Serialize>(values: impl IntoIterator<Item = T>) -> Domain {
    Domain::Choice(values.into_iter().map(json).collect())
}

/// Every one of `values` (`tune.grid_search`).
pub fn grid<T: Serialize>(values: impl IntoIterator<Item = T>) -> Domain {
    Domain::Grid(values.into_iter().map(json).collect())
}

/// A float in `[low, high)` (`tune.uniform`).
pub fn uniform(low: f64, high: f64) -> Domain {
    Domain::Uniform { low, high }
}

/// A float in `[low, high]`, a multiple of `q` (`tune.quniform`).
pub fn quniform(low: f64, high: f64, q: f64) -> Domain {
    Domain::QUniform { low, high, q }
}

/// A float in `[low, high)`, uniform in its logarithm (`tune.loguniform`).
pub fn loguniform(low: f64, high: f64) -> Domain {
    Domain::LogUniform { low, high }
}

/// An integer in `[low, high)` (`tune.randint`).
pub fn randint(low: i64, high: i64) -> Domain {
    Domain::RandInt { low, high }
}

/// A float from N(`mean`, `sd`²) (`tune.randn`).
pub fn normal(mean: f64, sd: f64) -> Domain {
    Domain::Normal { mean, sd }
}

/// A value computed from the parameters drawn before it (`tune.sample_from`).
pub fn derived(f: impl Fn(&Map<String, Value>) -> Value + Send + Sync + 'static) -> Domain {
    Domain::Derived(Arc::new(f))
}

/// Always `value`.
pub fn constant(value: impl Serialize) -> Domain {
    Domain::Constant(json(value))
}

/// The parameters a trial's config is drawn from; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct SearchSpace {
    params: Vec<(String, Domain)>,
}

/// One grid point: the value of each grid parameter, by its path.
pub type GridPoint = Vec<(Vec<String>, Value)>;

impl SearchSpace {
    /// An empty space (every trial's config is `{}`).
    pub fn new() -> Self {
        SearchSpace::default()
    }

    /// Adds parameter `name` (replacing one of that name).
    pub fn param(mut self, name: impl Into<String>, domain: Domain) -> Self {
        let name = name.into();
        self.params.retain(|(n, _)| *n != name);
        self.params.push((name, domain));
        self
    }

    /// Adds a nested object of parameters.
    pub fn nested(self, name: impl Into<String>, space: SearchSpace) -> Self {
        self.param(name, Domain::Nested(space))
    }

    /// Its parameters, in the order they were added.
    pub fn params(&self) -> &[(String, Domain)] {
        &self.params
    }

    /// Step 3 alone: computes the derived parameters of `config`, whose
    /// other parameters were chosen elsewhere (a model-based searcher).
    pub fn derive(&self, config: &mut Map<String, Value>) {
        for (name, domain) in &self.params {
            if let Domain::Derived(f) = domain {
                let value = f(config);
                config.insert(name.clone(), value);
            }
        }
    }

    /// Refuses a space no trial could be sampled from; see the module docs.
    pub fn validate(&self) -> Result<(), TuneError> {
        self.validate_at("")
    }

    fn validate_at(&self, prefix: &str) -> Result<(), TuneError> {
        for (name, domain) in &self.params {
            let param = format!("{prefix}{name}");
            let bad = |detail: String| {
                Err(TuneError::BadSpace {
                    param: param.clone(),
                    detail,
                })
            };
            let finite = |xs: &[f64]| xs.iter().all(|x| x.is_finite());
            match domain {
                Domain::Choice(v) | Domain::Grid(v) if v.is_empty() => {
                    return bad("has no values to choose from".into())
                }
                Domain::Uniform { low, high } | Domain::QUniform { low, high, .. }
                    if !finite(&[*low, *high, high - low]) || low >= high =>
                {
                    return bad(format!(
                        "needs finite bounds with low < high, got [{low}, {high}]"
                    ))
                }
                Domain::QUniform { q, .. } if !(q.is_finite() && *q > 0.0) => {
                    return bad(format!("needs a step q > 0, got {q}"))
                }
                Domain::QUniform { low, high, q } if (low / q).ceil() > (high / q).floor() => {
                    return bad(format!("has no multiple of {q} in [{low}, {high}]"))
                }
                Domain::LogUniform { low, high } if !finite(&[*low, *high]) || *low <= 0.0 => {
                    return bad(format!(
                        "is log-uniform: its bounds must be > 0, got [{low}, {high}]"
                    ))
                }
                Domain::LogUniform { low, high } if low >= high => {
                    return bad(format!("needs low < high, got [{low}, {high}]"))
                }
                Domain::RandInt { low, high } if low >= high => {
                    return bad(format!("needs low < high, got [{low}, {high})"))
                }
                Domain::Normal { mean, sd } if !finite(&[*mean, *sd]) || *sd <= 0.0 => {
                    return bad(format!(
                        "needs a finite mean and sd > 0, got N({mean}, {sd})"
                    ))
                }
                Domain::Nested(space) => space.validate_at(&format!("{param}."))?,
                _ => {}
            }
        }
        Ok(())
    }

    /// The cross product of every grid parameter's values, nested ones
    /// included (one empty point when there is no grid).
    pub fn grid_points(&self) -> Vec<GridPoint> {
        let mut points = vec![GridPoint::new()];
        self.add_grids(&[], &mut points);
        points
    }

    fn add_grids(&self, path: &[String], points: &mut Vec<GridPoint>) {
        for (name, domain) in &self.params {
            let mut here = path.to_vec();
            here.push(name.clone());
            match domain {
                Domain::Grid(values) => {
                    *points = points
                        .iter()
                        .flat_map(|point| {
                            values.iter().map(|v| {
                                let mut point = point.clone();
                                point.push((here.clone(), v.clone()));
                                point
                            })
                        })
                        .collect();
                }
                Domain::Nested(space) => space.add_grids(&here, points),
                _ => {}
            }
        }
    }

    /// Draws a config at grid point `point` (steps 1–3 of the module docs).
    pub fn sample(&self, rng: &mut dyn RngCore, point: &GridPoint) -> Map<String, Value> {
        self.sample_at(&[], rng, point)
    }

    fn sample_at(
        &self,
        path: &[String],
        rng: &mut dyn RngCore,
        point: &GridPoint,
    ) -> Map<String, Value> {
        let mut config = Map::new();
        for (name, domain) in &self.params {
            let mut here = path.to_vec();
            here.push(name.clone());
            let value = match domain {
                Domain::Derived(_) => continue,
                Domain::Constant(v) => v.clone(),
                Domain::Choice(values) => values[rng.random_range(0..values.len())].clone(),
                Domain::Grid(values) => point
                    .iter()
                    .find(|(p, _)| *p == here)
                    .map_or_else(|| values[0].clone(), |(_, v)| v.clone()),
                Domain::Uniform { low, high } => json(rng.random_range(*low..*high)),
                Domain::QUniform { low, high, q } => {
                    // Multiples of q within the bounds only.
                    let (first, last) = ((low / q).ceil(), (high / q).floor());
                    let x = (rng.random_range(*low..=*high) / q)
                        .round()
                        .clamp(first, last);
                    json(x * q)
                }
                Domain::LogUniform { low, high } => {
                    json(rng.random_range(low.ln()..high.ln()).exp())
                }
                Domain::RandInt { low, high } => json(rng.random_range(*low..*high)),
                Domain::Normal { mean, sd } => json(mean + sd * standard_normal(rng)),
                Domain::Nested(space) => Value::Object(space.sample_at(&here, rng, point)),
            };
            config.insert(name.clone(), value);
        }
        self.derive(&mut config);
        config
    }
}

/// A draw from N(0, 1) (Box–Muller).
fn standard_normal(rng: &mut dyn RngCore) -> f64 {
    let u: f64 = 1.0 - rng.random::<f64>();
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn draws(domain: Domain, n: usize) -> Vec<f64> {
        let space = SearchSpace::new().param("x", domain);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        (0..n)
            .map(|_| space.sample(&mut rng, &Vec::new())["x"].as_f64().unwrap())
            .collect()
    }

    fn mean_sd(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt())
    }

    #[test]
    fn each_distribution_has_its_range_and_moments() {
        let n = 20_000;
        // Uniform [2, 6): mean 4, sd 4/sqrt(12).
        let xs = draws(uniform(2.0, 6.0), n);
        assert!(xs.iter().all(|x| (2.0..6.0).contains(x)));
        let (mean, sd) = mean_sd(&xs);
        assert!((mean - 4.0).abs() < 0.05, "{mean}");
        assert!((sd - 4.0 / 12f64.sqrt()).abs() < 0.03, "{sd}");
        // Log-uniform [1e-4, 1): log10 uniform on [-4, 0).
        let logs: Vec<f64> = draws(loguniform(1e-4, 1.0), n)
            .iter()
            .map(|x| x.log10())
            .collect();
        assert!(logs.iter().all(|l| (-4.0..0.0).contains(l)));
        let below = logs.iter().filter(|l| **l < -2.0).count() as f64 / n as f64;
        assert!((below - 0.5).abs() < 0.02, "half below 1e-2: {below}");
        // Normal(3, 2).
        let (mean, sd) = mean_sd(&draws(normal(3.0, 2.0), n));
        assert!(
            (mean - 3.0).abs() < 0.06 && (sd - 2.0).abs() < 0.05,
            "{mean} {sd}"
        );
        // Bounds that are not multiples: only the multiples inside.
        let xs = draws(quniform(0.1, 0.9, 0.25), 2_000);
        assert!(
            xs.iter().all(|x| [0.25, 0.5, 0.75].contains(x)),
            "{:?}",
            &xs[..5]
        );
        // Quantized: multiples of 0.25 within bounds, ends included.
        let xs = draws(quniform(0.0, 1.0, 0.25), n);
        for x in [0.0, 0.25, 0.5, 0.75, 1.0] {
            assert!(xs.contains(&x), "{x} drawn");
        }
        assert!(xs
            .iter()
            .all(|x| (x * 4.0).fract() == 0.0 && (0.0..=1.0).contains(x)));
        // randint [3, 7): each of 3..=6 about a quarter of the time.
        let xs = draws(randint(3, 7), n);
        for k in 3..7 {
            let share = xs.iter().filter(|x| **x == k as f64).count() as f64 / n as f64;
            assert!((share - 0.25).abs() < 0.02, "{k}: {share}");
        }
        let choices = draws(choice([1.5, 2.5]), n);
        let share = choices.iter().filter(|x| **x == 1.5).count() as f64 / n as f64;
        assert!((share - 0.5).abs() < 0.02, "{share}");
    }

    #[test]
    fn grids_cross_nested_ones_and_derived_values_see_the_draw() {
        let space = SearchSpace::new()
            .param("lr", grid([0.1, 0.01]))
            .param(
                "layers",
                derived(|c| json(c["width"].as_i64().unwrap() / 32)),
            )
            .param("width", choice([64, 128]))
            .nested(
                "optim",
                SearchSpace::new()
                    .param("kind", grid(["sgd", "adam", "lamb"]))
                    .param("momentum", constant(0.9)),
            );
        let points = space.grid_points();
        assert_eq!(points.len(), 6);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let configs: Vec<Value> = points
            .iter()
            .map(|p| Value::Object(space.sample(&mut rng, p)))
            .collect();
        let pairs: std::collections::BTreeSet<String> = configs
            .iter()
            .map(|c| format!("{} {}", c["lr"], c["optim"]["kind"]))
            .collect();
        assert_eq!(pairs.len(), 6, "every combination once: {pairs:?}");
        for c in &configs {
            assert_eq!(
                c["layers"].as_i64().unwrap() * 32,
                c["width"].as_i64().unwrap()
            );
            assert_eq!(c["optim"]["momentum"], json(0.9));
        }
        // The same seed, the same configs.
        let mut again = rand::rngs::StdRng::seed_from_u64(1);
        let repeat: Vec<Value> = points
            .iter()
            .map(|p| Value::Object(space.sample(&mut again, p)))
            .collect();
        assert_eq!(configs, repeat);
    }

    #[test]
    fn bad_spaces_are_refused_naming_the_parameter() {
        let refused = |domain: Domain| {
            let space = SearchSpace::new().nested("opt", SearchSpace::new().param("p", domain));
            match space.validate() {
                Err(TuneError::BadSpace { param, detail }) => {
                    assert_eq!(param, "opt.p");
                    detail
                }
                other => panic!("expected BadSpace, got {other:?}"),
            }
        };
        assert!(refused(choice(Vec::<u8>::new())).contains("no values"));
        assert!(refused(grid(Vec::<u8>::new())).contains("no values"));
        assert!(refused(loguniform(0.0, 1.0)).contains("> 0"));
        assert!(refused(loguniform(-1.0, 1.0)).contains("> 0"));
        assert!(refused(uniform(1.0, 1.0)).contains("low < high"));
        assert!(refused(uniform(f64::NAN, 1.0)).contains("finite"));
        assert!(refused(quniform(0.0, 1.0, 0.0)).contains("q > 0"));
        assert!(refused(quniform(0.1, 0.2, 0.25)).contains("no multiple of 0.25"));
        assert!(refused(uniform(-1e308, 1e308)).contains("finite"));
        assert!(refused(randint(5, 5)).contains("low < high"));
        assert!(refused(normal(0.0, 0.0)).contains("sd > 0"));
        SearchSpace::new()
            .param("a", loguniform(1e-5, 1e-1))
            .param("b", randint(0, 1))
            .validate()
            .unwrap();
    }
}
