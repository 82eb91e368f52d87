//! TPE, the Tree-structured Parzen Estimator (Bergstra et al. 2011; the
//! default sampler of Optuna and HyperOpt), as Optuna 5's `TPESampler`
//! with its defaults: multivariate (one model over all parameters, Falkner
//! et al. 2018; univariate with `TpeConfig::multivariate` off) and a
//! constant liar for trials still running.
//!
//! For each suggestion:
//! 1. the first `n_startup_trials` configs are random draws from the space
//!    (as `BasicSearch`);
//! 2. after that, the completed trials (with a score) are split: the best
//!    `γ(n) = min(⌈n/10⌉, 25)` are "good", the rest "bad", and so are the
//!    trials still running (the constant liar: trials running at once
//!    spread out instead of piling onto one spot);
//! 3. a Parzen estimator is fitted to the good trials, l(x), and one to the
//!    bad, g(x): a mixture of one kernel per trial and a prior kernel
//!    (weight `PRIOR_WEIGHT`). Trials weigh equally, except that beyond the
//!    `RECENT` latest the older ones weigh less (a ramp from 1/n up). A
//!    numeric parameter's kernel is a normal truncated to its bounds
//!    (log-uniform ones in log space, integers and steps rounded after),
//!    centred on the trial's value and as wide as the larger gap to its
//!    neighbours (the outermost: the gap inward), at least 1/min(100,
//!    kernels + 1) of the range; the prior's is centred and as wide as the
//!    range. A choice's kernel puts 1 on the trial's option and
//!    `PRIOR_WEIGHT / kernels` on each, normalised; the prior's is uniform.
//!    Multivariate: one estimator over all parameters, each kernel the
//!    product of its parameters' kernels, so that correlated parameters (a
//!    learning rate and a momentum) are modelled together; univariate: one
//!    estimator per parameter;
//! 4. `n_ei_candidates` configs are drawn from l and the one with the
//!    largest l(x)/g(x) (the expected improvement's argmax) is taken (per
//!    parameter when univariate);
//! 5. derived parameters are computed from the chosen ones.
//!
//! The space's grids and nested spaces are refused (TPE models flat
//! spaces; draw a grid's values with a `choice`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::{Searcher, TrialConfig};
use crate::tune::space::{Domain, SearchSpace};
use crate::tune::TuneError;

/// The prior kernel's weight against a trial's 1 (Optuna: 1.0).
const PRIOR_WEIGHT: f64 = 1.0;

/// Trials that weigh fully in an estimator; older ones weigh less (Optuna:
/// 25).
const RECENT: usize = 25;

/// TPE's settings.
#[derive(Clone, Debug)]
pub struct TpeConfig {
    /// Random configs before the model is used (Optuna: 10).
    pub n_startup_trials: usize,
    /// Candidates drawn from l(x) per suggestion (Optuna: 24).
    pub n_ei_candidates: usize,
    /// One model over all parameters instead of one per parameter
    /// (Optuna's default since 5.0); see the module docs.
    pub multivariate: bool,
    /// Count the trials still running as bad ones, so that trials running
    /// at once spread out (Optuna's `constant_liar`, its default since
    /// 5.0).
    pub constant_liar: bool,
}

impl Default for TpeConfig {
    fn default() -> Self {
        TpeConfig {
            n_startup_trials: 10,
            n_ei_candidates: 24,
            multivariate: true,
            constant_liar: true,
        }
    }
}

