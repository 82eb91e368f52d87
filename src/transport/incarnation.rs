//! A fresh [`Incarnation`]: the clock read that the wire format
//! (`crate::wire`) leaves to the processes that start.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::wire::Incarnation;

impl Incarnation {
    /// A new incarnation for a process starting now (0 on a clock set
    /// before 1970).
    pub fn fresh() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Incarnation::starting_at(since_epoch)
    }
}
