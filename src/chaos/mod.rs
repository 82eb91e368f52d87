//! The fault-injection harness: seeded plans of node, actor, packet and
//! training faults run against a [`LocalCluster`], with a timeline of what
//! was injected and what recovered (the helpers for tests that use it are
//! in [`crate::testing`]).
//!
//! A plan is data, written with a builder or in TOML:
//!
//! ```toml
//! seed = 7
//! [[faults]]
//! at_ms = 500
//! action = { kill_node = { node = "random" } }
//! [[faults]]
//! at_ms = 4000
//! action = { restart_node = { node = "random" } }
//! ```
//!
//! Every random choice (`"random"` targets) comes from the seed, so the same
//! seed and plan inject the same faults at the same times
//! ([`ChaosPlan::resolve`]); actor and training faults fire at message
//! counts and training steps. Faults never outlive the run: a stopped node
//! is always resumed, even when the run fails.

mod plan;
mod run;
mod timeline;

pub use plan::{ChaosPlan, FaultAction, NodeTarget, PlanError, PlannedFault, ResolvedFault};
pub use run::{run, run_while, ChaosError};
pub use timeline::{Timeline, TimelineEntry};

#[cfg(doc)]
use crate::local::LocalCluster;