/// The TPE searcher; see the module docs.
pub struct Tpe {
    space: SearchSpace,
    config: TpeConfig,
    /// The modelled parameters, in the space's order.
    params: Vec<(String, Param)>,
    num_samples: usize,
    suggested: usize,
    rng: StdRng,
    /// Completed trials (in the order they completed): each modelled
    /// parameter's value in model space, and the score (higher is better).
    observed: Vec<(Vec<f64>, f64)>,
    /// Suggested trials not completed yet, in model space.
    pending: Vec<Vec<f64>>,
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
        let mut params = Vec::new();
        for (name, domain) in space.params() {
            let param = match domain {
                Domain::Grid(_) | Domain::Nested(_) => {
                    return Err(TuneError::BadSpace {
                        param: name.clone(),
                        detail: "is a grid or a nested space, which TPE does not model: use a choice, or the basic searcher".into(),
                    })
                }
                Domain::Constant(_) | Domain::Derived(_) => continue,
                Domain::Choice(options) => Param::Choice(options.clone()),
                numeric => match Numeric::of(numeric) {
                    Some(numeric) => Param::Numeric(numeric),
                    None => continue,
                },
            };
            params.push((name.clone(), param));
        }
        Ok(Tpe {
            space,
            config,
            params,
            num_samples,
            suggested: 0,
            rng: StdRng::seed_from_u64(seed),
            observed: Vec::new(),
            pending: Vec::new(),
        })
    }

    /// `config`'s modelled parameters in model space, if it has them all.
    fn point_of(&self, config: &TrialConfig) -> Option<Vec<f64>> {
        self.params
            .iter()
            .map(|(name, param)| param.to_model(config.get(name)?))
            .collect()
    }

    /// Steps 2–5.
    fn model(&mut self) -> TrialConfig {
        let mut ranked: Vec<usize> = (0..self.observed.len()).collect();
        ranked.sort_by(|&a, &b| self.observed[b].1.total_cmp(&self.observed[a].1));
        let n_good = ranked.len().div_ceil(10).clamp(1, 25);
        let (mut good, mut bad) = (ranked[..n_good].to_vec(), ranked[n_good..].to_vec());
        // Completion order, for the weights' ramp.
        good.sort_unstable();
        bad.sort_unstable();
        let mut bad: Vec<&[f64]> = bad.iter().map(|&t| self.observed[t].0.as_slice()).collect();
        let good: Vec<&[f64]> = good
            .iter()
            .map(|&t| self.observed[t].0.as_slice())
            .collect();
        if self.config.constant_liar {
            bad.extend(self.pending.iter().map(Vec::as_slice));
        }
        let groups: Vec<Vec<usize>> = if self.config.multivariate {
            vec![(0..self.params.len()).collect()]
        } else {
            (0..self.params.len()).map(|i| vec![i]).collect()
        };
        let mut chosen = vec![0.0; self.params.len()];
        for group in groups {
            let points = |set: &[&[f64]]| -> Vec<Vec<f64>> {
                set.iter()
                    .map(|point| group.iter().map(|&p| point[p]).collect())
                    .collect()
            };
            let params: Vec<&Param> = group.iter().map(|&p| &self.params[p].1).collect();
            let l = Mixture::fit(&params, &points(&good));
            let g = Mixture::fit(&params, &points(&bad));
            let mut best = (f64::NEG_INFINITY, Vec::new());
            for _ in 0..self.config.n_ei_candidates.max(1) {
                let x: Vec<f64> = l
                    .sample(&mut self.rng)
                    .into_iter()
                    .zip(&params)
                    .map(|(x, param)| param.snap(x))
                    .collect();
                let ratio = l.log_pdf(&x) - g.log_pdf(&x);
                if ratio > best.0 || best.1.is_empty() {
                    best = (ratio, x);
                }
            }
            for (&p, x) in group.iter().zip(best.1) {
                chosen[p] = x;
            }
        }
        let mut config = TrialConfig::new();
        for (name, domain) in self.space.params() {
            if let Domain::Constant(v) = domain {
                config.insert(name.clone(), v.clone());
            }
        }
        for ((name, param), x) in self.params.iter().zip(chosen) {
            config.insert(name.clone(), param.value_of(x));
        }
        self.space.derive(&mut config);
        config
    }
}

impl Searcher for Tpe {
    fn suggest(&mut self) -> Option<TrialConfig> {
        if self.suggested >= self.num_samples {
            return None;
        }
        self.suggested += 1;
        let config = if self.observed.len() < self.config.n_startup_trials.max(1) {
            self.space.sample(&mut self.rng, &Vec::new())
        } else {
            self.model()
        };
        if let Some(point) = self.point_of(&config) {
            self.pending.push(point);
        }
        Some(config)
    }

    fn total(&self) -> Option<usize> {
        Some(self.num_samples)
    }

