//! Resources a node offers: CPUs, GPUs, memory and custom ones, as Ray
//! names them (`CPU`, `GPU`, `memory`, `accelerator_type:H200`, ...).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Name of the CPU resource.
pub const CPU: &str = "CPU";
/// Name of the GPU resource.
pub const GPU: &str = "GPU";
/// Name of the memory resource, in bytes.
pub const MEMORY: &str = "memory";

/// Amounts of named resources.
///
/// ```
/// use nimbus::cluster::ResourceSet;
/// let mut r = ResourceSet::default();
/// r.set("CPU", 4.0);
/// r.merge_custom(r#"{"accelerator_type:H200": 1}"#).unwrap();
/// assert_eq!(r.amount("accelerator_type:H200"), 1.0);
/// assert!(r.merge_custom(r#"{"CPU": 1}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ResourceSet(BTreeMap<String, f64>);

/// A `--resources` value, or a request's resources, that cannot be used.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ResourceError {
    /// Not a JSON object of numbers.
    #[error("--resources must be a JSON object of numbers, such as '{{\"accelerator_type:H200\": 1}}': {0}")]
    NotJson(String),
    /// A negative or non-finite amount.
    #[error("resource {name:?} has amount {amount}; amounts must be finite and not negative")]
    BadAmount {
        /// The resource.
        name: String,
        /// Its amount.
        amount: f64,
    },
    /// A node offering part of a GPU.
    #[error("--num-gpus {0} is not a whole number: a node offers whole GPUs (actors may ask for fractions of one)")]
    FractionalGpus(f64),
    /// A built-in resource given as a custom one.
    #[error("resource {0:?} is built in; set it with --num-cpus, --num-gpus or --memory")]
    BuiltIn(String),
}

impl ResourceSet {
    /// A set of one resource.
    ///
    /// ```
    /// use nimbus::cluster::ResourceSet;
    /// let bundle = ResourceSet::of("CPU", 1.0).with("GPU", 1.0);
    /// assert_eq!(bundle.amount("GPU"), 1.0);
    /// ```
    pub fn of(name: &str, amount: f64) -> Self {
        ResourceSet::default().with(name, amount)
    }

    /// The same set with `name` set to `amount`.
    pub fn with(mut self, name: &str, amount: f64) -> Self {
        self.set(name, amount);
        self
    }

    /// The amount of `name` (0 when absent).
    pub fn amount(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }

    /// Sets the amount of `name`.
    pub fn set(&mut self, name: &str, amount: f64) {
        self.0.insert(name.to_string(), amount);
    }

    /// Adds custom resources from a JSON object such as
    /// `{"accelerator_type:H200": 1}`.
    pub fn merge_custom(&mut self, json: &str) -> Result<(), ResourceError> {
        let custom: BTreeMap<String, f64> =
            serde_json::from_str(json).map_err(|e| ResourceError::NotJson(e.to_string()))?;
        for (name, amount) in custom {
            if [CPU, GPU, MEMORY].contains(&name.as_str()) {
                return Err(ResourceError::BuiltIn(name));
            }
            if !amount.is_finite() || amount < 0.0 {
                return Err(ResourceError::BadAmount { name, amount });
            }
            self.0.insert(name, amount);
        }
        Ok(())
    }

    /// Fails on the first amount that is negative, infinite or NaN: such
    /// an amount would corrupt a node's accounting for good.
    ///
    /// ```
    /// use nimbus::cluster::ResourceSet;
    /// assert!(ResourceSet::of("CPU", 0.5).validate().is_ok());
    /// assert!(ResourceSet::of("CPU", f64::NAN).validate().is_err());
    /// assert!(ResourceSet::of("GPU", -1.0).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), ResourceError> {
        match self.iter().find(|(_, a)| !a.is_finite() || *a < 0.0) {
            Some((name, amount)) => Err(ResourceError::BadAmount {
                name: name.to_string(),
                amount,
            }),
            None => Ok(()),
        }
    }

    /// The resources with their amounts.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Adds every amount of `other`.
    pub fn add(&mut self, other: &ResourceSet) {
        for (name, amount) in other.iter() {
            self.set(name, self.amount(name) + amount);
        }
    }

    /// Subtracts every amount of `other`, never going below zero.
    pub fn subtract(&mut self, other: &ResourceSet) {
        for (name, amount) in other.iter() {
            self.set(name, (self.amount(name) - amount).max(0.0));
        }
    }

    /// `self` less `other` (what is free of a total after a use).
    pub fn minus(&self, other: &ResourceSet) -> ResourceSet {
        let mut rest = self.clone();
        rest.subtract(other);
        rest
    }

    /// Whether `available` holds every amount of `self`.
    pub fn fits_in(&self, available: &ResourceSet) -> bool {
        self.shortfall(available).is_empty()
    }

    /// What of `self` `available` lacks, as `NAME=AMOUNT (free F)`.
    pub fn shortfall(&self, available: &ResourceSet) -> Vec<String> {
        self.iter()
            .filter(|(name, amount)| *amount > available.amount(name) + 1e-9)
            .map(|(name, amount)| format!("{name}={amount} (free {})", available.amount(name)))
            .collect()
    }
}

