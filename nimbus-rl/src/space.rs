//! Observation and action spaces, with Gymnasium's meaning: what an
//! environment promises to return and to accept.

use serde::{Deserialize, Serialize};

/// A space of values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Space {
    /// One of `n` choices, `0..n`.
    Discrete {
        /// How many.
        n: u32,
    },
    /// Real vectors within bounds (each may be infinite), flat.
    Box {
        /// Each component's lower bound.
        low: Vec<f32>,
        /// Each component's upper bound.
        high: Vec<f32>,
    },
    /// One choice per component, component `i` in `0..nvec[i]`.
    MultiDiscrete {
        /// Each component's number of choices.
        nvec: Vec<u32>,
    },
}

/// An action, in its space's form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Action {
    /// In a [`Space::Discrete`].
    Discrete(u32),
    /// In a [`Space::Box`].
    Continuous(Vec<f32>),
    /// In a [`Space::MultiDiscrete`].
    MultiDiscrete(Vec<u32>),
}

impl Space {
    /// A box with the same bounds in each of `n` components.
    pub fn uniform_box(n: usize, low: f32, high: f32) -> Space {
        Space::Box {
            low: vec![low; n],
            high: vec![high; n],
        }
    }

    /// How many `f32`s an observation in this space takes: a discrete
    /// observation is its index.
    pub fn flat_len(&self) -> usize {
        match self {
            Space::Discrete { .. } => 1,
            Space::Box { low, .. } => low.len(),
            Space::MultiDiscrete { nvec } => nvec.len(),
        }
    }

    /// Why `observation` is not in this space, if it is not.
    pub fn check_observation(&self, observation: &[f32]) -> Result<(), String> {
        if observation.len() != self.flat_len() {
            return Err(format!(
                "an observation of {} values, where the space has {}",
                observation.len(),
                self.flat_len()
            ));
        }
        if let Some(i) = observation.iter().position(|v| v.is_nan()) {
            return Err(format!("component {i} of the observation is NaN"));
        }
        let outside = |i: usize, v: f32, low: f32, high: f32| {
            Err(format!(
                "component {i} of the observation is {v}, outside [{low}, {high}]"
            ))
        };
        match self {
            Space::Discrete { n } => {
                let v = observation[0];
                if v < 0.0 || v >= *n as f32 || v.fract() != 0.0 {
                    return outside(0, v, 0.0, (*n as f32) - 1.0);
                }
            }
            Space::Box { low, high } => {
                for (i, ((&v, &lo), &hi)) in observation.iter().zip(low).zip(high).enumerate() {
                    if v < lo || v > hi {
                        return outside(i, v, lo, hi);
                    }
                }
            }
            Space::MultiDiscrete { nvec } => {
                for (i, (&v, &n)) in observation.iter().zip(nvec).enumerate() {
                    if v < 0.0 || v >= n as f32 || v.fract() != 0.0 {
                        return outside(i, v, 0.0, (n as f32) - 1.0);
                    }
                }
            }
        }
        Ok(())
    }

    /// Why `action` is not in this space, if it is not.
    pub fn check_action(&self, action: &Action) -> Result<(), String> {
        match (self, action) {
            (Space::Discrete { n }, Action::Discrete(a)) if a < n => Ok(()),
            (Space::Discrete { n }, Action::Discrete(a)) => {
                Err(format!("action {a} of a space of {n} choices"))
            }
            (Space::Box { low, high }, Action::Continuous(a)) => {
                if a.len() != low.len() {
                    return Err(format!(
                        "an action of {} values, where the space has {}",
                        a.len(),
                        low.len()
                    ));
                }
                match a
                    .iter()
                    .zip(low.iter().zip(high))
                    .position(|(v, (lo, hi))| v.is_nan() || v < lo || v > hi)
                {
                    Some(i) => Err(format!(
                        "component {i} of the action is {}, outside [{}, {}]",
                        a[i], low[i], high[i]
                    )),
                    None => Ok(()),
                }
            }
            (Space::MultiDiscrete { nvec }, Action::MultiDiscrete(a)) => {
                if a.len() != nvec.len() {
                    return Err(format!(
                        "an action of {} values, where the space has {}",
                        a.len(),
                        nvec.len()
                    ));
                }
                match a.iter().zip(nvec).position(|(v, n)| v >= n) {
                    Some(i) => Err(format!(
                        "component {i} of the action is {}, of {} choices",
                        a[i], nvec[i]
                    )),
                    None => Ok(()),
                }
            }
            (space, action) => Err(format!("a {action:?} for a space {space:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Action, Space};

    #[test]
    fn spaces_say_what_is_outside_them() {
        let b = Space::Box {
            low: vec![-1.0, f32::NEG_INFINITY],
            high: vec![1.0, f32::INFINITY],
        };
        assert!(b.check_observation(&[0.5, 1e30]).is_ok());
        assert_eq!(
            b.check_observation(&[2.0, 0.0]).unwrap_err(),
            "component 0 of the observation is 2, outside [-1, 1]"
        );
        assert!(b
            .check_observation(&[0.0, f32::NAN])
            .unwrap_err()
            .contains("NaN"));
        assert!(b
            .check_observation(&[0.0])
            .unwrap_err()
            .contains("1 values"));
        let d = Space::Discrete { n: 2 };
        assert!(d.check_action(&Action::Discrete(1)).is_ok());
        assert_eq!(
            d.check_action(&Action::Discrete(2)).unwrap_err(),
            "action 2 of a space of 2 choices"
        );
        assert!(d.check_action(&Action::Continuous(vec![0.0])).is_err());
        let c = Space::uniform_box(1, -2.0, 2.0);
        assert!(c.check_action(&Action::Continuous(vec![3.0])).is_err());
        assert!(c.check_action(&Action::Continuous(vec![0.0, 0.0])).is_err());
    }
}