    fn on_trial_complete(&mut self, config: &TrialConfig, score: Option<f64>) {
        let Some(point) = self.point_of(config) else {
            return;
        };
        // The config may have been through JSON: equal to a rounding.
        let same = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-9 * (1.0 + x.abs()))
        };
        if let Some(i) = self.pending.iter().position(|p| same(p, &point)) {
            self.pending.remove(i);
        }
        if let Some(score) = score.filter(|s| !s.is_nan()) {
            self.observed.push((point, score));
        }
    }

    fn restored(&mut self) {
        // The trials a restore retries run again without the liar's
        // count: their configs were drawn before the restore.
        self.pending.clear();
    }
}

/// A modelled parameter.
enum Param {
    Numeric(Numeric),
    /// One of these; modelled as the option's index.
    Choice(Vec<Value>),
}

impl Param {
    /// A trial's value in model space, if it is one of this parameter's.
    fn to_model(&self, value: &Value) -> Option<f64> {
        match self {
            Param::Numeric(numeric) => value.as_f64().map(|x| numeric.to_model(x)),
            Param::Choice(options) => options.iter().position(|o| o == value).map(|i| i as f64),
        }
    }

    /// `x` rounded to a discrete parameter's grid.
    fn snap(&self, x: f64) -> f64 {
        match self {
            Param::Numeric(numeric) => numeric.snap(x),
            Param::Choice(_) => x,
        }
    }

    fn value_of(&self, x: f64) -> Value {
        match self {
            Param::Numeric(numeric) => numeric.value_of(x),
            Param::Choice(options) => options[(x as usize).min(options.len() - 1)].clone(),
        }
    }
}

/// A numeric parameter as the model sees it: bounds in model space (log
/// for log-uniform), its grid if discrete, and how values map back.
struct Numeric {
    low: f64,
    high: f64,
    log: bool,
    /// The spacing of a discrete parameter's values (1 for integers, `q`
    /// for a quantised uniform); each value owns the interval of this
    /// width around it.
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
                step: Some(1.0),
                integer: true,
                ..plain(*low as f64 - 0.5, (*high - 1) as f64 + 0.5)
            },
            Domain::Normal { mean, sd } => plain(mean - 5.0 * sd, mean + 5.0 * sd),
            _ => return None,
        })
    }

    fn to_model(&self, x: f64) -> f64 {
        let x = if self.log {
            x.max(f64::MIN_POSITIVE).ln()
        } else {
            x
        };
        x.clamp(self.low, self.high)
    }

    /// `x` rounded to the parameter's grid, if it has one.
    fn snap(&self, x: f64) -> f64 {
        match self.step {
            Some(_) if self.integer => x.round().clamp(self.low + 0.5, self.high - 0.5),
            // Multiples of q within the bounds only (as the space samples).
            Some(q) => {
                (x / q)
                    .round()
                    .clamp((self.low / q).ceil(), (self.high / q).floor())
                    * q
            }
            None => x,
        }
    }

    fn value_of(&self, x: f64) -> Value {
        let x = self.snap(x.clamp(self.low, self.high));
        if self.integer {
            Value::from(x as i64)
        } else if self.log {
            Value::from(x.exp())
        } else {
            Value::from(x)
        }
    }
}

/// A kernel of one parameter (step 3), over its model space.
enum Kernel {
    Normal(TruncatedNormal),
    /// Each option's probability.
    Choice(Vec<f64>),
}

/// A normal truncated to `[low, high]`; over a discrete parameter's grid
/// (values `step` apart) when `step` is set.
struct TruncatedNormal {
    mu: f64,
    sigma: f64,
    low: f64,
    high: f64,
    step: Option<f64>,
}

impl TruncatedNormal {
    /// The log density at `x` (a discrete parameter's: the log of the mass
    /// of `x`'s interval, as Optuna).
    fn log_pdf(&self, x: f64) -> f64 {
        let z = |x: f64| (x - self.mu) / self.sigma;
        let truncated = (phi(z(self.high)) - phi(z(self.low))).max(1e-12);
        match self.step {
            Some(step) => {
                let mass = phi(z(x + step / 2.0)) - phi(z(x - step / 2.0));
                mass.max(1e-300).ln() - truncated.ln()
            }
            None => {
                -0.5 * z(x) * z(x)
                    - (self.sigma * (2.0 * std::f64::consts::PI).sqrt()).ln()
                    - truncated.ln()
            }
        }
    }