impl fmt::Display for ResourceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, amount) in self.iter() {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            if name == MEMORY {
                write!(f, "{name}={:.1}GiB", amount / (1u64 << 30) as f64)?;
            } else {
                write!(f, "{name}={amount}")?;
            }
        }
        Ok(())
    }
}

/// What the user set on the command line; `None` means detect.
#[derive(Clone, Debug, Default)]
pub struct ResourceOverrides {
    /// `--num-cpus`.
    pub num_cpus: Option<f64>,
    /// `--num-gpus`.
    pub num_gpus: Option<f64>,
    /// `--memory`, in bytes.
    pub memory: Option<u64>,
    /// `--resources`, a JSON object.
    pub custom_json: Option<String>,
}

impl ResourceOverrides {
    /// The node's total resources: overrides where given, detected otherwise.
    pub fn resolve(&self) -> Result<ResourceSet, ResourceError> {
        let mut set = ResourceSet::default();
        for (name, amount) in [(CPU, self.num_cpus), (GPU, self.num_gpus)] {
            if let Some(amount) = amount.filter(|a| !a.is_finite() || *a < 0.0) {
                return Err(ResourceError::BadAmount {
                    name: name.into(),
                    amount,
                });
            }
        }
        if let Some(gpus) = self.num_gpus.filter(|g| g.fract() != 0.0) {
            return Err(ResourceError::FractionalGpus(gpus));
        }
        set.set(CPU, self.num_cpus.unwrap_or_else(crate::host::probe::cpus));
        set.set(
            GPU,
            self.num_gpus
                .unwrap_or_else(|| crate::host::gpus::detect() as f64),
        );
        set.set(
            MEMORY,
            self.memory.unwrap_or_else(crate::host::probe::memory_bytes) as f64,
        );
        if let Some(json) = &self.custom_json {
            set.merge_custom(json)?;
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_win_and_detection_fills_the_rest() {
        let overrides = ResourceOverrides {
            num_cpus: Some(3.0),
            custom_json: Some(r#"{"accelerator_type:H200": 1}"#.into()),
            ..Default::default()
        };
        let set = overrides.resolve().unwrap();
        assert_eq!(set.amount(CPU), 3.0);
        assert_eq!(set.amount("accelerator_type:H200"), 1.0);
        assert!(set.amount(MEMORY) > 0.0);
    }

    #[test]
    fn bad_custom_resources_are_named() {
        let mut set = ResourceSet::default();
        let err = set.merge_custom(r#"{"x": -1}"#).unwrap_err();
        assert!(
            matches!(&err, ResourceError::BadAmount { name, amount } if name == "x" && *amount == -1.0),
            "{err}"
        );
        assert!(err.to_string().contains("\"x\""));
        assert!(matches!(
            set.merge_custom("[1]"),
            Err(ResourceError::NotJson(_))
        ));
        assert!(matches!(
            set.merge_custom(r#"{"x": "one"}"#),
            Err(ResourceError::NotJson(_))
        ));
    }

    #[test]
    fn negative_cpu_count_is_refused() {
        let overrides = ResourceOverrides {
            num_cpus: Some(-2.0),
            ..Default::default()
        };
        let err = overrides.resolve().unwrap_err();
        assert!(
            matches!(&err, ResourceError::BadAmount { name, amount } if name == CPU && *amount == -2.0),
            "{err}"
        );
    }
}