    /// A draw, not yet rounded to a discrete parameter's grid.
    fn sample(&self, rng: &mut StdRng) -> f64 {
        for _ in 0..100 {
            let u: f64 = 1.0 - rng.random::<f64>();
            let v: f64 = rng.random();
            let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
            let x = self.mu + self.sigma * z;
            if (self.low..=self.high).contains(&x) {
                return x;
            }
        }
        self.mu
    }
}

impl Kernel {
    fn log_pdf(&self, x: f64) -> f64 {
        match self {
            Kernel::Normal(normal) => normal.log_pdf(x),
            Kernel::Choice(p) => p[x as usize].max(1e-300).ln(),
        }
    }

    fn sample(&self, rng: &mut StdRng) -> f64 {
        match self {
            Kernel::Normal(normal) => normal.sample(rng),
            Kernel::Choice(p) => pick(p, rng) as f64,
        }
    }
}

/// A Parzen estimator over some parameters (step 3): weighted components,
/// each a product of one kernel per parameter.
struct Mixture {
    weights: Vec<f64>,
    /// `components[k][d]`: component k's kernel of parameter d.
    components: Vec<Vec<Kernel>>,
}

impl Mixture {
    /// Fits `params` to `points` (one value per parameter each, oldest
    /// first).
    fn fit(params: &[&Param], points: &[Vec<f64>]) -> Mixture {
        let n = points.len();
        let kernels = n + 1;
        let mut components: Vec<Vec<Kernel>> = (0..kernels).map(|_| Vec::new()).collect();
        for (d, param) in params.iter().enumerate() {
            let values: Vec<f64> = points.iter().map(|p| p[d]).collect();
            match param {
                Param::Numeric(numeric) => {
                    let (low, high) = (numeric.low, numeric.high);
                    let range = high - low;
                    let sigmas = gap_sigmas(&values, low, high);
                    let min_sigma = range / (100f64).min(1.0 + kernels as f64);
                    for (k, (&mu, sigma)) in values.iter().zip(sigmas).enumerate() {
                        components[k].push(Kernel::Normal(TruncatedNormal {
                            mu,
                            sigma: sigma.clamp(min_sigma, range),
                            low,
                            high,
                            step: numeric.step,
                        }));
                    }
                    components[n].push(Kernel::Normal(TruncatedNormal {
                        mu: (low + high) / 2.0,
                        sigma: range,
                        low,
                        high,
                        step: numeric.step,
                    }));
                }
                Param::Choice(options) => {
                    let base = PRIOR_WEIGHT / kernels as f64;
                    let total = 1.0 + base * options.len() as f64;
                    for (k, &x) in values.iter().enumerate() {
                        let mut p = vec![base / total; options.len()];
                        p[x as usize] += 1.0 / total;
                        components[k].push(Kernel::Choice(p));
                    }
                    components[n].push(Kernel::Choice(vec![
                        1.0 / options.len() as f64;
                        options.len()
                    ]));
                }
            }
        }
        let mut weights: Vec<f64> = if n < RECENT {
            vec![1.0; n]
        } else {
            // From 1/n to 1 in `ramp` steps (numpy's linspace).
            let ramp = n - RECENT;
            let last = ramp.saturating_sub(1).max(1) as f64;
            (0..ramp)
                .map(|i| 1.0 / n as f64 + (1.0 - 1.0 / n as f64) * i as f64 / last)
                .chain(std::iter::repeat_n(1.0, RECENT))
                .collect()
        };
        weights.push(PRIOR_WEIGHT);
        let sum: f64 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= sum);
        Mixture {
            weights,
            components,
        }
    }

    fn sample(&self, rng: &mut StdRng) -> Vec<f64> {
        let k = pick(&self.weights, rng);
        self.components[k]
            .iter()
            .map(|kernel| kernel.sample(rng))
            .collect()
    }

    fn log_pdf(&self, x: &[f64]) -> f64 {
        let logs: Vec<f64> = self
            .weights
            .iter()
            .zip(&self.components)
            .map(|(w, kernels)| {
                w.ln()
                    + kernels
                        .iter()
                        .zip(x)
                        .map(|(k, &x)| k.log_pdf(x))
                        .sum::<f64>()
            })
            .collect();
        let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        max + logs.iter().map(|l| (l - max).exp()).sum::<f64>().ln()
    }
}

/// Kernel widths (Optuna's): each value's larger gap to its neighbours
/// among the values and the bounds; the lowest and highest of two or more
/// values measure only the gap inward.
fn gap_sigmas(values: &[f64], low: f64, high: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let sorted: Vec<f64> = std::iter::once(low)
        .chain(order.iter().map(|&i| values[i]))
        .chain(std::iter::once(high))
        .collect();
    let n = values.len();
    let mut sigmas = vec![0.0; n];
    for (rank, &original) in order.iter().enumerate() {
        let at = rank + 1;
        let (left, right) = (sorted[at] - sorted[at - 1], sorted[at + 1] - sorted[at]);
        sigmas[original] = match (n >= 2, rank) {
            (true, 0) => right,
            (true, last) if last == n - 1 => left,
            _ => left.max(right),
        };
    }
    sigmas
}

/// An index drawn with probability `weights[i]` (they sum to 1).
fn pick(weights: &[f64], rng: &mut StdRng) -> usize {
    let mut u = rng.random::<f64>();
    for (i, &w) in weights.iter().enumerate() {
        if u < w {
            return i;
        }
        u -= w;
    }
    weights.len() - 1
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
    fn trials_still_running_are_the_ones_suggested_and_not_ended() {
        let mut tpe = Tpe::new(space(), 10, 1, TpeConfig::default()).unwrap();
        let configs: Vec<TrialConfig> = (0..3).map(|_| tpe.suggest().unwrap()).collect();
        assert_eq!(tpe.pending.len(), 3);
        tpe.on_trial_complete(&configs[1], Some(objective(&configs[1])));
        // Failed for good: no score, no longer running.
        tpe.on_trial_complete(&configs[0], None);
        assert_eq!(tpe.pending.len(), 1);
        assert_eq!(tpe.observed.len(), 1);
        tpe.restored();
        assert!(tpe.pending.is_empty());
    }

    #[test]
    fn quantised_values_stay_multiples_within_the_bounds() {
        let space = SearchSpace::new().param("q", crate::tune::space::quniform(0.0, 0.95, 0.1));
        let mut tpe = Tpe::new(space, 60, 2, TpeConfig::default()).unwrap();
        while let Some(c) = tpe.suggest() {
            let q = c["q"].as_f64().unwrap();
            assert!((0.0..=0.95).contains(&q), "{c:?}");
            assert!(((q / 0.1).round() * 0.1 - q).abs() < 1e-9, "{c:?}");
            tpe.on_trial_complete(&c, Some(-(q - 0.9).abs()));
        }
    }

    #[test]
    fn kernel_widths_are_optunas() {
        let widths = gap_sigmas(&[0.9, 0.2, 0.5], 0.0, 1.0);
        for (width, expected) in widths.iter().zip([0.4, 0.3, 0.4]) {
            assert!((width - expected).abs() < 1e-12, "{widths:?}");
        }
        assert_eq!(gap_sigmas(&[0.3], 0.0, 1.0), [0.7]);
    }

    #[test]
    fn trials_suggested_while_others_run_spread_out() {
        let peak = |c: &TrialConfig| -(c["x"].as_f64().unwrap() - 0.3).powi(2);
        let space = || SearchSpace::new().param("x", crate::tune::space::uniform(0.0, 1.0));
        let spread = |constant_liar| {
            let mut total = 0.0;
            for seed in 0..50 {
                let config = TpeConfig {
                    constant_liar,
                    ..TpeConfig::default()
                };
                let mut tpe = Tpe::new(space(), 14, seed, config).unwrap();
                for _ in 0..10 {
                    let c = tpe.suggest().unwrap();
                    tpe.on_trial_complete(&c, Some(peak(&c)));
                }
                // Four at once, none completed.
                let xs: Vec<f64> = (0..4)
                    .map(|_| tpe.suggest().unwrap()["x"].as_f64().unwrap())
                    .collect();
                let mean = xs.iter().sum::<f64>() / 4.0;
                total += xs.iter().map(|x| (x - mean).abs()).sum::<f64>() / 4.0;
            }
            total / 50.0
        };
        let (lying, not) = (spread(true), spread(false));
        assert!(
            lying > not,
            "spread with the constant liar {lying:.4}, without {not:.4}"
        );
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
